"""The add-an-axis recipe (docs/architecture.md, "Adding a parallel axis"), shown with a test axis.

A process registers a plain integer axis ``xp`` (``config/axes.py::register_axis``: a ``Knob``
and an ``Axis`` with its values), gives ``ParallelConfig`` its field and adds its legality, one
rule family (``xp <= tp``: ``solver/rules.py::register_rule``, as a new entry of ``RULES``
and ``FAMILY_AXES`` would), before any other tune-cp module is imported; nothing else is
edited. The CLI then takes ``--xp`` (check, search,
plan) and ``--baseline xp=2``, a constraint may name it, the search enumerates it (the raw
space doubles, every legal layout at both values), the seed phase moves it, ``--json`` shows
it, the check line of the answer carries it, the sweep has its column and the exporters write
it by their framework spelling; CP-SAT encodes the rule from the rule itself
(``solver/model.py::encode_from_rule``) and accepts the same set as the plain Python loop.
The axis has no memory or time term, so every figure is the same at both values: what a real
axis adds besides is its term (``oracle/memory.py``, ``oracle/work.py`` + ``timing.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SETUP = """
from pydantic import Field

import tune_cp.config.specs as S


class ParallelConfig(S.ParallelConfig):
    xp: int = Field(default=1, ge=1, le=S.MAX_GPUS, description="a test axis")


S.ParallelConfig = ParallelConfig  # the field (in the configuration spec)
from tune_cp.config import axes as A  # noqa: E402

A.register_axis(  # the registry entry
    A.Knob("xp", "xp", "xp", "Test-parallel size (a test axis).", default=1,
           combinable=True, attributed=True, plain=True,
           megatron="test_parallel_size", bridge="model.test_parallel_size"),
    A.Axis("xp", "1 and 2 (a test axis)", walk=len(A.AXIS_TABLE), values=(1, 2),
           seed_values=(1, 2)))
from tune_cp.solver import rules as R  # noqa: E402


def test_parallel(ctx):  # its legality (a family of solver/rules.py)
    c = ctx.cfg
    return [R.Violation("test_parallel", f"xp ({c.xp}) must be at most tp ({c.tp}); choose "
                        f"xp in {{1..{c.tp}}}", ("xp",))] if c.xp > c.tp else []


R.register_rule("test_parallel", test_parallel, ("tp", "xp"))
"""

PROBE = """
import json
from click.testing import CliRunner

from tune_cp.cli import main
from tune_cp.agent import sweep
from tune_cp.config.axes import AXES, BASELINE_KEYS, COMBINATION_AXES
from tune_cp.formats.export import plain_axis_values
from tune_cp.formats.keys import KNOB_BRIDGE, KNOB_DEST
from tune_cp.solver.constraints import NAMES

run = CliRunner().invoke
base = ["--model", "llama3-8b", "--gpu", "h100", "--nodes", "1"]
out = {}
out["help"] = "--xp INTEGER" in run(main, ["check", "--help"]).output
chk = run(main, ["check", *base, "--tp", "2", "--xp", "2", "--json"])
out["check_exit"] = chk.exit_code
out["check_xp"] = json.loads(chk.output)["config"]["xp"]
illegal = run(main, ["check", *base, "--tp", "1", "--xp", "2"])
out["illegal_exit"], out["illegal"] = illegal.exit_code, illegal.output
bad = run(main, ["check", *base, "--xp", "0"])
out["bad_exit"], out["bad_line"] = bad.exit_code, bad.output.strip().splitlines()[-1]
srch = run(main, ["search", *base, "--json", "--top", "2"])
res = json.loads(srch.output)
out["search_exit"] = srch.exit_code
out["feasible"], out["candidates"] = res["feasible_count"], res["candidates"]
pinned = run(main, ["search", *base, "--json", "--constraint", "xp == 2",
                    "--baseline", "tp=2,xp=2"])
