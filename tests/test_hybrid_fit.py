"""The Mamba mixer's own kernel rate (``mamba_kernel_efficiency``) and its second-stage fit on
the hybrid Mamba rows (``calibration/calibrate.py::fit_hybrid_terms``)."""

from __future__ import annotations

import math

import numpy as np

from tune_cp.calibration.calibrate import (
    HYBRID_TERMS,
    ROBUST_SCALE,
    ROW_NOISE,
    fit_hybrid_terms,
    hybrid_objective,
    hybrid_rows,
    make_layout,
    predict,
    prepare,
    table_constants,
)
from tune_cp.formats.runs import PUBLISHED_RUNS_FILES, read_runs_files
from tune_cp.oracle.constants import BY_NAME, CalibrationTable, load_calibration
from tune_cp.oracle.timing import mamba_kernel_time


def test_mamba_kernel_time_by_hand():
    """2.0 ms modelled at the flash-attention / element-wise rates takes 4.0 ms at 0.5 and is
    unchanged at the prior 1."""
    assert math.isclose(float(mamba_kernel_time(2.0e-3, 0.5)), 4.0e-3)
    assert math.isclose(float(mamba_kernel_time(2.0e-3, 1.0)), 2.0e-3)
    d = BY_NAME["mamba_kernel_efficiency"]
    assert d.per_arch and d.prior == 1.0 and d.kind == "positive"


def test_hybrid_objective_by_hand():
    """Two rows of weight 1 at log residuals 0.1 and -0.2, theta 0 against prior 0, sigma 0.5:
    (0.25 / 0.15)^2 x (ln(1 + 0.16) + ln(1 + 0.64)) = 2.7778 x 0.64312 = 1.7864; the prior
    term 0. Small residuals are the fit's squared residual / ROW_NOISE^2."""
    v = hybrid_objective(np.array([0.1, -0.2]), np.ones(2), 0.0, 0.0, 0.5)
    assert round(v, 4) == round((0.25 / 0.15) ** 2 * (math.log(1.16) + math.log(1.64)), 4)
    assert round(v, 4) == 1.7864
    small = hybrid_objective(np.array([1e-4]), np.ones(1), 0.0, 0.0, 0.5)
    assert math.isclose(small, (1e-4 / ROW_NOISE) ** 2, rel_tol=1e-6)
    assert ROBUST_SCALE == 0.25 and hybrid_objective(np.zeros(1), np.ones(1), 1.0, 0.0, 0.5) \
        == 4.0


def test_the_main_fit_leaves_the_hybrid_terms_out():
    names = {name for name, _ in make_layout(["hopper", "blackwell"]).entries}
    assert not names & set(HYBRID_TERMS)


def test_fit_hybrid_terms_moves_only_the_mamba_term_and_lowers_the_objective():
    """From the shipped table with the Mamba term put back at its prior: the second stage
    changes only mamba_kernel_efficiency of the architectures with hybrid rows (hopper,
    blackwell), below 1 (the projections ran fast), and lowers each architecture's objective;
    the shipped file holds the same values."""
    rows = read_runs_files(PUBLISHED_RUNS_FILES)
    shipped = load_calibration()
    reset = CalibrationTable(
        defaults=shipped.defaults,
        architectures={a: {k: v for k, v in c.items() if k not in HYBRID_TERMS}
                       for a, c in shipped.architectures.items()},
        software=shipped.software)
    fitted = fit_hybrid_terms(rows, reset)
    for arch, consts in fitted.architectures.items():
        before = reset.architectures.get(arch, {})
        changed = {k for k in consts if consts[k] != before.get(k)}
        assert changed <= {"mamba_kernel_efficiency"}
        if arch in ("hopper", "blackwell"):
            assert changed and consts["mamba_kernel_efficiency"] < 1.0
            assert consts["mamba_kernel_efficiency"] == \
                shipped.architectures[arch]["mamba_kernel_efficiency"]
        else:
            assert not changed
    assert fitted.defaults == reset.defaults and fitted.software == reset.software
    hyb = hybrid_rows(rows)
    prep = prepare(hyb)
    logm = np.log(prep.measured)
    d = BY_NAME["mamba_kernel_efficiency"]
    for arch in ("hopper", "blackwell"):
        idx = np.array([a == arch for a in prep.archs])
        objs = []
        for table, v in ((reset, 1.0),
                         (fitted, fitted.architectures[arch]["mamba_kernel_efficiency"])):
            pred = predict(prep, table_constants(table, prep.archs, prep.software))
            objs.append(hybrid_objective((np.log(pred) - logm)[idx], prep.weight[idx],
                                         math.log(v), 0.0, d.prior_sigma))
        assert objs[1] < objs[0]


def test_shipped_header_names_the_hybrid_rows():
    t = load_calibration()
    assert t.fitted_on is not None
    assert len(t.fitted_on["hybrid_rows"]) == 22 and t.fitted_on["hybrid_terms"] == \
        ["mamba_kernel_efficiency"]
    assert not set(t.fitted_on["hybrid_rows"]) & set(t.fitted_on["rows"])
