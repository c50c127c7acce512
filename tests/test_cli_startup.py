"""Start-up: which libraries each command loads (issue 14). What they cost is measured by
``benchmarks/cli.py``, not here; these tests pin that the light commands stay light."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("ortools", "pandas", "numpy", "dspy", "matplotlib")

PROBE = """
import contextlib, io, json, sys
from tune_cp import cli
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    code = cli.run(json.loads(sys.argv[1]))
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))
print(json.dumps({"code": code, "heavy": heavy}))
"""


def fresh_python(code: str, *args: str) -> str:
    """What ``python -c CODE ARGS`` prints in a fresh interpreter (from the checkout root)."""
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


def loaded(*args: str) -> tuple[int, list[str]]:
    """Exit code of ``tune-cp ARGS`` in a fresh interpreter and the heavy libraries it loaded."""
    out = json.loads(fresh_python(PROBE, json.dumps(args), json.dumps(HEAVY)).splitlines()[-1])
    return out["code"], out["heavy"]


@pytest.mark.parametrize("args", [
    ("--help",), ("--version",), ("models",), ("gpus",), ("models", "--json"),
    ("check", "--help"), ("plan", "--help"), ("search", "--help"),
    ("--model", "mixtral-8x22b", "--nodes", "0"),          # a flag error
    ("--model", "no-such-model", "--nodes", "4"),          # an unknown catalog name
])
def test_light_commands_load_no_heavy_library(args):
    code, heavy = loaded(*args)
    assert heavy == [], f"tune-cp {' '.join(args)} (exit {code}) loaded {heavy}"


@pytest.mark.parametrize("tp,exit_code", [(2, 0), (3, 1)])  # legal; tp 3 divides no head count
def test_check_loads_numpy_but_not_the_solver(tp, exit_code):
    """A check resolves its configuration with the one vectorised resolver
    (``config/resolve.py``, numpy) before any rule runs, so an illegal layout loads numpy too;
    neither loads the solver (ortools) nor the LLM phase."""
    code, heavy = loaded("check", "--model", "llama3-8b", "--nodes", "1", "--tp", str(tp))
    assert code == exit_code
    assert heavy == ["numpy"]


def test_cp_model_without_pandas_still_has_its_pandas_helpers():
    probe = ("import sys\nfrom tune_cp.solver.cpsat import cp_model\n"
             "assert 'pandas' not in sys.modules\n"
             "import pandas as pd\n"
             "xs = cp_model.CpModel().new_int_var_series('x', pd.Index(range(3)), 0, 5)\n"
             "print(type(xs).__name__, len(xs))")
    assert fresh_python(probe).split() == ["Series", "3"]


class _Terminal:
    """A stand-in stderr that says it is a terminal and keeps what is written."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass


def test_progress_bar_draws_only_on_a_terminal(monkeypatch):
    from tune_cp import cli

    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    bar = cli.Progress("planning")
    bar.bar(3, 4, "h100: 16 nodes")
    bar.close()
    assert "planning [##################......] 3/4 h100: 16 nodes" in term.text
    assert term.text.endswith("\r\x1b[K")  # the line is erased when done


def test_plan_reports_progress_that_ends_exact(run_cli):
    from tune_cp.agent.plan import plan, training_for_precision
    from tune_cp.config.specs import Precision
    from tune_cp.oracle.catalog import load_gpu, load_model

    calls: list[tuple[int, int, str]] = []
    model = load_model("llama3-8b")
    plans = plan(model, [(load_gpu("h100"), 8), (load_gpu("b200"), 8)],
                 training_for_precision(8192, 128, Precision.BF16), max_nodes=4, points=2,
                 progress=lambda done, total, what: calls.append((done, total, what)))
    evaluated = sum(len(p.points) for p in plans)  # every node count here is a table row
    assert [c[0] for c in calls] == list(range(evaluated + 1))
    assert calls[-1] == (evaluated, evaluated, "done")
    assert all(done <= total for done, total, _ in calls)
    assert calls[0][2] == "h100: 1 node"
    # without a terminal nothing is drawn: the CLI's stderr stays empty
    code, out, err = run_cli("plan", "--model", "llama3-8b", "--gpu", "h100", "--max-nodes",
                             "2", "--points", "2")
    assert code == 0 and err == "" and "fits from 1 node" in out


def test_specs_build_without_the_pydantic_plugin_scan():
    """Building specs does not import importlib.metadata (pydantic's plugin scan,
    ``config/_plugins.py``), and the validators still refuse bad values."""
    probe = ("import sys\nfrom tune_cp.oracle.catalog import load_model\nfrom tune_cp.config.specs import "
             "ParallelConfig\nload_model('llama3-8b')\n"
             "try:\n    ParallelConfig(tp=0)\nexcept ValueError:\n    print('refused')\n"
             "print('importlib.metadata' in sys.modules)")
    assert fresh_python(probe).split() == ["refused", "False"]


ENTRY_PROBE = """
import json, os, sys
from tune_cp import cli
cli.run = lambda argv=None: 0
try:
    cli.entry()
except SystemExit as e:
    print(json.dumps({"code": e.code, "blas": os.environ.get("OPENBLAS_NUM_THREADS"),
                      "ends": cli._PROCESS_ENDS_WITH_COMMAND}))
"""


@pytest.mark.parametrize("given, expected", [(None, "1"), ("4", "4")])
def test_entry_runs_one_blas_thread_unless_the_environment_says(given, expected):
    """The ``tune-cp`` entry point sets OpenBLAS to one thread before any command imports numpy,
    and keeps a user's own setting; it marks the process as ending with its command."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    out = subprocess.run([sys.executable, "-c", ENTRY_PROBE], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out.splitlines()[-1]) == {"code": 0, "blas": expected, "ends": True}


GC_PROBE = """
import contextlib, gc, io, json
from tune_cp import cli
args = ["--model", "llama3-8b", "--gpu", "h100", "--nodes", "1", "--top", "1"]
out = {}
with contextlib.redirect_stdout(io.StringIO()):
    out["in_process"] = [cli.run(args), gc.isenabled(), gc.get_freeze_count()]
    cli._PROCESS_ENDS_WITH_COMMAND = True  # as cli.entry: the process ends with the command
    out["one_shot"] = [cli.run(args), gc.isenabled(), gc.get_freeze_count() > 0]
print(json.dumps(out))
"""


def test_search_runs_without_the_cyclic_collector():
    """The search command turns the cyclic garbage collector off: called in-process it is
    restored afterwards (nothing frozen); in the ``tune-cp`` process, which ends with the
    command, it stays off and the objects left are frozen (no collector pass over them)."""
    out = json.loads(fresh_python(GC_PROBE).splitlines()[-1])
    assert out == {"in_process": [0, True, 0], "one_shot": [0, False, True]}


def test_or_tools_is_loaded_with_lazy_binding_and_the_flags_restored():
    """``solver/cpsat.py`` imports OR-Tools' native library with ``RTLD_LAZY`` and gives the
    process its dlopen flags back."""
    out = fresh_python(
        "import os, sys; before = sys.getdlopenflags(); seen = []\n"
        "import importlib\n"
        "real = importlib.import_module\n"
        "def spy(name, *a):\n"
        "    if name == 'ortools.sat.python.cp_model': seen.append(sys.getdlopenflags())\n"
        "    return real(name, *a)\n"
        "importlib.import_module = spy\n"
        "import tune_cp.solver.cpsat\n"
        "print(before == sys.getdlopenflags(), bool(seen[0] & os.RTLD_LAZY),"
        " not seen[0] & os.RTLD_NOW)")
    assert out.split() == ["True", "True", "True"]
