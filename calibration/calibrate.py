"""Fit the time-model constants to measured runs (``tune-cp calibrate --runs FILE.csv``).

Method (maximum a posteriori, regularised towards physical priors):

* every row of the CSV with a measured tokens/s/GPU that :mod:`formats.runs` can represent is
  projected with :func:`oracle.work.build_work` once; the constants enter only
  :func:`oracle.timing.timing`, so one evaluation of all rows takes milliseconds;
* unknowns: each per-architecture constant (:mod:`oracle.constants`) once per architecture that
  has rows, each shared constant once; fractions are fitted in logit space, positive constants
  in log space, each with a Gaussian prior of width ``prior_sigma`` around its documented prior
  (so an architecture with five rows moves only as far as they support);
* residual of a row: ``log(projected / measured)`` tokens/s/GPU, divided by
  :data:`ROW_NOISE` (the scatter between releases of the same published configuration) and
  weighted ``1 / sqrt(duplicates)`` for rows repeating the same configuration; a robust Cauchy
  weight (iteratively reweighted, scale :data:`ROBUST_SCALE`) keeps rows no physical model can
  match (a software release 2x slower than the next) from dragging the constants;
* Levenberg-Marquardt with a finite-difference Jacobian (numpy only).

:func:`calibrate` returns a :class:`CalibrationReport` and writes the calibration JSON (the
header says which rows, when, and the fit error) when ``out_path`` is given.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from tune_cp.config.specs import ConfigError
from tune_cp.formats.runs import NOT_FITTED, RunRow, read_runs_files, runs_label, scored_rows
from tune_cp.oracle.constants import (
    ARCHITECTURES,
    BY_NAME,
    CONSTANTS,
    REFERENCE_SOFTWARE,
    SOFTWARE_BY_NAME,
    SOFTWARE_FACTORS,
    SOFTWARE_STACKS,
    CalibrationTable,
    architecture_key,
    load_calibration,
    mfu_class,
    prior_table,
    table_from_json,
    utc_now,
)
from tune_cp.oracle.timing import timing
from tune_cp.oracle.work import ConfigBatch, Work, build_work, concat_work

#: log-scale scatter assumed for one published measurement (release-to-release differences of the
#: same configuration on the Megatron-Bridge page are 5-15 %).
ROW_NOISE = 0.15
#: scale of the Cauchy robust weight on log residuals.
ROBUST_SCALE = 0.25
#: minimum number of representable rows to fit anything.
MIN_ROWS = 3
#: The constants fitted on the hybrid Mamba rows alone (:func:`fit_hybrid_terms`), every other
#: constant held at the fit on the transformer rows: the hybrid rows' error cannot move the
#: shared constants (``formats.runs.NOT_FITTED``), only the Mamba mixer's own kernels' rate.
HYBRID_TERMS: tuple[str, ...] = ("mamba_kernel_efficiency",)
#: Points of the log-spaced search of :func:`fit_hybrid_terms` between the constant's bounds.
HYBRID_GRID_POINTS = 481
#: Key of the software factors shared by every stack other than the reference: PyTorch-native
#: training stacks (torchtitan, llm-foundry) run the same kind of kernels (cuBLAS GEMMs from
#: PyTorch, FlashAttention / SDPA attention, no Transformer Engine fused norms, casts and
#: cross-entropy), so a stack's factor is this shared factor times its own deviation
#: (prior 1, width :data:`STACK_DEVIATION_SIGMA`); a stack with no rows gets the shared factor.
SHARED_STACK_KEY = "sw:*"
#: Log-space prior width of one stack's deviation from the shared non-reference factor: the
#: stacks differ by their compile and attention paths (torch.compile, Triton flash attention)
#: by up to ~15% (order of magnitude).
STACK_DEVIATION_SIGMA = 0.15


@dataclass
class PreparedRows:
    """Rows projected to work records once (constants-independent)."""

    rows: list[RunRow]
    work: Work
    archs: list[str]
    software: list[str]
    measured: np.ndarray
    tokens_per_step: np.ndarray
    world: np.ndarray
    weight: np.ndarray


def configuration_key(r: RunRow) -> tuple:
    """What makes two rows the same configuration (a repeat across software releases): model,
    GPU, cluster shape, layout, micro-batch, sequence length, global batch, precision and FP8
    recipe, recompute, software stack."""
    c, t, cl = r.cfg, r.training, r.cluster
    assert c is not None and t is not None and cl is not None and r.model is not None
    return (r.model.name, cl.gpu.name, cl.num_nodes, cl.gpus_per_node, c.tp, c.pp, c.vpp, c.cp,
            c.ep, c.etp_, c.mbs, t.seq_len, t.global_batch_size, str(t.precision),
            str(c.fp8_recipe), str(c.recompute), r.software)


def prepare(rows: Iterable[RunRow]) -> PreparedRows:
    """Work arrays of every representable row with a measurement."""
    rows = [r for r in rows if r.representable and r.measured_tokens_per_s_per_gpu]
    if not rows:
        raise ConfigError("no representable rows with a measured tokens_per_sec_per_gpu")
    works = []
    for r in rows:
        assert r.model and r.cluster and r.training and r.cfg
        works.append(build_work(r.model, r.cluster, r.training,
                                ConfigBatch.from_configs([r.cfg], r.traits)))
    keys = [configuration_key(r) for r in rows]
    dup = Counter(keys)
    return PreparedRows(
        rows=rows,
        work=concat_work(works),
        archs=[architecture_key(r.cluster.gpu.architecture) for r in rows],  # type: ignore
        software=[r.software for r in rows],
        measured=np.array([r.measured_tokens_per_s_per_gpu for r in rows], dtype=float),
        tokens_per_step=np.array(
            [r.cfg.mbs * r.cfg.dp * r.cfg.ga * r.training.seq_len for r in rows],  # type: ignore
            dtype=float,
        ),
        world=np.array([r.cluster.world_size for r in rows], dtype=float),  # type: ignore
        weight=np.array([1.0 / math.sqrt(dup[k]) for k in keys]),
    )


# ------------------------------------------------------------------ parameter vector


@dataclass
class Layout:
    """Which entries of the parameter vector are which constant: ``(name, key)`` with key an
    architecture (per-architecture constants), None (shared constants) or ``sw:<stack>``
    (software-stack factors)."""

    entries: list[tuple[str, str | None]]
    archs_present: list[str]
    software_present: list[str]

    def prior_theta(self) -> np.ndarray:
        return np.array([_to_theta(c, _prior(c, a)) for c, a in self.entries])

    def sigma(self) -> np.ndarray:
        return np.array([
            STACK_DEVIATION_SIGMA if k and k.startswith("sw:") and k != SHARED_STACK_KEY
            else _def(c).prior_sigma for c, k in self.entries])


def _def(name: str):
    return BY_NAME.get(name) or SOFTWARE_BY_NAME[name]


def _prior(name: str, key: str | None) -> float:
    d = _def(name)
    return d.prior_for(key) if key and not key.startswith("sw:") else d.prior


def _to_theta(name: str, value: float) -> float:
    d = _def(name)
    if d.kind == "fraction":
        v = min(max(value, 1e-6), 1 - 1e-6)
        return math.log(v / (1 - v))
    return math.log(min(max(value, d.lower), d.upper))


def _from_theta(name: str, theta: np.ndarray | float) -> np.ndarray | float:
    d = _def(name)
    if isinstance(theta, float):  # one value (the fit's tables): the same arithmetic, no arrays
        if d.kind == "fraction":
            return 1.0 / (1.0 + math.exp(-theta))
        return min(max(math.exp(theta), d.lower), d.upper)
    if d.kind == "fraction":
        return 1.0 / (1.0 + np.exp(-np.asarray(theta)))
    return np.clip(np.exp(np.asarray(theta)), d.lower, d.upper)


def make_layout(archs: Iterable[str], software: Iterable[str] = ()) -> Layout:
    present = [a for a in ARCHITECTURES if a in set(archs)]
    stacks = [s for s in SOFTWARE_STACKS if s in set(software) and s != REFERENCE_SOFTWARE]
    entries: list[tuple[str, str | None]] = []
    for c in CONSTANTS:
        if c.name in HYBRID_TERMS:  # fitted apart, on the hybrid rows (fit_hybrid_terms)
            continue
        if c.per_arch:
            entries += [(c.name, a) for a in present]
        else:
            entries.append((c.name, None))
    for f in SOFTWARE_FACTORS:
        if stacks:
            entries.append((f.name, SHARED_STACK_KEY))
        entries += [(f.name, f"sw:{s}") for s in stacks]
    return Layout(entries, present, stacks)


@lru_cache(maxsize=1)
def _prior_table() -> dict[str, Any]:
    """:func:`oracle.constants.prior_table`, built once (read, never changed, by
    :func:`table_for_theta`, which the fit calls once per parameter per iteration)."""
    return prior_table()


def table_for_theta(layout: Layout, theta: np.ndarray) -> CalibrationTable:
    """The calibration table a parameter vector stands for (priors elsewhere)."""
    base = _prior_table()
    defaults = dict(base["defaults"])
    archs: dict[str, dict[str, float]] = {a: dict(v) for a, v in base["architectures"].items()}
    software: dict[str, dict[str, float]] = {}
    shared: dict[str, float] = {}
    for (name, key), th in zip(layout.entries, theta, strict=True):
        if key == SHARED_STACK_KEY:
            shared[name] = float(_from_theta(name, th))
    for (name, key), th in zip(layout.entries, theta, strict=True):
        value = float(_from_theta(name, th))
        if key is None:
            defaults[name] = value
        elif key == SHARED_STACK_KEY:
            continue
        elif key.startswith("sw:"):
            d = _def(name)
            software.setdefault(key[3:], {})[name] = float(
                np.clip(shared.get(name, 1.0) * value, d.lower, d.upper))
        else:
            archs.setdefault(key, {})[name] = value
    # a non-reference stack without rows: the shared factor
    for stack in SOFTWARE_STACKS:
        if stack != REFERENCE_SOFTWARE and stack not in software and shared:
            software[stack] = dict(shared)
    return CalibrationTable(defaults=defaults, architectures=archs, software=software)


def predict(prep: PreparedRows, consts: dict[str, np.ndarray]) -> np.ndarray:
    """Projected tokens/s/GPU of every prepared row."""
    step = timing(prep.work, consts)["step_time_s"]
    return prep.tokens_per_step / step / prep.world


def table_constants(
    table: CalibrationTable, archs: list[str], software: list[str] | None = None
) -> dict[str, np.ndarray]:
    """Per-row constant arrays of a calibration table."""
    software = software or [REFERENCE_SOFTWARE] * len(archs)
    keys = list(zip(archs, software, strict=True))
    uniq = sorted(set(keys))
    where = {k: i for i, k in enumerate(uniq)}
    rows = np.fromiter((where[k] for k in keys), dtype=np.intp, count=len(keys))
    per = [table.constants(*k) for k in uniq]
    # one row of every constant per distinct (architecture, software), then one per run row
    values = np.array([[p[c.name] for c in CONSTANTS] for p in per], dtype=float)[rows]
    return {c.name: values[:, j] for j, c in enumerate(CONSTANTS)}


# ---------------------------------------------------------------------------- the fit


#: The fit's outer (robust reweighting) rounds.
FIT_ROUNDS = 4
#: Convergence of one Levenberg-Marquardt round, in the fit's own units: the residuals are
#: divided by their noise (:data:`ROW_NOISE`) and the parameters' offsets by their prior
#: widths, so the cost is a chi-square and ``(J^T J)^-1`` the posterior covariance of the
#: parameters. A round ends when the Gauss-Newton step is shorter than this many posterior
#: standard deviations (``g^T (J^T J)^-1 g < FIT_TOL_SIGMA^2``, the Newton decrement; Boyd &
#: Vandenberghe, Convex Optimization, 9.5.1): the constants are then within 1% of their own
#: uncertainty of the round's optimum. On the published rows every constant ends within 0.03%
#: of the fit run to the former rule (until a step under 1e-5 in logit/log space), in 19
#: iterations instead of 53; on them plus the README's calibrate --log example, within 0.7%, in
#: 82 instead of 114.
FIT_TOL_SIGMA = 0.01
#: ... or when an accepted step lowered the chi-square by less than this (a change of 1 is one
#: standard deviation of one parameter) while moving every parameter by less than
#: FIT_TOL_SIGMA of its posterior standard deviation: the fit has stalled where the
#: Gauss-Newton model is poor (constants at their bounds, where the clipped Jacobian is zero).
FIT_STALL_CHI2 = 1e-4
#: Levenberg-Marquardt damping at the start of each round.
LM_LAMBDA_START = 1e-2


def fit(prep: PreparedRows, iterations: int = 40,
        progress: Callable[[int, int], None] | None = None
        ) -> tuple[Layout, np.ndarray, dict[str, Any]]:
    """Levenberg-Marquardt MAP fit (see module docstring). Returns layout, theta and stats.
    ``progress(done, total)``: called after each iteration (``total``: the most there can be,
    :data:`FIT_ROUNDS` x ``iterations``; a round that converges early counts in full)."""
    layout = make_layout(prep.archs, prep.software)
    theta = layout.prior_theta()
    prior, sigma = layout.prior_theta(), layout.sigma()
    logm = np.log(prep.measured)

    def resid_data(th: np.ndarray) -> np.ndarray:
        consts = table_constants(table_for_theta(layout, th), prep.archs, prep.software)
        return np.log(predict(prep, consts)) - logm

    def full(th: np.ndarray, rw: np.ndarray) -> np.ndarray:
        return np.concatenate([rw * resid_data(th) / ROW_NOISE, (th - prior) / sigma])

    n, k = len(prep.rows), len(theta)
    tiled: list[Work] = []  # every row's work once per parameter, built on first use

    def jacobian(th: np.ndarray, rw: np.ndarray, r: np.ndarray, eps: float) -> np.ndarray:
        """``(full(th + eps e_j, rw) - r) / eps`` for every j, the k perturbed projections in
        one ``timing`` call over the rows stacked k times (``concat_work``; elementwise, so each
        column is what ``full`` gives)."""
        if not tiled:
            tiled.append(concat_work([prep.work] * k))
        thetas = np.repeat(th[None, :], k, axis=0) + eps * np.eye(k)
        per = [table_constants(table_for_theta(layout, t), prep.archs, prep.software)
               for t in thetas]
        consts = {name: np.concatenate([c[name] for c in per]) for name in per[0]}
        step = timing(tiled[0], consts)["step_time_s"].reshape(k, n)
        res = np.log(prep.tokens_per_step / step / prep.world) - logm
        cols = np.concatenate([rw * res / ROW_NOISE, (thetas - prior) / sigma], axis=1)
        return ((cols - r) / eps).T

    robust = np.ones(len(prep.rows))
    done = 0  # Jacobians evaluated (iterations)
    for outer in range(FIT_ROUNDS):
        rw = prep.weight * robust
        r = full(theta, rw)
        cost = float(r @ r)
        # each round is its own least-squares problem: its damping starts afresh (carried
        # over, the 6e5 a converged round ends with after 12 refused steps made the next
        # rounds stop after one step of 1e-6: the robust reweighting never moved the fit)
        lam = LM_LAMBDA_START
        for it in range(iterations):
            if progress:
                progress(outer * iterations + it, FIT_ROUNDS * iterations)
            J = jacobian(theta, rw, r, 1e-4)
            done += 1
            A = J.T @ J
            gvec = J.T @ r
            # the Gauss-Newton step's length in posterior standard deviations (the Newton
            # decrement): under FIT_TOL_SIGMA, the round has converged
            if float(gvec @ np.linalg.solve(A, gvec)) < FIT_TOL_SIGMA ** 2:
                break
            std = np.sqrt(np.diag(np.linalg.inv(A)))  # posterior standard deviations
            improved = False
            before = cost
            for _ in range(12):
                step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-9), -gvec)
                cand = theta + step
                rc = full(cand, rw)
                cc = float(rc @ rc)
                if cc < cost:
                    theta, r, cost = cand, rc, cc
                    lam = max(lam / 3, 1e-7)
                    improved = True
                    break
                lam *= 4
            if not improved or (before - cost < FIT_STALL_CHI2
                                and np.max(np.abs(step) / std) < FIT_TOL_SIGMA):
                break  # stalled: no step lowers the cost, or steps below the noise
        res = resid_data(theta)
        robust = 1.0 / np.sqrt(1.0 + (res / ROBUST_SCALE) ** 2)
    if progress:
        progress(FIT_ROUNDS * iterations, FIT_ROUNDS * iterations)
    res = resid_data(theta)
    pred = np.exp(res + logm)
    stats = {
        "rows": len(prep.rows),
        "mape": float(np.mean(np.abs(pred / prep.measured - 1))),
        "median_ape": float(np.median(np.abs(pred / prep.measured - 1))),
        "iterations": done,
    }
    return layout, theta, stats


def table_from_fit(
    layout: Layout, theta: np.ndarray, header: dict[str, Any], about: str
) -> CalibrationTable:
    t = table_for_theta(layout, theta)

    def r(d: dict[str, float]) -> dict[str, float]:
        return {k: float(f"{v:.6g}") for k, v in d.items()}

    return CalibrationTable(
        defaults=r(t.defaults),
        architectures={a: r(v) for a, v in t.architectures.items()},
        software={s: r(v) for s, v in (t.software or {}).items()},
        about=about,
        fitted_on=header,
    )


def hybrid_rows(rows: Iterable[RunRow]) -> list[RunRow]:
    """The measured, representable rows of hybrid Mamba models (the rows
    :func:`fit_hybrid_terms` fits on)."""
    return [r for r in scored_rows(list(rows))
            if r.representable and r.model is not None and r.model.is_hybrid]


def hybrid_objective(log_ratio: np.ndarray, weight: np.ndarray, theta: float, prior: float,
                     sigma: float) -> float:
    """The MAP objective of one hybrid term: every row's log residual through the fit's robust
    (Cauchy, :data:`ROBUST_SCALE`) loss in units of :data:`ROW_NOISE`, which is the squared
    residual / ROW_NOISE^2 for small residuals, plus the Gaussian prior in log space."""
    c = ROBUST_SCALE
    data = float(np.sum(weight * (c / ROW_NOISE) ** 2 * np.log1p((log_ratio / c) ** 2)))
    return data + ((theta - prior) / sigma) ** 2


def fit_hybrid_terms(rows: Iterable[RunRow], table: CalibrationTable) -> CalibrationTable:
    """``table`` with :data:`HYBRID_TERMS` fitted per architecture on the hybrid rows among
    ``rows``, every other constant as ``table`` has it (second stage of the fit; the table
    itself when there are none). Each architecture's value is the minimum of
    :func:`hybrid_objective` over :data:`HYBRID_GRID_POINTS` log-spaced points between the
    constant's bounds (the projections are monotone in it: one minimum)."""
    hyb = hybrid_rows(rows)
    if not hyb:
        return table
    prep = prepare(hyb)
    logm = np.log(prep.measured)
    archs = {a: dict(v) for a, v in table.architectures.items()}
    for name in HYBRID_TERMS:
        d = BY_NAME[name]
        grid = np.exp(np.linspace(math.log(d.lower), math.log(d.upper), HYBRID_GRID_POINTS))
        for arch in sorted(set(prep.archs)):
            idx = np.array([a == arch for a in prep.archs])
            prior = math.log(d.prior_for(arch))
            best: tuple[float, float] | None = None
            for v in grid:
                trial = CalibrationTable(
                    defaults=table.defaults,
                    architectures={**archs, arch: {**archs.get(arch, {}), name: float(v)}},
                    software=table.software)
                pred = predict(prep, table_constants(trial, prep.archs, prep.software))
                obj = hybrid_objective((np.log(pred) - logm)[idx], prep.weight[idx],
                                       math.log(v), prior, d.prior_sigma)
                if best is None or obj < best[0]:
                    best = (obj, float(v))
            assert best is not None
            archs.setdefault(arch, {})[name] = float(f"{best[1]:.6g}")
    return CalibrationTable(defaults=table.defaults, architectures=archs,
                            software=table.software, about=table.about,
                            fitted_on=table.fitted_on)


