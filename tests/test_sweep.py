"""tune-cp sweep: grid files, one row per scenario, determinism, resume, failures as rows."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest

from tune_cp.agent.sweep import (
    COLUMN_NAMES,
    GridError,
    LocalEngine,
    SerialEngine,
    load_grid,
    read_rows,
    run_sweep,
    write_rows,
)
from tune_cp.config.specs import ConfigError
from tune_cp.solver.defaults import DEFAULT_MEMORY_MARGIN

#: four fast scenarios (dense 8B, one or two nodes, two GPUs)
SMALL = """\
name: small
models: [llama3-8b]
gpus: [h100, mi355x]
nodes: [2, 1]
seq_len: 4096
global_batch: 128
tokens: 1.0e12
price_per_gpu_hour: {h100: 2.5, mi355x: 3}
"""


def grid_file(tmp_path: Path, text: str, name: str = "grid.yaml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def rows_of(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The small grid swept once in this process: (grid path, output path, report)."""
    d = tmp_path_factory.mktemp("sweep")
    g = grid_file(d, SMALL)
    out = str(d / "serial.csv")
    report = run_sweep(load_grid(g).scenarios, out, SerialEngine())
    return g, out, report


def test_small_grid_rows_match_the_search_command(small, run_json):
    _, out, report = small
    rows = rows_of(out)
    assert [r["scenario_id"] for r in rows] == [
        "llama3-8b/h100/n1/s4096/b128/bf16", "llama3-8b/h100/n2/s4096/b128/bf16",
        "llama3-8b/mi355x/n1/s4096/b128/bf16", "llama3-8b/mi355x/n2/s4096/b128/bf16"]
    assert list(rows[0]) == list(COLUMN_NAMES)
    assert (report.ok, report.infeasible, report.failed, report.computed) == (4, 0, 0, 4)
    # each row is the main command's answer for that scenario
    code, data = run_json("--model", "llama3-8b", "--gpu", "h100", "--nodes", "2",
                          "--seq-len", "4096", "--gbs", "128")
    assert code == 0
    r = rows[1]
    best = data["best"]
    for k in ("tp", "pp", "vpp", "cp", "dp", "mbs", "ga"):
        assert int(r[k]) == best[k], k
    assert r["recompute"] == best["recompute"]
    assert float(r["tokens_per_s_per_gpu"]) == pytest.approx(
        best["projection"]["tokens_per_s_per_gpu"], rel=1e-12)
    assert float(r["mfu"]) == pytest.approx(best["projection"]["mfu"], rel=1e-12)
    assert int(r["feasible"]) == data["feasible_count"]
    assert int(r["peak_bytes"]) == best["memory"]["peak_bytes"]


def test_time_and_cost_columns_follow_the_plan_formulas(small):
    _, out, _ = small
    for r in rows_of(out):
        per_gpu, gpus = float(r["tokens_per_s_per_gpu"]), int(r["gpus"])
        assert gpus == 8 * int(r["nodes"])
        seconds = 1.0e12 / (per_gpu * gpus)
        assert float(r["days"]) == pytest.approx(seconds / 86400, rel=1e-12)
        assert float(r["gpu_hours"]) == pytest.approx(gpus * seconds / 3600, rel=1e-12)
        price = {"h100": 2.5, "mi355x": 3.0}[r["gpu"]]
        assert float(r["price_per_gpu_hour"]) == price
        assert float(r["cost"]) == pytest.approx(float(r["gpu_hours"]) * price, rel=1e-12)
        assert float(r["peak_gib"]) == pytest.approx(int(r["peak_bytes"]) / 2**30)
        assert int(r["peak_bytes"]) <= int(r["hbm_limit_bytes"])
        # the interval when the search result carries one (both ends or neither)
        lo, hi = r["tokens_per_s_per_gpu_low"], r["tokens_per_s_per_gpu_high"]
        assert (lo == "") == (hi == "")
        if lo:
            assert float(lo) <= per_gpu <= float(hi)


