"""Grouped k-fold cross-validation of the calibrated time model on published runs.

The best estimate of the error on runs the constants were not fitted on: the representable rows
with a measured tokens/s/GPU are split into folds by *configuration* (same model, GPU, node
count, layout tp/pp/vpp/cp/ep, micro-batch and precision), so the repeats of one configuration
across software releases never sit on both sides of a split; each fold is projected with
constants calibrated (:func:`calibration.calibrate.fit`, the shipped method) on the other folds.

Prints, as plain-text tables: every fold (rows, configurations, MAPE, median), the pooled
out-of-fold MAPE, median and within-10% / within-15% shares, per source and per GPU, and the
within-group Spearman rank correlation of the out-of-fold projections.

    python benchmarks/crossval.py [--runs FILE.csv ...] [--folds 5] [--seed 0]

(default: the published runs, ``benchmarks/published_runs.csv`` and
``benchmarks/amd_published_runs.csv``: ``formats.runs.PUBLISHED_RUNS_FILES``)
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# first on the path: run as a script, sys.path[0] is benchmarks/, whose oracle.py would shadow
# the oracle package
sys.path.insert(0, str(ROOT))

from tune_cp.calibration.calibrate import (  # noqa: E402
    fit,
    fit_hybrid_terms,
    hybrid_rows,
    predict,
    prepare,
    table_constants,
    table_from_fit,
)
from tune_cp.formats.runs import (  # noqa: E402
    PUBLISHED_RUNS_FILES,
    RunRow,
    read_runs_files,
    runs_label,
    scored_rows,
)

#: the runs files read by default (both copies of ../shared/calibration/, in this order)
DEFAULT_RUNS: list[str] = [str(p) for p in PUBLISHED_RUNS_FILES]


def config_key(r: RunRow) -> tuple:
    """Rows with this key are one configuration (possibly published in several releases)."""
    c = r.cfg
    assert c is not None and r.model is not None and r.cluster is not None and r.training
    return (r.model.name, r.cluster.gpu.name, r.cluster.num_nodes, c.tp, c.pp, c.vpp, c.cp,
            c.ep, c.mbs, str(r.training.precision))


@dataclass
class CrossValidation:
    rows: list[RunRow]
    measured: np.ndarray
    projected: np.ndarray  # out-of-fold projection of every row
    fold: np.ndarray  # fold of every row

    @property
    def ape(self) -> np.ndarray:
        return np.abs(self.projected / self.measured - 1)


#: The classes the error is reported on (issue 12): interleaving depth, context parallelism,
#: dense / MoE / hybrid Mamba (a hybrid model with MoE layers is hybrid), GPU architecture.
CLASSES = ("interleaving", "context parallel", "moe/dense", "architecture")


def row_class(r: RunRow, name: str) -> str:
    """The class of a row: ``interleaving`` by virtual stages per rank (1, 2-4, 5-12, > 12) with
    layers per virtual stage, ``context parallel`` cp1 / cp2-4 / cp8+, ``moe/dense`` (dense,
    moe, hybrid),
    ``architecture``."""
    c, m = r.cfg, r.model
    assert c is not None and m is not None and r.cluster is not None
    if name == "interleaving":
        if c.vpp == 1:
            return "vpp1"
        per = m.num_layers / (c.pp * c.vpp)
        band = "vpp2-4" if c.vpp <= 4 else ("vpp5-12" if c.vpp <= 12 else "vpp>12")
        return f"{band} ({'<=2' if per <= 2 else '>2'} layers/chunk)"
    if name == "context parallel":
        return "cp1" if c.cp == 1 else ("cp2-4" if c.cp <= 4 else "cp8+")
    if name == "moe/dense":
        return "hybrid" if m.is_hybrid else ("moe" if m.is_moe else "dense")
    return r.cluster.gpu.architecture or "generic"


def assign_folds(rows: list[RunRow], folds: int = 5, seed: int = 0) -> np.ndarray:
    """Fold of every row: the distinct configurations (:func:`config_key`), sorted, shuffled with
    ``random.Random(seed)`` and dealt round-robin, so all rows of one configuration share a
    fold."""
    keys = sorted({config_key(r) for r in rows})
    random.Random(seed).shuffle(keys)
    fold_of = {k: i % folds for i, k in enumerate(keys)}
    return np.array([fold_of[config_key(r)] for r in rows])


def grouped_cv(rows: list[RunRow], folds: int = 5, seed: int = 0) -> CrossValidation:
    """Out-of-fold projections of every representable measured row (see module docstring).
    Configurations are shuffled with ``random.Random(seed)`` and dealt round-robin to folds."""
    # the fitted rows, then the hybrid Mamba rows: they fit only the hybrid terms, in a second
    # stage on each fold's training rows (calibration.calibrate.fit_hybrid_terms), as the shipped fit
    fitted, hybrid = [r for r in scored_rows(rows) if r.fitted], hybrid_rows(rows)
    rows = fitted + hybrid
    # dealt apart, so the hybrid rows leave the folds of the fitted rows as they were
    fold = np.concatenate([assign_folds(fitted, folds, seed),
                           assign_folds(hybrid, folds, seed) if hybrid else np.zeros(0, int)])
    projected = np.zeros(len(rows))
    for f in range(folds):
        train = [r for r, g in zip(rows, fold, strict=True) if g != f]
        test_idx = np.flatnonzero(fold == f)
        layout, theta, _ = fit(prepare([r for r in train if r.fitted]))
        table = fit_hybrid_terms(train, table_from_fit(layout, theta, {}, f"fold {f}"))
        pt = prepare([rows[i] for i in test_idx])
        projected[test_idx] = predict(pt, table_constants(table, pt.archs, pt.software))
    measured = np.array([r.measured_tokens_per_s_per_gpu for r in rows], dtype=float)
    return CrossValidation(rows, measured, projected, fold)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain-text table: left-aligned columns, a dashed rule under the header."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


def ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank)."""
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x))
    r[order] = np.arange(len(x), dtype=float)
    for v in np.unique(x):
        idx = x == v
        if idx.sum() > 1:
            r[idx] = r[idx].mean()
    return r


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation (NaN when either side has no spread)."""
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def group_spearman(rows: list[RunRow], projected: np.ndarray,
                   measured: np.ndarray) -> list[tuple[tuple[str, str], int, float]]:
    """Spearman of projected vs measured within each (model, GPU) group of >= 3 rows with at
    least two distinct measurements and two distinct configurations."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        groups[r.group].append(i)
    out = []
    for g, idx in sorted(groups.items()):
        a = np.array(idx)
        if len(a) < 3 or len(np.unique(measured[a])) < 2:
            continue
        out.append((g, len(a), spearman(projected[a], measured[a])))
    return out


