"""Accuracy of the projection oracle on published runs.

Projects every row of the runs CSVs (default the copies of ../shared/calibration/published_runs.csv
and amd_published_runs.csv, ``formats.runs.PUBLISHED_RUNS_FILES``) that has a
measured tokens/s/GPU and prints, as plain-text tables: overall, per-source and per-GPU mean
absolute percentage error (MAPE) of tokens/s/GPU; the ten worst rows with their breakdown;
Spearman rank correlation within groups of the same model and hardware; a leave-one-source-out
table (calibrate without a source, score that source); the grouped 5-fold cross-validation of
``benchmarks/crossval.py`` (the best estimate of the error on runs the constants were not
fitted on); the unrepresentable rows with reasons.

    python benchmarks/accuracy.py [--runs FILE.csv ...] [--calibration FILE.json]
                                               [--no-loso] [--no-cv]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tune_cp.calibration.calibrate import calibrate_rows, prepare, table_constants  # noqa: E402
from tune_cp.formats.runs import (  # noqa: E402
    NOT_FITTED,
    PUBLISHED_RUNS_FILES,
    RunRow,
    read_runs_files,
    runs_label,
    scored_rows,
)
from tune_cp.oracle.constants import load_calibration  # noqa: E402
from tune_cp.oracle.timing import BREAKDOWN, timing  # noqa: E402


def _crossval_module():
    """``benchmarks/crossval.py`` loaded by path (``benchmarks/`` itself is not put on the path:
    its ``oracle.py`` would shadow the package)."""
    import importlib.util

    name = "tune_cp_crossval"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("crossval.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod

#: Copies of ../shared/calibration/published_runs.csv and amd_published_runs.csv (the published
#: runs the shipped constants are fitted on), kept in the repository so tests and CI need nothing
#: outside it.
DEFAULT_RUNS: list[str] = [str(p) for p in PUBLISHED_RUNS_FILES]


_cv = _crossval_module()
ranks, spearman, table, pct = _cv.ranks, _cv.spearman, _cv.table, _cv.pct


def project_rows(rows: list[RunRow], calib) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    prep = prepare(rows)
    res = timing(prep.work, table_constants(calib, prep.archs, prep.software))
    pred = prep.tokens_per_step / res["step_time_s"] / prep.world
    return pred, res


def model_family(r: RunRow) -> str:
    """The row's model architecture: the catalog family (``llama``, ``qwen3_moe``,
    ``nemotron_h``, ...), else the model name's letters."""
    from tune_cp.oracle.catalog import model_entries

    entry = model_entries().get(r.model.name) if r.model else None
    fam = getattr(entry, "family", None) if entry is not None else None
    if fam:
        return str(fam)
    import re

    m = re.match(r"[A-Za-z]+", r.model_name)
    return m.group(0).lower() if m else r.model_name


