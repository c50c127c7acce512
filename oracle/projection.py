"""Time projection: step time, tokens/s/GPU, model TFLOP/s/GPU, MFU and a breakdown.

The model is split in two so that one code path serves a single configuration, a vectorised
batch of configurations, and the calibration over many published runs:

1. :func:`build_work` — *what* one rank does per micro-batch, independent of the fitted
   constants: the shape ``(M, N, K)`` of every GEMM, core-attention FLOPs, bytes of memory-bound
   element-wise work, bytes of every collective with its group size and link, how many layers of
   each kind every pipeline stage holds and recomputes, parameters per stage (for data-parallel
   traffic and the optimizer). numpy arrays, one entry per configuration.
2. :func:`timing` — *how long* that takes, given the constants of ``oracle/constants.py``
   (scalars or one value per configuration): GEMM time from a shape-dependent efficiency,
   attention at the flash-attention efficiency, element-wise work at HBM bandwidth, collectives
   on an alpha-beta model of the right link with the overlap the framework achieves, then the
   pipeline schedule over the slowest stage, data-parallel traffic and the optimizer step.

:func:`project` is ``build_work`` + ``timing`` for one configuration; :func:`score_configs`
is the same for a :class:`ConfigBatch`, and returns identical step times (a test checks it).

Time terms (one micro-batch on one rank unless said otherwise; symbols: T = mbs s / cp tokens,
T_sp = T / tp under sequence parallelism, h hidden, f FFN width, V vocabulary):

* **GEMM** of shape (M, N, K): ``2 M N K / (peak x eff)``, ``eff = eff_prec x
  g(M) g(N) g(K)``, ``g(x) = x / (x + gemm_half_dim)``, never faster than moving its operands
  through HBM; expert GEMMs also x ``grouped_gemm_efficiency``. A low-precision GEMM's half
  dimension is ``gemm_half_dim`` x its peak over the BF16 peak (:func:`gemm_half_dims`: the
  fixed part of a GEMM's time takes as long at any precision, so FP8/FP4 gain less on small
  GEMMs). Backward = dgrad + wgrad, the
  same shape factors, twice the forward time; block-scaled recipes (MXFP8, blockwise) run at
  ``block_scaled_gemm_efficiency`` of a per-tensor FP8 GEMM. Low precision (FP8 recipes, NVFP4) applies to the
  transformer-layer linears; router and logits stay BF16 (Megatron/Transformer Engine default).
  FP8/FP4 quantisation of GEMM inputs (and of output gradients in backward) is element-wise
  work: :data:`CAST_BYTES_PER_ELEMENT` bytes per element (torchao row-wise scaling,
  ``RunTraits.fp8_rowwise``: 10). Weights are quantised once per step where the framework keeps
  the low-precision copy across micro-batches, every micro-batch forward and backward under
  FSDP (:func:`weight_casts_per_microbatch`).
* **Core attention** (flash): forward FLOPs from :mod:`oracle.flops` (causal), backward 2.5 x
  forward (FlashAttention-2 recomputes the scores: 5 matmuls vs 2; Dao 2023), at
  ``attention_efficiency`` x head-dim factor x ``g(context)``; never faster than the GPU's
  special-function units compute the softmax exponentials (one per score forward, one more in
  backward; ``sfu_exp_per_s`` in gpus.json): Blackwell Ultra doubles that rate.
* **Element-wise** (norms, rope, residual adds, SwiGLU/GELU, router softmax, MoE permute and
  unpermute, cross-entropy, embedding): bytes read + written / (HBM x ``hbm_efficiency``);
  backward moves twice the forward bytes.
* **Host overhead**: the host issues :data:`KERNELS_PER_LAYER` operations per layer (forward;
  backward twice as many; a MoE layer adds a fixed set plus four per local expert) at
  ``kernel_overhead_s`` each. The host runs ahead of the GPU: a dense layer exposes only host
  time beyond its GPU time. A dropless MoE layer synchronises host and device once (token
  counts), so the host cannot run ahead across it: the layer takes the smooth maximum
  ``(host^p + gpu^p)^(1/p)`` (p = ``host_gpu_overlap_exponent``, fitted) of its host and GPU
  times. The excess
  over the GPU time is ``kernel_overhead``. Small micro-batches of fine-grained MoE models
  (many local experts, little work per expert) become host-bound.
* **Collectives** (ring): ``alpha (1 + log2 n) + (n - 1)/n x S / (link x link_eff)`` for an
  all-gather or reduce-scatter of a tensor of S bytes (all-reduce = two); all-to-all:
  ``alpha (1 + log2 n) + max(intra bytes / scale-up, inter bytes / NIC)``. Rank order
  tp-cp-ep-dp-pp (Megatron): a group of size n and stride st stays on the scale-up links when
  ``st x n <= scale-up domain``, else its traffic crosses the NIC.
* **TP/SP**: per layer forward, all-gather + reduce-scatter of ``T h`` bf16 around attention and
  around the MLP (one all-reduce each without SP); backward adds the re-gather of the input for
  the weight gradient; under an FP8 recipe with SP the input is quantised before it is gathered
  (the forward all-gather and backward re-gather move half the bytes,
  :data:`TP_FP8_ALLGATHER_FRACTION`); exposed ``max(0, comm - tp_comm_overlap x GEMM time)``
  where the run overlaps TP communication (:class:`RunTraits`), all of it otherwise.
* **CP** (ring p2p): ``cp - 1`` exchanges of the local K and V per layer (backward: K, V, dK,
  dV), each overlapping one ``1/cp`` block of attention: exposed ``(cp - 1) max(0, step -
  attention / cp)``.
* **EP**: dispatch and combine all-to-all of ``T_sp k h`` bf16 (forward and backward), plus the
  ETP all-gather / reduce-scatter; ``allgather`` dispatcher gathers ``T_sp h`` over tp x ep;
  ``flex`` (DeepEP, HybridEP) sends a token once per destination node: ``(N - 1)(1 - (1 - 1/N)^k)``
  node copies instead of ``k (N - 1)/N``; exposed ``(1 - ep_comm_overlap) x time``.
* **PP p2p**: one ``T_sp h`` bf16 activation per chunk boundary each way (``t_send`` each).
  In the interleaved schedule Megatron overlaps each transfer with the next chunk's compute
  (``overlap_p2p_comm``): per virtual stage and direction only ``max(0, t_send -
  pp_comm_overlap x chunk time)`` is exposed (chunk time: the stage's forward or backward
  divided by vpp); the 1F1B schedule sends and receives on the critical path (fully exposed).
* **Pipeline**: with ``t_s`` the per-micro-batch time of stage s (forward + backward +
  recompute + exposed comm) and m micro-batches, ``m max_s t_s + bubble_factor x (sum_s t_s -
  max_s t_s) / vpp``: for equal stages this is Narayanan et al.'s ``(m + (p - 1)/vpp) t``
  (interleaved bubble ``(p - 1)/(vpp m)``); the slowest stage sets the pace; zero-bubble
  (ZB-H1, Qi et al. 2023) keeps a third of the 1F1B bubble.
* **DP**: distributed optimizer: reduce-scatter of the gradients in their buffer's dtype (fp32,
  4 B/param; bf16, 2 B/param with ``grad_reduce_in_fp32=False``) and all-gather of bf16
  parameters (2 B/param) over dp x cp (dense) and expert-dp (experts), exposed beyond
  ``dp_comm_overlap`` x one micro-batch's backward (forward for the gather); without it an
  all-reduce; FSDP (ZeRO-3): all-gather in forward and backward plus the reduce-scatter *every
  micro-batch*, overlapped the same way.
* **Optimizer**: Adam with fp32 master weights reads and writes
  :data:`OPTIMIZER_BYTES_PER_PARAM` bytes per local parameter at HBM speed.
* **Step overhead**: ``step_overhead_s`` once per step (host work the GPU waits for: gradient
  norm and clipping, loss averaging and logging synchronisation, optimizer launches, the
  data batch); it matters for short steps (few micro-batches).

Breakdown (:data:`BREAKDOWN`): seconds per step that add up to ``step_time_s``: the components
of the slowest stage times the number of micro-batches, then the bubble, the exposed DP
traffic and the optimizer step of the stage that finishes last, and the fixed step overhead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from types import SimpleNamespace
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from oracle import flops as F
from oracle import params as P
from oracle.constants import (
    CONSTANT_NAMES,
    POWER_REFERENCE_GPU,
    REFERENCE_SOFTWARE,
    CalibrationTable,
    evidence_note,
    load_calibration,
)
from oracle.inventory import (
    kind_index,
    mamba_cp_all_to_all_elements,
    mamba_gemms,
    mamba_scan_bytes_per_token,
    mamba_scan_flops_per_token,
)
from oracle.memory import param_units, pipeline_chunks, recompute_groups, stage_params
from oracle.specs import (
    ClusterSpec,
    ConfigError,
    Dispatcher,
    Fp8Recipe,
    GpuSpec,
    ModelSpec,
    ParallelConfig,
    PipelineSplit,
    Precision,
    Recompute,
    RecomputeMethod,
    Schedule,
    TrainingSpec,
    auto_pipeline_split,
)

BF16 = 2.0
FP32 = 4.0
#: Adam step per local parameter: read fp32 grad (4), read+write fp32 master (8), exp_avg (8),
#: exp_avg_sq (8), write bf16 param (2), gradient-norm pass (4). Megatron distributed optimizer.
OPTIMIZER_BYTES_PER_PARAM = 34.0
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
#: Bytes of an FP8 all-gather relative to the bf16 one (1 byte per element instead of 2).
TP_FP8_ALLGATHER_FRACTION = 0.5
#: Bytes per element of a GEMM operand read from HBM (memory-bound floor of a GEMM).
OPERAND_BYTES = {0: 2.0, 1: 1.0, 2: 0.5625}  # bf16, fp8, nvfp4 (4 bit + 1 scale byte per 16)
#: Flash-attention backward FLOPs over forward (5 matmuls over 2; Dao 2023, FlashAttention-2).
ATTENTION_BWD_FLOPS_RATIO = 2.5
#: Host operations (Python-dispatched kernels and collectives) per forward pass of one layer part;
#: the backward issues twice as many. attention: norm, QKV, rope, attention, output projection,
#: residual, bias/dropout; mlp: norm, fc1, activation, fc2, residual; moe (on top of the mlp
#: entry's norm/residual/activation), order-of-magnitude count of Megatron-Core's dropless MoE
#: layer: router GEMM, softmax/top-k, load-balancing and z losses (a dozen small ops), token
#: counts and their device-to-host copy, the count exchange, permutation index ops, two token
#: all-to-alls, unpermute, probability scaling, ~40; moe_per_local_expert: the grouped expert
#: MLP is a loop over the rank's experts (Transformer Engine GroupedLinear: per expert an
#: input quantisation and a GEMM for fc1 and for fc2 forward), 4 per local expert.
#: mamba (one Mamba-2 mixer layer, Megatron-Core 0.16.1 training path): fused norm + in_proj,
#: two layout copies (rearrange), the fused conv1d + SSD scan (causal_conv1d and the five
#: mamba_ssm chunk kernels: cumsum, chunk state, state passing, C B^T, chunk scan), the gated
#: RMSNorm, out_proj and the residual add, ~11.
KERNELS_PER_LAYER = {"attention": 7.0, "mlp": 5.0, "moe": 40.0, "moe_per_local_expert": 4.0,
                     "mamba": 11.0}
#: Megatron-Core DDP bucket size when ``--ddp-bucket-size`` is unset: ``max(40M, 1M x dp_cp
#: size)`` parameters (megatron/core/distributed/distributed_data_parallel_config.py,
#: ``bucket_size`` docstring; megatron/training ``resolve_ddp_bucket_size``). Model chunks after
#: the first are one bucket each (``disable_bucketing=(model_chunk_idx > 0)`` in get_model).
DDP_BUCKET_MIN_PARAMS = 40_000_000
DDP_BUCKET_PARAMS_PER_DP_RANK = 1_000_000
#: Host operations of one context-parallel ring step and direction (Transformer Engine
#: ``AttnFuncWithCPAndKVP2P``, Megatron's default ``cp_comm_type p2p``): isend, irecv, their
#: wait, up to two flash-attention calls (the load-balanced halves of the step's block) and the
#: softmax-LSE / output correction; order-of-magnitude count.
CP_OPS_PER_RING_STEP = 6.0
#: Bytes per output element of the per-step output correction of ring attention: read the fp32
#: running output (4), write it (4), read the step's bf16 partial output (2) (TE
#: ``flash_attn_fwd_out_correction``); forward, backward moves twice (element-wise convention).
CP_CORRECTION_BYTES_PER_ELEMENT = 10.0
#: Zero-bubble (ZB-H1) keeps ~1/3 of the 1F1B bubble (Qi et al. 2023, "Zero Bubble Pipeline
#: Parallelism"); DualPipe is represented by the same factor.
ZERO_BUBBLE_FACTOR = 1.0 / 3.0

BREAKDOWN: tuple[str, ...] = (
    "attention_gemm",  # QKV / MLA projections and the attention output projection, fwd + bwd
    "core_attention",  # flash attention fwd + bwd
    "mlp_gemm",  # dense MLP GEMMs
    "expert_gemm",  # routed (grouped) and shared expert GEMMs
    "router",  # router GEMM
    "mamba_mixer",  # Mamba-2 in/out projections and the chunked SSD scan, fwd + bwd (hybrid)
    "elementwise",  # norms, rope, activations, residuals, permutes, FP8/FP4 casts
    "embedding_logits_loss",  # embedding, final norm, logits GEMM, cross-entropy, MTP heads
    "recompute",  # recomputed forward work (selective modules or full layers)
    "kernel_overhead",  # launch / host overhead not hidden
    "tp_comm",  # exposed TP/SP collectives
    "cp_comm",  # exposed context-parallel ring exchange
    "ep_comm",  # exposed MoE dispatch / combine
    "pp_p2p",  # exposed pipeline send / receive
    "pipeline_bubble",  # fill and drain of the pipeline schedule
    "dp_comm",  # exposed data-parallel / FSDP collectives
    "optimizer",  # optimizer step
    "step_overhead",  # fixed host work per step (grad norm, loss logging sync, launches)
)

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

# config codes
RECOMPUTE_CODE = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2}
METHOD_CODE = {RecomputeMethod.UNIFORM: 0, RecomputeMethod.BLOCK: 1}
DISPATCH_CODE = {Dispatcher.ALLTOALL: 0, Dispatcher.ALLGATHER: 1, Dispatcher.FLEX: 2}
SCHEDULE_CODE = {Schedule.ONE_F_ONE_B: 0, Schedule.INTERLEAVED: 1, Schedule.ZERO_BUBBLE: 2}
SPLIT_CODE = {PipelineSplit.EVEN: 0, PipelineSplit.EMBEDDING_LOSS: 1}
FP8_CODE = {None: -1, Fp8Recipe.DELAYED: 0, Fp8Recipe.TENSORWISE: 1, Fp8Recipe.BLOCKWISE: 2,
            Fp8Recipe.MXFP8: 3}
MODULE_BITS = {"core_attn": 1, "layernorm": 2, "mlp": 4, "moe": 8, "moe_act": 16,
               "shared_experts": 32, "mla_up_proj": 64}
_CODE_RECOMPUTE = {v: k for k, v in RECOMPUTE_CODE.items()}
_CODE_METHOD = {v: k for k, v in METHOD_CODE.items()}
_CODE_SPLIT = {v: k for k, v in SPLIT_CODE.items()}


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
    ``moe_dropless``: MoE layers route without a capacity limit (Megatron-Core's default,
    ``--moe-expert-capacity-factor`` unset): each layer copies its token counts to the host, so
    the host cannot run ahead of the GPU across it (:func:`host_exposed`, and at every pipeline
    chunk boundary :func:`chunk_boundary_host`). False: token-drop (``--moe-expert-capacity-factor
    1.0 --moe-pad-expert-input-to-capacity``): fixed shapes, no synchronisation, the host runs
    ahead as for a dense layer. Ignored for dense models.
    """

    tp_comm_overlap: bool = True
    fp8_rowwise: bool = False
    moe_dropless: bool = True


