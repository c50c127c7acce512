"""The search: baseline -> seed phase -> exhaustive ranking of the feasible set -> LLM phase.

Every candidate of every phase is judged by the same solver (legality, exact memory) and the
same oracle (projection). Without an LLM the exhaustive ranking is the answer; the seed phase
still runs so that each gain over the baseline is attributed to a change, and the regret says
how far the single-axis moves got from the oracle's optimum.

Distinct configurations and the answer (:func:`group_ranked`, :func:`choose_answer`): each
projection carries an 80 % interval from the out-of-fold residuals of its class
(:mod:`oracle.uncertainty`). Configurations whose adjusted projections lie within
:data:`GROUP_TOLERANCE` of each other cannot be told apart by the oracle and are one row, headed by
its least exotic member (:func:`exotic_key`), its variants listed. The answer is the configuration
with the highest lower bound of its interval (the class's 10th percentile x the adjusted
projection); lower bounds within :data:`ANSWER_TIE` of it are a tie, broken by the least
exotic. Rows whose projection is within the near-tie band of the answer (the median error with
which the out-of-fold projections order two published configurations of one model, GPU and
source, from the residuals file) are marked as near ties: a short run should decide between them.

Ranking: projected tokens/s/GPU, adjusted by preferences (soft objectives, from ``--prefer`` or
the LLM planner reading ``--goal``): each preference is a condition with a weight ``w`` (the
share of throughput worth giving up for it); a configuration that does not satisfy it scores
``tokens/s x (1 - w)``. The report says what each preference cost in projected throughput.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tune_cp.agent import backend
from tune_cp.agent.baseline import Reference, find_reference, reference_training_matches
from tune_cp.agent.evaluate import Evaluator, Trial
from tune_cp.agent.llm import (
    MAX_ITEMS,
    LlmBudget,
    LlmReport,
    LlmRound,
    PlannerHints,
    run_llm_phase,
)
from tune_cp.agent.seed import SeedResult, Step, apply, seed_phase
from tune_cp.config.axes import (
    ATTRIBUTION_FIELDS,
    COMBINATION_AXES,
    INT_AXES,
    KNOB,
    MOE_AXES,
    RECOMPUTE_FIELDS,
    FlagKind,
)
from tune_cp.config.resolve import Columns, as_read, columns_of
from tune_cp.config.specs import (
    DEFAULT_SELECTIVE_MODULES,
    ClusterSpec,
    ConfigError,
    ModelSpec,
    OptimizerState,
    ParallelConfig,
    Recompute,
    RecomputeMethod,
    Schedule,
    TrainingSpec,
    nodes_text,
)
from tune_cp.oracle.inputs import finite, parse_number
from tune_cp.oracle.memory_verdict import Spread, fits_line_bytes
from tune_cp.oracle.projection import score_configs
from tune_cp.oracle.uncertainty import Interval, load_residuals, residuals_for
from tune_cp.oracle.work import ConfigBatch
from tune_cp.solver.constraints import NAMES, HardConstraint, SoftObjective, axis_values
from tune_cp.solver.explain import Explanation, explain_infeasible
from tune_cp.solver.feasible import Enumeration, enumerate_feasible, enumeration_families
from tune_cp.solver.rules import (
    RULES,
    options_problem,
    settings_space_problem,
    training_precision,
)
from tune_cp.solver.settings import RunSettings, SettingsView
from tune_cp.solver.space import (
    OptimizerChoice,
    RecomputeOption,
    SearchSpace,
    default_space,
    searched_optimizers,
)

MAX_PREFERENCE_WEIGHT = 0.5
#: projections closer than this (relative) are one distinct configuration: the oracle cannot tell
#: them apart (the same projection to the precision the table prints, far below the ~8 % median
#: error of the projected ratio of two published runs).
GROUP_TOLERANCE = 0.001
#: lower bounds closer than this (relative) tie for the answer; the least exotic wins.
ANSWER_TIE = 0.005


@dataclass(frozen=True)
class Preference:
    """A soft objective: ``condition`` should hold; ``weight`` (0..0.5) is the share of projected
    throughput worth giving up for it."""

    condition: str
    weight: float
    rationale: str = ""
    origin: str = "user"

    def holds(self, cfg: ParallelConfig) -> bool:
        return SoftObjective.of(self.condition).value(axis_values(cfg)) != 0

    @staticmethod
    def parse(text: str, origin: str = "user") -> Preference:
        """``"ep*etp<=8"`` or ``"ep*etp<=8:0.2"`` (weight after the last colon, default 0.1)."""
        cond, sep, w = text.rpartition(":")
        if not sep:
            cond, w = text, "0.1"
        try:
            weight = parse_number(w.strip(), "weight")
        except ConfigError:
            raise ConfigError(f"preference {text!r}: weight {w!r} is not a number; write "
                              f"'CONDITION:0.1'") from None
        if not (math.isfinite(weight) and 0 < weight <= MAX_PREFERENCE_WEIGHT):
            raise ConfigError(f"preference {text!r}: weight {weight:g} must be in "
                              f"(0, {MAX_PREFERENCE_WEIGHT:g}]")
        obj = SoftObjective.of(cond)
        if obj.kind != "condition":
            raise ConfigError(f"preference {cond!r} must be a condition (e.g. 'ep*etp <= 8')")
        return Preference(obj.expr, weight, origin=origin)


@dataclass(frozen=True)
class SearchOptions(SettingsView):
    """How a search runs: the run's ``settings`` (overheads, margin, cross-scale-up, hard
    constraints, calibration; read as ``opts.memory_margin`` etc.) and the search's own
    options."""

    settings: RunSettings = field(default_factory=RunSettings)
    top_k: int = 10
    preferences: tuple[Preference, ...] = ()
    baseline: ParallelConfig | None = None
    allow_fp8: bool = False
    goal: str = ""
    lm: Any = None  # a DSPy LM, or None to skip the LLM phase
    lm_name: str | None = None
    budget: LlmBudget = field(default_factory=LlmBudget)
    space: SearchSpace | None = None
    #: gradient buffer dtype, fixed for the whole search (not an axis); ``space`` wins if given
    grad_reduce_in_fp32: bool = True
    #: FP8 parameters for the FP8 candidates, fixed for the whole search (not an axis)
    fp8_param_gather: bool = False
    optimizer_state: OptimizerState = field(default_factory=OptimizerState)
    keep_all_recompute_levels: bool = False
    workers: int = 1  # processes for the enumeration's slices (same set, same order)
    #: also enumerate Megatron-FSDP (``--fsdp``: ``solver.space.searched_optimizers``); ``space``
    #: wins if given
    fsdp: bool = False
    #: called with what the search is doing as each step starts ("enumerating ...",
    #: "explaining why nothing fits: ..."); the CLI draws it on a terminal's stderr
    progress: Callable[[str], None] | None = field(default=None, compare=False, repr=False)

    def say(self, what: str) -> None:
        if self.progress is not None:
            self.progress(what)

    @property
    def families(self) -> tuple[str, ...] | None:
        """Rule families of the enumeration (None: all, dominance of recompute levels included)."""
        if not self.keep_all_recompute_levels:
            return None
        return tuple(f for f in RULES if f != "recompute_dominance")


@dataclass
class Ranked:
    """The feasible set scored by the oracle, best first (adjusted score)."""

    configs: list[ParallelConfig]
    peak_bytes: np.ndarray
    tokens: np.ndarray  # projected tokens/s/GPU
    adjusted: np.ndarray
    order: np.ndarray  # indices, best first
    scores: dict[str, np.ndarray]
    intervals: list[Interval] = field(default_factory=list)  # one per configuration

    @property
    def lower(self) -> np.ndarray:
        """Adjusted score x the interval's low / projected (the lower bound the answer uses)."""
        if not self.intervals:
            return self.adjusted.copy()
        f = np.array([iv.low / iv.projected if iv.projected else 0.0 for iv in self.intervals])
        return self.adjusted * f


