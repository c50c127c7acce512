"""Scenarios per second of a sweep, three ways, on a fixed grid (``benchmarks/grids/bench200.yaml``,
216 small scenarios):

1. one process per scenario: the main command (``tune-cp --model M --gpu G --nodes N --seq-len S
   --gbs B --json``), one after another, as a shell loop would run the grid; on every
   ``--per-process-every``-th scenario (default 8: a stride sample across the whole grid; 1 runs
   them all), its rate is scenarios / wall time of that sample;
2. ``tune-cp sweep GRID --workers 2`` (local processes);
3. ``tune-cp sweep GRID --ray auto --workers 2`` (a local 2-CPU Ray cluster started by the
   command, its start-up included), when Ray is installed in this interpreter.

The result files of 2 and 3 must be identical (checked). Then the worker-level cache: the same
scenarios in this process with the shared memory tables on and off (CPU seconds, alternating).

    python benchmarks/sweep.py                  # the table
    python benchmarks/sweep.py --per-process-every 1 --skip-cache
"""

from __future__ import annotations

import argparse
import filecmp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GRID = ROOT / "benchmarks" / "grids" / "bench200.yaml"


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=False, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def per_process(grid, every: int) -> tuple[int, float]:
    sample = grid.scenarios[::every]
    t = time.perf_counter()
    for sc in sample:
        cmd = [sys.executable, "cli.py", "--model", sc.model.name, "--gpu", sc.gpu.name,
               "--nodes", str(sc.nodes), "--gpus-per-node", str(sc.gpus_per_node),
               "--seq-len", str(sc.seq_len), "--gbs", str(sc.global_batch),
               "--precision", sc.precision.value, "--json"]
        subprocess.run(cmd, cwd=ROOT, check=False, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return len(sample), time.perf_counter() - t


def cache_gain(grid, n: int) -> tuple[float, float]:
    """CPU seconds of the first ``n`` scenarios in this process with the memoised memory tables
    kept from one scenario to the next (on) and forgotten before each (off); best of two,
    alternating."""
    from tune_cp.agent.sweep import WorkerCache, clear_solver_caches, run_scenario

    sample = grid.scenarios[:n]
    times: dict[bool, list[float]] = {False: [], True: []}
    for keep in (False, True, False, True):
        clear_solver_caches()
        cache = WorkerCache()
        cache.enabled = keep
        t = time.process_time()
        for sc in sample:
            if not keep:
                clear_solver_caches()
            run_scenario(sc, cache)
        times[keep].append(time.process_time() - t)
    return min(times[False]), min(times[True])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default=str(GRID))
    ap.add_argument("--per-process-every", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip-cache", action="store_true")
    ap.add_argument("--cache-scenarios", type=int, default=36)
    args = ap.parse_args()

    from tune_cp.agent.sweep import load_grid

    grid = load_grid(args.grid)
    total = len(grid.scenarios)
    rows = []
    k, wall = per_process(grid, args.per_process_every)
    base = k / wall
    rows.append((f"one process per scenario ({k} of {total}, every "
                 f"{args.per_process_every}th)", k, wall, base))
    with tempfile.TemporaryDirectory() as d:
        out_w = os.path.join(d, "workers.csv")
        wall = timed([sys.executable, "cli.py", "sweep", args.grid, "--out", out_w,
                      "--workers", str(args.workers), "--no-progress"])
        rows.append((f"tune-cp sweep --workers {args.workers}", total, wall, total / wall))
        same = None
        try:
            import ray  # noqa: F401
        except ImportError:
            rows.append(("tune-cp sweep --ray auto (Ray not installed: skipped)", 0, 0.0, None))
        else:
            out_r = os.path.join(d, "ray.csv")
            wall = timed([sys.executable, "cli.py", "sweep", args.grid, "--out", out_r,
                          "--ray", "auto", "--workers", str(args.workers), "--no-progress"])
            rows.append((f"tune-cp sweep --ray auto (local {args.workers}-CPU cluster, start-up "
                         f"included)", total, wall, total / wall))
            same = os.path.exists(out_r) and filecmp.cmp(out_w, out_r, shallow=False)
    print(f"grid {args.grid} ({total} scenarios), {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    print(f"{'way':72} {'scenarios':>9} {'wall s':>8} {'scen/s':>7} {'x per-process':>13}")
    for name, n, w, rate in rows:
        if rate is None:
            print(f"{name:72} {'-':>9} {'-':>8} {'-':>7} {'-':>13}")
            continue
        print(f"{name:72} {n:>9} {w:>8.1f} {rate:>7.2f} {rate / base:>12.1f}x")
    if same is not None:
        print(f"--workers and --ray result files identical: {'yes' if same else 'NO'}")
    if not args.skip_cache:
        off, on = cache_gain(grid, args.cache_scenarios)
        print(f"worker cache, first {args.cache_scenarios} scenarios in one process (CPU s, best "
              f"of 2): memory tables rebuilt per scenario {off:.1f}, kept across scenarios "
              f"{on:.1f} ({100 * (off - on) / off:+.1f}% saved)")


if __name__ == "__main__":
    main()
