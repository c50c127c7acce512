"""Enumeration by slices: any slicing, and any number of processes, gives the same feasible set,
in the same order, with the same peak bytes and removal counts as one model of the whole space;
and the speed devices behind it (memoised oracle tables, vectorised stage pruning, the numpy
dependency analysis of tables, lazy value sets) compute what the plain versions compute."""

from __future__ import annotations

import random

import pytest
from ortools.sat.python import cp_model

from tests.test_solver_equivalence import CASES, problem
from tune_cp.config.specs import ParallelConfig, PipelineSplit, Recompute
from tune_cp.oracle import memory as M
from tune_cp.solver.constraints import as_constraints
from tune_cp.solver.feasible import (
    SLICE_AXES,
    default_slice_axes,
    enumerate_problem,
    plan_slices,
)
from tune_cp.solver.model import LegalityModel, _covered, _dominated, oracle_cache, prune_stages
from tune_cp.solver.rules import RULES
from tune_cp.solver.symbolic import Arith, _Dependencies


def _same(a, b) -> None:
    assert [(f.candidate, f.peak_bytes) for f in a.configs] == \
        [(f.candidate, f.peak_bytes) for f in b.configs]
    assert [f.config for f in a.configs] == [f.config for f in b.configs]
    assert a.removed == b.removed


@pytest.mark.parametrize("name", sorted(CASES))
def test_sliced_equals_one_model(name):
    p = CASES[name]()
    whole = enumerate_problem(p, slice_axes=())
    assert whole.slices == 1
    for axes in (("pp",), SLICE_AXES, ("tp", "pp", "cp", "vpp"), ("ep", "mbs")):
        sliced = enumerate_problem(p, slice_axes=axes)
        _same(sliced, whole)
        assert sliced.slices == len(plan_slices(p.space, axes) or [{}])


def test_sliced_equals_one_model_with_families_off_and_constraints():
    p = CASES["mixtral-8x7b"]().replace(constraints=as_constraints(["ep * etp <= 4", "dp >= 2"]))
    for fams in (None, [f for f in RULES if f != "recompute_dominance"],
                 [f for f in RULES if f not in ("hbm", "pipeline_split")]):
        _same(enumerate_problem(p, fams, slice_axes=("tp", "pp", "mbs")),
              enumerate_problem(p, fams, slice_axes=()))


def test_processes_give_the_same_result():
    p = CASES["deepseek-v3"]()
    one = enumerate_problem(p)
    two = enumerate_problem(p, workers=2)
    assert two.workers == 2 and one.workers == 1
    _same(two, one)
    assert enumerate_problem(p, workers=3, count_removed=False).configs == one.configs


def test_slices_partition_the_space():
    p = CASES["llama3-8b-fp8-fsdp"]()
    parts = plan_slices(p.space, ("tp", "pp", "cp", "vpp"))
    assert len(parts) > 1
    assert sum(p.space.fix(**f).size() for f in parts) == p.space.size()
    assert len({tuple(sorted(f.items())) for f in parts}) == len(parts)
    with pytest.raises(ValueError, match="cannot slice"):
        plan_slices(p.space, ("recompute",))


def test_default_slices():
    """MoE spaces (several ep values) are sliced by (tp, pp), dense ones by pp."""
    assert default_slice_axes(CASES["mixtral-8x7b"]().space) == ("tp", "pp")
    assert default_slice_axes(CASES["llama3-8b"]().space) == ("pp",)


def test_oracle_tables_are_memoised_per_problem():
    p = CASES["mixtral-8x7b"]()
    cache = oracle_cache(p)
    a = enumerate_problem(p, count_removed=False)
    assert cache.act and cache.shard and cache.stages and oracle_cache(p) is cache
    b = enumerate_problem(p, count_removed=False)  # from the memoised tables
    assert a.configs == b.configs
    longer = p.replace(training=p.training.model_copy(update={"seq_len": 8192}))
    assert oracle_cache(longer) is not cache


