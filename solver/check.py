"""Check one configuration: legality (every rule family), memory per stage, and (when the oracle
is asked) the projection. Library side of ``tune-cp check``; the CLI only renders the result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oracle.memory import MemoryReport
from oracle.specs import (
    ClusterSpec,
    ModelSpec,
    ParallelConfig,
    TrainingSpec,
    compute_precision,
    resolve_config,
)
from solver.rules import (
    STRUCTURAL,
    RuleContext,
    Violation,
    check,
    hbm_limit_bytes,
)
from solver.settings import RunSettings


@dataclass(frozen=True)
class CheckOutcome:
    ctx: RuleContext
    violations: tuple[Violation, ...]
    memory: MemoryReport | None

    @property
    def legal(self) -> bool:
        return not self.violations

    @property
    def limit_bytes(self) -> int:
        return hbm_limit_bytes(self.ctx.cluster.gpu.hbm_bytes, self.ctx.memory_margin)

    @property
    def batch_error(self) -> Violation | None:
        """The ``batch`` identity failing means the configuration does not exist: an input error."""
        return next((v for v in self.violations if v.rule == "batch"), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "legal": self.legal,
            "violations": [{"rule": v.rule, "message": v.message} for v in self.violations],
            "config": config_json(self.ctx.cfg, self.ctx.training),
            "memory": memory_json(self.memory, self.limit_bytes, self.ctx.memory_margin),
        }


def check_configuration(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    cfg: ParallelConfig,
    settings: RunSettings | None = None,
) -> CheckOutcome:
    """Resolve ``cfg``, run every legality family (and ``extra`` with the settings'
    constraints), and compute memory when the layout exists."""
    resolved = resolve_config(cfg, model, cluster, training)
    ctx = RuleContext(model=model, cluster=cluster, training=training, cfg=resolved,
                      settings=settings or RunSettings())
    violations = check(ctx, STRUCTURAL + ("batch",))
    memory = None
    if not violations:
        memory = ctx.memory
        violations = violations + check(ctx, ("hbm",))
    violations = violations + check(ctx, ("extra",))
    return CheckOutcome(ctx, tuple(violations), memory)


def config_json(cfg: ParallelConfig, training: TrainingSpec) -> dict[str, Any]:
    """The configuration keys shared by ``check --json`` and the search's ``best``."""
    return {
        "tp": cfg.tp,
        "pp": cfg.pp,
        "vpp": cfg.vpp,
        "cp": cfg.cp,
        "ep": cfg.ep,
        "etp": cfg.etp_,
        "dp": cfg.dp,
        "mbs": cfg.mbs,
        "ga": cfg.ga,
        "gbs": training.global_batch_size,
        "seq_len": training.seq_len,
        "recompute": cfg.recompute.value,
        "recompute_method": cfg.recompute_method.value if cfg.recompute == "full" else None,
        "recompute_layers": cfg.recompute_layers,
        "recompute_modules": list(cfg.recompute_modules) if cfg.recompute == "selective" else [],
        "sequence_parallel": cfg.sp,
        "distributed_optimizer": cfg.distributed_optimizer,
        "fsdp": cfg.fsdp,
        "grad_reduce_in_fp32": cfg.grad_reduce_in_fp32,
        "dispatcher": cfg.dispatcher.value,
        "schedule": cfg.schedule_.value,
        "precision": compute_precision(training, cfg).value,
        "fp8_recipe": cfg.fp8_recipe.value if cfg.fp8_recipe is not None else None,
        "pipeline_split": cfg.pipeline_split.value if cfg.pipeline_split else None,
    }


def memory_json(report: MemoryReport | None, limit: int, margin: float) -> dict[str, Any] | None:
    if report is None:
        return None
    return {
        "stages": [
            {
                "stage": s.stage,
                "decoder_layers": s.decoder_layers,
                "terms": dict(s.terms),
                "total_bytes": s.total_bytes,
            }
            for s in report.stages
        ],
        "peak_stage": report.peak_stage,
        "peak_bytes": report.peak_bytes,
        "hbm_bytes": report.hbm_bytes,
        "memory_margin": margin,
        "limit_bytes": limit,
        "headroom_bytes": limit - report.peak_bytes,
        "fits": report.peak_bytes <= limit,
        "dominant_term": report.dominant_term,
        "dominant_group": report.dominant_group,
    }