def summary_line(cv: CrossValidation) -> str:
    ape = cv.ape
    return (f"grouped {int(cv.fold.max()) + 1}-fold CV: MAPE {pct(float(ape.mean()))}, median "
            f"{pct(float(np.median(ape)))}, within 10% {pct(float((ape <= 0.10).mean()))}, "
            f"within 15% {pct(float((ape <= 0.15).mean()))} over {len(ape)} rows")


def report(cv: CrossValidation) -> str:
    ape, logerr = cv.ape, np.log(cv.projected / cv.measured)
    nfold = int(cv.fold.max()) + 1
    lines = [(f"== Grouped {nfold}-fold cross-validation (folds by configuration: model, GPU, "
              "nodes, tp/pp/vpp/cp/ep, mbs, precision) ==")]
    frows = []
    for f in range(nfold):
        idx = cv.fold == f
        confs = len({config_key(r) for r, m in zip(cv.rows, idx, strict=True) if m})
        frows.append([str(f), str(int(idx.sum())), str(confs), pct(float(ape[idx].mean())),
                      pct(float(np.median(ape[idx]))),
                      f"{100 * float(logerr[idx].mean()):+.1f}%"])
    lines.append(table(["fold", "rows", "configurations", "MAPE", "median",
                         "bias (mean log err)"], frows))
    lines.append("")
    lines.append(table(
        ["pooled rows", "MAPE", "median APE", "within 10%", "within 15%", "fold MAPE range"],
        [[str(len(ape)), pct(float(ape.mean())), pct(float(np.median(ape))),
          pct(float((ape <= 0.10).mean())), pct(float((ape <= 0.15).mean())),
          (f"{min(float(ape[cv.fold == f].mean()) for f in range(nfold)) * 100:.1f}-"
           f"{max(float(ape[cv.fold == f].mean()) for f in range(nfold)) * 100:.1f}%")]]))
    lines.append("")

    def grouped(title: str, key) -> None:
        groups: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(cv.rows):
            groups[key(r)].append(i)
        out = []
        for k, idx in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            a = np.array(idx)
            out.append([k, str(len(a)), pct(float(ape[a].mean())),
                        pct(float(np.median(ape[a]))),
                        f"{100 * float(logerr[a].mean()):+.1f}%"])
        lines.append(table([title, "rows", "CV MAPE", "CV median", "bias (mean log err)"], out))
        lines.append("")

    grouped("source", lambda r: r.source_id)
    grouped("gpu", lambda r: r.gpu_name)
    for name in CLASSES:
        grouped(name, lambda r, name=name: row_class(r, name))
    sp = group_spearman(cv.rows, cv.projected, cv.measured)
    vals = [rho for _, _, rho in sp if rho == rho]
    lines.append(
        f"within-group Spearman of the out-of-fold projections: mean {np.mean(vals):+.2f} over "
        f"{len(vals)} groups (same model and GPU, >= 3 rows, >= 2 configurations)")
    lines.append(summary_line(cv))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", default=DEFAULT_RUNS)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    cv = grouped_cv(read_runs_files(args.runs), args.folds, args.seed)
    print(f"runs files: {runs_label(args.runs)}")
    print(report(cv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