def _slow_prune(stages):
    uniq = {}
    for s in stages:
        uniq.setdefault((s.as_vector(), s.recompute_groups), s)
    vals = list(uniq.values())
    return [a for i, a in enumerate(vals)
            if not any(j != i and _dominated(a, b) for j, b in enumerate(vals))]


def test_vectorised_stage_pruning_keeps_the_same_stages():
    m = CASES["deepseek-v3"]().model
    for pp, vpp, k, ga in [(16, 2, 1, 9), (16, 1, 4, 3), (16, 2, None, 20), (32, 1, 2, 40)]:
        cfg = ParallelConfig(pp=pp, vpp=vpp, pipeline_split=PipelineSplit.EMBEDDING_LOSS, ga=ga,
                             dp=1, recompute=Recompute.FULL if k else Recompute.NONE,
                             recompute_layers=k)
        stages = M.stage_counts(m, cfg)
        assert len(stages) > 8
        assert prune_stages(stages) == _slow_prune(stages)
    a = M.StageCounts(0, *([1] * 15), recompute_groups=((1, 2),))
    b = M.StageCounts(1, *([1] * 15), recompute_groups=((2, 2), (0, 1)))
    assert _covered(a, b) and not _covered(b, a)


def test_numpy_dependency_analysis_matches_python():
    rng = random.Random(5)
    for _ in range(20):
        keys = [tuple(rng.randrange(4) for _ in range(4)) for _ in range(300)]
        keys = list(dict.fromkeys(keys))
        outs = [(k[0] * 3 + k[2], k[1], rng.randrange(2), 7) for k in keys]
        d = _Dependencies(keys, outs)
        for subset in [(), (0,), (0, 2), (1,), (0, 1, 2, 3), (3, 1)]:
            assert d._numpy(subset) == d._python(subset), subset


def test_lazy_value_sets():
    ar = Arith(cp_model.CpModel())
    a = ar.var((1, 2, 5), "a")
    b = ar.var((0, 3), "b")
    s = a * 2 + b - 1
    assert s.values == tuple(sorted({2 * x + y - 1 for x in (1, 2, 5) for y in (0, 3)}))
    assert (a * b).values == tuple(sorted({x * y for x in (1, 2, 5) for y in (0, 3)}))
    assert (-a).values == (-5, -2, -1)
    big = ar.var(range(100), "big")
    assert (big + big).values == tuple(range(199))
    assert (big * big + big).values is None  # beyond MAX_TRACKED_VALUES pairs: not tracked


def test_slice_models_fold_the_fixed_axes():
    """A slice fixes its axes to constants: its model has no variable for them."""
    p = CASES["mixtral-8x7b"]()
    f = plan_slices(p.space)[3]
    lm = LegalityModel(p.replace(space=p.space.fix(**f)))
    assert all(isinstance(lm.axis[a], int) for a in f)


def test_mixtral_on_four_nodes_sliced():
    """The benchmark's first case at a reduced batch of micro-batch sizes: slices agree."""
    p = problem("mixtral-8x22b", "mi355x", 4, 8192, 512, mbs=(1, 2))
    _same(enumerate_problem(p, slice_axes=("tp", "pp")), enumerate_problem(p, slice_axes=()))


