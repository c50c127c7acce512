"""Check one configuration: legality (every rule family), memory per stage, and (when the oracle
is asked) the projection. Library side of ``tune-cp check``; the CLI only renders the result."""

from __future__ import annotations

from dataclasses import dataclass

from tune_cp.oracle.memory import MemoryReport
from tune_cp.oracle.specs import (
    ClusterSpec,
    ModelSpec,
    ParallelConfig,
    TrainingSpec,
    resolve_config,
)
from tune_cp.solver.rules import (
    STRUCTURAL,
    RuleContext,
    Violation,
    check,
    hbm_limit_bytes,
)
from tune_cp.solver.settings import RunSettings


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
