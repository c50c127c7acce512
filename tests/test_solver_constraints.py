"""Extra constraints as data: safe parsing, Python and CP-SAT agree, constraints only narrow,
conflicts give an empty set with an explanation, soft objectives rank, ``check --constraint``."""

from __future__ import annotations

import random

import pytest
from ortools.sat.python import cp_model

from tests.test_solver_equivalence import CASES
from tune_cp.config.specs import ConfigError
from tune_cp.solver.constraints import (
    NAMES,
    HardConstraint,
    SoftObjective,
    axis_values,
    compile_expr,
    score,
)
from tune_cp.solver.explain import explain_infeasible
from tune_cp.solver.feasible import best_feasible, enumerate_problem
from tune_cp.solver.model import LegalityModel
from tune_cp.solver.symbolic import Sym

GOOD = ["ep * etp <= 8", "cp == 1", "pp in {2, 4}", "tp <= 4", "pp not in {1}",
        "tp * pp * cp * dp == 16 or mbs > 1", "not (vpp > 1 and ga < 2 * pp)",
        "1 <= tp < 8", "(ga - 4) // 3 >= -1", "-tp + 2 * ep != 3"]


@pytest.mark.parametrize("bad,needle", [
    ("tp ** 2 < 4", "'**' is not allowed in constraint 'tp ** 2 < 4'"),
    ("foo < 2", ("unknown name 'foo' in constraint 'foo < 2'; allowed names: tp, pp, vpp, cp, "
                 "ep, etp, dp, mbs, ga")),
    ("tp", "constraint 'tp' is a number, not a condition"),
    ("tp < 1.5", "'1.5' is not an integer in ASCII digits"),
    # numbers in ASCII digits and ASCII names only, as Python's literals and NFKC names are not
    ("tp <= 1_000", "'1_000' is not an integer in ASCII digits"),
    ("tp <= 0x10", "'0x10' is not an integer"), ("ｔｐ <= 8", "'ｔｐ' is not an ASCII name"),
    ("tp in 3", "'3' after 'in' is not a set of integers"),
    ("__import__('os').system('x') == 0", "is not allowed in constraint"),
    ("tp.real < 2", "'tp.real' is not allowed"),
    ("tp / 2 < 1", "'/' is not allowed"),
    ("tp <", "is not an expression"),
    ("(tp < 2) + 1 > 0", "'tp < 2' is a condition, not a number"),
    ("", "empty constraint"),
])
def test_bad_constraints_are_one_line_errors(bad, needle):
    with pytest.raises(ConfigError) as e:
        HardConstraint.of(bad)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


def test_python_evaluation_and_description():
    c = HardConstraint.of("ep*etp<=8", rationale="one node of experts")
    env = {"tp": 2, "pp": 4, "vpp": 1, "cp": 1, "ep": 8, "etp": 2, "dp": 2, "mbs": 1, "ga": 64}
    assert c.holds(env) is False and c.describe(env) == "ep*etp = 16"
    assert c.axes == ("ep", "etp") and c.rationale == "one node of experts"
    assert HardConstraint.of("dp >= 2").axes == ("cp", "pp", "tp")
    assert HardConstraint.of("pp in {2, 4}").holds(env)
    assert SoftObjective.of("tp", weight=3).score(env) == 6
    assert SoftObjective.of("vpp > 1", direction="maximize").score(env) == 0


def test_cpsat_compilation_equals_python():
    """Each constraint compiled to CP-SAT takes the value Python computes, on every config."""
    p = CASES["mixtral-8x7b"]()
    p = p.replace(space=p.space.with_domains(recompute=p.space.recompute[:1]))
    lm = LegalityModel(p, ["world_size", "batch"])
    vals = [compile_expr(HardConstraint.of(t).tree, lm.names, lm.ar) for t in GOOD]
    names = [lm.names[n] for n in NAMES]

    class Col(cp_model.CpSolverSolutionCallback):
        def __init__(self):
            super().__init__()
            self.rows = []

        def on_solution_callback(self):
            env = {n: (v if isinstance(v, int) else self.Value(v.expr))
                   for n, v in zip(NAMES, names, strict=True)}
            got = [v if isinstance(v, int) else self.Value(v.expr) for v in vals]
            self.rows.append((env, got))

    for lit in lm.lit.values():
        lm.cp.Add(lit == 1)
    s = cp_model.CpSolver()
    s.parameters.enumerate_all_solutions = True
    s.parameters.num_workers = 1
    col = Col()
    s.Solve(lm.cp, col)
    assert len(col.rows) > 300
    for env, got in random.Random(1).sample(col.rows, 300):
        assert got == [int(HardConstraint.of(t).holds(env)) for t in GOOD], env