@pytest.mark.slow
def test_same_grid_same_file_with_local_processes(small, tmp_path):
    g, out, _ = small
    other = str(tmp_path / "workers.csv")
    run_sweep(load_grid(g).scenarios, other, LocalEngine(2))
    assert Path(other).read_bytes() == Path(out).read_bytes()


def test_resume_after_an_interrupt_computes_only_the_rest(small, tmp_path):
    g, out, _ = small
    scenarios = load_grid(g).scenarios
    part = str(tmp_path / "part.csv")
    seen = []

    def stop_after_two(row):
        seen.append(row["scenario_id"])
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(scenarios, part, SerialEngine(), on_row=stop_after_two)
    written = rows_of(part)  # a valid partial file with what had arrived
    assert [r["scenario_id"] for r in written] == seen
    computed = []
    report = run_sweep(scenarios, part, SerialEngine(), resume=True,
                       on_row=lambda r: computed.append(r["scenario_id"]))
    assert (report.resumed, report.computed) == (2, 2)
    assert sorted(computed) == sorted({s.scenario_id for s in scenarios} - set(seen))
    assert Path(part).read_bytes() == Path(out).read_bytes()
    # nothing left to do: nothing recomputed, the same file
    again = run_sweep(scenarios, part, SerialEngine(), resume=True)
    assert (again.resumed, again.computed) == (4, 0)
    assert Path(part).read_bytes() == Path(out).read_bytes()


def test_resume_recomputes_rows_whose_inputs_changed(small, tmp_path):
    _, out, _ = small
    changed = grid_file(tmp_path, SMALL.replace("mi355x: 3", "mi355x: 4"))
    copy = tmp_path / "copy.csv"
    copy.write_bytes(Path(out).read_bytes())
    report = run_sweep(load_grid(changed).scenarios, str(copy), SerialEngine(), resume=True)
    assert (report.resumed, report.computed) == (2, 2)  # the mi355x rows had another price
    assert {float(r["cost"]) / float(r["gpu_hours"]) for r in rows_of(str(copy))
            if r["gpu"] == "mi355x"} == {4.0}


def test_a_failing_scenario_is_a_row_and_the_rest_completes(small, tmp_path):
    g, _, _ = small
    good = list(load_grid(g).scenarios[:2])
    broken = dataclasses.replace(good[0], scenario_id="broken/n0", nodes=0, position=(9,))
    out = str(tmp_path / "failed.csv")
    report = run_sweep([*good, broken], out, SerialEngine())
    rows = {r["scenario_id"]: r for r in rows_of(out)}
    assert rows["broken/n0"]["status"] == "error"
    assert "num_nodes" in rows["broken/n0"]["reason"]
    assert [rows[s.scenario_id]["status"] for s in good] == ["ok", "ok"]
    assert report.failed == 1 and report.ok == 2


@pytest.mark.slow
def test_impossible_scenario_gives_the_reason_and_the_sweep_completes(tmp_path, run_cli):
    g = grid_file(tmp_path, "models: [llama3.1-405b, llama3-8b]\ngpus: [h100]\nnodes: [1]\n")
    out = tmp_path / "impossible.csv"
    code, stdout, err = run_cli("sweep", g, "--out", out, "--no-progress")
    assert code == 0, err
    assert "2 scenarios (2 computed, 0 kept" in stdout and "1 ok, 1 infeasible, 0 failed" in stdout
    rows = {r["model"]: r for r in rows_of(str(out))}
    big = rows["llama3.1-405b"]
    assert big["status"] == "infeasible" and big["feasible"] == "0" and big["tp"] == ""
    # the explanation the search command prints (README): 857.3 GiB at the least
    assert big["reason"].startswith("no configuration of llama3.1-405b on 1 x 8 h100")
    assert "857.3 GiB per GPU" in big["reason"]
    assert "needs at least 14 nodes of h100" in big["reason"]
    assert rows["llama3-8b"]["status"] == "ok"


