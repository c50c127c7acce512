"""The workload inventory: what a decoder layer is made of, described once.

A decoder layer is one *kind* (:class:`LayerKind`) made of *blocks* (:class:`Block`), each with
its own pre-norm. A transformer layer is attention + MLP (``dense``) or attention + MoE
(``moe``); in a Megatron-Core hybrid model (``ModelSpec.hybrid_pattern``, Megatron-LM
``--hybrid-override-pattern``) each layer is ONE block: Mamba-2 mixer ``M``, attention ``*``,
dense MLP ``-``, MoE ``E`` (``megatron/core/ssm/mamba_hybrid_layer_allocation.py``). The memory
side (``oracle/memory.py``: :class:`~oracle.memory.StageCounts` counts layers per kind,
``param_units`` and ``activation_units`` are per kind) and the time side (per-stage kind counts,
GEMM shapes) read the composition, the parameters, the saved tensors and the GEMM shapes of
each block from here.

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
from enum import StrEnum
from functools import lru_cache

from oracle import params as P
from oracle.specs import (
    Fp8Recipe,
    ModelSpec,
    NormKind,
    ParallelConfig,
    PositionEmbedding,
    Precision,
    TrainingSpec,
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


# ============================================================== layer composition


class Block(StrEnum):
    """A block of a decoder layer: one operation group with its own pre-norm."""

    ATTENTION = "attention"
    MLP = "mlp"
    MOE = "moe"
    MAMBA = "mamba"


class LayerKind(StrEnum):
    """What one decoder layer is (the unit of pipeline splitting and per-stage counts).

    ``dense`` and ``moe``: attention + MLP / attention + MoE in a transformer; the MLP-only
    (``-``) and MoE-only (``E``) layers in a hybrid model. ``attention`` (``*``) and ``mamba``
    (``M``) occur only in hybrid models."""

    DENSE = "dense"
    MOE = "moe"
    ATTENTION = "attention"
    MAMBA = "mamba"


#: the order of per-kind count tuples (``StageCounts.recompute_groups``, ...)
KINDS: tuple[LayerKind, ...] = (LayerKind.DENSE, LayerKind.MOE, LayerKind.ATTENTION,
                                LayerKind.MAMBA)
#: Megatron-Core ``Symbols``: pattern character -> layer kind
SYMBOL_KIND: dict[str, LayerKind] = {"-": LayerKind.DENSE, "E": LayerKind.MOE,
                                     "*": LayerKind.ATTENTION, "M": LayerKind.MAMBA}


def kind_blocks(model: ModelSpec, kind: LayerKind) -> tuple[Block, ...]:
    """The blocks one layer of ``kind`` runs, in order."""
    if model.is_hybrid:
        return {LayerKind.DENSE: (Block.MLP,), LayerKind.MOE: (Block.MOE,),
                LayerKind.ATTENTION: (Block.ATTENTION,), LayerKind.MAMBA: (Block.MAMBA,)}[kind]
    return {LayerKind.DENSE: (Block.ATTENTION, Block.MLP),
            LayerKind.MOE: (Block.ATTENTION, Block.MOE)}.get(kind, ())


@lru_cache(maxsize=256)
def layer_kinds(model: ModelSpec) -> tuple[LayerKind, ...]:
    """The kind of every decoder layer (0-based): the hybrid pattern, else MoE from
    ``num_dense_layers`` on for an MoE model, dense otherwise."""
    if model.is_hybrid:
        return tuple(SYMBOL_KIND[ch] for ch in model.hybrid_pattern)
    return tuple(LayerKind.MOE if model.is_moe and i >= model.num_dense_layers else
                 LayerKind.DENSE for i in range(model.num_layers))


def kind_index(model: ModelSpec) -> tuple[int, ...]:
    """:func:`layer_kinds` as indices into :data:`KINDS` (hashable, for cached geometry)."""
    return tuple(KINDS.index(k) for k in layer_kinds(model))


def mtp_kind(model: ModelSpec) -> LayerKind:
    """An MTP module's transformer layer copies the last layer's kind (DeepSeek-V3)."""
    return LayerKind.MOE if model.is_moe else LayerKind.DENSE


def block_counts(model: ModelSpec, kinds: dict[LayerKind, int]) -> dict[Block, int]:
    """Blocks of each kind in a set of layers given per kind (``{kind: layers}``)."""
    out = dict.fromkeys(Block, 0)
    for kind, n in kinds.items():
        for b in kind_blocks(model, kind):
            out[b] += n
    return out


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

    def gemm_input(self, elements: int) -> int:
        """Bytes of a saved GEMM input: bf16, or FP8 (+ MXFP8 block scales) under FP8."""
        if not self.fp8_num:
            return BF16_BYTES * elements
        return P.cdiv(elements * self.fp8_num, self.fp8_den)


def act_shape(model: ModelSpec, training: TrainingSpec, cfg: ParallelConfig) -> ActShape:
    t = P.cdiv(cfg.mbs * training.seq_len, cfg.cp)
    t_sp = P.cdiv(t, cfg.tp) if cfg.sp else t
    num, den = fp8_saved_input_bytes(cfg.fp8_recipe, training.precision is Precision.FP4)
    return ActShape(t, t_sp, P.cdiv(training.seq_len, cfg.cp), cfg.tp, cfg.etp_, num, den)


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

