"""Enumerate the feasible set of a search space with CP-SAT.

:func:`enumerate_feasible` is the entry point of the search (``tune-cp``'s search command and
the tuning agent): every configuration of the space that passes every enabled rule family, in a
deterministic order (the space's domain order, axis by axis in ``solver.space.AXES`` order), each
resolved and with its exact peak bytes (``oracle.memory.memory_report``'s ``peak_bytes``), plus
how many raw candidates each family removed (``solver/attribution.py``) and the time taken.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from tune_cp.config.axes import INT_AXES, SLICE_DEFAULT_AXES, SLICEABLE_AXES
from tune_cp.config.resolve import Columns
from tune_cp.config.specs import (
    ClusterSpec,
    ConfigError,
    ModelSpec,
    ParallelConfig,
    Recompute,
    TrainingSpec,
)
from tune_cp.solver.attribution import PROBE_AXES, attribute, attribution_walk
from tune_cp.solver.constraints import (
    Direction,
    SoftObjective,
    compile_expr,
)
from tune_cp.solver.cpsat import cp_model
from tune_cp.solver.model import LegalityModel
from tune_cp.solver.problem import Problem
from tune_cp.solver.rules import RULES
from tune_cp.solver.settings import RunSettings
from tune_cp.solver.space import AXES, SearchSpace, default_space
from tune_cp.solver.symbolic import Sym

#: Families a search applies unless told otherwise: all of them.
DEFAULT_FAMILIES: tuple[str, ...] = tuple(RULES)


def enumeration_families(families: Iterable[str] | None) -> tuple[str, ...]:
    """The families an enumeration applies, in ``RULES`` order (None: :data:`DEFAULT_FAMILIES`)."""
    chosen = set(DEFAULT_FAMILIES if families is None else families)
    return tuple(f for f in RULES if f in chosen)


@dataclass(frozen=True)
class FeasibleConfig:
    """One feasible configuration: resolved, with the most loaded stage's bytes."""

    config: ParallelConfig
    peak_bytes: int
    candidate: Mapping[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class Enumeration:
    """The feasible set of a space.

    ``removed[f]``: raw candidates (of ``space_size``) whose first failing family, in ``RULES``
    order, is ``f`` (families switched off remove nothing); ``space_size - sum(removed) ==
    len(configs)``. ``timings`` (seconds): ``build`` (tables and models) and ``solve`` (CP-SAT),
    each summed over the slices (over the processes when ``workers`` > 1), ``enumerate`` (wall
    time of the slices), ``decode`` (resolved configurations), ``attribution`` (removal counts),
    ``total`` (wall time). ``slices``: slices of the space; ``skipped``: those of them where
    nothing passes the families that do not read memory (the removal counts' walk shows it;
    no CP-SAT model is built), so ``slices - skipped`` CP-SAT models were solved;
    ``workers``: processes used.
    """

    problem: Problem
    configs: tuple[FeasibleConfig, ...]
    space_size: int
    removed: dict[str, int]
    families: tuple[str, ...]
    timings: dict[str, float]
    method: str = "cp-sat"
    slices: int = 1
    workers: int = 1
    skipped: int = 0
    #: the resolved configurations as columns, row i = ``configs[i].config``
    #: (``config/resolve.py``; None where the enumeration did not resolve them as one batch)
    columns: Columns | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.configs)

    @property
    def empty(self) -> bool:
        return not self.configs


def sort_key(space: SearchSpace, candidate: Mapping[str, Any]) -> tuple[int, ...]:
    """Position of a candidate in the space's order (axis by axis, domain order)."""
    out = []
    for name in AXES:
        dom = space.etp_all_values if name == "etp" else getattr(space, name)
        out.append(dom.index(candidate[name]))
    return tuple(out)


