"""Intervals from a cluster's own logged runs (``oracle/uncertainty.py::residuals_for``): a
calibration file written by ``tune-cp calibrate --log`` carries the logs' residuals, and with at
least ``MIN_CLASS_ROWS`` of them every projection made with that file takes its interval from
them, unless the published class it replaces is wider."""

from __future__ import annotations

import json

import numpy as np

from tune_cp.oracle.constants import load_calibration
from tune_cp.oracle.uncertainty import (
    MIN_CLASS_ROWS,
    USER_CLASS,
    load_residuals,
    residuals_for,
    user_interval,
)

FEATURES = ("hopper", "dense", "1", "1", "bf16")


def _calibration_with(tmp_path, residuals):
    data = load_calibration().to_json()
    data["fitted_on"] = {**(data["fitted_on"] or {}), "user_residuals": residuals}
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_user_quantiles_hand_worked():
    """Ten residuals -0.45 .. +0.45 in steps of 0.1: numpy's linear 10th / 50th / 90th
    percentiles are -0.36, 0 and +0.36; seven residuals are too few (None)."""
    r = [round(-0.45 + 0.1 * i, 2) for i in range(10)]
    ci = user_interval(r)
    assert ci is not None and ci.key == USER_CLASS and ci.rows == 10
    assert np.isclose(ci.q_lo, -0.36) and np.isclose(ci.q_mid, 0.0) and np.isclose(ci.q_hi, 0.36)
    assert user_interval(r[:MIN_CLASS_ROWS - 1]) is None


def test_wide_user_scatter_replaces_the_published_class(tmp_path):
    published = load_residuals().lookup(FEATURES)
    wide = [round(-0.45 + 0.1 * i, 2) for i in range(10)]  # 80% width 0.72 in log space
    assert wide[-1] - wide[0] > published.q_hi - published.q_lo
    table = residuals_for(_calibration_with(tmp_path, wide))
    assert table.lookup(FEATURES).key == USER_CLASS


def test_narrow_user_scatter_never_narrows_the_interval(tmp_path):
    """In-sample log residuals (the refit saw the logs) are no licence for a narrower interval."""
    narrow = [0.001 * i for i in range(10)]
    table = residuals_for(_calibration_with(tmp_path, narrow))
    assert table.lookup(FEATURES).key == load_residuals().lookup(FEATURES).key


def test_few_logs_keep_the_published_residuals(tmp_path):
    table = residuals_for(_calibration_with(tmp_path, [0.5, -0.5, 0.4]))
    assert table is load_residuals()
    assert residuals_for(None) is load_residuals()
