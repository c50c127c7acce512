"""What the searched light splits cost and change: for each case, the default space with the
automatic split alone (``pipeline_splits=(None,)``) and with the searched light splits
(``config.specs.SEARCHED_LIGHT_SPLITS``, the default): raw candidates, feasible configurations,
CPU seconds of the enumeration (one process, the fastest of ``--repeat`` cold runs; CPU time,
so other load on the machine inflates it less than wall time), and the projected best of each
(and its split).

    python benchmarks/splits.py [--repeat N] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tune_cp.config.specs import ClusterSpec, TrainingSpec  # noqa: E402
from tune_cp.oracle.catalog import load_gpu, load_model  # noqa: E402
from tune_cp.oracle.projection import score_configs  # noqa: E402
from tune_cp.oracle.work import ConfigBatch  # noqa: E402
from tune_cp.solver.feasible import enumerate_feasible  # noqa: E402
from tune_cp.solver.space import default_space  # noqa: E402

CASES: tuple[tuple[str, str, int], ...] = (
    ("mixtral-8x22b", "mi355x", 4),  # the canonical search
    ("llama3-8b", "h100", 4),
    ("llama3.1-405b", "h100", 128),
)


def cold() -> None:
    """Forget the solver's memoised tables, so each run starts as a process's first."""
    from tune_cp.solver.model import _CACHES, _SHARED

    _CACHES.clear()
    _SHARED.clear()


def run(model, cluster, training, splits, repeat: int):
    space = default_space(model, cluster, training, pipeline_splits=splits)
    best_s, result = None, None
    for _ in range(repeat):
        cold()
        t0 = time.process_time()
        result = enumerate_feasible(model, cluster, training, space)
        dt = time.process_time() - t0
        best_s = dt if best_s is None else min(best_s, dt)
    configs = [f.config for f in result.configs]
    tokens = score_configs(model, cluster, training,
                           ConfigBatch.from_configs(configs))["tokens_per_s_per_gpu"]
    i = int(tokens.argmax())
    return space.size(), len(configs), best_s, configs[i], float(tokens[i])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the canonical case only")
    args = ap.parse_args()
    print(f"{'case':30} {'splits':10} {'candidates':>12} {'feasible':>9} {'cpu s':>6}  "
          f"best (tokens/s/GPU, split)")
    for name, gpu, nodes in CASES[:1] if args.quick else CASES:
        m, g = load_model(name), load_gpu(gpu)
        cl = ClusterSpec(gpu=g, num_nodes=nodes, gpus_per_node=g.gpus_per_node)
        tr = TrainingSpec(seq_len=m.default_seq_len, global_batch_size=m.default_global_batch_size)
        for label, splits in (("auto", (None,)), ("searched", None)):
            size, feasible, cpu, best, tok = run(m, cl, tr, splits, args.repeat)
            assert best.pipeline_split is not None
            print(f"{name + ' ' + gpu + ' x' + str(nodes):30} {label:10} {size:>12,} "
                  f"{feasible:>9,} {cpu:>6.2f}  {best.label()} mbs {best.mbs}: {tok:,.0f}, "
                  f"{best.pipeline_split.value}")


if __name__ == "__main__":
    main()
