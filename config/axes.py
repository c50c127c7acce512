"""The axis registry: every setting of a :class:`~config.specs.ParallelConfig` a user, a search or
the LLM planner may choose, declared once.

The tables, and every list of axis names, domains, labels and columns in tune-cp is derived
from them (``tests/test_axis_lists.py`` fails on a literal one anywhere else):

* :data:`KNOBS` — one entry per ``ParallelConfig`` field a user sets: its command-line flag
  (spelling, value type and range, default, help), whether ``--baseline`` takes it, whether
  the LLM planner may combine it, whether the attribution walks it as one change, how outputs
  show it, and its Megatron-LM / Megatron-Bridge spellings where the framework has one name
  for it (the many-to-one readings and the other frameworks' keys are in ``formats/keys.py``).
* :data:`AXIS_TABLE` — one entry per search-space axis (``solver/space.py::SearchSpace``), in
  the order the solver branches on them: the ``ParallelConfig`` fields it sets, how the
  default space enumerates its domain (and the values of ``mbs``, for the search and the seed
  phase), its slicing, geometry and attribution-walk roles. ``optimizer`` sets two fields
  (distributed optimizer, FSDP) and ``recompute`` four (one recompute option);
  ``sequence_parallel`` (derived from tp) and ``grad_reduce_in_fp32`` / ``fp8_param_gather``
  (fixed per search) are knobs but not axes.
* :data:`DECLARED_COLUMNS` — the configuration's output keys (``--json``, the sweep's
  columns), in output order.
* :data:`SEARCH_SELECTIVE` / :data:`SEED_SELECTIVE` — the selective-recompute module sets the
  exhaustive space and the seed phase try.

A plain integer axis (``Knob.plain``) needs nothing else outside its mechanism: see
docs/architecture.md, "Adding a parallel axis", and :func:`register_axis`.

A further table, :data:`RUN_KNOBS`, declares the framework run settings (CUDA-graph scope, MoE
all-to-all overlap, token-drop): fields of ``solver/settings.py::RunSettings``, not of the
configuration, with their flags and framework spellings.

This module imports only the specs (no OR-Tools, no numpy), so the CLI's ``--help`` stays
light.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from tune_cp.config.specs import (
    MAX_GPUS,
    Dispatcher,
    FlexBackend,
    Fp8Recipe,
    GroupedGemm,
    ModelSpec,
    PipelineSplit,
    Recompute,
    RecomputeMethod,
    Schedule,
    TrainingSpec,
)

#: Largest pipeline size / virtual stages / recompute depth a flag takes (``ParallelConfig``).
MAX_STAGES = 100_000
#: Largest micro-batch a flag takes.
MAX_MBS = 1 << 20


class FlagKind(StrEnum):
    """How a knob is spelled on the command line."""

    INT = "int"  # --tp 8
    CHOICE = "choice"  # --dispatcher flex (the values of an enum)
    FLAG = "flag"  # --fsdp (a flag without value; ``negated``: stores False into the field)
    SWITCH = "switch"  # --sequence-parallel / --no-sequence-parallel (unset: derived)
    MODULES = "modules"  # --recompute-modules core_attn,mlp (comma separated)
    TEXT = "text"  # --pipeline-layout 'Et*3|(tt|)*29,m|L' (a string, as given)


@dataclass(frozen=True)
class Knob:
    """One ``ParallelConfig`` field as a user, the search and the planner set it.

    ``field``: the ``ParallelConfig`` field; ``axis``: the search-space axis that sets it (None:
    not searched); ``flag``: the command-line flag (``--`` + its spelling); ``negated``: the flag
    stores the negation of the field (``--no-distributed-optimizer``); ``lo``/``hi``: integer
    range; ``choices``: the enum of a choice; ``default``: the flag's default (None: derived,
    said in ``help``); ``baseline``: a ``--baseline`` key; ``combinable``: the LLM planner may
    set it in a combination; ``attributed``: one change of the search's attribution (the
    recompute fields are one change, ``recompute``); ``megatron``: Megatron-LM argument dest;
    ``bridge``: Megatron-Bridge ``ConfigContainer`` field path; ``view``: the
    ``ParallelConfig`` attribute outputs show (None: the field; ``etp_``, ``sp`` and
    ``schedule_`` resolve what the field leaves unset); ``shown_for``: the recompute kind the
    field applies to (outputs show ``unset`` under the others); ``plotted``: the ``--pareto``
    picture may colour its points by it (``--pareto-color``); ``plain``: a plain integer axis
    (its own field): the edges read and write it without a line of their own (the default
    space takes its :class:`Axis` ``values``, the seed phase moves to each ``seed_values``,
    ``check_command`` and the exporters write it when it is not ``default``, the Megatron-LM
    reader reads ``megatron``); the knobs before it have their own lines in those places.
    """

    field: str
    axis: str | None
    flag: str
    help: str
    kind: FlagKind = FlagKind.INT
    lo: int = 1
    hi: int = MAX_GPUS
    choices: type[StrEnum] | None = None
    default: object = None
    negated: bool = False
    baseline: bool = True
    combinable: bool = False
    attributed: bool = False
    megatron: str | None = None
    bridge: str | None = None
    view: str | None = None
    shown_for: Recompute | None = None
    unset: object = None
    plotted: bool = False
    plain: bool = False

    @property
    def param(self) -> str:
        """The click parameter name of the flag (``--no-distributed-optimizer`` ->
        ``no_distributed_optimizer``)."""
        return self.flag.replace("-", "_")


GRAD_BF16_HELP = (
    "Keep the gradient buffer and the data-parallel gradient reduce-scatter/all-reduce in bf16 "
    "(2 B/param) instead of fp32 (4 B/param)  [default: fp32, Megatron-LM's default under "
    "--bf16]. Megatron-LM --grad-reduce-in-bf16 / Primus grad_reduce_in_bf16: true; "
    "Megatron-Core DDP and Megatron-Bridge (NeMo) grad_reduce_in_fp32=False.")

#: Every knob, in the order the flags are listed (``tune-cp check --help``), ``--baseline`` keys
#: are named, the planner's schema lists them and the attribution tries them.
KNOBS: tuple[Knob, ...] = (
    Knob("tp", "tp", "tp", "Tensor-parallel size.", default=1, combinable=True,
         attributed=True, megatron="tensor_model_parallel_size",
         bridge="model.tensor_model_parallel_size", plotted=True),
    Knob("pp", "pp", "pp", "Pipeline-parallel size.", hi=MAX_STAGES, default=1, combinable=True,
         attributed=True, megatron="pipeline_model_parallel_size",
         bridge="model.pipeline_model_parallel_size", plotted=True),
    Knob("vpp", "vpp", "vpp", "Virtual pipeline stages per rank (interleaved schedule when > 1).",
         hi=MAX_STAGES, default=1, combinable=True, attributed=True,
         megatron="num_virtual_stages_per_pipeline_rank",
         bridge="model.virtual_pipeline_model_parallel_size", plotted=True),
    Knob("cp", "cp", "cp", "Context-parallel size.", default=1, combinable=True, attributed=True,
         megatron="context_parallel_size", bridge="model.context_parallel_size", plotted=True),
    Knob("ep", "ep", "ep", "Expert-parallel size.", default=1, combinable=True, attributed=True,
         megatron="expert_model_parallel_size", bridge="model.expert_model_parallel_size", plotted=True),
    Knob("etp", "etp", "etp", "Expert tensor-parallel size  [default: 1 for an MoE model, the "
         "search's first value (Megatron-LM's default for a launch without it: tp)]",
         combinable=True, view="etp_",
         attributed=True, megatron="expert_tensor_parallel_size",
         bridge="model.expert_tensor_parallel_size"),
    Knob("mbs", "mbs", "mbs", "Micro-batch size.", hi=MAX_MBS, default=1, combinable=True,
         attributed=True, megatron="micro_batch_size", bridge="train.micro_batch_size", plotted=True),
    Knob("recompute", "recompute", "recompute", "Activation recomputation granularity.",
         kind=FlagKind.CHOICE, choices=Recompute, default=Recompute.NONE.value, combinable=True,
         attributed=True, megatron="recompute_granularity", bridge="model.recompute_granularity", plotted=True),
    Knob("recompute_method", "recompute", "recompute-method",
         "Full recompute: block (first N layers of each virtual stage) or uniform (groups of N).",
         kind=FlagKind.CHOICE, choices=RecomputeMethod, default=RecomputeMethod.BLOCK.value,
         combinable=True, megatron="recompute_method", bridge="model.recompute_method",
         shown_for=Recompute.FULL),
    Knob("recompute_layers", "recompute", "recompute-layers",
         "Full recompute: N layers per virtual stage  [default: all]", lo=0, hi=MAX_STAGES,
         combinable=True, megatron="recompute_num_layers", bridge="model.recompute_num_layers"),
    Knob("recompute_modules", "recompute", "recompute-modules",
         "Selective recompute modules, comma separated  [default: core_attn]",
         kind=FlagKind.MODULES, megatron="recompute_modules", bridge="model.recompute_modules",
         shown_for=Recompute.SELECTIVE, unset=()),
    Knob("sequence_parallel", None, "sequence-parallel",
         "Sequence parallelism  [default: on when tp > 1]", kind=FlagKind.SWITCH,
         megatron="sequence_parallel", bridge="model.sequence_parallel", view="sp"),
    Knob("dispatcher", "dispatcher", "dispatcher", "MoE token dispatcher (flex = DeepEP).",
         kind=FlagKind.CHOICE, choices=Dispatcher, default=Dispatcher.ALLTOALL.value,
         combinable=True, attributed=True, megatron="moe_token_dispatcher_type",
         bridge="model.moe_token_dispatcher_type"),
    Knob("flex_backend", None, "flex-backend",
         "Library of the flex dispatcher: deepep / hybridep (NVIDIA; Megatron-LM "
         "--moe-flex-dispatcher-backend), turbo (Primus-Turbo DeepEP on AMD, Primus "
         "use_turbo_deepep)  [default: turbo on AMD, deepep elsewhere]",
         kind=FlagKind.CHOICE, choices=FlexBackend, attributed=True,
         megatron="moe_flex_dispatcher_backend"),
    Knob("sync_free_stage", None, "sync-free-stage",
         "Primus-Turbo sync-free MoE stage (turbo_sync_free_moe_stage, AMD): 1 fused router and "
         "permutation, 2 + flex dispatch and Turbo grouped GEMM, 3 no host synchronisation",
         lo=0, hi=3, default=0, attributed=True),
    Knob("grouped_gemm", None, "grouped-gemm",
         "Expert GEMMs: sequential (per-expert loop, no --moe-grouped-gemm), legacy "
         "(--moe-use-legacy-grouped-gemm), te (Transformer Engine GroupedLinear), turbo "
         "(Primus-Turbo use_turbo_grouped_gemm, AMD)", kind=FlagKind.CHOICE,
         choices=GroupedGemm, default=GroupedGemm.TE.value, attributed=True),
    Knob("permute_fusion", None, "permute-fusion",
         "Fused MoE token permutation (Megatron-LM --moe-permute-fusion)  [default: off]",
         kind=FlagKind.FLAG, attributed=True, megatron="moe_permute_fusion",
         bridge="model.moe_permute_fusion"),
    Knob("shared_expert_overlap", None, "shared-expert-overlap",
         "Run the shared experts beside the token dispatch (Megatron-LM "
         "--moe-shared-expert-overlap)  [default: off]", kind=FlagKind.FLAG,
         attributed=True, megatron="moe_shared_expert_overlap",
         bridge="model.moe_shared_expert_overlap"),
    Knob("router_fp32", None, "router-fp32",
         "Router in fp32 (Megatron-LM --moe-router-dtype fp32; Primus-Turbo DeepEP needs it)  "
         "[default: on with Primus-Turbo DeepEP, else off]", kind=FlagKind.SWITCH,
         attributed=True),
    Knob("schedule", "schedule", "schedule",
         "Pipeline schedule  [default: interleaved when vpp > 1, else 1f1b]",
         kind=FlagKind.CHOICE, choices=Schedule, combinable=True, attributed=True,
         view="schedule_"),
    Knob("fp8_recipe", "fp8_recipe", "fp8-recipe",
         "FP8 recipe  [default with --precision fp8: mxfp8 on Blackwell, tensorwise elsewhere]",
         kind=FlagKind.CHOICE, choices=Fp8Recipe, combinable=True, attributed=True,
         megatron="fp8_recipe"),
    Knob("distributed_optimizer", "optimizer", "no-distributed-optimizer",
         "Replicate optimizer state (default: distributed optimizer).", kind=FlagKind.FLAG,
         negated=True, combinable=True, attributed=True, megatron="use_distributed_optimizer",
         bridge="optimizer.use_distributed_optimizer"),
    Knob("fsdp", "optimizer", "fsdp", "Fully shard params, grads, optimizer.",
         kind=FlagKind.FLAG, attributed=True, megatron="use_megatron_fsdp",
         bridge="ddp.use_megatron_fsdp"),
    Knob("grad_reduce_in_fp32", None, "grad-reduce-in-bf16", GRAD_BF16_HELP, kind=FlagKind.FLAG,
         negated=True, baseline=False, megatron="grad_reduce_in_bf16"),
    Knob("fp8_param_gather", None, "fp8-param-gather",
         "FP8 runs keep the linear weights in FP8 only (no bf16 copy; Megatron-LM "
         "--fp8-param-gather, Megatron-Bridge mixed_precision.fp8_param_gather)  [default: off]",
         kind=FlagKind.FLAG, baseline=False, megatron="fp8_param_gather",
         bridge="mixed_precision.fp8_param_gather"),
    Knob("pipeline_split", "pipeline_split", "pipeline-split",
         "Layer split: even, embedding_loss (embedding and loss as layer slots), light_first / "
         "light_last / light_ends (the end stages one layer per virtual stage lighter), uneven "
         "(--first/last-stage-layers), layout (--pipeline-layout)  [default: even when layers "
         "divide, else embedding_loss]",
         kind=FlagKind.CHOICE, choices=PipelineSplit, attributed=True),
    Knob("first_stage_layers", None, "first-stage-layers",
         "Uneven split: decoder layers of the first pipeline stage, all its virtual stages "
         "(Megatron-LM --decoder-first-pipeline-num-layers)", hi=MAX_STAGES, baseline=False,
         megatron="decoder_first_pipeline_num_layers",
         bridge="model.num_layers_in_first_pipeline_stage"),
    Knob("last_stage_layers", None, "last-stage-layers",
         "Uneven split: decoder layers of the last pipeline stage (Megatron-LM "
         "--decoder-last-pipeline-num-layers)", hi=MAX_STAGES, baseline=False,
         megatron="decoder_last_pipeline_num_layers",
         bridge="model.num_layers_in_last_pipeline_stage"),
    Knob("pipeline_layout", None, "pipeline-layout",
         "Hand-written layout (Megatron-LM --pipeline-model-parallel-layout), e.g. "
         "'Et*3|(tt|)*29,m|L': E embedding, t decoder layer, m MTP layer, L loss, | next "
         "virtual stage; pp x vpp stages", kind=FlagKind.TEXT, baseline=False,
         megatron="pipeline_model_parallel_layout",
         bridge="model.pipeline_model_parallel_layout"),
)

@dataclass(frozen=True)
class Axis:
    """One search-space axis: the ``ParallelConfig`` fields it sets and how
    ``solver/space.py::default_space`` enumerates its domain.

    ``domain``: the default space's domain in words; ``values``: its values where the registry
    fixes them (``mbs``: capped by the global batch); ``seed_values``: the values the seed
    phase (``agent/seed.py``) steps through, where they differ from ``values``; ``slice``: the
    enumeration may slice the space on it (``solver/feasible.py::SLICEABLE``: fixing it keeps
    every other domain as it is), ``slice_default``: it does by default when experts multiply
    the layouts (``SLICE_AXES``); ``geometry``: the CP-SAT model branches on it first (the
    pipeline geometry: ``solver/model.py::GEOMETRY_FIRST``); ``walk``: its position in the
    attribution walk (``solver/attribution.py::WALK_ORDER``: cheap, strongly pruning families
    first; the recompute options and the optimizer, read only by memory, last)."""

    name: str
    domain: str
    walk: int
    values: tuple[int, ...] = ()
    seed_values: tuple[int, ...] = ()
    slice: bool = False
    slice_default: bool = False
    geometry: bool = False

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(k.field for k in KNOBS if k.axis == self.name)


#: The search axes, in the order the solver branches on them and candidates are listed.
AXIS_TABLE: tuple[Axis, ...] = (
    Axis("tp", "divisors of the world size within the scale-up domain (unless crossing it is "
               "allowed)", walk=0, slice=True, slice_default=True),
    Axis("pp", "divisors of the world size, at most the layer count", walk=2, slice=True,
         slice_default=True, geometry=True),
    Axis("cp", "divisors of the world size where the sequence splits in 2 cp", walk=3,
         slice=True),
    Axis("vpp", "the values some pipeline size and the layer count allow (1 always)", walk=5,
         slice=True, geometry=True),
    Axis("ep", "divisors of the expert count (1 for a dense model)", walk=4, slice=True),
    Axis("etp", "from the policy: {1, tp}, tp, or divisors of the expert FFN width", walk=1),
    # two values on purpose: the exhaustive space stops at 8 (each value multiplies its size),
    # the seed phase doubles or halves mbs up to 16 (one evaluation a move; a baseline, the
    # user's or a published one, may hold 16 and step down from it)
    Axis("mbs", "1, 2, 4, 8 up to the global batch", walk=8, values=(1, 2, 4, 8),
         seed_values=(1, 2, 4, 8, 16), slice=True),
    Axis("pipeline_split", "automatic (even when the layers divide, else embedding_loss) and "
                           "the light splits (light_first, light_last, light_ends) where they "
                           "exist", walk=6, geometry=True),
    Axis("schedule", "from vpp (zero-bubble when asked)", walk=7, geometry=True),
    Axis("fp8_recipe", "from the training precision (every FP8 recipe when asked)", walk=9),
    Axis("dispatcher", "alltoall (flex when asked)", walk=10),
    Axis("optimizer", "distributed optimizer; Megatron-FSDP too with --fsdp "
                      "(solver/space.py::searched_optimizers)", walk=12),
    Axis("recompute", "none; selective module sets per model; full block, K = 1 .. the largest "
                      "virtual stage", walk=11),
)


# ------------------------------------------------------------------ output columns


@dataclass(frozen=True)
class Column:
    """One key of a configuration as the outputs show it (``agent/serialize.py::config_json``:
    ``check --json``, the search's ``best``; the sweep's rows take the ``sweep`` ones,
    ``agent/sweep.py::CONFIG_COLUMNS``), in output order. A knob's column shows its
    ``ParallelConfig`` value (:func:`shown_value`); ``derived`` columns (dp, ga, the training
    batch and sequence, the compute precision, the optimizer state's dtypes) are computed by
    ``config_json``; ``type``: the sweep's column type (a knob's: from its flag kind)."""

    name: str
    sweep: bool = False
    derived: bool = False
    type: type | None = None

    @property
    def value_type(self) -> type:
        if self.type is not None:
            return self.type
        kind = KNOB[self.name].kind
        return {FlagKind.INT: int, FlagKind.FLAG: bool, FlagKind.SWITCH: bool}.get(kind, str)


#: The configuration's output keys in the order ``--json`` writes them, as declared; every knob
#: not declared here follows them (:data:`CONFIG_COLUMNS`).
DECLARED_COLUMNS: tuple[Column, ...] = (
    Column("tp", sweep=True), Column("pp", sweep=True), Column("vpp", sweep=True),
    Column("cp", sweep=True), Column("ep", sweep=True), Column("etp", sweep=True),
    Column("dp", sweep=True, derived=True, type=int), Column("mbs", sweep=True),
    Column("ga", sweep=True, derived=True, type=int), Column("gbs", derived=True, type=int),
    Column("seq_len", derived=True, type=int), Column("recompute", sweep=True),
    Column("recompute_method", sweep=True), Column("recompute_layers", sweep=True),
    Column("recompute_modules", sweep=True), Column("sequence_parallel", sweep=True),
    Column("distributed_optimizer", sweep=True), Column("fsdp", sweep=True),
    Column("grad_reduce_in_fp32", sweep=True), Column("fp8_param_gather"),
    Column("optimizer_state", derived=True, type=dict), Column("dispatcher", sweep=True),
    Column("schedule", sweep=True), Column("precision", derived=True, type=str),
    Column("fp8_recipe", sweep=True), Column("pipeline_split", sweep=True),
    Column("first_stage_layers"), Column("last_stage_layers"), Column("pipeline_layout"),
    Column("flex_backend"), Column("sync_free_stage"), Column("grouped_gemm"),
    Column("permute_fusion"), Column("shared_expert_overlap"), Column("router_fp32"),
)
#: The derived values a constraint may name, with the axes each depends on (dp = world /
#: (tp x pp x cp), ga = gbs / (mbs x dp)).
DERIVED_NAME_AXES: dict[str, tuple[str, ...]] = {"dp": ("tp", "pp", "cp"),
                                                 "ga": ("tp", "pp", "cp", "mbs")}
#: The MoE backend's fields: not CP-SAT axes (none changes memory but the flex dispatcher's
#: buffers, which the ``dispatcher`` axis carries); the search picks them per layout after the
#: enumeration (``agent/backend.py``).
BACKEND_FIELDS: tuple[str, ...] = ("flex_backend", "sync_free_stage", "grouped_gemm",
                                   "permute_fusion", "shared_expert_overlap", "router_fp32")
#: The MoE-only axes: a dense model's search, seed phase and attribution leave them alone.
MOE_AXES: tuple[str, ...] = ("ep", "etp", "dispatcher")


# ------------------------------------------------------------------ derived from the tables

#: ``KNOBS`` by field, ``AXIS_TABLE`` by name.
KNOB: dict[str, Knob]
AXIS: dict[str, Axis]
#: Axis names of a search space (``SearchSpace`` fields), in branching order.
AXES: tuple[str, ...]
#: The integer axes (their domains are sizes; the solver's value is the value itself, the other
#: axes' values are indices into their domains).
INT_AXES: tuple[str, ...]
#: The other axes: their domains are choices (enum members, options), non-empty without repeats.
CHOICE_AXES: tuple[str, ...]
#: The plain integer axes (``Knob.plain``): every edge reads and writes them generically.
PLAIN_AXES: tuple[str, ...]
#: The axes the enumeration may slice on, and those it slices on by default (MoE spaces).
SLICEABLE_AXES: tuple[str, ...]
SLICE_DEFAULT_AXES: tuple[str, ...]
#: The axes CP-SAT branches on first: the pipeline geometry.
GEOMETRY_AXES: tuple[str, ...]
#: The attribution walk's axis order.
WALK_AXES: tuple[str, ...]
#: Micro-batch sizes a default search tries (capped by the global batch), and those the seed
#: phase steps through (:class:`Axis` ``mbs``).
SEARCH_MBS: tuple[int, ...]
SEED_MBS: tuple[int, ...]
#: The configuration fields one recompute option sets (``RecomputeOption.config_fields``).
RECOMPUTE_FIELDS: tuple[str, ...]
#: ``--baseline KEY=VALUE`` keys.
BASELINE_KEYS: tuple[str, ...]
#: Fields a planner combination may set (``agent/llm.py::CombinationHint``).
COMBINATION_AXES: tuple[str, ...]
#: The changes the search's attribution walks (``agent/search.py::attribute``); ``recompute``
#: stands for every field of :data:`RECOMPUTE_FIELDS`.
ATTRIBUTION_FIELDS: tuple[str, ...]
#: The axes ``--pareto-color`` takes, in flag order.
PLOT_AXES: tuple[str, ...]
#: The configuration's output keys, in the order ``--json`` writes them: the declared ones,
#: then every other knob (a new knob shows up in the outputs without another edit).
CONFIG_COLUMNS: tuple[Column, ...]
#: The sweep's configuration columns (a row per scenario).
SWEEP_COLUMNS: tuple[Column, ...]
#: The values a ``--constraint`` (and the planner's hints) may name, in the order errors list
#: them (output order): the integer axes and the derived dp and ga.
CONSTRAINT_NAMES: tuple[str, ...]
#: The search axes each constraint name depends on.
CONSTRAINT_NAME_AXES: dict[str, tuple[str, ...]]


def _derive() -> None:
    """Every derived name above, from :data:`KNOBS` and :data:`AXIS_TABLE` (once at import, and
    again by :func:`register_axis`)."""
    global KNOB, AXIS, AXES, INT_AXES, CHOICE_AXES, PLAIN_AXES, SLICEABLE_AXES
    global SLICE_DEFAULT_AXES, GEOMETRY_AXES, WALK_AXES, SEARCH_MBS, SEED_MBS, RECOMPUTE_FIELDS
    global BASELINE_KEYS, COMBINATION_AXES, ATTRIBUTION_FIELDS, PLOT_AXES, CONFIG_COLUMNS
    global SWEEP_COLUMNS, CONSTRAINT_NAMES, CONSTRAINT_NAME_AXES
    KNOB = {k.field: k for k in KNOBS}
    AXIS = {a.name: a for a in AXIS_TABLE}
    AXES = tuple(a.name for a in AXIS_TABLE)
    INT_AXES = tuple(a for a in AXES if a in KNOB and KNOB[a].kind is FlagKind.INT)
    CHOICE_AXES = tuple(a for a in AXES if a not in INT_AXES)
    PLAIN_AXES = tuple(a for a in AXES if a in KNOB and KNOB[a].plain)
    SLICEABLE_AXES = tuple(a.name for a in AXIS_TABLE if a.slice)
    SLICE_DEFAULT_AXES = tuple(a.name for a in AXIS_TABLE if a.slice_default)
    GEOMETRY_AXES = tuple(a.name for a in AXIS_TABLE if a.geometry)
    WALK_AXES = tuple(a.name for a in sorted(AXIS_TABLE, key=lambda a: a.walk))
    SEARCH_MBS, SEED_MBS = AXIS["mbs"].values, AXIS["mbs"].seed_values
    RECOMPUTE_FIELDS = AXIS["recompute"].fields
    BASELINE_KEYS = tuple(k.field for k in KNOBS if k.baseline)
    COMBINATION_AXES = tuple(k.field for k in KNOBS if k.combinable)
    ATTRIBUTION_FIELDS = tuple(k.field for k in KNOBS if k.attributed)
    PLOT_AXES = tuple(k.field for k in KNOBS if k.plotted)
    named = {c.name for c in DECLARED_COLUMNS}
    CONFIG_COLUMNS = DECLARED_COLUMNS + tuple(
        Column(k.field, sweep=k.plain) for k in KNOBS if k.field not in named)
    SWEEP_COLUMNS = tuple(c for c in CONFIG_COLUMNS if c.sweep)
    CONSTRAINT_NAMES = tuple(
        c.name for c in CONFIG_COLUMNS if c.name in INT_AXES or c.name in DERIVED_NAME_AXES)
    CONSTRAINT_NAME_AXES = {n: DERIVED_NAME_AXES.get(n, (n,)) for n in CONSTRAINT_NAMES}
    # every axis sets at least one knob, every knob's axis exists, the walk orders every axis
    # once, every declared column is a knob or derived, and a plain axis is an integer axis
    assert {k.axis for k in KNOBS} - {None} == set(AXES)
    assert sorted(a.walk for a in AXIS_TABLE) == list(range(len(AXIS_TABLE)))
    assert len(named) == len(DECLARED_COLUMNS), "a column is declared twice"
    assert not {c.name for c in DECLARED_COLUMNS if not c.derived} - set(KNOB)
    assert all(KNOB[a].kind is FlagKind.INT and KNOB[a].field == a for a in PLAIN_AXES)
    assert AXES[-1] == "recompute", "the recompute option is the last axis"


_derive()


def register_axis(knob: Knob, axis: Axis) -> None:
    """Add a plain integer axis (``knob.plain``, ``knob.field == axis.name``) to the registry
    and re-derive every list from it: what a test does to show that a new axis needs no edit
    outside its registry entry and its mechanism (``tests/test_add_axis.py``). Call it before
    any other tune-cp module is imported (they read the derived lists at import)."""
    global KNOBS, AXIS_TABLE
    assert knob.plain and knob.field == axis.name == knob.axis, "a plain axis of its own"
    KNOBS = (*KNOBS, knob)
    # before the recompute option, which stays last (solver/feasible.py reads it there)
    AXIS_TABLE = (*AXIS_TABLE[:-1], axis, AXIS_TABLE[-1])
    _derive()


def shown_value(cfg: object, knob: Knob) -> object:
    """A knob's value as outputs show it: the ``view`` attribute of a resolved configuration,
    enum members by value, tuples as lists; ``unset`` under a recompute kind the field does not
    apply to."""
    if knob.shown_for is not None and cfg.recompute != knob.shown_for:
        value = knob.unset
    else:
        value = getattr(cfg, knob.view or knob.field)
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value


# ------------------------------------------------------------------ recompute module sets


@dataclass(frozen=True)
class ModuleSet:
    """A selective-recompute module set worth trying, and for which models: ``when`` reads the
    model and training specs."""

    modules: tuple[str, ...]
    when: Callable[[ModelSpec, TrainingSpec], bool]


def _no_flash(m: ModelSpec, t: TrainingSpec) -> bool:
    """``core_attn`` only matters without flash attention (flash attention already recomputes
    the scores)."""
    return not t.flash_attention


def _mla(m: ModelSpec, t: TrainingSpec) -> bool:
    """``mla_up_proj``: the MLA up-projections."""
    return m.mla is not None


def _moe(m: ModelSpec, t: TrainingSpec) -> bool:
    """``moe_act`` drops the largest MoE activation."""
    return m.is_moe


def _dense(m: ModelSpec, t: TrainingSpec) -> bool:
    return bool(m.num_dense_layers_effective) and not m.is_moe


#: The modules the exhaustive space tries, each alone, and all those that apply together when
#: there are several (``solver/space.py::selective_options``): few sets, since each multiplies
#: the recompute domain of every layout.
SEARCH_SELECTIVE: tuple[ModuleSet, ...] = (
    ModuleSet(("core_attn",), _no_flash), ModuleSet(("mla_up_proj",), _mla),
    ModuleSet(("moe_act",), _moe),
)
#: The sets the seed phase moves to (``agent/seed.py::selective_sets``), one move each: the
#: search's modules and two the exhaustive space leaves out (``moe_act`` with ``layernorm``,
#: ``mlp`` of a dense model), since a single move costs one evaluation, not a domain.
SEED_SELECTIVE: tuple[ModuleSet, ...] = (
    ModuleSet(("core_attn",), _no_flash), ModuleSet(("moe_act",), _moe),
    ModuleSet(("moe_act", "layernorm"), _moe), ModuleSet(("mla_up_proj",), _mla),
    ModuleSet(("mlp",), _dense),
)


def module_sets(sets: tuple[ModuleSet, ...], model: ModelSpec,
                training: TrainingSpec) -> list[tuple[str, ...]]:
    """The module sets of ``sets`` that apply to this model and training."""
    return [s.modules for s in sets if s.when(model, training)]


@dataclass(frozen=True)
class RunKnob:
    """One framework run setting of ``solver/settings.py::RunSettings`` (not a
    ``ParallelConfig`` field: fixed for a whole check, search or plan, never searched), with its
    flag and the frameworks' spellings (the exporters and readers in ``formats/`` write and read
    these names; ``formats/keys.py`` has the readers' key types).

    ``field``: the ``oracle.memory.RunOptions`` field (given to ``RunSettings`` by that name,
    stored as its ``overheads.run``); ``flag``: the command-line flag (``--`` + spelling);
    ``kind``: ``FLAG`` with ``negated`` False is a ``--x/--no-x`` switch here; ``metavar``: the
    value's name; ``megatron``: Megatron-LM flags (``arguments.py`` at ``d98e8a64dd``);
    ``primus``: Primus keys (``trainer_base.yaml`` / ``language_model.yaml`` at ``fd1eeabbad``);
    ``bridge``: Megatron-Bridge ``ConfigContainer`` fields (``067f987df0``).
    """

    field: str
    flag: str
    help: str
    metavar: str
    megatron: tuple[str, ...]
    primus: tuple[str, ...]
    bridge: tuple[str, ...]


#: The framework run settings the published recipes vary, in the order their flags are listed.
RUN_KNOBS: tuple[RunKnob, ...] = (
    RunKnob("cuda_graph_scope", "cuda-graph-scope",
            "CUDA graphs: per-layer parts, comma separated (attn,mlp,moe_router,"
            "moe_preprocess: Megatron-LM --cuda-graph-impl transformer_engine "
            "--cuda-graph-modules ...), full_iteration (--cuda-graph-impl full_iteration), or "
            "none  [default: none]",
            "attn,mlp,moe_router,moe_preprocess|full_iteration|none",
            megatron=("--cuda-graph-impl", "--cuda-graph-modules", "--cuda-graph-scope"),
            primus=("external_cuda_graph", "enable_cuda_graph", "cuda_graph_scope"),
            bridge=("model.cuda_graph_impl", "model.cuda_graph_modules")),
    RunKnob("moe_a2a_overlap", "moe-a2a-overlap",
            "Overlap the MoE dispatch/combine all-to-all of one micro-batch with another's "
            "computation (Megatron-LM --overlap-moe-expert-parallel-comm --delay-wgrad-compute; "
            "needs ep > 1, no full recompute, interleaving when pp > 1)  [default: off]",
            "", megatron=("--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"),
            primus=("overlap_moe_expert_parallel_comm", "delay_wgrad_compute"),
            bridge=("comm_overlap.overlap_moe_expert_parallel_comm",
                    "comm_overlap.delay_wgrad_compute")),
    RunKnob("moe_capacity_factor", "moe-token-drop",
            "Token-drop MoE: each expert's input padded to this capacity factor (Megatron-LM "
            "--moe-expert-capacity-factor C --moe-pad-expert-input-to-capacity)  [default: "
            "dropless]", "CAPACITY_FACTOR",
            megatron=("--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity"),
            primus=("moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity"),
            bridge=("model.moe_expert_capacity_factor", "model.moe_pad_expert_input_to_capacity")),
)
RUN_KNOB: dict[str, RunKnob] = {k.field: k for k in RUN_KNOBS}
