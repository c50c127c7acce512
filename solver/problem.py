"""One search problem: what is trained, where, the space searched, and the rule settings.

Shared by the CP-SAT model (``solver/model.py``), the plain Python loop
(``solver/reference.py``), the removal counts (``solver/attribution.py``) and the explanations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from tune_cp.config.axes import RECOMPUTE_FIELDS
from tune_cp.oracle.specs import (
    ClusterSpec,
    ModelSpec,
    ParallelConfig,
    TrainingSpec,
    derived_ga,
    resolve_config,
)
from tune_cp.solver.rules import RuleContext, hbm_limit_bytes
from tune_cp.solver.settings import SETTINGS_FIELDS, RunSettings, SettingsView
from tune_cp.solver.space import SearchSpace, candidate_config

#: The candidate axes :meth:`Problem.resolve_many` copies into a layout's resolution.
_PER_LAYOUT = frozenset(("mbs", "recompute"))
#: The recompute fields at their defaults (:meth:`Problem.vary` clears them before setting an
#: option's own).
_CLEARED_RECOMPUTE = {f: ParallelConfig.model_fields[f].default for f in RECOMPUTE_FIELDS}


@dataclass(frozen=True)
class Problem(SettingsView):
    """The inputs of a search: what is trained, where, the space, and the run's settings (their
    ``constraints`` feed the ``extra`` family)."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    space: SearchSpace
    settings: RunSettings = field(default_factory=RunSettings)

    @property
    def limit_bytes(self) -> int:
        return hbm_limit_bytes(self.cluster.gpu.hbm_bytes, self.memory_margin)

    def resolve(self, candidate: Mapping[str, Any]) -> ParallelConfig:
        """The resolved configuration of one candidate (a dict of axis values)."""
        return resolve_config(candidate_config(candidate, self.space.grad_reduce_in_fp32,
                                               self.space.fp8_param_gather,
                                               self.space.optimizer_state),
                              self.model, self.cluster, self.training)

    def resolve_many(self, candidates: Iterable[Mapping[str, Any]]) -> list[ParallelConfig]:
        """:meth:`resolve` of each candidate. Candidates that differ only in mbs and the
        recompute option share one resolution (no other derived field reads them: dp, the
        split, the schedule, the FP8 recipe), copied with those fields and the micro-batch
        count as :meth:`vary` does (in one copy); the enumeration's few thousand candidates
        resolve about three times as fast (pydantic validates once per layout)."""
        layouts: dict[tuple[Any, ...], ParallelConfig] = {}
        out = []
        for cand in candidates:
            key = tuple([v for k, v in cand.items() if k not in _PER_LAYOUT])
            base = layouts.get(key)
            if base is None:
                out.append(layouts.setdefault(key, self.resolve(cand)))
                continue
            out.append(base.model_copy(update=self._vary_update(base, "recompute",
                                                                cand["recompute"])
                                       | self._vary_update(base, "mbs", cand["mbs"])))
        return out

    def context(self, cfg: ParallelConfig) -> RuleContext:
        """The rule context of a resolved configuration, with this problem's settings."""
        return RuleContext(
            model=self.model, cluster=self.cluster, training=self.training, cfg=cfg,
            settings=self.settings,
            full_recompute_layers=self._full_layers,
            recompute_none_option=self._none_option,
        )

    def vary(self, cfg: ParallelConfig, axis: str, value: Any) -> ParallelConfig:
        """``resolve`` of the candidate of the resolved ``cfg`` with ``axis`` set to ``value``,
        by copying ``cfg``: for the axes whose resolution touches only their own fields,
        ``recompute`` (an option of the space) and ``mbs`` (and the micro-batch count)."""
        return cfg.model_copy(update=self._vary_update(cfg, axis, value))

    def _vary_update(self, cfg: ParallelConfig, axis: str, value: Any) -> dict[str, Any]:
        """The fields :meth:`vary` changes: the recompute option's (the others cleared), or mbs
        and the micro-batch count."""
        if axis == "recompute":
            return _CLEARED_RECOMPUTE | value.config_fields()
        if axis == "mbs":
            assert cfg.dp is not None
            return {"mbs": value,
                    "ga": derived_ga(self.training.global_batch_size, value, cfg.dp)}
        raise ValueError(f"vary does not apply to {axis!r}")

    @cached_property
    def _full_layers(self) -> tuple[int, ...]:
        return self.space.full_layers

    @cached_property
    def _none_option(self) -> bool:
        return self.space.has_no_recompute

    def replace(self, **changes: Any) -> Problem:
        """A copy with ``changes``: problem fields, or settings fields (``memory_margin=0``)."""
        settings = {k: changes.pop(k) for k in SETTINGS_FIELDS if k in changes}
        if settings:
            changes["settings"] = changes.get("settings", self.settings).with_(**settings)
        return Problem(**({f: getattr(self, f) for f in self.__dataclass_fields__} | changes))
