"""Inputs that used to run for minutes or grow without bound (issue 16) now end in seconds:
bounded repair and vpp moves, bounded recompute-depth domains, bounded expressions and layer
patterns, bounded explanation scans (solver-call budget, bisection, divisors in O(sqrt n))."""

from __future__ import annotations

import time

import pytest

from tests.conftest import setting
from tune_cp.config.specs import ConfigError
from tune_cp.formats.keys import MAX_PATTERN_LAYERS, layer_pattern
from tune_cp.solver.constraints import MAX_EXPR_CHARS, HardConstraint, SoftObjective
from tune_cp.solver.explain import Budget, _OutOfTime, divisors_of, explain_infeasible
from tune_cp.solver.problem import Problem
from tune_cp.solver.space import RECOMPUTE_LAYERS_EXACT, default_space, recompute_layer_values


def test_recompute_depths_bounded_beyond_published_models():
    assert recompute_layer_values(126) == tuple(range(1, 127))  # every catalog model: all K
    ks = recompute_layer_values(100_000)
    assert ks[:RECOMPUTE_LAYERS_EXACT] == tuple(range(1, 129))
    assert ks[RECOMPUTE_LAYERS_EXACT:] == (256, 512, 1024, 2048, 4096, 8192, 16384, 32768,
                                           65536, 100_000)


def test_seed_vpp_values_bounded():
    from tune_cp.agent.seed import vpp_values

    assert vpp_values(20) == list(range(1, 21))
    assert vpp_values(100_000)[-3:] == [32768, 65536, 100_000] and len(vpp_values(100_000)) < 50


def test_baseline_vpp_100000_ends_quickly(run_cli):
    t0 = time.monotonic()
    code, out, err = run_cli("--model", "llama3-8b", "--gpu", "h100", "--nodes", "2",
                             "--baseline", "vpp=100000", "--top", "1")
    assert code == 0, err
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("expr, match", [
    ("-" * 1000 + "tp <= 0", "nests 65 levels deep; at most 64"),
    ("not " * 400 + "tp == 1", "nests 65 levels deep"),
    ("tp" + " + tp" * 300 + " <= 8", "nests 65 levels deep"),
    (" and ".join(["tp <= 8"] * 3000), f"at most {MAX_EXPR_CHARS:,}"),
    ("tp <= " + "9" * 4000, "characters; at most"),
    ("tp <= " + "9" * 20, "an integer of 20 digits is beyond int64"),
    ("pp in {1, " + "9" * 20 + "}", "an integer in a set is beyond int64"),
])
def test_expressions_bounded(expr, match):
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=None) as e:
        HardConstraint.of(expr)
    assert match in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError):
        SoftObjective.of(expr)
    assert time.monotonic() - t0 < 1.0


def test_long_legal_expression_parses_fast():
    t0 = time.monotonic()
    assert HardConstraint.of(" and ".join(["tp <= 8"] * 160)).kind == "condition"
    assert time.monotonic() - t0 < 0.5


def test_products_beyond_int64_refused_by_the_solver(run_cli):
    code, _, err = run_cli("--model", "llama3-8b", "--gpu", "h100", "--nodes", "1",
                           "--constraint", " * ".join(["ga"] * 30) + " <= 512")
    assert code == 2 and "reaches values beyond int64 over the search space" in err
    assert err.count("\n") == 1


def test_layer_patterns_bounded():
    assert layer_pattern("[0]*3+[1]*58") == [0] * 3 + [1] * 58
    t0 = time.monotonic()
    assert layer_pattern("[1]*300000000") is None
    assert layer_pattern("[0]*100000000000") is None
    assert layer_pattern("[1]*2*99999999999") is None
    assert layer_pattern("+".join(["[1]"] * 50_000)) is None  # deep tree
    assert len(layer_pattern(f"[1]*{MAX_PATTERN_LAYERS}")) == MAX_PATTERN_LAYERS
    assert time.monotonic() - t0 < 5


def test_divisors_in_sqrt_time():
    t0 = time.monotonic()
    assert divisors_of(1 << 30) == [1 << k for k in range(31)]
    assert divisors_of(12) == [1, 2, 3, 4, 6, 12]
    assert time.monotonic() - t0 < 0.5


def test_budget_counts_solves():
    b = Budget(solves=2, seconds=100)
    assert b.take(30) == 30 and b.take(30) == 30
    with pytest.raises(_OutOfTime):
        b.take(30)
    assert b.spent


def test_explanation_of_a_huge_batch_is_bounded():
    """--nodes 3 --gbs 2**30 scanned every integer up to gbs (101 s): now the divisors."""
    m, cl, tr = setting("llama3-8b", "mi355x", 3, 8192, 1 << 30)
    t0 = time.monotonic()
    # without the light splits: with them pp 3 splits the 32 layers as 11 + 11 + 10
    # (light_last) and dp 1 takes any batch, so the space is no longer infeasible
    why = explain_infeasible(Problem(m, cl, tr, default_space(m, cl, tr,
                                                               pipeline_splits=(None,))))
    assert not why.feasible and "batch" in why.conflict
    assert why.max_nodes in (1, 2)
    assert time.monotonic() - t0 < 60


def test_fp4_refused_before_enumeration(run_cli):
    t0 = time.monotonic()
    code, out, err = run_cli("--model", "llama3-8b", "--gpu", "a100", "--nodes", "1",
                             "--precision", "fp4")
    assert code == 1 and not err
    assert "the precision [precision]" in out and "fix: --precision bf16" in out
    assert time.monotonic() - t0 < 5
    code, out, _ = run_cli("check", "--model", "llama3-8b", "--gpu", "a100", "--nodes", "1",
                           "--precision", "fp4")
    assert code == 1 and "[precision] precision fp4 (NVFP4) needs FP4 tensor cores" in out


def test_dimensions_beyond_64_bits_are_an_input_error(run_cli, tmp_path):
    """hidden_size 2**24 with one head drove CP-SAT to MODEL_INVALID (exit 3)."""
    import json

    cfg = {"model_type": "mixtral", "hidden_size": 16777216, "num_attention_heads": 1,
           "num_key_value_heads": 1, "num_hidden_layers": 32, "vocab_size": 32000,
           "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, _, err = run_cli("--model", str(path), "--nodes", "1")
    assert code in (1, 2) and "internal error" not in err
    if code == 2:
        assert "too large for the solver's 64-bit arithmetic" in err and err.count("\n") == 1


def test_layer_count_bounded(run_cli, tmp_path):
    """100,000 layers ran for minutes in the pipeline-stage tables: at most MAX_LAYERS (512)."""
    import json

    from tune_cp.config.specs import MAX_LAYERS

    cfg = {"model_type": "mixtral", "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "num_hidden_layers": 100000, "vocab_size": 32000,
           "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, _, err = run_cli("--model", str(path), "--gpu", "mi355x", "--nodes", "1")
    assert code == 2 and err.count("\n") == 1
    assert f"num_layers: Input should be less than or equal to {MAX_LAYERS}" in err