class _Collector(cp_model.CpSolverSolutionCallback):
    """Reads each solution: the raw value of every axis in ``AXES`` order (the value of tp, pp,
    cp, vpp, ep, etp, mbs; the domain index of the others) and the peak bytes.

    Values are read by variable index (``SolutionIntegerValue``); each stage slot's memory
    total is one variable (the enumeration models define one per total:
    ``MemoryEncoding._fits``) or a constant."""

    def __init__(self, lm: LegalityModel) -> None:
        super().__init__()
        self.slots = [(i, lm.ar.as_var(v).index) for i, v in enumerate(lm.axis.values())
                      if isinstance(v, Sym)]
        self.template = [v if isinstance(v, int) else 0 for v in lm.axis.values()]
        self.rows: list[tuple[tuple[int, ...], int]] = []
        #: scenario (a constant, or a variable index), and per scenario the slots' totals: the
        #: variable indices of those that vary and the largest constant one (-1: none)
        self.scenario: tuple[bool, int] | None = None
        self.totals: dict[int, tuple[list[int], int]] = {}
        if "hbm" in lm.families:
            mem = lm.memory
            sc = mem.scenario
            self.scenario = ((True, lm.ar.as_var(sc).index) if isinstance(sc, Sym)
                             else (False, sc))
            for s in mem.scenarios:
                totals = [t[s] for t in mem.totals]
                self.totals[s] = ([lm.ar.as_var(t).index for t in totals if isinstance(t, Sym)],
                                  max((t for t in totals if isinstance(t, int)), default=-1))

    def on_solution_callback(self) -> None:
        value = self.SolutionIntegerValue
        vals = list(self.template)
        for i, v in self.slots:
            vals[i] = value(v)
        peak = -1
        if self.scenario is not None:
            is_var, s = self.scenario
            idx, const = self.totals[value(s) if is_var else s]
            peak = max(const, *map(value, idx)) if idx else const
        self.rows.append((tuple(vals), peak))


def single_solve_solver(time_limit_s: float | None = None) -> cp_model.CpSolver:
    """A solver for one solve (feasibility, an optimum, an assumption core): the enumeration's
    parameters with CP-SAT's automatic search instead of the fixed axis order."""
    solver = cp_model.CpSolver()
    solver_parameters(solver, time_limit_s)
    solver.parameters.search_branching = cp_model.AUTOMATIC_SEARCH
    return solver


def solved_axes(solver: cp_model.CpSolver, lm: LegalityModel) -> dict[str, int]:
    """The axis values of the solver's solution."""
    return {k: solver.Value(v.expr) for k, v in lm.axis.items() if isinstance(v, Sym)}


def solver_parameters(solver: cp_model.CpSolver, time_limit_s: float | None = None) -> None:
    """One worker, fixed search on the axes (``LegalityModel.add_search_strategy``), light
    presolve and no SAT inprocessing: probing, symmetry, the LP relaxation and inprocessing at
    each return to the root (enumeration returns there after every solution) cost more than they
    save here; implied bounds and the newer linear propagator too (Mixtral 8x22B on 4 nodes:
    23 s with CP-SAT's defaults, 2.1 s with these).
    Presolve must keep every solution while enumerating; ``Arith.le`` avoids the one OR-Tools
    9.15 rule that did not (see its docstring).
    CP-SAT does not catch Ctrl-C (``catch_sigint_signal`` off): caught, it stopped the solve as
    if its time had run out (read as "did not finish within 60 s" or as infeasible), or was
    lost when the solve finished anyway, and its handler left SIGINT's default behind (a second
    Ctrl-C killed the process silently). Python's handler raises KeyboardInterrupt in the next
    solution callback or when the solve returns."""
    prm = solver.parameters
    prm.catch_sigint_signal = False
    prm.num_workers = 1
    prm.search_branching = cp_model.FIXED_SEARCH
    prm.cp_model_probing_level = 0
    prm.symmetry_level = 0
    prm.linearization_level = 0
    prm.use_sat_inprocessing = False
    prm.use_implied_bounds = False
    prm.new_linear_propagation = False
    if time_limit_s is not None:
        prm.max_time_in_seconds = time_limit_s