def test_no_presolve_reified_pair():
    """Why ``Arith.le`` uses maxima even without presolve: OR-Tools 9.15 without presolve calls
    this satisfiable model (y = 0, b = 1 and y = 1, b = 0) infeasible; found on a four-axis slice
    of llama3-8b when ``le`` was a reified pair. If this starts to pass, the pair may be tried
    again (it was about 8% faster on Mixtral 8x22B)."""
    big, q0, bound = 11047600128, 552380006, 8182335488

    def solve(presolve: bool) -> str:
        m = cp_model.CpModel()
        y = m.NewIntVar(0, 1, "y")
        q = m.NewIntVar(q0, 2 * q0, "q")
        m.Add(q == q0 + q0 * y)
        b = m.NewBoolVar("b")
        m.Add(big * y + q <= bound).OnlyEnforceIf(b)
        m.Add(big * y + q >= bound + 1).OnlyEnforceIf(b.Not())
        s = cp_model.CpSolver()
        s.parameters.num_workers = 1
        s.parameters.cp_model_presolve = presolve
        return s.StatusName(s.Solve(m))

    assert solve(True) == "OPTIMAL"
    assert solve(False) == "INFEASIBLE"  # the OR-Tools 9.15 behaviour ``le`` avoids
    # the encoding ``le`` uses instead is right without presolve
    m = cp_model.CpModel()
    ar = Arith(m)
    y = ar.var((0, 1), "y")
    q = ar.var((q0, 2 * q0), "q")
    m.Add(q.expr == q0 + q0 * y.expr)
    ok = ar.as_var(ar.le(y * big + q, bound, "fits"))
    rows = []

    class Col(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self):
            rows.append((self.Value(y.expr), self.Value(ok)))

    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    s.parameters.cp_model_presolve = False
    s.parameters.enumerate_all_solutions = True
    s.Solve(m, Col())
    assert sorted(rows) == [(0, 1), (1, 0)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_walk_counts_what_passes_per_slice(name):
    """The removal counts' walk, asked for what passes per (tp, pp) or per pp, gives the same
    counts as without, and per slice what a walk of that slice alone gives; enumeration skips
    exactly the slices where nothing passes."""
    from tune_cp.solver.attribution import MEMORY_FAMILIES, walk

    p = CASES[name]()
    fams = [f for f in RULES if f not in MEMORY_FAMILIES]
    axes = default_slice_axes(p.space)
    parts = plan_slices(p.space, axes)
    by = tuple(parts[0])
    passing: dict = {}
    assert walk(p, fams, by, passing) == walk(p, fams)
    for f in parts:
        alone = walk(p.replace(space=p.space.fix(**f)), fams)
        assert passing.get(tuple(f.values()), 0) == alone.get("pass", 0)
    e = enumerate_problem(p)
    assert e.slices == len(parts)
    assert e.skipped == sum(1 for f in parts if not passing.get(tuple(f.values())))


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_recomputation_is_never_refused_where_another_option_passes(name):
    """What lets the other options' model of a slice take "no recomputation fits" from the
    solutions of the no-recomputation model (``feasible.none_from_solutions``): a candidate that
    passes every family besides memory still passes them with no recomputation, and the families
    that read the recompute option are the ones named for it."""
    from tune_cp.solver.attribution import MEMORY_FAMILIES
    from tune_cp.solver.feasible import NONE_NEVER_STRICTER
    from tune_cp.solver.rules import FAMILY_AXES
    from tune_cp.solver.space import RecomputeOption

    assert {f for f in RULES if f not in MEMORY_FAMILIES
            and "recompute" in FAMILY_AXES[f]} == NONE_NEVER_STRICTER
    p = CASES[name]()
    fams = [f for f in RULES if f not in MEMORY_FAMILIES]
    none = RecomputeOption(kind=Recompute.NONE)

    def passes(cand) -> bool:
        ctx = p.context(p.resolve(cand))
        return not any(RULES[f](ctx) for f in fams)

    passed = 0
    for cand in p.space.sample(3000, seed=11):
        if cand["recompute"].kind is Recompute.NONE or not passes(cand):
            continue
        passed += 1
        assert passes(cand | {"recompute": none}), cand
    assert passed
    # the run settings' refusals that read the recompute option never refuse none of it
    from tune_cp.solver.rules import SETTING_REFUSALS

    on_rc = [r for r in SETTING_REFUSALS if "recompute" in r.fields]
    assert on_rc and all(set(r.fields) <= {"recompute", "recompute_modules"} for r in on_rc)
    for r in on_rc:
        values = {"recompute": Recompute.NONE, "recompute_modules": ()}
        assert not r.refuses(*(values[f] for f in r.fields))


def test_other_options_are_one_model(monkeypatch):
    """A MoE slice: no recomputation alone, then one model of the other options (selective and
    every full block K); the enumeration equals the one with a model for the options other than
    full block and another for full block (the pieces of the fifth to seventh rounds)."""
    from tune_cp.solver import feasible

    p = problem("mixtral-8x22b", "mi355x", 4, 8192, 512, mbs=(1, 2))
    parts = feasible.recompute_parts(p.space, tuple(RULES))
    assert [n for _, n in parts] == [None, True]
    (none_sp, _), (rest_sp, _) = parts
    assert [o.kind for o in none_sp.recompute] == [Recompute.NONE]
    assert {o.kind for o in rest_sp.recompute} == {Recompute.SELECTIVE, Recompute.FULL}
    assert len(none_sp.recompute) + len(rest_sp.recompute) == len(p.space.recompute)
    one = enumerate_problem(p)

    def separate(space, families):
        got = parts_of(space, families)
        if len(got) == 1:
            return got
        (n_sp, n_opt), (r_sp, r_opt) = got
        groups = ([o for o in r_sp.recompute if not o.is_full_block],
                  [o for o in r_sp.recompute if o.is_full_block])
        return [(n_sp, n_opt),
                *((r_sp.with_domains(recompute=tuple(g)), r_opt) for g in groups)]

    parts_of = feasible.recompute_parts
    monkeypatch.setattr(feasible, "recompute_parts", separate)
    _same(one, enumerate_problem(p))


@pytest.mark.parametrize("name", ["deepseek-v3", "mixtral-8x22b", "llama3-8b", "nemotron-h-56b"])
def test_activation_units_read_pp_only_as_a_pipeline(name):
    """The solver computes the activation units of pp 2 for every pp > 1
    (``oracle.memory.activation_pp``): they must be those of each pp, for every kind of
    layer, parallelism, micro-batch, FP8 and selective recomputation."""
    from tests.conftest import resolved
    from tune_cp.config.specs import ClusterSpec, Precision, TrainingSpec
    from tune_cp.oracle.catalog import load_gpu, load_model

    m = load_model(name)
    cl = ClusterSpec(gpu=load_gpu("h100"), num_nodes=64, gpus_per_node=8)
    for prec in ("bf16", "fp8"):
        tr = TrainingSpec(seq_len=4096, global_batch_size=4096, precision=Precision(prec))
        for tp, cp, mbs, rc in ((1, 1, 1, {}), (2, 2, 2, {}), (4, 1, 1, {
                "recompute": Recompute.SELECTIVE, "recompute_modules": ("core_attn",)})):
            units = {pp: M.activation_units(m, tr, resolved(m, cl, tr, tp=tp, pp=pp, cp=cp,
                                                             mbs=mbs, **rc))
                     for pp in (1, 2, 4, 8, 16)}
            assert units[1] != units[2]  # the pipeline's send/receive buffers
            for pp in (4, 8, 16):
                assert M.activation_pp(pp) == 2 and units[pp] == units[2], (pp, tp, cp, mbs)
    assert M.activation_pp(1) == 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_resolve_many_is_resolve(name):
    """``Problem.resolve_many`` (one resolution per layout, copied per micro-batch size and
    recompute option) gives what ``resolve`` gives for each candidate, every field."""
    p = CASES[name]()
    cands = list(p.space.sample(1500, seed=5))
    # the same layouts again with the other mbs values and recompute options
    cands += [c | {"mbs": b, "recompute": r} for c in cands[:40]
              for b in p.space.mbs for r in p.space.recompute[:4]]
    got = p.resolve_many(cands)
    assert len(got) == len(cands)
    for cand, cfg in zip(cands, got, strict=True):
        want = p.resolve(cand)
        assert cfg == want and cfg.model_dump() == want.model_dump(), cand