def print_classes(rows: list[RunRow], pred: np.ndarray) -> None:
    """In-sample error per class (dense / MoE / hybrid Mamba, as ``crossval.row_class``) and per
    model architecture, the hybrid rows with the shipped constants (their Mamba term is fitted
    on them)."""
    meas = np.array([r.measured_tokens_per_s_per_gpu for r in rows])
    ape, logerr = np.abs(pred / meas - 1), np.log(pred / meas)
    for title, key in (("class", lambda r: _cv.row_class(r, "moe/dense")),
                       ("model architecture", model_family)):
        groups: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(rows):
            groups[key(r)].append(i)
        out = []
        for k, idx in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            a = np.array(idx)
            out.append([k, str(len(a)), pct(float(ape[a].mean())),
                        pct(float(np.median(ape[a]))), f"{100 * float(logerr[a].mean()):+.1f}%"])
        print(f"== Per {title} (in-sample; hybrid rows fit only mamba_kernel_efficiency) ==")
        print(table([title, "rows", "MAPE", "median", "bias (mean log err)"], out))
        print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", default=DEFAULT_RUNS)
    ap.add_argument("--calibration", default=None, help="calibration JSON (default: shipped)")
    ap.add_argument("--no-loso", action="store_true", help="skip leave-one-source-out")
    ap.add_argument("--no-cv", action="store_true", help="skip the grouped cross-validation")
    args = ap.parse_args(argv)

    all_rows = read_runs_files(args.runs)
    measured_rows = scored_rows(all_rows)
    rep = [r for r in measured_rows if r.fitted]
    apart = [r for r in measured_rows if r.representable and not r.fitted]
    unrep = [r for r in measured_rows if not r.representable]
    calib = load_calibration(args.calibration)
    pred, res = project_rows(rep, calib)
    meas = np.array([r.measured_tokens_per_s_per_gpu for r in rep])
    ape = np.abs(pred / meas - 1)
    logerr = np.log(pred / meas)

    print(f"runs files: {runs_label(args.runs)}")
    print(f"calibration: {calib.about or 'priors'}")
    print()
    print("== Overall (tokens/s/GPU) ==")
    print(table(
        ["rows in file", "with measured tokens/s", "representable", "share", "MAPE",
         "median APE", "within 10%", "within 15%"],
        [[str(len(all_rows)), str(len(measured_rows)), str(len(rep)),
          pct(len(rep) / max(1, len(measured_rows))), pct(float(ape.mean())),
          pct(float(np.median(ape))), pct(float((ape <= 0.10).mean())),
          pct(float((ape <= 0.15).mean()))]],
    ))
    print()

    def grouped(key) -> list[list[str]]:
        groups: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(rep):
            groups[key(r)].append(i)
        out = []
        for k, idx in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            idx_a = np.array(idx)
            out.append([k, str(len(idx)), pct(float(ape[idx_a].mean())),
                        pct(float(np.median(ape[idx_a]))),
                        f"{100 * float(np.mean(logerr[idx_a])):+.1f}%"])
        return out

    print("== Per source ==")
    print(table(["source", "rows", "MAPE", "median", "bias (mean log err)"],
                grouped(lambda r: r.source_id)))
    print()
    print_classes(rep + apart, np.concatenate([pred, project_rows(apart, calib)[0]])
                  if apart else pred)
    print("== Per GPU ==")
    print(table(["gpu", "rows", "MAPE", "median", "bias (mean log err)"],
                grouped(lambda r: r.gpu_name)))
    print()

    print("== Ten worst rows ==")
    worst = np.argsort(-ape)[:10]
    wrows = []
    for i in worst:
        r = rep[i]
        comps = sorted(((k, float(res[k][i])) for k in BREAKDOWN), key=lambda kv: -kv[1])
        step = float(res["step_time_s"][i])
        top = ", ".join(f"{k} {100 * v / step:.0f}%" for k, v in comps[:5] if v > 0)
        wrows.append([r.row_id, r.source_id, f"{r.model.name}", r.gpu_name,
                      r.cfg.label().replace(" ", ""), f"mbs{r.cfg.mbs}",
                      r.training.precision.value, f"{meas[i]:.0f}", f"{pred[i]:.0f}",
                      f"{100 * (pred[i] / meas[i] - 1):+.0f}%", f"{step:.2f}s", top])
    print(table(["row", "source", "model", "gpu", "layout", "mbs", "prec", "measured",
                 "projected", "error", "step", "breakdown (share of step)"], wrows))
    print()

    print("== Spearman rank correlation within groups (same model and GPU, >= 3 rows) ==")
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(rep):
        groups[r.group].append(i)
    srows, rhos, weights = [], [], []
    for (model, gpu), idx in sorted(groups.items()):
        if len(idx) < 3:
            continue
        idx_a = np.array(idx)
        if len(np.unique(meas[idx_a])) < 2:
            continue
        rho = spearman(pred[idx_a], meas[idx_a])
        shown = f"{rho:+.2f}" if rho == rho else "n/a (one configuration, several releases)"
        srows.append([model, gpu, str(len(idx)), shown])
        if rho == rho:
            rhos.append(rho)
            weights.append(len(idx))
    print(table(["model", "gpu", "rows", "spearman"], srows))
    if rhos:
        print(f"mean within-group Spearman: {np.mean(rhos):+.2f} (row-weighted "
              f"{np.average(rhos, weights=weights):+.2f}) over {len(rhos)} groups")
    print()

    if not args.no_loso:
        print("== Leave one source out (calibrate without the source, score it) ==")
        sources = sorted({r.source_id for r in rep}, key=lambda s: -sum(
            1 for r in rep if r.source_id == s))
        lrows = []
        all_ape = []
        for src in sources:
            held = [r for r in rep if r.source_id == src]
            rest = [r for r in all_rows if r.source_id != src]
            try:
                rep_fit = calibrate_rows(rest, source_label=f"without {src}")
            except Exception as e:  # noqa: BLE001 - reported in the table
                lrows.append([src, str(len(held)), "-", "-", f"fit failed: {e}"])
                continue
            p_held, _ = project_rows(held, rep_fit.table)
            m_held = np.array([r.measured_tokens_per_s_per_gpu for r in held])
            a_held = np.abs(p_held / m_held - 1)
            idx = np.array([rep.index(r) for r in held])
            all_ape.extend(a_held.tolist())
            lrows.append([src, str(len(held)), pct(float(ape[idx].mean())),
                          pct(float(a_held.mean())), pct(float(np.median(a_held)))])
        print(table(["held-out source", "rows", "MAPE (all sources fitted)",
                     "MAPE (source held out)", "median (held out)"], lrows))
        if all_ape:
            print(f"pooled held-out MAPE: {pct(float(np.mean(all_ape)))} over "
                  f"{len(all_ape)} rows")
        print()

    if not args.no_cv:
        cvm = _crossval_module()
        print(cvm.report(cvm.grouped_cv(all_rows)))
        print()

    if apart:
        pa, ra = project_rows(apart, calib)
        ma = np.array([r.measured_tokens_per_s_per_gpu for r in apart])
        ea = pa / ma - 1
        print(f"== Representable, scored apart ({NOT_FITTED}): {len(apart)} rows, "
              f"MAPE {pct(float(np.abs(ea).mean()))}, median {pct(float(np.median(np.abs(ea))))}"
              f", bias {100 * float(np.mean(np.log1p(ea))):+.1f}% ==")
        print(table(["row", "model", "gpu", "layout", "prec", "measured", "projected", "error"],
                    [[r.row_id, r.model.name if r.model else r.model_name, r.gpu_name,
                      r.cfg.label() if r.cfg else "", r.training.precision.value
                      if r.training else "", f"{r.measured_tokens_per_s_per_gpu:.0f}",
                      f"{pa[i]:.0f}", f"{100 * ea[i]:+.1f}%"] for i, r in enumerate(apart)]))
        print()
    print(f"== Unrepresentable rows with a measurement: {len(unrep)} of "
          f"{len(measured_rows)} ==")
    print(table(["row", "source", "model", "reason"],
                [[r.row_id, r.source_id, r.model_name, r.reason or ""] for r in unrep]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
