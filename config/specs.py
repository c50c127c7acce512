"""Specifications: what is trained (model), where (GPU, cluster), how (training, parallel config).

House rules (see docs/architecture.md):

* every spec is a frozen pydantic model with ``extra="forbid"``; field bounds live in ``Field``;
* validators only *check* one spec in isolation; cross-spec legality (tp divides the heads, the
  world size decomposes, ...) lives in ``solver/rules.py`` and nowhere else;
* derived values (dp, ga, etp, sequence parallel, schedule, pipeline split, FP8 recipe) are filled
  by one named resolver, ``config/resolve.py`` (:func:`config.resolve.resolve` over a columnar
  batch, ``resolve_config`` for one configuration), never by validators;
* units are in the names: ``*_bytes`` are integer bytes, ``*_flops`` FLOP/s, ``*_bytes_per_s``.
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tune_cp.config._plugins import skip_plugin_scan

skip_plugin_scan()  # before the first model is built: tune-cp uses no pydantic plugins

GIB = 2**30
#: Largest MoE expert capacity factor a run setting may give (``RunOptions.moe_capacity_factor``,
#: ``--moe-token-drop``; a sweep grid's ``moe_capacity_factor``): an input bound, not a rule.
MAX_MOE_CAPACITY_FACTOR = 64.0
MAX_DIM = 1 << 24  # no real transformer dimension comes near 16 Mi; larger values are typos
MAX_GPUS = 1 << 20


def nodes_text(n: int) -> str:
    """``1 node``, ``4 nodes``: a node count in words, for messages and reports."""
    return f"{n} node{'' if n == 1 else 's'}"
#: Most decoder layers a model may have: four times the deepest published one (Llama 3.1 405B,
#: 126). The pipeline-stage tables grow with the layer count; at 512 a search with its
#: explanation ends in seconds, at 100,000 it runs for minutes.
MAX_LAYERS = 512


class Spec(BaseModel):
    """Base of every spec: immutable, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


# --------------------------------------------------------------------------------------- enums


class NormKind(StrEnum):
    RMSNORM = "rmsnorm"
    LAYERNORM = "layernorm"


class PositionEmbedding(StrEnum):
    """``none``: no position embedding at all (Megatron-LM ``--position-embedding-type none``;
    Nemotron-H 47B/56B and Nemotron 3, whose Mamba layers carry the position)."""

    ROPE = "rope"
    LEARNED = "learned"
    NONE = "none"


class Precision(StrEnum):
    """GEMM precision of the transformer layers. ``fp4`` is NVFP4 (Blackwell; Transformer Engine
    ``NVFP4BlockScaling``, Megatron-Bridge ``bf16_with_nvfp4_mixed``); the memory accounting counts
    its saved GEMM inputs and weight copies at 9/16 B per element (``oracle/memory.py``)."""

    BF16 = "bf16"
    FP8 = "fp8"
    FP4 = "fp4"


class Fp8Recipe(StrEnum):
    """Transformer Engine FP8 recipes (Megatron-LM ``--fp8-recipe``)."""

    DELAYED = "delayed"
    TENSORWISE = "tensorwise"
    BLOCKWISE = "blockwise"
    MXFP8 = "mxfp8"


class Recompute(StrEnum):
    """Activation recomputation granularity (Megatron-LM ``--recompute-granularity``)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class RecomputeMethod(StrEnum):
    """How full recomputation picks layers (Megatron-LM ``--recompute-method``).

    ``block``: the first ``recompute_layers`` layers of every pipeline chunk are checkpointed at
    their input, the others keep all activations. ``uniform``: the chunk's layers are cut into
    groups of ``recompute_layers`` and each group is checkpointed at its input.
    """

    UNIFORM = "uniform"
    BLOCK = "block"


class Dispatcher(StrEnum):
    """MoE token dispatcher (Megatron-Core ``--moe-token-dispatcher-type``); ``flex`` is DeepEP."""

    ALLTOALL = "alltoall"
    ALLGATHER = "allgather"
    FLEX = "flex"


class FlexBackend(StrEnum):
    """The library behind the ``flex`` dispatcher: NVIDIA DeepEP or HybridEP (Megatron-Core
    ``--moe-flex-dispatcher-backend``, ``transformer_config.py`` l.898 at d98e8a64), or
    Primus-Turbo's DeepEP on ROCm (Primus ``use_turbo_deepep``, ``primus_turbo.yaml``)."""

    DEEPEP = "deepep"
    HYBRIDEP = "hybridep"
    TURBO = "turbo"


class GroupedGemm(StrEnum):
    """How the local experts' GEMMs run (Megatron-Core ``moe/experts.py``): ``sequential`` a
    Python loop over the experts (``SequentialMLP``, ``--moe-grouped-gemm`` off), ``legacy``
    the ``grouped_gemm`` package (``GroupedMLP``, ``--moe-use-legacy-grouped-gemm``), ``te``
    Transformer Engine ``GroupedLinear`` (``TEGroupedMLP``), ``turbo`` Primus-Turbo's CK
    grouped GEMM (``PrimusTurboGroupedMLP``, Primus ``use_turbo_grouped_gemm``)."""

    SEQUENTIAL = "sequential"
    LEGACY = "legacy"
    TE = "te"
    TURBO = "turbo"


class Schedule(StrEnum):
    """Pipeline schedule."""

    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    ZERO_BUBBLE = "zero_bubble"


