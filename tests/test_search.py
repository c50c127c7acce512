"""The tuning agent end to end: baseline, seed phase, exhaustive ranking, attribution, regret,
constraints, preferences, and the LLM phase with scripted (DummyLM) and failing LMs."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from dspy.utils import DummyLM

from tests.conftest import setting
from tests.test_llm_phase import SlowLM
from tune_cp.agent.llm import LlmBudget
from tune_cp.agent.search import Preference, SearchOptions, search
from tune_cp.agent.serialize import search_json
from tune_cp.solver.check import check_configuration
from tune_cp.solver.constraints import as_constraints
from tune_cp.solver.settings import RunSettings

LLAMA = ("llama3-8b", "h100", 1, 8192, 128)


@pytest.fixture(scope="module")
def llama_result():
    return search(*setting(*LLAMA), SearchOptions())


def test_search_is_deterministic(llama_result):
    again = search(*setting(*LLAMA), SearchOptions())
    assert json.dumps(search_json(again)) == json.dumps(search_json(llama_result))


def test_attribution_chains_from_baseline_to_best(llama_result):
    r = llama_result
    steps = r.attribution
    assert steps and steps[0].before == pytest.approx(r.baseline.throughput)
    assert steps[-1].after == pytest.approx(r.best.throughput)
    for a, b in itertools.pairwise(steps):
        assert a.after == pytest.approx(b.before)
    # the path's step ratios multiply to the reported speedup (the path starts at the baseline
    # and ends at the answer)
    assert math.prod(s.after / s.before for s in steps) == pytest.approx(r.speedup)
    for s in r.seed.steps:  # each accepted seed move is a gain
        assert s.after > s.before


@pytest.mark.parametrize("case", [("gpt-oss-120b", "b200", 2, 4096, 320),
                                  ("deepseek-v3", "gb200", 32, 4096, 4096)])
def test_attribution_ends_at_the_best_and_names_each_change_once(case):
    """Cases whose last changes are only legal together (GPT-OSS: tp, pp, ep and mbs) and whose
    path has a change with no effect on its own (DeepSeek-V3: the pipeline split while pp is 1):
    the path still ends at the best, recomputation is one change, and a step's gain is never
    exactly zero unless the whole path is."""
    m, cl, tr = setting(*case[:3], case[3], case[4], gpn=8 if case[1] != "gb200" else 4)
    r = search(m, cl, tr, SearchOptions())
    steps = r.attribution
    assert steps[-1].after == pytest.approx(r.best.throughput)
    for a, b in itertools.pairwise(steps):
        assert a.after == pytest.approx(b.before)
    labels = " + ".join(s.move for s in steps)
    assert "recompute_layers" not in labels and "recompute_modules" not in labels
    assert labels.count("pipeline_split") <= 1 and labels.count("recompute ") <= 1
    assert all(s.after != s.before for s in steps) or len(steps) == 1


def test_attribution_prefers_a_gaining_pair_to_a_loss():
    """Llama 3 70B on 8 H100 nodes from the stated default (TP8, full recompute): cp 2 alone
    loses 4.8% and only makes room for dropping recomputation; the path takes both as one step,
    and every step of the path gains."""
    r = search(*setting("llama3-70b", "h100", 8, 8192, 128), SearchOptions())
    steps = r.attribution
    assert steps[-1].after == pytest.approx(r.best.throughput)
    assert all(s.after > s.before for s in steps), [(s.move, s.gain) for s in steps]
    assert any(" + " in s.move for s in steps)


def test_exhaustive_best_is_the_top_of_the_ranking_and_regret_is_consistent(llama_result):
    r = llama_result
    top = int(r.ranked.order[0])
    assert r.exhaustive_best.throughput == pytest.approx(float(r.ranked.tokens[top]))
    assert r.best.throughput >= r.seed.best.throughput
    # without an LLM the agent phases are the seed phase, whose single-axis moves stop short
    # of the exhaustive answer here
    assert 0.0 < r.regret < 1.0


def test_regret_and_speedup_hand_worked():
    """Regret and speedup on numbers worked by hand (lower bounds / projections in tokens/s/GPU):
    the agent at 27,000 against the exhaustive 30,000 falls 10% short; at or above it, 0; an
    answer at 30,000 over a baseline at 20,000 is 1.5x."""
    from tune_cp.agent.search import regret, speedup

    assert regret(27_000.0, 30_000.0) == pytest.approx(0.1)
    assert regret(30_000.0, 30_000.0) == 0.0 and regret(31_000.0, 30_000.0) == 0.0
    assert regret(5_000.0, 0.0) is None
    assert speedup(30_000.0, 20_000.0) == pytest.approx(1.5)
    assert speedup(30_000.0, 0.0) is None


def test_every_listed_configuration_passes_check_with_the_same_figures(llama_result):
    r = llama_result
    m, cl, tr = setting(*LLAMA)
    data = search_json(r)
    for row in data["top"]:
        i = next(j for j in r.ranked.order if _same(row, r.ranked.configs[int(j)]))
        cfg = r.ranked.configs[int(i)]
        out = check_configuration(m, cl, tr, cfg)
        assert out.legal and out.memory.peak_bytes == row["memory"]["peak_bytes"]


def _same(row, cfg):
    return all(row[k] == getattr(cfg, k) for k in ("tp", "pp", "vpp", "cp", "ep", "mbs")) and \
        row["recompute"] == cfg.recompute.value and row["recompute_layers"] == cfg.recompute_layers


def test_constraint_contradicting_the_best_changes_the_answer(llama_result):
    best_tp = llama_result.best.config.tp
    other = 1 if best_tp != 1 else 2
    r = search(*setting(*LLAMA), SearchOptions(
        settings=RunSettings(constraints=as_constraints([f"tp == {other}"]))))
    assert r.best.config.tp == other
    assert all(c.tp == other for c in r.ranked.configs)
    assert r.best.throughput <= llama_result.best.throughput


def test_preference_shapes_ranking_and_reports_its_cost(llama_result):
    best_tp = llama_result.best.config.tp
    pref = Preference.parse(f"tp != {best_tp}:0.5")
    r = search(*setting(*LLAMA), SearchOptions(preferences=(pref,)))
    assert r.best.config.tp != best_tp
    cost = r.preference_costs[0]
    assert 0 < cost["cost"] < 1
    assert cost["best_tokens_per_s_per_gpu"] == pytest.approx(llama_result.best.throughput)


def test_mixtral_4_nodes_beats_amd_reference():
    r = search(*setting("mixtral-8x22b", "mi355x", 4, 8192, 512), SearchOptions())
    assert r.baseline_source.startswith("published reference: AMD Primus Mixtral 8x22B")
    base = r.baseline.config
    assert (base.tp, base.pp, base.vpp, base.ep, base.mbs, base.recompute_layers) == (1, 4, 2, 8, 1, 1)
    assert r.speedup > 1.0 and r.attribution
    data = search_json(r)
    for key in ("best", "top", "baseline", "speedup_vs_baseline", "feasible_count", "regret",
                "attribution", "llm"):
        assert key in data
    for key in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "mbs", "ga", "gbs", "recompute",
                "recompute_layers", "projection", "memory"):
        assert key in data["best"]
    assert data["llm"]["status"] == "skipped"


# ------------------------------------------------------------------------------ LLM phase


def hints(**kw):
    return {"hints": json.dumps({"hard_constraints": [], "soft_objectives": [],
                                 "combinations": []} | kw)}


def run_with(lm, rounds=1, **opts):
    return search(*setting(*LLAMA), SearchOptions(lm=lm, lm_name="dummy",
                                                  budget=LlmBudget(rounds=rounds, calls=rounds),
                                                  **opts))


def test_valid_hints_become_constraints_and_only_narrow(llama_result):
    lm = DummyLM([hints(hard_constraints=[{"expr": "pp == 1", "rationale": "no bubble"}],
                        combinations=[{"settings": {"tp": 1, "mbs": 2}, "rationale": "try"}])])
    r = run_with(lm)
    rnd = r.llm.rounds[0]
    assert r.llm.status == "completed" and "constraint pp == 1" in rnd.accepted
    assert {x["kind"] for x in rnd.results} == {"constraints", "combination"}
    llm_trials = [t for t in r.trials if t.phase == "llm"]
    assert llm_trials and all(t.legal for t in llm_trials)
    from tune_cp.agent.evaluate import config_key

    feasible = {config_key(c) for c in llama_result.ranked.configs}
    for t in llm_trials:  # inside the default space: a subset of the unconstrained feasible set
        assert config_key(t.config) in feasible
        assert t.config.pp == 1
    assert r.best.throughput == pytest.approx(llama_result.best.throughput)


def test_hostile_and_invalid_hints_are_rejected():
    lm = DummyLM([hints(hard_constraints=[{"expr": "__import__('os').system('echo pwned')"},
                                          {"expr": "tp ** 2 < 9"}],
                        soft_objectives=[{"expr": "open('/etc/passwd')", "weight": 0.3}],
                        combinations=[{"settings": {"rm -rf": 1}}])])
    r = run_with(lm)
    rnd = r.llm.rounds[0]
    assert len(rnd.rejected) == 4 and not rnd.accepted and not rnd.results
    assert r.best.legal


def test_hints_that_empty_the_set_are_reported():
    lm = DummyLM([hints(hard_constraints=[{"expr": "tp == 3"}])])
    r = run_with(lm)
    res = r.llm.rounds[0].results
    assert res and res[0]["summary"].endswith("empty: no legal configuration satisfies it")
    assert r.best.legal


def test_goal_objectives_from_the_llm_shape_the_ranking(llama_result):
    best_tp = llama_result.best.config.tp
    lm = DummyLM([hints(soft_objectives=[{"expr": f"tp != {best_tp}", "weight": 0.5,
                                          "rationale": "user goal"}])])
    r = run_with(lm, goal="keep tensor parallelism off")
    assert [p["origin"] for p in r.preference_costs] == ["llm"]


def test_slow_lm_leaves_the_run_complete():
    r = search(*setting(*LLAMA), SearchOptions(
        lm=SlowLM(), lm_name="slow", budget=LlmBudget(rounds=2, calls=2, call_timeout_s=0.3)))
    assert r.llm.status == "stopped" and r.llm.warnings
    assert r.best.legal and r.best_phase in ("exhaustive", "seed")


def test_combination_outside_the_default_space_is_enumerated_with_every_rule():
    """etp 2 with tp 1 (outside the default etp in {1, tp}) and a pinned full recompute depth
    (which dominance would otherwise drop): CP-SAT enumerates the pinned set, every rule on."""
    from tune_cp.agent.search import pin_settings
    from tune_cp.solver.feasible import enumerate_feasible
    from tune_cp.solver.rules import RULES
    from tune_cp.solver.space import default_space

    m, cl, tr = setting("qwen3-30b-a3b", "h100", 2, 4096, 512)
    space = default_space(m, cl, tr)
    sub, pinned = pin_settings(space, {"tp": 1, "etp": 2, "ep": 8, "recompute": "full",
                                       "recompute_layers": 3})
    assert pinned and sub.tp == (1,) and sub.etp == (2,)
    enum = enumerate_feasible(m, cl, tr, sub, count_removed=False,
                              families=[f for f in RULES if f != "recompute_dominance"])
    assert enum.configs
    for fc in enum.configs:
        c = fc.config
        assert (c.tp, c.etp_, c.ep, c.recompute.value, c.recompute_layers) == (1, 2, 8, "full", 3)
        assert check_configuration(m, cl, tr, c).legal


def test_bad_combination_values_are_rejected():
    from tune_cp.agent.search import pin_settings
    from tune_cp.solver.space import default_space

    m, cl, tr = setting(*LLAMA)
    with pytest.raises(ValueError):
        pin_settings(default_space(m, cl, tr), {"dispatcher": "carrier-pigeon"})


def test_evaluator_key_is_every_field_in_order(llama_result):
    """``config_key`` reads the instance's values: the same tuple ``model_dump`` gives (a nested
    spec such as ``optimizer_state`` as itself, frozen and hashable, where ``model_dump`` gives
    its dict), for configurations built, resolved and copied with updates (the seed phase's
    moves)."""
    from tune_cp.agent.evaluate import config_key
    from tune_cp.agent.seed import apply

    for t in llama_result.trials[:60]:
        for cfg in (t.config, apply(t.config, {"mbs": 2, "recompute": "selective"})):
            dumped = tuple(cfg.model_dump().values())
            key = config_key(cfg)
            assert len(key) == len(dumped)
            for k, d in zip(key, dumped, strict=True):
                assert (k.model_dump() if hasattr(k, "model_dump") else k) == d
            hash(key)


def test_text_report_lists_accepted_and_rejected_hints():
    """The text report of the LLM phase says what was accepted, what was rejected and why, and
    what each narrowed set gave, as --json's llm.rounds does (issue 30 item 9)."""
    from tune_cp.agent.report import render_search
    from tune_cp.agent.serialize import search_json

    lm = DummyLM([hints(hard_constraints=[{"expr": "pp == 1"}, {"expr": "tp ** 2 < 9"}],
                        soft_objectives=[{"expr": "cp == 1", "weight": 0.2}],
                        combinations=[{"settings": {"rm -rf": 1}}])])
    r = run_with(lm)
    text = "\n".join(render_search(r))
    rnd = search_json(r)["llm"]["rounds"][0]
    assert rnd["accepted"] == ["constraint pp == 1", "preference cp == 1 (weight 0.2)"]
    assert "LLM phase: completed (dummy; 1 LM call)\n" in text
    assert "  round 1: accepted constraint pp == 1; preference cp == 1 (weight 0.2)\n" in text
    assert len(rnd["rejected"]) == 2
    for why in rnd["rejected"]:
        assert f"\n    rejected {why}\n" in text
    assert "\n    rejected constraint 'tp ** 2 < 9': '**' is not allowed" in text
    (result,) = rnd["results"]
    assert result["summary"].startswith("constraints ['pp == 1']: TP")
    assert f"\n    tried {result['summary']}\n" in text


