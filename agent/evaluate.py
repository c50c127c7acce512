"""One place where a candidate configuration is judged: legality and memory (solver), throughput
(oracle). Every phase of the agent goes through :class:`Evaluator`, which logs each trial."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from oracle.memory import MemoryOverheads
from oracle.projection import Projection, project
from oracle.specs import ClusterSpec, ModelSpec, ParallelConfig, TrainingSpec
from solver.check import CheckOutcome, check_configuration, config_json
from solver.constraints import HardConstraint
from solver.rules import DEFAULT_MEMORY_MARGIN


def config_key(cfg: ParallelConfig) -> tuple:
    """Identity of a resolved configuration (every field, in order)."""
    return tuple(cfg.model_dump().values())


@dataclass(frozen=True)
class Trial:
    """One evaluated candidate."""

    phase: str
    label: str
    outcome: CheckOutcome
    projection: Projection | None

    @property
    def config(self) -> ParallelConfig:
        return self.outcome.ctx.cfg

    @property
    def legal(self) -> bool:
        return self.outcome.legal

    @property
    def throughput(self) -> float:
        """Projected tokens/s/GPU, 0 for an illegal candidate."""
        return self.projection.tokens_per_s_per_gpu if self.legal and self.projection else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "label": self.label,
            "config": config_json(self.config, self.outcome.ctx.training),
            "legal": self.legal,
            "violations": [{"rule": v.rule, "message": v.message} for v in self.outcome.violations],
            "peak_bytes": self.outcome.memory.peak_bytes if self.outcome.memory else None,
            "tokens_per_s_per_gpu": self.throughput if self.legal else None,
        }


@dataclass
class Evaluator:
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    overheads: MemoryOverheads = field(default_factory=MemoryOverheads)
    memory_margin: float = DEFAULT_MEMORY_MARGIN
    allow_cross_scale_up: bool = False
    constraints: Sequence[HardConstraint] = ()
    projector: Callable[..., Projection] = project
    trials: list[Trial] = field(default_factory=list)
    _cache: dict[tuple, tuple[CheckOutcome, Projection | None]] = field(default_factory=dict)
    #: the resolved key of each configuration checked (as given): the seed phase meets the same
    #: candidates again and again (Mixtral 8x22B on 4 nodes: 753 evaluations, 335 distinct)
    _resolved: dict[tuple, tuple] = field(default_factory=dict)

    def evaluate(self, cfg: ParallelConfig, phase: str, label: str) -> Trial:
        given = config_key(cfg)
        key = self._resolved.get(given)
        if key is None:
            outcome = check_configuration(
                self.model, self.cluster, self.training, cfg,
                overheads=self.overheads, memory_margin=self.memory_margin,
                allow_cross_scale_up=self.allow_cross_scale_up, constraints=self.constraints,
            )
            key = self._resolved[given] = config_key(outcome.ctx.cfg)
            if key not in self._cache:
                proj = None
                if outcome.legal:
                    proj = self.projector(self.model, self.cluster, self.training,
                                          outcome.ctx.cfg)
                self._cache[key] = (outcome, proj)
        outcome, proj = self._cache[key]
        trial = Trial(phase, label, outcome, proj)
        self.trials.append(trial)
        return trial
