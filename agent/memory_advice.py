"""The room a configuration at the edge of memory needs: which term decides, and the cheapest
single change that makes it fit at the pessimistic end of the overhead spread
(``oracle/memory_verdict.py``). ``tune-cp check`` prints it under an "at the edge" or "out of
memory" verdict."""

from __future__ import annotations

from dataclasses import dataclass

from tune_cp.config.specs import (
    GIB,
    ClusterSpec,
    ModelSpec,
    ParallelConfig,
    Precision,
    Recompute,
    RecomputeMethod,
    TrainingSpec,
)
from tune_cp.oracle.memory_verdict import MemoryState, Spread, memory_state
from tune_cp.oracle.projection import project
from tune_cp.solver.check import check_configuration
from tune_cp.solver.settings import RunSettings


@dataclass(frozen=True)
class Room:
    """One single change: its flags, the peak it gives, its state and projected throughput."""

    flags: str
    peak_bytes: int
    state: MemoryState
    tokens_per_s_per_gpu: float

    def text(self, base_tokens: float) -> str:
        change = (self.tokens_per_s_per_gpu / base_tokens - 1) if base_tokens else 0.0
        return (f"{self.flags} (peak {self.peak_bytes / GIB:.1f} GiB, {self.state.value}; "
                f"{self.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, {change:+.1%})")


#: Selective-recompute module sets tried (Megatron-Core ``--recompute-modules`` names), for
#: dense and MoE models: the seed phase's extra sets and the MoE expert activations.
SELECTIVE_SETS: dict[bool, tuple[tuple[str, ...], ...]] = {
    False: (("mlp",), ("layernorm", "mlp")),
    True: (("moe_act",), ("layernorm", "moe_act"), ("layernorm", "moe")),
}
#: Full recomputation of the first K layers of each virtual stage (block method) tried before
#: every layer.
FULL_LAYERS = (1, 2, 4, 8)


def single_changes(model: ModelSpec, cfg: ParallelConfig,
                   training: TrainingSpec) -> list[tuple[str, dict]]:
    """The single changes that lower memory without changing the layout: more recomputation
    (selective sets, full of K layers, full), a smaller micro-batch, FP8 parameters, bf16
    gradients, a sharded optimizer."""
    out: list[tuple[str, dict]] = []
    if cfg.recompute is Recompute.NONE:
        for mods in SELECTIVE_SETS[model.is_moe]:
            out.append((f"--recompute selective --recompute-modules {','.join(mods)}",
                        {"recompute": Recompute.SELECTIVE, "recompute_modules": mods}))
    if cfg.recompute is not Recompute.FULL or cfg.recompute_layers is not None:
        for k in FULL_LAYERS:
            if cfg.recompute is Recompute.FULL and (cfg.recompute_layers or 0) >= k:
                continue
            out.append((f"--recompute full --recompute-layers {k}",
                        {"recompute": Recompute.FULL, "recompute_layers": k,
                         "recompute_method": RecomputeMethod.BLOCK}))
        out.append(("--recompute full", {"recompute": Recompute.FULL, "recompute_layers": None,
                                         "recompute_method": RecomputeMethod.BLOCK}))
    if cfg.mbs > 1:
        out.append((f"--mbs {cfg.mbs // 2}", {"mbs": cfg.mbs // 2}))
    if training.precision is Precision.FP8 and not cfg.fp8_param_gather:
        out.append(("--fp8-param-gather", {"fp8_param_gather": True}))
    if cfg.grad_reduce_in_fp32:
        out.append(("--grad-reduce-in-bf16", {"grad_reduce_in_fp32": False}))
    if not cfg.fsdp and not cfg.distributed_optimizer:
        out.append(("--distributed-optimizer", {"distributed_optimizer": True}))
    if not cfg.fsdp:
        out.append(("--fsdp", {"fsdp": True}))
    return out


def cheapest_room(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                  cfg: ParallelConfig, settings: RunSettings, spread: Spread) -> Room | None:
    """Among :func:`single_changes` that stay legal, the fastest that fits; else the one with
    the lowest peak (None when no change is legal)."""
    rooms = []
    for flags, update in single_changes(model, cfg, training):
        base = cfg.model_dump() | update
        if update.get("mbs"):
            base["ga"] = None
        try:
            changed = ParallelConfig(**{k: v for k, v in base.items()
                                        if k in ParallelConfig.model_fields})
            out = check_configuration(model, cluster, training, changed, settings=settings)
        except Exception:  # noqa: BLE001 - a change the specs refuse is no advice
            continue
        if not out.legal or out.memory is None:
            continue
        state = memory_state(out.memory.peak_bytes, cluster.gpu.hbm_bytes, spread)
        tps = project(model, cluster, training, out.ctx.cfg, calib=settings.calibration,
                      traits=settings.traits).tokens_per_s_per_gpu
        rooms.append(Room(flags, out.memory.peak_bytes, state, tps))
    fitting = [r for r in rooms if r.state is MemoryState.FITS]
    if fitting:
        return max(fitting, key=lambda r: r.tokens_per_s_per_gpu)
    return min(rooms, key=lambda r: r.peak_bytes, default=None)
