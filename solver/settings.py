"""What a check, a search or a plan is run with besides the model, the cluster, the training and
the configuration: one frozen spec, passed through (never re-declared) by the rule context
(``solver/rules.py::RuleContext``), the search problem (``solver/problem.py::Problem``), the
agent's evaluator (``agent/evaluate.py::Evaluator``) and the search options
(``agent/search.py::SearchOptions``). ``cli.py`` generates the flags of every field
(``settings_options``) for ``search``, ``check`` and ``plan``; ``tune-cp sweep`` reads the same
fields from its grid file.

Light on purpose: it imports the specs, the memory overheads (pydantic) and the constraint parser,
no OR-Tools and no numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field, field_validator, model_validator

from tune_cp.oracle.memory import MemoryOverheads, RunOptions
from tune_cp.oracle.specs import Spec
from tune_cp.solver.constraints import HardConstraint, as_constraints
from tune_cp.solver.defaults import DEFAULT_MEMORY_MARGIN, MAX_MEMORY_MARGIN


class RunSettings(Spec):
    """The rule and model settings of one run.

    ``overheads``: the memory overhead terms (``--overhead``); ``memory_margin``: share of HBM
    kept free (``--memory-margin``); ``allow_cross_scale_up``: tp/etp may cross the scale-up
    domain (``--allow-cross-scale-up``); ``constraints``: extra hard constraints, family
    ``extra`` (``--constraint``; text is parsed); ``calibration``: the time model's constants
    file (``--calibration``; None: the shipped one).

    The framework run settings (``solver/axes.py::RUN_KNOBS``, :class:`oracle.memory.RunOptions`):
    ``cuda_graph_scope`` (``--cuda-graph-scope``; ``()``: none), ``moe_a2a_overlap``
    (``--moe-a2a-overlap``), ``moe_capacity_factor`` (``--moe-token-drop C``; None: dropless).
    They reach every projection as :attr:`traits` and every memory computation as
    ``overheads.run`` (kept equal to them here), so the check, the search's CP-SAT tables, the
    seed phase, the ranking and the explanation all see the same settings.
    """

    overheads: MemoryOverheads = Field(default_factory=MemoryOverheads)
    memory_margin: float = Field(default=DEFAULT_MEMORY_MARGIN, ge=0.0, le=MAX_MEMORY_MARGIN)
    allow_cross_scale_up: bool = False
    constraints: tuple[HardConstraint, ...] = ()
    calibration: str | None = None
    cuda_graph_scope: tuple[str, ...] = ()
    moe_a2a_overlap: bool = False
    moe_capacity_factor: float | None = Field(default=None, gt=0.0, le=64.0)

    @model_validator(mode="before")
    @classmethod
    def _options(cls, data: Any) -> Any:
        """Validate the run options (:class:`RunOptions`) and put them on the overheads."""
        if not isinstance(data, dict):
            return data
        names = RunOptions.model_fields
        opts = RunOptions(**{k: data[k] for k in names if k in data})
        ov = data.get("overheads") or MemoryOverheads()
        if isinstance(ov, dict):
            ov = MemoryOverheads(**ov)
        if isinstance(ov, MemoryOverheads) and ov.run != opts:
            ov = ov.model_copy(update={"run": opts})
        return data | {"overheads": ov, "cuda_graph_scope": opts.cuda_graph_scope}

    @property
    def options(self) -> RunOptions:
        """The framework run settings as one spec (what the exporters write)."""
        return self.overheads.run

    @property
    def traits(self) -> Any:
        """The :class:`oracle.work.RunTraits` of every projection this run makes (TP overlap
        and row-wise FP8 stay the defaults: they are read from published rows only)."""
        from tune_cp.oracle.work import RunTraits

        o = self.options
        return RunTraits(moe_dropless=o.moe_capacity_factor is None,
                         cuda_graph_scope=o.cuda_graph_scope, moe_a2a_overlap=o.moe_a2a_overlap,
                         moe_capacity_factor=o.moe_capacity_factor)

    @field_validator("constraints", mode="before")
    @classmethod
    def _parse(cls, v: Any) -> tuple[HardConstraint, ...]:
        if isinstance(v, str):
            v = (v,)
        return as_constraints(v) if isinstance(v, Sequence) else v

    def with_(self, **changes: Any) -> RunSettings:
        """A copy with ``changes`` (validated)."""
        return RunSettings(**(dict(self) | changes))


#: The settings field names (what ``Problem.replace`` and the views pass to the settings).
SETTINGS_FIELDS: tuple[str, ...] = tuple(RunSettings.model_fields)


class SettingsView:
    """Read access to a ``settings: RunSettings`` attribute under the settings' own names, for
    the classes that run with one (they do not re-declare the fields)."""

    settings: RunSettings

    @property
    def overheads(self) -> MemoryOverheads:
        return self.settings.overheads

    @property
    def memory_margin(self) -> float:
        return self.settings.memory_margin

    @property
    def allow_cross_scale_up(self) -> bool:
        return self.settings.allow_cross_scale_up

    @property
    def constraints(self) -> tuple[HardConstraint, ...]:
        return self.settings.constraints

    @property
    def calibration(self) -> str | None:
        return self.settings.calibration

    @property
    def traits(self) -> Any:
        return self.settings.traits
