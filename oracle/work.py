"""What one rank does per micro-batch, independent of the fitted constants.

:class:`ConfigBatch` holds many resolved configurations of one (model, cluster, training) as
integer arrays (with :class:`RunTraits`, the framework settings that change the time);
:func:`build_work` turns them into the work of one rank: the shape ``(M, N, K)`` of every GEMM
(:data:`SLOTS`), core-attention FLOPs, bytes of memory-bound element-wise work, bytes of every
collective with its group size and link, how many layers of each kind every pipeline stage holds
and recomputes, parameters per stage (for data-parallel traffic and the optimizer). The result
is a :class:`Work`: typed records of numpy arrays, one entry per configuration, one record per
concern (:class:`GemmWork`, :class:`DeviceWork`, :class:`AttentionWork`,
:class:`ElementwiseWork`, :class:`TpWork`, :class:`CpWork`, :class:`EpWork`, :class:`PpWork`,
:class:`DpWork`, :class:`StageWork`, :class:`RecomputeWork`, :class:`ScheduleWork`), so a
misspelt quantity is an ``AttributeError``, never a silent zero. :func:`concat_work` stacks the
work of several batches (calibration over many published runs). :func:`oracle.timing.timing`
turns the work into time.

Symbols (one micro-batch on one rank): T = mbs s / cp tokens, T_sp = T / tp under sequence
parallelism, h hidden, f FFN width, V vocabulary.

* **Element-wise** (norms, rope, residual adds, SwiGLU/GELU, router softmax, MoE permute and
  unpermute, cross-entropy, embedding): bytes read + written per micro-batch forward; the time
  model moves them at HBM speed, backward twice the forward bytes.
* **Quantisation**: FP8/FP4 quantisation of GEMM inputs (and of output gradients in backward)
  is element-wise work: :data:`CAST_BYTES_PER_ELEMENT` bytes per element (torchao row-wise
  scaling, ``RunTraits.fp8_rowwise``: 10). Weights are quantised once per step where the
  framework keeps the low-precision copy across micro-batches, every micro-batch forward and
  backward under FSDP (:func:`weight_casts_per_microbatch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from tune_cp.config.codes import (
    DISPATCH_CODE,
    FP8_CODE,
    GROUPED_GEMM_CODE,
    GROUPED_GEMMS,
    METHODS,
    MODULE_BITS,
    RECOMPUTES,
    SplitKey,
)
from tune_cp.config.resolve import (
    COLUMN_FIELDS,
    Columns,
    as_read,
    columns,
    columns_of,
    resolve,
    view,
)
from tune_cp.config.specs import (
    ClusterSpec,
    ConfigError,
    Dispatcher,
    Fp8Recipe,
    GroupedGemm,
    ModelSpec,
    ParallelConfig,
    Precision,
    TrainingSpec,
)
from tune_cp.oracle import flops as F
from tune_cp.oracle import params as P
from tune_cp.oracle.catalog import gpu_power_ratios
from tune_cp.oracle.collectives import (
    DEEPEP_OVERLAP_EFFICIENCY,
    TP_FP8_ALLGATHER_FRACTION,
    cp_attention_block,
    cp_correction_bytes,
    ddp_bucket_params,
    group_intra,
    group_local,
)
from tune_cp.oracle.compute import OPERAND_BYTES
from tune_cp.oracle.host import GRAPH_BITS, backend_ops
from tune_cp.oracle.inventory import (
    block_gemms,
    mamba_cp_all_to_all_elements,
    mamba_scan_bytes_per_token,
    mamba_scan_flops_per_token,
    mamba_ssd_state_bytes_per_token,
)
from tune_cp.oracle.layers import KINDS, kind_index, mtp_kind
from tune_cp.oracle.memory import (
    ParamUnits,
    param_units,
    stage_counts_by_kind,
    stage_params,
)
from tune_cp.oracle.schedule import ZERO_BUBBLE_FACTOR

BF16 = 2.0
FP32 = 4.0


#: Bytes moved per element to quantise a GEMM input (Transformer Engine cast(+transpose)):
#: read bf16 (2) + write the row-wise and column-wise low-precision copies (1 + 1 for FP8);
#: current/tensorwise scaling and NVFP4 add an amax pass over the input (+2).
CAST_BYTES_PER_ELEMENT = {"delayed": 4.0, "tensorwise": 6.0, "blockwise": 4.0, "mxfp8": 4.0,
                          "nvfp4": 6.0, "rowwise": 10.0}
#: torchao's row-wise ("axiswise") FP8 recipe (``RunTraits.fp8_rowwise``) scales every GEMM
#: operand along the reduction axis of the GEMM it feeds, and an operand feeds two GEMMs with
#: different reduction axes (the input: forward over K and weight gradient over tokens; the
#: output gradient: data gradient over N and weight gradient over tokens), so each operand is
#: quantised twice from bf16 (amax pass 2 + cast read 2 + write 1, twice = 10 bytes per element);
#: its GEMMs (CUTLASS row-wise kernel) run at ``block_scaled_gemm_efficiency`` like the other
#: finer-than-tensor scalings, and its tensor-parallel all-gathers stay in bf16.


# ------------------------------------------------------------------------------ GEMM slots
#: Named GEMMs of one layer (plus output/MTP heads), in a fixed order.
SLOTS: tuple[str, ...] = (
    "qkv", "q_down", "q_up", "kv_down", "kv_up", "attn_out",
    "mlp_fc1", "mlp_fc2", "exp_fc1", "exp_fc2", "sh_fc1", "sh_fc2",
    "router", "logits", "mtp_proj",
    "mamba_in", "mamba_out", "lat_down", "lat_up",
)
S = {name: i for i, name in enumerate(SLOTS)}
ATTN_SLOTS = [S[x] for x in ("qkv", "q_down", "q_up", "kv_down", "kv_up", "attn_out")]
MLA_UP_SLOTS = [S["q_up"], S["kv_up"]]
MLP_SLOTS = [S["mlp_fc1"], S["mlp_fc2"]]
EXP_SLOTS = [S["exp_fc1"], S["exp_fc2"]]
SH_SLOTS = [S["sh_fc1"], S["sh_fc2"]]
MAMBA_SLOTS = [S["mamba_in"], S["mamba_out"]]
LAT_SLOTS = [S["lat_down"], S["lat_up"]]  # a latent MoE's h -> L -> h projections
#: slots that run in the training's low precision (FP8/FP4); router, logits, MTP projection: BF16
LOW_PREC_SLOTS = np.array(
    [name not in ("router", "logits", "mtp_proj") for name in SLOTS], dtype=bool
)
GROUPED_SLOTS = np.array([name in ("exp_fc1", "exp_fc2") for name in SLOTS], dtype=bool)

#: Bytes per element of the router input under ``--moe-router-dtype fp32``: Megatron-Core
#: ``moe/router.py`` ``router_gating_linear`` casts the bf16 hidden state to fp32 before the
#: gating GEMM (read 2, write 4; the backward's fp32 input gradient cast back is the backward
#: share of the element-wise bytes).
ROUTER_FP32_CAST_BYTES = 6.0
_CODE_GROUPED_GEMM = dict(enumerate(GROUPED_GEMMS))
_CODE_RECOMPUTE = dict(enumerate(RECOMPUTES))
_CODE_METHOD = dict(enumerate(METHODS))


# ============================================================================ config batch


@dataclass(frozen=True)
class RunTraits:
    """How a run executes beyond its parallel layout and precision: framework settings that
    change the time of the same configuration. The defaults are Megatron-Core with Transformer
    Engine as Megatron-Bridge / NeMo recipes configure it (what the search plans for);
    :mod:`formats.runs` reads other values from a published row's columns.

    ``tp_comm_overlap``: tensor-parallel collectives can hide behind the layer's GEMMs
    (Transformer Engine userbuffers, ``--tp-comm-overlap``, torchtitan async TP); False for plain
    Megatron-LM without the flag and torchtitan's vanilla TP, whose all-gather and
    reduce-scatter run between the GEMMs.
    ``fp8_rowwise``: the FP8 recipe is torchao's row-wise scaling (see
    :data:`CAST_BYTES_PER_ELEMENT`); ignored without FP8.
    ``moe_capacity_factor``: token-drop MoE padded to this capacity factor (Megatron-LM
    ``--moe-expert-capacity-factor C --moe-pad-expert-input-to-capacity``, tune-cp
    ``--moe-token-drop C``): every expert processes, and the all-to-all moves, ``C`` times the
    balanced token copies (padding included), so the expert GEMMs, their element-wise work and
    the dispatch bytes scale by ``C``; None: 1 (dropless, or a published row whose capacity is
    not stated).
    ``moe_dropless``: MoE layers route without a capacity limit (Megatron-Core's default,
    ``--moe-expert-capacity-factor`` unset): each layer copies its token counts to the host, so
    the host cannot run ahead of the GPU across it (:func:`host_exposed`, and at every pipeline
    chunk boundary :func:`chunk_boundary_host`). False: token-drop (``--moe-expert-capacity-factor
    1.0 --moe-pad-expert-input-to-capacity``): fixed shapes, no synchronisation, the host runs
    ahead as for a dense layer. Ignored for dense models.
    ``cuda_graph_scope``: the layer parts captured in CUDA graphs (Megatron-Core
    ``--cuda-graph-impl transformer_engine|local --cuda-graph-scope attn mlp moe_router
    moe_preprocess``; Megatron-Bridge ``cuda_graph_impl`` / ``cuda_graph_scope``): each captured
    part costs the host one graph launch instead of its operations
    (:data:`oracle.host.GRAPH_SCOPE_OPS`). ``("full_iteration",)`` (``--cuda-graph-impl
    full_iteration``): the whole forward-backward pass of the step replays as one graph: no
    per-operation host time, and MoE routing runs without a host synchronisation (the recipes
    pair it with padded expert buffers and paged stashing), so nothing of
    :func:`oracle.host.host_exposed` or :func:`oracle.schedule.chunk_boundary_host` remains.
    ``()``: no CUDA graphs (Megatron-LM's default).
    ``moe_a2a_overlap``: the MoE dispatch / combine all-to-all of one micro-batch runs beside
    another micro-batch's computation (Megatron-Core ``--overlap-moe-expert-parallel-comm
    --delay-wgrad-compute``; Megatron-Bridge ``moe_a2a_overlap``): the hidden fraction is
    ``ep_a2a_overlap`` instead of ``ep_comm_overlap``, and a dropless layer's host and GPU
    times add (:func:`oracle.host.a2a_sync_exponent`).
    ``moe_routing_imbalance`` (``u``, ``--overhead moe_routing_imbalance=U``, the same setting
    as the memory's): under dropless routing the busiest expert-parallel rank receives
    ``(1 + u)`` times the balanced token copies, and every rank waits for it at the combine, so
    the layer runs at that rank's pace: its expert GEMMs, their element-wise work and its
    all-to-all bytes scale by ``1 + u``. Padded token-drop has fixed shapes (the capacity
    already bounds every expert), so ``u`` does not apply there. 0: balanced routing, as the
    published MoE benchmarks force it (Megatron-Bridge's footnote, Primus
    ``moe_router_force_load_balancing``); max/mean expert loads of 1.5-1.7 are reported with
    auxiliary-loss balancing (arXiv 2408.15664 Table 2).
    """

    tp_comm_overlap: bool = True
    fp8_rowwise: bool = False
    moe_dropless: bool = True
    cuda_graph_scope: tuple[str, ...] = ()
    moe_a2a_overlap: bool = False
    moe_capacity_factor: float | None = None
    moe_routing_imbalance: float = 0.0

    def __post_init__(self) -> None:
        bad = sorted(set(self.cuda_graph_scope) - set(GRAPH_BITS))
        if bad:
            raise ConfigError(f"cuda_graph_scope {bad} is not known; choose from "
                              f"{', '.join(GRAPH_BITS)}")

    @property
    def graph_mask(self) -> int:
        """:data:`oracle.host.GRAPH_BITS` of :attr:`cuda_graph_scope`."""
        return sum(GRAPH_BITS[x] for x in set(self.cuda_graph_scope))


DEFAULT_TRAITS = RunTraits()


@dataclass
class ConfigBatch(Columns):
    """Many resolved configurations of one (model, cluster, training): the resolved
    :class:`config.resolve.Columns` (codes: :mod:`config.codes`) with the :class:`RunTraits` of
    each configuration as arrays (None: the defaults): ``tp_overlap``, ``fp8_rowwise``,
    ``dropless`` (0/1), ``graph_mask`` (the :data:`oracle.host.GRAPH_BITS` mask of the CUDA
    graph scope), ``a2a_overlap`` (0/1), ``capacity`` (the MoE capacity factor, 1.0 when
    dropless) and ``imbalance`` (the routing imbalance ``u``)."""

    tp_overlap: np.ndarray | None = None
    fp8_rowwise: np.ndarray | None = None
    dropless: np.ndarray | None = None
    graph_mask: np.ndarray | None = None
    a2a_overlap: np.ndarray | None = None
    capacity: np.ndarray | None = None
    imbalance: np.ndarray | None = None

    @classmethod
    def of(cls, cols: Columns,
           traits: RunTraits | Sequence[RunTraits] | None = None) -> ConfigBatch:
        """Resolved ``cols`` with ``traits``: one :class:`RunTraits` for all, one per
        configuration, or None (the defaults)."""
        n = len(cols)
        one = (traits or DEFAULT_TRAITS) if traits is None or isinstance(traits, RunTraits) \
            else None  # the same traits for all
        if one is None and len(traits) != n:
            raise ConfigError("ConfigBatch: give one RunTraits per configuration")

        def of_traits(get: Any, dtype: Any) -> np.ndarray:
            if one is not None:
                return np.full(n, get(one), dtype=dtype)
            return np.array([get(t) for t in traits], dtype=dtype)

        return cls(
            **{f: getattr(cols, f) for f in COLUMN_FIELDS}, split_keys=cols.split_keys,
            tp_overlap=of_traits(lambda t: t.tp_comm_overlap, bool),
            fp8_rowwise=of_traits(lambda t: t.fp8_rowwise, bool),
            dropless=of_traits(lambda t: t.moe_dropless, bool),
            graph_mask=of_traits(lambda t: t.graph_mask, np.int64),
            a2a_overlap=of_traits(lambda t: t.moe_a2a_overlap, bool),
            capacity=of_traits(lambda t: t.moe_capacity_factor or 1.0, np.float64),
            imbalance=of_traits(lambda t: t.moe_routing_imbalance, np.float64),
        )

    @classmethod
    def from_configs(
        cls,
        configs: Sequence[ParallelConfig],
        traits: RunTraits | Sequence[RunTraits] | None = None,
    ) -> ConfigBatch:
        """From configurations already resolved by :func:`config.resolve.resolve_config`;
        ``traits``: one :class:`RunTraits` for all, one per configuration, or None (defaults)."""
        for c in configs:
            if c.dp is None or c.ga is None or c.pipeline_split is None:
                raise ConfigError("resolve_config() the configuration before projecting it")
        return cls.of(as_read(columns_of(configs)), traits)

    @classmethod
    def resolved(cls, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                 traits: RunTraits | Sequence[RunTraits] | None = None,
                 **values: Any) -> ConfigBatch:
        """The configurations of ``values`` (arrays or scalars of :class:`Columns` fields,
        codes for enums: :func:`config.resolve.columns`) resolved by
        :func:`config.resolve.resolve`, with ``traits``."""
        return cls.of(resolve(columns(**values), model, cluster, training), traits)

    def traits(self, i: int) -> RunTraits:
        """The :class:`RunTraits` of configuration ``i``."""
        return RunTraits(
            tp_comm_overlap=True if self.tp_overlap is None else bool(self.tp_overlap[i]),
            fp8_rowwise=False if self.fp8_rowwise is None else bool(self.fp8_rowwise[i]),
            moe_dropless=True if self.dropless is None else bool(self.dropless[i]),
            cuda_graph_scope=() if self.graph_mask is None else tuple(
                k for k, bit in GRAPH_BITS.items() if int(self.graph_mask[i]) & bit),
            moe_a2a_overlap=False if self.a2a_overlap is None else bool(self.a2a_overlap[i]),
            moe_capacity_factor=(None if self.capacity is None or self.capacity[i] == 1.0
                                 else float(self.capacity[i])),
            moe_routing_imbalance=0.0 if self.imbalance is None else float(self.imbalance[i]),
        )

    def config(self, i: int) -> ParallelConfig:
        """Configuration ``i`` as a resolved :class:`ParallelConfig` (the fields the batch
        holds; the others their defaults)."""
        return view(self, i)


# ========================================================================= work records
#
# The work of a batch of n configurations, as typed records of numpy arrays: one record per
# concern, one named field per quantity (a misspelt field is an AttributeError, never a silent
# zero). Per-configuration fields are (n,); GEMM fields (n, len(SLOTS)) indexed by :data:`S`;
# stage fields (n, stages), padded with empty stages up to the batch's largest pp.


@dataclass(frozen=True, slots=True)
class GemmWork:
    """Every GEMM of one micro-batch on one rank, per slot of :data:`SLOTS` ((n, slots)): its
    shape ``M x N x K`` (forward; backward runs dgrad + wgrad of the same shapes), how many
    times it runs (``count``: local experts for the grouped slots, 1 for the others, 0 where the
    model has no such GEMM) and the bytes its FP8/FP4 quantisation moves forward and backward
    (0 in BF16)."""

    M: np.ndarray
    N: np.ndarray
    K: np.ndarray
    count: np.ndarray
    cast_fwd_bytes: np.ndarray
    cast_bwd_bytes: np.ndarray


@dataclass(frozen=True, slots=True)
class DeviceWork:
    """The GPU of each configuration and the precision its GEMMs run in ((n,) each).

    ``prec``: 0 bf16, 1 fp8, 2 fp4 (the transformer-layer linears, :data:`LOW_PREC_SLOTS`);
    ``block_scaled``: 1 for block-scaled recipes (blockwise, MXFP8, torchao row-wise);
    ``peak_low``: the dense peak of ``prec``; ``operand_bytes``: bytes per low-precision GEMM
    operand (:data:`oracle.compute.OPERAND_BYTES`); ``pw_*``: :func:`oracle.catalog.gpu_power_ratios`
    (peak, units, TDP against the architecture's reference part)."""

    prec: np.ndarray
    block_scaled: np.ndarray
    peak_bf16: np.ndarray
    peak_low: np.ndarray
    operand_bytes: np.ndarray
    hbm_bw: np.ndarray
    scale_up_bw: np.ndarray
    nic_bw: np.ndarray
    sfu_exp_per_s: np.ndarray
    pw_peak: np.ndarray
    pw_units: np.ndarray
    pw_tdp: np.ndarray


@dataclass(frozen=True, slots=True)
class AttentionWork:
    """Core attention of one layer and micro-batch on one rank ((n,) each), averaged over the
    model's full and sliding-window layers: forward FLOPs of each kind (``flops_*``), the key
    length one flash-attention call sees (``ctx_*``: the context, or one CP ring step's block),
    the head dimension its efficiency follows and the softmax exponentials per FLOP."""

    flops_full: np.ndarray
    flops_slide: np.ndarray
    ctx_full: np.ndarray
    ctx_slide: np.ndarray
    head_dim: np.ndarray
    exp_per_flop: np.ndarray


@dataclass(frozen=True, slots=True)
class ElementwiseWork:
    """Bytes of memory-bound element-wise work of one micro-batch on one rank, forward, per
    layer part ((n,) each): ``attn`` (norm, rope, qk-norm, residual, CP output correction),
    ``mlp`` (norm, activation, residual), ``moe`` (norm, activations, router softmax, permute
    and unpermute); the ``*_norm`` / ``*_act`` / ``cp_correction`` parts of those totals
    separately (selective recompute of norms and activations); the output layer (final norm,
    cross-entropy) and the embedding forward and backward."""

    attn_norm: np.ndarray
    cp_correction: np.ndarray
    attn: np.ndarray
    mlp_norm: np.ndarray
    mlp_act: np.ndarray
    mlp: np.ndarray
    moe_norm: np.ndarray
    moe_act: np.ndarray
    moe: np.ndarray
    out_fwd: np.ndarray
    out_bwd: np.ndarray
    emb_fwd: np.ndarray
    emb_bwd: np.ndarray


@dataclass(frozen=True, slots=True)
class TpWork:
    """Tensor-parallel collectives of one layer ((n,) each): one all-gather / reduce-scatter
    of ``tensor_bytes`` (``T h`` bf16) over ``n`` ranks, ``fwd_per_block`` / ``bwd_per_block``
    of them per attention or MLP block (SP: AG + RS forward, + the input re-gather backward;
    without SP one all-reduce = 2), ``shared_blocks`` = 1 where shared experts add a block;
    ``has`` = 1 when tp > 1; ``intra`` / ``local``: :func:`oracle.collectives.group_intra`,
    :func:`oracle.collectives.group_local`; ``overlap``: 1 where the run overlaps TP
    communication (:class:`RunTraits`)."""

    tensor_bytes: np.ndarray
    n: np.ndarray
    has: np.ndarray
    intra: np.ndarray
    local: np.ndarray
    fwd_per_block: np.ndarray
    bwd_per_block: np.ndarray
    shared_blocks: np.ndarray
    overlap: np.ndarray


@dataclass(frozen=True, slots=True)
class CpWork:
    """Context-parallel ring of one layer ((n,) each): ``steps`` = cp - 1 exchanges of
    ``block_bytes`` (the local K and V, bf16) each forward; ``intra``: on the scale-up links."""

    block_bytes: np.ndarray
    steps: np.ndarray
    intra: np.ndarray


@dataclass(frozen=True, slots=True)
class EpWork:
    """Expert-parallel traffic of one MoE layer and direction ((n,) each; zeros for dense
    models): the all-to-all bytes one rank sends inside its scale-up domain and over the NIC
    (``intra_bytes``, ``inter_bytes``; ``active`` = 1 for an all-to-all dispatcher at ep > 1),
    the group size ``n`` (its latency), the ``allgather`` dispatcher's gathered bytes
    (``gather_bytes`` with ``gather_intra`` / ``gather_local``), and the expert-tensor-parallel
    all-gather / reduce-scatter (``etp_bytes`` over ``etp_n`` ranks)."""

    intra_bytes: np.ndarray
    inter_bytes: np.ndarray
    n: np.ndarray
    gather_bytes: np.ndarray
    gather_intra: np.ndarray
    gather_local: np.ndarray
    active: np.ndarray
    etp_bytes: np.ndarray
    etp_n: np.ndarray
    etp_intra: np.ndarray
    etp_local: np.ndarray


@dataclass(frozen=True, slots=True)
class PpWork:
    """Pipeline send / receive per micro-batch and stage ((n,) each): ``activation_bytes``
    (``T_sp h`` bf16) per transfer, ``sends`` transfers (2 vpp; 0 without pipeline
    parallelism), ``intra``: on the scale-up links."""

    activation_bytes: np.ndarray
    sends: np.ndarray
    intra: np.ndarray


@dataclass(frozen=True, slots=True)
class DpWork:
    """Data-parallel groups of the dense parameters (dp x cp) and of the experts (expert dp)
    ((n,) each): size, link (``*_intra``, ``*_local``), the optimizer's sharding
    (``dist_opt``, ``fsdp``), the gradient buffer's bytes per parameter and Megatron-Core's
    bucket size in parameters (:func:`oracle.collectives.ddp_bucket_params`)."""

    dense_n: np.ndarray
    dense_intra: np.ndarray
    dense_local: np.ndarray
    expert_n: np.ndarray
    expert_intra: np.ndarray
    expert_local: np.ndarray
    dist_opt: np.ndarray
    fsdp: np.ndarray
    grad_bytes: np.ndarray
    bucket_params: np.ndarray


@dataclass(frozen=True, slots=True)
class StageLayers:
    """Layers of each pipeline stage (one array entry per stage): dense and MoE decoder
    layers, MTP layers, whether it holds the embedding and the output layer, and the dense and
    MoE layers it recomputes in full. The field names are those :func:`oracle.memory.stage_params`
    reads."""

    dense_layers: np.ndarray
    moe_layers: np.ndarray
    mtp_layers: np.ndarray
    has_embedding: np.ndarray
    has_output: np.ndarray
    rc_dense_layers: np.ndarray
    rc_moe_layers: np.ndarray
    attention_layers: np.ndarray  # hybrid models: attention-only layers (``*``)
    mamba_layers: np.ndarray  # hybrid models: Mamba-2 mixer layers (``M``)
    rc_attention_layers: np.ndarray
    rc_mamba_layers: np.ndarray


@dataclass(frozen=True, slots=True)
class StageWork:
    """Per pipeline stage ((n, stages) each; ``valid`` 0 for the padding beyond a
    configuration's pp): layers that run as dense and as MoE layers (MTP layers count as the
    model's last layer kind), MTP layers, embedding and output heads (each MTP module has its
    own logits and loss), fully recomputed dense and MoE layers, and the stage's parameters per
    rank (:func:`oracle.memory.stage_params`: dense and expert)."""

    dense_like: np.ndarray
    moe_like: np.ndarray
    mtp: np.ndarray
    embedding: np.ndarray
    output_heads: np.ndarray
    rc_dense: np.ndarray
    rc_moe: np.ndarray
    valid: np.ndarray
    params_dense: np.ndarray
    params_expert: np.ndarray
    attn_only: np.ndarray  # hybrid: attention-only layers (an MTP depth runs one too)
    mamba: np.ndarray  # hybrid: Mamba layers
    rc_attn_only: np.ndarray
    rc_mamba: np.ndarray


@dataclass(frozen=True, slots=True)
class HybridWork:
    """What hybrid Mamba models add ((n,) each; zeros for a transformer): ``is_hybrid`` (1:
    each layer is one block, ``oracle/inventory.py``), the SSD scan's FLOPs per Mamba layer and
    micro-batch and its chunk length, the Mamba layer's element-wise bytes, and the bytes of its
    context-parallel all-to-alls per direction (:func:`mamba_work`)."""

    is_hybrid: np.ndarray
    scan_flops: np.ndarray
    chunk: np.ndarray
    ew_mamba: np.ndarray
    cp_bytes: np.ndarray
    #: forward HBM bytes of the SSD intermediates (``mamba_ssd_state_bytes_per_token``)
    ssd_bytes: np.ndarray


@dataclass(frozen=True, slots=True)
class RecomputeWork:
    """Selective recompute: 1 where the configuration recomputes the module ((n,) each; the
    names of :data:`MODULE_BITS`), 0 otherwise and under no or full recompute."""

    core_attn: np.ndarray
    layernorm: np.ndarray
    mlp: np.ndarray
    moe: np.ndarray
    moe_act: np.ndarray
    shared_experts: np.ndarray
    mla_up_proj: np.ndarray


@dataclass(frozen=True, slots=True)
class ScheduleWork:
    """The step's schedule ((n,) each): ``m`` micro-batches, ``vpp`` virtual stages, the
    bubble factor (1, or :data:`oracle.schedule.ZERO_BUBBLE_FACTOR`), ``pp_on`` = 1 when pp > 1;
    and the MoE facts the host terms need: ``has_moe``, ``moe_sync`` (:func:`moe_host_sync`;
    0 under a full-iteration CUDA graph), ``local_experts`` per rank; the run settings:
    ``graph_<part>`` = 1 when :attr:`RunTraits.cuda_graph_scope` captures the part
    (:data:`oracle.host.GRAPH_BITS`), ``a2a_overlap`` (:attr:`RunTraits.moe_a2a_overlap`);
    ``current_scaling`` = 1 when the linears are quantised with Transformer Engine's per-tensor
    current scaling (FP8 tensorwise, not torchao row-wise): every quantised operand costs the
    host :data:`oracle.host.CURRENT_SCALING_EXTRA_KERNELS` more launches
    (:func:`oracle.host.current_scaling_ops`)."""

    m: np.ndarray
    vpp: np.ndarray
    bubble_factor: np.ndarray
    pp_on: np.ndarray
    has_moe: np.ndarray
    moe_sync: np.ndarray
    local_experts: np.ndarray
    graph_attn: np.ndarray
    graph_mlp: np.ndarray
    graph_moe_router: np.ndarray
    graph_moe_preprocess: np.ndarray
    graph_full_iteration: np.ndarray
    a2a_overlap: np.ndarray
    current_scaling: np.ndarray


@dataclass(frozen=True, slots=True)
class BackendWork:
    """The MoE backend's effects ((n,) each; 0 for a dense model): ``flex`` = 1 with the flex
    dispatcher at ep > 1 running Primus-Turbo's DeepEP, ``flex_overlap`` the fraction
    of its dispatch/combine hidden behind the layer's computation
    (:data:`oracle.collectives.DEEPEP_OVERLAP_EFFICIENCY`, by sync-free stage); ``shared_overlap``
    = 1 when the shared experts run beside the dispatch (``--moe-shared-expert-overlap``);
    ``fused_grouped`` = 1 when one kernel runs every local expert's GEMM (``legacy`` grouped_gemm,
    ``turbo``: the shape efficiency sees all local rows); ``host_ops`` operations a MoE layer's
    forward issues beyond :data:`oracle.host.KERNELS_PER_LAYER` (negative: fused away) and
    ``host_ops_per_expert`` per local expert in place of its 4 (:func:`oracle.host.backend_ops`)."""

    flex: np.ndarray
    flex_overlap: np.ndarray
    shared_overlap: np.ndarray
    fused_grouped: np.ndarray
    host_ops: np.ndarray
    host_ops_per_expert: np.ndarray


@dataclass(frozen=True, slots=True)
class Work:
    """What every configuration of a batch does per micro-batch on one rank
    (:func:`build_work`); :func:`oracle.timing.timing` reads it."""

    gemm: GemmWork
    device: DeviceWork
    attention: AttentionWork
    elementwise: ElementwiseWork
    tp: TpWork
    cp: CpWork
    ep: EpWork
    pp: PpWork
    dp: DpWork
    stages: StageWork
    recompute: RecomputeWork
    schedule: ScheduleWork
    hybrid: HybridWork
    backend: BackendWork

    def __len__(self) -> int:
        return len(self.schedule.m)


# ================================================================================ work


@lru_cache(maxsize=65536)
def _stage_layers(
    kinds: tuple[int, ...], mtp_kind: int, num_mtp: int, pp: int, vpp: int,
    split: SplitKey, recompute: int, method: int, k: int,
) -> StageLayers:
    """:class:`StageLayers` of one pipeline layout (arrays of pp entries), read from the memory
    model's own :class:`oracle.memory.StageCounts` (``stage_counts_by_kind``: the one per-stage
    composition); ``kinds``: each layer's kind as an index into ``oracle.layers.KINDS``."""
    split_, first, last, layout = split
    counts = stage_counts_by_kind(kinds, mtp_kind, num_mtp, pp, vpp, split_, 1,
                                  _CODE_RECOMPUTE[recompute], _CODE_METHOD[method],
                                  None if k < 0 else k, first, last, layout)

    def arr(get: Any) -> np.ndarray:
        return np.array([get(c) for c in counts], dtype=np.int64)

    return StageLayers(
        dense_layers=arr(lambda c: c.dense_layers), moe_layers=arr(lambda c: c.moe_layers),
        mtp_layers=arr(lambda c: c.mtp_layers), has_embedding=arr(lambda c: c.has_embedding),
        has_output=arr(lambda c: c.has_output),
        rc_dense_layers=arr(lambda c: c.recomputed[0]), rc_moe_layers=arr(lambda c: c.recomputed[1]),
        attention_layers=arr(lambda c: c.attention_layers),
        mamba_layers=arr(lambda c: c.mamba_layers),
        rc_attention_layers=arr(lambda c: c.recomputed[2]),
        rc_mamba_layers=arr(lambda c: c.recomputed[3]),
    )


def _per_tp(fn: Any, tp: np.ndarray) -> np.ndarray:
    """``fn(tp)`` for every configuration, evaluated once per distinct tp."""
    uq, inv = np.unique(tp, return_inverse=True)
    return np.array([float(fn(int(t))) for t in uq], dtype=np.float64)[inv.reshape(-1)]


def mamba_work(model: ModelSpec, b: ConfigBatch, T: np.ndarray, Tsp: np.ndarray) -> HybridWork:
    """What one Mamba-2 mixer layer does per micro-batch on one rank beside its GEMMs
    (``oracle/inventory.py``): the chunked SSD scan's FLOPs (under CP each rank scans the whole
    sequence for ``H / (tp cp)`` heads: ``T cp x flops(tp) / cp``), its chunk length (the scan's
    matmul dimension), the element-wise bytes (pre-norm, conv + scan + gated norm, residual, as
    the other blocks count them) and the bytes of Mamba's two context-parallel all-to-alls per
    direction (``(cp - 1) / cp`` of ``zxBCdt`` and ``y`` leave the rank). Zeros without Mamba."""
    n = len(b)
    flag = np.full(n, 1.0 if model.is_hybrid else 0.0)
    if model.mamba is None:
        zero = np.zeros(n)
        return HybridWork(is_hybrid=flag, scan_flops=zero, chunk=np.ones(n), ew_mamba=zero,
                          cp_bytes=zero, ssd_bytes=zero)
    h = model.hidden_size
    cp = b.cp.astype(np.float64)
    return HybridWork(
        is_hybrid=flag,
        scan_flops=T * _per_tp(lambda t: mamba_scan_flops_per_token(model, t), b.tp),
        chunk=np.full(n, float(model.mamba.chunk_size)),
        ew_mamba=(Tsp * h * 4 + T * _per_tp(lambda t: mamba_scan_bytes_per_token(model, t),
                                            b.tp) + Tsp * h * 6),
        cp_bytes=np.where(b.cp > 1, T * BF16 * (cp - 1) / cp * _per_tp(
            lambda t: mamba_cp_all_to_all_elements(model, t), b.tp), 0.0),
        ssd_bytes=T * _per_tp(lambda t: mamba_ssd_state_bytes_per_token(model, t), b.tp),
    )


def _unique_rows(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of the stacked integer columns and the index of each row's distinct row
    (mixed-radix key: one 1-d ``np.unique`` instead of a slow row-wise one)."""
    key = np.zeros(len(cols[0]), dtype=np.int64)
    for c in cols:
        lo = int(c.min())
        span = int(c.max()) - lo + 1
        key = key * span + (c - lo)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    uniq = np.stack([c[first] for c in cols], axis=1)
    return uniq, inverse.reshape(-1)


def padded_vocab(vocab: int, tp: np.ndarray) -> np.ndarray:
    """Megatron's padded vocabulary (a multiple of ``VOCAB_DIVISIBLE_BY x tp``) for an array
    of tp: :func:`oracle.params.padded_vocab_size` vectorised."""
    multiple = P.VOCAB_DIVISIBLE_BY * tp
    return -(-vocab // multiple) * multiple


def weight_casts_per_microbatch(fsdp: Any, ga: Any) -> tuple[np.ndarray, np.ndarray]:
    """How often one micro-batch quantises a low-precision GEMM's weights, forward and
    backward (each time ``K N`` elements at :data:`CAST_BYTES_PER_ELEMENT`).

    Without FSDP the framework keeps the quantised weights (and their transposed/column-wise
    copy) across the micro-batches of a step (Transformer Engine's ``is_first_microbatch``
    weight cache), so the cast happens once per step: ``1/ga`` per micro-batch forward and none
    in backward. Under FSDP (ZeRO-3) the full weights exist only between their all-gather and
    their release, which happens every micro-batch in forward and again in backward: the
    gathered bf16 weights are quantised in forward and the copy the data gradient needs is
    quantised again in backward (Megatron-Bridge's Megatron-FSDP override sets
    ``ddp.keep_fp8_transpose_cache = False``: scripts/performance/utils/overrides.py and
    helpers.py, ``_set_megatron_fsdp_overrides``; torchao's ``Float8Linear`` under FSDP2 casts
    the gathered weight on every call): one cast forward and one backward per micro-batch.
    Worked example: Llama 3 70B FP8 under FSDP at 2 micro-batches per step quantises its 70e9
    weights 4 times per step instead of once."""
    fs = np.asarray(fsdp, dtype=bool)
    g = np.asarray(ga, dtype=np.float64)
    return np.where(fs, 1.0, 1.0 / g), np.where(fs, 1.0, 0.0)


def moe_host_sync(dropless: Any, dispatcher: Any, sync_free: Any = 0) -> np.ndarray:
    """Whether a MoE layer makes the host wait for the GPU once per layer (1) or lets it run
    ahead as a dense layer does (0). Dropless routing copies the token counts per expert to the
    host (Megatron-Core's token dispatchers: ``cuda_sync_point``); token-drop with padding to
    capacity (``moe_pad_expert_input_to_capacity``) has fixed shapes and no synchronisation with
    the ``alltoall`` / ``allgather`` dispatchers, but the ``flex`` dispatcher (DeepEP, HybridEP)
    returns its received-token counts to the host in any case (DeepEP ``dispatch`` returns
    ``num_recv_tokens_per_expert_list``, a host list). ``dispatcher``: the :data:`DISPATCH_CODE`
    codes. Primus-Turbo's sync-free MoE stage 3 (``sync_free`` = 3) removes every one of them:
    the dispatcher allocates its worst-case receive buffer (``num_worst_tokens``) and the
    permutation its worst-case output (``permute_max_token_num``), so no shape comes from the
    device (Primus ``primus_turbo.py`` l.2333-2342, ``examples/moe_package/README.md`` Table 2:
    stage 1 router and permutation, stage 2 router, DeepEP and grouped MLP, stage 3 all)."""
    sync = np.asarray(dropless, dtype=bool) | (np.asarray(dispatcher) == DISPATCH_CODE[
        Dispatcher.FLEX])
    return sync & (np.asarray(sync_free) < 3)


def build_work(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, b: ConfigBatch
) -> Work:
    """Everything :func:`oracle.timing.timing` needs, per configuration (see the module
    docstring and the record classes above)."""
    n = len(b)
    gpu = cluster.gpu
    f64 = np.float64
    s = float(training.seq_len)
    h, a, g = model.hidden_size, model.num_attention_heads, model.num_kv_heads
    tp, cp, ep, etp = (x.astype(f64) for x in (b.tp, b.cp, b.ep, b.etp))
    mbs = b.mbs.astype(f64)
    T = mbs * s / cp
    Tsp = np.where(b.sp, T / tp, T)
    a_loc = np.ceil(a / tp)
    g_loc = np.maximum(1.0, np.ceil(g / tp))
    vloc = padded_vocab(model.vocab_size, b.tp).astype(f64) / tp
    up = 2.0 if model.gated_mlp else 1.0

    # --- GEMM shapes (n, slots): M, N, K, count
    M = np.zeros((n, len(SLOTS)))
    N = np.zeros((n, len(SLOTS)))
    K = np.zeros((n, len(SLOTS)))
    C = np.zeros((n, len(SLOTS)))

    def gemm(slot: str, m: Any, nn: Any, kk: Any, count: Any = 1.0) -> None:
        i = S[slot]
        M[:, i], N[:, i], K[:, i], C[:, i] = m, nn, kk, count

    # every block's GEMMs come from the workload inventory (oracle/inventory.py::block_gemms)
    for ops in block_gemms(model, T, Tsp, tp, ep, etp).values():
        for op in ops:
            gemm(op.slot, op.m, op.n, op.k, op.count)
    # token-drop padded to a capacity factor: the experts' GEMMs run on C x the token copies;
    # dropless with routing imbalance u: the busiest rank's on (1 + u) x (RunTraits)
    cap = np.ones(n) if b.capacity is None else b.capacity
    skew = np.ones(n)
    if b.imbalance is not None and b.imbalance.any():
        dropless = np.ones(n, dtype=bool) if b.dropless is None else b.dropless
        skew = np.where(dropless, 1.0 + b.imbalance, 1.0)
        cap = cap * skew
    M[:, EXP_SLOTS] = M[:, EXP_SLOTS] * cap[:, None]
    if model.mla is not None:
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        kv_width = a_loc * (qk + m.v_head_dim)  # K and V per token the CP ring moves
        rope_width = (a_loc + 1) * m.qk_rope_head_dim
        d_attn = (qk + m.v_head_dim) / 2
        mla_norm_width = m.q_lora_rank + m.kv_lora_rank
    else:
        d = model.head_dim
        kv_width = 2 * g_loc * d
        rope_width = (a_loc + g_loc) * d
        d_attn = float(d)
        mla_norm_width = 0.0
    if model.num_dense_layers_effective:
        f_loc = np.ceil(model.ffn_hidden_size / tp)
    else:
        f_loc = np.zeros(n)
    E, k = model.num_experts, model.moe_top_k
    # the width routed tokens travel and experts work in: h, or a latent MoE's latent size
    width = model.moe_latent_size or h
    if model.is_moe:
        fe_loc = np.ceil(model.expert_ffn_hidden_size / etp)
        # token copies this rank's experts process (x the capacity factor under token-drop)
        rows = Tsp * k * etp * cap
        fs = model.num_shared_experts * model.shared_expert_ffn_hidden_size
        fs_loc = np.ceil(fs / tp) if fs else np.zeros(n)
    else:
        fe_loc = rows = fs_loc = np.zeros(n)
        fs = 0
    gemm("logits", T, vloc, h)
    if model.num_mtp_layers:
        gemm("mtp_proj", T, h / tp, 2 * h)

    # --- precision: 0 bf16, 1 fp8, 2 fp4
    rowwise = (b.fp8 >= 0) & (False if b.fp8_rowwise is None else b.fp8_rowwise)
    if training.precision is Precision.FP4:
        if gpu.peak_fp4_flops is None:
            raise ConfigError(
                f"precision fp4 (NVFP4) needs a GPU with FP4 tensor cores; {gpu.name} has no "
                f"peak_fp4_tflops in the catalog; choose precision bf16 or fp8"
            )
        prec = np.full(n, 2)
        cast = np.full(n, CAST_BYTES_PER_ELEMENT["nvfp4"])
    else:
        prec = np.where(b.fp8 >= 0, 1, 0)
        cast_by_code = np.array([CAST_BYTES_PER_ELEMENT[x] for x in
                                 ("delayed", "tensorwise", "blockwise", "mxfp8")] + [0.0])
        cast = cast_by_code[np.where(b.fp8 >= 0, b.fp8, 4)]
        cast = np.where(rowwise, CAST_BYTES_PER_ELEMENT["rowwise"], cast)
        if gpu.peak_fp8_flops is None and np.any(prec == 1):
            raise ConfigError(
                f"precision fp8 needs a GPU with FP8 tensor cores; {gpu.name} has none; "
                f"choose precision bf16"
            )
    # quantisation bytes per micro-batch: inputs (M K) forward, output grads (M N) backward,
    # weights (K N): once per step where the quantised copy is cached across micro-batches,
    # forward and backward of every micro-batch under FSDP (weight_casts_per_microbatch)
    low = LOW_PREC_SLOTS[None, :] & (prec[:, None] > 0)
    wc_f, wc_b = weight_casts_per_microbatch(b.fsdp, b.ga)
    gemms = GemmWork(
        M=M, N=N, K=K, count=C,
        cast_fwd_bytes=np.where(low, (M * K * C + wc_f[:, None] * K * N * C) * cast[:, None],
                                0.0),
        cast_bwd_bytes=np.where(low, (M * N * C + wc_b[:, None] * K * N * C) * cast[:, None],
                                0.0),
    )
    # sustained tensor rate relative to the architecture's reference part (power-limited clock)
    pw = gpu_power_ratios(gpu)
    device = DeviceWork(
        prec=prec,
        # blockwise, MXFP8 and torchao row-wise scaling: finer than per-tensor scales
        block_scaled=((b.fp8 == 2) | (b.fp8 == 3) | rowwise).astype(f64),
        peak_bf16=np.full(n, gpu.peak_bf16_flops),
        peak_low=np.choose(prec, [gpu.peak_bf16_flops, gpu.peak_fp8_flops or 1.0,
                                  gpu.peak_fp4_flops or 1.0]).astype(f64),
        operand_bytes=np.choose(prec, [OPERAND_BYTES[0], OPERAND_BYTES[1], OPERAND_BYTES[2]]),
        hbm_bw=np.full(n, gpu.hbm_bytes_per_s),
        scale_up_bw=np.full(n, gpu.scale_up_bytes_per_s),
        nic_bw=np.full(n, gpu.nic_bytes_per_s),
        sfu_exp_per_s=np.full(n, gpu.sfu_exp_per_s or 0.0),
        pw_peak=np.full(n, pw[0]), pw_units=np.full(n, pw[1]), pw_tdp=np.full(n, pw[2]),
    )

    # --- core attention (per layer, averaged over sliding and full layers)
    n_slide = sum(F.layer_is_sliding(model, i) for i in range(model.num_layers))
    frac_slide = n_slide / model.num_layers
    per_tok_full = F.core_attention_flops(model, training.seq_len, False)
    per_tok_slide = F.core_attention_flops(model, training.seq_len, True)
    # under context parallelism every attention kernel sees one ring step's key block
    # (cp_attention_block): its efficiency follows that length, not the whole context
    kv_block = cp_attention_block(training.seq_len, cp)
    attention = AttentionWork(
        flops_full=(1 - frac_slide) * mbs * s * per_tok_full / (tp * cp),
        flops_slide=frac_slide * mbs * s * per_tok_slide / (tp * cp),
        ctx_full=np.minimum(F.attention_context(model, training.seq_len, False), kv_block),
        ctx_slide=np.minimum(F.attention_context(model, training.seq_len, True), kv_block),
        head_dim=np.full(n, d_attn),
        # one exponential per score (query, key, head): FLOPs / (2 (d_qk + d_v))
        exp_per_flop=np.full(n, 1.0 / (2.0 * 2.0 * d_attn)),
    )

    # --- element-wise bytes per micro-batch (forward; backward moves twice as much)
    qk_norm = T * rope_width * 4 if model.qk_norm else 0.0
    ew_attn_norm = Tsp * h * 4 + T * mla_norm_width * 4
    v_width = a_loc * (model.mla.v_head_dim if model.mla is not None else model.head_dim)
    ew_cp_correction = cp_correction_bytes(T, v_width, cp)
    act_bytes = (up + 1) * BF16
    ew_mlp_norm = Tsp * h * 4
    ew_mlp_act = T * f_loc * act_bytes
    if model.is_moe:
        ew_moe_norm = Tsp * h * 4
        ew_moe_act = rows * fe_loc * act_bytes + T * fs_loc * act_bytes
        ew_moe = (
            ew_moe_norm + ew_moe_act + Tsp * h * 6
            + Tsp * E * 12  # fp32 router logits: write, softmax read/write
            + 2 * Tsp * width * BF16 * (1 + k)  # permute and unpermute
            # --moe-router-dtype fp32: the router's input cast to fp32 (ROUTER_FP32_CAST_BYTES)
            + (0.0 if b.router_fp32 is None else b.router_fp32 * Tsp * h
               * ROUTER_FP32_CAST_BYTES)
        )
    else:
        ew_moe_norm = ew_moe_act = ew_moe = np.zeros(n)
    elementwise = ElementwiseWork(
        attn_norm=ew_attn_norm,
        cp_correction=ew_cp_correction,
        attn=(ew_attn_norm + T * rope_width * 4 + Tsp * h * 6 + qk_norm + ew_cp_correction),
        mlp_norm=ew_mlp_norm,
        mlp_act=ew_mlp_act,
        mlp=ew_mlp_norm + ew_mlp_act + Tsp * h * 6,
        moe_norm=ew_moe_norm,
        moe_act=ew_moe_act,
        moe=ew_moe,
        out_fwd=Tsp * h * 4 + T * vloc * 10.0,  # final norm; CE: read bf16, fp32 passes
        out_bwd=Tsp * h * 8 + T * vloc * 6.0,
        emb_fwd=T * h * BF16,
        emb_bwd=T * h * (BF16 + FP32),
    )

    # --- tensor parallel (S = T h bf16; counts in all-gather/reduce-scatter equivalents)
    has_tp = (b.tp > 1).astype(f64)
    sp = b.sp.astype(f64)
    # with sequence parallelism an FP8 recipe quantises the layer input before gathering it
    # (Transformer Engine: current scaling reduces the amax over the TP group first, MXFP8 /
    # blockwise gather the scaled data; torchtitan's float8 tensor-parallel styles): the forward
    # all-gather and the backward re-gather move 1 byte per element instead of 2; reduce-scatters
    # and the gradient all-gather stay bf16. torchao row-wise scaling and NVFP4 gather bf16.
    ag = np.where((prec == 1) & ~rowwise, TP_FP8_ALLGATHER_FRACTION, 1.0)
    tp_work = TpWork(
        tensor_bytes=T * h * BF16,
        n=tp,
        has=has_tp,
        intra=group_intra(cluster, b.tp),
        local=group_local(cluster, np.ones(n, dtype=np.int64), b.tp),
        fwd_per_block=has_tp * (sp * (ag + 1.0) + (1 - sp) * 2.0),  # AG + RS, or one AR (= 2)
        bwd_per_block=has_tp * (sp * (2.0 + ag) + (1 - sp) * 2.0),  # + input re-gather (SP)
        shared_blocks=np.full(n, 1.0 if fs else 0.0),
        overlap=np.ones(n) if b.tp_overlap is None else b.tp_overlap.astype(f64),
    )

    # --- context parallel ring (p2p, K and V of the local chunk per step)
    cp_work = CpWork(block_bytes=T * kv_width * BF16, steps=cp - 1,
                     intra=group_intra(cluster, b.tp * b.cp))

    # --- expert parallel
    if model.is_moe:
        span = b.etp * b.ep
        per_node = np.maximum(1, np.minimum(b.ep, cluster.scale_up_gpus // np.maximum(1, b.etp)))
        ep_local = np.where(span <= cluster.scale_up_gpus, b.ep, per_node).astype(f64)
        # bytes the busiest rank moves (bf16 token copies; padded to the capacity under
        # token-drop, x (1 + u) under imbalanced dropless routing)
        disp = Tsp * k * width * BF16 * cap
        a2a_intra = disp * (ep_local - 1) / ep
        a2a_inter = disp * (ep - ep_local) / ep
        nodes = ep / ep_local
        flex_inter = Tsp * width * BF16 * (nodes - 1) * (1 - (1 - 1 / nodes) ** k) * skew
        ag_n = tp * ep
        ag_span = b.tp * b.ep
        ag_bytes = Tsp * width * BF16 * ag_n  # gathered tensor over tp x ep
        is_ag = b.dispatcher == 1
        is_flex = b.dispatcher == 2
        ep_work = EpWork(
            intra_bytes=np.where(is_ag, 0.0, a2a_intra),
            inter_bytes=np.where(is_ag, 0.0, np.where(is_flex, flex_inter, a2a_inter)),
            n=np.where(is_ag, ag_n, ep),
            gather_bytes=np.where(is_ag & (ag_n > 1), ag_bytes, 0.0),
            gather_intra=group_intra(cluster, ag_span),
            gather_local=group_local(cluster, np.ones(n, dtype=np.int64), b.tp * b.ep),
            active=((b.ep > 1) & ~is_ag).astype(f64),
            etp_bytes=np.where(b.etp > 1, rows * width * BF16, 0.0),
            etp_n=etp,
            etp_intra=group_intra(cluster, b.etp),
            etp_local=group_local(cluster, np.ones(n, dtype=np.int64), b.etp),
        )
    else:
        zero, one = np.zeros(n), np.ones(n)
        ep_work = EpWork(intra_bytes=zero, inter_bytes=zero, n=one, gather_bytes=zero,
                         gather_intra=one, gather_local=one, active=zero, etp_bytes=zero,
                         etp_n=one, etp_intra=one, etp_local=one)

    # --- pipeline p2p
    pp_work = PpWork(
        activation_bytes=np.where(b.pp > 1, Tsp * h * BF16, 0.0),
        sends=np.where(b.pp > 1, 2.0 * b.vpp, 0.0),  # forward + backward per chunk
        intra=group_intra(cluster, b.tp * b.cp * b.dp * b.pp),
    )

    # --- per-stage layer counts and parameters
    Pmax = int(b.pp.max())
    uniq, inv = _unique_rows(b.pp, b.vpp, b.split, b.recompute, b.recompute_method,
                             b.recompute_layers)
    kinds, mkind = kind_index(model), KINDS.index(mtp_kind(model))
    tables = [_stage_layers(kinds, mkind, model.num_mtp_layers, int(pp_), int(vpp_),
                            b.split_keys[int(split_)], int(rc_), int(meth_), int(k_))
              for pp_, vpp_, split_, rc_, meth_, k_ in uniq]

    def per_stage(name: str) -> np.ndarray:
        """One :class:`StageLayers` field as (n, Pmax) float64, padded with empty stages."""
        t = np.zeros((len(uniq), Pmax), dtype=np.int64)
        for j, table in enumerate(tables):
            col = getattr(table, name)
            t[j, : len(col)] = col
        return t[inv].astype(f64)

    layers = StageLayers(**{f.name: per_stage(f.name) for f in fields(StageLayers)})
    valid_u = np.zeros((len(uniq), Pmax), dtype=bool)
    for j, (pp_, *_rest) in enumerate(uniq):
        valid_u[j, : int(pp_)] = True
    valid = valid_u[inv]

    uq, inv2 = _unique_rows(b.tp, b.pp, b.ep, b.etp)
    units_u = [_param_units_cached(model, *map(int, row)) for row in uq]
    # the memory model's own per-stage count (oracle.memory.stage_params), on arrays: every
    # ParamUnits field as (n, 1), broadcast over the stages
    units = ParamUnits(**{f.name: np.array([getattr(u, f.name) for u in units_u],
                                           dtype=f64)[inv2][:, None]
                          for f in fields(ParamUnits)})
    params_dense, params_expert = stage_params(layers, units, model.is_moe)
    mtp_moe = model.is_moe  # MTP layers copy the last layer's kind (MoE for MoE models)
    stages = StageWork(
        dense_like=layers.dense_layers + (0 if mtp_moe else layers.mtp_layers),
        moe_like=layers.moe_layers + (layers.mtp_layers if mtp_moe else 0),
        mtp=layers.mtp_layers,
        embedding=layers.has_embedding,
        output_heads=layers.has_output + layers.mtp_layers,  # each MTP module: logits and loss
        rc_dense=layers.rc_dense_layers,
        rc_moe=layers.rc_moe_layers,
        valid=valid.astype(f64),
        params_dense=params_dense,
        params_expert=params_expert,
        # hybrid models: attention-only layers (an MTP depth runs one too:
        # layers.mtp_extra_blocks) and Mamba layers; 0 for a transformer
        attn_only=layers.attention_layers + (layers.mtp_layers if model.is_hybrid else 0),
        mamba=layers.mamba_layers,
        rc_attn_only=layers.rc_attention_layers,
        rc_mamba=layers.rc_mamba_layers,
    )

    # --- data parallel
    dense_group = b.dp * b.cp
    expert_group = np.maximum(1, cluster.world_size // (b.pp * b.ep * b.etp))
    dp_work = DpWork(
        dense_n=dense_group.astype(f64),
        dense_intra=group_intra(cluster, b.tp * dense_group),
        dense_local=group_local(cluster, b.tp, dense_group),
        expert_n=expert_group.astype(f64),
        expert_intra=group_intra(cluster, b.ep * b.etp * expert_group),
        expert_local=group_local(cluster, b.ep * b.etp, expert_group),
        dist_opt=b.distributed_optimizer.astype(f64),
        fsdp=b.fsdp.astype(f64),
        grad_bytes=(np.full(n, FP32) if b.grad_fp32 is None
                    else np.where(b.grad_fp32, FP32, BF16)),
        bucket_params=ddp_bucket_params(dense_group).astype(f64),
    )

    # --- schedule and recompute
    sel = b.recompute == 1
    recompute = RecomputeWork(**{mod: (sel & ((b.recompute_modules & bit) > 0)).astype(f64)
                                 for mod, bit in MODULE_BITS.items()})
    # the host synchronises with the GPU once per MoE layer unless routing is token-drop with a
    # dispatcher of fixed shapes: the flex dispatcher (DeepEP / HybridEP) returns its receive
    # counts to the host even when the experts are padded to capacity (moe_host_sync)
    dropless = np.ones(n, dtype=bool) if b.dropless is None else b.dropless
    sync_free = np.zeros(n, dtype=np.int64) if b.sync_free is None else b.sync_free
    gmask = np.zeros(n, dtype=np.int64) if b.graph_mask is None else b.graph_mask
    full_graph = (gmask & GRAPH_BITS["full_iteration"]) > 0
    schedule = ScheduleWork(
        m=b.ga.astype(f64),
        vpp=b.vpp.astype(f64),
        bubble_factor=np.where(b.schedule == 2, ZERO_BUBBLE_FACTOR, 1.0),
        pp_on=(b.pp > 1).astype(f64),
        has_moe=np.full(n, 1.0 if model.is_moe else 0.0),
        moe_sync=(moe_host_sync(dropless, b.dispatcher, sync_free) & ~full_graph).astype(f64),
        local_experts=np.ceil(E / ep) if model.is_moe else np.zeros(n),
        **{f"graph_{part}": ((gmask & bit) > 0).astype(f64) for part, bit in GRAPH_BITS.items()},
        a2a_overlap=np.zeros(n) if b.a2a_overlap is None else b.a2a_overlap.astype(f64),
        current_scaling=((prec == 1) & (b.fp8 == FP8_CODE[Fp8Recipe.TENSORWISE])
                         & ~rowwise).astype(f64),
    )
    return Work(gemm=gemms, device=device, attention=attention, elementwise=elementwise,
                tp=tp_work, cp=cp_work, ep=ep_work, pp=pp_work, dp=dp_work, stages=stages,
                recompute=recompute, schedule=schedule, hybrid=mamba_work(model, b, T, Tsp),
                backend=backend_work(model, b, sync_free))


def backend_work(model: ModelSpec, b: ConfigBatch, sync_free: np.ndarray) -> BackendWork:
    """The MoE backend's records (:class:`BackendWork`) from the batch's backend fields."""
    n = len(b)
    f64 = np.float64
    if not model.is_moe:
        z = np.zeros(n)
        return BackendWork(flex=z, flex_overlap=z, shared_overlap=z, fused_grouped=z,
                           host_ops=z, host_ops_per_expert=np.full(n, 4.0))
    gg = (np.full(n, GROUPED_GEMM_CODE[GroupedGemm.TE]) if b.grouped_gemm is None
          else b.grouped_gemm)
    off = np.zeros(n, dtype=bool)
    fusion = off if b.permute_fusion is None else b.permute_fusion
    shared = off if b.shared_overlap is None else b.shared_overlap
    flex = (b.dispatcher == DISPATCH_CODE[Dispatcher.FLEX]) & (b.ep > 1)
    # only Primus-Turbo's DeepEP hides its all-to-all behind the layer's own computation
    # (collectives.DEEPEP_OVERLAP_EFFICIENCY); Megatron-Core's DeepEP dispatch waits for its
    # result on the compute stream (token_dispatcher.py _DeepepManager.dispatch, async_finish
    # False, l.1306-1330 at d98e8a64) and HybridEP's output is consumed at once, so NVIDIA flex
    # hides only what the schedule hides (ep_comm_overlap / ep_a2a_overlap)
    turbo = flex & (np.zeros(n, dtype=bool) if b.turbo_flex is None else b.turbo_flex)
    eff = np.array([DEEPEP_OVERLAP_EFFICIENCY[k] for k in range(4)])[np.clip(sync_free, 0, 3)]
    ops, per_expert = backend_ops(gg, fusion, sync_free)
    fused = (gg == GROUPED_GEMM_CODE[GroupedGemm.LEGACY]) | (gg == GROUPED_GEMM_CODE[
        GroupedGemm.TURBO])
    return BackendWork(
        flex=turbo.astype(f64), flex_overlap=np.where(turbo, eff, 0.0),
        shared_overlap=(shared & (model.num_shared_experts > 0)).astype(f64),
        fused_grouped=fused.astype(f64), host_ops=ops, host_ops_per_expert=per_expert)


@lru_cache(maxsize=4096)
def _param_units_cached(model: ModelSpec, tp: int, pp: int, ep: int, etp: int) -> ParamUnits:
    return param_units(model, tp, pp, ep, etp)


def concat_work(works: Sequence[Work]) -> Work:
    """Stack the work of several (model, cluster, training) batches into one (stage axis padded
    with empty stages), so :func:`oracle.timing.timing` evaluates them all at once."""
    pmax = max(w.stages.valid.shape[1] for w in works)

    def stack(records: Sequence[Any]) -> Any:
        cls = type(records[0])
        out = {}
        for f in fields(cls):
            parts = [getattr(r, f.name) for r in records]
            if is_dataclass(parts[0]):
                out[f.name] = stack(parts)
                continue
            if cls is StageWork:
                parts = [np.pad(x, ((0, 0), (0, pmax - x.shape[1]))) if x.shape[1] < pmax
                         else x for x in parts]
            out[f.name] = np.concatenate(parts, axis=0)
        return cls(**out)

    return stack(works)