def mfu_ceilings(prep: PreparedRows) -> dict[str, dict[str, Any]]:
    """Best measured MFU of the prepared rows per :func:`mfu_class`, with the row that set it
    (measured MFU = model FLOPs per token x measured tokens/s/GPU / the dense peak of the
    precision the GEMMs run in, as :class:`oracle.projection.Projection` defines it)."""
    from tune_cp.oracle.projection import mfu_peak_flops, model_flops_per_token_array

    best: dict[str, dict[str, Any]] = {}
    for r, measured in zip(prep.rows, prep.measured, strict=True):
        assert r.model and r.cluster and r.training and r.cfg
        flops = float(model_flops_per_token_array(r.model, r.training.seq_len,
                                                  np.array([r.cfg.tp]))[0])
        peak = mfu_peak_flops(r.cluster, r.training, r.cfg.fp8_recipe is not None)
        mfu = flops * float(measured) / peak
        key = mfu_class(r.model.is_moe, r.cluster.gpu.architecture, r.training.precision.value)
        if key not in best or mfu > best[key]["mfu"]:
            best[key] = {"mfu": round(mfu, 4), "row": r.row_id, "model": r.model.name,
                         "gpu": r.cluster.gpu.name}
    return dict(sorted(best.items()))


@dataclass
class CalibrationReport:
    """What :func:`calibrate` did: the table, which rows it used and skipped, the fit error."""

    table: CalibrationTable
    rows_used: list[str]
    rows_skipped: list[tuple[str, str]]
    mape: float
    median_ape: float
    prior_mape: float
    out_path: str | None = None
    per_row: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> str:
        lines = [
            f"calibrated on {len(self.rows_used)} rows "
            f"({len(self.rows_skipped)} skipped: no measurement or not representable)",
            f"tokens/s/GPU MAPE: {100 * self.prior_mape:.1f}% with priors -> "
            f"{100 * self.mape:.1f}% fitted (median {100 * self.median_ape:.1f}%)",
        ]
        if self.out_path:
            lines.append(f"written to {self.out_path}")
        return "\n".join(lines)