def enumeration_parameters(solver: cp_model.CpSolver) -> None:
    """:func:`solver_parameters` for enumerating a whole (slice) model, without presolve: a
    slice model is small and built with its constants folded, so presolve finds little to
    remove, and with presolve every reported solution goes through postsolve (about a third of
    the search time on Mixtral 8x22B)."""
    solver_parameters(solver)
    solver.parameters.enumerate_all_solutions = True
    solver.parameters.cp_model_presolve = False


#: Axes enumeration slices the space on by default: one CP-SAT model per combination of their
#: values (docs/solver.md, "Speed"): pp, and tp too when experts multiply the layouts of each
#: (tp, pp) (:func:`default_slice_axes`).
SLICE_AXES: tuple[str, ...] = SLICE_DEFAULT_AXES
#: Axes a space may be sliced on (fixing one of them keeps every other domain as it is).
SLICEABLE: tuple[str, ...] = SLICEABLE_AXES
#: Axes whose raw solver value is the value itself (the others are domain indices).
NUMERIC_AXES = frozenset(INT_AXES)


def default_slice_axes(space: SearchSpace) -> tuple[str, ...]:
    """The axes :func:`enumerate_problem` slices on by default: (tp, pp) when the space has more
    than one ep value (MoE: many feasible configurations per (tp, pp), each cheaper to report
    from a small model), else pp only (dense: few feasible configurations; more slices cost
    more to build than they save)."""
    return SLICE_AXES if len(space.ep) > 1 else ("pp",)


def plan_slices(space: SearchSpace, axes: Sequence[str] = SLICE_AXES) -> list[dict[str, Any]]:
    """The slices of ``space``: every combination of values of ``axes`` (those with more than
    one value), in the space's order. Their union is the space; they are disjoint."""
    bad = sorted(set(axes) - set(SLICEABLE))
    if bad:
        raise ValueError(f"cannot slice on {bad}; choose from {list(SLICEABLE)}")
    free = [a for a in AXES if a in axes and len(getattr(space, a)) > 1]
    return [dict(zip(free, vals, strict=True))
            for vals in product(*(getattr(space, a) for a in free))]


@dataclass
class SliceResult:
    """What one slice model gives: ``rows`` of (raw axis values in ``AXES`` order, peak)."""

    fixed: dict[str, Any]
    rows: list[tuple[tuple[int, ...], int]]
    build_s: float
    solve_s: float


#: Wall-clock seconds the enumeration of one search may take (all its slices together; each
#: slice in its own process with ``workers`` > 1). The largest default spaces of the catalog take
#: a few seconds (``benchmarks/solver.py``); a space that needs more is refused with what would
#: narrow it, instead of running for minutes.
ENUMERATION_TIME_LIMIT_S = 60.0


class EnumerationTooLong(ConfigError):
    """The enumeration did not finish within :data:`ENUMERATION_TIME_LIMIT_S`."""


def _too_long(problem: Problem, found: int) -> EnumerationTooLong:
    sp, c = problem.space, problem.cluster
    return EnumerationTooLong(
        f"enumerating the {sp.size():,} candidate configurations of {problem.model.name} on "
        f"{c.num_nodes} x {c.gpus_per_node} {c.gpu.name} did not finish within "
        f"{ENUMERATION_TIME_LIMIT_S:g} s ({found:,} feasible so far); narrow the space with "
        f"--constraint (e.g. 'tp<=8', 'pp<=16', 'ep<=64') or fewer nodes")


