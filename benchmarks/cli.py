"""Whole-process cost of the tune-cp commands a new user types first: CPU and wall time.

Each command runs ``--runs`` times as a fresh ``python cli.py ...`` process (output discarded);
the table gives the median CPU time (user + system, from the child's ``wait4`` resource usage:
on a shared machine CPU time is what the command costs, wall time also counts the wait for a
core) and the median wall time. The import share is the median CPU time of a process that only
imports the modules the command loaded (in the order it loaded them), divided by the command's
CPU time. The machine (CPU count, model) and its load average before and after are printed
with the table.

The checkout's own modules are byte-compiled first (``compileall``, as ``pip install`` does when
it installs tune-cp), so every run reads the ``.pyc`` files an installed tune-cp has; the
command's own caches (none persist between runs) start empty each time. ``--no-compile`` leaves
the checkout as it is: with ``PYTHONDONTWRITEBYTECODE`` set, as on the project's machines, each
run then also compiles tune-cp's sources (about 0.3 s of CPU for the search).

    python benchmarks/cli.py                      # this checkout, 5 runs per command
    python benchmarks/cli.py --runs 3 --only help,search
    python benchmarks/cli.py --root /tmp/old      # another checkout of tune-cp (before/after)
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (name, arguments): the README's examples (README.md, "Search", "Check", "Plan capacity",
#: "Verify on your cluster"); ``{tmp}`` is the run's temporary folder.
COMMANDS: list[tuple[str, list[str]]] = [
    ("help", ["--help"]),
    ("models", ["models"]),
    ("check", ["check", "--model", "mixtral-8x22b", "--gpu", "mi355x", "--nodes", "4", "--pp",
               "4", "--vpp", "2", "--ep", "8", "--recompute", "full", "--recompute-layers", "1"]),
    ("search", ["--model", "mixtral-8x22b", "--nodes", "4"]),
    ("plan", ["plan", "--model", "llama3.1-405b", "--gpu", "h100,b200", "--tokens", "15e12",
              "--price-per-gpu-hour", "h100=2.5,b200=4", "--points", "4"]),
    # README "Verify on your cluster" (written to a temporary file: --out is replaced there)
    ("calibrate", ["calibrate", "--log", "tests/data/logs/megatron_mixtral8x7b_h100_issue756.log",
                   "--gpu", "h100", "--model", "mixtral-8x7b", "--out", "{tmp}/mixtral-h100.json"]),
]

#: Runs the CLI like ``python cli.py ARGS`` (exit code kept), then writes the names of the
#: modules it loaded, in load order, to the file named by the first argument.
PROBE = """
import sys
out, args = sys.argv[1], sys.argv[2:]
sys.argv = ["cli.py", *args]
import runpy
code = 0
try:
    runpy.run_path("cli.py", run_name="__main__")
except SystemExit as e:
    code = e.code or 0
with open(out, "w") as fh:
    fh.write("\\n".join(m for m in list(sys.modules) if m != "__main__"))
sys.exit(code)
"""

#: Imports the modules listed in the file named by the first argument: tune-cp's own first (in
#: the order they finished loading), then the rest, with the BLAS thread count tune-cp's entry
#: point sets. (``sys.modules`` lists a module once it has
#: finished loading, after what it imported: importing ``ortools.sat.python.cp_model`` before
#: ``solver.cpsat`` would load pandas, which the command did not.)
IMPORTER = """
import importlib, os, sys
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as tune-cp's entry point (cli.BLAS_THREADS)
names = open(sys.argv[1]).read().split()
own = [n for n in names if n.split(".")[0] == "tune_cp"]
for name in own + [n for n in names if n not in own]:
    try:
        importlib.import_module(name)
    except Exception:
        pass
"""


def timed(cmd: list[str], cwd: Path) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, exit code) of one process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, wall, proc.returncode


def loaded_modules(args: list[str], cwd: Path, path: Path) -> None:
    subprocess.run([sys.executable, "-c", PROBE, str(path), *args], cwd=cwd,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def compile_checkout(root: Path) -> None:
    """Byte-compile tune-cp's modules under ``root`` (the ``__pycache__`` files ``pip install``
    writes for an installed package)."""
    compileall.compile_file(str(root / "cli.py"), quiet=2)
    for pkg in ("oracle", "solver", "agent", "formats"):
        if (root / pkg).is_dir():
            compileall.compile_dir(str(root / pkg), quiet=2)


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({model}), Python {platform.python_version()}"


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs per command (median shown)")
    ap.add_argument("--only", default=None, help="comma-separated names: "
                    + ", ".join(n for n, _ in COMMANDS))
    ap.add_argument("--root", type=Path, default=ROOT, help="the tune-cp checkout to run")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--no-compile", action="store_true",
                    help="do not byte-compile the checkout first (see the module docstring)")
    opts = ap.parse_args()
    wanted = set(opts.only.split(",")) if opts.only else {n for n, _ in COMMANDS}
    root = opts.root.resolve()
    if not opts.no_compile:
        compile_checkout(root)
    load_before = load()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in COMMANDS:
            if name not in wanted:
                continue
            args = [a.replace("{tmp}", tmp) for a in args]
            mods = Path(tmp, f"{name}.txt")
            loaded_modules(args, root, mods)  # also warms the bytecode cache
            runs = [timed([sys.executable, "cli.py", *args], root) for _ in range(opts.runs)]
            imports = [timed([sys.executable, "-c", IMPORTER, str(mods)], root)[0]
                       for _ in range(opts.runs)]
            cpu = statistics.median(r[0] for r in runs)
            rows.append({
                "command": name, "args": args, "exit": runs[0][2],
                "cpu_s": cpu, "cpu_min_s": min(r[0] for r in runs),
                "wall_s": statistics.median(r[1] for r in runs),
                "import_cpu_s": statistics.median(imports),
                "import_share": statistics.median(imports) / cpu if cpu else 0.0,
                "libraries": sorted({m.split(".")[0] for m in mods.read_text().split()}
                                    & {"ortools", "pandas", "numpy", "dspy", "matplotlib",
                                       "pydantic", "yaml"}),
            })
    info = {"machine": machine(), "root": str(root), "runs": opts.runs,
            "bytecode": "as checked out" if opts.no_compile else "compiled first (as pip install)",
            "load_average_before": load_before, "load_average_after": load()}
    if opts.json:
        print(json.dumps({**info, "rows": rows}, indent=2))
        return
    print(f"tune-cp start-up and command cost ({root}); {info['machine']}")
    print(f"median of {opts.runs} runs; load average (1, 5, 15 min) before {load_before}, "
          f"after {info['load_average_after']}; tune-cp's bytecode {info['bytecode']}")
    print(f"{'command':9} {'CPU s':>6} {'(min)':>6} {'wall s':>7} {'imports CPU s':>13} "
          f"{'share':>6}  {'exit':>4}  heavy libraries loaded")
    for r in rows:
        print(f"{r['command']:9} {r['cpu_s']:>6.2f} {r['cpu_min_s']:>6.2f} {r['wall_s']:>7.2f} "
              f"{r['import_cpu_s']:>13.2f} {100 * r['import_share']:>5.0f}%  {r['exit']:>4}  "
              f"{', '.join(r['libraries']) or '-'}")
    print("CPU = user + system of the whole process; imports = a process that only imports "
          "what the command loaded.")
    for name, args in COMMANDS:
        if name in wanted:
            print(f"  {name}: tune-cp {' '.join(args)}")


if __name__ == "__main__":
    main()
