"""Pictures of the trade-offs: the feasible set of a search (``--pareto``) and capacity plans
(``plan --plot``). Matplotlib with the non-interactive Agg backend; every plotted number comes
from the search or plan result it is given."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tune_cp.config.specs import GIB

if TYPE_CHECKING:
    from tune_cp.agent.plan import GpuPlan
    from tune_cp.agent.search import SearchResult


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both less memory (x) and more throughput
    (y), sorted by x."""
    order = np.lexsort((-y, x))
    front, best = [], -np.inf
    for i in order:
        if y[i] > best:
            front.append(i)
            best = y[i]
    return np.array(front, dtype=int)


def _axis_values(configs, axis: str) -> list[str]:
    """Category of each configuration on ``axis``; full-recompute depths are bucketed."""
    if axis == "recompute":
        out = []
        for c in configs:
            if c.recompute.value != "full":
                out.append(c.recompute.value)
                continue
            k = c.recompute_layers or 10**6
            out.append("full, 1-2 layers" if k <= 2 else "full, 3-8 layers" if k <= 8
                       else "full, 9+ layers")
        return out
    return [str(getattr(c, axis if axis != "etp" else "etp_")) for c in configs]


def _order(kind: str) -> tuple:
    return (0, int(kind), "") if kind.isdigit() else (1, 0, kind)


def pareto_plot(r: SearchResult, path: str, color_axis: str = "pp") -> None:
    """Projected tokens/s/GPU against peak memory of every feasible configuration, coloured by
    ``color_axis``; the Pareto front, the HBM limit, the baseline and the winner marked."""
    plt = _pyplot()
    x = r.ranked.peak_bytes / GIB
    y = r.ranked.tokens
    labels = _axis_values(r.ranked.configs, color_axis)
    kinds = sorted(set(labels), key=_order)
    cmap = plt.get_cmap("tab10" if len(kinds) <= 10 else "tab20")
    fig, ax = plt.subplots(figsize=(11, 6), dpi=120)
    for k, kind in enumerate(kinds):
        mask = np.array([lab == kind for lab in labels])
        ax.scatter(x[mask], y[mask], s=10, alpha=0.6, color=cmap(k % cmap.N),
                   label=f"{color_axis} {kind}")
    front = pareto_front(x, y)
    ax.plot(x[front], y[front], color="black", lw=1, label="Pareto front")
    limit = r.best.outcome.limit_bytes / GIB
    ax.axvline(limit, color="red", ls="--", lw=1, label=f"HBM limit {limit:.0f} GiB")
    b = r.best
    if b.outcome.memory is not None:
        ax.scatter([b.outcome.memory.peak_bytes / GIB], [b.throughput], marker="*", s=250,
                   color="gold", edgecolor="black", zorder=5, label=f"best: {b.config.label()}")
    base = r.baseline
    if base is not None and base.legal and base.outcome.memory is not None:
        ax.scatter([base.outcome.memory.peak_bytes / GIB], [base.throughput], marker="X", s=120,
                   color="white", edgecolor="black", zorder=5,
                   label=f"baseline: {base.config.label()}")
    cl, tr = r.cluster, r.training
    ax.set_title(f"{r.model.name} on {cl.num_nodes} x {cl.gpus_per_node} {cl.gpu.name}, seq "
                 f"{tr.seq_len}, gbs {tr.global_batch_size}: {len(y):,} feasible configurations")
    ax.set_xlabel("peak memory of the most loaded stage (GiB per GPU)")
    ax.set_ylabel("projected tokens/s/GPU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1 + len(kinds) // 20)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plan_plot(plans: Sequence[GpuPlan], path: str, tokens: float | None) -> None:
    """Throughput (cluster tokens/s) and, with ``tokens``, days to train against nodes, one line
    per GPU type."""
    plt = _pyplot()
    ncols = 2 if tokens else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, 4.5), dpi=120, squeeze=False)
    for p in plans:
        pts = [q for q in p.points if q.feasible]
        if not pts:
            continue
        n = [q.nodes for q in pts]
        axes[0][0].plot(n, [q.cluster_tokens_per_s for q in pts], marker="o", label=p.gpu)
        if tokens:
            axes[0][1].plot(n, [q.days for q in pts], marker="o", label=p.gpu)
    axes[0][0].set_title("projected cluster throughput")
    axes[0][0].set_ylabel("tokens/s")
    if tokens:
        axes[0][1].set_title(f"time to train {tokens:.3g} tokens")
        axes[0][1].set_ylabel("days")
    from matplotlib.ticker import ScalarFormatter

    for ax in axes[0]:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("nodes")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
