"""Why a search space has no feasible configuration, and the nearest fix in the user's terms.

:func:`explain_infeasible`:

1. **Conflicting families.** The model is solved with every family literal (and one literal per
   extra constraint) as a CP-SAT *assumption* (OR-Tools ``assumptions_sample_sat.py``);
   ``SufficientAssumptionsForInfeasibility`` gives a conflicting subset, shrunk to a minimal one
   by dropping each assumption that is not needed (deletion, one solve per family).
2. **How far memory is.** When ``hbm`` is in the conflict, the same model minus ``hbm``
   minimises the most loaded stage's bytes: the least memory any legal layout of the space needs.
3. **Nearest fixes.** The smallest node count of the same GPU that has a feasible
   configuration (same model, batch and options; linear scan up to ``max_nodes``), and each
   single relaxation that makes the space feasible: full or selective recompute, FSDP, micro-batch
   1, an axis the user fixed left free, memory margin 0, an extra constraint dropped; when the
   global batch is in the conflict, the nearest global batch that fits; when the node has an
   unusual GPU count, the GPU's usual count per node.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tune_cp.config.specs import GIB, ClusterSpec, ConfigError, Recompute, nodes_text
from tune_cp.solver.cpsat import cp_model
from tune_cp.solver.feasible import single_solve_solver, solved_axes
from tune_cp.solver.model import LegalityModel
from tune_cp.solver.problem import Problem
from tune_cp.solver.rules import RULES, SEARCH_ONLY
from tune_cp.solver.space import (
    AXES,
    OptimizerChoice,
    RecomputeOption,
    SearchSpace,
    default_space,
    max_layers_per_chunk,
    recompute_layer_values,
    selective_options,
)

#: What a family means, for explanations.
FAMILY_WORDS: dict[str, str] = {
    "world_size": "the world size (tp x pp x cp x dp = GPUs)",
    "tensor_parallel": "tensor-parallel shapes",
    "scale_up": "the scale-up domain",
    "expert_layout": "the expert layout",
    "expert_tensor_parallel": "expert tensor parallelism",
    "sequence_parallel": "sequence parallelism",
    "sequence_length": "the sequence length",
    "pipeline_split": "the pipeline layer split",
    "virtual_pipeline": "the interleaved schedule",
    "schedule": "the pipeline schedule",
    "recompute": "the recompute options",
    "precision": "the precision",
    "dispatcher": "the MoE dispatcher",
    "run_settings": "the framework run settings (CUDA graphs, MoE all-to-all overlap, token-drop)",
    "batch": "the global batch (gbs = mbs x ga x dp)",
    "extra": "the extra constraints",
    "recompute_dominance": "recompute dominance",
    "hbm": "memory (HBM)",
}
#: Families whose verdict may change with the node count: only then are node counts scanned.
NODE_BOUND = frozenset({"hbm", "world_size", "batch", "expert_layout", "scale_up"})
#: Largest multiple of the user's node count the node scan tries.
MAX_NODE_FACTOR = 64
#: Node counts above the user's tried one by one before the scan doubles.
LINEAR_NODE_SCAN = 16
#: Most smaller node counts tried when the cluster is too large for the batch.
MAX_NODE_PROBES = 32
#: What one explanation may spend: CP-SAT solves, and wall-clock seconds as a backstop (the
#: fixes not reached are left out, and the text says so).
EXPLAIN_SOLVES = 48
EXPLAIN_BUDGET_S = 40.0
#: Longest single CP-SAT solve of an explanation, and the least worth starting (seconds).
SOLVE_LIMIT_S = 30.0
MIN_SOLVE_S = 0.05


@dataclass(frozen=True)
class Explanation:
    """Why nothing is feasible. ``conflict``: a minimal set of conflicting families (extra
    constraints appear as ``extra: <expr>``); ``min_peak_bytes``: the least memory a legal
    layout needs (when memory is in the conflict); ``min_nodes``: the smallest node count with a
    feasible configuration (None if none up to the scan's limit); ``max_nodes``: a smaller node
    count that fits when the cluster is too large for the batch; ``relaxations``: the single
    changes that make this cluster feasible; ``nearest_gbs``: the nearest global batch that fits
    this cluster (when the batch is in the conflict)."""

    feasible: bool
    conflict: tuple[str, ...] = ()
    min_peak_bytes: int | None = None
    min_peak_config: str | None = None
    limit_bytes: int = 0
    min_nodes: int | None = None
    max_nodes: int | None = None
    nodes_scanned: tuple[int, int] = (0, 0)
    relaxations: tuple[str, ...] = ()
    nearest_gbs: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    setting: str = ""
    gpu: str = ""
    #: the time budget ran out: the fixes not reached are left out (said in the text)
    budget_spent: bool = False
    #: why an extra constraint conflicts with the space alone (e.g. vpp > 1 on a hybrid model)
    notes: tuple[str, ...] = ()

    def text(self) -> str:
        """The explanation as sentences."""
        if self.feasible:
            return "the space has feasible configurations"
        words = ", ".join(
            c if c.startswith("extra:") else f"{FAMILY_WORDS.get(c, c.replace('_', ' '))} [{c}]"
            for c in self.conflict) or "not isolated within the time budget"
        out = [f"no configuration of {self.setting} is legal and fits; conflicting rules: {words}"]
        out += self.notes
        if self.min_peak_bytes is not None:
            out.append(f"memory: the least any legal layout needs is "
                       f"{self.min_peak_bytes / GIB:.1f} GiB per GPU ({self.min_peak_config}), "
                       f"above the limit of {self.limit_bytes / GIB:.1f} GiB")
        fixes = []
        if self.min_nodes is not None:
            fixes.append(f"needs at least {nodes_text(self.min_nodes)} of {self.gpu} at this batch")
        elif self.max_nodes is not None:
            fixes.append(f"fewer nodes fit this global batch, e.g. {self.max_nodes} "
                         f"node{'s' if self.max_nodes != 1 else ''} of {self.gpu}"
                         + ("" if self.nearest_gbs else ", or a larger --gbs"))
        elif self.nodes_scanned[1]:
            fixes.append(f"no node count from {self.nodes_scanned[0]} to "
                         f"{self.nodes_scanned[1]} fits at this batch")
        if self.nearest_gbs is not None:
            fixes.append(f"--gbs {self.nearest_gbs} on this cluster")
        fixes += self.relaxations
        if fixes:
            out.append("fix: " + ", or ".join(fixes))
        if self.budget_spent:
            out.append("(explanation cut at its budget of solver calls: other fixes were not "
                       "tried)")
        return "; ".join(out)


def _assumption_model(problem: Problem, families: Iterable[str]) -> tuple[LegalityModel, dict]:
    """The model with one literal per family (per constraint for ``extra``), for assumptions."""
    lm = LegalityModel(problem, families)
    lits = dict(lm.lit)
    if "extra" in lits and problem.constraints:
        # one literal per constraint, so the conflict names the constraint; the family literal
        # is left free (not assumed), which switches the family's own implication off
        del lits["extra"]
        for con, ok in zip(problem.constraints, lm.extra_ok, strict=True):
            lit = lm.cp.NewBoolVar(f"extra: {con.expr}")
            if isinstance(ok, int):
                if not ok:
                    lm.cp.AddBoolOr([lit.Not()])
            else:
                lm.cp.AddImplication(lit, lm.ar.literal(ok))
            lits[f"extra: {con.expr}"] = lit
    return lm, lits


def _solve(lm: LegalityModel, assumptions: list, time_limit_s: float) -> int:
    lm.cp.ClearAssumptions()
    lm.cp.AddAssumptions(assumptions)
    solver = single_solve_solver(time_limit_s)
    return solver.Solve(lm.cp)


def conflicting_families(problem: Problem, families: Iterable[str] | None = None,
                         time_limit_s: float = 30.0,
                         deadline: Budget | None = None) -> tuple[str, ...] | None:
    """A minimal set of conflicting families, or None when the space is feasible; ``()`` when
    CP-SAT cannot decide within the time; not minimised further once ``deadline`` passes."""
    fams = tuple(f for f in RULES if f in set(families or RULES) and f not in SEARCH_ONLY)
    lm, lits = _assumption_model(problem, fams)
    names = list(lits)
    lm.cp.ClearAssumptions()
    lm.cp.AddAssumptions([lits[n] for n in names])
    solver = single_solve_solver(min(time_limit_s, _left(deadline, time_limit_s)))
    status = solver.Solve(lm.cp)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    _refuse_invalid(lm, status)
    if status != cp_model.INFEASIBLE:
        return ()
    index = {lits[n].Index(): n for n in names}
    core = [index[i] for i in solver.SufficientAssumptionsForInfeasibility()]
    # deletion: drop every assumption the conflict does not need, legality rules first so the
    # conflict keeps what the user can change (memory, extra constraints) when possible
    order = sorted(core, key=lambda n: (n == "hbm" or n.startswith("extra"), names.index(n)))
    for n in order:
        trial = [lits[x] for x in core if x != n]
        try:
            limit = _left(deadline, time_limit_s)
        except _OutOfTime:
            break
        if _solve(lm, trial, limit) == cp_model.INFEASIBLE:
            core.remove(n)
    return tuple(sorted(core, key=names.index))


def least_memory(problem: Problem, families: Iterable[str] | None = None,
                 time_limit_s: float = 30.0,
                 deadline: Budget | None = None) -> tuple[int, str] | None:
    """The least peak bytes of any configuration passing every family but ``hbm`` (and the
    search-only ones), with that configuration's label; None if there is none."""
    fams = [f for f in RULES if f in set(families or RULES)
            and f not in ("hbm", *SEARCH_ONLY)] + ["hbm"]
    lm = LegalityModel(problem, fams)
    for f, lit in lm.lit.items():
        lm.cp.Add(lit == (0 if f == "hbm" else 1))
    mem = lm.memory
    if len(mem.scenarios) != 1:
        return None
    (s,) = mem.scenarios
    totals = [t[s] for t in mem.totals]
    hi = max(t if isinstance(t, int) else t.hi for t in totals)
    peak = lm.cp.NewIntVar(0, hi, "peak")
    lm.cp.AddMaxEquality(peak, [t if isinstance(t, int) else t.expr for t in totals])
    lm.cp.Minimize(peak)
    solver = single_solve_solver(_left(deadline, time_limit_s))
    status = solver.Solve(lm.cp)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    values = solved_axes(solver, lm)
    cfg = problem.resolve(lm.candidate(values))
    rc = lm.candidate(values)["recompute"]
    return solver.Value(peak), f"{cfg.label()} mbs {cfg.mbs} recompute {rc.label()}"


def feasible(problem: Problem, families: Iterable[str] | None = None,
             time_limit_s: float = 30.0) -> bool:
    """Whether the space has at least one feasible configuration (one CP-SAT solve)."""
    fams = [f for f in RULES if f in set(families or RULES) and f not in SEARCH_ONLY]
    lm = LegalityModel(problem, fams)
    for lit in lm.lit.values():
        lm.cp.Add(lit == 1)
    solver = single_solve_solver(time_limit_s)
    status = solver.Solve(lm.cp)
    _refuse_invalid(lm, status)
    if status == cp_model.UNKNOWN:
        raise _OutOfTime  # undecided within the time: the caller leaves this fix out
    return status != cp_model.INFEASIBLE


def _refuse_invalid(lm: LegalityModel, status: int) -> None:
    """CP-SAT refuses a model whose numbers leave its 64-bit range (dimensions far beyond any
    real model): a one-line input error, not a crash."""
    if status == cp_model.MODEL_INVALID:
        why = " ".join(lm.cp.Validate().split())[:200]
        m = lm.p.model
        raise ConfigError(f"model {m.name!r} (hidden_size {m.hidden_size}, "
                          f"{m.num_attention_heads} heads, vocab {m.vocab_size}) is too large for "
                          f"the solver's 64-bit arithmetic ({why})")


SpaceFor = Callable[[ClusterSpec], SearchSpace]


def default_space_for(problem: Problem) -> SpaceFor:
    """The default search space of another cluster with the problem's model, training and
    options (what the node-count scans and the node-size check rebuild)."""
    return lambda c: default_space(problem.model, c, problem.training,
                                   allow_cross_scale_up=problem.allow_cross_scale_up,
                                   grad_reduce_in_fp32=problem.space.grad_reduce_in_fp32,
                                   fp8_param_gather=problem.space.fp8_param_gather,
                                   optimizer_state=problem.space.optimizer_state)


def relaxations(problem: Problem, families: Iterable[str] | None = None,
                default: SearchSpace | None = None, deadline: Budget | None = None) -> list[str]:
    """Single changes, in the user's terms, that make ``problem`` feasible on its cluster."""
    sp, model, training = problem.space, problem.model, problem.training
    default = default or default_space_for(problem)(problem.cluster)
    trials: list[tuple[str, Problem]] = []
    rc = list(sp.recompute)
    if not any(o.kind is Recompute.FULL for o in rc):
        k_max = max_layers_per_chunk(model, sp.pp, sp.vpp)
        full = [RecomputeOption(kind=Recompute.FULL, layers=k) for k in recompute_layer_values(k_max)]
        trials.append(("full recompute", problem.replace(
            space=sp.with_domains(recompute=tuple(rc + full)))))
    sel = [o for o in selective_options(model, training) if o not in rc]
    if sel:
        trials.append(("selective recompute", problem.replace(
            space=sp.with_domains(recompute=tuple(rc + sel)))))
    if OptimizerChoice.FSDP not in sp.optimizer:
        trials.append(("FSDP (--fsdp)", problem.replace(
            space=sp.with_domains(optimizer=(*sp.optimizer, OptimizerChoice.FSDP)))))
    if 1 not in sp.mbs:
        trials.append(("micro-batch size 1", problem.replace(
            space=sp.with_domains(mbs=(1, *sp.mbs)))))
    for axis in AXES:
        if axis in ("recompute", "optimizer", "mbs"):
            continue
        mine, theirs = getattr(sp, axis), getattr(default, axis)
        if len(mine) == 1 and len(theirs) > 1:
            update = {axis: theirs}
            if axis == "etp":
                update["etp_policy"] = default.etp_policy
            trials.append((f"{axis.replace('_', ' ')} left free", problem.replace(
                space=sp.with_domains(**update))))
    if problem.memory_margin > 0:
        trials.append(("--memory-margin 0", problem.replace(memory_margin=0.0)))
    for con in problem.constraints:
        trials.append((f"without constraint '{con.expr}'", problem.replace(
            constraints=tuple(c for c in problem.constraints if c is not con))))
    out = []
    for label, p in trials:
        try:
            if feasible(p, families, time_limit_s=_left(deadline)):
                out.append(label)
        except _OutOfTime:
            break
    return out


def nearest_batch(problem: Problem, families: Iterable[str] | None = None,
                  tries: int = 4, deadline: Budget | None = None) -> int | None:
    """The global batch nearest the problem's (ties: the larger), within a factor of two, that
    has a feasible configuration on the same cluster and space. Candidates are the multiples of
    each data-parallel size the space allows (world / (tp x pp x cp)) nearest the batch, tried
    by distance."""
    gbs, world, sp = problem.training.global_batch_size, problem.cluster.world_size, problem.space
    model_ranks = {tp * pp * cp for tp in sp.tp for pp in sp.pp for cp in sp.cp}
    near: set[int] = set()
    for dp in (world // r for r in model_ranks if world % r == 0):
        low = gbs // dp * dp
        near |= {v for v in (low, low + dp) if gbs // 2 <= v <= 2 * gbs and v != gbs}
    for g in sorted(near, key=lambda v: (abs(v - gbs), -v))[:tries]:
        training = problem.training.model_copy(update={"global_batch_size": g})
        try:
            if feasible(problem.replace(training=training), families,
                        time_limit_s=_left(deadline)):
                return g
        except _OutOfTime:
            return None
    return None


def usual_node(problem: Problem, families: Iterable[str] | None = None,
               space_for: SpaceFor | None = None, deadline: Budget | None = None) -> int | None:
    """The GPU's usual GPUs per node when the cluster uses another count and the usual one,
    at the same node count, has a feasible configuration."""
    cl = problem.cluster
    usual = cl.gpu.gpus_per_node
    if not usual or usual == cl.gpus_per_node:
        return None
    cluster = cl.model_copy(update={"gpus_per_node": usual})
    space_for = space_for or default_space_for(problem)
    try:
        return usual if feasible(problem.replace(cluster=cluster, space=space_for(cluster)),
                                 families, time_limit_s=_left(deadline)) else None
    except (_OutOfTime, ValueError):
        return None


def min_nodes(problem: Problem, families: Iterable[str] | None = None,
              space_for: SpaceFor | None = None, max_nodes: int | None = None,
              deadline: Budget | None = None) -> tuple[int | None, tuple[int, int]]:
    """The smallest node count above the problem's with a feasible configuration (same GPU,
    model, batch, options), up to ``max_nodes``; and the range scanned. Bounded: every count up
    to :data:`LINEAR_NODE_SCAN` more nodes, then the counts 2^k and 3 x 2^k above, then bisection between the last
    count that does not fit and the first that does (exact where feasibility grows with the node
    count, as memory does); at most about 40 solves, and none after ``deadline``."""
    cl = problem.cluster
    space_for = space_for or default_space_for(problem)
    top = max_nodes or min(cl.num_nodes * MAX_NODE_FACTOR, 4096)

    def fits(n: int) -> bool:
        cluster = cl.model_copy(update={"num_nodes": n})
        try:
            p = problem.replace(cluster=cluster, space=space_for(cluster))
        except ValueError:  # beyond the largest cluster a spec allows
            return False
        return feasible(p, families, time_limit_s=_left(deadline))

    last_bad = cl.num_nodes
    try:
        for n in range(cl.num_nodes + 1, min(top, cl.num_nodes + LINEAR_NODE_SCAN) + 1):
            if fits(n):
                return n, (cl.num_nodes + 1, n)
            last_bad = n
        n = last_bad
        while n < top:
            # the next 2^k or 3 x 2^k above n: batches are usually powers of two, and a doubling
            # from an odd count (17, 34, 68, ...) would step over every count that divides them
            n = min(_next_smooth(n), top)
            if fits(n):
                lo, hi = last_bad, n  # lo does not fit, hi does
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if fits(mid) else (mid, hi)
                return hi, (cl.num_nodes + 1, hi)
            last_bad = n
    except _OutOfTime:
        return None, (cl.num_nodes + 1, last_bad)
    return None, (cl.num_nodes + 1, top)


def _next_smooth(n: int) -> int:
    """The smallest 2^k or 3 x 2^k above ``n`` (17 -> 24, 24 -> 32, 32 -> 48)."""
    p = 1 << (n.bit_length() - 1)  # the largest power of two <= n
    return 3 * p // 2 if n < 3 * p // 2 and p > 1 else 2 * p if n < 2 * p else 3 * p


def divisors_of(n: int) -> list[int]:
    """The divisors of ``n`` in O(sqrt n)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def max_nodes_below(problem: Problem, families: Iterable[str] | None = None,
                    space_for: SpaceFor | None = None,
                    deadline: Budget | None = None) -> int | None:
    """A smaller node count that fits when the cluster is too large for the batch: the largest
    feasible one among the powers of two and the divisors of the global batch below the
    problem's node count (feasibility is not monotone in the node count — divisibility — so this
    is an example, not a bound); the :data:`MAX_NODE_PROBES` largest candidates are tried."""
    cl = problem.cluster
    space_for = space_for or default_space_for(problem)
    gbs = problem.training.global_batch_size
    candidates = {1 << k for k in range(cl.num_nodes.bit_length())}
    candidates |= set(divisors_of(gbs))
    tried = sorted((c for c in candidates if c < cl.num_nodes), reverse=True)[:MAX_NODE_PROBES]
    try:
        for n in tried:
            cluster = cl.model_copy(update={"num_nodes": n})
            if feasible(problem.replace(cluster=cluster, space=space_for(cluster)), families,
                        time_limit_s=_left(deadline)):
                return n
    except _OutOfTime:
        return None
    return None


class _OutOfTime(Exception):
    """The explanation's time budget is spent (the remaining fixes are left out)."""


class Budget:
    """What one explanation may spend: CP-SAT solves (the bound that keeps explanations the
    same on a busy machine) and, as a backstop, wall-clock seconds."""

    def __init__(self, solves: int = EXPLAIN_SOLVES, seconds: float = EXPLAIN_BUDGET_S) -> None:
        self.solves, self.deadline, self.spent = solves, time.monotonic() + seconds, False

    def take(self, cap: float) -> float:
        """Seconds the next solve may take; :class:`_OutOfTime` when the budget is spent."""
        left = self.deadline - time.monotonic()
        if self.solves <= 0 or left <= MIN_SOLVE_S:
            self.spent = True
            raise _OutOfTime
        self.solves -= 1
        return min(cap, left)


def _left(budget: Budget | None, cap: float = SOLVE_LIMIT_S) -> float:
    """Seconds one solve may take within ``budget`` (:class:`_OutOfTime` when it is spent)."""
    return cap if budget is None else budget.take(cap)


def explain_infeasible(problem: Problem, families: Iterable[str] | None = None, *,
                       space_for: SpaceFor | None = None, max_nodes: int | None = None,
                       budget_s: float | None = None,
                       progress: Callable[[str], None] | None = None) -> Explanation:
    """Explain an empty feasible set (see the module docstring). ``space_for`` rebuilds the
    space for another cluster (default: :func:`~solver.space.default_space`); ``progress`` is
    told each step as it starts (what it looks for, in words)."""
    say = progress or (lambda _what: None)
    t0 = time.perf_counter()
    say("the conflicting rules")
    cl = problem.cluster
    setting = (f"{problem.model.name} on {cl.num_nodes} x {cl.gpus_per_node} {cl.gpu.name} "
               f"(seq {problem.training.seq_len}, gbs {problem.training.global_batch_size})")
    deadline = Budget(seconds=EXPLAIN_BUDGET_S if budget_s is None else budget_s)
    core = conflicting_families(problem, families, deadline=deadline)
    t1 = time.perf_counter()
    if core is None:
        return Explanation(feasible=True, setting=setting)
    if "hbm" in core:
        say("the least memory any legal layout needs")
    try:
        least = least_memory(problem, families, deadline=deadline) if "hbm" in core else None
    except _OutOfTime:
        least = None
    t2 = time.perf_counter()
    n, n_max, scanned = None, None, (0, 0)
    if "batch" in core and "hbm" not in core and problem.cluster.num_nodes > 1:
        say("the largest node count the batch divides over")
        n_max = max_nodes_below(problem, families, space_for, deadline=deadline)
    elif set(core) & NODE_BOUND:
        say("the smallest node count that fits")
        n, scanned = min_nodes(problem, families, space_for, max_nodes, deadline=deadline)
    t3 = time.perf_counter()
    say("which relaxations would fix it")
    relax = relaxations(problem, families, deadline=deadline)
    gbs = nearest_batch(problem, families, deadline=deadline) if "batch" in core else None
    if (gpn := usual_node(problem, families, space_for, deadline=deadline)) is not None:
        relax.append(f"--gpus-per-node {gpn} (usual {cl.gpu.name} node)")
    budget_spent = deadline.spent
    t4 = time.perf_counter()
    notes = []
    if problem.model.is_hybrid and any(c.startswith("extra:") and re.search(r"\bvpp\b", c)
                                       for c in core):
        # solver/space.py::default_space offers vpp 1 only for hybrid models (the
        # pipeline_split rule rejects every vpp > 1), so the constraint conflicts with the space
        notes.append(f"{problem.model.name} is a hybrid Mamba model: Megatron-Core splits its "
                     f"layer pattern over pp stages without virtual stages (rule "
                     f"pipeline_split), so vpp is 1 in every legal configuration")
    return Explanation(
        feasible=False, conflict=core,
        min_peak_bytes=least[0] if least else None, min_peak_config=least[1] if least else None,
        limit_bytes=problem.limit_bytes, min_nodes=n, max_nodes=n_max, nodes_scanned=scanned,
        relaxations=tuple(relax), nearest_gbs=gbs, setting=setting, gpu=cl.gpu.name,
        budget_spent=budget_spent, notes=tuple(notes),
        timings={"conflict": t1 - t0, "least_memory": t2 - t1, "nodes": t3 - t2,
                 "relaxations": t4 - t3, "total": t4 - t0},
    )