BAD_GRIDS = [
    ("gpus: [h100]\nnodes: [1]\n", "grid key 'models' is missing"),
    ("models: [llama3-8b]\ngpus: [h100]\nnodes: [1]\nnode: [2]\n", "grid key 'node' is unknown"),
    ("models: [llama3-8b]\ngpus: [h100]\nnodes: [0]\n",
     "grid key 'nodes': 0 must be a whole number from 1"),
    ("models: [llama3-8b]\ngpus: [h100]\nnodes: [two]\n", "grid key 'nodes': 'two' must be"),
    ("models: [llama3-8b]\ngpus: [h100]\nnodes: []\n", "grid key 'nodes': the list is empty"),
    ("models: [llama-9b]\ngpus: [h100]\nnodes: [1]\n", "grid key 'models': 'llama-9b'"),
    ("models: [llama3-8b]\ngpus: [h900]\nnodes: [1]\n", "grid key 'gpus': 'h900'"),
    ("models: [llama3-8b]\ngpus: [h100]\nnodes: [1]\nprecision: [bf17]\n",
     "grid key 'precision': 'bf17' is not a precision; choose from bf16, fp8, fp4"),
    ("models: [llama3-8b]\ngpus: [h100]\nnodes: [1]\nconstraints: ['tq == 1']\n",
     "grid key 'constraints': 'tq == 1'"),
    ("models: [llama3-8b]\ngpus: [h100]\nnodes: [1]\nprice_per_gpu_hour: {b200: 4}\n",
     "grid key 'price_per_gpu_hour': 'b200' is not one of the grid's gpus (h100)"),
    ("models: [llama3-8b]\ngpus: [h100]\nnodes: [1]\ntokens: -5\n",
     "grid key 'tokens': -5 must be a positive number"),
    ("models: [llama3-8b, llama3-8b]\ngpus: [h100]\nnodes: [1]\n",
     "grid key 'models': 'llama3-8b' and 'llama3-8b' both name llama3-8b"),
    ("models: [llama3-8b]\ngpus: [h100]\nnodes: [1]\noverheads: {fragmentation: x}\n",
     "grid key 'overheads'"),
    ("models: [llama3-8b]\ngpus: [h100]\nnodes: [1]\nallow_cross_scale_up: yes please\n",
     "grid key 'allow_cross_scale_up': 'yes please' must be true or false"),
    ("models: [llama3-8b]\ngpus: [h100]\nnodes: [1]\nframework: nemo\n",
     "grid key 'framework': 'nemo' is not a framework; give one of megatron-lm, bridge, "
     "primus, torchtitan"),
    ("- just\n- a list\n", "expected a mapping of keys"),
    ("models: [llama3-8b\n", "not valid YAML"),
]


@pytest.mark.parametrize(("text", "message"), BAD_GRIDS)
def test_bad_grid_files_are_one_line_naming_the_key_and_value(tmp_path, text, message):
    with pytest.raises(GridError) as e:
        load_grid(grid_file(tmp_path, text))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_grid_on_the_command_line_exits_2_with_one_line(tmp_path, run_cli):
    g = grid_file(tmp_path, "models: [llama3-8b]\ngpus: [h100]\nnodes: [1, -2]\n")
    code, out, err = run_cli("sweep", g, "--out", tmp_path / "x.csv")
    assert code == 2 and out == ""
    assert err.strip() == ("tune-cp: error: grid key 'nodes': -2 must be a whole number from 1 "
                           "to 1048576")
    code, _, err = run_cli("sweep", g, "--out", tmp_path / "x.txt")
    assert code == 2 and "--out" in err and ".csv or .parquet" in err
    code, _, err = run_cli("sweep", tmp_path / "missing.yaml", "--out", tmp_path / "x.csv")
    assert code == 2 and "no such file" in err