DEFAULT_TRAITS = RunTraits()


@dataclass
class ConfigBatch:
    """Many resolved configurations of one (model, cluster, training) as integer arrays.

    Codes: ``recompute`` 0 none / 1 selective / 2 full; ``recompute_method`` 0 uniform /
    1 block; ``recompute_layers`` -1 = every layer; ``recompute_modules`` bit mask of
    :data:`MODULE_BITS`; ``dispatcher`` 0 alltoall / 1 allgather / 2 flex; ``schedule`` 0 1f1b /
    1 interleaved / 2 zero-bubble; ``split`` 0 even / 1 embedding_loss; ``fp8`` -1 none /
    0 delayed / 1 tensorwise / 2 blockwise / 3 mxfp8. ``tp_overlap`` / ``fp8_rowwise``: the
    :class:`RunTraits` of each configuration as 0/1 arrays (None: the defaults).
    """

    tp: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    dp: np.ndarray
    mbs: np.ndarray
    ga: np.ndarray
    sp: np.ndarray
    recompute: np.ndarray
    recompute_method: np.ndarray
    recompute_layers: np.ndarray
    recompute_modules: np.ndarray
    distributed_optimizer: np.ndarray
    fsdp: np.ndarray
    dispatcher: np.ndarray
    schedule: np.ndarray
    split: np.ndarray
    fp8: np.ndarray
    tp_overlap: np.ndarray | None = None
    #: gradient buffer / DP reduction in fp32 (None: all True, the default)
    grad_fp32: np.ndarray | None = None
    fp8_rowwise: np.ndarray | None = None
    #: dropless MoE routing (None: all True, the default; RunTraits.moe_dropless)
    dropless: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.tp)

    @classmethod
    def from_configs(
        cls,
        configs: Sequence[ParallelConfig],
        traits: RunTraits | Sequence[RunTraits] | None = None,
    ) -> ConfigBatch:
        """From configurations already resolved by :func:`oracle.specs.resolve_config`;
        ``traits``: one :class:`RunTraits` for all, one per configuration, or None (defaults)."""
        if traits is None or isinstance(traits, RunTraits):
            traits = [traits or DEFAULT_TRAITS] * len(configs)
        if len(traits) != len(configs):
            raise ConfigError("from_configs(): give one RunTraits per configuration")
        for c in configs:
            if c.dp is None or c.ga is None or c.pipeline_split is None:
                raise ConfigError("resolve_config() the configuration before projecting it")
        def arr(get: Any, dtype: Any = np.int64) -> np.ndarray:
            return np.array([get(c) for c in configs], dtype=dtype)
        return cls(
            tp=arr(lambda c: c.tp), pp=arr(lambda c: c.pp), vpp=arr(lambda c: c.vpp),
            cp=arr(lambda c: c.cp), ep=arr(lambda c: c.ep), etp=arr(lambda c: c.etp_),
            dp=arr(lambda c: c.dp), mbs=arr(lambda c: c.mbs), ga=arr(lambda c: c.ga),
            sp=arr(lambda c: c.sp, bool),
            recompute=arr(lambda c: RECOMPUTE_CODE[c.recompute]),
            recompute_method=arr(lambda c: METHOD_CODE[c.recompute_method]),
            recompute_layers=arr(
                lambda c: -1 if c.recompute_layers is None else c.recompute_layers
            ),
            recompute_modules=arr(
                lambda c: sum(MODULE_BITS[m] for m in set(c.recompute_modules))
            ),
            distributed_optimizer=arr(lambda c: c.distributed_optimizer, bool),
            fsdp=arr(lambda c: c.fsdp, bool),
            dispatcher=arr(lambda c: DISPATCH_CODE[c.dispatcher]),
            schedule=arr(lambda c: SCHEDULE_CODE[c.schedule_]),
            split=arr(lambda c: SPLIT_CODE[c.pipeline_split]),
            fp8=arr(lambda c: FP8_CODE[c.fp8_recipe]),
            tp_overlap=np.array([t.tp_comm_overlap for t in traits], dtype=bool),
            fp8_rowwise=np.array([t.fp8_rowwise for t in traits], dtype=bool),
            dropless=np.array([t.moe_dropless for t in traits], dtype=bool),
            grad_fp32=arr(lambda c: c.grad_reduce_in_fp32, bool),
        )

    @classmethod
    def from_arrays(
        cls,
        model: ModelSpec,
        cluster: ClusterSpec,
        training: TrainingSpec,
        *,
        tp: Any = 1,
        pp: Any = 1,
        vpp: Any = 1,
        cp: Any = 1,
        ep: Any = 1,
        etp: Any = None,
        mbs: Any = 1,
        recompute: Any = 0,
        recompute_method: Any = 1,
        recompute_layers: Any = -1,
        recompute_modules: Any = MODULE_BITS["core_attn"],
        distributed_optimizer: Any = True,
        fsdp: Any = False,
        dispatcher: Any = 0,
        schedule: Any = None,
        fp8: Any = None,
        sp: Any = None,
        tp_comm_overlap: Any = True,
        fp8_rowwise: Any = False,
        grad_reduce_in_fp32: Any = True,
        moe_dropless: Any = True,
    ) -> ConfigBatch:
        """Vectorised :func:`oracle.specs.resolve_config`: arrays (or scalars, broadcast) of the
        free axes; dp = world / (tp pp cp), ga = gbs / (mbs dp), etp = tp, SP when tp > 1,
        interleaved when vpp > 1, FP8 recipe from the training precision, pipeline split
        ``even`` when the layers divide over pp x vpp. Recompute layers only count under full
        recompute (``-1`` = all). ``tp_comm_overlap`` / ``fp8_rowwise``: :class:`RunTraits`
        fields (scalars or arrays)."""
        tp_ = np.asarray(tp, dtype=np.int64)
        arrays = np.broadcast_arrays(
            tp_, np.asarray(pp), np.asarray(vpp), np.asarray(cp), np.asarray(ep),
            np.asarray(mbs), np.asarray(recompute),
        )
        n = arrays[0].size
        def b(x: Any, dtype: Any = np.int64) -> np.ndarray:
            return np.broadcast_to(np.asarray(x, dtype=dtype), (n,)).copy()
        tp_, pp_, vpp_, cp_, ep_, mbs_, rc_ = (b(a.ravel()) for a in arrays)
        etp_ = tp_.copy() if etp is None else b(etp)
        dp_ = np.maximum(1, cluster.world_size // (tp_ * pp_ * cp_))
        ga_ = np.maximum(1, training.global_batch_size // (mbs_ * dp_))
        if fp8 is None:
            code = -1
            if training.precision is Precision.FP8:
                from oracle.specs import default_fp8_recipe

                code = FP8_CODE[default_fp8_recipe(cluster.gpu)]
            fp8 = code
        split_ = np.where(model.num_layers % (pp_ * vpp_) == 0, 0, 1)
        sched_ = np.where(vpp_ > 1, 1, 0) if schedule is None else b(schedule)
        layers_ = np.where(rc_ == 2, b(recompute_layers), -1)
        return cls(
            tp=tp_, pp=pp_, vpp=vpp_, cp=cp_, ep=ep_, etp=etp_, dp=dp_, mbs=mbs_, ga=ga_,
            sp=(tp_ > 1) if sp is None else b(sp, bool),
            recompute=rc_, recompute_method=b(recompute_method), recompute_layers=layers_,
            recompute_modules=b(recompute_modules), distributed_optimizer=b(
                distributed_optimizer, bool), fsdp=b(fsdp, bool), dispatcher=b(dispatcher),
            schedule=sched_, split=split_.astype(np.int64), fp8=b(fp8),
            tp_overlap=b(tp_comm_overlap, bool), fp8_rowwise=b(fp8_rowwise, bool),
            grad_fp32=b(grad_reduce_in_fp32, bool), dropless=b(moe_dropless, bool),
        )

    def traits(self, i: int) -> RunTraits:
        """The :class:`RunTraits` of configuration ``i``."""
        return RunTraits(
            tp_comm_overlap=True if self.tp_overlap is None else bool(self.tp_overlap[i]),
            fp8_rowwise=False if self.fp8_rowwise is None else bool(self.fp8_rowwise[i]),
            moe_dropless=True if self.dropless is None else bool(self.dropless[i]),
        )

    def config(self, i: int) -> ParallelConfig:
        """Configuration ``i`` as a resolved :class:`ParallelConfig`."""
        mods = tuple(m for m, bit in MODULE_BITS.items() if self.recompute_modules[i] & bit)
        rc = _CODE_RECOMPUTE[int(self.recompute[i])]
        fp8 = {v: k for k, v in FP8_CODE.items()}[int(self.fp8[i])]
        return ParallelConfig(
            tp=int(self.tp[i]), pp=int(self.pp[i]), vpp=int(self.vpp[i]), cp=int(self.cp[i]),
            ep=int(self.ep[i]), etp=int(self.etp[i]), dp=int(self.dp[i]), mbs=int(self.mbs[i]),
            ga=int(self.ga[i]), sequence_parallel=bool(self.sp[i]), recompute=rc,
            recompute_method=_CODE_METHOD[int(self.recompute_method[i])],
            recompute_layers=(None if self.recompute_layers[i] < 0 or rc is not Recompute.FULL
                              else int(self.recompute_layers[i])),
            recompute_modules=mods or ("core_attn",),
            distributed_optimizer=bool(self.distributed_optimizer[i]),
            fsdp=bool(self.fsdp[i]),
            grad_reduce_in_fp32=True if self.grad_fp32 is None else bool(self.grad_fp32[i]),
            dispatcher={v: k for k, v in DISPATCH_CODE.items()}[int(self.dispatcher[i])],
            schedule={v: k for k, v in SCHEDULE_CODE.items()}[int(self.schedule[i])],
            fp8_recipe=fp8, pipeline_split=_CODE_SPLIT[int(self.split[i])],
        )


# ================================================================================ work


@lru_cache(maxsize=65536)
def _stage_layers(
    kinds: tuple[int, ...], num_mtp: int, pp: int, vpp: int,
    split: int, recompute: int, method: int, k: int,
) -> np.ndarray:
    """Per stage (rows): dense layers, MoE layers, MTP layers, has embedding, has output, fully
    recomputed dense layers, fully recomputed MoE layers, then attention-only and Mamba layers
    and their fully recomputed counts (hybrid models). ``kinds``: each layer's kind as an index
    into ``oracle.inventory.KINDS``. Pipeline layout and recompute groups come from
    :mod:`oracle.memory` (``pipeline_chunks``, ``recompute_groups``)."""
    out = np.zeros((pp, 11), dtype=np.int64)
    chunks = pipeline_chunks(len(kinds), num_mtp, pp, vpp, _CODE_SPLIT[split])
    rc = _CODE_RECOMPUTE[recompute]
    kk = None if k < 0 else k
    col = {0: 0, 1: 1, 2: 7, 3: 8}  # kind index -> layer column
    rc_col = {0: 5, 1: 6, 2: 9, 3: 10}
    for s, stage in enumerate(chunks):
        for ch in stage:
            for i in ch.layers:
                out[s, col[kinds[i]]] += 1
            out[s, 2] += ch.mtp_layers
            out[s, 3] |= int(ch.has_embedding)
            out[s, 4] |= int(ch.has_output)
            for lo, hi in recompute_groups(len(ch.layers), rc, _CODE_METHOD[method], kk):
                for i in ch.layers[lo:hi]:
                    out[s, rc_col[kinds[i]]] += 1
    return out


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


def _padded_vocab(vocab: int, tp: np.ndarray) -> np.ndarray:
    multiple = P.VOCAB_DIVISIBLE_BY * tp
    return -(-vocab // multiple) * multiple


def _link(cluster: ClusterSpec, span: np.ndarray) -> np.ndarray:
    """1 where a group spanning ``span`` consecutive ranks stays on the scale-up links, else 0."""
    return (span <= cluster.scale_up_gpus).astype(np.float64)


def _local(cluster: ClusterSpec, stride: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Members of a group (``size`` ranks, ``stride`` apart) inside one scale-up domain: a ring
    collective that leaves the domain drives that many NICs per domain in parallel (NCCL builds
    one ring per NIC), so its bus bandwidth is ``min(scale-up, local x NIC)``."""
    per = np.maximum(1, cluster.scale_up_gpus // np.maximum(1, stride))
    return np.minimum(size, per).astype(np.float64)


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


def gemm_half_dims(half_dim: Any, low: np.ndarray, peak_low: Any, peak_bf16: Any) -> np.ndarray:
    """The GEMM dimension at which each slot runs at half its large-GEMM efficiency
    (``g(x) = x / (x + half)``).

    ``gemm_half_dim`` is measured in BF16 work: a GEMM's fixed part (launch and pipeline fill,
    prologue, the epilogue that writes the bf16 output, the last partial wave) takes the same
    time at any precision, while a low-precision tile computes ``peak_low / peak_bf16`` times
    faster, so the same fixed time is worth that many times more rows, columns or reduction
    length: ``half_low = gemm_half_dim x peak_low / peak_bf16`` (FP8: 2x, NVFP4: 4x-6x). Small
    GEMMs (high tp, small experts, few tokens per expert) gain less from FP8/FP4 than large
    ones. Worked example: half dim 128, FP8 at twice the BF16 peak: a 1024-wide dimension runs at
    1024/1280 = 0.80 in FP8 against 1024/1152 = 0.89 in BF16.

    ``half_dim``: (n,) or scalar; ``low``: (n, slots) bool, the slots in low precision;
    ``peak_low``/``peak_bf16``: (n,). Returns (n, slots)."""
    half = np.asarray(half_dim, dtype=np.float64)[..., None]
    ratio = (np.asarray(peak_low, dtype=np.float64)
             / np.asarray(peak_bf16, dtype=np.float64))[:, None]
    return np.where(low, half * ratio, half)


def _per_tp(fn: Any, tp: np.ndarray) -> np.ndarray:
    """``fn(tp)`` for every configuration, evaluated once per distinct tp."""
    uq, inv = np.unique(tp, return_inverse=True)
    return np.array([float(fn(int(t))) for t in uq], dtype=np.float64)[inv.reshape(-1)]


def mamba_work(model: ModelSpec, b: ConfigBatch, T: np.ndarray, Tsp: np.ndarray
               ) -> dict[str, np.ndarray]:
    """What one Mamba-2 mixer layer does per micro-batch on one rank beside its GEMMs
    (``oracle/inventory.py``): the chunked SSD scan's FLOPs (under CP each rank scans the whole
    sequence for ``H / (tp cp)`` heads: ``T cp x flops(tp) / cp``), its chunk length (the scan's
    matmul dimension), the element-wise bytes (pre-norm, conv + scan + gated norm, residual, as
    the other blocks count them) and the bytes of Mamba's two context-parallel all-to-alls per
    direction (``(cp - 1) / cp`` of ``zxBCdt`` and ``y`` leave the rank). Zeros without Mamba."""
    n = len(b)
    if model.mamba is None:
        return {key: np.zeros(n) for key in ("mamba_scan_flops", "ew_mamba", "cp_mamba_bytes")
                } | {"mamba_chunk": np.ones(n)}
    h = model.hidden_size
    cp = b.cp.astype(np.float64)
    return {
        "mamba_scan_flops": T * _per_tp(lambda t: mamba_scan_flops_per_token(model, t), b.tp),
        "mamba_chunk": np.full(n, float(model.mamba.chunk_size)),
        "ew_mamba": (Tsp * h * 4 + T * _per_tp(lambda t: mamba_scan_bytes_per_token(model, t),
                                              b.tp) + Tsp * h * 6),
        "cp_mamba_bytes": np.where(b.cp > 1, T * BF16 * (cp - 1) / cp * _per_tp(
            lambda t: mamba_cp_all_to_all_elements(model, t), b.tp), 0.0),
    }


def build_work(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, b: ConfigBatch
) -> dict[str, np.ndarray]:
    """Everything :func:`timing` needs, per configuration (see the module docstring)."""
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
    vloc = _padded_vocab(model.vocab_size, b.tp).astype(f64) / tp
    up = 2.0 if model.gated_mlp else 1.0
    w: dict[str, np.ndarray] = {}

    # --- GEMM shapes (n, slots): M, N, K, count
    M = np.zeros((n, len(SLOTS)))
    N = np.zeros((n, len(SLOTS)))
    K = np.zeros((n, len(SLOTS)))
    C = np.zeros((n, len(SLOTS)))

    def gemm(slot: str, m: Any, nn: Any, kk: Any, count: Any = 1.0) -> None:
        i = S[slot]
        M[:, i], N[:, i], K[:, i], C[:, i] = m, nn, kk, count

    if model.mla is not None:
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            gemm("q_down", T, m.q_lora_rank, h)  # duplicated over tp (Megatron-Core MLA)
            gemm("q_up", T, a_loc * qk, m.q_lora_rank)
        else:
            gemm("qkv", T, a_loc * qk, h)
        gemm("kv_down", T, m.kv_lora_rank + m.qk_rope_head_dim, h)
        gemm("kv_up", T, a_loc * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
        gemm("attn_out", T, h, a_loc * m.v_head_dim)
        kv_width = a_loc * (qk + m.v_head_dim)  # K and V per token the CP ring moves
        rope_width = (a_loc + 1) * m.qk_rope_head_dim
        d_attn = (qk + m.v_head_dim) / 2
        mla_norm_width = m.q_lora_rank + m.kv_lora_rank
    else:
        d = model.head_dim
        gemm("qkv", T, (a_loc + 2 * g_loc) * d, h)
        gemm("attn_out", T, h, a_loc * d)
        kv_width = 2 * g_loc * d
        rope_width = (a_loc + g_loc) * d
        d_attn = float(d)
        mla_norm_width = 0.0
    if model.num_dense_layers_effective:
        f_loc = np.ceil(model.ffn_hidden_size / tp)
        gemm("mlp_fc1", T, up * f_loc, h)
        gemm("mlp_fc2", T, h, f_loc)
    else:
        f_loc = np.zeros(n)
    E, k = model.num_experts, model.moe_top_k
    # the width routed tokens travel and experts work in: h, or a latent MoE's latent size
    width = model.moe_latent_size or h
    if model.is_moe:
        fe_loc = np.ceil(model.expert_ffn_hidden_size / etp)
        rows = Tsp * k * etp  # token copies this rank's experts process
        local_experts = np.ceil(E / ep)
        m_e = rows / local_experts
        gemm("exp_fc1", m_e, up * fe_loc, width, local_experts)
        gemm("exp_fc2", m_e, width, fe_loc, local_experts)
        if model.moe_latent_size:  # duplicated (replicated) over tp, on the local tokens
            gemm("lat_down", Tsp, width, h)
            gemm("lat_up", Tsp, h, width)
        fs = model.num_shared_experts * model.shared_expert_ffn_hidden_size
        fs_loc = np.ceil(fs / tp) if fs else np.zeros(n)
        if fs:
            gemm("sh_fc1", T, up * fs_loc, h)
            gemm("sh_fc2", T, h, fs_loc)
        gemm("router", Tsp, E, h)
    else:
        fe_loc = rows = fs_loc = np.zeros(n)
        fs = 0
    gemm("logits", T, vloc, h)
    if model.num_mtp_layers:
        gemm("mtp_proj", T, h / tp, 2 * h)
    if model.mamba is not None:
        for slot, (n_mamba, k_mamba) in mamba_gemms(model, tp).items():
            gemm(slot, T, n_mamba, k_mamba)
    w["gemm_M"], w["gemm_N"], w["gemm_K"], w["gemm_count"] = M, N, K, C

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
    w["prec"] = prec
    # blockwise, MXFP8 and torchao row-wise scaling: finer than per-tensor scales
    w["block_scaled"] = ((b.fp8 == 2) | (b.fp8 == 3) | rowwise).astype(f64)
    w["peak_bf16"] = np.full(n, gpu.peak_bf16_flops)
    w["peak_low"] = np.choose(prec, [gpu.peak_bf16_flops, gpu.peak_fp8_flops or 1.0,
                                     gpu.peak_fp4_flops or 1.0]).astype(f64)
    w["operand_bytes"] = np.choose(prec, [OPERAND_BYTES[0], OPERAND_BYTES[1], OPERAND_BYTES[2]])
    # quantisation bytes per micro-batch: inputs (M K) forward, output grads (M N) backward,
    # weights (K N): once per step where the quantised copy is cached across micro-batches,
    # forward and backward of every micro-batch under FSDP (weight_casts_per_microbatch)
    low = LOW_PREC_SLOTS[None, :] & (prec[:, None] > 0)
    wc_f, wc_b = weight_casts_per_microbatch(b.fsdp, b.ga)
    w["cast_fwd_bytes"] = np.where(low, (M * K * C + wc_f[:, None] * K * N * C)
                                   * cast[:, None], 0.0)
    w["cast_bwd_bytes"] = np.where(low, (M * N * C + wc_b[:, None] * K * N * C)
                                   * cast[:, None], 0.0)
    w["hbm_bw"] = np.full(n, gpu.hbm_bytes_per_s)

    # --- core attention (per layer, averaged over sliding and full layers)
    n_slide = sum(F.layer_is_sliding(model, i) for i in range(model.num_layers))
    frac_slide = n_slide / model.num_layers
    per_tok_full = F.core_attention_flops(model, training.seq_len, False)
    per_tok_slide = F.core_attention_flops(model, training.seq_len, True)
    w["attn_flops_full"] = (1 - frac_slide) * mbs * s * per_tok_full / (tp * cp)
    w["attn_flops_slide"] = frac_slide * mbs * s * per_tok_slide / (tp * cp)
    # under context parallelism every attention kernel sees one ring step's key block
    # (cp_attention_block): its efficiency follows that length, not the whole context
    kv_block = cp_attention_block(training.seq_len, cp)
    w["attn_ctx_full"] = np.minimum(F.attention_context(model, training.seq_len, False), kv_block)
    w["attn_ctx_slide"] = np.minimum(F.attention_context(model, training.seq_len, True), kv_block)
    w["attn_head_dim"] = np.full(n, d_attn)
    # one exponential per score (query, key, head): FLOPs / (2 (d_qk + d_v))
    w["attn_exp_per_flop"] = np.full(n, 1.0 / (2.0 * 2.0 * d_attn))
    w["sfu_exp_per_s"] = np.full(n, gpu.sfu_exp_per_s or 0.0)
    # sustained tensor rate relative to the architecture's reference part (power-limited clock)
    pw = power_ratios(gpu)
    w["pw_peak"], w["pw_units"], w["pw_tdp"] = (np.full(n, x) for x in pw)

    # --- element-wise bytes per micro-batch (forward; backward moves twice as much)
    qk_norm = T * rope_width * 4 if model.qk_norm else 0.0
    w["ew_attn_norm"] = Tsp * h * 4 + T * mla_norm_width * 4
    v_width = a_loc * (model.mla.v_head_dim if model.mla is not None else model.head_dim)
    w["ew_cp_correction"] = cp_correction_bytes(T, v_width, cp)
    w["ew_attn"] = (w["ew_attn_norm"] + T * rope_width * 4 + Tsp * h * 6 + qk_norm
                    + w["ew_cp_correction"])
    act_bytes = (up + 1) * BF16
    w["ew_mlp_norm"] = Tsp * h * 4
    w["ew_mlp_act"] = T * f_loc * act_bytes
    w["ew_mlp"] = w["ew_mlp_norm"] + w["ew_mlp_act"] + Tsp * h * 6
    if model.is_moe:
        w["ew_moe_norm"] = Tsp * h * 4
        w["ew_moe_act"] = rows * fe_loc * act_bytes + T * fs_loc * act_bytes
        w["ew_moe"] = (
            w["ew_moe_norm"] + w["ew_moe_act"] + Tsp * h * 6
            + Tsp * E * 12  # fp32 router logits: write, softmax read/write
            + 2 * Tsp * width * BF16 * (1 + k)  # permute and unpermute
        )
    else:
        w["ew_moe_norm"] = w["ew_moe_act"] = w["ew_moe"] = np.zeros(n)
    w.update(mamba_work(model, b, T, Tsp))
    w["ew_out_fwd"] = Tsp * h * 4 + T * vloc * 10.0  # final norm; CE: read bf16, fp32 passes
    w["ew_out_bwd"] = Tsp * h * 8 + T * vloc * 6.0
    w["ew_emb_fwd"] = T * h * BF16
    w["ew_emb_bwd"] = T * h * (BF16 + FP32)

    # --- tensor parallel (S = T h bf16; counts in all-gather/reduce-scatter equivalents)
    has_tp = (b.tp > 1).astype(f64)
    sp = b.sp.astype(f64)
    w["tp_bytes"] = T * h * BF16
    w["tp_n"] = tp
    w["tp_has"] = has_tp
    w["tp_intra"] = _link(cluster, b.tp)
    w["tp_local"] = _local(cluster, np.ones(n, dtype=np.int64), b.tp)
    # with sequence parallelism an FP8 recipe quantises the layer input before gathering it
    # (Transformer Engine: current scaling reduces the amax over the TP group first, MXFP8 /
    # blockwise gather the scaled data; torchtitan's float8 tensor-parallel styles): the forward
    # all-gather and the backward re-gather move 1 byte per element instead of 2; reduce-scatters
    # and the gradient all-gather stay bf16. torchao row-wise scaling and NVFP4 gather bf16.
    ag = np.where((prec == 1) & ~rowwise, TP_FP8_ALLGATHER_FRACTION, 1.0)
    w["tp_fwd_per_block"] = has_tp * (sp * (ag + 1.0) + (1 - sp) * 2.0)  # AG + RS, or one AR (= 2)
    w["tp_bwd_per_block"] = has_tp * (sp * (2.0 + ag) + (1 - sp) * 2.0)  # + input re-gather (SP)
    w["tp_shared_blocks"] = np.full(n, 1.0 if fs else 0.0)
    w["tp_overlap"] = np.ones(n) if b.tp_overlap is None else b.tp_overlap.astype(f64)

    # --- context parallel ring (p2p, K and V of the local chunk per step)
    w["cp_bytes"] = T * kv_width * BF16
    w["cp_steps"] = cp - 1
    w["cp_intra"] = _link(cluster, b.tp * b.cp)

    # --- expert parallel
    if model.is_moe:
        span = b.etp * b.ep
        per_node = np.maximum(1, np.minimum(b.ep, cluster.scale_up_gpus // np.maximum(1, b.etp)))
        ep_local = np.where(span <= cluster.scale_up_gpus, b.ep, per_node).astype(f64)
        disp = Tsp * k * width * BF16  # bytes one rank dispatches (bf16 token copies)
        a2a_intra = disp * (ep_local - 1) / ep
        a2a_inter = disp * (ep - ep_local) / ep
        nodes = ep / ep_local
        flex_inter = Tsp * width * BF16 * (nodes - 1) * (1 - (1 - 1 / nodes) ** k)
        ag_n = tp * ep
        ag_span = b.tp * b.ep
        ag_bytes = Tsp * width * BF16 * ag_n  # gathered tensor over tp x ep
        is_ag = b.dispatcher == 1
        is_flex = b.dispatcher == 2
        w["ep_intra_bytes"] = np.where(is_ag, 0.0, a2a_intra)
        w["ep_inter_bytes"] = np.where(is_ag, 0.0, np.where(is_flex, flex_inter, a2a_inter))
        w["ep_n"] = np.where(is_ag, ag_n, ep)
        w["ep_ag_bytes"] = np.where(is_ag & (ag_n > 1), ag_bytes, 0.0)
        w["ep_ag_intra"] = _link(cluster, ag_span)
        w["ep_ag_local"] = _local(cluster, np.ones(n, dtype=np.int64), b.tp * b.ep)
        w["ep_active"] = ((b.ep > 1) & ~is_ag).astype(f64)
        w["etp_bytes"] = np.where(b.etp > 1, rows * width * BF16, 0.0)
        w["etp_n"] = etp
        w["etp_intra"] = _link(cluster, b.etp)
        w["etp_local"] = _local(cluster, np.ones(n, dtype=np.int64), b.etp)
    else:
        for key in ("ep_intra_bytes", "ep_inter_bytes", "ep_ag_bytes", "ep_active",
                    "etp_bytes"):
            w[key] = np.zeros(n)
        w["ep_n"] = w["etp_n"] = np.ones(n)
        w["ep_ag_intra"] = w["etp_intra"] = np.ones(n)
        w["ep_ag_local"] = w["etp_local"] = np.ones(n)

    # --- pipeline p2p
    w["pp_bytes"] = np.where(b.pp > 1, Tsp * h * BF16, 0.0)
    w["pp_sends"] = np.where(b.pp > 1, 2.0 * b.vpp, 0.0)  # forward + backward per chunk
    w["pp_intra"] = _link(cluster, b.tp * b.cp * b.dp * b.pp)

    # --- links and GPU
    w["scale_up_bw"] = np.full(n, gpu.scale_up_bytes_per_s)
    w["nic_bw"] = np.full(n, gpu.nic_bytes_per_s)

    # --- per-stage layer counts and parameters
    Pmax = int(b.pp.max())
    uniq, inv = _unique_rows(b.pp, b.vpp, b.split, b.recompute, b.recompute_method,
                             b.recompute_layers)
    tables = np.zeros((len(uniq), Pmax, 11), dtype=np.int64)
    valid_u = np.zeros((len(uniq), Pmax), dtype=bool)
    for j, (pp_, vpp_, split_, rc_, meth_, k_) in enumerate(uniq):
        t = _stage_layers(kind_index(model), model.num_mtp_layers, int(pp_), int(vpp_),
                          int(split_), int(rc_), int(meth_), int(k_))
        tables[j, : int(pp_)] = t
        valid_u[j, : int(pp_)] = True
    st = tables[inv].astype(f64)  # (n, Pmax, 11)
    valid = valid_u[inv]
    mtp_moe = model.is_moe  # MTP layers copy the last layer's kind (MoE for MoE models)
    w["st_dense"] = st[:, :, 0] + (0 if mtp_moe else st[:, :, 2])
    w["st_moe"] = st[:, :, 1] + (st[:, :, 2] if mtp_moe else 0)
    # hybrid models: attention-only layers (an MTP depth runs one too: inventory.mtp_extra_blocks)
    # and Mamba layers; 0 for a transformer, whose attention sits in its dense/MoE layers
    w["st_attn_only"] = st[:, :, 7] + (st[:, :, 2] if model.is_hybrid else 0)
    w["st_mamba"] = st[:, :, 8]
    w["st_rc_attn_only"] = st[:, :, 9]
    w["st_rc_mamba"] = st[:, :, 10]
    w["is_hybrid"] = np.full(n, 1.0 if model.is_hybrid else 0.0)
    w["st_mtp"] = st[:, :, 2]
    w["st_emb"] = st[:, :, 3]
    w["st_out"] = st[:, :, 4] + st[:, :, 2]  # each MTP module has its own logits and loss
    w["st_rc_dense"] = st[:, :, 5]
    w["st_rc_moe"] = st[:, :, 6]
    w["st_valid"] = valid.astype(f64)

    uq, inv2 = _unique_rows(b.tp, b.pp, b.ep, b.etp)
    units = np.array([_param_units_tuple(model, *map(int, row)) for row in uq], dtype=f64)
    pu = units[inv2]  # (n, len(PARAM_UNIT_FIELDS))
    # the memory model's own per-stage count (oracle.memory.stage_params), on arrays
    counts = SimpleNamespace(dense_layers=st[:, :, 0], moe_layers=st[:, :, 1],
                             mtp_layers=st[:, :, 2], has_embedding=st[:, :, 3],
                             has_output=st[:, :, 4], attention_layers=st[:, :, 7],
                             mamba_layers=st[:, :, 8])
    units_ns = SimpleNamespace(**{f: pu[:, None, i] for i, f in enumerate(PARAM_UNIT_FIELDS)})
    w["st_params_dense"], w["st_params_expert"] = stage_params(counts, units_ns, model.is_moe)

    # --- data parallel
    dense_group = b.dp * b.cp
    expert_group = np.maximum(1, cluster.world_size // (b.pp * b.ep * b.etp))
    w["dp_dense_n"] = dense_group.astype(f64)
    w["dp_dense_intra"] = _link(cluster, b.tp * dense_group)
    w["dp_dense_local"] = _local(cluster, b.tp, dense_group)
    w["dp_expert_n"] = expert_group.astype(f64)
    w["dp_expert_intra"] = _link(cluster, b.ep * b.etp * expert_group)
    w["dp_expert_local"] = _local(cluster, b.ep * b.etp, expert_group)
    w["dist_opt"] = b.distributed_optimizer.astype(f64)
    w["fsdp"] = b.fsdp.astype(f64)
    w["grad_bytes"] = (np.full(n, FP32) if b.grad_fp32 is None
                       else np.where(b.grad_fp32, FP32, BF16))
    w["dp_bucket_params"] = ddp_bucket_params(dense_group).astype(f64)

    # --- schedule and recompute
    w["m"] = b.ga.astype(f64)
    w["vpp"] = b.vpp.astype(f64)
    w["bubble_factor"] = np.where(b.schedule == 2, ZERO_BUBBLE_FACTOR, 1.0)
    sel = b.recompute == 1
    for mod, bit in MODULE_BITS.items():
        w[f"rc_{mod}"] = (sel & ((b.recompute_modules & bit) > 0)).astype(f64)
    w["has_moe"] = np.full(n, 1.0 if model.is_moe else 0.0)
    # the host synchronises with the GPU once per MoE layer unless routing is token-drop with a
    # dispatcher of fixed shapes: the flex dispatcher (DeepEP / HybridEP) returns its receive
    # counts to the host even when the experts are padded to capacity (moe_host_sync)
    dropless = np.ones(n, dtype=bool) if b.dropless is None else b.dropless
    w["moe_sync"] = moe_host_sync(dropless, b.dispatcher).astype(f64)
    w["pp_on"] = (b.pp > 1).astype(f64)
    w["local_experts"] = np.ceil(E / ep) if model.is_moe else np.zeros(n)
    return w


#: The :class:`oracle.memory.ParamUnits` fields :func:`oracle.memory.stage_params` reads.
PARAM_UNIT_FIELDS = ("attention", "dense_mlp", "moe_nonexpert", "experts", "embedding", "output",
                     "mtp_extra", "layer_attention", "mamba")


@lru_cache(maxsize=4096)
def _param_units_cached(model: ModelSpec, tp: int, pp: int, ep: int, etp: int) -> tuple:
    pu = param_units(model, tp, pp, ep, etp)
    return tuple(getattr(pu, f) for f in PARAM_UNIT_FIELDS)


def _param_units_tuple(model: ModelSpec, tp: int, pp: int, ep: int, etp: int) -> tuple:
    return _param_units_cached(model, tp, pp, ep, etp)


def concat_work(works: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Stack the work of several (model, cluster, training) batches into one (stage axis padded
    with empty stages), so :func:`timing` evaluates them all at once."""
    pmax = max(w["st_valid"].shape[1] for w in works)
    out: dict[str, np.ndarray] = {}
    for key in works[0]:
        parts = []
        for w in works:
            x = w[key]
            if key.startswith("st_") and x.shape[1] < pmax:
                x = np.pad(x, ((0, 0), (0, pmax - x.shape[1])))
            parts.append(x)
        out[key] = np.concatenate(parts, axis=0)
    return out


# ============================================================================== timing


def _g(x: np.ndarray, half: Any) -> np.ndarray:
    return x / (x + half)


def _collective(bytes_: Any, n: Any, bw: Any, alpha: Any) -> np.ndarray:
    """Ring all-gather / reduce-scatter of a tensor of ``bytes_`` over ``n`` ranks."""
    n = np.asarray(n, dtype=np.float64)
    t = alpha * (1 + np.log2(np.maximum(n, 1))) + (n - 1) / np.maximum(n, 1) * bytes_ / bw
    return np.where(n > 1, t, 0.0)


@lru_cache(maxsize=64)
def power_ratios(gpu: GpuSpec) -> tuple[float, float, float]:
    """``(reference peak / peak, units / reference units, TDP / reference TDP)`` of a GPU against
    its architecture's reference part (:data:`oracle.constants.POWER_REFERENCE_GPU`); all 1 when
    the GPU or the reference lacks ``tdp_w`` or ``compute_units`` (nothing is modelled)."""
    ref_name = POWER_REFERENCE_GPU.get(gpu.architecture or "")
    if ref_name is None or gpu.tdp_w is None or gpu.compute_units is None:
        return (1.0, 1.0, 1.0)
    from oracle.catalog import load_gpu

    ref = load_gpu(ref_name)
    if ref.tdp_w is None or ref.compute_units is None:
        return (1.0, 1.0, 1.0)
    return (ref.peak_bf16_flops / gpu.peak_bf16_flops, gpu.compute_units / ref.compute_units,
            gpu.tdp_w / ref.tdp_w)


def sustained_rate(peak_ratio: Any, units_ratio: Any, tdp_ratio: Any, gamma: Any) -> np.ndarray:
    """Sustained dense tensor rate of a GPU over its catalog peak, within its architecture.

    Training GEMMs and attention run at a power-limited clock: with per-unit dynamic power
    growing as ``f^(1/gamma)``, a part with U compute units and board power P sustains
    ``rate ~ U^(1 - gamma) P^gamma``. Relative to the architecture's reference part (whose catalog
    peak the efficiency constants refer to) the rate is ``ref_peak x (U / U_ref)^(1 - gamma) x
    (P / P_ref)^gamma``; divided by the part's own catalog peak this is the factor returned (1
    for the reference part). Worked example, gamma = 0.5: GB300 (160 SMs, 1400 W, 2.5 PFLOP/s
    BF16) against B200 (148 SMs, 1000 W, 2.25): 0.9 x 1.0398 x 1.1832 = 1.107."""
    g = np.asarray(gamma, dtype=np.float64)
    return (np.asarray(peak_ratio, dtype=np.float64) * np.asarray(units_ratio) ** (1.0 - g)
            * np.asarray(tdp_ratio) ** g)


def layer_host_time(moe: bool, local_experts: Any, kernel_overhead_s: Any,
                    cp_steps: Any = 0.0) -> np.ndarray:
    """Host time to issue one layer's forward and backward (backward: twice the forward's
    operations): ``3 x (attention + mlp [+ moe + moe_per_local_expert x local experts] +
    CP_OPS_PER_RING_STEP x cp_steps) x kernel_overhead_s`` with the counts of
    :data:`KERNELS_PER_LAYER` (``cp_steps``: the ``cp - 1`` ring steps of context
    parallelism)."""
    ops = (KERNELS_PER_LAYER["attention"] + KERNELS_PER_LAYER["mlp"]
           + CP_OPS_PER_RING_STEP * np.asarray(cp_steps, dtype=np.float64))
    if moe:
        ops = ops + KERNELS_PER_LAYER["moe"] + KERNELS_PER_LAYER["moe_per_local_expert"] * \
            np.asarray(local_experts, dtype=np.float64)
    return 3.0 * ops * np.asarray(kernel_overhead_s, dtype=np.float64)


def host_exposed(host: Any, gpu: Any, p: Any) -> np.ndarray:
    """Host time a layer exposes beyond its GPU time: ``(host^p + gpu^p)^(1/p) - gpu``, the
    smooth maximum of the two with exponent ``p`` (``host_gpu_overlap_exponent``) minus the GPU
    time. Worked example (p = 2): host 3 ms, GPU 4 ms -> (9 + 16)^(1/2) - 4 = 1 ms."""
    h, g = np.asarray(host, dtype=np.float64), np.asarray(gpu, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    return (h**p + g**p) ** (1.0 / p) - g


def mamba_scan_time(flops: Any, chunk: Any, peak: Any, efficiency: Any, half_dim: Any
                    ) -> np.ndarray:
    """Forward time of the chunked SSD scan (``oracle/inventory.py::mamba_scan_flops_per_token``
    FLOPs): matmuls of chunk-length dimension on the BF16 tensor cores at the fitted
    flash-attention kernel efficiency (``attention_efficiency``: the scan is a fused chunked-matmul
    kernel like flash attention; no Mamba row was fitted), scaled by the GEMM-size saturation of
    the chunk length (``_g(chunk, gemm_half_dim)``). Backward: twice the forward (timing)."""
    return np.where(flops > 0, flops / (peak * efficiency * _g(chunk, half_dim)), 0.0)


def pipeline_p2p(
    t_send: Any, sends: Any, vpp: Any, fwd: Any, bwd: Any, overlap: Any
) -> np.ndarray:
    """Exposed pipeline send/receive time of one micro-batch on one stage.

    ``t_send``: one activation transfer; ``sends``: transfers per micro-batch and stage (2 vpp,
    0 without pipeline parallelism); ``fwd``/``bwd``: the stage's forward / backward time of the
    micro-batch. Interleaved schedule (vpp > 1): each of the vpp transfers per direction hides
    behind ``overlap`` x one chunk's compute (``fwd / vpp`` or ``bwd / vpp``); 1F1B: every
    transfer is on the critical path."""
    t, v = np.asarray(t_send, dtype=np.float64), np.asarray(vpp, dtype=np.float64)
    inter = v * (np.maximum(0.0, t - overlap * fwd / v) + np.maximum(0.0, t - overlap * bwd / v))
    return np.where(np.asarray(sends) > 0, np.where(v > 1, inter, np.asarray(sends) * t), 0.0)


def ddp_bucket_params(dp_cp: Any) -> np.ndarray:
    """Parameters per gradient bucket of Megatron-Core's DDP at the default bucket size:
    ``max(DDP_BUCKET_MIN_PARAMS, DDP_BUCKET_PARAMS_PER_DP_RANK x dp_cp)``. Worked example: dp_cp
    64 -> 64e6 parameters, dp_cp 8 -> 40e6."""
    return np.maximum(DDP_BUCKET_MIN_PARAMS,
                      DDP_BUCKET_PARAMS_PER_DP_RANK * np.asarray(dp_cp, dtype=np.float64))


def cp_attention_block(seq_len: int, cp: Any) -> np.ndarray:
    """Key length one flash-attention call of a context-parallel ring step sees: each rank holds
    two chunks of ``s / (2 cp)`` tokens (the load-balancing split of Megatron-Core / TE: chunk
    i and 2 cp - 1 - i), and every step after the diagonal one runs the two halves of the step's
    block separately, each over ``s / (2 cp)`` keys or queries. ``inf`` without CP (the whole
    context). Worked example: s 8192, cp 4 -> 1024."""
    c = np.asarray(cp, dtype=np.float64)
    return np.where(c > 1, seq_len / (2.0 * c), np.inf)


def cp_correction_bytes(tokens: Any, v_width: Any, cp: Any) -> np.ndarray:
    """Forward bytes of ring attention's per-step output correction on one rank: ``(cp - 1) x
    tokens x v_width x CP_CORRECTION_BYTES_PER_ELEMENT`` (``v_width``: local heads x value head
    dim). Worked example: 2048 tokens, 8 x 128 values, cp 4: 3 x 2048 x 1024 x 10 = 62.9 MB."""
    c = np.asarray(cp, dtype=np.float64)
    return (c - 1) * np.asarray(tokens) * np.asarray(v_width) * CP_CORRECTION_BYTES_PER_ELEMENT


def cp_ring_exposed(steps: Any, step_time: Any, attention: Any, alpha: Any) -> np.ndarray:
    """Exposed ring exchange of one layer and direction: ``steps x [alpha + max(0, t_step -
    attention / (steps + 1))]``: each of the ``cp - 1`` transfers hides behind one block of the
    attention (``t_step`` includes its latency), and the receiving step then synchronises
    with it (one more ``alpha``: the stream waits on the recv before the next block's kernel),
    which no overlap hides. Worked example: 3 steps of 1 ms, attention 2 ms, alpha 10 us:
    3 x (0.01 + 0.5) = 1.53 ms."""
    n = np.asarray(steps, dtype=np.float64)
    return np.where(n > 0, n * (alpha + np.maximum(0.0, step_time - attention / (n + 1))), 0.0)


def chunk_boundary_host(
    vpp: Any, chunk_host_s: Any, host_layer: Any, gpu_layer: Any, p: Any, dropless: Any,
    serial: Any = 1.0,
) -> np.ndarray:
    """Host time a dropless MoE pipeline stage exposes at its chunk boundaries, per micro-batch.

    A pipeline stage runs ``vpp`` model chunks per micro-batch in each direction (1 for 1F1B).
    At every chunk boundary the schedule's host work (model-chunk switch, posting the isend /
    irecv of the exchange, deallocating the sent output, the DDP hooks: ``chunk_host_s`` per
    boundary and direction, ``pipeline_chunk_host_s``) runs while the GPU has nothing queued:
    a dropless MoE layer synchronises host and device every layer (token counts), so the host
    has no run-ahead to hide it. The first layer of each chunk then starts with an empty queue:
    for the fraction ``serial`` (``chunk_start_serial_fraction``) of it host and GPU times add
    instead of taking the smooth maximum of :func:`host_exposed`: ``vpp x [2 chunk_host_s +
    serial x (host + gpu - (host^p + gpu^p)^(1/p))]``. Dense or token-drop layers let the host
    run ahead, so none of it is exposed (0). Worked example, vpp 24, 0.2 ms, host 8 ms, GPU
    16 ms, p 2, serial 1: 24 x (0.4 + 24 - 17.89) = 156.3 ms."""
    v = np.asarray(vpp, dtype=np.float64)
    lost = np.asarray(serial) * (
        np.asarray(host_layer) - host_exposed(host_layer, gpu_layer, p))  # host + gpu - smax
    return np.asarray(dropless) * v * (2.0 * np.asarray(chunk_host_s) + lost)


def moe_host_sync(dropless: Any, dispatcher: Any) -> np.ndarray:
    """Whether a MoE layer makes the host wait for the GPU once per layer (1) or lets it run
    ahead as a dense layer does (0). Dropless routing copies the token counts per expert to the
    host (Megatron-Core's token dispatchers: ``cuda_sync_point``); token-drop with padding to
    capacity (``moe_pad_expert_input_to_capacity``) has fixed shapes and no synchronisation with
    the ``alltoall`` / ``allgather`` dispatchers, but the ``flex`` dispatcher (DeepEP, HybridEP)
    returns its received-token counts to the host in any case (DeepEP ``dispatch`` returns
    ``num_recv_tokens_per_expert_list``, a host list). ``dispatcher``: the :data:`DISPATCH_CODE`
    codes."""
    return np.asarray(dropless, dtype=bool) | (np.asarray(dispatcher) == DISPATCH_CODE[
        Dispatcher.FLEX])


def dp_exposed(total: Any, last_bucket: Any, window: Any, overlap: Any) -> np.ndarray:
    """Exposed time of an overlapped data-parallel collective: ``max(last_bucket, total -
    overlap x window)``. The collective is issued bucket by bucket while the backward (reduce-
    scatter) or forward (parameter all-gather) runs, but the bucket that fills last (the first
    layers' gradients, after the last backward) and the first bucket of the next step's forward
    (its parameters are needed before any layer runs) cannot overlap anything. Worked example:
    total 1 s, last bucket 0.1 s, window 2 s, overlap 0.8: max(0.1, -0.6) = 0.1 s."""
    return np.maximum(np.asarray(last_bucket), np.asarray(total) - np.asarray(overlap) * window)


def pipeline_time(
    stage_times: np.ndarray, m: Any, vpp: Any = 1, bubble_factor: Any = 1.0
) -> np.ndarray:
    """Time of the pipelined forward/backward passes of one step.

    ``stage_times[..., s]``: one micro-batch's forward + backward on stage s (0 for padding);
    ``m`` micro-batches; ``vpp`` virtual stages per rank. ``m x max_s t_s + bubble_factor x
    (sum_s t_s - max_s t_s) / vpp``: with p equal stages of time t this is ``(m + (p - 1)/vpp)
    t``, i.e. the bubble fraction ``(p - 1)/(vpp m)`` of Narayanan et al. 2021 (interleaved) and
    ``(p - 1)/m`` for 1F1B; with unequal stages the slowest sets the steady-state pace and each
    other stage adds its own fill/drain time. ``bubble_factor``: 1 for 1F1B/interleaved,
    :data:`ZERO_BUBBLE_FACTOR` for zero-bubble schedules.
    """
    t = np.asarray(stage_times, dtype=np.float64)
    t_max = t.max(axis=-1)
    return np.asarray(m) * t_max + np.asarray(bubble_factor) * (t.sum(axis=-1) - t_max) / vpp


def constants_arrays(
    calib: CalibrationTable,
    archs: Sequence[str] | str,
    n: int,
    software: Sequence[str] | str = REFERENCE_SOFTWARE,
) -> dict[str, np.ndarray]:
    """Constants as arrays of length ``n`` (one architecture and software stack, or one per
    entry)."""
    if isinstance(archs, str) and isinstance(software, str):
        c = calib.constants(archs, software)
        return {k: np.full(n, c[k]) for k in CONSTANT_NAMES}
    archs_l = [archs] * n if isinstance(archs, str) else list(archs)
    soft_l = [software] * n if isinstance(software, str) else list(software)
    table = {key: calib.constants(*key) for key in set(zip(archs_l, soft_l, strict=True))}
    return {k: np.array([table[key][k] for key in zip(archs_l, soft_l, strict=True)])
            for k in CONSTANT_NAMES}


def timing(w: dict[str, np.ndarray], c: dict[str, Any]) -> dict[str, np.ndarray]:
    """Step time and breakdown for every configuration of a work batch (see module docstring).

    Returns ``step_time_s`` and one array per :data:`BREAKDOWN` entry (seconds per step, they
    add up to the step time), plus ``critical_stage``.
    """
    eff_prec = np.choose(
        w["prec"], [c["gemm_efficiency_bf16"], c["gemm_efficiency_fp8"],
                    c["gemm_efficiency_fp4"]]
    ) * (1 - w["block_scaled"] * (1 - np.asarray(c["block_scaled_gemm_efficiency"])))
    hbm = w["hbm_bw"] * c["hbm_efficiency"]
    up_bw = w["scale_up_bw"] * c["scale_up_efficiency"]
    nic_bw = w["nic_bw"] * c["nic_efficiency"]
    alpha = c["collective_latency_s"]
    kern = c["kernel_overhead_s"]
    peak_bf16 = w["peak_bf16"]
    rate = sustained_rate(w["pw_peak"], w["pw_units"], w["pw_tdp"], c["power_clock_exponent"])

    def link(intra: np.ndarray) -> np.ndarray:
        """Point-to-point / all-to-all bandwidth per GPU."""
        return np.where(intra > 0, up_bw, nic_bw)

    def ring(intra: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Bus bandwidth of a ring collective (see :func:`_local`)."""
        return np.where(intra > 0, up_bw, np.minimum(up_bw, local * nic_bw))

    # ---- GEMMs, forward time per slot
    M, N, K, cnt = w["gemm_M"], w["gemm_N"], w["gemm_K"], w["gemm_count"]
    present = cnt > 0
    Ms, Ns, Ks = (np.where(present, x, 1.0) for x in (M, N, K))
    low = LOW_PREC_SLOTS[None, :] & (w["prec"][:, None] > 0)
    eff = np.where(low, eff_prec[:, None], np.asarray(c["gemm_efficiency_bf16"])[..., None])
    half_s = gemm_half_dims(c["gemm_half_dim"], low, w["peak_low"], peak_bf16)
    eff = eff * _g(Ms, half_s) * _g(Ns, half_s) * _g(Ks, half_s)
    eff = np.where(GROUPED_SLOTS[None, :], eff * np.asarray(c["grouped_gemm_efficiency"])[
        ..., None], eff)
    peak = np.where(low, w["peak_low"][:, None], peak_bf16[:, None]) * rate[:, None]
    t_compute = 2.0 * Ms * Ns * Ks * cnt / (peak * eff)
    opb = np.where(low, w["operand_bytes"][:, None], BF16)
    t_memory = cnt * ((Ms * Ks + Ks * Ns) * opb + Ms * Ns * BF16) / hbm[:, None]
    gf = np.where(present, np.maximum(t_compute, t_memory), 0.0)  # forward; backward = 2x
    cast_f = w["cast_fwd_bytes"] / hbm[:, None]
    cast_b = w["cast_bwd_bytes"] / hbm[:, None]

    def slots(x: np.ndarray, idx: list[int]) -> np.ndarray:
        return x[:, idx].sum(axis=1)

    g_attn, g_mlp = slots(gf, ATTN_SLOTS), slots(gf, MLP_SLOTS)
    g_exp, g_sh = slots(gf, EXP_SLOTS), slots(gf, SH_SLOTS)
    g_router, g_logits, g_mtp = gf[:, S["router"]], gf[:, S["logits"]], gf[:, S["mtp_proj"]]
    g_mla_up = slots(gf, MLA_UP_SLOTS)
    cf_attn, cb_attn = slots(cast_f, ATTN_SLOTS), slots(cast_b, ATTN_SLOTS)
    cf_mlp, cb_mlp = slots(cast_f, MLP_SLOTS), slots(cast_b, MLP_SLOTS)
    cf_moe = slots(cast_f, EXP_SLOTS + SH_SLOTS)
    cb_moe = slots(cast_b, EXP_SLOTS + SH_SLOTS)
    # hybrid models (oracle/inventory.py): Mamba mixers, a latent MoE's projections; a
    # transformer has none of these (zeros), and ``nh`` = 1 keeps attention inside its
    # dense/MoE layers (``hyb`` = 1: each hybrid layer is one block)
    hyb = w["is_hybrid"]
    nh = 1.0 - hyb
    g_mamba, g_lat = slots(gf, MAMBA_SLOTS), slots(gf, LAT_SLOTS)
    cf_mamba, cb_mamba = slots(cast_f, MAMBA_SLOTS), slots(cast_b, MAMBA_SLOTS)
    cf_lat, cb_lat = slots(cast_f, LAT_SLOTS), slots(cast_b, LAT_SLOTS)

    # ---- core attention
    hd = c["attention_head_dim_half"]
    dfac = (w["attn_head_dim"] / (w["attn_head_dim"] + hd)) / (128.0 / (128.0 + hd))
    a_eff = c["attention_efficiency"] * dfac
    hh = np.asarray(c["gemm_half_dim"])
    sfu = np.where(w["sfu_exp_per_s"] > 0, w["sfu_exp_per_s"] * rate, np.inf)
    core_f = np.zeros_like(w["peak_bf16"])
    core_b = np.zeros_like(w["peak_bf16"])
    for part in ("full", "slide"):
        eff_ctx = _g(w[f"attn_ctx_{part}"], hh)
        t_mm = w[f"attn_flops_{part}"] / (peak_bf16 * rate * a_eff * eff_ctx)
        # softmax exponentials on the special-function units overlap the matmuls (FA3/FA4)
        t_exp = w[f"attn_flops_{part}"] * w["attn_exp_per_flop"] / (
            sfu * c["attention_efficiency"] * eff_ctx)
        core_f = core_f + np.maximum(t_mm, t_exp)
        core_b = core_b + np.maximum(ATTENTION_BWD_FLOPS_RATIO * t_mm, t_exp)

    # ---- Mamba-2 SSD scan (mamba_scan_time)
    scan_f = mamba_scan_time(w["mamba_scan_flops"], w["mamba_chunk"], peak_bf16 * rate,
                             c["attention_efficiency"], hh)

    # ---- element-wise
    ew_attn, ew_mlp, ew_moe = w["ew_attn"] / hbm, w["ew_mlp"] / hbm, w["ew_moe"] / hbm
    ew_mamba = w["ew_mamba"] / hbm
    ew_out_f, ew_out_b = w["ew_out_fwd"] / hbm, w["ew_out_bwd"] / hbm
    ew_emb_f, ew_emb_b = w["ew_emb_fwd"] / hbm, w["ew_emb_bwd"] / hbm

    # ---- host time per layer (forward + backward launches twice as many kernels)
    host_dense = layer_host_time(False, 0.0, kern, w["cp_steps"])
    host_moe = layer_host_time(True, w["local_experts"], kern, w["cp_steps"])
    # a hybrid layer is one block: its dense / MoE layers issue no attention operations
    host_attn = 3.0 * (KERNELS_PER_LAYER["attention"] + CP_OPS_PER_RING_STEP * w["cp_steps"]) \
        * np.asarray(kern, dtype=np.float64)
    host_dense = host_dense - hyb * host_attn
    host_moe = host_moe - hyb * host_attn
    host_mamba = 3.0 * KERNELS_PER_LAYER["mamba"] * np.asarray(kern, dtype=np.float64)

    # ---- TP
    t_tp = _collective(w["tp_bytes"], w["tp_n"], ring(w["tp_intra"], w["tp_local"]), alpha)
    ov_tp = c["tp_comm_overlap"] * w["tp_overlap"]
    tp_attn_f = np.maximum(0.0, w["tp_fwd_per_block"] * t_tp - ov_tp * g_attn)
    tp_attn_b = np.maximum(0.0, w["tp_bwd_per_block"] * t_tp - ov_tp * 2 * g_attn)
    tp_mlp_f = np.maximum(0.0, w["tp_fwd_per_block"] * t_tp - ov_tp * g_mlp)
    tp_mlp_b = np.maximum(0.0, w["tp_bwd_per_block"] * t_tp - ov_tp * 2 * g_mlp)
    tp_sh_f = np.maximum(0.0, w["tp_shared_blocks"] * w["tp_fwd_per_block"] * t_tp
                         - ov_tp * g_sh)
    tp_sh_b = np.maximum(0.0, w["tp_shared_blocks"] * w["tp_bwd_per_block"] * t_tp
                         - ov_tp * 2 * g_sh)
    # one bf16 collective of T h each way before the logits (SP gather) / after the embedding
    # (the output layer and the embedding stay bf16 under FP8 recipes)
    tp_out_f = w["tp_has"] * t_tp
    tp_out_b = w["tp_has"] * t_tp
    tp_mamba_f = np.maximum(0.0, w["tp_fwd_per_block"] * t_tp - ov_tp * g_mamba)
    tp_mamba_b = np.maximum(0.0, w["tp_bwd_per_block"] * t_tp - ov_tp * 2 * g_mamba)

    # ---- CP
    cp_bw = link(w["cp_intra"])
    cp_step_f = np.where(w["cp_steps"] > 0, alpha + w["cp_bytes"] / cp_bw, 0.0)
    cp_step_b = np.where(w["cp_steps"] > 0, alpha + 2 * w["cp_bytes"] / cp_bw, 0.0)
    cp_f = cp_ring_exposed(w["cp_steps"], cp_step_f, core_f, alpha)
    cp_b = cp_ring_exposed(w["cp_steps"], cp_step_b, core_b, alpha)
    # Mamba's two all-to-alls per direction (before and after the conv + scan), not overlapped
    cp_mamba = np.where(w["cp_steps"] > 0, 2 * alpha + w["cp_mamba_bytes"] / cp_bw, 0.0)

    # ---- EP (per direction: dispatch + combine)
    lat = alpha * (1 + np.log2(np.maximum(w["ep_n"], 1)))
    a2a = w["ep_active"] * (lat + np.maximum(w["ep_intra_bytes"] / up_bw,
                                             w["ep_inter_bytes"] / nic_bw))
    agd = _collective(w["ep_ag_bytes"], w["ep_n"], ring(w["ep_ag_intra"], w["ep_ag_local"]),
                      alpha)
    etp = _collective(w["etp_bytes"], w["etp_n"], ring(w["etp_intra"], w["etp_local"]), alpha)
    ep_dir = (2 * a2a + 2 * agd + 2 * etp) * (1 - c["ep_comm_overlap"])
    ep_f = ep_dir * w["has_moe"]
    ep_b = ep_dir * w["has_moe"]

    # ---- per-layer forward / backward (compute | comm), and selective recompute
    attn_f = g_attn + core_f + ew_attn + cf_attn
    attn_b = 2 * g_attn + core_b + 2 * ew_attn + cb_attn
    mlp_f = g_mlp + ew_mlp + cf_mlp
    mlp_b = 2 * g_mlp + 2 * ew_mlp + cb_mlp
    moe_f = g_exp + g_sh + g_router + ew_moe + cf_moe + g_lat + cf_lat
    moe_b = 2 * (g_exp + g_sh + g_router) + 2 * ew_moe + cb_moe + 2 * g_lat + cb_lat
    comm_attn_f, comm_attn_b = tp_attn_f + cp_f, tp_attn_b + cp_b
    comm_mlp_f, comm_mlp_b = tp_mlp_f, tp_mlp_b
    comm_moe_f, comm_moe_b = tp_sh_f + ep_f, tp_sh_b + ep_b
    dense_fwd = nh * attn_f + mlp_f + nh * comm_attn_f + comm_mlp_f
    moe_fwd = nh * attn_f + moe_f + nh * comm_attn_f + comm_moe_f
    # hybrid layer kinds: attention only, Mamba mixer (backward: twice the forward)
    attn_only_fwd = attn_f + comm_attn_f
    mamba_f = g_mamba + scan_f + ew_mamba + cf_mamba
    mamba_b = 2 * g_mamba + 2 * scan_f + 2 * ew_mamba + cb_mamba
    comm_mamba_f, comm_mamba_b = tp_mamba_f + cp_mamba, tp_mamba_b + cp_mamba
    mamba_fwd = mamba_f + comm_mamba_f
    rc_attn_only = (
        w["rc_core_attn"] * core_f
        + w["rc_layernorm"] * w["ew_attn_norm"] / hbm
        + w["rc_mla_up_proj"] * g_mla_up
    )
    rc_common = nh * (
        w["rc_core_attn"] * core_f
        + w["rc_layernorm"] * (w["ew_attn_norm"] + w["ew_mlp_norm"]) / hbm
        + w["rc_mla_up_proj"] * g_mla_up
    ) + hyb * w["rc_layernorm"] * w["ew_mlp_norm"] / hbm
    rc_dense = rc_common + w["rc_mlp"] * (mlp_f + comm_mlp_f)
    rc_moe = (
        rc_common
        + w["rc_moe"] * (moe_f + comm_moe_f)
        + (1 - w["rc_moe"]) * (
            w["rc_moe_act"] * w["ew_moe_act"] / hbm
            + w["rc_shared_experts"] * (g_sh + tp_sh_f)
        )
    )

    # ---- output, embedding, MTP heads (per micro-batch)
    out_f = g_logits + ew_out_f + tp_out_f
    out_b = 2 * g_logits + ew_out_b + tp_out_b
    emb_f, emb_b = ew_emb_f + tp_out_f, ew_emb_b + tp_out_b
    mtp_fb = 3 * g_mtp

    # ---- pipeline p2p: one activation transfer per chunk boundary and direction
    t_send = np.where(w["pp_bytes"] > 0, alpha + w["pp_bytes"] / link(w["pp_intra"]), 0.0)

    # ---- per-stage buckets for one micro-batch: (n, P)
    nd, nm = w["st_dense"], w["st_moe"]
    rd, rm = w["st_rc_dense"], w["st_rc_moe"]
    ne, no, nmtp = w["st_emb"], w["st_out"], w["st_mtp"]
    valid = w["st_valid"]
    na, nmb = w["st_attn_only"], w["st_mamba"]
    ra, rmb = w["st_rc_attn_only"], w["st_rc_mamba"]

    def col(x: Any) -> np.ndarray:
        return np.asarray(x)[:, None] if np.ndim(x) else np.asarray(x)

    nl = (nd + nm) * col(nh) + na  # attention blocks

    bucket: dict[str, np.ndarray] = {}
    bucket["attention_gemm"] = nl * col(3 * g_attn)
    bucket["core_attention"] = nl * col(core_f + core_b)
    bucket["mlp_gemm"] = nd * col(3 * g_mlp)
    bucket["expert_gemm"] = nm * col(3 * (g_exp + g_sh)) + nm * col(3 * g_lat)
    bucket["router"] = nm * col(3 * g_router)
    bucket["mamba_mixer"] = nmb * col(3 * g_mamba + 3 * scan_f)
    bucket["elementwise"] = (
        nl * col(3 * ew_attn + cf_attn + cb_attn) + nd * col(3 * ew_mlp + cf_mlp + cb_mlp)
        + nm * col(3 * ew_moe + cf_moe + cb_moe)
        + nmb * col(3 * ew_mamba + cf_mamba + cb_mamba) + nm * col(cf_lat + cb_lat)
    )
    bucket["embedding_logits_loss"] = (
        ne * col(emb_f + emb_b) + no * col(out_f + out_b) + nmtp * col(mtp_fb)
    )
    bucket["recompute"] = (
        nd * col(rc_dense) + nm * col(rc_moe) + rd * col(dense_fwd) + rm * col(moe_fwd)
        + na * col(rc_attn_only) + ra * col(attn_only_fwd) + rmb * col(mamba_fwd)
    )
    # the host runs ahead of the GPU: a dense layer exposes only host time beyond its GPU time;
    # a dropless MoE layer synchronises host and device once (token counts), so the host cannot
    # run ahead across it: smooth maximum of its host and GPU time, the excess is exposed
    gpu_dense = nh * attn_f + nh * attn_b + mlp_f + mlp_b + nh * comm_attn_f \
        + nh * comm_attn_b + comm_mlp_f + comm_mlp_b + rc_dense
    gpu_moe = nh * attn_f + nh * attn_b + moe_f + moe_b + nh * comm_attn_f \
        + nh * comm_attn_b + comm_moe_f + comm_moe_b + rc_moe
    gpu_attn_only = attn_f + attn_b + comm_attn_f + comm_attn_b + rc_attn_only
    gpu_mamba = mamba_f + mamba_b + comm_mamba_f + comm_mamba_b
    p_host = c["host_gpu_overlap_exponent"]
    drop = w["moe_sync"]
    moe_host_exp = np.where(drop > 0, host_exposed(host_moe, gpu_moe, p_host),
                            np.maximum(0.0, host_moe - gpu_moe))
    bucket["kernel_overhead"] = (
        nd * col(np.maximum(0.0, host_dense - gpu_dense))
        + nm * col(moe_host_exp * w["has_moe"])
        # pipeline chunk boundaries of a dropless MoE stage (chunk_boundary_host)
        + (nm > 0) * col(w["pp_on"] * w["has_moe"] * chunk_boundary_host(
            w["vpp"], c["pipeline_chunk_host_s"], host_moe, gpu_moe, p_host, drop,
            c["chunk_start_serial_fraction"]))
        + na * col(np.maximum(0.0, host_attn - gpu_attn_only))
        + nmb * col(np.maximum(0.0, host_mamba - gpu_mamba))
    )
    bucket["tp_comm"] = (
        nl * col(tp_attn_f + tp_attn_b) + nd * col(tp_mlp_f + tp_mlp_b)
        + nm * col(tp_sh_f + tp_sh_b) + nmb * col(tp_mamba_f + tp_mamba_b)
    )
    bucket["cp_comm"] = nl * col(cp_f + cp_b) + nmb * col(2 * cp_mamba)
    bucket["ep_comm"] = nm * col(ep_f + ep_b)
    bucket["pp_p2p"] = np.zeros_like(valid)  # below, once the chunk times are known

    # forward / backward split of a stage's micro-batch (DP overlap windows)
    fwd_s = (
        nd * col(dense_fwd) + nm * col(moe_fwd) + ne * col(emb_f) + no * col(out_f)
        + nmtp * col(g_mtp) + na * col(attn_only_fwd) + nmb * col(mamba_fwd)
    )

    # ---- link time of the layer traffic (hidden or not) per micro-batch and stage, forward
    # and backward, on the scale-up links [0] and the NICs [1]: the DP collectives share them
    tp_raw_f = (2.0 + w["tp_shared_blocks"]) * w["tp_fwd_per_block"] * t_tp
    tp_raw_b = (2.0 + w["tp_shared_blocks"]) * w["tp_bwd_per_block"] * t_tp
    cp_raw_f = w["cp_steps"] * cp_step_f
    cp_raw_b = w["cp_steps"] * cp_step_b
    ep_up = w["ep_active"] * 2 * w["ep_intra_bytes"] / up_bw
    ep_nic = w["ep_active"] * 2 * w["ep_inter_bytes"] / nic_bw
    tpi, cpi = w["tp_intra"], w["cp_intra"]
    link_busy = tuple(
        tuple(nl * col(tp_raw * (tpi if k == 0 else 1 - tpi) + cp_raw * (cpi if k == 0 else 1 - cpi))
              + nm * col(ep_up if k == 0 else ep_nic)
              # hybrid MLP-only and Mamba layers: one TP block each, Mamba's CP all-to-alls
              + (nd * col(hyb) + nmb) * col(blk * (tpi if k == 0 else 1 - tpi))
              + nmb * col(cp_mamba * (cpi if k == 0 else 1 - cpi)) for k in (0, 1))
        for tp_raw, cp_raw, blk in ((tp_raw_f, cp_raw_f, w["tp_fwd_per_block"] * t_tp),
                                    (tp_raw_b, cp_raw_b, w["tp_bwd_per_block"] * t_tp))
    )

    # ---- data parallel and FSDP
    pd, pe = w["st_params_dense"], w["st_params_expert"]
    bw_dd = col(ring(w["dp_dense_intra"], w["dp_dense_local"]))
    bw_de = col(ring(w["dp_expert_intra"], w["dp_expert_local"]))
    nd_n, ne_n = col(w["dp_dense_n"]), col(w["dp_expert_n"])
    alpha_c = col(alpha)
    gbytes = col(w["grad_bytes"])  # the gradient buffer's dtype (fp32 or bf16)
    rs = _collective(gbytes * pd, nd_n, bw_dd, alpha_c) + _collective(gbytes * pe, ne_n, bw_de,
                                                                       alpha_c)
    ag = _collective(BF16 * pd, nd_n, bw_dd, alpha_c) + _collective(BF16 * pe, ne_n, bw_de,
                                                                     alpha_c)
    ov_dp = col(c["dp_comm_overlap"])
    stage_mb = sum(bucket.values())
    bwd_s = stage_mb - fwd_s
    # interleaved: every chunk's receive is a synchronisation the overlap cannot hide (the
    # next chunk's kernels wait on it): one latency per chunk and direction
    pp_sync = np.where(w["vpp"] > 1, w["pp_sends"] * alpha, 0.0)
    bucket["pp_p2p"] = valid * (pipeline_p2p(col(t_send), col(w["pp_sends"]), col(w["vpp"]),
                                             fwd_s, bwd_s, col(c["pp_comm_overlap"]))
                                + col(pp_sync))
    stage_mb = stage_mb + bucket["pp_p2p"]
    fsdp = col(w["fsdp"])
    dist = col(w["dist_opt"])
    fsdp_mb = fsdp * (
        np.maximum(0.0, ag - ov_dp * fwd_s) + np.maximum(0.0, ag + rs - ov_dp * bwd_s)
    )
    bucket["dp_comm"] = fsdp_mb * valid
    stage_mb = stage_mb + bucket["dp_comm"]
    # the last gradient bucket and the next step's first parameter bucket are exposed
    # (dp_exposed); chunk 0 is bucketed, later chunks are one bucket each but finish earlier
    bucket_p = col(w["dp_bucket_params"])
    vv = col(w["vpp"])
    bd = np.minimum(bucket_p, pd / vv)
    be = np.minimum(bucket_p, pe / vv)
    rs_last = _collective(gbytes * bd, nd_n, bw_dd, alpha_c) + _collective(gbytes * be, ne_n,
                                                                            bw_de, alpha_c)
    ag_first = _collective(BF16 * bd, nd_n, bw_dd, alpha_c) + _collective(BF16 * be, ne_n,
                                                                           bw_de, alpha_c)
    # the window is shared with the layer traffic on the same links (dp_window)
    busy_f, busy_b = link_busy
    dp_on_nic = col(1.0 - w["dp_dense_intra"])
    win_b = np.maximum(0.0, bwd_s - np.where(dp_on_nic > 0, busy_b[1], busy_b[0]))
    win_f = np.maximum(0.0, fwd_s - np.where(dp_on_nic > 0, busy_f[1], busy_f[0]))
    dp_step = (1 - fsdp) * np.where(
        dist > 0,
        dp_exposed(rs, rs_last, win_b, ov_dp) + dp_exposed(ag, ag_first, win_f, ov_dp),
        dp_exposed(2 * rs, 2 * rs_last, win_b, ov_dp),
    )
    sharded = (dist > 0) | (fsdp > 0)
    local = np.where(sharded, pd / nd_n + pe / ne_n, pd + pe)
    opt = OPTIMIZER_BYTES_PER_PARAM * local / col(hbm)
    tail = (dp_step + opt) * valid

    # ---- pipeline schedule
    m = w["m"]
    stage_mb = stage_mb * valid
    crit = np.argmax(stage_mb, axis=1)
    rows = np.arange(stage_mb.shape[0])
    bubble = pipeline_time(stage_mb, m, w["vpp"], w["bubble_factor"]) - m * stage_mb[rows, crit]
    last = np.argmax(tail, axis=1)
    out: dict[str, np.ndarray] = {}
    for key in BREAKDOWN:
        if key in bucket:
            out[key] = m * bucket[key][rows, crit]
    out["pipeline_bubble"] = bubble
    out["dp_comm"] = out["dp_comm"] + dp_step[rows, last]
    out["optimizer"] = opt[rows, last]
    out["step_overhead"] = np.broadcast_to(np.asarray(c["step_overhead_s"], dtype=np.float64),
                                           m.shape).copy()
    out = {key: out[key] for key in BREAKDOWN}
    total = np.zeros_like(m)
    for key in BREAKDOWN:
        total = total + out[key]
    out["step_time_s"] = total
    out["critical_stage"] = crit
    return out


# ============================================================================ projection


class Projection(BaseModel):
    """Projected performance of one configuration.

    ``breakdown``: seconds per step by component (:data:`BREAKDOWN`), adding up to
    ``step_time_s``; compute components are those of the slowest pipeline stage (x micro-batches),
    ``pipeline_bubble`` the schedule's fill and drain, ``dp_comm`` the exposed data-parallel
    traffic (FSDP per micro-batch, plus the step's gradient/parameter collectives) and
    ``optimizer`` the optimizer step. ``mfu`` is model FLOPs over the peak of the precision the
    GEMMs run in (BF16, FP8 or FP4 dense peak), recompute excluded.
    """

    model_config = ConfigDict(frozen=True)

    step_time_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    model_flops_per_token: float
    breakdown: dict[str, float]
    critical_stage: int
    label: str
    calibration: str
    #: "" when the calibration was fitted on rows of this GPU; else what the projection rests on
    #: (:func:`oracle.constants.evidence_note`)
    evidence: str = ""
    #: "" unless the projected MFU is above the best published MFU of its class (dense or MoE,
    #: architecture, precision): then what makes it higher (:func:`mfu_note`)
    mfu_note: str = ""


def _peak_for(cluster: ClusterSpec, training: TrainingSpec, fp8_active: bool) -> float:
    if training.precision is Precision.FP4 and cluster.gpu.peak_fp4_flops:
        return cluster.gpu.peak_fp4_flops
    if fp8_active and cluster.gpu.peak_fp8_flops:
        return cluster.gpu.peak_fp8_flops
    return cluster.gpu.peak_bf16_flops


def _calib(calib: CalibrationTable | str | None) -> CalibrationTable:
    if isinstance(calib, CalibrationTable):
        return calib
    return load_calibration(calib)


def score_configs(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    batch: ConfigBatch,
    calib: CalibrationTable | str | None = None,
    software: str = REFERENCE_SOFTWARE,
) -> dict[str, np.ndarray]:
    """Vectorised projection of many configurations of one (model, cluster, training).

    Returns arrays: ``step_time_s``, ``tokens_per_s_per_gpu``, ``model_tflops_per_gpu``, ``mfu``
    and the :data:`BREAKDOWN` components. Legality is not checked here (the solver's job).
    ``software``: the stack whose kernel efficiencies apply (``megatron`` by default; see
    :data:`oracle.constants.SOFTWARE_STACKS`)."""
    table = _calib(calib)
    w = build_work(model, cluster, training, batch)
    res = timing(w, constants_arrays(table, cluster.gpu.architecture, len(batch), software))
    # tokens the step actually trains: mbs x dp x ga sequences (= the global batch for a legal
    # configuration; an illegal one that does not divide it is not credited with more)
    tokens = (batch.mbs * batch.dp * batch.ga).astype(np.float64) * training.seq_len
    world = cluster.world_size
    flops_tok = model_flops_per_token_array(model, training.seq_len, batch.tp)
    step = res["step_time_s"]
    res["tokens_per_s_per_gpu"] = tokens / step / world
    res["model_flops_per_token"] = flops_tok
    res["model_tflops_per_gpu"] = flops_tok * tokens / step / world / 1e12
    peak = np.where(
        batch.fp8 >= 0,
        cluster.gpu.peak_fp8_flops or cluster.gpu.peak_bf16_flops,
        cluster.gpu.peak_bf16_flops,
    )
    if training.precision is Precision.FP4 and cluster.gpu.peak_fp4_flops:
        peak = np.full(len(batch), cluster.gpu.peak_fp4_flops)
    res["mfu"] = res["model_tflops_per_gpu"] * 1e12 / peak
    return res


@lru_cache(maxsize=1024)
def _flops_base(model: ModelSpec, seq_len: int) -> float:
    return F.model_flops_per_token(model, seq_len, 1)


def model_flops_per_token_array(model: ModelSpec, seq_len: int, tp: np.ndarray) -> np.ndarray:
    """:func:`oracle.flops.model_flops_per_token` for an array of tp (only Megatron's vocabulary
    padding, a multiple of 128 x tp, depends on tp): the tp = 1 value plus the logits FLOPs of
    the extra padded vocabulary."""
    vpad1 = P.padded_vocab_size(model.vocab_size, 1)
    per_vocab = F.FWD_BWD_FACTOR * F.FMA * model.hidden_size * (1 + model.num_mtp_layers)
    extra = (_padded_vocab(model.vocab_size, np.asarray(tp)) - vpad1).astype(np.float64)
    return _flops_base(model, seq_len) + per_vocab * extra


def project(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    cfg: ParallelConfig,
    calib: CalibrationTable | str | None = None,
    software: str = REFERENCE_SOFTWARE,
    traits: RunTraits | None = None,
) -> Projection:
    """Projection of one configuration resolved by :func:`oracle.specs.resolve_config`.

    ``calib``: a :class:`~oracle.constants.CalibrationTable`, a path to a calibration JSON
    (``tune-cp calibrate --out``), or None for the shipped ``oracle/catalog/calibration.json``.
    ``software``: ``megatron`` (Megatron-LM / Bridge / NeMo / Primus, the default),
    ``torchtitan`` or ``llm-foundry``. ``traits``: :class:`RunTraits` (None: the Megatron-Bridge
    defaults).
    """
    table = _calib(calib)
    if cfg.pipeline_split is None or cfg.dp is None or cfg.ga is None:
        raise ConfigError("resolve_config() the configuration before projecting it")
    batch = ConfigBatch.from_configs([cfg], traits)
    res = score_configs(model, cluster, training, batch, table, software)
    return Projection(
        step_time_s=float(res["step_time_s"][0]),
        tokens_per_s_per_gpu=float(res["tokens_per_s_per_gpu"][0]),
        model_tflops_per_gpu=float(res["model_tflops_per_gpu"][0]),
        mfu=float(res["mfu"][0]),
        model_flops_per_token=float(res["model_flops_per_token"][0]),
        breakdown={k: float(res[k][0]) for k in BREAKDOWN},
        critical_stage=int(res["critical_stage"][0]),
        label=cfg.label(),
        calibration=table.about or "priors",
        evidence=evidence_note(cluster.gpu.name, cluster.gpu.architecture, table),
        mfu_note=mfu_note(float(res["mfu"][0]), {k: float(res[k][0]) for k in BREAKDOWN},
                          float(res["step_time_s"][0]), model.is_moe,
                          cluster.gpu.architecture, training.precision.value, table),
    )


#: Breakdown entries that are GEMM work (what an MFU above the published ceiling rests on).
GEMM_TERMS = ("attention_gemm", "mlp_gemm", "expert_gemm", "router")
#: Exposed communication entries of the breakdown.
COMM_TERMS = ("tp_comm", "cp_comm", "ep_comm", "pp_p2p", "dp_comm")


def mfu_note(mfu: float, breakdown: dict[str, float], step_s: float, is_moe: bool,
             architecture: str, precision: str, table: CalibrationTable) -> str:
    """One line when a projected MFU is above the best MFU any published run of its class
    reached (``fitted_on.mfu_ceilings`` of the calibration file, written by
    :func:`oracle.calibrate.mfu_ceilings`): the ceiling, the row that set it, and what the
    projection's step consists of (GEMM share, bubble, exposed communication), so a user sees
    what makes it higher; "" otherwise or when the calibration has no ceilings."""
    from oracle.calibrate import mfu_class

    ceil = ((table.fitted_on or {}).get("mfu_ceilings") or {}).get(
        mfu_class(is_moe, architecture, precision))
    if not ceil or mfu <= ceil["mfu"]:
        return ""
    gemm = sum(breakdown.get(k, 0.0) for k in GEMM_TERMS) / step_s
    comm = sum(breakdown.get(k, 0.0) for k in COMM_TERMS) / step_s
    bubble = breakdown.get("pipeline_bubble", 0.0) / step_s
    return (f"MFU {100 * mfu:.1f}% is above the best published {100 * ceil['mfu']:.1f}% for "
            f"{mfu_class(is_moe, architecture, precision)} (row {ceil['row']}, {ceil['model']} on "
            f"{ceil['gpu']}); it rests on GEMMs taking {100 * gemm:.0f}% of the step at the fitted "
            f"GEMM efficiency, a {100 * bubble:.0f}% pipeline bubble and {100 * comm:.0f}% exposed "
            f"communication: verify the GEMM throughput at these shapes on the cluster")


def work_fields() -> list[str]:
    """Field names of :class:`ConfigBatch` (for documentation and tests)."""
    return [f.name for f in fields(ConfigBatch)]


__all__ = [
    "BREAKDOWN",
    "DEFAULT_TRAITS",
    "ConfigBatch",
    "Projection",
    "RunTraits",
    "auto_pipeline_split",
    "build_work",
    "concat_work",
    "constants_arrays",
    "project",
    "score_configs",
    "timing",
]
