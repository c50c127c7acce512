"""Intervals from a cluster's own logged runs (``oracle/uncertainty.py::residuals_for``): a
calibration file written by ``tune-cp calibrate --log`` carries the logs' residuals, and with at
least ``MIN_CLASS_ROWS`` of them every projection made with that file takes its interval from
them, unless the published class it replaces is wider."""

from __future__ import annotations

import json

import numpy as np
import pytest

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


# ---------------------------------------------------------------- biased classes (issue 30)

import math  # noqa: E402
import re  # noqa: E402

from tune_cp.oracle.uncertainty import BIAS_MARK, ClassInterval, Interval  # noqa: E402


def test_an_interval_holds_its_point_or_names_its_class_bias():
    """Every class of the shipped residuals: its interval holds the projection exactly when the
    10th and 90th percentile residuals straddle zero; else the bias is the median's
    exp(-q_mid) - 1 and its text names it. moe=hybrid (22 rows) straddles zero since the Mamba
    kernel term is fitted (q 10/90 -0.222 / +0.034; before it: -0.331 / -0.095, 23% biased)."""
    table = load_residuals()
    seen_biased = 0
    for ci in table.classes.values():
        iv = Interval(1000.0, 1000.0 * math.exp(ci.q_lo), 1000.0 * math.exp(ci.q_hi), ci.key, ci)
        assert iv.contains == (iv.low <= iv.projected <= iv.high)
        if iv.contains:
            assert iv.bias is None and iv.bias_text() == ""
            assert iv.to_json()["class_bias"] is None and iv.to_json()["bias_note"] is None
            continue
        seen_biased += 1
        assert iv.bias == math.exp(-ci.q_mid) - 1
        assert f"{abs(iv.bias):.0%} {'above' if iv.bias > 0 else 'below'} measured" in iv.text()
        assert iv.to_json()["contains_projection"] is False
    assert seen_biased >= 3  # small classes (widened to their parents where they are used)
    hybrid = table.classes["moe=hybrid"]
    assert hybrid.rows == 22 and hybrid.q_lo < 0 < hybrid.q_hi and hybrid.biased is None
    old = ClassInterval("moe=hybrid", 22, -0.3307, -0.2077, -0.0951)
    assert round(old.biased, 4) == round(math.exp(0.2077) - 1, 4) == 0.2308
    assert "ran 23% above measured" in old.bias_text()
    # a class above its projections (measured faster than projected) says so
    slow = ClassInterval("x", 9, 0.02, 0.05, 0.10)
    assert slow.biased == math.exp(-0.05) - 1 and "5% below measured" in slow.bias_text()
    assert ClassInterval("y", 9, -0.1, 0.0, 0.0).biased is None  # on the boundary: held


def _rows(text: str) -> list[tuple[float, float, float, bool]]:
    """(point, low, high, marked) of every table row printing a tok/s and an interval."""
    out = []
    for m in re.finditer(r"\s([\d,]+)\s+([\d,]+)-([\d,]+)(!?)\s+[\d.]+%", text):
        p, lo, hi = (float(x.replace(",", "")) for x in m.groups()[:3])
        out.append((p, lo, hi, m.group(4) == BIAS_MARK))
    return out


def _assert_flagged(text: str) -> int:
    """Every printed point lies inside its interval or is marked, and a mark has its note with
    the bias figure; returns how many rows were marked."""
    rows = _rows(text)
    assert rows
    marked = 0
    for p, lo, hi, mark in rows:
        inside = lo <= p <= hi
        assert mark != inside, (p, lo, hi, mark)
        marked += mark
    if marked:
        assert re.search(r"^\s*! class biased: projections of .* ran \d+% (above|below) "
                         r"measured", text, re.M)
    return marked


@pytest.fixture
def biased_hybrid(monkeypatch, tmp_path):
    """The shipped residuals with the moe=hybrid pool as it was before the Mamba kernel term
    was fitted (22 rows, q 10/50/90 -0.3307 / -0.2077 / -0.0951: projections 23% above
    measured), so that the flagging of a biased class is exercised on a real model."""
    from tune_cp.oracle import uncertainty

    data = json.loads(uncertainty.RESIDUALS_PATH.read_text())
    data["classes"]["moe=hybrid"] = {"rows": 22, "q_lo": -0.3307, "q_mid": -0.2077,
                                     "q_hi": -0.0951, "mape": 0.256}
    path = tmp_path / "residuals.json"
    path.write_text(json.dumps(data))
    uncertainty.load_residuals.cache_clear()
    monkeypatch.setattr(uncertainty, "RESIDUALS_PATH", path)
    yield
    uncertainty.load_residuals.cache_clear()


def test_every_printed_point_is_inside_its_interval_or_flagged(run_cli, run_json, tmp_path,
                                                               biased_hybrid):
    """search, check, plan and sweep, text and --json: Nemotron-H 56B on H100 (the hybrid
    class, projections 23% above measured: :func:`biased_hybrid`) is flagged everywhere; Llama
    3 8B is not."""
    code, out, _ = run_cli("--model", "nemotron-h-56b", "--gpu", "h100", "--nodes", "8")
    assert code == 0 and _assert_flagged(out) == 10
    assert re.search(r"interval: 1,018-1,289 tokens/s/GPU .*class biased: projections of class "
                     r"moe=hybrid ran 23% above measured", out)
    code, data = run_json("--model", "nemotron-h-56b", "--gpu", "h100", "--nodes", "8")
    ivs = [data["best"]["interval"]] + [t["interval"] for t in data["top"]]
    for iv, p in zip(ivs, [data["best"]] + data["top"], strict=True):
        tok = p["projection"]["tokens_per_s_per_gpu"] if "projection" in p else \
            p["tokens_per_s_per_gpu"]
        held = iv["low_tokens_per_s_per_gpu"] <= tok <= iv["high_tokens_per_s_per_gpu"]
        assert iv["contains_projection"] is held is False
        assert round(iv["class_bias"], 3) == 0.231 and "23% above" in iv["bias_note"]
    code, out, _ = run_cli("--model", "llama3-8b", "--gpu", "h100", "--nodes", "1")
    assert code == 0 and _assert_flagged(out) == 0 and "class biased" not in out

    code, out, _ = run_cli("check", "--model", "nemotron-h-56b", "--gpu", "h100", "--nodes", "8",
                           "--tp", "8")
    assert "interval: 1,037-1,313 tokens/s/GPU" in out and "ran 23% above measured" in out
    code, data = run_json("check", "--model", "nemotron-h-56b", "--gpu", "h100", "--nodes",
                          "8", "--tp", "8")
    assert data["interval"]["contains_projection"] is False
    assert round(data["interval"]["class_bias"], 3) == 0.231

    code, out, _ = run_cli("plan", "--model", "nemotron-h-56b", "--gpu", "h100", "--points", "1")
    assert code == 0 and _assert_flagged(out) == 1
    code, data = run_json("plan", "--model", "nemotron-h-56b", "--gpu", "h100", "--points", "1")
    (pt,) = data["gpus"][0]["points"]
    assert pt["interval"]["contains_projection"] is False
    assert round(pt["interval"]["class_bias"], 3) == 0.231

    grid = tmp_path / "grid.yaml"
    grid.write_text("models: [nemotron-h-56b, llama3-8b]\ngpus: [h100]\nnodes: [8]\n"
                    "seq_len: 8192\nglobal_batch: 768\n")
    code, out, _ = run_cli("sweep", str(grid), "--out", str(tmp_path / "s.csv"), "--table")
    assert code == 0 and _assert_flagged(out) == 1 and "class_bias +0.231" in out