def test_model_and_gpu_files_are_read_relative_to_the_grid(tmp_path):
    catalog = json.loads((Path(__file__).parent.parent / "oracle/catalog/gpus.json").read_text())
    entry = next(g for g in catalog["gpus"] if g["name"] == "h100")
    (tmp_path / "specs").mkdir()
    mine = {**entry, "name": "mygpu", "aliases": []}
    (tmp_path / "specs" / "mygpu.json").write_text(json.dumps(mine))
    g = load_grid(grid_file(tmp_path, "models: [llama3-8b]\ngpus: [specs/mygpu.json]\n"
                                      "nodes: [1]\n"))
    assert g.scenarios[0].gpu.name == "mygpu"
    assert g.scenarios[0].scenario_id == "llama3-8b/mygpu/n1/s8192/b128/bf16"


def test_parquet_needs_the_extra_else_round_trips(tmp_path, small):
    _, out, _ = small
    rows = read_rows(out)
    path = str(tmp_path / "r.parquet")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(Exception) as e:
            write_rows(path, rows)
        assert "tune-cp[sweep]" in str(e.value)
        return
    write_rows(path, rows)
    back = read_rows(path)
    assert back == rows
    assert all(math.isfinite(r["tokens_per_s_per_gpu"]) for r in back)


def test_nothing_of_ray_is_imported_without_it(small):
    import subprocess

    code = ("import sys; from tune_cp import cli; cli.run(['sweep', '--help']); "
            "import tune_cp.agent.sweep; from tune_cp import agent; print('ray' in sys.modules, 'matplotlib' in sys.modules)")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent, check=True)
    # (pyarrow is not checked: OR-Tools' cp_model imports pandas, which may import it)
    assert got.stdout.strip().splitlines()[-1] == "False False"


# ------------------------------------------------------------- --ray auto: which cluster


def test_ray_address_file_follows_rays_temp_dir_rule(tmp_path):
    from tune_cp.agent.sweep import ray_address_file

    assert ray_address_file({}) == Path("/tmp/ray/ray_current_cluster")
    assert ray_address_file({"RAY_TMPDIR": str(tmp_path), "TMPDIR": "/x"}) == (
        tmp_path / "ray" / "ray_current_cluster")
    if sys.platform.startswith("linux"):
        assert ray_address_file({"TMPDIR": "/x"}) == Path("/x/ray/ray_current_cluster")


def _free_port() -> int:
    import socket

    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ray_auto_starts_a_local_cluster_over_a_stale_cluster_file(tmp_path):
    """A head that was started (``ray start --head``) and stopped leaves
    /tmp/ray/ray_current_cluster behind; Ray's own auto (and ray.init() without an address)
    would join it and refuse. --ray auto joins only an address that answers, else starts its
    own (address "local"), and says which."""
    from tune_cp.agent.sweep import address_answers, auto_address

    env = {"RAY_TMPDIR": str(tmp_path)}
    assert auto_address(env) == ("local", "no Ray cluster is recorded on this machine")
    (tmp_path / "ray").mkdir()
    stale = f"127.0.0.1:{_free_port()}"
    (tmp_path / "ray" / "ray_current_cluster").write_text(stale + "\n")
    assert not address_answers(stale)
    where = tmp_path / "ray" / "ray_current_cluster"
    assert auto_address(env) == ("local", f"{where} names {stale}, which does not answer: a "
                                          f"head that is no longer running")
    import socket

    with socket.socket() as head:  # a head that runs: something listens at the address
        head.bind(("127.0.0.1", 0))
        head.listen()
        live = f"127.0.0.1:{head.getsockname()[1]}"
        where.write_text(live)
        assert address_answers(live) and address_answers(f"ray://{live}")
        assert auto_address(env) == (live, f"recorded in {where}")
        # RAY_ADDRESS wins over the file
        assert auto_address(env | {"RAY_ADDRESS": f"ray://{live}"}) == (
            f"ray://{live}", "from RAY_ADDRESS")
    # a RAY_ADDRESS that does not answer was asked for: an error, not a silent local cluster
    with pytest.raises(ConfigError) as e:
        auto_address(env | {"RAY_ADDRESS": stale})
    assert str(e.value) == (f"--ray auto: RAY_ADDRESS={stale} does not answer; start that "
                            f"cluster, or unset RAY_ADDRESS to start a local one")