out["pinned_exit"] = pinned.exit_code
out["pinned"] = json.loads(pinned.output)
from tune_cp.oracle.catalog import load_gpu, load_model
from tune_cp.config.specs import ClusterSpec, TrainingSpec
from tune_cp.solver.space import default_space
space_cluster = ClusterSpec(gpu=load_gpu("h100"), num_nodes=1, gpus_per_node=8)
space_training = TrainingSpec(seq_len=8192, global_batch_size=128)
space = default_space(load_model("llama3-8b"), space_cluster, space_training)
out["domain"], out["size"], out["size_1"] = space.xp, space.size(), space.fix(xp=1).size()
# CP-SAT (the family encoded from the rule) and the plain Python loop accept the same set
from tune_cp.solver.feasible import enumerate_problem
from tune_cp.solver.problem import Problem
from tune_cp.solver.reference import reference_enumerate
small = space.with_domains(pp=(1, 2), cp=(1,), vpp=(1,), mbs=(1,), recompute=space.recompute[:2])
p = Problem(model=load_model("llama3-8b"), cluster=space_cluster, training=space_training,
            space=small)
a, b = enumerate_problem(p), reference_enumerate(p)
out["same"] = ([(f.candidate, f.peak_bytes) for f in a.configs]
               == [(f.candidate, f.peak_bytes) for f in b.configs] and a.removed == b.removed)
out["removed"] = a.removed.get("test_parallel")
out["xp_tp"] = sorted({(f.candidate["xp"], f.candidate["tp"]) for f in a.configs})
text = run(main, ["search", *base, "--constraint", "xp == 2"]).output
out["check_line"] = [ln for ln in text.splitlines() if "check it: tune-cp check" in ln]
out["axes"] = AXES
out["baseline_keys"] = "xp" in BASELINE_KEYS
out["planner"] = "xp" in COMBINATION_AXES
out["names"] = NAMES
out["sweep"] = "xp" in sweep.CONFIG_COLUMNS and "xp" in sweep.COLUMN_NAMES
from tune_cp.config.specs import ParallelConfig
cfg = ParallelConfig(xp=2)
out["megatron"] = plain_axis_values(cfg, KNOB_DEST)
out["bridge"] = plain_axis_values(cfg, KNOB_BRIDGE)
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    code = textwrap.dedent(SETUP) + textwrap.dedent(PROBE)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def _find(obj, key):
    """Every value of ``key`` anywhere in a JSON document."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                yield v
            yield from _find(v, key)
    elif isinstance(obj, list):
        for v in obj:
            yield from _find(v, key)


def test_the_registry_and_the_derived_lists_take_the_axis(probe):
    assert probe["axes"][-2:] == ["xp", "recompute"]
    assert probe["baseline_keys"] and probe["planner"]
    assert probe["names"][-1] == "xp"  # a constraint may name it
    assert probe["sweep"]


def test_the_cli_flags_and_check(probe):
    assert probe["help"]
    assert probe["check_exit"] == 0 and probe["check_xp"] == 2
    # the flag's range is the knob's (lo 1): one line, exit 2
    assert probe["bad_exit"] == 2, probe["bad_line"]
    assert "--xp" in probe["bad_line"]


def test_the_search_enumerates_and_shows_it(probe):
    assert probe["domain"] == [1, 2]  # the registry's values
    assert probe["size"] == 2 * probe["size_1"]
    assert probe["search_exit"] == 0
    pinned = probe["pinned"]
    assert probe["pinned_exit"] == 0
    # the constraint keeps the layouts at xp 2 (of the same raw space), the rule those of
    # tp >= 2 among them
    assert probe["candidates"] == pinned["candidates"]
    assert 0 < pinned["feasible_count"] < probe["feasible"] / 2
    assert pinned["best"]["tp"] >= 2
    # the seed phase moves it (from the baseline's 2)
    assert any(m["change"] == "xp 2->1" for m in pinned["seed_moves"])
    # the answer and the baseline hold xp 2 (the constraint and --baseline name it)
    assert set(_find(pinned, "xp")) == {2}, sorted(set(_find(pinned, "xp")))
    # the check line of the answer carries the axis
    assert probe["check_line"] and all("--xp 2" in ln for ln in probe["check_line"])


def test_its_rule_is_one_function(probe):
    """The family is encoded for CP-SAT from the rule itself: the same set as the Python loop,
    and the rule's line on a check."""
    assert probe["same"]
    assert probe["removed"] > 0
    assert [2, 1] not in probe["xp_tp"] and [2, 2] in probe["xp_tp"] and [1, 1] in probe["xp_tp"]
    assert probe["illegal_exit"] == 1
    assert "xp (2) must be at most tp (1); choose xp in {1..1}" in probe["illegal"]


def test_the_exporters_spell_it(probe):
    assert probe["megatron"] == [["test_parallel_size", 2]]
    assert probe["bridge"] == [["model.test_parallel_size", 2]]