@dataclass
class Group:
    """A distinct configuration: ``head`` (its least exotic member) and every member (indices
    into ``Ranked.configs``, best projection first), within :data:`GROUP_TOLERANCE`."""

    head: int
    members: list[int]
    near_tie: bool = False
    answer: bool = False

    @property
    def variants(self) -> list[int]:
        return [i for i in self.members if i != self.head]


@dataclass
class SearchResult:
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    options: SearchOptions
    enumeration: Enumeration
    ranked: Ranked
    baseline: Trial | None
    baseline_source: str
    seed: SeedResult | None
    best: Trial
    best_phase: str
    exhaustive_best: Trial
    regret: float | None
    attribution: list[Step]
    llm: LlmReport
    preference_costs: list[dict[str, Any]]
    trials: list[Trial]
    timings: dict[str, float]
    groups: list[Group] = field(default_factory=list)  # the top distinct configurations
    answer_index: int | None = None  # index into ranked.configs of the rule's answer
    rule: str = ""
    #: the defaults the caller took, stated in the report (the CLI's flags)
    defaults: list[str] = field(default_factory=list)
    near_tie_band: float = 0.0
    interval: Interval | None = None  # of the best
    #: the ``tune-cp check`` line of the best (``agent/report.py::check_command``; the CLI's,
    #: which knows the model and GPU arguments as given)
    check_command: str | None = None

    def best_interval(self) -> Interval | None:
        return self.interval

    @property
    def speedup(self) -> float | None:
        if self.baseline is None or not self.baseline.legal:
            return None
        return speedup(self.best.throughput, self.baseline.throughput)


def speedup(best_tokens: float, baseline_tokens: float) -> float | None:
    """The answer's projected tokens/s/GPU over the baseline's (None without a baseline
    throughput)."""
    return best_tokens / baseline_tokens if baseline_tokens > 0 else None


def regret(agent_lower: float, exhaustive_lower: float) -> float | None:
    """How far the agent phases' best falls short of the exhaustive answer, both by the lower
    bound of their interval: 1 - agent / exhaustive, 0 when the agent does as well or better
    (None when the exhaustive answer has no positive lower bound)."""
    if exhaustive_lower <= 0:
        return None
    return max(0.0, 1.0 - agent_lower / exhaustive_lower)


def adjusted_scores(configs: Sequence[ParallelConfig], tokens: np.ndarray,
                    prefs: Sequence[Preference]) -> np.ndarray:
    out = tokens.astype(float).copy()
    for p in prefs:
        miss = np.array([not p.holds(c) for c in configs], dtype=bool)
        out = np.where(miss, out * (1 - p.weight), out)
    return out


#: Configurations projected per batch by :func:`score_in_chunks`: the projection's work arrays
#: grow with the batch (the backend presets of a large MoE space made 177,372 configurations,
#: 2.6 GB in one batch); chunks of this size keep them bounded with the same figures.
SCORE_CHUNK = 16384