def test_ray_client_address_without_grpc_names_the_extra(monkeypatch):
    """ray://... is Ray Client, which needs grpcio (ray[client]): without it one line naming
    the extra that brings it, before Ray tries to connect."""
    pytest.importorskip("ray")
    from tune_cp.agent.sweep import RayEngine

    monkeypatch.setitem(sys.modules, "grpc", None)  # import grpc raises ImportError
    engine = RayEngine("ray://127.0.0.1:1")
    assert not engine.ray.is_initialized()
    with pytest.raises(ConfigError) as e:
        list(engine.run([]))
    assert str(e.value) == ("--ray ray://127.0.0.1:1: Ray Client needs grpcio: pip install "
                            "'tune-cp[ray]' (it brings ray[client])")


def test_the_ray_extra_brings_ray_client():
    """pyproject's ray extra installs what --ray ray://head:10001 needs (ray[client])."""
    import tomllib

    data = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    extra = data["project"]["optional-dependencies"]["ray"]
    assert any(req.replace(" ", "").startswith("ray[client]") for req in extra), extra


def test_shared_tables_give_the_rows_of_fresh_tables(small):
    """Memory tables kept from one node count to the next (the worker cache, or the solver's
    own sharing across clusters) give the rows (best configuration, its peak bytes, the
    feasible count) of tables built afresh for every scenario."""
    from tune_cp.agent.sweep import WorkerCache, clear_solver_caches, run_scenario

    g, out, _ = small
    scenarios = load_grid(g).scenarios
    clear_solver_caches()
    shared = WorkerCache()
    rows = [run_scenario(s, shared) for s in scenarios]
    fresh = []
    for s in scenarios:
        clear_solver_caches()
        c = WorkerCache()
        c.enabled = False
        fresh.append(run_scenario(s, c))
    assert rows == fresh
    assert rows == read_rows(out)


def test_grid_settings_are_the_run_settings_search_takes(tmp_path):
    """The grid's settings become the same RunSettings ``search`` builds from its flags; a
    changed setting changes the scenario's digest (a resumed sweep recomputes it)."""
    from tune_cp.agent.sweep import scenario_inputs

    base = "models: [llama3-8b]\ngpus: [h100]\nnodes: [1]\n"
    plain = load_grid(grid_file(tmp_path, base, "a.yaml")).scenarios[0]
    cross = load_grid(grid_file(tmp_path, base + "allow_cross_scale_up: true\nmemory_margin: 0.1\n"
                                "constraints: ['cp == 1']\n", "b.yaml")).scenarios[0]
    _, _, opts = scenario_inputs(cross)
    assert opts.settings.allow_cross_scale_up is True and opts.settings.memory_margin == 0.1
    assert [c.expr for c in opts.settings.constraints] == ["cp == 1"]
    _, _, opts = scenario_inputs(plain)
    assert opts.settings.allow_cross_scale_up is False
    assert opts.settings.memory_margin == DEFAULT_MEMORY_MARGIN
    assert plain.digest != cross.digest


@pytest.mark.parametrize(("framework", "gpu", "precision"),
                         [("torchtitan", "h100", "bf16"), ("bridge", "b200", "fp8")])
