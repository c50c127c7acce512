"""Scoring speed of the projection oracle: configurations scored per second on one core.

For a few (model, cluster) cases, builds every combination of tp, pp, vpp, cp, ep, mbs and
recompute over small domains (legality is not filtered here: the solver does that; the scorer
costs the same either way), scores them with :func:`oracle.projection.score_configs`, and
prints the rate. Also times the scalar :func:`oracle.projection.project` for comparison.

    python benchmarks/oracle.py
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tune_cp.config.specs import ClusterSpec, TrainingSpec  # noqa: E402
from tune_cp.oracle.catalog import load_gpu, load_model  # noqa: E402
from tune_cp.oracle.projection import project, score_configs  # noqa: E402
from tune_cp.oracle.work import ConfigBatch  # noqa: E402

CASES = [
    ("mixtral-8x22b", "mi355x", 4, 8192, 512, "bf16"),
    ("llama3-70b", "h100", 8, 8192, 128, "fp8"),
    ("deepseek-v3", "gb200", 64, 4096, 4096, "fp8"),
    ("qwen3-30b-a3b", "b200", 2, 4096, 512, "fp8"),
]


def grid(model_name: str, nodes: int) -> dict[str, np.ndarray]:
    model = load_model(model_name)
    tps, pps, vpps, cps = [1, 2, 4, 8], [1, 2, 4, 8], [1, 2, 4], [1, 2]
    eps = [1, 2, 4, 8, 16] if model.is_moe else [1]
    mbss, rcs = [1, 2, 4], [0, 1, 2]
    combos = np.array(list(itertools.product(tps, pps, vpps, cps, eps, mbss, rcs)))
    world = nodes * 8
    keep = (world % (combos[:, 0] * combos[:, 1] * combos[:, 3]) == 0) & (
        (combos[:, 2] == 1) | (combos[:, 1] > 1)
    )
    c = combos[keep]
    return dict(tp=c[:, 0], pp=c[:, 1], vpp=c[:, 2], cp=c[:, 3], ep=c[:, 4], mbs=c[:, 5],
                recompute=c[:, 6])


def main() -> int:
    rows = []
    for model_name, gpu, nodes, seq, gbs, prec in CASES:
        model = load_model(model_name)
        cluster = ClusterSpec(gpu=load_gpu(gpu), num_nodes=nodes, gpus_per_node=8)
        training = TrainingSpec(seq_len=seq, global_batch_size=gbs, precision=prec)
        g = grid(model_name, nodes)
        base = ConfigBatch.resolved(model, cluster, training, **g)
        reps = max(1, 200_000 // len(base))
        big = ConfigBatch(**{k: np.tile(v, reps) if isinstance(v, np.ndarray) else v
                             for k, v in vars(base).items()})
        score_configs(model, cluster, training, big)  # warm caches
        t0 = time.perf_counter()
        res = score_configs(model, cluster, training, big)
        dt = time.perf_counter() - t0
        n = len(big)
        t1 = time.perf_counter()
        k = 50
        for i in range(k):
            project(model, cluster, training, base.config(i % len(base)))
        dt1 = (time.perf_counter() - t1) / k
        best = float(np.max(res["tokens_per_s_per_gpu"]))
        rows.append([f"{model_name} / {nodes}x8 {gpu} / {prec}", f"{n:,}", f"{dt:.3f}",
                     f"{n / dt:,.0f}", f"{1 / dt1:,.0f}", f"{best:,.0f}"])
    headers = ["case", "configs", "vectorised s", "configs/s (vectorised)",
               "configs/s (scalar project)", "best tok/s/GPU (unfiltered)"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    print("one core (OMP/OpenBLAS threads = 1); legality not filtered (the solver's job)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
