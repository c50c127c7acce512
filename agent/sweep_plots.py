"""Pictures of a sweep (``tune-cp sweep ... --plot DIR``): per model, the cost / time-to-train
frontier across GPUs and node counts, and the best layout of every cell as a table figure.

Every plotted number is a column of the sweep's rows (``agent/sweep.py``): days to train and
cost (or GPU-hours when the grid gives no price) of each feasible scenario; without ``tokens`` in
the grid the time axis is days per 10^12 tokens (tokens / cluster tokens/s, the same formula).
Matplotlib (Agg backend) is imported only here.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: tokens assumed for the time axis when the grid names none (days per 10^12 tokens)
REFERENCE_TOKENS = 1e12
SECONDS_PER_DAY = 86400.0
SECONDS_PER_HOUR = 3600.0


def check_plot_dir(path: str) -> None:
    """``--plot``'s folder, by the one output check (``oracle/outputs.py``)."""
    from tune_cp.oracle.outputs import check_output_dir

    check_output_dir(path, "--plot")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "model"


def frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both fewer days (x) and less cost (y),
    sorted by days."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    out, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            out.append(i)
            best = points[i][1]
    return out


def _time_cost(r: Mapping[str, Any]) -> tuple[float, float, str, str]:
    """(days, cost or GPU-hours, time label, cost label) of a feasible row."""
    if r.get("days") is not None:
        days, gpu_hours = r["days"], r["gpu_hours"]
        tlabel = f"days to train {r['tokens']:.3g} tokens"
    else:
        seconds = REFERENCE_TOKENS / r["cluster_tokens_per_s"]
        days, gpu_hours = seconds / SECONDS_PER_DAY, r["gpus"] * seconds / SECONDS_PER_HOUR
        tlabel = "days per 1e12 tokens (no tokens in the grid)"
    if r.get("cost") is not None:
        return days, r["cost"], tlabel, "cost (price per GPU-hour x GPU-hours)"
    return days, gpu_hours, tlabel, "GPU-hours"


def layout_text(r: Mapping[str, Any]) -> str:
    if r["status"] == "infeasible":
        return "does not fit"
    if r["status"] != "ok":
        return "error"
    rc = r["recompute"]
    if rc == "full":
        rc = f"full {r['recompute_layers'] if r['recompute_layers'] is not None else 'all'}"
    ep = f" EP{r['ep']}" if r["ep"] and r["ep"] > 1 else ""
    return (f"TP{r['tp']} PP{r['pp']} VPP{r['vpp']} CP{r['cp']}{ep}\n"
            f"mbs {r['mbs']}, rc {rc}\n{r['tokens_per_s_per_gpu']:,.0f} tok/s/GPU")


def sweep_plots(rows: Sequence[Mapping[str, Any]], out_dir: str, name: str = "sweep") -> list[str]:
    """Draw ``frontier_<model>.png`` and ``layouts_<model>.png`` per model; the paths written."""
    check_plot_dir(out_dir)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    by_model: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        by_model[r["model"]].append(r)
    written = []
    for model, rs in by_model.items():
        written.append(_frontier_plot(plt, model, rs, out_dir, name))
        written.append(_layout_table(plt, model, rs, out_dir, name))
    return [p for p in written if p]


def _frontier_plot(plt, model: str, rows, out_dir: str, name: str) -> str | None:
    ok = [r for r in rows if r["status"] == "ok" and r["tokens_per_s_per_gpu"]]
    if not ok:
        return None
    gpus = list(dict.fromkeys(r["gpu"] for r in ok))
    pts = [_time_cost(r) for r in ok]
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    cmap = plt.get_cmap("tab10")
    for gi, g in enumerate(gpus):
        idx = [i for i, r in enumerate(ok) if r["gpu"] == g]
        ax.scatter([pts[i][0] for i in idx], [pts[i][1] for i in idx], s=[
            18 + 10 * ok[i]["nodes"] ** 0.5 for i in idx], color=cmap(gi % 10), alpha=0.75,
            label=g, edgecolors="none")
        for i in idx:
            ax.annotate(f"{ok[i]['nodes']}n", (pts[i][0], pts[i][1]), fontsize=7,
                        xytext=(3, 2), textcoords="offset points", color=cmap(gi % 10))
    front = frontier([(p[0], p[1]) for p in pts])
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "k--", lw=1,
            label="frontier (nothing both faster and cheaper)")
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    thousands = FuncFormatter(lambda v, _: f"{v:,.0f}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(thousands)
        axis.set_minor_formatter(thousands)
    ax.tick_params(axis="both", which="minor", labelsize=7)
    ax.set_xlabel(pts[0][2])
    ax.set_ylabel(pts[0][3])
    variants = {(r["seq_len"], r["global_batch"], r["precision"]) for r in ok}
    sub = (", ".join(f"seq {s} gbs {b} {p}" for s, b, p in sorted(variants))
           if len(variants) <= 3 else f"{len(variants)} seq/batch/precision settings")
    ax.set_title(f"{model}: cost against time to train ({name})\n{sub}; labels: nodes",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = str(Path(out_dir) / f"frontier_{_slug(model)}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _layout_table(plt, model: str, rows, out_dir: str, name: str) -> str:
    nodes = sorted({r["nodes"] for r in rows})
    keys = list(dict.fromkeys((r["gpu"], r["seq_len"], r["global_batch"], r["precision"])
                              for r in rows))
    cell: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for r in rows:
        k = (r["gpu"], r["seq_len"], r["global_batch"], r["precision"], r["nodes"])
        # several token counts share one search: the first row stands for the cell
        cell.setdefault(k, r)
    text = [[layout_text(cell[(*k, n)]) if (*k, n) in cell else "" for n in nodes] for k in keys]
    labels = [f"{g}\nseq {s} gbs {b} {p}" for g, s, b, p in keys]
    fig_w = 2.2 + 1.9 * len(nodes)
    fig_h = 1.0 + 0.62 * len(keys)
    fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    ax.axis("off")
    table = ax.table(cellText=text, rowLabels=labels,
                     colLabels=[f"{n} node{'s' if n != 1 else ''}" for n in nodes],
                     loc="center", cellLoc="center", rowLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    table.scale(1, 3.0)
    for (i, j), c in table.get_celld().items():
        if i > 0 and j >= 0 and text[i - 1][j] in ("does not fit", "error"):
            c.set_facecolor("#f4d6d6")
    ax.set_title(f"{model}: best layout per cell ({name})", fontsize=10)
    fig.tight_layout()
    path = str(Path(out_dir) / f"layouts_{_slug(model)}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
