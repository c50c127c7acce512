"""tune-cp sweep on Ray: a local cluster (no network, no dashboard), the same file as local
processes, and a scenario that fails inside a Ray task."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a Ray cluster starts in 5-20 s

from tune_cp.agent.sweep import RayEngine, SerialEngine, load_grid, read_rows, run_sweep  # noqa: E402

GRID = """\
models: [llama3-8b]
gpus: [h100, mi355x]
nodes: [1, 2]
seq_len: 4096
global_batch: 128
tokens: 1.0e12
"""


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the module: 2 CPUs, no dashboard, nothing leaves the machine;
    started by ``--ray auto``'s own path over a stale cluster file (the
    /tmp/ray/ray_current_cluster of a head that was started and stopped, as a user who tried
    ``ray start --head`` has): it must start its own cluster (address "local") and say so,
    where ``ray.init(num_cpus=...)`` would try to join the dead head and refuse."""
    import shutil
    import socket
    import tempfile

    root = str(Path(__file__).resolve().parent.parent)
    tmp = tempfile.mkdtemp(prefix="tcp-ray-")  # short: Ray's socket paths live under it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        stale = f"127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there
    (Path(tmp) / "ray").mkdir()
    (Path(tmp) / "ray" / "ray_current_cluster").write_text(stale + "\n")
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_TMPDIR", tmp)
    mp.delenv("RAY_ADDRESS", raising=False)
    said: list[str] = []
    engine = RayEngine("auto", num_cpus=2, say=said.append,
                       init_kwargs={"runtime_env": {"env_vars": {"PYTHONPATH": root}}})
    try:
        engine._init()
        assert said == [f"--ray auto: started a local Ray cluster of 2 CPUs ({tmp}/ray/"
                        f"ray_current_cluster names {stale}, which does not answer: a head "
                        f"that is no longer running)"]
        assert engine.name == "Ray (local, 2 CPUs)"
        yield
    finally:
        ray.shutdown()
        mp.undo()
        shutil.rmtree(tmp, ignore_errors=True)


def test_ray_gives_the_same_file_and_a_failing_task_is_a_row(cluster, tmp_path):
    g = tmp_path / "grid.yaml"
    g.write_text(GRID)
    scenarios = load_grid(str(g)).scenarios
    serial = tmp_path / "serial.csv"
    run_sweep(scenarios, str(serial), SerialEngine())
    on_ray = tmp_path / "ray.csv"
    report = run_sweep(scenarios, str(on_ray), RayEngine("auto"))
    assert on_ray.read_bytes() == serial.read_bytes()
    assert (report.ok, report.failed) == (4, 0)
    # a scenario that raises inside its Ray task (a cluster of 0 nodes fails ClusterSpec's
    # validation there): its row says why, the others complete
    broken = dataclasses.replace(scenarios[0], scenario_id="broken/n0", nodes=0, position=(9,))
    mixed = tmp_path / "mixed.csv"
    report = run_sweep([broken, *scenarios[:2]], str(mixed), RayEngine("auto"))
    rows = {r["scenario_id"]: r for r in read_rows(str(mixed))}
    assert rows["broken/n0"]["status"] == "error"
    assert "num_nodes" in rows["broken/n0"]["reason"]
    assert [rows[s.scenario_id]["status"] for s in scenarios[:2]] == ["ok", "ok"]
    assert (report.ok, report.failed) == (2, 1)


def test_a_task_whose_worker_dies_is_a_row(cluster, tmp_path):
    g = tmp_path / "grid.yaml"
    g.write_text(GRID)
    sc = load_grid(str(g)).scenarios[0]
    engine = RayEngine("auto")
    task = engine.ray.remote(num_cpus=1, max_retries=0)(_die)
    ref = task.remote(sc)
    engine.refs[ref] = sc
    # the engine's own loop reads the dead task as an error row
    out = list(_drain(engine))
    assert len(out) == 1 and out[0][1]["status"] == "error"
    assert out[0][1]["reason"].startswith("Ray task failed:")


def _die(sc):
    import os

    os._exit(1)


def _drain(engine):
    # the engine's result loop with nothing new to submit
    return engine.run([])
