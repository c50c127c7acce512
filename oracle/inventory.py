"""The workload inventory: what each block of a decoder layer holds, described once.

A decoder layer is one *kind* made of *blocks* (``LayerKind``, ``Block`` and ``kind_blocks`` of
``oracle/layers.py``). The memory side
(``oracle/memory.py``: :class:`~oracle.memory.StageCounts` counts layers per kind,
``param_units`` and ``activation_units`` are per kind) and the time side (per-stage kind counts,
GEMM shapes) read the parameters, the saved tensors and the GEMM shapes of each block from here.

Per block this module holds:

* parameters per rank (:func:`block_params`; formulas in ``oracle/params.py``);
* tensors saved for backward per micro-batch and rank, with the selective-recompute modules
  that drop them (:func:`attention_tensors`, :func:`dense_mlp_tensors`, :func:`moe_tensors`,
  :func:`mamba_tensors`; a full-recompute group keeps only its input);
* the Mamba-2 mixer's GEMMs and its chunked SSM scan (:func:`mamba_gemms`,
  :func:`mamba_scan_flops_per_token`, :func:`mamba_scan_bytes_per_token`) and its collectives
  (:func:`mamba_cp_all_to_all_elements`).

Bytes are exact integers (the solver tabulates them); shapes are per rank: ``t`` tokens after
context parallelism, ``t_sp`` after sequence parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass

from tune_cp.config.specs import (
    Fp8Recipe,
    ModelSpec,
    NormKind,
    ParallelConfig,
    PositionEmbedding,
    Precision,
    TrainingSpec,
)
from tune_cp.oracle import params as P
from tune_cp.oracle.layers import (
    Block,
    kind_blocks,
    layer_kinds,
)

BF16_BYTES = 2
FP32_BYTES = 4
INT64_BYTES = 8
INT32_BYTES = 4
BOOL_BYTES = 1
#: Unfused RoPE saves a cos and a sin table for Q and again for K (``rope_tensors``).
ROPE_TABLES = 4
#: MXFP8 stores one 8-bit scale per 32-element block.
MXFP8_BLOCK = 32
#: NVFP4 stores 4-bit values with one FP8 (E4M3) scale per 16-element block.
NVFP4_BLOCK = 16
#: parts per million (the routing-imbalance scale of :func:`moe_tensors`)
PPM = 1_000_000


# ============================================================ saved tensors


@dataclass(frozen=True)
class Tensor:
    """One tensor kept for backward: its name, bytes per micro-batch on one rank, and the
    selective-recompute modules (``--recompute-modules``) that drop it."""

    name: str
    bytes: int
    dropped_by: frozenset[str] = frozenset()


def _drop(*modules: str) -> frozenset[str]:
    return frozenset(modules)


@dataclass(frozen=True)
class ActShape:
    """Shapes one rank sees for one micro-batch: ``t`` tokens in the sequence dimension after
    context parallelism (mbs x seq / cp), ``t_sp`` after sequence parallelism (t / tp or t),
    tensor-parallel size ``tp``, expert-TP size ``etp``, bytes of an FP8-saved GEMM input element
    (numerator/denominator, 0 when BF16)."""

    t: int
    t_sp: int
    seq: int
    tp: int
    etp: int
    fp8_num: int
    fp8_den: int
    cp: int = 1

    def gemm_input(self, elements: int) -> int:
        """Bytes of a saved GEMM input: bf16, or FP8 (+ MXFP8 block scales) under FP8."""
        if not self.fp8_num:
            return BF16_BYTES * elements
        return P.cdiv(elements * self.fp8_num, self.fp8_den)


def act_shape(model: ModelSpec, training: TrainingSpec, cfg: ParallelConfig) -> ActShape:
    t = P.cdiv(cfg.mbs * training.seq_len, cfg.cp)
    t_sp = P.cdiv(t, cfg.tp) if cfg.sp else t
    num, den = fp8_saved_input_bytes(cfg.fp8_recipe, training.precision is Precision.FP4)
    return ActShape(t, t_sp, P.cdiv(training.seq_len, cfg.cp), cfg.tp, cfg.etp_, num, den, cfg.cp)


def fp8_saved_input_bytes(recipe: Fp8Recipe | None, fp4: bool = False) -> tuple[int, int]:
    """Bytes per element of a GEMM input Transformer Engine saves for backward under FP8, as a
    fraction: 1 byte (the FP8 copy it keeps instead of bf16; TE "performance considerations"
    docs), plus one scale byte per 32 elements for MXFP8. NVFP4 (``fp4``) saves the column-wise
    quantized input its weight-gradient GEMM reads: 4 bits plus one FP8 scale per 16 elements,
    ``9/16`` B (TE ``NVFP4Quantizer``). ``(0, 1)`` means BF16."""
    if fp4:
        return (NVFP4_BLOCK // 2 + 1, NVFP4_BLOCK)
    if recipe is None:
        return (0, 1)
    if recipe is Fp8Recipe.MXFP8:
        return (MXFP8_BLOCK + 1, MXFP8_BLOCK)
    return (1, 1)


def norm_stats_bytes(model: ModelSpec, tokens: int) -> int:
    """Saved normalisation statistics: fp32 rstd per token (RMSNorm), mean and rstd (LayerNorm)."""
    return tokens * FP32_BYTES * (2 if model.norm is NormKind.LAYERNORM else 1)


def attention_tensors(model: ModelSpec, training: TrainingSpec, x: ActShape) -> list[Tensor]:
    """Tensors the self-attention block keeps, per micro-batch and rank.

    Korthikanti et al. 2022 Table 2 (per layer 11 sbh + 5 a s^2 b without parallelism, plus 2 sbh
    for the layer norm): layer input kept by the norm (2 sbh), QKV input (2 sbh), Q and K (4 sbh),
    V (2 sbh), softmax (2 a s^2 b), its dropout mask (a s^2 b) and output (2 a s^2 b), projection
    input (2 sbh), dropout mask (sbh). Generalised here: GQA/MLA widths, flash attention (no s^2
    tensors, an fp32 log-sum-exp per head instead), QK norm, attention and hidden dropout only
    when enabled, sequence parallelism on the tensors outside the tensor-parallel region.
    """
    h, a_loc = model.hidden_size, P.cdiv(model.num_attention_heads, x.tp)
    out: list[Tensor] = [
        Tensor("attn_norm_input", BF16_BYTES * x.t_sp * h),
        Tensor("attn_norm_stats", norm_stats_bytes(model, x.t_sp)),
        Tensor("qkv_input", x.gemm_input(x.t_sp * h), _drop("layernorm")),
    ]
    if model.mla is not None:
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            out.append(Tensor("mla_q_latent", 2 * BF16_BYTES * x.t * m.q_lora_rank))
        kv_latent = BF16_BYTES * x.t * (m.kv_lora_rank + m.qk_rope_head_dim + m.kv_lora_rank)
        out.append(Tensor("mla_kv_latent", kv_latent))
        qkv_width = a_loc * (2 * qk + m.v_head_dim)
        out.append(Tensor("qkv", BF16_BYTES * x.t * qkv_width, _drop("mla_up_proj")))
        o_width = a_loc * m.v_head_dim
    else:
        d = model.head_dim
        q_w, kv_w = a_loc * d, P.kv_heads_per_rank(model, x.tp) * d
        # the fused QKV output stays alive whole: V (and, without RoPE, Q and K) are views of it
        out.append(Tensor("qkv", BF16_BYTES * x.t * (q_w + 2 * kv_w)))
        if model.qk_norm:
            norm_in = BF16_BYTES * x.t * (q_w + kv_w)
            heads = a_loc + P.kv_heads_per_rank(model, x.tp)
            out.append(Tensor("qk_norm", norm_in + norm_stats_bytes(model, x.t * heads)))
        if model.position_embedding is PositionEmbedding.ROPE:
            out += rope_tensors(x, q_w + kv_w, d)
        o_width = q_w
    if training.flash_attention:
        out.append(Tensor("attn_lse", FP32_BYTES * x.t * a_loc, _drop("core_attn")))
    else:
        s_kv = training.seq_len  # each local query attends to the whole (causal) sequence
        per_elem = BF16_BYTES + (1 + BF16_BYTES if model.attention_dropout else 0)
        scores = per_elem * x.t * a_loc * s_kv
        out.append(Tensor("attn_scores", scores, _drop("core_attn")))
    out.append(Tensor("attn_output", BF16_BYTES * x.t * o_width))
    if x.fp8_num:
        out.append(Tensor("proj_input_fp8", x.gemm_input(x.t * o_width)))
    if model.hidden_dropout:
        out.append(Tensor("attn_dropout_mask", x.t_sp * h))
    return out


def rope_tensors(x: ActShape, qk_width: int, rot_dim: int) -> list[Tensor]:
    """What rotary embeddings add to the attention's saved set.

    RoPE makes new Q and K tensors (``apply_rotary_pos_emb``: ``t * cos + rotate(t) * sin``)
    that core attention saves, while the QKV projection output they came from stays alive
    through V's view of it: Q and K are held twice (``2 t qk_width`` bytes; measured on
    Megatron-Core 0.16.1, ``benchmarks/memory_truth.py``). Unfused RoPE (the local spec,
    ``--no-rope-fusion``) also saves a bf16 cos and sin table of ``t x rot_dim`` for Q and again
    for K; Transformer Engine's fused RoPE saves only the shared fp32 frequencies, so for it
    these four tables (``4 x 2 t rot_dim`` bytes per layer, not split by tensor parallelism) are
    an over-count tune-cp accepts."""
    return [
        Tensor("rope_rotated_qk", BF16_BYTES * x.t * qk_width),
        Tensor("rope_cos_sin", ROPE_TABLES * BF16_BYTES * x.seq * rot_dim),
    ]


def dense_mlp_tensors(model: ModelSpec, x: ActShape, ffn: int | None = None) -> list[Tensor]:
    """Tensors a dense MLP keeps: norm input and stats, fc1 input (the norm output), fc1 output
    (``2f`` when gated, the activation's input), fc2 input (activation output), dropout mask.
    Korthikanti's MLP: 2 sbh + 8 sbh + 8 sbh + sbh with f = 4h (plus 2 sbh for the norm)."""
    h = model.hidden_size
    f = P.cdiv(model.ffn_hidden_size if ffn is None else ffn, x.tp)
    up = (2 if model.gated_mlp else 1) * f
    out = [
        Tensor("mlp_norm_input", BF16_BYTES * x.t_sp * h),
        Tensor("mlp_norm_stats", norm_stats_bytes(model, x.t_sp)),
        # the ``mlp`` checkpoint keeps its input, the norm output: only ``layernorm`` drops it
        Tensor("fc1_input", x.gemm_input(x.t_sp * h), _drop("layernorm")),
        Tensor("fc1_output", BF16_BYTES * x.t * up, _drop("mlp")),
        Tensor("fc2_input", x.gemm_input(x.t * f), _drop("mlp")),
    ]
    if model.hidden_dropout:
        out.append(Tensor("mlp_dropout_mask", x.t_sp * h))
    return out


def moe_tensors(model: ModelSpec, x: ActShape, imbalance_ppm: int = 0) -> list[Tensor]:
    """Tensors an MoE block keeps (alltoall dispatcher, dropless, balanced routing):

    router input (the norm output), fp32 router logits and probabilities (``2 x 4 E`` bytes per
    token), routing map (top-k probs and int32 indices), dispatched tokens: each rank's experts
    receive ``t_sp x k`` token copies from its EP peers and all-gather them across ETP
    (``x etp``), keep the fc1 input, fc1 output (``2 f_e / etp`` gated) and fc2 input
    (``f_e / etp``). The routing probabilities are applied inside the expert activation
    (Megatron-Core MoE README, "memory-efficient permutation"), so the combine keeps no expert
    outputs. Shared experts keep what a dense MLP of width ``n_s f_s`` keeps. ``imbalance_ppm``
    scales the expert-side tensors for the busiest rank.
    """
    h, e, k = model.hidden_size, model.num_experts, model.moe_top_k
    fe = P.cdiv(model.expert_ffn_hidden_size, x.etp)
    up = (2 if model.gated_mlp else 1) * fe
    scale = PPM + imbalance_ppm
    rows = x.t_sp * k * x.etp * scale // PPM
    moe_drop = _drop("moe")
    out = [
        Tensor("mlp_norm_input", BF16_BYTES * x.t_sp * h),
        Tensor("mlp_norm_stats", norm_stats_bytes(model, x.t_sp)),
        Tensor("router_input", BF16_BYTES * x.t_sp * h, _drop("layernorm")),  # moe ckpt keeps it
        Tensor("router_logits_probs", 2 * FP32_BYTES * x.t_sp * e, moe_drop),
        Tensor("routing_map", (FP32_BYTES + INT32_BYTES) * x.t_sp * k, moe_drop),
        Tensor("expert_input", x.gemm_input(rows * h), moe_drop),
        Tensor("expert_fc1_output", BF16_BYTES * rows * up, moe_drop),
        Tensor("expert_fc2_input", x.gemm_input(rows * fe), _drop("moe", "moe_act")),
    ]
    if model.num_shared_experts:
        fs = P.cdiv(model.num_shared_experts * model.shared_expert_ffn_hidden_size, x.tp)
        sup = (2 if model.gated_mlp else 1) * fs
        shared = _drop("moe", "shared_experts")
        out.append(Tensor("shared_fc1_output", BF16_BYTES * x.t * sup, shared))
        out.append(Tensor("shared_fc2_input", x.gemm_input(x.t * fs), shared))
    if model.hidden_dropout:
        out.append(Tensor("mlp_dropout_mask", x.t_sp * h))
    return out



def kept_bytes(tensors: list[Tensor], modules: frozenset[str]) -> int:
    """Bytes of the tensors that the selective-recompute ``modules`` do not drop."""
    return sum(t.bytes for t in tensors if not (t.dropped_by & modules))



# ============================================================ Mamba-2 mixer


@dataclass(frozen=True)
class MambaShape:
    """Per-rank widths of one Mamba-2 mixer (Megatron-Core ``mamba_mixer.py`` and
    ``mamba_context_parallel.py``): heads and groups split over tp, then over cp by the
    all-to-all around the conv and scan (groups replicated when ``G / tp < cp``)."""

    d_inner: int  # d_inner / tp
    heads: int  # H / tp
    groups: int  # G / tp
    proj: int  # in_proj output width on one tp rank: 2 d_inner + 2 G N + H, over tp
    conv: int  # conv1d channels on one tp rank: d_inner + 2 G N, over tp
    heads_cp: int  # H / (tp cp)
    groups_cp: int  # G / (tp cp), at least 1
    proj_cp: int  # the zxBCdt width one rank scans after the CP all-to-all


def mamba_shape(model: ModelSpec, tp: int, cp: int = 1) -> MambaShape:
    m = model.mamba
    assert m is not None, "a Mamba layer needs ModelSpec.mamba"
    n = m.state_dim
    heads, groups = P.cdiv(m.num_heads, tp), P.cdiv(m.num_groups, tp)
    d_inner = heads * m.head_dim
    heads_cp = P.cdiv(heads, cp)
    groups_cp = max(1, groups // cp)
    return MambaShape(
        d_inner=d_inner, heads=heads, groups=groups,
        proj=2 * d_inner + 2 * groups * n + heads,
        conv=d_inner + 2 * groups * n,
        heads_cp=heads_cp, groups_cp=groups_cp,
        proj_cp=2 * heads_cp * m.head_dim + 2 * groups_cp * n + heads_cp,
    )


def mamba_tensors(model: ModelSpec, x: ActShape) -> list[Tensor]:
    """Tensors a Mamba-2 mixer layer keeps for backward, per micro-batch and rank (Megatron-Core
    0.16.1 training path, ``use_mamba_mem_eff_path=True``: ``MambaMixer._ssm_training`` calls
    mamba_ssm's ``mamba_split_conv1d_scan_combined``):

    * the fused pre-norm of ``in_proj`` (``TELayerNormColumnParallelLinear``): its input
      (bf16 ``t_sp x h``), fp32 rstd, and the GEMM input (the norm output);
    * ``MambaSplitConv1dScanCombinedFn`` saves ``zxbcdt`` (the whole ``in_proj`` output, bf16,
      after the CP all-to-all: the full sequence ``t cp`` for ``H / (tp cp)`` heads) and
      ``out_x`` (the scan output before the ``silu(z)`` gate, ``t x d_inner / tp``); the conv
      output and the chunk states are recomputed in its backward;
    * the gated RMSNorm (``ExtendedRMSNorm``, mamba_ssm ``layernorm_gated``) keeps its input y
      (bf16 ``t x d_inner / tp``) and an fp32 rstd per token and group;
    * ``out_proj`` (row-parallel) keeps its input, the norm output.

    No selective-recompute module drops them (Megatron-Core's ``recompute_modules`` name
    attention, MLP and MoE parts only). Not measured: the mamba_ssm kernels are not installed
    beside ``benchmarks/memory_truth.py``.
    """
    h = model.hidden_size
    ms = mamba_shape(model, x.tp, x.cp)
    out = [
        Tensor("mamba_norm_input", BF16_BYTES * x.t_sp * h),
        Tensor("mamba_norm_stats", norm_stats_bytes(model, x.t_sp)),
        Tensor("in_proj_input", x.gemm_input(x.t_sp * h)),
        Tensor("zxbcdt", BF16_BYTES * x.t * x.cp * ms.proj_cp),
        Tensor("scan_out_x", BF16_BYTES * x.t * ms.d_inner),
        Tensor("gated_norm_input", BF16_BYTES * x.t * ms.d_inner),
        Tensor("gated_norm_stats", FP32_BYTES * x.t * ms.groups),
        Tensor("out_proj_input", x.gemm_input(x.t * ms.d_inner)),
    ]
    if model.hidden_dropout:
        out.append(Tensor("mamba_dropout_mask", x.t_sp * h))
    return out


def mamba_backward_bytes(model: ModelSpec, x: ActShape) -> int:
    """Working set of a Mamba layer's backward beside the incoming ``t_sp x h`` gradient: the
    gradient of ``zxbcdt`` (bf16, as saved), the recomputed conv output (``x, B, C``, bf16) and
    the fp32 chunk states with their gradient (``t / chunk`` chunks of ``H / tp x P x N``), as
    mamba_ssm's ``MambaSplitConv1dScanCombinedFn.backward`` allocates them. Not measured."""
    m = model.mamba
    assert m is not None
    ms = mamba_shape(model, x.tp, x.cp)
    seq = x.t * x.cp
    chunks = P.cdiv(seq, m.chunk_size)
    states = FP32_BYTES * chunks * ms.heads_cp * m.head_dim * m.state_dim
    return (BF16_BYTES * seq * ms.proj_cp
            + BF16_BYTES * seq * (ms.conv // max(1, x.cp))
            + 2 * states
            + BF16_BYTES * x.t_sp * model.hidden_size)


def attention_backward_bytes(model: ModelSpec, x: ActShape) -> int:
    """Working set of an attention-only layer's backward (hybrid ``*``) beside the incoming
    ``t_sp x h`` gradient: the gradients of Q, K and V (bf16, the QKV output's width). A
    transformer layer's backward peak is its MLP's (``oracle/memory.py::dense_backward_bytes``);
    this one is not measured."""
    if model.mla is not None:
        ml = model.mla
        width = P.cdiv(model.num_attention_heads, x.tp) * (
            2 * (ml.qk_nope_head_dim + ml.qk_rope_head_dim) + ml.v_head_dim)
    else:
        width = (P.cdiv(model.num_attention_heads, x.tp)
                 + 2 * P.kv_heads_per_rank(model, x.tp)) * model.head_dim
    return BF16_BYTES * x.t * width + BF16_BYTES * x.t_sp * model.hidden_size


def mamba_scan_flops_per_token(model: ModelSpec, tp: int) -> float:
    """Forward FLOPs of the chunked SSD scan per token on one tensor-parallel rank.

    Mamba-2's SSD algorithm (Dao and Gu 2024, "Transformers are SSMs", section 6) with chunk
    length Q (``MambaSpec.chunk_size``, Megatron's ``chunk_size=128``), state N, head dim P runs
    four matmuls: ``C B^T`` within each chunk (``2 Q N`` per token, per group), its masked
    product with x (``2 Q P`` per token, per head), the chunk states ``B^T x`` (``2 N P``, per
    head) and the state output ``C h`` (``2 N P``, per head); the state passing between chunks
    is ``O(N P / Q)`` and left out. Backward is twice the forward."""
    m = model.mamba
    assert m is not None
    q, n, p_ = m.chunk_size, m.state_dim, m.head_dim
    heads, groups = m.num_heads / tp, max(1.0, m.num_groups / tp)
    return 2.0 * heads * (q * p_ + 2 * n * p_) + 2.0 * groups * q * n


def mamba_scan_bytes_per_token(model: ModelSpec, tp: int) -> float:
    """HBM bytes of the fused conv + scan kernels per token on one tp rank, forward: read
    ``zxbcdt`` (bf16), write the conv output and read it back (bf16, ``d_inner + 2 G N``), write
    ``out_x`` and the gated output (bf16, ``2 d_inner``); the gated RMSNorm reads y and writes
    its output (``2 d_inner`` bf16). Chunk states stay on chip per chunk (mamba_ssm
    ``ssd_combined.py`` kernels)."""
    ms = mamba_shape(model, tp)
    return float(BF16_BYTES * (ms.proj + 2 * ms.conv + 2 * ms.d_inner + 2 * ms.d_inner))


#: Bytes per element of the SSD kernels' chunk-state traffic through HBM, forward (mamba_ssm
#: ``ops/triton/ssd_combined.py::_mamba_chunk_scan_combined_fwd``): ``_chunk_state_fwd`` writes the
#: per-chunk states in fp32 (``states_in_fp32=True``, 4), ``_state_passing_fwd`` reads them (4)
#: and writes the passed states in the activation dtype (bf16, 2), ``_chunk_scan_fwd`` reads
#: those (2).
SSD_STATE_BYTES_PER_ELEMENT = 12
#: Bytes per element of the intra-chunk ``C B^T`` matrix, forward: ``_bmm_chunk_fwd`` writes it
#: in fp32 (``output_dtype=torch.float32``, 4), ``_chunk_scan_fwd`` reads it (4).
SSD_CB_BYTES_PER_ELEMENT = 8
#: The SSD backward (``_mamba_chunk_scan_combined_bwd``) first recomputes the forward's
#: cumsum, ``C B^T``, chunk states and state passing (the states are not saved:
#: ``oracle/inventory.py::mamba_tensors``), then runs the gradient kernels, which move about
#: twice the forward's bytes and FLOPs (the element-wise convention of ``oracle/timing.py``):
#: backward = 1 (recompute) + 2 forward units.
SSD_BACKWARD_FORWARD_UNITS = 3.0


def mamba_ssd_state_bytes_per_token(model: ModelSpec, tp: int) -> float:
    """HBM bytes per token of the SSD scan's intermediates on one tp rank, forward: the chunk
    states, ``H/tp`` heads of ``P x N`` per chunk of ``Q`` tokens
    (:data:`SSD_STATE_BYTES_PER_ELEMENT`), and ``C B^T``, ``Q`` elements per token and group
    (:data:`SSD_CB_BYTES_PER_ELEMENT`). The Triton SSD kernels exchange these through HBM
    between their five launches, so at state 128 they outweigh the bf16 activations the scan
    reads and writes (:func:`mamba_scan_bytes_per_token`). Worked example, Nemotron 3 Nano (64
    heads of 64, state 128, 8 groups, chunk 128), tp 1: 64 x 64 x 128 x 12 / 128 + 8 x 128 x 8
    = 49,152 + 8,192 = 57,344 B per token."""
    m = model.mamba
    assert m is not None
    heads, groups = P.cdiv(m.num_heads, tp), max(1, P.cdiv(m.num_groups, tp))
    states = heads * m.head_dim * m.state_dim * SSD_STATE_BYTES_PER_ELEMENT / m.chunk_size
    return float(states + groups * m.chunk_size * SSD_CB_BYTES_PER_ELEMENT)


def mamba_gemms(model: ModelSpec, tp: float) -> dict[str, tuple[float, float]]:
    """The mixer's GEMMs as ``{slot: (N, K)}`` per token (M = tokens on the rank): ``in_proj``
    ``h -> (2 d_inner + 2 G N + H) / tp`` (column-parallel) and ``out_proj``
    ``d_inner / tp -> h`` (row-parallel). ``tp`` may be a numpy array."""
    m = model.mamba
    assert m is not None
    import numpy as np

    h, n = model.hidden_size, m.state_dim
    heads = np.ceil(m.num_heads / tp)
    groups = np.ceil(m.num_groups / tp)
    d_inner = heads * m.head_dim
    return {
        "mamba_in": (2 * d_inner + 2 * groups * n + heads, float(h)),
        "mamba_out": (float(h), d_inner),
    }


def mamba_cp_all_to_all_elements(model: ModelSpec, tp: int) -> int:
    """Elements one rank sends per token in Mamba's context-parallel all-to-alls, forward:
    ``zxBCdt`` before the conv and scan (sequence-sharded -> head-sharded) and the scan output
    ``y`` after it (head-sharded -> sequence-sharded), Megatron-Core
    ``mamba_context_parallel.py::pre_conv_ssm`` / ``post_conv_ssm``. The z and dt parts ride
    along with x, B, C."""
    ms = mamba_shape(model, tp)
    return ms.proj + ms.d_inner


# ============================================================ GEMMs per block (vectorised)


@dataclass(frozen=True)
class Gemm:
    """One GEMM of a block on one rank, per micro-batch: ``m`` rows (tokens), ``n`` x ``k``
    weight (per rank, after tp / etp sharding), run ``count`` times (local experts). Fields may
    be numpy arrays over configurations. Its weight has ``n k count`` parameters."""

    slot: str
    m: object
    n: object
    k: object
    count: object = 1.0


def block_gemms(model: ModelSpec, tokens: object, tokens_sp: object, tp: object, ep: object,
                etp: object) -> dict[Block, list[Gemm]]:
    """The GEMMs of every block the model has, per rank and micro-batch (``tokens``: T = mbs
    seq / cp; ``tokens_sp``: T / tp under sequence parallelism; ``tp``, ``ep``, ``etp`` may be
    numpy arrays). Attention: fused QKV (GQA: ``h -> (a + 2 g) d / tp``, KV heads replicated
    when tp > g) or MLA's down- (replicated) and up-projections, and the output projection;
    MLP: fc1 (``2 f`` gated) and fc2; MoE: the grouped expert fc1/fc2 on the ``T_sp k etp``
    routed token copies of the ``E / ep`` local experts (a latent MoE's experts and its
    replicated ``h -> L -> h`` projections on the latent width), the shared experts and the
    router; Mamba: :func:`mamba_gemms`. ``oracle/work.py::build_work`` lays them into its GEMM
    slots; ``tests/test_hybrid.py`` checks their weights against ``oracle/params.py``."""
    import numpy as np

    h, a, g = model.hidden_size, model.num_attention_heads, model.num_kv_heads
    T, Tsp = tokens, tokens_sp
    a_loc = np.ceil(a / tp)
    g_loc = np.maximum(1.0, np.ceil(g / tp))
    up = 2.0 if model.gated_mlp else 1.0
    out: dict[Block, list[Gemm]] = {}
    blocks = {b for kind in set(layer_kinds(model)) for b in kind_blocks(model, kind)}
    if Block.ATTENTION in blocks or model.num_mtp_layers:
        att: list[Gemm] = []
        if model.mla is not None:
            m = model.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank:
                att.append(Gemm("q_down", T, m.q_lora_rank, h))  # duplicated over tp
                att.append(Gemm("q_up", T, a_loc * qk, m.q_lora_rank))
            else:
                att.append(Gemm("qkv", T, a_loc * qk, h))
            att.append(Gemm("kv_down", T, m.kv_lora_rank + m.qk_rope_head_dim, h))
            att.append(Gemm("kv_up", T, a_loc * (m.qk_nope_head_dim + m.v_head_dim),
                            m.kv_lora_rank))
            att.append(Gemm("attn_out", T, h, a_loc * m.v_head_dim))
        else:
            d = model.head_dim
            att.append(Gemm("qkv", T, (a_loc + 2 * g_loc) * d, h))
            att.append(Gemm("attn_out", T, h, a_loc * d))
        out[Block.ATTENTION] = att
    if model.num_dense_layers_effective:
        f_loc = np.ceil(model.ffn_hidden_size / tp)
        out[Block.MLP] = [Gemm("mlp_fc1", T, up * f_loc, h), Gemm("mlp_fc2", T, h, f_loc)]
    if model.is_moe:
        E, k = model.num_experts, model.moe_top_k
        width = model.moe_latent_size or h
        fe_loc = np.ceil(model.expert_ffn_hidden_size / etp)
        rows = Tsp * k * etp  # token copies this rank's experts process
        local_experts = np.ceil(E / ep)
        m_e = rows / local_experts
        moe = [Gemm("exp_fc1", m_e, up * fe_loc, width, local_experts),
               Gemm("exp_fc2", m_e, width, fe_loc, local_experts)]
        if model.moe_latent_size:  # duplicated (replicated) over tp, on the local tokens
            moe += [Gemm("lat_down", Tsp, width, h), Gemm("lat_up", Tsp, h, width)]
        fs = model.num_shared_experts * model.shared_expert_ffn_hidden_size
        if fs:
            fs_loc = np.ceil(fs / tp)
            moe += [Gemm("sh_fc1", T, up * fs_loc, h), Gemm("sh_fc2", T, h, fs_loc)]
        moe.append(Gemm("router", Tsp, E, h))
        out[Block.MOE] = moe
    if model.mamba is not None:
        out[Block.MAMBA] = [Gemm(slot, T, n_, k_) for slot, (n_, k_)
                            in mamba_gemms(model, tp).items()]
    return out