def score_in_chunks(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                    configs: Sequence[ParallelConfig] | Columns, traits: Any,
                    calibration: str | None) -> dict[str, Any]:
    """``score_configs`` of ``configs`` (resolved configurations, or their resolved
    :class:`config.resolve.Columns`) in batches of :data:`SCORE_CHUNK`, concatenated (the
    per-configuration arrays; a value that is not one, from the first batch)."""
    n = len(configs)
    chunks = [configs[i:i + SCORE_CHUNK] if not isinstance(configs, Columns)
              else configs.take(slice(i, i + SCORE_CHUNK)) for i in range(0, n, SCORE_CHUNK)]
    parts = [score_configs(model, cluster, training,
                           ConfigBatch.of(c, traits) if isinstance(c, Columns)
                           else ConfigBatch.from_configs(c, traits), calibration)
             for c in chunks]
    if len(parts) == 1:
        return parts[0]
    out: dict[str, Any] = {}
    for k, v in parts[0].items():
        per_config = np.ndim(v) and all(len(p[k]) == len(c)
                                        for p, c in zip(parts, chunks, strict=True))
        out[k] = np.concatenate([np.asarray(p[k]) for p in parts]) if per_config else v
    return out


def rank_feasible(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                  enum: Enumeration, prefs: Sequence[Preference], calibration: str | None,
                  traits: Any = None, settings: Any = None) -> Ranked:
    """``traits``: the run's :class:`oracle.work.RunTraits` (None: the defaults);
    ``settings``: the run's ``RunSettings``, given when each layout of an MoE model takes its
    fastest MoE backend preset (``agent/backend.py``; None: the layouts as enumerated). The
    projection reads the enumeration's resolved columns; a configuration is built only for the
    layouts' chosen presets."""
    configs = [fc.config for fc in enum.configs]
    peak = np.array([fc.peak_bytes for fc in enum.configs], dtype=np.int64)
    cols = enum.columns
    if cols is None or len(cols) != len(configs):
        cols = as_read(columns_of(configs)) if configs else None
    if configs and settings is not None and model.is_moe:
        owner, which, wide_peak = backend.expand_rows(model, cluster, training, configs, peak,
                                                      settings)
        wide = backend.expanded_columns(model, cluster, cols, owner, which)
        scores = score_in_chunks(model, cluster, training, wide, traits, calibration)
        pick = backend.best_per_layout(np.asarray(scores["tokens_per_s_per_gpu"]), owner,
                                       len(configs))
        configs = [backend.preset_config(model, cluster, configs[int(owner[j])],
                                         int(which[j])) for j in pick]
        peak = wide_peak[pick]
        scores = {k: (np.asarray(v)[pick] if np.ndim(v) and len(v) == len(wide) else v)
                  for k, v in scores.items()}
        tokens = np.asarray(scores["tokens_per_s_per_gpu"], dtype=float)
    elif configs:
        scores = score_in_chunks(model, cluster, training, cols, traits, calibration)
        tokens = np.asarray(scores["tokens_per_s_per_gpu"], dtype=float)
    else:
        scores, tokens = {}, np.zeros(0)
    adj = adjusted_scores(configs, tokens, prefs)
    # best first; ties broken by the enumeration's deterministic order
    order = np.lexsort((np.arange(len(adj)), -adj)) if len(adj) else np.zeros(0, dtype=int)
    intervals = residuals_for(calibration).intervals(model, cluster, training, configs,
                                                     tokens) if configs else []
    return Ranked(configs, peak, tokens, adj, order, scores, intervals)


def exotic_key(c: ParallelConfig) -> tuple:
    """How exotic a configuration is, least first: the number of mechanisms beyond a plain
    layout it uses (interleaving, context parallelism, FP8, a zero-bubble schedule, FSDP), then
    the interleaving depth, CP size, pipeline and tensor sizes and micro-batch."""
    used = (c.vpp > 1, c.cp > 1, c.fp8_recipe is not None, c.schedule is Schedule.ZERO_BUBBLE,
            bool(c.fsdp))
    return (sum(used), c.vpp, c.cp, c.pp, c.tp, c.mbs)


def memory_fits(ranked: Ranked, hbm_bytes: int, spread: Spread) -> np.ndarray:
    """Which ranked configurations are in the memory state *fits* (``oracle/memory_verdict.py``:
    the predicted peak times the largest measured overhead of ``spread`` -- the run's framework
    family, ``RunSettings.memory_spread`` -- within HBM), as a boolean array."""
    return ranked.peak_bytes <= fits_line_bytes(hbm_bytes, spread)


def choose_answer(ranked: Ranked, fits: np.ndarray | None = None, edge_band: float = 0.0) -> int:
    """Index of the rule's answer: the highest lower bound; lower bounds within
    :data:`ANSWER_TIE` of it tie, and the least exotic of those wins (then the higher projection,
    then the enumeration order). With ``fits`` (:func:`memory_fits`) the memory verdict comes
    first: the answer is the best configuration that fits, unless the best one at the edge of
    memory has a lower bound more than ``edge_band`` (the near-tie band: the oracle can tell the
    two apart) above it (:func:`edge_worth_it`). An edge configuration is legal but may not fit
    on the cluster: it is worth that risk only for a gain the oracle can resolve."""
    low = ranked.lower

    def best_of(pool: np.ndarray) -> int:
        top = float(low[pool].max())
        tied = pool[low[pool] >= top * (1 - ANSWER_TIE)]
        return int(min(tied, key=lambda i: (exotic_key(ranked.configs[i]), -ranked.adjusted[i],
                                            i)))

    best = best_of(np.arange(len(low)))
    if fits is None or not fits.any() or fits[best]:
        return best
    fitting = best_of(np.flatnonzero(fits))
    return best if edge_worth_it(float(low[best]), float(low[fitting]), edge_band) else fitting


def edge_worth_it(edge_lower: float, fit_lower: float, edge_band: float) -> bool:
    """True when the edge configuration (lower bound ``edge_lower``) is worth its memory risk
    over the best one that fits (``fit_lower``): more than ``edge_band`` above it."""
    return edge_lower > fit_lower * (1 + edge_band)