class PipelineSplit(StrEnum):
    """How decoder layers are cut into pipeline (virtual) stages (the layer lists of every
    value: ``oracle/memory.py::pipeline_chunks``; legality: ``solver/rules.py::split_problem``).

    ``even``: ``num_layers`` splits evenly over ``pp * vpp`` virtual stages.
    ``embedding_loss``: the embedding and the loss count as one layer slot each (Megatron-LM
    ``--account-for-embedding-in-pipeline-split`` and ``--account-for-loss-in-pipeline-split``),
    so the first and last virtual stage carry one decoder layer fewer and ``num_layers + 2``
    must split evenly; MTP layers are no slot (Megatron-Core builds them on the last virtual
    stage besides its share).
    ``uneven``: the first and/or last pipeline stage hold the decoder layers
    :attr:`ParallelConfig.first_stage_layers` / ``last_stage_layers`` say (Megatron-LM
    ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``,
    Megatron-Core ``num_layers_in_first/last_pipeline_stage``), over all their virtual stages;
    the other layers divide evenly over the middle stages.
    ``light_first`` / ``light_last`` / ``light_ends``: ``uneven`` with the first / last / both
    end stages one decoder layer per virtual stage lighter than a middle stage (Meta's Llama 3
    405B balance: one layer off the first and the last stage); ``last_to_first``: one layer moves
    from the last stage (output layer, loss, MTP) to the first (the embedding costs little
    time), so it exists wherever ``even`` does without virtual stages. The counts follow from
    (layers, pp, vpp): ``oracle/memory.py::uneven_stage_layers``.
    ``layout``: a hand-written layout (:attr:`ParallelConfig.pipeline_layout`, Megatron-LM
    ``--pipeline-model-parallel-layout``).
    ``embedding_mtp_loss``: of a model with MTP layers, the embedding, each MTP layer and the
    loss one layer slot each, ``num_layers + 2 + mtp`` slots split evenly (DeepSeek-V3 at pp 16:
    4 per stage, MTP beside the loss). Megatron-LM's account-for flags cannot say it (they give
    MTP no slot), so it is written as the ``--pipeline-model-parallel-layout`` it is
    (``oracle/memory.py::split_layout``) and checked by that layout's rules.
    """

    EVEN = "even"
    EMBEDDING_LOSS = "embedding_loss"
    UNEVEN = "uneven"
    LIGHT_FIRST = "light_first"
    LIGHT_LAST = "light_last"
    LIGHT_ENDS = "light_ends"
    LAST_TO_FIRST = "last_to_first"
    LAYOUT = "layout"
    EMBEDDING_MTP_LOSS = "embedding_mtp_loss"


#: layer slots the ``embedding_loss`` split adds besides the decoder and MTP layers: the
#: embedding and the loss, one each (Megatron-LM ``--account-for-embedding-in-pipeline-split``,
#: ``--account-for-loss-in-pipeline-split``)
EMBEDDING_LOSS_SLOTS = 2
#: the light splits: uneven splits whose end stages' layers follow from (layers, pp, vpp)
LIGHT_SPLITS: tuple[PipelineSplit, ...] = (
    PipelineSplit.LIGHT_FIRST, PipelineSplit.LIGHT_LAST, PipelineSplit.LIGHT_ENDS,
    PipelineSplit.LAST_TO_FIRST)
#: the splits whose layer lists follow from (layers, pp, vpp) alone: every split but ``uneven``
#: and ``layout``, which need values (the search space's splits: ``solver/space.py``; the codes
#: every batch of the vectorised path starts with: ``config/codes.py::VALUELESS_SPLIT_KEYS``)
VALUELESS_SPLITS: tuple[PipelineSplit, ...] = (
    PipelineSplit.EVEN, PipelineSplit.EMBEDDING_LOSS, *LIGHT_SPLITS,
    PipelineSplit.EMBEDDING_MTP_LOSS)
#: the splits whose layer slots divide evenly over the virtual stages (no end stage given):
#: their slot counts ``solver/rules.py::split_slots``
SLOT_SPLITS: tuple[PipelineSplit, ...] = (
    PipelineSplit.EVEN, PipelineSplit.EMBEDDING_LOSS, PipelineSplit.EMBEDDING_MTP_LOSS)
#: the light splits a search tries beside the automatic one (``solver/space.py::default_space``):
#: the last stage lighter (its output layer, loss and MTP layers cost time: Llama 3 8B's output
#: layer is ~2.4 decoder layers of GEMM work), both ends lighter (Meta's Llama 3 405B balance)
#: and a layer moved from the last stage to the first (the one that competes with ``even``).
#: ``light_first`` (the embedding costs little time, and stage 1 holds almost as many in-flight
#: micro-batches as stage 0) stays a choice for ``check``, not searched: each split value costs
#: enumeration time
SEARCHED_LIGHT_SPLITS: tuple[PipelineSplit, ...] = (
    PipelineSplit.LIGHT_LAST, PipelineSplit.LAST_TO_FIRST)
#: layers per virtual stage the light splits take off the (first, last) pipeline stage (-1:
#: one more than a middle stage; ``last_to_first`` moves one layer in all, whatever vpp:
#: ``oracle/memory.py::uneven_stage_layers``)
LIGHT_TRIM: dict[PipelineSplit, tuple[int, int]] = {
    PipelineSplit.LIGHT_FIRST: (1, 0), PipelineSplit.LIGHT_LAST: (0, 1),
    PipelineSplit.LIGHT_ENDS: (1, 1), PipelineSplit.LAST_TO_FIRST: (-1, 1)}


#: Megatron-Core ``PipelineParallelLayerLayout`` characters: embedding, decoder layer, MTP
#: layer, loss (``pipeline_parallel_layer_layout.py::parse_str_to_list``)
LAYOUT_CHARS: frozenset[str] = frozenset("EtmL")
#: the most characters a layout may unroll to (a hostile ``(t|)*10**9`` stays small)
MAX_LAYOUT_CHARS = 1_000_000
_LAYOUT_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
_LAYOUT_REPEAT = re.compile(r"(.)\*(\d+)")


