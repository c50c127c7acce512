"""One place where a candidate configuration is judged: legality and memory (solver), throughput
(oracle). Every phase of the agent goes through :class:`Evaluator`, which logs each trial."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tune_cp.config.specs import ClusterSpec, ModelSpec, ParallelConfig, TrainingSpec
from tune_cp.oracle.projection import Projection, project
from tune_cp.solver.check import CheckOutcome, check_configuration
from tune_cp.solver.settings import RunSettings, SettingsView


def config_key(cfg: ParallelConfig) -> tuple:
    """Identity of a configuration: every field's value, in order (the instance's own values:
    ``model_dump`` gives the same tuple at several times the cost; a test holds them equal)."""
    return tuple(cfg.__dict__.values())


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


@dataclass
class Evaluator(SettingsView):
    """Judges candidates of one model, cluster and training under the run's ``settings``."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    settings: RunSettings = field(default_factory=RunSettings)
    projector: Callable[..., Projection] = project
    #: the same projections for a list of configurations at once (``oracle.projection.
    #: project_many`` with the projector's calibration), or None: :meth:`prefetch` uses it
    batch_projector: Callable[..., list[Projection]] | None = None
    trials: list[Trial] = field(default_factory=list)
    _cache: dict[tuple, tuple[CheckOutcome, Projection | None]] = field(default_factory=dict)
    #: the resolved key of each configuration checked (as given): the seed phase meets the same
    #: candidates again and again (Mixtral 8x22B on 4 nodes: 753 evaluations, 335 distinct)
    _resolved: dict[tuple, tuple] = field(default_factory=dict)

    def _check(self, cfg: ParallelConfig) -> tuple[tuple, CheckOutcome | None]:
        """The resolved key of ``cfg``, and its outcome when it was not checked before."""
        given = config_key(cfg)
        key = self._resolved.get(given)
        if key is not None:
            return key, None
        outcome = check_configuration(
            self.model, self.cluster, self.training, cfg, settings=self.settings)
        key = self._resolved[given] = config_key(outcome.ctx.cfg)
        return key, outcome

    def prefetch(self, cfgs: Iterable[ParallelConfig]) -> None:
        """Check ``cfgs`` and project the legal ones not projected yet in one batch (the
        ``batch_projector``), so that :meth:`evaluate` finds them judged; logs no trial."""
        if self.batch_projector is None:
            return
        fresh: dict[tuple, CheckOutcome] = {}
        for cfg in cfgs:
            key, outcome = self._check(cfg)
            if outcome is not None and key not in self._cache and key not in fresh:
                fresh[key] = outcome
        for key, outcome in fresh.items():
            if not outcome.legal:
                self._cache[key] = (outcome, None)
        legal = [(k, o) for k, o in fresh.items() if o.legal]
        projs = self.batch_projector(self.model, self.cluster, self.training,
                                     [o.ctx.cfg for _, o in legal])
        for (key, outcome), proj in zip(legal, projs, strict=True):
            self._cache[key] = (outcome, proj)

    def evaluate(self, cfg: ParallelConfig, phase: str, label: str) -> Trial:
        key, outcome = self._check(cfg)
        if key not in self._cache:
            assert outcome is not None  # a key is cached once its first check is judged
            proj = None
            if outcome.legal:
                proj = self.projector(self.model, self.cluster, self.training,
                                      outcome.ctx.cfg)
            self._cache[key] = (outcome, proj)
        outcome, proj = self._cache[key]
        trial = Trial(phase, label, outcome, proj)
        self.trials.append(trial)
        return trial
