"""One search problem: what is trained, where, the space searched, and the rule settings.

Shared by the CP-SAT model (``solver/model.py``), the plain Python loop
(``solver/reference.py``), the removal counts (``solver/attribution.py``) and the explanations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from tune_cp.config.axes import RECOMPUTE_FIELDS
from tune_cp.config.resolve import Columns, columns_of, resolve, resolve_config, resolved_update
from tune_cp.config.specs import (
    ClusterSpec,
    ModelSpec,
    ParallelConfig,
    TrainingSpec,
    derived_ga,
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
        """:meth:`resolve` of each candidate, as one batch: the candidates as columns (one
        unresolved configuration per layout, validated once, its rows taking each candidate's
        mbs and recompute option), resolved by :func:`config.resolve.resolve` at once, then each
        row viewed as its configuration (one copy of its layout's)."""
        return self.resolve_columns(candidates)[1]

    def resolve_columns(self, candidates: Iterable[Mapping[str, Any]]
                        ) -> tuple[Columns, list[ParallelConfig]]:
        """The resolved :class:`config.resolve.Columns` of ``candidates`` and their
        configurations (:meth:`resolve_many`), in the candidates' order."""
        cands = list(candidates)
        layouts: dict[tuple[Any, ...], int] = {}
        bases: list[ParallelConfig] = []
        index = []
        for cand in cands:
            key = tuple([v for k, v in cand.items() if k not in _PER_LAYOUT])
            i = layouts.get(key)
            if i is None:
                i = layouts[key] = len(bases)
                bases.append(candidate_config(cand, self.space.grad_reduce_in_fp32,
                                              self.space.fp8_param_gather,
                                              self.space.optimizer_state))
            index.append(i)
        opts = [cand["recompute"] for cand in cands]
        per_opt = {o: columns_of([ParallelConfig(**o.config_fields())]) for o in set(opts)}
        cols = columns_of(bases).take(np.array(index, dtype=np.int64))
        for f in ("recompute", "recompute_method", "recompute_layers", "recompute_modules"):
            setattr(cols, f, np.array([getattr(per_opt[o], f)[0] for o in opts], dtype=np.int64))
        cols.mbs = np.array([cand["mbs"] for cand in cands], dtype=np.int64)
        cols = resolve(cols, self.model, self.cluster, self.training)
        configs = [bases[i].model_copy(update=_CLEARED_RECOMPUTE | o.config_fields()
                                       | {"mbs": cand["mbs"]} | resolved_update(cols, j))
                   for j, (i, o, cand) in enumerate(zip(index, opts, cands, strict=True))]
        return cols, configs

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
