"""What-if capacity planning: for a model and one or several GPU types, the smallest cluster that
fits and, over a range of node counts, the best configuration's projected throughput, the time
to train a number of tokens, GPU-hours and cost.

Each point is the answer of :func:`agent.search.search` at that node count (without the LLM
phase, as ``tune-cp search`` and a sweep without ``--lm``): the feasible set (CP-SAT) ranked by
the oracle, its answer by the search's rule (``agent.search.choose_answer``,
:data:`~agent.search.ANSWER_RULE`: the highest lower bound of the 80% interval, near ties to the
least exotic), against the seed phase's best (single-axis moves from the baseline, which also
try what the space does not hold: the other MoE dispatchers, more selective-recompute sets), by
the same lower bound. Formulas: cluster tokens/s = tokens/s/GPU x
GPUs; time to train T tokens = T / cluster tokens/s; GPU-hours = GPUs x time / 3600; cost =
GPU-hours x price per GPU-hour.

Work is shared across node counts: each node count is enumerated at most once (the
smallest-cluster search and the table read the same enumeration); between the powers of two,
where the enumeration would build one CP-SAT model per (tp, pp) slice (MoE models), the
smallest-cluster search only asks whether anything fits (``solver.feasible.any_feasible``: one
model of the whole space stopped at its first solution, exact). The tables CP-SAT's models read
that do not depend on the cluster are shared by the models of every node count and GPU
(``solver.model.oracle_cache``), as is the pipeline split of each pp x vpp
(``oracle.memory.pipeline_chunks``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tune_cp.agent.serialize import config_json
from tune_cp.config.specs import (
    ClusterSpec,
    ConfigError,
    GpuSpec,
    ModelSpec,
    Precision,
    TrainingSpec,
    nodes_text,
)
from tune_cp.solver.feasible import (
    Enumeration,
    any_feasible,
    default_slice_axes,
    enumerate_problem,
)
from tune_cp.solver.problem import Problem
from tune_cp.solver.rules import settings_space_problem
from tune_cp.solver.settings import RunSettings
from tune_cp.solver.space import default_space, searched_optimizers

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0


@dataclass(frozen=True)
class PlanPoint:
    gpu: str
    nodes: int
    gpus: int
    feasible: int
    config: dict[str, Any] | None
    tokens_per_s_per_gpu: float | None
    mfu: float | None
    peak_bytes: int | None
    cluster_tokens_per_s: float | None
    days: float | None
    gpu_hours: float | None
    cost: float | None
    #: the 80 % interval of tokens_per_s_per_gpu (oracle.uncertainty), as in search --json
    interval: dict[str, Any] | None = None
    #: the search phase that found the configuration (``exhaustive`` or ``seed``), as search's
    #: ``best_phase``
    phase: str | None = None
    #: the chosen configuration's memory state (oracle/memory_verdict.py: fits / at the edge)
    memory_state: str | None = None


@dataclass
class GpuPlan:
    gpu: str
    gpus_per_node: int
    min_nodes: int | None
    points: list[PlanPoint] = field(default_factory=list)
    price_per_gpu_hour: float | None = None
    note: str = ""


def plan_problem(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                 settings: RunSettings, grad_reduce_in_fp32: bool = True,
                 fsdp: bool = False, *, fp8_param_gather: bool = False) -> Problem:
    """The search's problem at ``cluster``: its default space under the run settings (with
    Megatron-FSDP when ``fsdp``, as ``search --fsdp``; ``fp8_param_gather``: the space's fixed
    FP8 parameters, as in a search)."""
    space = default_space(model, cluster, training, grad_reduce_in_fp32=grad_reduce_in_fp32,
                          allow_cross_scale_up=settings.allow_cross_scale_up,
                          optimizers=searched_optimizers(fsdp),
                          fp8_param_gather=fp8_param_gather)
    # what the framework run settings refuse is the family run_settings; settings that leave
    # no recomputation option or dispatcher at all are an input error
    problem = settings_space_problem(space, settings.options)
    if problem:
        raise ConfigError(problem)
    return Problem(model=model, cluster=cluster, training=training, space=space,
                   settings=settings)


def probe(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, settings: RunSettings,
          grad_reduce_in_fp32: bool = True, fsdp: bool = False, *,
          fp8_param_gather: bool = False) -> Enumeration:
    """The feasible set of ``cluster`` (every family, as the search enumerates it)."""
    # the removal counts are not shown: without them the enumeration costs about 40% less
    return enumerate_problem(plan_problem(model, cluster, training, settings,
                                          grad_reduce_in_fp32, fsdp,
                                          fp8_param_gather=fp8_param_gather),
                             count_removed=False)


def plan_point(model: ModelSpec, gpu: GpuSpec, nodes: int, gpus_per_node: int,
               training: TrainingSpec, tokens: float | None, price: float | None,
               settings: RunSettings, grad_reduce_in_fp32: bool = True,
               enum: Enumeration | None = None, fsdp: bool = False, *,
               fp8_param_gather: bool = False) -> PlanPoint:
    """One row: the answer of ``tune-cp search`` at ``nodes`` (``agent.search.search`` without
    the LLM phase, on the enumeration ``enum`` when done already: its :func:`probe`), so a plan's
    row, the search and a sweep's row at one node count are one configuration."""
    from tune_cp.agent.search import NoFeasibleConfiguration, SearchOptions, search
    from tune_cp.oracle.memory_verdict import legal_state

    cluster = ClusterSpec(gpu=gpu, num_nodes=nodes, gpus_per_node=gpus_per_node)
    if enum is None:
        enum = probe(model, cluster, training, settings, grad_reduce_in_fp32, fsdp,
                     fp8_param_gather=fp8_param_gather)
    world = cluster.world_size
    empty = PlanPoint(gpu.name, nodes, world, 0, None, None, None, None, None, None, None, None)
    if enum.empty:
        return empty
    try:
        # the enumeration's own space (the plan's: fsdp and the gradient dtype in it)
        result = search(model, cluster, training,
                        SearchOptions(settings=settings, space=enum.problem.space), enum=enum)
    except NoFeasibleConfiguration:  # not reached: the enumeration is not empty
        return empty
    best = result.best
    assert best.projection is not None and best.outcome.memory is not None
    per_gpu = float(best.throughput)
    cluster_tps = per_gpu * world
    seconds = tokens / cluster_tps if tokens else None
    gpu_hours = world * seconds / SECONDS_PER_HOUR if seconds is not None else None
    return PlanPoint(
        gpu=gpu.name, nodes=nodes, gpus=world, feasible=len(result.enumeration),
        config=config_json(best.config, training), tokens_per_s_per_gpu=per_gpu,
        mfu=float(best.projection.mfu), peak_bytes=int(best.outcome.memory.peak_bytes),
        cluster_tokens_per_s=cluster_tps,
        days=seconds / SECONDS_PER_DAY if seconds is not None else None,
        gpu_hours=gpu_hours, cost=gpu_hours * price if gpu_hours is not None and price else None,
        interval=result.interval.to_json() if result.interval is not None else None,
        phase=result.best_phase,
        memory_state=legal_state(int(best.outcome.memory.peak_bytes), gpu.hbm_bytes,
                                  settings.memory_spread).value,
    )