def solve_slice(problem: Problem, families: Sequence[str],
                fixed: Mapping[str, Any], time_limit_s: float | None = None) -> SliceResult:
    """Enumerate the slice of ``problem``'s space where the axes of ``fixed`` take those values:
    a :class:`LegalityModel` of the sub-space (every family, the same memory tables restricted
    to the slice, constants folded), every literal true. ``time_limit_s``: CP-SAT's wall-clock
    limit; raises :class:`EnumerationTooLong` when the enumeration does not finish within it."""
    sub = problem.replace(space=problem.space.fix(**fixed)) if fixed else problem
    rows: list[tuple[tuple[int, ...], int]] = []
    build_s = solve_s = 0.0
    start = time.perf_counter()
    none_fits: list[tuple[int, ...]] | None = None
    for part, none_option in recompute_parts(sub.space, families):
        t0 = time.perf_counter()
        lm = LegalityModel(sub.replace(space=part) if part is not sub.space else sub, families,
                           enforced=True, none_option=none_option,
                           none_fits=none_fits if none_option else None)
        for lit in lm.lit.values():
            lm.cp.Add(lit == 1)
        lm.add_search_strategy()
        t1 = time.perf_counter()
        left = None
        if time_limit_s is not None:
            left = time_limit_s - (time.perf_counter() - start)
            if left <= 0:
                raise _too_long(problem, len(rows))
        got = _solve_model(problem, lm, left, len(rows))
        if part is sub.space:
            rows += got
        else:  # the part's recompute indices -> the space's
            if none_option is None and none_from_solutions(families):
                none_fits = [raw[:_RC] for raw, _ in got]
            index = _positions(part.recompute, sub.space.recompute)
            rows += [((*raw[:_RC], index[raw[_RC]]), peak) for raw, peak in got]
        build_s += t1 - t0
        solve_s += time.perf_counter() - t1
    return SliceResult(dict(fixed), rows, build_s, solve_s)


def _solve_model(problem: Problem, lm: LegalityModel, time_limit_s: float | None,
                 found: int) -> list[tuple[tuple[int, ...], int]]:
    """Every solution of ``lm``'s model (raw axis values, peak bytes). ``found``: solutions of
    the problem so far (for the time-limit message)."""
    solver = cp_model.CpSolver()
    enumeration_parameters(solver)
    if time_limit_s is not None:
        solver.parameters.max_time_in_seconds = time_limit_s
    col = _Collector(lm)
    status = solver.Solve(lm.cp, col)
    if status == cp_model.MODEL_INVALID:  # numbers beyond 64 bits: an input error, one line
        m = lm.p.model
        raise ConfigError(f"model {m.name!r} (hidden_size {m.hidden_size}, vocab "
                          f"{m.vocab_size}) is too large for the solver's 64-bit arithmetic "
                          f"({' '.join(lm.cp.Validate().split())[:200]})")
    if status not in (cp_model.OPTIMAL, cp_model.INFEASIBLE):
        # FEASIBLE / UNKNOWN while enumerating: stopped by the time limit before the end
        raise _too_long(problem, found + len(col.rows))
    return col.rows


def _positions(items: Sequence[Any], domain: Sequence[Any]) -> list[int]:
    """The position of each of ``items`` in ``domain``: by identity (a part's options are the
    slice's own objects, ``recompute_parts``), else by equality (a pydantic comparison of every
    field, ~5 us each: ``tuple.index`` over the options of 45 models cost ~0.1 s of CPU)."""
    at = {id(o): i for i, o in enumerate(domain)}
    return [at[id(o)] if id(o) in at else domain.index(o) for o in items]


#: Position of the recompute option in a solution's raw values (``AXES`` order: the last).
_RC = AXES.index("recompute")
assert _RC == len(AXES) - 1


#: The families besides memory that read the recompute option: each accepts no recomputation
#: wherever it accepts another option (zero-bubble needs no recomputation; K and module checks
#: concern the other options; the run settings refuse full recomputation or the moe module),
#: so a layout whose no-recomputation configuration fails one of them fails it with every
#: option (``tests/test_solver_slices.py`` checks this on the Python rules).
NONE_NEVER_STRICTER: frozenset[str] = frozenset({"schedule", "recompute", "run_settings"})


