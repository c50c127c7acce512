"""What-if capacity planning: for a model and one or several GPU types, the smallest cluster that
fits and, over a range of node counts, the best configuration's projected throughput, the time
to train a number of tokens, GPU-hours and cost.

Each point is the exhaustive search of :mod:`agent.search` without the agent phases: the
feasible set (CP-SAT) ranked by the oracle. Formulas: cluster tokens/s = tokens/s/GPU x GPUs;
time to train T tokens = T / cluster tokens/s; GPU-hours = GPUs x time / 3600; cost = GPU-hours x
price per GPU-hour.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tune_cp.agent.serialize import config_json
from tune_cp.oracle.specs import ClusterSpec, GpuSpec, ModelSpec, Precision, TrainingSpec
from tune_cp.solver.feasible import enumerate_feasible
from tune_cp.solver.settings import RunSettings, narrow_space
from tune_cp.solver.space import default_space

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


@dataclass
class GpuPlan:
    gpu: str
    gpus_per_node: int
    min_nodes: int | None
    points: list[PlanPoint] = field(default_factory=list)
    price_per_gpu_hour: float | None = None
    note: str = ""


def plan_point(model: ModelSpec, gpu: GpuSpec, nodes: int, gpus_per_node: int,
               training: TrainingSpec, tokens: float | None, price: float | None,
               settings: RunSettings, grad_reduce_in_fp32: bool = True) -> PlanPoint:
    from tune_cp.oracle.projection import score_configs
    from tune_cp.oracle.work import ConfigBatch

    cluster = ClusterSpec(gpu=gpu, num_nodes=nodes, gpus_per_node=gpus_per_node)
    space = default_space(model, cluster, training, grad_reduce_in_fp32=grad_reduce_in_fp32,
                          allow_cross_scale_up=settings.allow_cross_scale_up)
    # what the framework run settings refuse stays out of the space (solver/settings.py)
    space, enum_settings = narrow_space(space, settings)
    # the removal counts are not shown: without them the enumeration costs about 40% less
    enum = enumerate_feasible(model, cluster, training, space, settings=enum_settings,
                              count_removed=False)
    world = cluster.world_size
    if enum.empty:
        return PlanPoint(gpu.name, nodes, world, 0, None, None, None, None, None, None, None, None)
    configs = [fc.config for fc in enum.configs]
    scores = score_configs(model, cluster, training,
                           ConfigBatch.from_configs(configs, settings.traits),
                           settings.calibration)
    tok = scores["tokens_per_s_per_gpu"]
    i = max(range(len(configs)), key=lambda j: (tok[j], -j))
    per_gpu = float(tok[i])
    from tune_cp.oracle.uncertainty import load_residuals

    interval = load_residuals().interval(model, cluster, training, configs[i], per_gpu).to_json()
    cluster_tps = per_gpu * world
    seconds = tokens / cluster_tps if tokens else None
    gpu_hours = world * seconds / SECONDS_PER_HOUR if seconds is not None else None
    return PlanPoint(
        gpu=gpu.name, nodes=nodes, gpus=world, feasible=len(configs),
        config=config_json(configs[i], training), tokens_per_s_per_gpu=per_gpu,
        mfu=float(scores["mfu"][i]), peak_bytes=enum.configs[i].peak_bytes,
        cluster_tokens_per_s=cluster_tps,
        days=seconds / SECONDS_PER_DAY if seconds is not None else None,
        gpu_hours=gpu_hours, cost=gpu_hours * price if gpu_hours is not None and price else None,
        interval=interval,
    )


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
         grad_reduce_in_fp32: bool = True) -> list[GpuPlan]:
    """Plan for each ``(gpu, gpus_per_node)``: the smallest node count with a feasible
    configuration (doubling, then bisecting), then a table over node counts.
    ``settings``: the run's overheads, margin, cross-scale-up, constraints and calibration;
    ``grad_reduce_in_fp32``: the gradient buffer's dtype (fp32 default; False: bf16).

    ``progress(done, total, what)`` is called before each node count is enumerated: ``done``
    node counts enumerated so far, ``total`` an estimate of how many there will be (exact for a
    GPU once its smallest node count is known; until then the count of the GPUs already planned,
    else doubling up to ``max_nodes`` and the table), ``what`` the GPU and node count.
    The enumerations of one model share the tables that do not depend on the cluster
    (``solver.model.oracle_cache``)."""
    settings = settings or RunSettings()
    counts: list[int] = []  # node counts enumerated per GPU planned so far
    first_guess = max_nodes.bit_length() + points

    def plan_gpu(g_index: int, gpu: GpuSpec, gpn: int) -> GpuPlan:
        training = training_for(gpu)
        price = (prices or {}).get(gpu.name)
        cache: dict[int, PlanPoint] = {}
        table: list[int] | None = None  # the table's node counts, once the smallest is known

        def estimate() -> int:
            guess = round(sum(counts) / len(counts)) if counts else first_guess
            here = (len(cache) + sum(n not in cache for n in table) if table is not None
                    else max(guess, len(cache) + 1))
            return sum(counts) + here + guess * (len(gpus) - g_index - 1)

        def point(n: int) -> PlanPoint:
            if n not in cache:
                if progress:
                    progress(sum(counts) + len(cache), estimate(),
                             f"{gpu.name}: {n} node{'s' if n != 1 else ''}")
                cache[n] = plan_point(model, gpu, n, gpn, training, tokens, price, settings,
                                      grad_reduce_in_fp32)
            return cache[n]

        try:
            lo, hi = 0, 1
            while hi <= max_nodes and not point(hi).feasible:
                lo, hi = hi, hi * 2
            if hi > max_nodes:
                return GpuPlan(gpu.name, gpn, None, [], price,
                               f"no feasible configuration up to {max_nodes} nodes")
            while hi - lo > 1:  # smallest feasible in (lo, hi]
                mid = (lo + hi) // 2
                if point(mid).feasible:
                    hi = mid
                else:
                    lo = mid
            table = node_counts(hi, max_nodes, points)
            return GpuPlan(gpu.name, gpn, hi, [point(n) for n in table], price)
        finally:
            counts.append(len(cache))

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
