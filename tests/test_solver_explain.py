"""Explanations of an empty feasible set, and the removal counts' definition."""

from __future__ import annotations

from solver.attribution import walk
from solver.explain import explain_infeasible, feasible
from solver.feasible import enumerate_feasible
from solver.problem import Problem
from solver.space import SearchSpace, default_space
from tests.conftest import setting


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
    assert "GiB per GPU" in text and "above the limit of 76.0 GiB" in text
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
    assert {"full recompute", "tp left free", "FSDP"} <= set(why.relaxations)
    assert "micro-batch size 1" not in why.relaxations  # already 1
    assert "or full recompute" in why.text()


def test_removal_counts_are_first_failing_family():
    """A hand-countable space: 8 GPUs, tp in {1, 2, 3}, pp in {1, 2}: tp 3 never divides 8
    (2 x 2 candidates charged to world_size); Llama 3 8B's 32 heads refuse no tp here."""
    m, cl, tr = setting("llama3-8b", "h100", 1, 8192, 32)
    sp = SearchSpace(tp=(1, 2, 3), pp=(1, 2), mbs=(1, 2), etp_policy="same")
    counts = walk(Problem(m, cl, tr, sp), ["world_size", "tensor_parallel", "batch"])
    assert counts["world_size"] == 1 * 2 * 2
    assert counts["tensor_parallel"] == 0  # tp 3 was already charged to world_size
    assert counts["pass"] == sp.size() - 4
