"""Intervals on projected throughput from the out-of-fold residuals of a configuration's class.

Where the numbers come from: ``benchmarks/residuals.py`` runs the grouped cross-validation of the
time model (:func:`benchmarks.crossval.grouped_cv`: every published run projected with constants
fitted on the folds that do not contain its configuration) and writes, per class, the quantiles of
the out-of-fold log residual ``r = log(measured / projected)`` to ``oracle/catalog/residuals.json``
(with the runs file, its SHA-256, the calibration it validated, folds, seed and date). An interval
is then ``[projected x exp(q_lo), projected x exp(q_hi)]``: where, judged by how far the model
missed published runs of the same kind that it was not fitted on, the measurement is likely to
land (the 10th and 90th percentiles: an 80 % interval).

Classes: a configuration is described by five features, most general first:

* ``arch``: the GPU's architecture (``hopper``, ``blackwell``, ``cdna3``, ...; ``unknown`` for a
  GPU file without one — no published row has it, so only the pooled class applies);
* ``moe``: ``moe`` or ``dense``; ``hybrid`` for a hybrid Mamba model (dense or MoE): its rows are
  not fitted on (``formats/runs.py::NOT_FITTED``), so their residuals against the shipped
  constants are out-of-sample already, and they carry the Mamba terms' own error (projected
  20-45% too fast today) that no transformer class shows;
* ``vpp``: interleaving depth ``1``, ``2-4`` or ``5+`` virtual stages per pipeline rank;
* ``cp``: ``1`` or ``2+`` context-parallel ranks;
* ``prec``: ``bf16``, ``fp4`` or the FP8 recipe (``tensorwise``, ``blockwise``, ``mxfp8``,
  ``delayed``).

A class whose residuals' 10th and 90th percentiles are on one side of zero (today the hybrid
Mamba classes: their projections ran 23-32% above measured) gives intervals that do not hold
their projections: the interval is kept as it is (where measurements of that class landed) and
every output that prints it says the class is biased and by how much
(:attr:`ClassInterval.biased`, ``class biased: ...``; ``--json``: ``contains_projection``,
``class_bias``, ``bias_note``).

The interval of a configuration is that of its most specific class (all five features, then
dropping ``prec``, ``cp``, ``vpp``, ``moe``, ``arch`` in that order) with at least
:data:`MIN_CLASS_ROWS` out-of-fold rows; the class used is reported (a configuration whose own
class has too few rows says which parent class it was widened to). The pooled class (every row)
always exists. A hybrid configuration never borrows a transformer class: its parents stop at
``arch=...|moe=hybrid`` and then the pooled hybrid class ``moe=hybrid`` (:data:`HYBRID_POOL`);
hybrid rows are not in ``all`` or the architecture classes, so they do not widen the
transformers' intervals.

A cluster's own runs: a calibration file written by ``tune-cp calibrate --log`` records the log
residuals of the refit in its header (``fitted_on.user_residuals``, ``log(measured / projected)``
with the refitted constants, :mod:`calibration.refit`). With at least :data:`MIN_CLASS_ROWS` of them,
:func:`residuals_for` gives every projection made with that file (``--calibration FILE``) the
interval of those residuals (class :data:`USER_CLASS`): the cluster's own scatter, not the
published runs'. Those residuals are in-sample (the refit saw the logs), so the interval is never
narrower than the published class it replaces.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from tune_cp.config.specs import ClusterSpec, ModelSpec, ParallelConfig, Precision, TrainingSpec

RESIDUALS_PATH = Path(__file__).parent / "catalog" / "residuals.json"

#: features of a class, most general first; parents drop features from the end.
FEATURES = ("arch", "moe", "vpp", "cp", "prec")
#: fewest out-of-fold rows for a class to carry its own interval (a 10th percentile of fewer than
#: eight rows is the smallest or second-smallest residual: too noisy to trust).
MIN_CLASS_ROWS = 8
#: the quantiles of the interval (an 80 % interval) and its centre.
Q_LO, Q_MID, Q_HI = 0.10, 0.50, 0.90
#: the value of the ``moe`` feature for hybrid Mamba models, and their pooled class
HYBRID = "hybrid"
HYBRID_POOL = f"moe={HYBRID}"
#: the class of the residuals of a user's logged runs (``calibrate --log``)
USER_CLASS = "user logs"


def vpp_bucket(vpp: int) -> str:
    """Interleaving depth class: ``1``, ``2-4`` or ``5+`` virtual stages per pipeline rank."""
    return "1" if vpp <= 1 else "2-4" if vpp <= 4 else "5+"


def precision_class(precision: Precision, cfg: ParallelConfig) -> str:
    """``bf16``, ``fp4`` or the FP8 recipe (resolved configurations name it)."""
    if precision is Precision.FP8:
        return cfg.fp8_recipe.value if cfg.fp8_recipe is not None else "tensorwise"
    return precision.value


def class_features(arch: str, moe: bool, vpp: int, cp: int, prec: str,
                   hybrid: bool = False) -> tuple[str, ...]:
    return (arch or "unknown", HYBRID if hybrid else "moe" if moe else "dense", vpp_bucket(vpp),
            "1" if cp <= 1 else "2+", prec)


def class_key(features: Sequence[str], depth: int | None = None) -> str:
    """``arch=hopper|moe=dense|vpp=1`` for the first ``depth`` features; ``all`` for none."""
    n = len(features) if depth is None else depth
    return "|".join(f"{k}={v}" for k, v in zip(FEATURES[:n], features[:n], strict=True)) or "all"


def parents(features: Sequence[str]) -> list[str]:
    """The class keys from the most specific to ``all`` (hybrid: to :data:`HYBRID_POOL`)."""
    if features[1] == HYBRID:
        return [class_key(features, d) for d in range(len(FEATURES), 1, -1)] + [HYBRID_POOL]
    return [class_key(features, d) for d in range(len(FEATURES), -1, -1)]


@dataclass(frozen=True)
class ClassInterval:
    """The residual quantiles of one class."""

    key: str
    rows: int
    q_lo: float
    q_mid: float
    q_hi: float

    def to_json(self) -> dict[str, Any]:
        return {"class": self.key, "rows": self.rows, "q_lo": self.q_lo, "q_mid": self.q_mid,
                "q_hi": self.q_hi}

    @property
    def biased(self) -> float | None:
        """How far this class's projections ran from measured when its residuals' 10th and 90th
        percentiles lie on one side of zero (so its intervals do not hold their projections):
        projected / measured - 1 at the median residual, ``exp(-q_mid) - 1`` (positive: the
        projections ran above measured; ``moe=hybrid``: exp(0.207) - 1 = +23%). None when the
        interval holds the projection (``q_lo <= 0 <= q_hi``)."""
        if self.q_lo <= 0.0 <= self.q_hi:
            return None
        return float(np.exp(-self.q_mid) - 1.0)

    def bias_text(self) -> str:
        """``class biased: projections of class K ran 23% above measured (median out-of-fold
        residual, N rows); the interval is where measurements landed``; empty when unbiased."""
        b = self.biased
        if b is None:
            return ""
        return (f"class biased: projections of class {self.key} ran {abs(b):.0%} "
                f"{'above' if b > 0 else 'below'} measured (median out-of-fold residual, "
                f"{self.rows} rows), so the interval lies {'below' if b > 0 else 'above'} the "
                f"projection")


@dataclass(frozen=True)
class Interval:
    """The interval of one projection: ``low``..``high`` tokens/s/GPU, from ``used`` (the class
    whose residuals set it) for a configuration of class ``own`` (``widened`` when they differ)."""

    projected: float
    low: float
    high: float
    own: str
    used: ClassInterval

    @property
    def widened(self) -> bool:
        return self.own != self.used.key

    @property
    def contains(self) -> bool:
        """Whether the interval holds its own projection (its class's 10th and 90th percentile
        residuals are on both sides of zero)."""
        return self.used.biased is None

    @property
    def bias(self) -> float | None:
        """The class's bias when the interval lies on one side of the projection:
        :attr:`ClassInterval.biased` (None when it holds the projection)."""
        return self.used.biased

    def bias_text(self) -> str:
        """``class biased: ...`` (:meth:`ClassInterval.bias_text`); empty when unbiased."""
        return self.used.bias_text()

    def to_json(self) -> dict[str, Any]:
        return {"low_tokens_per_s_per_gpu": self.low, "high_tokens_per_s_per_gpu": self.high,
                "quantiles": [Q_LO, Q_HI], "class": self.own, "class_used": self.used.key,
                "class_rows": self.used.rows, "widened": self.widened,
                "contains_projection": self.contains, "class_bias": self.bias,
                "bias_note": self.bias_text() or None}

    def text(self) -> str:
        why = (f"class {self.used.key}, {self.used.rows} rows: widened, the own class {self.own} "
               f"and the parents before it have fewer than {MIN_CLASS_ROWS}" if self.widened else
               f"class {self.used.key}, {self.used.rows} rows")
        bias = f"; {self.bias_text()}" if self.bias is not None else ""
        return (f"{self.low:,.0f}-{self.high:,.0f} tokens/s/GPU (80% interval from out-of-fold "
                f"residuals; {why}{bias})")


#: the mark after an interval that does not hold its projection (its class is biased); every
#: output that prints the mark prints the class's bias in a note (:func:`bias_notes`)
BIAS_MARK = "!"


def band_text(low: float, high: float, biased: bool) -> str:
    """``1,073-1,355`` for a table's interval column, :data:`BIAS_MARK` after it when the
    interval's class is biased (the interval does not hold the projection)."""
    return f"{low:,.0f}-{high:,.0f}{BIAS_MARK if biased else ''}"