def group_ranked(ranked: Ranked, k: int, answer: int, near_tie_band: float) -> list[Group]:
    """The first ``k`` distinct configurations, best projection first: consecutive configurations
    in the ranking within :data:`GROUP_TOLERANCE` of the group's first member are one group,
    headed by its least exotic member (the answer heads the group it is in)."""
    groups: list[Group] = []
    top_score = 0.0
    for i in (int(x) for x in ranked.order):
        s = float(ranked.adjusted[i])
        if groups and s >= top_score * (1 - GROUP_TOLERANCE):
            groups[-1].members.append(i)
            continue
        if len(groups) == k:
            break
        groups.append(Group(i, [i]))
        top_score = s
    ans_score = float(ranked.adjusted[answer])
    for g in groups:
        g.head = answer if answer in g.members else min(
            g.members, key=lambda i: (exotic_key(ranked.configs[i]), -ranked.adjusted[i], i))
        g.answer = answer in g.members
        s = float(ranked.adjusted[g.members[0]])
        g.near_tie = not g.answer and abs(s / ans_score - 1) <= near_tie_band if ans_score else False
    return groups


def near_tie_band() -> float:
    """The near-tie band: the median relative error of the projected ratio of two published
    configurations (same model, GPU and source) in the out-of-fold residuals."""
    pw = load_residuals().data.get("pairwise", {})
    return float(np.exp(pw.get("median_abs_log_ratio_error", 0.0)) - 1)


ANSWER_RULE = ("the answer is the configuration with the highest lower bound of its 80% interval "
               "that fits memory (one at the edge of memory only when its lower bound is above it "
               "by more than the near-tie band; lower bounds within 0.5% tie, the least exotic wins: fewest of interleaving, CP, "
               "FP8, zero-bubble, FSDP, then the shallowest interleaving and smallest CP)")


def default_baseline(ranked: Ranked, full_recompute: bool = True) -> ParallelConfig:
    """The stated default when no baseline is given or known: the conservative configuration a
    practitioner launches first — the feasible layout with micro-batch 1, no context parallelism
    and no virtual stages that uses the fewest model-parallel GPUs (tp x pp, smaller pp first, the
    largest expert parallelism), with full recomputation of every layer (the least memory that
    layout can use, so it stays legal); without such a layout, the feasible configuration with the
    least recomputation and the fewest model-parallel GPUs. ``full_recompute=False`` (hybrid
    Mamba models have no full recomputation, ``solver/rules.py::recompute``): that layout with
    the recomputation it has in the feasible set."""
    def key(i: int) -> tuple:
        c = ranked.configs[i]
        return (c.tp * c.pp * c.cp, c.pp, c.tp, -c.ep, c.etp_, c.mbs, c.vpp, i)

    plain = [i for i, c in enumerate(ranked.configs) if c.mbs == 1 and c.cp == 1 and c.vpp == 1]
    if plain:
        c = ranked.configs[min(plain, key=key)]
        if not full_recompute:
            return c
        return c.model_copy(update={"recompute": Recompute.FULL, "recompute_layers": None,
                                    "recompute_method": RecomputeMethod.BLOCK,
                                    "recompute_modules": DEFAULT_SELECTIVE_MODULES})
    level = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2}
    return ranked.configs[min(range(len(ranked.configs)),
                              key=lambda i: (level[ranked.configs[i].recompute], key(i)))]


#: The dispatcher as one change of the attribution: its library and the fp32 router that
#: Primus-Turbo's DeepEP needs go with it (each alone may be illegal: solver/rules.py
#: backend_problems).
DISPATCH_FIELDS = ("dispatcher", "flex_backend", "router_fp32")


def _change_keys(f: str) -> tuple[str, ...]:
    """The configuration fields one attribution change sets."""
    if f == "recompute":
        return RECOMPUTE_FIELDS
    return DISPATCH_FIELDS if f == "dispatcher" else (f,)


def _effective(cfg: ParallelConfig | dict[str, Any], f: str) -> Any:
    """The value of change ``f`` that matters: recomputation as one change, its method and
    depth only under full recomputation and its modules only under selective."""
    get = cfg.get if isinstance(cfg, dict) else lambda k: getattr(cfg, k)
    if f == "dispatcher":
        return tuple(get(k) for k in DISPATCH_FIELDS)
    if f != "recompute":
        return get(f)
    kind = get("recompute")
    if kind is Recompute.FULL:
        return kind, get("recompute_method"), get("recompute_layers")
    if kind is Recompute.SELECTIVE:
        return kind, tuple(get("recompute_modules"))
    return (kind,)