def calibrate_rows(
    rows: list[RunRow], source_label: str = "runs", exclude_sources: Iterable[str] = (),
    progress: Callable[[int, int], None] | None = None,
) -> CalibrationReport:
    """Fit on already-parsed rows (``exclude_sources``: source ids left out, for
    leave-one-source-out validation)."""
    excl = set(exclude_sources)
    usable = [r for r in scored_rows(rows) if r.fitted and r.source_id not in excl]
    skipped = [(r.row_id, r.reason or (NOT_FITTED if r.representable and r.model is not None
                                       and r.model.is_hybrid and r.measured_tokens_per_s_per_gpu
                                       else "no measured tokens/s/GPU"))
               for r in rows if r not in usable and r.source_id not in excl]
    if len(usable) < MIN_ROWS:
        raise ConfigError(
            f"{source_label}: only {len(usable)} representable rows with a measured "
            f"tokens_per_sec_per_gpu; calibration needs at least {MIN_ROWS}"
        )
    prep = prepare(usable)
    prior_pred = predict(
        prep, table_constants(table_from_json(prior_table()), prep.archs, prep.software)
    )
    prior_mape = float(np.mean(np.abs(prior_pred / prep.measured - 1)))
    layout, theta, stats = fit(prep, progress=progress)
    header = {
        "runs_file": source_label,
        "date": utc_now(),
        "rows": [r.row_id for r in usable],
        "excluded_sources": sorted(excl),
        "architectures_fitted": layout.archs_present,
        "gpus_fitted": sorted({r.cluster.gpu.name for r in usable}),  # type: ignore[union-attr]
        "gpus_by_architecture": {
            a: sorted({r.cluster.gpu.name for r in usable  # type: ignore[union-attr]
                       if architecture_key(r.cluster.gpu.architecture) == a})  # type: ignore
            for a in layout.archs_present
        },
        "software_stacks_fitted": layout.software_present,
        "tokens_per_s_mape": round(stats["mape"], 4),
        "tokens_per_s_median_ape": round(stats["median_ape"], 4),
        "tokens_per_s_mape_priors_only": round(prior_mape, 4),
        "method": "MAP fit: log residuals / 0.15, Cauchy-robust (0.25), Gaussian priors in "
                  "logit/log space (calibration/calibrate.py)",
    }
    header["mfu_ceilings"] = mfu_ceilings(prep)
    about = (
        f"tune-cp time-model constants fitted on {len(usable)} rows of {source_label} "
        f"({header['date']}); in-sample tokens/s/GPU MAPE {100 * stats['mape']:.1f}%"
    )
    hyb = [r for r in hybrid_rows(rows) if r.source_id not in excl]
    if hyb:
        header["hybrid_rows"] = [r.row_id for r in hyb]
        header["hybrid_terms"] = list(HYBRID_TERMS)
        about += (f"; {', '.join(HYBRID_TERMS)} fitted apart on {len(hyb)} hybrid Mamba rows")
    table = fit_hybrid_terms(hyb, table_from_fit(layout, theta, header, about))
    pred = predict(prep, table_constants(table, prep.archs, prep.software))
    per_row = [
        {"row_id": r.row_id, "measured": float(m), "projected": float(p)}
        for r, m, p in zip(prep.rows, prep.measured, pred, strict=True)
    ]
    return CalibrationReport(
        table=table,
        rows_used=[r.row_id for r in usable],
        rows_skipped=skipped,
        mape=stats["mape"],
        median_ape=stats["median_ape"],
        prior_mape=prior_mape,
        per_row=per_row,
    )


def calibrate(
    runs_csv_path: str | Path | list[str | Path] | tuple[str | Path, ...],
    out_path: str | Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CalibrationReport:
    """Fit the constants on a runs CSV, or on several (the columns of published_runs.csv; the
    shipped constants: :data:`formats.runs.PUBLISHED_RUNS_FILES`) and, when ``out_path`` is
    given, write the calibration JSON there (load it with ``project(..., calib=out_path)``)."""
    rows = read_runs_files(runs_csv_path)
    report = calibrate_rows(rows, source_label=runs_label(runs_csv_path), progress=progress)
    if out_path is not None:
        out = Path(out_path)
        out.write_text(json.dumps(report.table.to_json(), indent=2) + "\n")
        report.out_path = str(out)
    return report


def load(path: str | Path | None = None) -> CalibrationTable:
    """Alias of :func:`oracle.constants.load_calibration`."""
    return load_calibration(path)
