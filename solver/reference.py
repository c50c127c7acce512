"""The plain Python loop: the same space, the same rule functions, one candidate at a time.

It exists to check the CP-SAT model (``tests/test_solver_equivalence.py`` requires identical
sets, identical peak bytes and identical removal counts) and as the baseline of
``benchmarks/solver.py``. Every candidate of the raw product is resolved and run through the
families of ``solver/rules.py`` in ``RULES`` order; the first one it breaks is charged; a
candidate that breaks none is feasible, with ``memory_report``'s peak bytes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from tune_cp.solver.feasible import DEFAULT_FAMILIES, Enumeration, FeasibleConfig, sort_key
from tune_cp.solver.problem import Problem
from tune_cp.solver.rules import RULES


def reference_enumerate(problem: Problem, families: Iterable[str] | None = None, *,
                        candidates: Iterable[dict[str, Any]] | None = None) -> Enumeration:
    """Enumerate ``problem``'s space with a Python loop. ``candidates`` replaces the raw product
    (the benchmark passes a uniform sample); the result then covers only those."""
    t0 = time.perf_counter()
    wanted = set(DEFAULT_FAMILIES if families is None else families)
    fams = [f for f in RULES if f in wanted]
    removed = dict.fromkeys(RULES, 0)
    configs = []
    seen = 0
    for cand in problem.space.candidates() if candidates is None else candidates:
        seen += 1
        cfg = problem.resolve(cand)
        ctx = problem.context(cfg)
        for f in fams:
            if RULES[f](ctx):
                removed[f] += 1
                break
        else:
            configs.append(FeasibleConfig(cfg, ctx.memory.peak_bytes, cand))
    if candidates is None:
        configs.sort(key=lambda f: sort_key(problem.space, f.candidate))
    total = time.perf_counter() - t0
    return Enumeration(problem=problem, configs=tuple(configs), space_size=seen, removed=removed,
                       families=tuple(fams), timings={"total": total}, method="python")