def attribute(ev: Evaluator, start: Trial, target: ParallelConfig, phase: str) -> list[Step]:
    """Explain ``target`` as a path of single changes from ``start``: at each step apply the
    change (of those left) that keeps the configuration legal and gains most (when every single
    change loses, the best pair of changes if it does better). A legal change
    that leaves the projection unchanged (e.g. the pipeline split while pp is 1) rides along
    with the next step that moves it; changes that are only legal together end the path as one
    step, at ``target`` itself."""
    fields: tuple[str, ...] = ATTRIBUTION_FIELDS
    if not ev.model.is_moe:
        fields = tuple(f for f in fields if f not in MOE_AXES)
    fields = tuple(f for f in fields if f not in DISPATCH_FIELDS[1:])
    goal = target.model_dump()

    def left(cfg: ParallelConfig) -> list[str]:
        return [f for f in fields if _effective(cfg, f) != _effective(goal, f)]

    cur = start
    todo = left(cur.config)
    steps: list[Step] = []
    riders: list[str] = []  # no-op changes taken, named with the next step
    for _ in range(4 * len(fields)):  # a bound: re-derived fields could otherwise cycle
        if not todo:
            break
        # derived fields already at the goal stay there (apply() would re-derive them, e.g.
        # etp following tp)
        kept = {k: goal[k] for k in ("etp", "pipeline_split") if k not in todo}

        def trial(change: tuple[str, ...], cur: Trial = cur, kept: dict = kept) -> Trial:
            keys = [k for f in change for k in _change_keys(f)]
            return ev.evaluate(apply(cur.config, kept | {k: goal[k] for k in keys}), phase, "")

        trials = [(t.throughput, (f,), t) for f in todo if (t := trial((f,))).legal]
        moving = [x for x in trials if x[0] != cur.throughput]
        if not trials:
            break
        if not moving:
            _, change, t = trials[0]
            riders.append(_change(cur.config, goal, change[0]))
            cur = t
            todo = left(cur.config)
            continue
        best = max(moving, key=lambda x: x[0])
        if best[0] < cur.throughput and len(todo) >= 2:
            # every single change loses: the best pair, when it does better than any single
            # change, reads better than a loss followed by a gain
            pairs = [(t.throughput, (a, b), t) for i, a in enumerate(todo) for b in todo[i + 1:]
                     if (t := trial((a, b))).legal and t.throughput > best[0]]
            if pairs:
                best = max(pairs, key=lambda x: x[0])
        _, change, t = best
        label = " + ".join(riders + [_change(cur.config, goal, f) for f in change])
        riders = []
        steps.append(Step(label, phase, cur.throughput, t.throughput))
        cur = t
        todo = left(cur.config)
    if todo:  # changes only legal together (or a cycle): one last step, at the target
        t = ev.evaluate(target, phase, "")
        label = " + ".join(riders + [_change(cur.config, goal, f) for f in todo])
        steps.append(Step(label, phase, cur.throughput, t.throughput))
    elif riders:
        if steps:
            last = steps[-1]
            steps[-1] = Step(last.move + " + " + " + ".join(riders), last.phase, last.before,
                             last.after)
        else:
            steps.append(Step(" + ".join(riders), phase, start.throughput, cur.throughput))
    return steps


def _change(cfg: ParallelConfig, goal: dict[str, Any], f: str) -> str:
    def show(v: Any) -> str:
        if isinstance(v, tuple):
            return ",".join(v)
        return v.value if hasattr(v, "value") else str(v)

    if f == "recompute":
        def rc(c: dict[str, Any]) -> str:
            if c["recompute"] == Recompute.FULL:
                n = c["recompute_layers"]
                return f"full ({'all' if n is None else n} layer{'s' if n != 1 else ''})"
            if c["recompute"] == Recompute.SELECTIVE:
                return f"selective ({show(c['recompute_modules'])})"
            return "none"
        return f"recompute {rc(cfg.model_dump())} -> {rc(goal)}"
    if f == "dispatcher":
        def disp(c: dict[str, Any]) -> str:
            lib = f" ({show(c['flex_backend'])})" if c["flex_backend"] is not None else ""
            return show(c["dispatcher"]) + lib + (", fp32 router" if c["router_fp32"] else "")
        return f"dispatcher {disp(cfg.model_dump())} -> {disp(goal)}"
    return f"{f} {show(getattr(cfg, f))} -> {show(goal[f])}"


def precision_explanation(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                          refused: Sequence[Any]) -> Explanation:
    """The explanation when the training precision itself is illegal on the GPU."""
    fixes = ["--precision bf16"] + (["--precision fp8"] if cluster.gpu.peak_fp8_flops else [])
    return Explanation(
        feasible=False, conflict=("precision",), relaxations=tuple(fixes), gpu=cluster.gpu.name,
        setting=f"{model.name} on {cluster.num_nodes} x {cluster.gpus_per_node} "
                f"{cluster.gpu.name} (seq {training.seq_len}, gbs {training.global_batch_size}, "
                f"{training.precision.value}: {refused[0].message})")


