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
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from tune_cp.config.specs import Spec
from tune_cp.oracle.memory import MemoryOverheads, RunOptions
from tune_cp.solver.constraints import HardConstraint, as_constraints
from tune_cp.solver.defaults import DEFAULT_MEMORY_MARGIN, FRAMEWORK_NAMES, MAX_MEMORY_MARGIN

#: The type of :attr:`RunSettings.framework` (``--framework``'s values).
FrameworkName = Literal[FRAMEWORK_NAMES]  # type: ignore[valid-type]


class RunSettings(Spec):
    """The rule and model settings of one run.

    ``overheads``: the memory overhead terms (``--overhead``); ``memory_margin``: share of HBM
    kept free (``--memory-margin``); ``allow_cross_scale_up``: tp/etp may cross the scale-up
    domain (``--allow-cross-scale-up``); ``constraints``: extra hard constraints, family
    ``extra`` (``--constraint``; text is parsed); ``calibration``: the time model's constants
    file (``--calibration``; None: the shipped one); ``framework``: the framework that runs the
    job (``--framework``; None: Megatron-LM's defaults), the one place a run says which it is:
    the memory verdict of every check, search, plan and sweep row reads its family's spread
    (:attr:`memory_spread`, ``oracle/memory_verdict.py``).

    The framework run settings (``config/axes.py::RUN_KNOBS``, :class:`oracle.memory.RunOptions`):
    ``cuda_graph_scope`` (``--cuda-graph-scope``; ``()``: none), ``moe_a2a_overlap``
    (``--moe-a2a-overlap``), ``moe_capacity_factor`` (``--moe-token-drop C``; None: dropless).
    They are stored once, as ``overheads.run`` (the one per-run object every memory
    computation receives: the check, the CP-SAT tables, the Python loop), and read as
    :attr:`options`; every projection gets :attr:`traits`, derived from them. They are given by
    name (``RunSettings(moe_a2a_overlap=True)``, ``with_(cuda_graph_scope="attn")``): a name
    given sets that field of ``overheads.run`` (over the ``overheads`` given with it).
    """

    overheads: MemoryOverheads = Field(default_factory=MemoryOverheads)
    memory_margin: float = Field(default=DEFAULT_MEMORY_MARGIN, ge=0.0, le=MAX_MEMORY_MARGIN)
    allow_cross_scale_up: bool = False
    constraints: tuple[HardConstraint, ...] = ()
    calibration: str | None = None
    framework: FrameworkName | None = None

    @model_validator(mode="before")
    @classmethod
    def _options(cls, data: Any) -> Any:
        """The run options given by name (:data:`RUN_OPTION_NAMES`), validated as a
        :class:`RunOptions`, set on ``overheads.run``."""
        if not isinstance(data, dict) or not set(data) & set(RUN_OPTION_NAMES):
            return data
        given = {k: data[k] for k in RUN_OPTION_NAMES if k in data}
        rest = {k: v for k, v in data.items() if k not in given}
        ov = rest.get("overheads") or MemoryOverheads()
        if isinstance(ov, dict):
            ov = MemoryOverheads(**ov)
        if not isinstance(ov, MemoryOverheads):
            return data  # the field's own validation says what is wrong
        run = RunOptions(**(dict(ov.run) | given))
        return rest | {"overheads": ov.model_copy(update={"run": run})}

    @property
    def options(self) -> RunOptions:
        """The framework run settings as one spec (what the exporters write)."""
        return self.overheads.run

    @property
    def memory_family(self) -> str:
        """The framework family whose measured peaks give the memory spread
        (``formats/frameworks.py::FAMILY``; Megatron-LM's without ``framework``)."""
        from tune_cp.formats.frameworks import FAMILY, Framework

        return FAMILY[Framework(self.framework or "megatron-lm")]

    @property
    def memory_spread(self) -> Any:
        """The :class:`oracle.memory_verdict.Spread` of :attr:`memory_family`: the line between
        fits, at the edge and out of memory for this run."""
        from tune_cp.oracle.memory_verdict import spread_for

        return spread_for(self.memory_family)

    @property
    def traits(self) -> Any:
        """The :class:`oracle.work.RunTraits` of every projection this run makes (TP overlap
        and row-wise FP8 stay the defaults: they are read from published rows only)."""
        from tune_cp.oracle.work import RunTraits

        o = self.options
        return RunTraits(moe_dropless=o.moe_capacity_factor is None,
                         cuda_graph_scope=o.cuda_graph_scope, moe_a2a_overlap=o.moe_a2a_overlap,
                         moe_capacity_factor=o.moe_capacity_factor,
                         moe_routing_imbalance=self.overheads.moe_routing_imbalance)

    @field_validator("constraints", mode="before")
    @classmethod
    def _parse(cls, v: Any) -> tuple[HardConstraint, ...]:
        if isinstance(v, str):
            v = (v,)
        return as_constraints(v) if isinstance(v, Sequence) else v

    def with_(self, **changes: Any) -> RunSettings:
        """A copy with ``changes`` (validated; settings names, :data:`SETTINGS_FIELDS`). A new
        ``overheads`` brings its own ``run``; run options given by name are set on it."""
        return RunSettings(**(dict(self) | changes))


#: The run options' names (fields of ``overheads.run``), which the settings also take by name.
RUN_OPTION_NAMES: tuple[str, ...] = tuple(RunOptions.model_fields)
#: The names a run's settings are given by: the fields, and the run options (what
#: ``Problem.replace`` passes to the settings, and what ``cli.py::SETTINGS_FLAGS`` has a flag
#: for).
SETTINGS_FIELDS: tuple[str, ...] = (*RunSettings.model_fields, *RUN_OPTION_NAMES)


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
    def framework(self) -> str | None:
        return self.settings.framework

    @property
    def memory_spread(self) -> Any:
        return self.settings.memory_spread

    @property
    def traits(self) -> Any:
        return self.settings.traits
