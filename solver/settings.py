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

from tune_cp.oracle.memory import FULL_ITERATION, MemoryOverheads, RunOptions
from tune_cp.oracle.specs import ModelSpec, Spec
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


def options_problem(model: ModelSpec, options: RunOptions) -> str | None:
    """What Megatron-Core refuses in these run settings for ``model`` whatever the layout (one
    line, the CLI's exit 2), or None. Sources: Megatron-Core ``transformer/transformer_config.py``
    ``__post_init__`` and Megatron-LM ``docs/user-guide/features/cuda_graph.md`` at
    ``d98e8a64dd``; what depends on the layout is ``solver/rules.py::setting_violations``."""
    scope = options.cuda_graph_scope
    if not model.is_moe:
        if options.moe_a2a_overlap:
            return (f"--moe-a2a-overlap overlaps the MoE all-to-all, but {model.name} is a dense "
                    "model (Megatron-Core: 'overlap_moe_expert_parallel_comm is only supported "
                    "with expert model parallelism'); drop it")
        if options.moe_capacity_factor is not None:
            return (f"--moe-token-drop sets an expert capacity, but {model.name} is a dense model "
                    "with no experts; drop it")
        moe_parts = [x for x in scope if x.startswith("moe_")]
        if moe_parts:
            return (f"--cuda-graph-scope {','.join(moe_parts)} captures MoE parts, but "
                    f"{model.name} is a dense model (Megatron-Core: 'moe cuda graph is only "
                    "supported for MoE'); choose from attn,mlp or full_iteration")
        return None
    if "mlp" in scope and model.num_dense_layers == 0 and not model.is_hybrid:
        return (f"--cuda-graph-scope mlp captures dense MLP layers, but every layer of "
                f"{model.name} is MoE (Megatron-Core: 'mlp cuda graph is only supported for dense "
                "layers'); use moe_router (with moe_preprocess) instead")
    if FULL_ITERATION in scope and options.moe_capacity_factor is None:
        return (f"--cuda-graph-scope full_iteration on the MoE model {model.name} needs static "
                "expert shapes: a dropless layer copies its token counts to the host, which a "
                "graph cannot capture (Megatron-LM cuda_graph.md: 'MoE expert dispatch involves "
                "dynamic shapes and cannot be captured'; its full-iteration MoE recipe adds "
                "--moe-paged-stash, which tune-cp does not model); add --moe-token-drop 1.0 or "
                "capture attn,moe_router,moe_preprocess")
    if options.moe_a2a_overlap and "mlp" in scope:
        return ("--moe-a2a-overlap with a per-layer mlp graph is refused by Megatron-Core "
                "('CUDA graph scope on moe and mlp is not supported with "
                "overlap_moe_expert_parallel_comm'); drop mlp from --cuda-graph-scope")
    if options.moe_a2a_overlap and model.num_mtp_layers > 1:
        return (f"--moe-a2a-overlap supports at most one MTP layer (Megatron-Core: 'MTP supports "
                f"at most one layer when enabling overlap_moe_expert_parallel_comm'); "
                f"{model.name} has {model.num_mtp_layers}")
    return None


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


def narrow_space(space: Any, settings: RunSettings) -> tuple[Any, RunSettings]:
    """The search space and settings a search under these framework run settings enumerates:
    what Megatron-Core refuses with them for some layouts (``solver/rules.py::
    setting_violations``, the same conditions) taken out of the domains, or added as hard
    constraints where a condition joins two axes, so that the CP-SAT model never proposes a
    layout the check would refuse. The defaults change nothing.

    * per-layer CUDA graphs: no full recomputation (Megatron-Core: 'full recompute is only
      supported with full iteration CUDA graph');
    * MoE all-to-all overlap: no full recomputation and no ``moe`` recompute module, an
      all-to-all or flex dispatcher, ``ep > 1``, and virtual stages when ``pp > 1``;
    * token-drop: no flex (DeepEP) dispatcher ('Flex token dispatcher with deepep backend does
      not support moe_pad_expert_input_to_capacity').
    """
    from tune_cp.oracle.specs import ConfigError, Dispatcher, Recompute
    from tune_cp.solver.constraints import HardConstraint

    o = settings.options
    recompute, dispatcher, implied = list(space.recompute), list(space.dispatcher), []
    if o.per_layer_graphs or o.moe_a2a_overlap:
        recompute = [r for r in recompute if r.kind is not Recompute.FULL]
    if o.moe_a2a_overlap:
        recompute = [r for r in recompute if "moe" not in r.modules]
        dispatcher = [d for d in dispatcher if d is not Dispatcher.ALLGATHER]
        implied = [HardConstraint(expr="ep > 1", rationale="--moe-a2a-overlap needs expert "
                                  "parallelism (Megatron-Core transformer_config.py)"),
                   HardConstraint(expr="pp == 1 or vpp > 1", rationale="--moe-a2a-overlap "
                                  "with pp > 1 needs virtual stages (Megatron-Core "
                                  "transformer_config.py)")]
    if o.moe_capacity_factor is not None:
        dispatcher = [d for d in dispatcher if d is not Dispatcher.FLEX]
    if not recompute or not dispatcher:
        what = "recomputation options" if not recompute else "dispatchers"
        raise ConfigError(f"the run settings ({o.label()}) leave no {what} in the search space; "
                          "drop one of them or widen the space")
    if (recompute, dispatcher) == (list(space.recompute), list(space.dispatcher)) \
            and not implied:
        return space, settings
    narrowed = space.model_copy(update={"recompute": tuple(recompute),
                                        "dispatcher": tuple(dispatcher)})
    return narrowed, settings.with_(constraints=(*settings.constraints, *implied))