def search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
           opts: SearchOptions, *, enum: Enumeration | None = None) -> SearchResult:
    """Run the whole search. Raises :class:`NoFeasibleConfiguration` (with an explanation)
    when nothing is legal.

    ``enum``: the feasible set of this search's space when it is enumerated already (``tune-cp
    plan`` enumerates each node count once, for its smallest-cluster search and its table; its
    removal counts may be left out); everything after the enumeration runs as without it, so
    plan, search and sweep give one answer at one node count."""
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    problem = options_problem(model, opts.settings.options)  # run settings no layout can fix
    if problem:
        raise ConfigError(problem)
    refused = training_precision(cluster, training)
    if refused:  # no layout can fix it: say so before enumerating
        raise NoFeasibleConfiguration(precision_explanation(model, cluster, training, refused))
    space = opts.space or default_space(model, cluster, training,
                                        allow_cross_scale_up=opts.allow_cross_scale_up,
                                        grad_reduce_in_fp32=opts.grad_reduce_in_fp32,
                                        optimizers=searched_optimizers(opts.fsdp),
                                        fp8_param_gather=opts.fp8_param_gather,
                                        optimizer_state=opts.optimizer_state)
    # what Megatron-Core refuses under the framework run settings is the family run_settings;
    # settings that leave no recomputation option or dispatcher at all are an input error
    problem = settings_space_problem(space, opts.settings.options)
    if problem:
        raise ConfigError(problem)
    if enum is None:
        opts.say(f"enumerating {space.size():,} candidates (CP-SAT)")
        enum = enumerate_feasible(model, cluster, training, space, settings=opts.settings,
                                  families=opts.families, workers=opts.workers)
    elif enum.problem.space != space or enum.families != enumeration_families(opts.families):
        raise ValueError("search(enum=...): the enumeration is not of this search's space and "
                         "rule families")
    timings["enumerate_s"] = time.perf_counter() - t0
    if enum.empty:
        raise NoFeasibleConfiguration(explain_infeasible(
            enum.problem, progress=lambda what: opts.say(f"nothing fits; finding {what}")))
    opts.say(f"ranking {len(enum.configs):,} legal configurations")
    t1 = time.perf_counter()
    prefs = list(opts.preferences)
    traits = opts.settings.traits
    ranked = rank_feasible(model, cluster, training, enum, prefs, opts.calibration, traits,
                           opts.settings)
    timings["rank_s"] = time.perf_counter() - t1

    ev = Evaluator(model, cluster, training, opts.settings,
                   projector=_projector(opts.calibration, traits),
                   batch_projector=_batch_projector(opts.calibration, traits))
    # baseline
    ref: Reference | None = None
    if opts.baseline is not None:
        baseline_cfg, source = opts.baseline, "given"
    else:
        ref = find_reference(model, cluster)
        if ref is not None and reference_training_matches(ref, training):
            baseline_cfg, source = ref.parallel_config(), f"published reference: {ref.name} ({ref.source})"
        else:
            baseline_cfg = default_baseline(ranked, full_recompute=not model.is_hybrid)
            source = ("stated default: the feasible layout with the fewest model-parallel GPUs "
                      "(mbs 1, no cp, no virtual stages, the largest ep), "
                      + ("its feasible recomputation (a hybrid Mamba model has no full "
                         "recomputation)" if model.is_hybrid else
                         "full recompute of every layer"))
            if ref is not None:
                source += (f" (the published reference {ref.name} is for seq {ref.seq_len}, "
                           f"gbs {ref.global_batch_size}, {ref.precision.value})")
    # the gradient dtype is a setting of the problem, not of the baseline
    baseline_cfg = baseline_cfg.model_copy(
        update={"grad_reduce_in_fp32": space.grad_reduce_in_fp32,
                "fp8_param_gather": space.fp8_param_gather,
                "optimizer_state": space.optimizer_state})
    t2 = time.perf_counter()
    opts.say("seed phase: single-axis moves from the baseline")
    seed = seed_phase(ev, baseline_cfg, allow_fp8=opts.allow_fp8)
    timings["seed_s"] = time.perf_counter() - t2
    base = seed.baseline

    fits = memory_fits(ranked, cluster.gpu.hbm_bytes, opts.memory_spread)
    band = near_tie_band()
    top = choose_answer(ranked, fits, band)
    exhaustive = ev.evaluate(ranked.configs[top], "exhaustive",
                             "best of the feasible set (highest lower bound)")
    residuals = residuals_for(opts.calibration)
    # the LLM phase
    reason = "no --lm given: seed phase and exhaustive ranking only"
    if opts.goal:
        reason += ("; the --goal text needs the LLM planner to become objectives (without one, "
                   "write them as --prefer conditions)")
    llm = LlmReport(status="skipped", reason=reason)
    llm_best: Trial | None = None
    if opts.lm is not None:
        opts.say(f"LLM phase ({opts.lm_name or 'lm'}, at most {opts.budget.wall_s:g} s)")
        t3 = time.perf_counter()
        llm, llm_best = _llm_phase(model, cluster, training, opts, space, ev, base, seed,
                                   exhaustive, ranked, prefs)
        timings["llm_s"] = time.perf_counter() - t3

    def adj(t: Trial) -> float:
        return adjusted_scores([t.config], np.array([t.throughput]), prefs)[0] if t.legal else 0.0

    def lower(t: Trial) -> float:
        """The adjusted lower bound (the answer's rule), 0 for an illegal trial."""
        if not t.legal:
            return 0.0
        iv = residuals.interval(model, cluster, training, t.config, t.throughput)
        return adj(t) * (iv.low / iv.projected if iv.projected else 0.0)

    candidates = [("exhaustive", exhaustive), ("seed", seed.best)]
    if llm_best is not None:
        candidates.append(("llm", llm_best))
    # the exhaustive answer wins ties within the rule's ANSWER_TIE (it already took the least
    # exotic of the lower bounds that tie), so an agent phase replaces it only when it is clearly
    # better than the rule's answer, not when it is the oracle's fastest by less than the tie
    fits_line = fits_line_bytes(cluster.gpu.hbm_bytes, opts.memory_spread)

    def fits_memory(t: Trial) -> bool:
        return bool(t.legal and t.outcome.memory is not None
                    and t.outcome.memory.peak_bytes <= fits_line)

    def rule_lower(pt: tuple[str, Trial]) -> float:
        return lower(pt[1]) * (1 + ANSWER_TIE) if pt[0] == "exhaustive" else lower(pt[1])

    # the same rule as choose_answer across the phases: the best that fits, unless the best at
    # the edge of memory is more than the near-tie band above it
    best_phase, best = max(candidates, key=rule_lower)
    fitting = [pt for pt in candidates if fits_memory(pt[1])]
    if fitting and not fits_memory(best):
        fit_phase, fit_best = max(fitting, key=rule_lower)
        if not edge_worth_it(rule_lower((best_phase, best)),
                              rule_lower((fit_phase, fit_best)), band):
            best_phase, best = fit_phase, fit_best
    agent_best = max((seed.best, llm_best) if llm_best else (seed.best,), key=lower)
    shortfall = regret(lower(agent_best), lower(exhaustive))
    attribution = attribute(ev, base, best.config, "attribution") if base.legal else []
    if base.legal and best_phase == "seed":
        attribution = list(seed.steps)
    costs = preference_costs(ranked, prefs)
    groups = group_ranked(ranked, opts.top_k, top, band)
    interval = residuals.interval(model, cluster, training, best.config, best.throughput)
    timings["total_s"] = time.perf_counter() - t0
    return SearchResult(
        model=model, cluster=cluster, training=training, options=opts, enumeration=enum,
        ranked=ranked, baseline=base, baseline_source=source, seed=seed, best=best,
        best_phase=best_phase, exhaustive_best=exhaustive, regret=shortfall,
        attribution=attribution, llm=llm, preference_costs=costs,
        trials=ev.trials, timings=timings, groups=groups, answer_index=top, rule=ANSWER_RULE,
        near_tie_band=band, interval=interval,
    )