def test_ranking_in_chunks_gives_the_one_batch_figures(monkeypatch):
    """Issue 29 (a search past 2 GB): the ranking projects its configurations in batches of
    ``SCORE_CHUNK`` (Qwen3-30B-A3B on 128 H100 nodes with the MoE backend presets: 177,372
    configurations, 2.6 GB max RSS in one batch, 0.78 GB in chunks, the same --json); the
    chunked scores equal the one-batch scores array for array (to the last bits: numpy's
    vectorised loops may round a sum differently at another array length)."""
    import numpy as np

    from tune_cp.agent import search as search_mod
    from tune_cp.oracle.projection import score_configs
    from tune_cp.oracle.work import ConfigBatch
    from tune_cp.solver.feasible import enumerate_feasible
    from tune_cp.solver.space import default_space

    m, cl, tr = setting("mixtral-8x7b", "h100", 2, 4096, 64)
    enum = enumerate_feasible(m, cl, tr, default_space(m, cl, tr))
    configs = [fc.config for fc in enum.configs]
    assert len(configs) > 20
    whole = score_configs(m, cl, tr, ConfigBatch.from_configs(configs, None), None)
    monkeypatch.setattr(search_mod, "SCORE_CHUNK", 7)
    chunked = search_mod.score_in_chunks(m, cl, tr, configs, None, None)
    assert chunked.keys() == whole.keys()
    for k, v in whole.items():
        np.testing.assert_allclose(np.asarray(chunked[k]), np.asarray(v), rtol=1e-12, atol=0)