def none_from_solutions(families: Sequence[str]) -> bool:
    """Whether the other options' model may take "no recomputation fits" from the solutions of
    the no-recomputation model (:func:`solve_slice`): with ``hbm`` on, those solutions are the
    layouts where no recomputation passes every family; for a configuration that passes the
    families besides memory, that is exactly "no recomputation fits" as long as no family
    refuses no recomputation where it accepts another option (:data:`NONE_NEVER_STRICTER`)."""
    from tune_cp.solver.attribution import MEMORY_FAMILIES
    from tune_cp.solver.rules import FAMILY_AXES

    reads_rc = {f for f in families if f not in MEMORY_FAMILIES
                and "recompute" in FAMILY_AXES[f]}
    return "hbm" in families and reads_rc <= NONE_NEVER_STRICTER


def recompute_parts(space: SearchSpace, families: Sequence[str]
                    ) -> list[tuple[SearchSpace, bool | None]]:
    """The CP-SAT models a slice is enumerated with, one after the other: ``(space,
    none_option)`` for :class:`LegalityModel`. With ``recompute_dominance`` on and no
    recomputation an option beside others: no recomputation alone (nothing dominates it: it
    needs no dominance memory), then one model of the other options, told that no
    recomputation is an option (so that it dominates them where it fits) and, by the first
    model's solutions, where it fits (:func:`none_from_solutions`). Only where experts multiply
    the layouts (more than one ep value, as :func:`default_slice_axes`): a dense space has few
    feasible configurations per slice, and each part searches the slice's layouts again (Llama
    3.1 405B on 16 H100 nodes: 1.2 -> 1.6 s). Else the slice's space itself. (Solving the other
    options in two pieces, full block recompute apart, takes less CP-SAT deterministic time but
    more instructions, a model load each: docs/solver.md.)"""
    rc = space.recompute
    none = tuple(o for o in rc if o.kind is Recompute.NONE)
    if ("recompute_dominance" not in families or not none or len(none) == len(rc)
            or len(space.ep) == 1):
        return [(space, None)]
    rest = tuple(o for o in rc if o.kind is not Recompute.NONE)
    return [(space.with_domains(recompute=none), None),
            (space.with_domains(recompute=rest), True)]


#: The problem and families of the enumeration a worker process serves (set before the fork,
#: or by the pool initializer where processes are spawned).
_JOB: tuple[Problem, tuple[str, ...]] | None = None


def _init_worker(job: tuple[Problem, tuple[str, ...]]) -> None:
    global _JOB
    _JOB = job
    gc.disable()


def _solve_in_worker(fixed: dict[str, Any]) -> SliceResult:
    assert _JOB is not None
    return solve_slice(_JOB[0], _JOB[1], fixed, ENUMERATION_TIME_LIMIT_S)


def decode(space: SearchSpace, raw: Sequence[int]) -> dict[str, Any]:
    """The candidate (axis name -> domain value) of raw solver values in ``AXES`` order."""
    return {name: v if name in NUMERIC_AXES else getattr(space, name)[v]
            for name, v in zip(AXES, raw, strict=True)}


def enumerate_problem(problem: Problem, families: Iterable[str] | None = None,
                      *, count_removed: bool = True, workers: int = 1,
                      slice_axes: Sequence[str] | None = None) -> Enumeration:
    """:func:`enumerate_feasible` on a prepared :class:`Problem`.

    The space is cut into slices (:func:`plan_slices` on ``slice_axes``, default
    :func:`default_slice_axes`; ``()``: one model of the whole space), each enumerated by its
    own CP-SAT model; ``workers`` > 1 enumerates the slices in that many processes. The result
    does not depend on either: the union of the slices' solutions, in the space's order."""
    gc_was_on = gc.isenabled()
    gc.disable()  # many small acyclic objects (tables, rows): collections only cost time here
    try:
        return _enumerate(problem, families, count_removed, workers, slice_axes)
    finally:
        if gc_was_on:
            gc.enable()


