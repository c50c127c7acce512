"""Out-of-fold residuals of the time model per configuration class -> ``oracle/catalog/residuals.json``.

Runs the grouped cross-validation (:func:`benchmarks.crossval.grouped_cv`: each published run
projected with constants fitted on the folds without its configuration), takes every row's
out-of-fold log residual ``log(measured / projected)`` tokens/s/GPU, and writes per class
(:mod:`oracle.uncertainty`: architecture, MoE or dense, interleaving depth, CP, precision / FP8
recipe, and every parent class) the rows, the 10th / 50th / 90th percentiles and the MAPE, plus
the pairwise figure the search uses for near ties: for pairs of rows of the same model, GPU and
source with different configurations, how far the projected ratio of the two misses the measured
ratio (``|r_a - r_b|``; its median). Prints the table it wrote.

Regenerate after any change to the time model or its calibration (one command)::

    python benchmarks/residuals.py            # writes oracle/catalog/residuals.json
    python benchmarks/residuals.py --out FILE --runs FILE.csv [FILE.csv ...] --folds 5 --seed 0

(default runs: ``benchmarks/published_runs.csv`` and ``benchmarks/amd_published_runs.csv``)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # before benchmarks/oracle.py can shadow the oracle package

from benchmarks.crossval import DEFAULT_RUNS, CrossValidation, grouped_cv, table
from tune_cp.formats.runs import RunRow, read_runs_files, scored_rows
from tune_cp.oracle.constants import load_calibration, utc_now
from tune_cp.oracle.uncertainty import (
    FEATURES,
    MIN_CLASS_ROWS,
    Q_HI,
    Q_LO,
    RESIDUALS_PATH,
    class_features,
    precision_class,
    residual_classes,
)


def row_features(r: RunRow) -> tuple[str, ...]:
    assert r.model and r.cluster and r.training and r.cfg
    return class_features(r.cluster.gpu.architecture or "hopper", r.model.is_moe, r.cfg.vpp,
                          r.cfg.cp, precision_class(r.training.precision, r.cfg),
                          r.model.is_hybrid)


def apart_residuals(rows: list[RunRow]) -> tuple[list[RunRow], np.ndarray]:
    """The representable rows the constants are not fitted on (hybrid Mamba models,
    ``formats/runs.py::NOT_FITTED``) and their log residuals against the shipped calibration:
    out-of-sample without cross-validation, since no fold is fitted on them."""
    from tune_cp.calibration.calibrate import predict, prepare, table_constants

    apart = [r for r in scored_rows(rows) if r.representable and not r.fitted
             and not (r.model is not None and r.model.is_hybrid)]  # hybrid rows: in the CV
    if not apart:
        return [], np.zeros(0)
    prep = prepare(apart)
    projected = predict(prep, table_constants(load_calibration(), prep.archs, prep.software))
    measured = np.array([r.measured_tokens_per_s_per_gpu for r in apart])
    return apart, np.log(measured / projected)


def pairwise(cv: CrossValidation, resid: np.ndarray) -> dict:
    """How well the out-of-fold projections order two configurations of one model, GPU and
    source: ``|r_a - r_b|`` over pairs of rows with different configurations."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(cv.rows):
        groups.setdefault((r.model_name, r.gpu_name, r.source_id), []).append(i)
    errs = []
    for idx in groups.values():
        for a, b in combinations(idx, 2):
            if cv.measured[a] != cv.measured[b] or cv.projected[a] != cv.projected[b]:
                errs.append(abs(resid[a] - resid[b]))
    e = np.array(errs)
    return {"pairs": len(e), "median_abs_log_ratio_error": round(float(np.median(e)), 4),
            "q90_abs_log_ratio_error": round(float(np.quantile(e, 0.9)), 4)}


def _shown(path: str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else path


def build(runs: list[str], folds: int, seed: int) -> dict:
    all_rows = read_runs_files(runs)
    cv = grouped_cv(all_rows, folds, seed)
    resid = np.log(cv.measured / cv.projected)
    apart, apart_resid = apart_residuals(all_rows)
    feats = [row_features(r) for r in cv.rows] + [row_features(r) for r in apart]
    classes = residual_classes(feats, np.concatenate([resid, apart_resid]))
    calib = load_calibration()
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                text=True, check=False).stdout.strip() or None
    except OSError:
        commit = None
    return {
        "_about": ("Out-of-fold log residuals log(measured / projected) tokens/s/GPU of the "
                   "grouped cross-validation, per configuration class (oracle/uncertainty.py). "
                   "Written by benchmarks/residuals.py; regenerate after any change to the time "
                   "model or calibration.json."),
        "provenance": {
            "command": "python benchmarks/residuals.py"
                       + ("" if list(runs) == list(DEFAULT_RUNS)
                          else f" --runs {' '.join(runs)}")
                       + ("" if folds == 5 else f" --folds {folds}")
                       + ("" if seed == 0 else f" --seed {seed}"),
            "runs_file": " + ".join(_shown(p) for p in runs),
            "runs_sha256": " ".join(hashlib.sha256(Path(p).read_bytes()).hexdigest()
                                    for p in runs),
            "calibration": calib.about,
            "method": f"benchmarks/crossval.py::grouped_cv, {folds} folds by configuration, "
                      f"seed {seed}",
            "git_commit": commit,
            "date": utc_now(),
            "rows": len(cv.rows),
            # the hybrid Mamba rows (in the CV; they fit only the hybrid terms) and rows scored
            # apart by the shipped constants
            "rows_not_fitted": len(apart) + sum(not r.fitted for r in cv.rows),
            "quantiles": [Q_LO, 0.5, Q_HI],
            "features": list(FEATURES),
            "min_class_rows": MIN_CLASS_ROWS,
        },
        "pairwise": pairwise(cv, resid),
        "classes": classes,
    }


def render(data: dict) -> str:
    rows = []
    for key, c in data["classes"].items():
        rows.append([key, str(c["rows"]), f"{100 * (np.exp(c['q_lo']) - 1):+.1f}%",
                     f"{100 * (np.exp(c['q_mid']) - 1):+.1f}%",
                     f"{100 * (np.exp(c['q_hi']) - 1):+.1f}%", f"{100 * c['mape']:.1f}%",
                     "" if c["rows"] >= MIN_CLASS_ROWS else "widened to parent"])
    pw = data["pairwise"]
    return "\n".join([
        table(["class", "rows", "p10 (measured/projected - 1)", "p50", "p90", "CV MAPE", "use"],
              rows),
        "",
        (f"pairs of configurations (same model, GPU, source): {pw['pairs']}; median |error of the "
        f"projected ratio| {100 * (np.exp(pw['median_abs_log_ratio_error']) - 1):.1f}%, 90th "
        f"percentile {100 * (np.exp(pw['q90_abs_log_ratio_error']) - 1):.1f}%"),
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", default=DEFAULT_RUNS)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESIDUALS_PATH))
    args = ap.parse_args(argv)
    data = build(args.runs, args.folds, args.seed)
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out} ({data['provenance']['rows']} rows, {data['provenance']['method']})")
    print(render(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
