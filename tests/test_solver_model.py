"""The CP-SAT model's building blocks: family registry, declared axes, symbolic arithmetic, the
tables' keys, and the properties its encodings rely on."""

from __future__ import annotations

import random

import pytest
from ortools.sat.python import cp_model

from tests.test_solver_equivalence import CASES
from tune_cp.config.specs import ParallelConfig, PipelineSplit, Recompute, RecomputeMethod
from tune_cp.oracle import memory as M
from tune_cp.oracle.catalog import load_model
from tune_cp.solver.feasible import enumerate_problem
from tune_cp.solver.model import ENCODERS, LegalityModel, prune_stages
from tune_cp.solver.rules import FAMILY_AXES, LEGALITY, RULES, SEARCH_ONLY, STRUCTURAL
from tune_cp.solver.space import AXES
from tune_cp.solver.symbolic import Arith, Sym


def test_one_encoder_per_rule_family():
    assert list(ENCODERS) == list(RULES)
    assert set(FAMILY_AXES) == set(RULES)
    assert all(set(ax) <= set(AXES) for ax in FAMILY_AXES.values())
    assert set(LEGALITY) | set(SEARCH_ONLY) == set(RULES)
    assert STRUCTURAL[-1] == "run_settings" and "batch" not in STRUCTURAL


def _random_candidate(space, rng):
    c = {a: rng.choice(getattr(space, a)) for a in AXES if a != "etp"}
    c["etp"] = rng.choice(space.etp_values(c["tp"]))
    return c


@pytest.mark.parametrize("case", ["mixtral-8x7b", "llama3-8b-fp8-fsdp", "tiny-gpt",
                                  "deepseek-v3"])
def test_family_axes_are_all_a_rule_reads(case):
    """Changing an axis a family does not declare never changes its verdict (the removal
    counts charge whole sub-products on this)."""
    p = CASES[case]()
    rng = random.Random(7)
    for _ in range(150):
        c = _random_candidate(p.space, rng)
        base = p.context(p.resolve(c))
        for fam in LEGALITY:
            if fam in ("hbm", "extra"):
                continue
            verdict = not RULES[fam](base)
            for axis in set(AXES) - set(FAMILY_AXES[fam]):
                other = dict(c)
                if axis == "etp":
                    other["etp"] = rng.choice(p.space.etp_values(c["tp"]))
                elif axis == "tp":
                    continue  # etp's domain depends on tp; tp is declared wherever it matters
                else:
                    other[axis] = rng.choice(getattr(p.space, axis))
                ctx = p.context(p.resolve(other))
                assert (not RULES[fam](ctx)) == verdict, (fam, axis, c, other)


# ------------------------------------------------------------------ symbolic arithmetic


def _all_solutions(model: cp_model.CpModel, variables):
    class Col(cp_model.CpSolverSolutionCallback):
        def __init__(self):
            super().__init__()
            self.rows = []

        def on_solution_callback(self):
            self.rows.append(tuple(self.Value(v) for v in variables))

    s = cp_model.CpSolver()
    s.parameters.enumerate_all_solutions = True
    s.parameters.num_workers = 1
    col = Col()
    s.Solve(model, col)
    return col.rows


def _expr(x):
    return x if isinstance(x, int) else x.expr