class NoFeasibleConfiguration(Exception):
    """Nothing in the space is legal; ``explanation`` says why and what would fit."""

    def __init__(self, explanation: Any) -> None:
        super().__init__(explanation.text())
        self.explanation = explanation


def _projector(calibration: str | None, traits: Any = None):
    from tune_cp.oracle.projection import project

    def run(model, cluster, training, cfg):
        return project(model, cluster, training, cfg, calib=calibration, traits=traits)

    return run


def _batch_projector(calibration: str | None, traits: Any = None):
    from tune_cp.oracle.projection import project_many

    def run(model, cluster, training, cfgs):
        return project_many(model, cluster, training, cfgs, calib=calibration, traits=traits)

    return run


def preference_costs(ranked: Ranked, prefs: Sequence[Preference]) -> list[dict[str, Any]]:
    """For each preference: the best projected throughput with and without it."""
    out = []
    if not len(ranked.tokens):
        return out
    best_all = float(ranked.tokens.max())
    for p in prefs:
        ok = np.array([p.holds(c) for c in ranked.configs], dtype=bool)
        best_ok = float(ranked.tokens[ok].max()) if ok.any() else 0.0
        out.append({"condition": p.condition, "weight": p.weight, "origin": p.origin,
                    "rationale": p.rationale, "best_tokens_per_s_per_gpu_satisfying": best_ok,
                    "best_tokens_per_s_per_gpu": best_all,
                    "cost": 1 - best_ok / best_all if best_all else None})
    return out


# ------------------------------------------------------------------------------ LLM phase


def describe_model(m: ModelSpec) -> str:
    moe = (f", MoE {m.num_experts} experts top-{m.moe_top_k} (expert FFN "
           f"{m.expert_ffn_hidden_size})" if m.is_moe else "")
    return (f"{m.name}: {m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} "
            f"heads / {m.num_kv_heads} KV heads, FFN {m.ffn_hidden_size}, vocab "
            f"{m.vocab_size}{moe}")


def describe_cluster(c: ClusterSpec) -> str:
    g = c.gpu
    return (f"{nodes_text(c.num_nodes)} x {c.gpus_per_node} {g.name} ({c.world_size} GPUs): "
            f"{g.hbm_bytes / 2**30:.0f} GiB HBM, {g.peak_bf16_flops / 1e12:.0f} BF16 TFLOP/s, "
            f"scale-up {g.scale_up_bytes_per_s / 1e9:.0f} GB/s within {c.scale_up_gpus} GPUs, "
            f"NIC {g.nic_bytes_per_s / 1e9:.0f} GB/s per GPU")


def describe_trial(t: Trial) -> str:
    c = t.config
    rc = c.recompute.value + (f"({c.recompute_layers})" if c.recompute == Recompute.FULL else "")
    if not t.legal:
        return f"{c.label()} mbs {c.mbs} recompute {rc}: illegal ({t.outcome.violations[0].message})"
    return (f"{c.label()} mbs {c.mbs} ga {c.ga} recompute {rc}: "
            f"{t.throughput:,.0f} tokens/s/GPU")


def describe_bottleneck(t: Trial) -> str:
    if t.projection is None:
        return "unknown"
    b = t.projection.breakdown
    step = t.projection.step_time_s
    parts = sorted(((v, k) for k, v in b.items() if v > 0), reverse=True)[:6]
    return ", ".join(f"{k} {100 * v / step:.0f}%" for v, k in parts)


def planner_axes(space: SearchSpace) -> str:
    """What the planner is told it may set (``COMBINATION_AXES``, from the axis registry), with
    the search's domain of each integer axis and the values of each choice, and the names its
    expressions may use (``solver.constraints.NAMES``)."""
    parts = []
    for name in COMBINATION_AXES:
        knob = KNOB[name]
        if name == "etp":
            parts.append(f"etp {list(space.etp_all_values)}")
        elif name in INT_AXES:
            parts.append(f"{name} {list(getattr(space, name))}")
        elif knob.choices is not None:
            parts.append(f"{name} ({'/'.join(e.value for e in knob.choices)})")
        elif knob.kind is FlagKind.FLAG:
            parts.append(f"{name} (true/false)")
        else:
            parts.append(name)
    return ", ".join(parts) + f"; names usable in expressions: {' '.join(NAMES)}"