def test_grid_key_framework_gives_the_search_with_the_same_flag(tmp_path, run_json, framework,
                                                                 gpu, precision):
    """``framework:`` in a grid is ``search --framework``: its defaults for the settings not given
    (Bridge: bf16 gradients, FP8 parameters, no fragmentation allowance) and its family's memory
    spread in the answer rule (torchtitan's high 1.69: Llama 3 8B on 8 H100 answers TP2 PP2 at
    47.2 GiB, not Megatron's TP2 PP1 at 58.3 GiB)."""
    g = grid_file(tmp_path, f"models: llama3-8b\ngpus: {gpu}\nnodes: 1\nprecision: {precision}\n"
                            f"framework: {framework}\n")
    out = str(tmp_path / "r.csv")
    run_sweep(load_grid(g).scenarios, out, SerialEngine())
    (r,) = rows_of(out)
    code, data = run_json("--model", "llama3-8b", "--gpu", gpu, "--nodes", "1", "--precision",
                          precision, "--framework", framework)
    best = data["best"]
    assert code == 0 and r["status"] == "ok"
    for k in ("tp", "pp", "vpp", "cp", "dp", "mbs", "ga"):
        assert int(r[k]) == best[k], k
    assert (r["recompute"], r["grad_reduce_in_fp32"]) == (best["recompute"],
                                                          str(best["grad_reduce_in_fp32"]).lower())
    assert int(r["peak_bytes"]) == best["memory"]["peak_bytes"]
    assert float(r["tokens_per_s_per_gpu"]) == pytest.approx(
        best["projection"]["tokens_per_s_per_gpu"], rel=1e-12)
    if framework == "torchtitan":
        assert (best["tp"], best["pp"]) == (2, 2)
    else:
        assert best["fp8_param_gather"] is True and best["grad_reduce_in_fp32"] is False


def test_grid_key_fp8_param_gather_is_the_search_flag(tmp_path, run_json):
    """``fp8_param_gather: true``: the FP8 scenarios are ``search --fp8-param-gather``; a bf16
    one is an error row with the search's own refusal."""
    g = grid_file(tmp_path, "models: llama3-8b\ngpus: b200\nnodes: 1\nprecision: [fp8, bf16]\n"
                            "fp8_param_gather: true\n")
    out = str(tmp_path / "r.csv")
    run_sweep(load_grid(g).scenarios, out, SerialEngine())
    fp8, bf16 = rows_of(out)
    code, data = run_json("--model", "llama3-8b", "--gpu", "b200", "--nodes", "1", "--precision",
                          "fp8", "--fp8-param-gather")
    assert code == 0 and fp8["status"] == "ok" and data["best"]["fp8_param_gather"] is True
    assert int(fp8["peak_bytes"]) == data["best"]["memory"]["peak_bytes"]
    assert bf16["status"] == "error" and bf16["reason"].startswith(
        "--fp8-param-gather keeps only FP8 copies of the weights, so it needs FP8 training")
    with pytest.raises(GridError, match="grid key 'fp8_param_gather': 'yes' must be true or false"):
        load_grid(grid_file(tmp_path, "models: llama3-8b\ngpus: b200\nnodes: 1\n"
                                      "fp8_param_gather: 'yes'\n", "bad.yaml"))


def test_local_workers_start_under_a_console_script_without_a_main_guard(tmp_path):
    """Issue 29's independent campaign (benchmarks/attack.py): under a console script that is
    ``sys.exit(entry())`` with no ``if __name__ == "__main__"`` guard (this checkout's
    ``.venv/bin/tune-cp``), every forkserver/spawn worker re-ran the whole command while
    bootstrapping and died ("An attempt has been made to start a new process before the current
    process has finished its bootstrapping phase"): each scenario of ``sweep --workers 2`` was
    an error row, exit 1. Workers now import ``tune_cp.cli`` by name
    (``cli.py::_workers_import_this_module``)."""
    import subprocess
    import sys

    script = tmp_path / "tune-cp-unguarded"
    script.write_text("import sys\nfrom tune_cp.cli import entry\nsys.exit(entry())\n")
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\nmodels: [llama2-7b]\ngpus: [h100]\nnodes: [1, 2]\n"
                    "seq_len: [2048]\nglobal_batch: [64]\n")
    p = subprocess.run([sys.executable, str(script), "sweep", str(grid), "--out",
                        str(tmp_path / "s.csv"), "--workers", "2", "--no-progress"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-400:]
    assert "bootstrapping" not in p.stderr and "internal error" not in p.stderr
    assert "2 ok, 0 infeasible, 0 failed" in p.stdout, p.stdout