def test_floor_division_keeps_python_semantics():
    """x // d for x of either sign (CP-SAT truncates toward zero), cdiv, and a numerator whose
    bounds straddle zero; each result is determined (one solution per (x, d))."""
    m = cp_model.CpModel()
    ar = Arith(m)
    x = ar.var(range(-9, 12), "x")
    d = ar.var((1, 2, 3, 5), "d")
    neg = ar.var(range(-9, 0), "n")
    q1, q2, q3, c1 = x // d, x // 4, neg // d, -(-x // d)
    straddle = (x + 0) - 0  # bounds -9..11
    q4 = straddle // d
    outs = [_expr(v) for v in (q1, q2, q3, c1, q4)]
    rows = _all_solutions(m, [x.expr, d.expr, neg.expr, *outs])
    assert len(rows) == 21 * 4 * 9
    for xv, dv, nv, a, b, c, e, f in rows:
        assert (a, b, c, e, f) == (xv // dv, xv // 4, nv // dv, -(-xv // dv), xv // dv)


def test_products_max_and_comparisons():
    m = cp_model.CpModel()
    ar = Arith(m)
    a = ar.var((0, 2, 7), "a")
    b = ar.var((3, 5), "b")
    p = a * b + 2 * a - 1
    mx = M.vmax([a * 3, b, 4])
    # tracked value sets may over-approximate (operands are treated as independent), never miss
    assert isinstance(p, Sym) and {x * y + 2 * x - 1 for x in (0, 2, 7) for y in (3, 5)} <= \
        set(p.values)
    assert (b > 2) is True and (b < 3) is False
    with pytest.raises(TypeError):
        _ = a > 1
    with pytest.raises(TypeError):
        bool(a)
    rows = _all_solutions(m, [a.expr, b.expr, _expr(p), _expr(mx)])
    assert len(rows) == 6
    for x, y, pv, mv in rows:
        assert pv == x * y + 2 * x - 1 and mv == max(3 * x, y, 4)


def test_lookup_uses_the_fewest_keys_and_is_exact():
    m = cp_model.CpModel()
    ar = Arith(m)
    t = ar.var((1, 2, 4), "t")
    u = ar.var((1, 3), "u")
    w = ar.var((5, 6), "w")
    only_t, both, const = ar.lookup([t, u, w], lambda a, b, c: (10 * a, a * b + 1, 7), "f")
    assert const == 7
    rows = _all_solutions(m, [t.expr, u.expr, w.expr, _expr(only_t), _expr(both)])
    assert len(rows) == 12
    assert all(o == 10 * a and bb == a * b + 1 for a, b, _, o, bb in rows)


# -------------------------------------------------------- tables and encoding properties


def test_stage_counts_saturate_in_micro_batches():
    for pp, vpp in [(1, 1), (2, 1), (4, 1), (4, 2), (8, 7), (3, 4), (16, 2)]:
        sat = M.inflight_saturation(pp, vpp)
        for s in range(pp):
            top = M.inflight_per_chunk(pp, vpp, sat, s)
            assert all(M.inflight_per_chunk(pp, vpp, m, s) == top for m in (sat + 1, 3 * sat, 999))
        assert any(M.inflight_per_chunk(pp, vpp, sat - 1, s) != M.inflight_per_chunk(
            pp, vpp, sat, s) for s in range(pp)) or sat == 1


def test_pruned_stages_keep_the_most_loaded():
    m = CASES["deepseek-v3"]().model
    for pp, vpp, k in [(8, 2, 1), (16, 1, 4), (4, 1, None)]:
        cfg = ParallelConfig(pp=pp, vpp=vpp, pipeline_split=PipelineSplit.EMBEDDING_LOSS, ga=6,
                             dp=1, recompute=Recompute.FULL if k else Recompute.NONE,
                             recompute_layers=k)
        stages = M.stage_counts(m, cfg)
        kept = prune_stages(stages)
        assert len(kept) < len(stages)
        for s in stages:
            assert any(all(x <= y for x, y in zip(s.as_vector(), t.as_vector(), strict=True))
                       for t in kept)


def test_unit_tables_key_on_every_dependency():
    """activation_units and sharding depend on nothing but the axes the model tabulates them
    over: two configurations that agree there get identical units."""
    p = CASES["llama3-8b-fp8-fsdp"]()
    rng = random.Random(3)
    for _ in range(60):
        c = _random_candidate(p.space, rng)
        other = _random_candidate(p.space, rng)
        for axis in ("mbs", "tp", "cp", "etp", "fp8_recipe"):
            other[axis] = c[axis]
        other["pp"] = c["pp"] if (c["pp"] > 1) != (other["pp"] > 1) else other["pp"]
        rc = c["recompute"]
        other["recompute"] = rc if rc.kind is Recompute.SELECTIVE else other["recompute"]
        if other["recompute"].kind is Recompute.SELECTIVE and rc.kind is not Recompute.SELECTIVE:
            other["recompute"] = rc
        a, b = p.resolve(c), p.resolve(other)
        assert M.activation_units(p.model, p.training, a) == \
            M.activation_units(p.model, p.training, b)
        for axis in ("pp", "cp", "ep", "optimizer", "dispatcher"):
            other[axis] = c[axis]
        assert M.sharding(p.model, p.cluster, p.resolve(c)) == \
            M.sharding(p.model, p.cluster, p.resolve(other))


@pytest.mark.parametrize("case", ["llama3-8b", "mixtral-8x7b", "deepseek-v3", "tiny-gpt"])
def test_memory_never_rises_with_more_block_recompute(case):
    """What recompute_dominance's encoding relies on: for a legal configuration, full block
    recompute of more layers (K >= 1) never needs more memory."""
    p = CASES[case]()
    e = enumerate_problem(p, [f for f in RULES if f not in ("hbm", "recompute_dominance")],
                          count_removed=False)
    checked = 0
    for f in e.configs:
        cfg = f.config
        if cfg.recompute is not Recompute.FULL or cfg.recompute_method is not RecomputeMethod.BLOCK:
            continue
        more = cfg.model_copy(update={"recompute_layers": cfg.recompute_layers + 1})
        lo = M.memory_report(p.model, p.cluster, p.training, cfg).peak_bytes
        hi = M.memory_report(p.model, p.cluster, p.training, more).peak_bytes
        assert hi <= lo, (cfg.label(), cfg.recompute_layers)
        checked += 1
    assert checked > 5


def test_families_can_be_left_out_and_literals_assumed():
    p = CASES["llama3-8b"]()
    lm = LegalityModel(p)
    assert set(lm.lit) == set(RULES)
    lm.cp.AddAssumptions(list(lm.lit.values()))
    s = cp_model.CpSolver()
    assert s.Solve(lm.cp) in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    only = LegalityModel(p, ["world_size", "batch"])
    assert set(only.lit) == {"world_size", "batch"}
    with pytest.raises(ValueError, match="unknown families"):
        LegalityModel(p, ["world_size", "nope"])


def test_mixtral_reference_layout_is_feasible_with_its_bytes():
    """AMD's 4-node Mixtral 8x22B reference (TP1 PP4 VPP2 EP8, full recompute of 1 layer) is in
    the feasible set, with memory_report's peak bytes, once recompute dominance is off. Without
    recomputation the layout needs 278.9 GiB: over the 273.6 GiB limit of a 5% margin, so
    dominance keeps recomputing variants; under the derived default margin (0.003, issue 28:
    a 287.1 GiB limit) it keeps "none" (at the edge of memory: above 288 / 1.18 GiB)."""
    from tests.conftest import resolved, setting
    from tune_cp.solver.feasible import enumerate_feasible
    from tune_cp.solver.settings import RunSettings

    m, cl, tr = setting("mixtral-8x22b", "mi355x", 4, 8192, 512)
    fixed = ["tp == 1", "pp == 4", "vpp == 2", "ep == 8", "etp == 1", "mbs == 1"]
    dominated = enumerate_feasible(m, cl, tr, settings=RunSettings(constraints=fixed),
                                   count_removed=False)
    assert {f.config.recompute.value for f in dominated.configs} == {"none"}
    dominated = enumerate_feasible(m, cl, tr, settings=RunSettings(constraints=fixed,
                                                                   memory_margin=0.05),
                                   count_removed=False)
    kinds = {f.config.recompute.value for f in dominated.configs}
    assert "full" in kinds  # under a 5% margin recomputing variants survive dominance
    e = enumerate_feasible(m, cl, tr, settings=RunSettings(constraints=fixed), count_removed=False,
                           families=[f for f in RULES if f != "recompute_dominance"])
    ref = resolved(m, cl, tr, tp=1, pp=4, vpp=2, ep=8, recompute="full", recompute_layers=1)
    match = [f for f in e.configs if f.config == ref]
    assert len(match) == 1
    assert match[0].peak_bytes == M.memory_report(m, cl, tr, ref).peak_bytes
    assert load_model("mixtral-8x22b").num_layers == 56


def test_every_axis_combination_of_a_tiny_space_is_accounted_for():
    p = CASES["tiny-gpt"]()
    e = enumerate_problem(p)
    assert sum(e.removed.values()) + len(e) == p.space.size() == \
        sum(1 for _ in p.space.candidates())
    assert len({tuple(sorted((k, str(v)) for k, v in f.candidate.items()))
                for f in e.configs}) == len(e)
    assert all(f.peak_bytes > 0 for f in e.configs)
