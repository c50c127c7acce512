"""Explanations of an empty feasible set, and the removal counts' definition."""

from __future__ import annotations

from tests.conftest import setting
from tune_cp.solver.attribution import walk
from tune_cp.solver.constraints import as_constraints
from tune_cp.solver.explain import explain_infeasible, feasible
from tune_cp.solver.feasible import enumerate_feasible
from tune_cp.solver.problem import Problem
from tune_cp.solver.settings import RunSettings
from tune_cp.solver.space import SearchSpace, default_space


def test_llama_405b_on_one_h100_node_needs_more_nodes():
    """Acceptance: no feasible configuration; the explanation names memory and the node count
    that would fit (the smallest: one node fewer has no feasible configuration)."""
    m, cl, tr = setting("llama3.1-405b", "h100", 1, 8192, 2048)
    e = enumerate_feasible(m, cl, tr)
    assert e.empty and e.removed["hbm"] > 0
    p = Problem(m, cl, tr, default_space(m, cl, tr))
    why = explain_infeasible(p)
    assert not why.feasible and "hbm" in why.conflict
    assert why.min_nodes is not None and why.min_nodes > 1
    assert why.min_peak_bytes is not None and why.min_peak_bytes > why.limit_bytes
    text = why.text()
    assert "memory (HBM) [hbm]" in text
    assert f"needs at least {why.min_nodes} nodes of h100 at this batch" in text
    assert "GiB per GPU" in text and "above the limit of 79.8 GiB" in text  # 80 x (1 - 0.003)
    n = why.min_nodes
    below = cl.model_copy(update={"num_nodes": n - 1})
    assert not feasible(Problem(m, below, tr, default_space(m, below, tr)))
    fits = cl.model_copy(update={"num_nodes": n})
    assert not enumerate_feasible(m, fits, tr, count_removed=False).empty


def test_feasible_space_has_nothing_to_explain():
    m, cl, tr = setting("llama3-8b", "h100", 1, 8192, 32)
    why = explain_infeasible(Problem(m, cl, tr, default_space(m, cl, tr)))
    assert why.feasible and why.text() == "the space has feasible configurations"


def test_fixed_choices_that_do_not_fit_suggest_freeing_them():
    """With the user's choices pinned (tp 1, pp 1, cp 1, mbs 1, no recompute), the fixes are
    the single relaxations that work, in the user's terms."""
    m, cl, tr = setting("llama3-8b", "h100", 1, 8192, 32)
    base = default_space(m, cl, tr, fixed={"tp": 1, "pp": 1, "cp": 1, "mbs": 1})
    space = base.with_domains(recompute=base.recompute[:1])  # no recompute
    why = explain_infeasible(Problem(m, cl, tr, space), max_nodes=2)
    assert not why.feasible and why.conflict == ("hbm",)
    assert {"full recompute", "tp left free", "FSDP (--fsdp)"} <= set(why.relaxations)
    assert "micro-batch size 1" not in why.relaxations  # already 1
    assert "or full recompute" in why.text()


def test_batch_conflict_suggests_the_nearest_global_batch():
    """Hand-worked: 16 H100s, pp = cp = 1 forced, so tp <= 8 leaves dp in {2, 4, 8, 16}; gbs 5
    has no such divisor. gbs 4 (dp 2 or 4) and 6 (dp 2) are both one away; the larger wins."""
    m, cl, tr = setting("llama3-8b", "h100", 2, 8192, 5)
    p = Problem(m, cl, tr, default_space(m, cl, tr),
                settings=RunSettings(constraints=as_constraints(["pp == 1", "cp == 1"])))
    why = explain_infeasible(p)
    assert "batch" in why.conflict and why.nearest_gbs == 6
    assert "--gbs 6 on this cluster" in why.text()
    assert "e.g. 1 node of h100" in why.text() and "a larger --gbs" not in why.text()
    six = tr.model_copy(update={"global_batch_size": 6})
    assert feasible(p.replace(training=six))


def test_unusual_node_size_suggests_the_usual_one():
    """Mixtral 8x22B on 4 x 5 MI355X: 20 GPUs leave no data-parallel size dividing gbs 512 (the
    factor 5 must go to pp, and 56 layers split over 5 or 10 stages neither evenly nor with one
    end stage a layer lighter or heavier; tp takes a divisor of 8 KV heads); 4 x 8 fits. (4 x 3
    fits since PP3 with a light last stage, 19 + 19 + 18 layers, is a searched split.)"""
    m, cl, tr = setting("mixtral-8x22b", "mi355x", 4, 8192, 512)
    five = cl.model_copy(update={"gpus_per_node": 5})
    why = explain_infeasible(Problem(m, five, tr, default_space(m, five, tr)))
    assert not why.feasible and "batch" in why.conflict
    assert "--gpus-per-node 8 (usual mi355x node)" in why.relaxations


def test_removal_counts_are_first_failing_family():
    """A hand-countable space: 8 GPUs, tp in {1, 2, 3}, pp in {1, 2}: tp 3 never divides 8
    (2 x 2 candidates charged to world_size); Llama 3 8B's 32 heads refuse no tp here."""
    m, cl, tr = setting("llama3-8b", "h100", 1, 8192, 32)
    sp = SearchSpace(tp=(1, 2, 3), pp=(1, 2), mbs=(1, 2), etp_policy="same")
    counts = walk(Problem(m, cl, tr, sp), ["world_size", "tensor_parallel", "batch"])
    assert counts["world_size"] == 1 * 2 * 2
    assert counts["tensor_parallel"] == 0  # tp 3 was already charged to world_size
    assert counts["pass"] == sp.size() - 4