def test_constraints_only_narrow():
    p = CASES["mixtral-8x7b"]()
    everything = {tuple(sorted((k, str(v)) for k, v in f.candidate.items()))
                  for f in enumerate_problem(p, count_removed=False).configs}
    cons = [HardConstraint.of(t) for t in ("ep * etp <= 4", "pp in {1, 2}", "dp >= 2")]
    narrowed = enumerate_problem(p.replace(constraints=tuple(cons)))
    assert 0 < len(narrowed) < len(everything)
    for f in narrowed.configs:
        assert tuple(sorted((k, str(v)) for k, v in f.candidate.items())) in everything
        assert all(c.holds(axis_values(f.config)) for c in cons)
    assert narrowed.removed["extra"] > 0


def test_conflicting_constraint_gives_empty_set_and_names_it():
    p = CASES["mixtral-8x7b"]()
    bad = p.replace(constraints=(HardConstraint.of("tp * pp * cp > 16"),))
    e = enumerate_problem(bad)
    assert e.empty and e.removed["extra"] > 0
    why = explain_infeasible(bad, max_nodes=p.cluster.num_nodes)
    assert not why.feasible and "extra: tp * pp * cp > 16" in why.conflict
    assert "without constraint 'tp * pp * cp > 16'" in why.relaxations
    assert "tp * pp * cp > 16" in why.text()


def test_soft_objectives_rank_and_cpsat_finds_the_best():
    p = CASES["mixtral-8x7b"]()
    objs = [SoftObjective.of("tp", weight=3, rationale="TP all-reduces are exposed"),
            SoftObjective.of("vpp > 1", direction="maximize", weight=2),
            SoftObjective.of("ep * etp", direction="maximize")]
    e = enumerate_problem(p, count_removed=False)
    best = min(score(objs, f.config) for f in e.configs)
    found = best_feasible(p, objs)
    assert found is not None and score(objs, found.config) == best
    assert found.config in [f.config for f in e.configs]
    assert found.peak_bytes == next(f.peak_bytes for f in e.configs if f.config == found.config)


def test_check_cli_constraint(run_cli, run_json):
    ref = ("check", "--model", "mixtral-8x22b", "--gpu", "mi355x", "--nodes", "4", "--gbs", "512",
           "--pp", "4", "--vpp", "2", "--ep", "8", "--recompute", "full", "--recompute-layers", "1")
    code, data = run_json(*ref, "--constraint", "ep*etp<=8", "--constraint", "cp == 1")
    assert code == 0 and data["legal"] is True
    code, data = run_json(*ref, "--constraint", "ep*etp<=4")
    assert code == 1 and data["legal"] is False and data["memory"]["fits"] is True
    assert data["violations"] == [{"rule": "extra", "message":
                                   "constraint 'ep*etp<=4' does not hold: ep*etp = 8"}]
    code, _, err = run_cli(*ref, "--constraint", "ep**2 < 3")
    assert code == 2 and err.startswith("tune-cp: error: '**' is not allowed") and \
        err.count("\n") == 1


def test_sym_compile_keeps_values_determined():
    p = CASES["llama3-8b"]()
    lm = LegalityModel(p, ["world_size"])
    v = compile_expr(HardConstraint.of("tp * pp <= 4").tree, lm.names, lm.ar)
    assert isinstance(v, Sym) and (v.lo, v.hi) == (0, 1)