def bias_notes(notes: Sequence[str | None]) -> list[str]:
    """The table notes of the biased classes among ``notes`` (each interval's ``bias_text()`` /
    JSON ``bias_note``; empty or None for an unbiased one): one line per distinct note, in
    first-seen order, after :data:`BIAS_MARK`."""
    out: list[str] = []
    for n in notes:
        if n and n not in out:
            out.append(n)
    return [f"{BIAS_MARK} {n}" for n in out]


class ResidualTable:
    """The per-class residual quantiles of a residuals file."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.classes = {k: ClassInterval(k, v["rows"], v["q_lo"], v["q_mid"], v["q_hi"])
                        for k, v in data["classes"].items()}

    @property
    def provenance(self) -> dict[str, Any]:
        return self.data.get("provenance", {})

    def lookup(self, features: Sequence[str]) -> ClassInterval:
        for key in parents(features):
            c = self.classes.get(key)
            if c is not None and c.rows >= MIN_CLASS_ROWS:
                return c
        return self.classes["all"]

    def intervals(self, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                  configs: Sequence[ParallelConfig], projected: np.ndarray) -> list[Interval]:
        """One interval per configuration (vectorised by class: the features take few values)."""
        arch = cluster.gpu.architecture
        # per (vpp, cp, FP8 recipe), what the features read of a configuration: the class, its
        # key and its two factors (a few per search)
        cache: dict[tuple[Any, ...], tuple[ClassInterval, str, float, float]] = {}
        out = []
        for c, p in zip(configs, np.asarray(projected, dtype=float).tolist(), strict=True):
            key = (c.vpp, c.cp, c.fp8_recipe)
            got = cache.get(key)
            if got is None:
                f = class_features(arch, model.is_moe, c.vpp, c.cp,
                                   precision_class(training.precision, c), model.is_hybrid)
                ci = self.lookup(f)
                got = cache[key] = (ci, class_key(f), float(np.exp(ci.q_lo)),
                                    float(np.exp(ci.q_hi)))
            ci, name, lo, hi = got
            out.append(Interval(p, p * lo, p * hi, name, ci))
        return out

    def interval(self, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                 cfg: ParallelConfig, projected: float) -> Interval:
        return self.intervals(model, cluster, training, [cfg], np.array([projected]))[0]


class UserResidualTable(ResidualTable):
    """A residual table whose every lookup is the user's logs' class when it is at least as wide
    as the published class it replaces (else the published class: in-sample log residuals are
    no licence for a narrower interval)."""

    def __init__(self, data: dict[str, Any], user: ClassInterval) -> None:
        super().__init__(data)
        self.user = user

    def lookup(self, features: Sequence[str]) -> ClassInterval:
        published = super().lookup(features)
        if self.user.q_hi - self.user.q_lo >= published.q_hi - published.q_lo:
            return self.user
        return published


def user_interval(residuals: Sequence[float]) -> ClassInterval | None:
    """The :data:`USER_CLASS` quantiles of a cluster's log residuals; None with fewer than
    :data:`MIN_CLASS_ROWS`."""
    r = np.asarray([float(x) for x in residuals], dtype=float)
    r = r[np.isfinite(r)]
    if len(r) < MIN_CLASS_ROWS:
        return None
    return ClassInterval(USER_CLASS, len(r), float(np.quantile(r, Q_LO)),
                         float(np.quantile(r, Q_MID)), float(np.quantile(r, Q_HI)))


def residuals_for(calibration: str | None = None) -> ResidualTable:
    """The residual table for projections made with ``calibration`` (a calibration file path;
    None: the shipped one): the shipped residuals, with the user's logs' class when that file
    was written by ``calibrate --log`` from at least :data:`MIN_CLASS_ROWS` logs (module
    docstring)."""
    table = load_residuals()
    if not calibration:
        return table
    from tune_cp.oracle.constants import load_calibration

    header = load_calibration(calibration).fitted_on or {}
    raw = header.get("user_residuals") if isinstance(header, dict) else None
    user = user_interval(raw) if isinstance(raw, list) else None
    return table if user is None else UserResidualTable(table.data, user)


@lru_cache(maxsize=4)
def load_residuals(path: str | None = None) -> ResidualTable:
    """The residual table (``oracle/catalog/residuals.json`` unless ``path``)."""
    p = Path(path) if path else RESIDUALS_PATH
    return ResidualTable(json.loads(p.read_text()))


def residual_classes(features: Sequence[Sequence[str]], residuals: np.ndarray) -> dict[str, dict]:
    """Quantiles of ``residuals`` (log measured / projected) for every class and parent class
    that the rows' ``features`` fall in (what ``benchmarks/residuals.py`` writes)."""
    members: dict[str, list[int]] = {}
    for i, f in enumerate(features):
        for key in parents(f):
            members.setdefault(key, []).append(i)
    out = {}
    for key in sorted(members, key=lambda k: (k.count("|") if k != "all" else -1, k)):
        r = residuals[np.array(members[key])]
        out[key] = {"rows": len(r), "q_lo": round(float(np.quantile(r, Q_LO)), 4),
                    "q_mid": round(float(np.quantile(r, Q_MID)), 4),
                    "q_hi": round(float(np.quantile(r, Q_HI)), 4),
                    "mape": round(float(np.mean(np.abs(np.exp(-r) - 1))), 4)}
    return out
