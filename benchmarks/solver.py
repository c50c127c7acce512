"""Feasible-set size and enumeration time: CP-SAT beside the plain Python loop.

    python benchmarks/solver.py [--python-cap N] [--quick] [--workers N]

For each case (model defaults for sequence length and global batch from the catalog, the
default search space, every family on): the raw space size, the feasible-set size, the CP-SAT
models solved (of the slices of the space), CP-SAT's time on one core (model build + enumeration +
decoding + removal counts, one worker, one process; wall time, and the process's CPU time)
and, with ``--workers N`` (N > 1), the wall time with the slices spread over N processes; and
the plain Python loop (``solver/reference.py``) on the same space. A space larger than ``--python-cap`` raw
candidates is not looped over: the loop runs on a uniform random sample of that many
candidates and its time and feasible count are scaled to the whole space (marked ``~``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tune_cp.config.specs import ClusterSpec, TrainingSpec
from tune_cp.oracle.catalog import load_gpu, load_model
from tune_cp.solver.feasible import enumerate_problem
from tune_cp.solver.problem import Problem
from tune_cp.solver.reference import reference_enumerate
from tune_cp.solver.space import default_space

CASES: tuple[tuple[str, str, int], ...] = (
    ("mixtral-8x22b", "mi355x", 4),
    ("mixtral-8x22b", "mi355x", 16),
    ("mixtral-8x22b", "mi355x", 64),
    ("mixtral-8x22b", "mi355x", 256),
    ("llama3.1-405b", "h100", 16),
    ("llama3.1-405b", "h100", 128),
    ("llama3.1-405b", "h100", 1024),
)
#: Largest space the Python loop runs on in full; larger ones are sampled.
DEFAULT_PYTHON_CAP = 20_000
SEED = 0


def problem_for(model_name: str, gpu_name: str, nodes: int) -> Problem:
    model, gpu = load_model(model_name), load_gpu(gpu_name)
    cluster = ClusterSpec(gpu=gpu, num_nodes=nodes, gpus_per_node=gpu.gpus_per_node)
    training = TrainingSpec(seq_len=model.default_seq_len,
                            global_batch_size=model.default_global_batch_size)
    return Problem(model=model, cluster=cluster, training=training,
                   space=default_space(model, cluster, training))


def cold() -> None:
    """Forget the memoised oracle tables (the solver's and the oracle's stage counts) and the
    memoised table analysis (``solver/symbolic.py``) so that each timed enumeration starts as
    the first one of a process would."""
    from tune_cp.oracle.memory import stage_counts_by_kind
    from tune_cp.solver import symbolic
    from tune_cp.solver.model import _CACHES

    _CACHES.clear()
    stage_counts_by_kind.cache_clear()
    symbolic._PLANS.clear()
    symbolic._SHAPES.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python-cap", type=int, default=DEFAULT_PYTHON_CAP,
                    help="raw candidates the Python loop visits before extrapolating")
    ap.add_argument("--quick", action="store_true", help="first two cases only")
    ap.add_argument("--workers", type=int, default=1,
                    help="also time the enumeration with the slices over this many processes")
    args = ap.parse_args()
    par = args.workers > 1
    head = (f"{'model':14} {'gpu':7} {'nodes':>5} {'GPUs':>5} {'raw space':>11} {'feasible':>9} "
            f"{'slices':>6} {'1 core s':>9} {'CPU s':>6} {'(build':>7} {'solve':>6} {'decode':>6} "
            f"{'counts)':>7}" + (f" {f'{args.workers} procs s':>12}" if par else "") +
            f" {'python s':>10} {'python feasible':>15} {'python ran on':>14}")
    print(head)
    print("-" * len(head))
    for name, gpu, nodes in CASES[:2] if args.quick else CASES:
        p = problem_for(name, gpu, nodes)
        cold()
        t0, c0 = time.perf_counter(), time.process_time()
        e = enumerate_problem(p)
        cp_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
        multi = ""
        if par:
            cold()
            t0 = time.perf_counter()
            m = enumerate_problem(p, workers=args.workers)
            multi = f" {time.perf_counter() - t0:>12.2f}"
            assert [(f.candidate, f.peak_bytes) for f in m.configs] == \
                [(f.candidate, f.peak_bytes) for f in e.configs] and m.removed == e.removed
        size = p.space.size()
        if size > args.python_cap:
            r = reference_enumerate(p, candidates=p.space.sample(args.python_cap, seed=SEED))
            py = f"~{r.timings['total'] * size / r.space_size:,.0f}"
            found = f"~{len(r) * size / r.space_size:,.0f}"
            visited = f"sample {r.space_size:,}"
        else:
            r = reference_enumerate(p)
            py, found, visited = f"{r.timings['total']:.1f}", f"{len(r):,}", "all"
            assert [f.candidate for f in r.configs] == [f.candidate for f in e.configs]
        t = e.timings
        print(f"{name:14} {gpu:7} {nodes:>5} {p.cluster.world_size:>5} {size:>11,} {len(e):>9,} "
              f"{f'{e.slices - e.skipped}/{e.slices}':>6} {cp_s:>9.2f} {cpu_s:>6.2f} {t['build']:>7.2f} {t['solve']:>6.2f} "
              f"{t['decode']:>6.2f} {t['attribution']:>7.2f}{multi} "
              f"{py:>10} {found:>15} {visited:>14}", flush=True)
    print("cp-sat: each run starts without memoised tables; 1 core s: wall time of one worker "
          "(build, solve, decode, counts: its parts), CPU s: the process's CPU time for it "
          "(what it costs on a shared machine); one worker, every family on (recompute_dominance: none when it fits, else the "
          "smallest fitting K), the space sliced by pp (and tp when ep varies), one CP-SAT model "
          "per slice (slices: models solved / slices; the removal counts' walk skips slices "
          "where nothing passes the legality rules);"
          + (f" {args.workers} procs: the same slices over {args.workers} processes (wall time);"
             if par else "")
          + f" python: solver/reference.py on all raw candidates, or (~) on a uniform sample of "
          f"{args.python_cap:,} scaled to the space")


if __name__ == "__main__":
    main()
