"""Cross-check CP-SAT against the plain Python loop on random subspaces.

    python benchmarks/crosscheck.py [--cases 40] [--seed 0] [--max-size 6000]

Each case draws a catalog model, a GPU, a node count, a batch, options (FP8, zero-bubble, FSDP,
uniform recompute, extra constraints, a family switched off) and fixes random axes until the
raw space has at most ``--max-size`` candidates; then requires identical feasible sets, peak
bytes and removal counts. The CP-SAT side slices the space as enumeration does by default, or,
with ``--any-slices``, on axes drawn per case (none, pp, tp and pp, four axes, ep and mbs) from
a separate random stream (the cases stay those of the seed). A slower, wider version of
``tests/test_solver_equivalence.py``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tune_cp.config.axes import SLICEABLE_AXES
from tune_cp.config.specs import ClusterSpec, Precision, TrainingSpec
from tune_cp.oracle.catalog import load_gpu, load_model, model_entries
from tune_cp.solver.constraints import as_constraints
from tune_cp.solver.feasible import enumerate_problem
from tune_cp.solver.problem import Problem
from tune_cp.solver.reference import reference_enumerate
from tune_cp.solver.rules import RULES
from tune_cp.solver.settings import RunSettings
from tune_cp.solver.space import OptimizerChoice, default_space

GPUS = ("h100", "h200", "b200", "mi300x", "mi355x", "a100")
SLICINGS: tuple[tuple[str, ...], ...] = ((), ("pp",), ("tp", "pp"), ("tp", "pp", "cp", "vpp"),
                                         ("ep", "mbs"))
CONSTRAINTS = ("ep * etp <= 8", "cp == 1", "pp in {2, 4}", "tp <= 4", "dp >= 2",
               "vpp == 1 or ga >= 2 * pp")


def draw(rng: random.Random, max_size: int) -> tuple[Problem, list[str], str]:
    model = load_model(rng.choice(list(model_entries())))
    gpu = load_gpu(rng.choice(GPUS))
    nodes = rng.choice((1, 2, 4, 8, 16, 32, 64))
    cluster = ClusterSpec(gpu=gpu, num_nodes=nodes, gpus_per_node=gpu.gpus_per_node)
    seq = rng.choice((2048, 4096, 8192))
    gbs = rng.choice((16, 64, 256, 1024))
    fp8 = rng.random() < 0.3 and gpu.peak_fp8_flops is not None
    training = TrainingSpec(seq_len=seq, global_batch_size=gbs,
                            precision=Precision.FP8 if fp8 else Precision.BF16,
                            flash_attention=rng.random() < 0.8)
    space = default_space(
        model, cluster, training, zero_bubble=rng.random() < 0.3, fp8_recipes=fp8,
        uniform_recompute=rng.random() < 0.2,
        optimizers=tuple(OptimizerChoice) if rng.random() < 0.3 else (OptimizerChoice.DISTRIBUTED,),
        full_recompute_layers=None if rng.random() < 0.3 else (1, 2, 3, 4))
    fixed: dict = {}
    axes = list(SLICEABLE_AXES)  # the integer axes fixing one keeps the others' domains
    while space.size() > max_size:
        axis = rng.choice([a for a in axes if len(getattr(space, a)) > 1] or ["recompute"])
        if axis == "recompute":
            space = space.with_domains(recompute=space.recompute[: max(1, len(space.recompute)
                                                                        // 2)])
            continue
        fixed[axis] = rng.choice(getattr(space, axis))
        space = space.fix(**{axis: fixed[axis]})
    cons = rng.sample(CONSTRAINTS, k=rng.choice((0, 0, 1, 2)))
    families = list(RULES)
    if rng.random() < 0.2:
        families.remove(rng.choice(["recompute_dominance", "scale_up", "pipeline_split",
                                    "virtual_pipeline", "batch"]))
    p = Problem(model=model, cluster=cluster, training=training, space=space,
                settings=RunSettings(constraints=as_constraints(cons)))
    label = (f"{model.name} {nodes}x{gpu.name} seq {seq} gbs {gbs}{' fp8' if fp8 else ''} "
             f"fixed {fixed} constraints {cons} off {set(RULES) - set(families) or '-'}")
    return p, families, label


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-size", type=int, default=6000)
    ap.add_argument("--any-slices", action="store_true",
                    help="slice each case's space on randomly drawn axes")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    slice_rng = random.Random(args.seed + 7919)
    bad = feasible = 0
    t0 = time.perf_counter()
    for i in range(args.cases):
        p, families, label = draw(rng, args.max_size)
        axes = slice_rng.choice(SLICINGS) if args.any_slices else None
        a = enumerate_problem(p, families, slice_axes=axes)
        b = reference_enumerate(p, families)
        same = ([(f.candidate, f.peak_bytes) for f in a.configs] ==
                [(f.candidate, f.peak_bytes) for f in b.configs] and a.removed == b.removed)
        feasible += bool(len(a))
        bad += not same
        sliced = f" slices {a.slices} on {','.join(axes) or '-'}" if axes is not None else ""
        print(f"{i:3} {'ok ' if same else 'BAD'} {len(a):5} feasible of {p.space.size():6}  "
              f"{label}{sliced}", flush=True)
    print(f"{args.cases - bad}/{args.cases} identical ({feasible} with feasible configurations) "
          f"in {time.perf_counter() - t0:.0f} s")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