def parse_pipeline_layout(text: str) -> tuple[str, ...]:
    """A Megatron-LM ``--pipeline-model-parallel-layout`` string as its virtual stages, in
    virtual-stage order, each a string of ``E t m L`` (Megatron-Core
    ``PipelineParallelLayerLayout.parse_str_to_list``: commas are cosmetic, ``(xy|)*n`` and
    ``x*n`` repeat, ``|`` separates virtual stages). ``"Et*3|(tt|)*29,m|L"`` is DeepSeek-V3's 32
    stages. Raises ``ValueError`` (one line) on a character Megatron does not know."""
    flat = text.replace(",", "")
    for pattern in (_LAYOUT_GROUP, _LAYOUT_REPEAT):
        size = len(flat)
        for mt in pattern.finditer(flat):
            size += len(mt.group(1)) * int(mt.group(2)) - len(mt.group(0))
            if size > MAX_LAYOUT_CHARS:
                raise ValueError(f"pipeline layout {text[:40]!r} unrolls to more than "
                                 f"{MAX_LAYOUT_CHARS:,} characters")
        flat = pattern.sub(lambda mt: mt.group(1) * int(mt.group(2)), flat)
    stages = tuple(flat.split("|"))
    bad = sorted(set(flat) - LAYOUT_CHARS - {"|"})
    if bad:
        raise ValueError(f"pipeline layout {text[:40]!r}: unknown character(s) {bad}; Megatron's "
                         f"layout knows E (embedding), t (decoder layer), m (MTP layer), L (loss), "
                         f"| (next virtual stage), (...)*n and x*n")
    return stages


class RopeScaling(StrEnum):
    """Rotary-embedding frequency scaling: ``llama3`` (Megatron-LM ``--use-rope-scaling
    --rope-scaling-factor F``; HF ``rope_type llama3``), ``yarn`` (``--position-embedding-type
    yarn --rotary-scaling-factor F``; HF ``rope_type yarn``)."""

    NONE = "none"
    LLAMA3 = "llama3"
    YARN = "yarn"


class Activation(StrEnum):
    """MLP activation. ``default``: Megatron-LM's default for the MLP kind (SwiGLU when
    ``gated_mlp``, GELU otherwise); ``quick_geglu``: gpt-oss's ``x sigmoid(1.702 x)`` gate
    (``--quick-geglu``); ``squared_relu``: Nemotron (``--squared-relu``). The MLP's matmul
    FLOPs and weights follow ``gated_mlp`` only; the activation's elementwise cost is the same
    kind of term for all of them."""

    DEFAULT = "default"
    QUICK_GEGLU = "quick_geglu"
    SQUARED_RELU = "squared_relu"


class RouterScore(StrEnum):
    """MoE router score function (Megatron-LM ``--moe-router-score-function``)."""

    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