def _llm_phase(model, cluster, training, opts, space, ev, base, seed, exhaustive, ranked, prefs):
    state = {"best": max((seed.best, exhaustive), key=lambda t: t.throughput)}
    axes = planner_axes(space)

    def context(rounds: list[LlmRound]) -> dict[str, str]:
        hist = "\n".join(f"round {r.index}: accepted {r.accepted}; rejected {r.rejected}; "
                         f"results {[x.get('summary') for x in r.results]}" for r in rounds)
        return dict(model=describe_model(model), cluster=describe_cluster(cluster),
                    baseline=describe_trial(base), best_so_far=describe_trial(state["best"]),
                    bottleneck=describe_bottleneck(state["best"]), goal=opts.goal or "",
                    axes=axes, history=hist or "none")

    def explore(hints: PlannerHints, rnd: LlmRound) -> None:
        hard: list[HardConstraint] = []
        for h in hints.hard_constraints[:MAX_ITEMS]:
            try:
                hard.append(HardConstraint.of(h.expr[:300], rationale=h.rationale[:300]))
                rnd.accepted.append(f"constraint {h.expr}")
            except ConfigError as e:
                rnd.rejected.append(f"constraint {h.expr[:80]!r}: {e}")
        for o in hints.soft_objectives[:MAX_ITEMS]:
            try:
                w = finite(o.weight, "weight")  # NaN would survive min/max clamping
                w = min(max(w, 0.01), MAX_PREFERENCE_WEIGHT)
                p = Preference.parse(f"{o.expr[:300]}:{w}", origin="llm")
                prefs.append(Preference(p.condition, p.weight, o.rationale[:300], "llm"))
                rnd.accepted.append(f"preference {p.condition} (weight {p.weight:g})")
            except (ConfigError, ValueError) as e:
                rnd.rejected.append(f"preference {o.expr[:80]!r}: {e}")
        subsets: list[tuple[str, dict[str, Any]]] = [("constraints", {})]
        for comb in hints.combinations[:MAX_ITEMS]:
            bad = [k for k in comb.settings if k not in COMBINATION_AXES]
            if bad:
                rnd.rejected.append(f"combination {comb.settings}: unknown axes {bad}; allowed "
                                    f"{', '.join(COMBINATION_AXES)}")
                continue
            subsets.append(("combination", dict(comb.settings)))
        for kind, settings in subsets:
            if kind == "constraints" and not hard:
                continue
            trial = _explore_subset(model, cluster, training, opts, space, ev, hard, settings, prefs)
            summary = (f"{kind} {settings or [h.expr for h in hard]}: "
                       + (describe_trial(trial) if isinstance(trial, Trial) else trial))
            rnd.results.append({"kind": kind, "settings": settings, "summary": summary})
            if isinstance(trial, Trial) and trial.legal and trial.throughput > state["best"].throughput:
                state["best"] = trial

    report = run_llm_phase(opts.lm, opts.lm_name or "lm", context, explore, opts.budget)
    best = state["best"]
    llm_best = best if any(t is best for t in ev.trials if t.phase == "llm") else None
    return report, llm_best


def pin_settings(space: SearchSpace, settings: dict[str, Any]) -> tuple[SearchSpace, bool]:
    """``space`` with the axes a combination sets pinned to its values (possibly outside the
    default domains), and whether recompute was pinned (then dominance of recompute levels must
    not drop the pinned option). Raises ConfigError / ValueError for values that do not parse."""
    axis_fix = {k: v for k, v in settings.items() if k in INT_AXES}
    out = space.fix(**axis_fix) if axis_fix else space
    domains: dict[str, Any] = {}
    for name, v in settings.items():  # the choice axes (dispatcher, schedule, fp8_recipe)
        knob = KNOB.get(name)
        if knob is not None and knob.kind is FlagKind.CHOICE and knob.axis == name:
            assert knob.choices is not None
            derived = knob.default is None and v in (None, "none", "")  # e.g. BF16: no recipe
            domains[name] = (None if derived else knob.choices(v),)
    if "distributed_optimizer" in settings:
        domains["optimizer"] = (OptimizerChoice.DISTRIBUTED if settings["distributed_optimizer"]
                                else OptimizerChoice.REPLICATED,)
    pinned_rc = any(k in settings for k in RECOMPUTE_FIELDS)
    if pinned_rc:
        kind = Recompute(settings.get("recompute", "full" if "recompute_layers" in settings
                                      else "none"))
        opt = RecomputeOption(
            kind=kind,
            method=RecomputeMethod(settings.get("recompute_method", "block")),
            layers=settings.get("recompute_layers") if kind is Recompute.FULL else None,
            modules=tuple(settings.get("recompute_modules") or ("core_attn",))
            if kind is Recompute.SELECTIVE else (),
        )
        domains["recompute"] = (opt,)
    if domains:
        out = out.with_domains(**domains)
    return out, pinned_rc


def _explore_subset(model, cluster, training, opts, space, ev, hard, settings, prefs):
    """Best configuration of the feasible set narrowed by ``hard`` and ``settings`` (pinned
    axis values, possibly outside the default space): CP-SAT enumerates it with every rule, the
    oracle ranks it."""
    try:
        sub, pinned_rc = pin_settings(space, settings)
    except (ConfigError, ValueError, TypeError) as e:
        return f"rejected: {' '.join(str(e).split())[:200]}"
    families = opts.families
    if pinned_rc:
        families = tuple(f for f in (families or RULES) if f != "recompute_dominance")
    narrowed = opts.settings.with_(constraints=tuple(opts.constraints) + tuple(hard))
    problem = settings_space_problem(sub, narrowed.options)  # as in the exhaustive search
    if problem:
        return f"rejected: {problem}"
    enum = enumerate_feasible(model, cluster, training, sub, settings=narrowed,
                              families=families, count_removed=False)
    configs = [fc.config for fc in enum.configs]
    if not configs:
        return "empty: no legal configuration satisfies it"
    scores = score_configs(model, cluster, training,
                           ConfigBatch.from_configs(configs, opts.settings.traits),
                           opts.calibration)
    adj = adjusted_scores(configs, np.asarray(scores["tokens_per_s_per_gpu"]), prefs)
    best = configs[int(np.argmax(adj))]
    return ev.evaluate(best, "llm", f"llm {settings or 'constraints'}")


__all__ = ["NoFeasibleConfiguration", "Preference", "SearchOptions", "SearchResult", "search"]