def _enumerate(problem: Problem, families: Iterable[str] | None, count_removed: bool,
               workers: int, slice_axes: Sequence[str] | None) -> Enumeration:
    t0 = time.perf_counter()
    fams = enumeration_families(families)
    if slice_axes is None:
        slice_axes = default_slice_axes(problem.space)
    parts = plan_slices(problem.space, slice_axes) or [{}]
    results: list[SliceResult] = []
    walked = None
    skipped = 0
    walk_s = 0.0  # the walk of the removal counts, when run before the slices
    if workers > 1 and len(parts) > 1:
        import multiprocessing as mp

        n = min(workers, len(parts))
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        # one task per slice, handed out as processes free up (slices differ a lot in cost)
        with ctx.Pool(n, initializer=_init_worker, initargs=((problem, fams),)) as pool:
            pending = pool.map_async(_solve_in_worker, parts, chunksize=1)
            if count_removed:  # the walk needs no configuration: overlap it with the slices
                walked = attribution_walk(problem, fams)
            results = pending.get()
    else:
        by = tuple(parts[0])
        if count_removed and len(parts) > 1 and set(by) <= set(PROBE_AXES):
            # the removal counts' walk first: it also tells which slices have no candidate
            # that passes the families that do not read memory (no model to build for those)
            passing: dict[tuple[Any, ...], int] = {}
            tw = time.perf_counter()
            walked = attribution_walk(problem, fams, by, passing)
            walk_s = time.perf_counter() - tw
            run = [f for f in parts if passing.get(tuple(f.values()), 0)]
            skipped = len(parts) - len(run)
        else:
            run = parts
        deadline = t0 + ENUMERATION_TIME_LIMIT_S
        for f in run:
            try:
                results.append(solve_slice(problem, fams, f, deadline - time.perf_counter()))
            except EnumerationTooLong:
                raise _too_long(problem, sum(len(r.rows) for r in results)) from None
    t1 = time.perf_counter()
    rows = sorted(row for r in results for row in r.rows)
    space = problem.space
    cands = [decode(space, raw) for raw, _ in rows]
    columns, resolved = problem.resolve_columns(cands)
    configs = [FeasibleConfig(cfg, peak, cand) for cfg, (_, peak), cand
               in zip(resolved, rows, cands, strict=True)]
    t2 = time.perf_counter()
    removed: dict[str, int] = {}
    if count_removed:
        removed = attribute(problem, fams, configs, walked=walked)
    t3 = time.perf_counter()
    build = sum(r.build_s for r in results)
    solve = sum(r.solve_s for r in results)
    return Enumeration(
        problem=problem, configs=tuple(configs), space_size=problem.space.size(), removed=removed,
        families=fams, columns=columns,
        timings={"build": build, "solve": solve, "decode": t2 - t1,
                 "attribution": t3 - t2 + walk_s, "enumerate": t1 - t0 - walk_s,
                 "total": t3 - t0},
        slices=len(parts), workers=min(workers, len(parts)), skipped=skipped,
    )


def enumerate_feasible(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    space: SearchSpace | None = None,
    *,
    settings: RunSettings | None = None,
    families: Iterable[str] | None = None,
    count_removed: bool = True,
    workers: int = 1,
    slice_axes: Sequence[str] | None = None,
) -> Enumeration:
    """Every configuration of ``space`` (default: :func:`~solver.space.default_space`) that
    passes every family of ``families`` (default: all, including ``extra`` with the settings'
    constraints and ``recompute_dominance``), in a deterministic order, under ``settings``.

    The constraints (``RunSettings(constraints=["ep * etp <= 8"])``) only narrow the set. Pass ``families=[f for f in RULES if f != "recompute_dominance"]`` to keep every K
    of full recompute that fits. ``workers`` > 1 enumerates the slices of the space in that many
    processes (same result; ``os.cpu_count()`` uses every core); ``slice_axes``: see
    :func:`enumerate_problem`.
    """
    settings = settings or RunSettings()
    if space is None:
        space = default_space(model, cluster, training,
                              allow_cross_scale_up=settings.allow_cross_scale_up)
    problem = Problem(model=model, cluster=cluster, training=training, space=space,
                      settings=settings)
    return enumerate_problem(problem, families, count_removed=count_removed, workers=workers,
                             slice_axes=slice_axes)