#: Bytes per parameter of the model state under Megatron's mixed precision (bf16 weight 2,
#: fp32 main gradient 4, fp32 master weight and Adam's two moments 12; Megatron-Core
#: ``distrib_optimizer.py``): only the starting guess of the smallest-cluster search, which the
#: enumerations then confirm or correct (activations, buffers and options are left out).
GUESS_STATE_BYTES_PER_PARAM = 18


def guess_nodes(model: ModelSpec, gpu: GpuSpec, gpus_per_node: int, settings: RunSettings,
                max_nodes: int) -> int:
    """Where the smallest-cluster search starts: the power of two of nodes (at most
    ``max_nodes``) at or above the model state spread over every GPU's usable HBM. A guess:
    the search gallops from it to a bracket of powers of two (infeasible below, feasible above)
    and bisects, as it would from 1 node, with fewer enumerations for large models."""
    from tune_cp.oracle.params import total_params
    from tune_cp.solver.rules import hbm_limit_bytes

    state = total_params(model) * GUESS_STATE_BYTES_PER_PARAM
    per_node = max(1, hbm_limit_bytes(gpu.hbm_bytes, settings.memory_margin) * gpus_per_node)
    need = max(1, -(-state // per_node))
    top = 1 << (max(1, max_nodes).bit_length() - 1)  # the largest power of two <= max_nodes
    return min(1 << (need - 1).bit_length(), top)


def node_counts(min_nodes: int, max_nodes: int, points: int) -> list[int]:
    """``min_nodes`` and the powers of two above it, up to ``max_nodes`` and ``points`` values."""
    out = [min_nodes]
    p = 1
    while p <= min_nodes:
        p *= 2
    while p <= max_nodes and len(out) < points:
        out.append(p)
        p *= 2
    return out


def plan(model: ModelSpec, gpus: Sequence[tuple[GpuSpec, int]], training_for: Callable[[GpuSpec], TrainingSpec],
         *, tokens: float | None = None, prices: dict[str, float] | None = None,
         max_nodes: int = 1024, points: int = 6, settings: RunSettings | None = None,
         progress: Callable[[int, int, str], None] | None = None,
         grad_reduce_in_fp32: bool = True, fsdp: bool = False,
         fp8_param_gather: bool = False) -> list[GpuPlan]:
    """Plan for each ``(gpu, gpus_per_node)``: the smallest node count with a feasible
    configuration (doubling, then bisecting), then a table over node counts.
    ``settings``: the run's overheads, margin, cross-scale-up, constraints and calibration;
    ``grad_reduce_in_fp32``: the gradient buffer's dtype (fp32 default; False: bf16);
    ``fsdp``: Megatron-FSDP in the space too (``search --fsdp``);
    ``fp8_param_gather``: FP8 parameters for the FP8 configurations (``--fp8-param-gather``,
    ``--framework bridge``).

    ``progress(done, total, what)`` is called before each node count is first looked at (probed
    or enumerated): ``done`` node counts looked at so far, ``total`` an estimate of how many
    there will be (exact for a GPU once its smallest node count is known; until then the count
    of the GPUs already planned, else doubling up to ``max_nodes`` and the table), ``what`` the
    GPU and node count. The smallest-cluster search only probes (``any_feasible``); the table's
    node counts are enumerated, once each. The CP-SAT models share the tables that do not depend on
    the cluster (``solver.model.oracle_cache``)."""
    settings = settings or RunSettings()
    counts: list[int] = []  # node counts looked at per GPU planned so far
    first_guess = max_nodes.bit_length() + points

    def plan_gpu(g_index: int, gpu: GpuSpec, gpn: int) -> GpuPlan:
        training = training_for(gpu)
        price = (prices or {}).get(gpu.name)
        problems: dict[int, Problem] = {}  # each node count looked at, its problem
        known: dict[int, bool] = {}  # node count -> has a feasible configuration
        enums: dict[int, Enumeration] = {}  # the table's node counts, each enumerated once
        rows: dict[int, PlanPoint] = {}
        table: list[int] | None = None  # the table's node counts, once the smallest is known

        def estimate() -> int:
            guess = round(sum(counts) / len(counts)) if counts else first_guess
            here = (len(problems) + sum(n not in problems for n in table) if table is not None
                    else max(guess, len(problems) + 1))
            return sum(counts) + here + guess * (len(gpus) - g_index - 1)

        def problem(n: int) -> Problem:
            if n not in problems:
                if progress:
                    progress(sum(counts) + len(problems), estimate(),
                             f"{gpu.name}: {nodes_text(n)}")
                cluster = ClusterSpec(gpu=gpu, num_nodes=n, gpus_per_node=gpn)
                problems[n] = plan_problem(model, cluster, training, settings,
                                           grad_reduce_in_fp32, fsdp,
                                           fp8_param_gather=fp8_param_gather)
            return problems[n]

        def enumeration(n: int) -> Enumeration:
            if n not in enums:
                enums[n] = enumerate_problem(problem(n), count_removed=False)
                # the probe and the enumeration answer the same question (any_feasible)
                assert known.setdefault(n, not enums[n].empty) == (not enums[n].empty)
            return enums[n]

        def feasible(n: int) -> bool:
            if n not in known:
                pr = problem(n)
                if points > 1 and n & (n - 1) == 0 or default_slice_axes(pr.space) == ("pp",):
                    # a power of two that fits is a row of the table (the first power of two
                    # at or above the smallest count): enumerated at once; so is every count
                    # where the enumeration builds one model per pp only (dense models): its
                    # cost is then the probe's, and the smallest count is a row
                    enumeration(n)
                else:  # one model instead of one per (tp, pp) slice (MoE)
                    known[n] = any_feasible(pr)
            return known[n]

        def point(n: int) -> PlanPoint:
            if n not in rows:
                rows[n] = plan_point(model, gpu, n, gpn, training, tokens, price, settings,
                                     grad_reduce_in_fp32, enum=enumeration(n))
            return rows[n]

        try:
            # a bracket lo < smallest <= hi of powers of two (lo infeasible or 0, hi feasible),
            # galloping from the guess: up while infeasible, down while feasible
            hi = guess_nodes(model, gpu, gpn, settings, max_nodes)
            if feasible(hi):
                lo = hi // 2
                while lo >= 1 and feasible(lo):
                    hi, lo = lo, lo // 2
            else:
                lo, hi = hi, hi * 2
                while hi <= max_nodes and not feasible(hi):
                    lo, hi = hi, hi * 2
            if hi > max_nodes:
                return GpuPlan(gpu.name, gpn, None, [], price,
                               f"no feasible configuration up to {max_nodes} nodes")
            while hi - lo > 1:  # smallest feasible in (lo, hi]
                mid = (lo + hi) // 2
                if feasible(mid):
                    hi = mid
                else:
                    lo = mid
            table = node_counts(hi, max_nodes, points)
            return GpuPlan(gpu.name, gpn, hi, [point(n) for n in table], price)
        finally:
            counts.append(len(problems))

    out = [plan_gpu(i, gpu, gpn) for i, (gpu, gpn) in enumerate(gpus)]
    if progress:
        progress(sum(counts), sum(counts), "done")
    return out


def training_for_precision(seq_len: int, gbs: int, precision: Precision) -> Callable[[GpuSpec], TrainingSpec]:
    """The same training setting for every GPU; FP8 falls back to BF16 on GPUs without FP8."""

    def make(gpu: GpuSpec) -> TrainingSpec:
        prec = precision
        if prec is Precision.FP8 and gpu.peak_fp8_flops is None:
            prec = Precision.BF16
        return TrainingSpec(seq_len=seq_len, global_batch_size=gbs, precision=prec)

    return make
