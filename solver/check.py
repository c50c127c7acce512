"""Check one configuration: legality (every rule family), memory per stage, and (when the oracle
is asked) the projection. Library side of ``tune-cp check``; the CLI only renders the result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tune_cp.config.resolve import resolve_config
from tune_cp.config.specs import (
    ClusterSpec,
    ModelSpec,
    ParallelConfig,
    TrainingSpec,
)
from tune_cp.oracle.memory import MemoryReport
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


def check_projection(outcome: CheckOutcome, calib: Any = None, *,
                     illegal_layouts: bool = False) -> Any:
    """The projection ``tune-cp check`` prints for a checked configuration
    (:class:`oracle.projection.Projection`; None when the layout does not exist or its
    precision is refused): the resolved configuration, projected with the run settings' traits
    and ``calib`` (a :class:`oracle.constants.CalibrationTable` or a file; None: the settings'
    ``--calibration``, else the shipped constants). ``calibrate --log`` reports its before and
    after columns with it, so that they are what ``check`` prints. ``illegal_layouts``: project
    a layout the structural rules refuse too (a log's layout ran, though its cut argument dump may
    leave out what made it legal; ``check`` prints no projection for it)."""
    from tune_cp.oracle.projection import project

    if any(v.rule == "precision" for v in outcome.violations) or (
            outcome.memory is None and not illegal_layouts):
        return None
    ctx = outcome.ctx
    return project(ctx.model, ctx.cluster, ctx.training, ctx.cfg,
                   calib=calib if calib is not None else ctx.settings.calibration,
                   traits=ctx.settings.traits)