def best_feasible(problem: Problem, objectives: Sequence[SoftObjective],
                  families: Iterable[str] | None = None,
                  time_limit_s: float = 60.0) -> FeasibleConfig | None:
    """The feasible configuration that minimises the weighted soft objectives (each compiled
    to CP-SAT; :func:`solver.constraints.score` is the same number in Python), without
    enumerating the set; None when nothing is feasible. Ties go to CP-SAT's choice."""
    fams = enumeration_families(families)
    lm = LegalityModel(problem, fams)
    for lit in lm.lit.values():
        lm.cp.Add(lit == 1)
    terms = []
    for o in objectives:
        v = compile_expr(o.tree, lm.names, lm.ar)
        sign = 1 if o.direction is Direction.MINIMIZE else -1
        terms.append(sign * o.weight * v)
    total = sum(terms)
    if not isinstance(total, int):
        lm.cp.Minimize(total.expr)
    solver = single_solve_solver(time_limit_s)
    status = solver.Solve(lm.cp)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    values = solved_axes(solver, lm)
    cand = lm.candidate(values)
    peak = lm.memory.peak(lambda x: solver.Value(x.expr)) if "hbm" in fams else -1
    return FeasibleConfig(problem.resolve(cand), peak, cand)



def any_feasible(problem: Problem, families: Iterable[str] | None = None, *,
                 slice_axes: Sequence[str] | None = None,
                 time_limit_s: float = ENUMERATION_TIME_LIMIT_S) -> bool:
    """Whether :func:`enumerate_problem` on ``problem`` would find a configuration, without
    enumerating: the models :func:`solve_slice` builds (default one model of the whole space,
    ``slice_axes`` as :func:`enumerate_problem`'s: its slices; the same families, default
    all, ``recompute_dominance`` included; the same search order and parameters), each stopped
    at its first solution, the slices tried deepest pipeline first (memory falls with pp) until
    one has a solution. CP-SAT's answer is exact (a complete search: INFEASIBLE is a proof
    that no configuration of the slice passes). ``tune-cp plan``'s smallest-cluster search
    asks only this at the node counts it bisects over. Raises :class:`EnumerationTooLong` when
    CP-SAT cannot decide within ``time_limit_s`` (all slices together)."""
    fams = enumeration_families(families)
    parts = plan_slices(problem.space, slice_axes) if slice_axes else [{}]
    deadline = time.perf_counter() + time_limit_s
    for fixed in sorted(parts, key=lambda f: -f.get("pp", 0)):
        sub = problem.replace(space=problem.space.fix(**fixed)) if fixed else problem
        lm = LegalityModel(sub, fams, enforced=True)
        for lit in lm.lit.values():
            lm.cp.Add(lit == 1)
        lm.add_search_strategy()
        solver = cp_model.CpSolver()
        solver_parameters(solver, max(1e-3, deadline - time.perf_counter()))
        solver.parameters.cp_model_presolve = False  # as the enumeration: the models are small
        solver.parameters.stop_after_first_solution = True
        status = solver.Solve(lm.cp)
        if status == cp_model.MODEL_INVALID:  # numbers beyond 64 bits (as solve_slice)
            m = problem.model
            raise ConfigError(f"model {m.name!r} (hidden_size {m.hidden_size}, vocab "
                              f"{m.vocab_size}) is too large for the solver's 64-bit arithmetic "
                              f"({' '.join(lm.cp.Validate().split())[:200]})")
        if status == cp_model.UNKNOWN:
            raise _too_long(problem, 0)
        if status != cp_model.INFEASIBLE:
            return True
    return False