class StateDtype(StrEnum):
    """Storage dtype of one optimizer-state tensor (Megatron-LM ``--main-params-dtype``,
    ``--exp-avg-dtype``, ``--exp-avg-sq-dtype``; ``megatron/training/arguments.py`` L3673-3685
    at d98e8a6; ``fp8`` is stored as ``torch.uint8``, L1078)."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"


#: bytes per element of each optimizer-state dtype (fp8: one byte; its per-tensor scale is
#: below a MiB and ignored)
STATE_DTYPE_BYTES: dict[StateDtype, int] = {
    StateDtype.FP32: 4, StateDtype.BF16: 2, StateDtype.FP16: 2, StateDtype.FP8: 1}


class OptimizerState(Spec):
    """The dtypes the Adam optimizer keeps its state in (fixed per search, not an axis).

    The default is Megatron-LM's: fp32 master weights and fp32 moments (12 B/param).
    ``precision_aware`` is Megatron-LM ``--use-precision-aware-optimizer`` (Transformer Engine's
    ``FusedAdam`` holds the state: ``megatron/core/optimizer/__init__.py`` L564-588 at d98e8a6).
    Without it every dtype must be fp32 (``optimizer_config.py`` L466-480). With it and fp32
    master weights over bf16 parameters, TE stores only the 16-bit remainder of each fp32 master
    weight beside the bf16 parameter (``store_param_remainders``, default True,
    ``optimizer_config.py`` L192; the remainder is an ``int16`` shard, ``distrib_optimizer.py``
    L1007-1009), except under an FP8 recipe other than delayed scaling, where Megatron-Core
    keeps the fp32 master itself (``optimizer_config.py`` L407-413, ``__init__.py`` L576).
    ``bf16`` master weights are NeMo 1.x's Apex ``DistributedFusedAdam`` with ``optim.dtype:
    bf16`` (Megatron-LM's argparse takes fp32/fp16 only, L3673)."""

    precision_aware: bool = False
    main_params: StateDtype = StateDtype.FP32
    exp_avg: StateDtype = StateDtype.FP32
    exp_avg_sq: StateDtype = StateDtype.FP32
    param_remainders: bool = Field(
        default=True, description="fp32 master weights as 16-bit remainders (TE "
        "store_param_remainders; Megatron-Core OptimizerConfig default True)")

    @model_validator(mode="after")
    def _check(self) -> OptimizerState:
        if self.main_params is StateDtype.FP8:
            raise ValueError("main_params fp8 is not a master-weight dtype; choose fp32, fp16 "
                             "or bf16")
        low = [f"{k} {v.value}" for k, v in (("main_params", self.main_params),
               ("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq))
               if v is not StateDtype.FP32]
        if low and not self.precision_aware:
            raise ValueError(f"optimizer state {', '.join(low)} needs the precision-aware "
                             "optimizer (Megatron-LM --use-precision-aware-optimizer; "
                             "megatron/core/optimizer/optimizer_config.py L466-480)")
        return self

    @property
    def is_default(self) -> bool:
        return self == OptimizerState()

    def master_bytes(self, fp8_recipe: Fp8Recipe | None) -> int:
        """Bytes per parameter of the master weights (see the class docstring)."""
        if not self.precision_aware:
            return 4
        if self.main_params is StateDtype.FP32:
            remainders = self.param_remainders and fp8_recipe in (None, Fp8Recipe.DELAYED)
            return 2 if remainders else 4
        return STATE_DTYPE_BYTES[self.main_params]

    def moment_bytes(self) -> int:
        """Bytes per parameter of the two Adam moments."""
        return STATE_DTYPE_BYTES[self.exp_avg] + STATE_DTYPE_BYTES[self.exp_avg_sq]


class Vendor(StrEnum):
    NVIDIA = "nvidia"
    AMD = "amd"
    OTHER = "other"


# ---------------------------------------------------------------------------------------- model


class MlaSpec(Spec):
    """Multi-head latent attention dimensions (DeepSeek-V2/V3)."""

    q_lora_rank: int = Field(ge=0, le=MAX_DIM, description="0: queries are not compressed")
    kv_lora_rank: int = Field(ge=1, le=MAX_DIM)
    qk_nope_head_dim: int = Field(ge=1, le=MAX_DIM)
    qk_rope_head_dim: int = Field(ge=0, le=MAX_DIM)
    v_head_dim: int = Field(ge=1, le=MAX_DIM)


class MambaSpec(Spec):
    """Mamba-2 mixer dimensions (Megatron-Core ``ssm/mamba_mixer.py``; Megatron-LM
    ``--mamba-state-dim``, ``--mamba-head-dim``, ``--mamba-num-groups``, ``--mamba-num-heads``;
    Hugging Face ``NemotronHConfig`` ``ssm_state_size``, ``mamba_head_dim``, ``n_groups``,
    ``mamba_num_heads``, ``conv_kernel``, ``chunk_size``). ``d_inner = num_heads x head_dim``."""

    state_dim: int = Field(ge=1, le=MAX_DIM, description="d_state (N)")
    head_dim: int = Field(ge=1, le=MAX_DIM, description="P")
    num_heads: int = Field(ge=1, le=MAX_DIM, description="nheads (d_inner / head_dim)")
    num_groups: int = Field(default=8, ge=1, le=MAX_DIM, description="ngroups of B and C")
    conv_kernel: int = Field(default=4, ge=1, le=64, description="d_conv")
    chunk_size: int = Field(default=128, ge=1, le=1 << 16, description="SSD scan chunk")

    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @model_validator(mode="after")
    def _check(self) -> MambaSpec:
        if self.num_heads % self.num_groups:
            raise ValueError(f"mamba num_heads ({self.num_heads}) must be a multiple of "
                             f"num_groups ({self.num_groups})")
        return self


#: Megatron-Core's hybrid layer symbols (``ssm/mamba_hybrid_layer_allocation.py::Symbols``):
#: each character of ``--hybrid-override-pattern`` is one decoder layer of that kind.
HYBRID_SYMBOLS = frozenset("M*-E")


class ModelSpec(Spec):
    """A decoder-only transformer, dense or mixture-of-experts, or a hybrid Mamba model.

    Symbols used throughout the oracle: h = ``hidden_size``, f = ``ffn_hidden_size``,
    a = ``num_attention_heads``, g = ``num_kv_heads``, d = ``head_dim``, V = ``vocab_size``,
    E = ``num_experts``, k = ``moe_top_k``, f_e = ``expert_ffn_hidden_size``.
    """

    name: str = Field(min_length=1)
    family: str = Field(default="custom", description="llama, mixtral, qwen3_moe, ...")
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    hidden_size: int = Field(ge=1, le=MAX_DIM)
    ffn_hidden_size: int = Field(ge=0, le=MAX_DIM, description="dense MLP width; 0 if none")
    num_attention_heads: int = Field(ge=1, le=MAX_DIM)
    num_kv_heads: int = Field(ge=1, le=MAX_DIM)
    head_dim: int = Field(ge=1, le=MAX_DIM)
    vocab_size: int = Field(ge=1, le=1 << 28)
    tied_embeddings: bool = False
    norm: NormKind = NormKind.RMSNORM
    gated_mlp: bool = True
    qkv_bias: bool = False
    attn_out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    attention_sinks: bool = False
    position_embedding: PositionEmbedding = PositionEmbedding.ROPE
    max_position_embeddings: int = Field(default=0, ge=0, le=1 << 28)
    attention_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    hidden_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    sliding_window: int = Field(default=0, ge=0, description="window of sliding-window layers")
    num_sliding_window_layers: int = Field(default=0, ge=0)
    # Settings that define the model but do not change memory or time; kept so that exports
    # train the model that was checked (defaults: Megatron-LM's).
    rotary_base: float = Field(default=10000.0, gt=0, description="RoPE theta (--rotary-base)")
    rope_scaling: RopeScaling = RopeScaling.NONE
    rope_scaling_factor: float = Field(default=1.0, ge=1.0)
    rope_original_max_position_embeddings: int = Field(default=0, ge=0, le=1 << 28)
    norm_epsilon: float = Field(default=1e-5, gt=0, lt=1, description="--norm-epsilon")
    activation: Activation = Activation.DEFAULT
    activation_clamp: float = Field(default=0.0, ge=0, description="0: no clamp (gpt-oss 7)")
    glu_linear_offset: float = Field(default=0.0, description="gpt-oss: 1 (x_linear + 1)")
    shared_expert_gate: bool = Field(default=False, description="sigmoid gate on shared experts")
    router_score: RouterScore = RouterScore.SOFTMAX
    router_num_groups: int = Field(default=0, ge=0, description="0: no group-limited routing")
    router_group_topk: int = Field(default=0, ge=0)
    router_topk_scaling_factor: float = Field(default=1.0, gt=0)
    # mixture of experts
    num_experts: int = Field(default=0, ge=0, le=1 << 16)
    moe_top_k: int = Field(default=0, ge=0, le=1 << 16)
    expert_ffn_hidden_size: int = Field(default=0, ge=0, le=MAX_DIM)
    num_shared_experts: int = Field(default=0, ge=0, le=1 << 10)
    shared_expert_ffn_hidden_size: int = Field(default=0, ge=0, le=MAX_DIM)
    num_dense_layers: int = Field(default=0, ge=0, description="leading layers with a dense MLP")
    router_bias: bool = False
    router_expert_bias: bool = Field(
        default=False, description="per-expert score-correction bias (DeepSeek-V3 aux-free)"
    )
    # attention variants
    mla: MlaSpec | None = None
    num_mtp_layers: int = Field(default=0, ge=0, le=64, description="multi-token prediction")
    # hybrid Mamba models (Nemotron-H, Nemotron 3): one pattern character per decoder layer
    hybrid_pattern: str = Field(
        default="", max_length=MAX_LAYERS,
        description="Megatron-LM --hybrid-override-pattern: M Mamba-2 mixer, * attention, "
        "- dense MLP, E MoE, one character per layer; empty: every layer is attention + MLP/MoE",
    )
    mamba: MambaSpec | None = None
    moe_latent_size: int = Field(
        default=0, ge=0, le=MAX_DIM,
        description="latent MoE (Megatron-Core --moe-latent-size): routed experts work on a "
        "latent width, with replicated h -> latent -> h projections; 0: off",
    )
    default_seq_len: int = Field(default=4096, ge=1, le=1 << 24)
    default_global_batch_size: int = Field(default=256, ge=1, le=1 << 30)
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.num_experts:
            if not 1 <= self.moe_top_k <= self.num_experts:
                raise ValueError(
                    f"moe_top_k ({self.moe_top_k}) must be in 1..num_experts ({self.num_experts})"
                )
            if self.expert_ffn_hidden_size < 1:
                raise ValueError("expert_ffn_hidden_size must be positive for an MoE model")
            if self.num_dense_layers > self.num_layers:
                raise ValueError(
                    f"num_dense_layers ({self.num_dense_layers}) exceeds "
                    f"num_layers ({self.num_layers})"
                )
            if self.router_num_groups:
                # Megatron-Core moe_utils.py::group_limited_topk views the scores as
                # (tokens, num_groups, num_experts / num_groups) and takes torch.topk of
                # group_topk groups: the groups divide the experts and group_topk <= num_groups
                if self.num_experts % self.router_num_groups:
                    raise ValueError(f"router_num_groups ({self.router_num_groups}) must divide "
                                     f"num_experts ({self.num_experts})")
                if self.router_group_topk > self.router_num_groups:
                    raise ValueError(f"router_group_topk ({self.router_group_topk}) must be at "
                                     f"most router_num_groups ({self.router_num_groups})")
        elif self.moe_top_k or self.num_shared_experts or self.num_dense_layers:
            raise ValueError("moe_top_k / shared experts / num_dense_layers need num_experts > 0")
        if self.num_dense_layers_effective and self.ffn_hidden_size < 1:
            raise ValueError(f"{self.name}: dense layers need ffn_hidden_size > 0")
        if self.num_shared_experts and self.shared_expert_ffn_hidden_size < 1:
            raise ValueError("shared experts need shared_expert_ffn_hidden_size > 0")
        if self.position_embedding is PositionEmbedding.LEARNED and self.max_position_embeddings < 1:
            raise ValueError("learned position embeddings need max_position_embeddings > 0")
        if self.num_sliding_window_layers > self.num_layers:
            raise ValueError("num_sliding_window_layers exceeds num_layers")
        if self.hybrid_pattern:
            self._check_hybrid()
        elif self.mamba is not None:
            raise ValueError(f"{self.name}: a Mamba mixer needs a hybrid_pattern")
        return self

    def _check_hybrid(self) -> None:
        pat = self.hybrid_pattern
        bad = sorted(set(pat) - HYBRID_SYMBOLS)
        if bad:
            raise ValueError(f"hybrid_pattern has {bad}; each character is one of M * - E")
        if len(pat) != self.num_layers:
            raise ValueError(f"hybrid_pattern has {len(pat)} layers, num_layers is "
                             f"{self.num_layers}; they must agree")
        if "M" in pat and self.mamba is None:
            raise ValueError(f"{self.name}: the pattern has Mamba layers (M) but no mamba spec")
        if "E" in pat and not self.num_experts:
            raise ValueError(f"{self.name}: the pattern has MoE layers (E) but num_experts is 0")
        if self.num_experts and "E" not in pat:
            raise ValueError(f"{self.name}: num_experts > 0 but the pattern has no MoE layer (E)")
        if "-" in pat and self.ffn_hidden_size < 1:
            raise ValueError(f"{self.name}: the pattern has MLP layers (-) but ffn_hidden_size 0")
        if self.num_dense_layers:
            raise ValueError(f"{self.name}: num_dense_layers is not used with a hybrid_pattern "
                             f"(the pattern says each layer)")
        if self.num_mtp_layers and pat[-1] not in "E-":
            raise ValueError(f"{self.name}: MTP in a hybrid model is attention + the last "
                             f"layer's MoE or MLP block; the pattern ends in {pat[-1]!r}")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_hybrid(self) -> bool:
        """A Megatron-Core hybrid model: each layer is one block (``hybrid_pattern``)."""
        return bool(self.hybrid_pattern)

    @property
    def num_dense_layers_effective(self) -> int:
        """Layers with a dense MLP: all of them for a dense model, the leading ones for MoE,
        the ``-`` layers of a hybrid pattern."""
        if self.hybrid_pattern:
            return self.hybrid_pattern.count("-")
        return self.num_dense_layers if self.is_moe else self.num_layers

    @property
    def num_moe_layers(self) -> int:
        if self.hybrid_pattern:
            return self.hybrid_pattern.count("E")
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def num_attention_layers(self) -> int:
        """Layers with a self-attention block: every layer, or the ``*`` of a hybrid pattern."""
        return self.hybrid_pattern.count("*") if self.hybrid_pattern else self.num_layers

    @property
    def num_mamba_layers(self) -> int:
        return self.hybrid_pattern.count("M")


# ------------------------------------------------------------------------------ GPU and cluster


class GpuSpec(Spec):
    """One accelerator. Every number comes from ``oracle/catalog/gpus.json`` with its source."""

    name: str = Field(min_length=1)
    vendor: Vendor = Vendor.OTHER
    hbm_bytes: int = Field(gt=0, le=1 << 50, description="HBM capacity in bytes (GiB-based)")
    peak_bf16_flops: float = Field(gt=0, le=1e18, description="dense BF16 tensor FLOP/s")
    peak_fp8_flops: float | None = Field(default=None, gt=0, le=1e18, description="None: no FP8")
    peak_fp4_flops: float | None = Field(
        default=None, gt=0, le=1e18, description="dense NVFP4 tensor FLOP/s; None: no FP4"
    )
    hbm_bytes_per_s: float = Field(gt=0, le=1e15)
    sfu_exp_per_s: float | None = Field(
        default=None, gt=0, le=1e16,
        description="special-function (exp) throughput; bounds flash-attention softmax; None: "
        "not a bottleneck / not published",
    )
    scale_up_bytes_per_s: float = Field(
        gt=0, le=1e14, description="scale-up (NVLink / xGMI) bandwidth per GPU per direction"
    )
    scale_up_domain_gpus: int = Field(ge=1, le=MAX_GPUS, description="GPUs on one scale-up fabric")
    nic_bytes_per_s: float = Field(gt=0, le=1e14, description="scale-out bandwidth per GPU")
    gpus_per_node: int = Field(default=8, ge=1, le=1024, description="usual node size")
    tdp_w: float | None = Field(
        default=None, gt=0, le=1e5,
        description="board power limit (W); with compute_units it scales the sustained tensor "
        "rate within an architecture (oracle.compute.sustained_rate); None: not modelled",
    )
    compute_units: int | None = Field(
        default=None, ge=1, le=1 << 20, description="streaming multiprocessors (NVIDIA) or "
        "compute units (AMD); None: not modelled",
    )
    architecture: str = Field(default="", description="hopper, blackwell, cdna3, ... (FP8 recipes)")
    source: str = ""
    notes: str = ""


class ClusterSpec(Spec):
    gpu: GpuSpec
    num_nodes: int = Field(ge=1, le=MAX_GPUS)
    gpus_per_node: int = Field(ge=1, le=1024)

    @model_validator(mode="after")
    def _world_size(self) -> ClusterSpec:
        if self.num_nodes * self.gpus_per_node > MAX_GPUS:
            raise ValueError(f"{nodes_text(self.num_nodes)} x {self.gpus_per_node} GPUs = "
                             f"{self.num_nodes * self.gpus_per_node:,} GPUs; at most {MAX_GPUS:,} "
                             f"GPUs in all")
        return self

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def scale_up_gpus(self) -> int:
        """GPUs reachable over the scale-up links: the node, or a rack-scale domain (NVL72)."""
        if self.gpu.scale_up_domain_gpus > self.gpus_per_node:
            return min(self.gpu.scale_up_domain_gpus, self.world_size)
        return self.gpus_per_node


class TrainingSpec(Spec):
    seq_len: int = Field(ge=1, le=1 << 24)
    global_batch_size: int = Field(ge=1, le=1 << 30, description="sequences per optimizer step")
    precision: Precision = Precision.BF16
    flash_attention: bool = True


# ------------------------------------------------------------------------ parallel configuration

DEFAULT_SELECTIVE_MODULES: tuple[str, ...] = ("core_attn",)
SELECTIVE_MODULES: frozenset[str] = frozenset(
    {"core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts", "mla_up_proj"}
)


class ParallelConfig(Spec):
    """One training configuration. ``None`` fields are derived by
    :func:`config.resolve.resolve_config`."""

    tp: int = Field(default=1, ge=1, le=MAX_GPUS)
    pp: int = Field(default=1, ge=1, le=100_000)
    vpp: int = Field(default=1, ge=1, le=100_000, description="virtual stages per pipeline rank")
    cp: int = Field(default=1, ge=1, le=MAX_GPUS)
    ep: int = Field(default=1, ge=1, le=MAX_GPUS)
    etp: int | None = Field(default=None, ge=1, le=MAX_GPUS, description="None: same as tp")
    dp: int | None = Field(default=None, ge=1, le=MAX_GPUS, description="None: world/(tp*pp*cp)")
    mbs: int = Field(default=1, ge=1, le=1 << 20)
    ga: int | None = Field(default=None, ge=1, le=1 << 30, description="None: gbs/(mbs*dp)")
    sequence_parallel: bool | None = Field(default=None, description="None: on when tp > 1")
    recompute: Recompute = Recompute.NONE
    recompute_method: RecomputeMethod = RecomputeMethod.BLOCK
    recompute_layers: int | None = Field(
        default=None, ge=0, description="full recompute: layers per virtual stage; None: all"
    )
    recompute_modules: tuple[str, ...] = DEFAULT_SELECTIVE_MODULES
    distributed_optimizer: bool = True
    fsdp: bool = False
    grad_reduce_in_fp32: bool = Field(
        default=True,
        description="gradient buffer and DP reduction in fp32 (4 B/param, Megatron-LM's default "
        "under --bf16); False: in bf16 (2 B/param; Megatron-LM --grad-reduce-in-bf16, "
        "Megatron-Core DDP / Megatron-Bridge grad_reduce_in_fp32=False). Not searched",
    )
    fp8_param_gather: bool = Field(
        default=False,
        description="FP8 parameters (Megatron-LM --fp8-param-gather, Megatron-Bridge "
        "fp8_param_gather; the default of its tensorwise, delayed and MXFP8 recipes): linear "
        "weights exist only as FP8 copies, no bf16 copy. Memory only; not searched",
    )
    optimizer_state: OptimizerState = Field(
        default_factory=OptimizerState,
        description="the optimizer state's dtypes (:class:`OptimizerState`). Not searched")
    dispatcher: Dispatcher = Dispatcher.ALLTOALL
    flex_backend: FlexBackend | None = Field(
        default=None, description="flex dispatcher library; None: turbo on AMD, deepep "
        "elsewhere (resolve_config), and none without the flex dispatcher")
    sync_free_stage: int = Field(
        default=0, ge=0, le=3, description="Primus-Turbo sync-free MoE stage "
        "(turbo_sync_free_moe_stage): 0 off, 1 router and permutation, 2 + dispatch and grouped "
        "MLP, 3 all")
    grouped_gemm: GroupedGemm = GroupedGemm.TE
    permute_fusion: bool = Field(default=False, description="fused token permute/unpermute "
                                 "(Megatron-LM --moe-permute-fusion)")
    shared_expert_overlap: bool = Field(default=False, description="shared experts on a side "
                                        "stream beside the dispatch (--moe-shared-expert-overlap)")
    router_fp32: bool | None = Field(
        default=None, description="router GEMM and probabilities in fp32 (--moe-router-dtype "
        "fp32); None: on with Primus-Turbo's DeepEP, which needs it, else off")
    schedule: Schedule | None = Field(default=None, description="None: interleaved if vpp > 1")
    fp8_recipe: Fp8Recipe | None = Field(default=None, description="None: BF16 compute")
    pipeline_split: PipelineSplit | None = Field(default=None, description="None: auto")
    first_stage_layers: int | None = Field(
        default=None, ge=1, le=100_000, description="uneven split: decoder layers of the first "
        "pipeline stage, all its virtual stages together (Megatron-LM "
        "--decoder-first-pipeline-num-layers); None: a middle stage's share")
    last_stage_layers: int | None = Field(
        default=None, ge=1, le=100_000, description="uneven split: decoder layers of the last "
        "pipeline stage (Megatron-LM --decoder-last-pipeline-num-layers); None: a middle "
        "stage's share")
    pipeline_layout: str | None = Field(
        default=None, min_length=1, max_length=10_000, description="layout split: Megatron-LM "
        "--pipeline-model-parallel-layout, e.g. 'Et*3|(tt|)*29,m|L' (E embedding, t decoder "
        "layer, m MTP layer, L loss, | between virtual stages)")

    @model_validator(mode="after")
    def _check(self) -> ParallelConfig:
        unknown = sorted(set(self.recompute_modules) - SELECTIVE_MODULES)
        if unknown:
            raise ValueError(
                f"unknown recompute module(s) {unknown}; choose from {sorted(SELECTIVE_MODULES)}"
            )
        uneven = self.first_stage_layers is not None or self.last_stage_layers is not None
        if uneven and self.pipeline_split not in (None, PipelineSplit.UNEVEN):
            raise ValueError(
                f"first/last stage layers make the uneven split, not "
                f"{self.pipeline_split.value}; drop --pipeline-split or give uneven")
        if self.pipeline_layout is not None:
            parse_pipeline_layout(self.pipeline_layout)
        if self.pipeline_layout is not None and (
                uneven or self.pipeline_split not in (None, PipelineSplit.LAYOUT)):
            raise ValueError("a pipeline layout is the whole split: give it without first/last "
                             "stage layers or another --pipeline-split")
        return self

    @property
    def sp(self) -> bool:
        """Sequence parallelism as resolved (on by default whenever tp > 1)."""
        return self.tp > 1 if self.sequence_parallel is None else self.sequence_parallel

    @property
    def etp_(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def schedule_(self) -> Schedule:
        if self.schedule is not None:
            return self.schedule
        return Schedule.INTERLEAVED if self.vpp > 1 else Schedule.ONE_F_ONE_B

    def backend_label(self) -> str:
        """The MoE backend in words: ``dispatcher flex (turbo), sync-free stage 2, grouped GEMM
        turbo, permute fusion, fp32 router``."""
        disp = self.dispatcher.value + (f" ({self.flex_backend.value})" if self.flex_backend
                                        else "")
        parts = [f"dispatcher {disp}"]
        if self.sync_free_stage:
            parts.append(f"sync-free stage {self.sync_free_stage}")
        parts.append(f"grouped GEMM {self.grouped_gemm.value}")
        if self.permute_fusion:
            parts.append("permute fusion")
        if self.shared_expert_overlap:
            parts.append("shared-expert overlap")
        if self.router_fp32:
            parts.append("fp32 router")
        return ", ".join(parts)

    def label(self) -> str:
        """Compact layout label used in tables: ``TP1 PP4 VPP2 CP1 EP8 ETP1 DP8``."""
        return (
            f"TP{self.tp} PP{self.pp} VPP{self.vpp} CP{self.cp} EP{self.ep} "
            f"ETP{self.etp_} DP{self.dp if self.dp is not None else '?'}"
        )


class ConfigError(ValueError):
    """A user-facing input error; its message is one line naming the value and the fix."""


def validation_message(err: ValidationError) -> str:
    """The first problem of a pydantic validation error, on one line: ``field: message (got
    value)``."""
    e = err.errors()[0]
    loc = ".".join(str(x) for x in e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    value = e.get("input")
    shown = f" (got {value!r})" if not isinstance(value, dict | list) else ""
    return f"{loc}: {msg}{shown}" if loc else msg


def default_fp8_recipe(gpu: GpuSpec) -> Fp8Recipe:
    """Default FP8 recipe per architecture: MXFP8 on Blackwell (block-scaled tensor cores), per-
    tensor current scaling elsewhere (Hopper, CDNA3/4), as Megatron-Bridge's recipes choose."""
    return Fp8Recipe.MXFP8 if gpu.architecture == "blackwell" else Fp8Recipe.TENSORWISE


def given_pipeline_split(cfg: ParallelConfig) -> PipelineSplit | None:
    """The split the configuration's own fields name: ``layout`` with a pipeline layout,
    ``uneven`` with first/last stage layers, else its ``pipeline_split`` (None: automatic)."""
    if cfg.pipeline_layout is not None:
        return PipelineSplit.LAYOUT
    if cfg.first_stage_layers is not None or cfg.last_stage_layers is not None:
        return PipelineSplit.UNEVEN
    return cfg.pipeline_split


def auto_pipeline_split(model: ModelSpec, pp: int, vpp: int) -> PipelineSplit:
    """``even`` when the decoder layers divide over ``pp * vpp`` virtual stages, else
    ``embedding_loss`` (embedding and loss as slots), else, for a model with MTP layers whose
    ``num_layers + 2 + mtp`` slots divide, ``embedding_mtp_loss``. Whether the choice is legal
    is the solver's business (rule ``pipeline_split``). A hybrid Mamba model always splits
    evenly (Megatron-Core's ``MambaStack`` has no embedding/loss slots). The resolver
    (``config/resolve.py::resolve``) calls it once per distinct ``pp * vpp``."""
    v = pp * vpp
    if model.is_hybrid or model.num_layers % v == 0:
        return PipelineSplit.EVEN
    if (model.num_mtp_layers and (model.num_layers + EMBEDDING_LOSS_SLOTS) % v
            and (model.num_layers + EMBEDDING_LOSS_SLOTS + model.num_mtp_layers) % v == 0):
        return PipelineSplit.EMBEDDING_MTP_LOSS
    return PipelineSplit.EMBEDDING_LOSS


def derived_dp(world: int, tp: int, pp: int, cp: int) -> int:
    """dp as :func:`config.resolve.resolve` derives it: ``world // (tp pp cp)``, at least 1."""
    return max(1, world // (tp * pp * cp))


def derived_ga(global_batch_size: int, mbs: int, dp: int) -> int:
    """ga (micro-batches per step) as :func:`config.resolve.resolve` derives it:
    ``gbs // (mbs dp)``, at least 1."""
    return max(1, global_batch_size // (mbs * dp))


def compute_precision(training: TrainingSpec, cfg: ParallelConfig) -> Precision:
    """The precision the configuration's GEMMs run in, the one source every reader uses (the
    check's header and JSON, the exporters, the interval class): FP8 when the configuration
    has an FP8 recipe (``resolve_config`` gives every FP8 training one), else the training
    precision (bf16, or NVFP4 ``fp4``). An FP8 recipe under fp4 training is illegal (rule
    family ``precision``)."""
    return Precision.FP8 if cfg.fp8_recipe is not None else training.precision


def training_as_run(training: TrainingSpec, cfg: ParallelConfig) -> TrainingSpec:
    """``training`` with the precision ``cfg`` runs in (:func:`compute_precision`): a bf16
    training given an FP8 recipe trains in FP8 (fp4 with a recipe stays, and is illegal)."""
    if training.precision is not Precision.BF16 or cfg.fp8_recipe is None:
        return training
    return training.model_copy(update={"precision": Precision.FP8})


def resolved_flex_backend(cfg: ParallelConfig, gpu: GpuSpec) -> FlexBackend | None:
    """The flex dispatcher's library: the one given, else Primus-Turbo's DeepEP on AMD and NVIDIA
    DeepEP elsewhere (Megatron-Core's default backend, ``transformer_config.py`` l.898); None
    without the flex dispatcher (a given backend is kept so that the rules can name it)."""
    if cfg.flex_backend is not None:
        return cfg.flex_backend
    if cfg.dispatcher is not Dispatcher.FLEX:
        return None
    return default_flex_backend(gpu)


def default_flex_backend(gpu: GpuSpec) -> FlexBackend:
    """The flex dispatcher's library where none is given: Primus-Turbo's DeepEP on AMD, NVIDIA
    DeepEP elsewhere."""
    return FlexBackend.TURBO if gpu.vendor is Vendor.AMD else FlexBackend.DEEPEP
