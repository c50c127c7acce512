"""Parameter counts: whole-model (Hugging Face convention) and per rank (Megatron-Core sharding).

Every function returns an exact integer count of parameters. The per-rank functions follow how
Megatron-Core shards each tensor (column-parallel: output dim / tp; row-parallel: input dim / tp,
its bias replicated; norms, routers and MLA down-projections replicated across tp). Division by
a parallel size uses ceiling division: legality (``solver/rules.py``) guarantees exact division,
and the ceiling keeps an illegal layout's estimate on the safe side rather than crashing.

Symbols: h hidden, f dense FFN, a heads, g KV heads, d head dim, V vocabulary, E experts,
f_e expert FFN, f_s shared-expert FFN (per shared expert), n_s shared experts, L the latent
width of a latent MoE; Mamba-2: H heads, P head dim, d_inner = H P, G groups, N state dim,
K conv kernel.

Which blocks a layer has is ``oracle/layers.py::kind_blocks``'s;
:func:`layer_params` sums them.
"""

from __future__ import annotations

from tune_cp.config.specs import ModelSpec, NormKind, PositionEmbedding
from tune_cp.oracle.layers import Block, kind_blocks, layer_kinds

#: Megatron-LM ``--make-vocab-size-divisible-by`` default (megatron/training/arguments.py).
VOCAB_DIVISIBLE_BY = 128


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = VOCAB_DIVISIBLE_BY) -> int:
    """Vocabulary padded the way Megatron-LM pads it (``_vocab_size_with_padding``): up to the next
    multiple of ``make_vocab_size_divisible_by * tp`` so every tensor-parallel rank holds an equal
    slice. Example: Llama 3's 128,256 stays 128,256 at tp 1 and 2 and becomes 128,512 at tp 4."""
    multiple = divisible_by * tp
    return cdiv(vocab_size, multiple) * multiple


def norm_params(model: ModelSpec, width: int) -> int:
    """One normalisation layer of ``width``: RMSNorm has a scale, LayerNorm a scale and a bias."""
    return width * (2 if model.norm is NormKind.LAYERNORM else 1)


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads one tensor-parallel rank holds: ``g / tp``, or one replicated head when tp > g."""
    return max(1, cdiv(model.num_kv_heads, tp))


def attention_params(model: ModelSpec, tp: int = 1) -> int:
    """Self-attention block of one layer on one tensor-parallel rank, its input norm included.

    GQA: fused QKV ``h x (a + 2g) d`` column-parallel, output ``a d x h`` row-parallel.
    MLA (DeepSeek-V3): the down-projections ``W_DQ (h x q_lora)`` and ``W_DKV (h x (kv_lora +
    d_rope))`` and their norms are replicated across tp (Megatron-Core builds them as duplicated
    linears); the up-projections and the output projection are sharded.
    """
    h, a = model.hidden_size, model.num_attention_heads
    total = norm_params(model, h)  # input layernorm (fused into the QKV linear in TE)
    if model.mla is not None:
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            total += h * m.q_lora_rank + norm_params(model, m.q_lora_rank)
            total += cdiv(m.q_lora_rank * a * qk, tp)
        else:
            total += cdiv(h * a * qk, tp)
        total += h * (m.kv_lora_rank + m.qk_rope_head_dim) + norm_params(model, m.kv_lora_rank)
        total += cdiv(m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim), tp)
        total += cdiv(a * m.v_head_dim * h, tp)
    else:
        d = model.head_dim
        # q heads shard over tp; KV heads too while tp <= g, else each rank keeps one replica
        # (Megatron-Core allows tp % g == 0 and replicates the KV heads).
        qkv = cdiv(model.num_attention_heads * d, tp) + 2 * kv_heads_per_rank(model, tp) * d
        total += h * qkv + (qkv if model.qkv_bias else 0)
        total += cdiv(a * d * h, tp)
        if model.qk_norm:
            total += 2 * norm_params(model, d)  # q_norm and k_norm over head_dim, shared by heads
    if model.attn_out_bias:
        total += h
    if model.attention_sinks:
        total += cdiv(a, tp)
    return total


def mlp_params(model: ModelSpec, ffn: int, tp: int = 1, width: int = 0) -> int:
    """One MLP of width ``ffn`` on one rank: fc1 (``2 ffn`` when gated) column-parallel, fc2
    row-parallel; biases when ``mlp_bias`` (fc2's replicated). No norm: callers add it.
    ``width``: its input/output width when not the hidden size (a latent MoE's experts)."""
    h = width or model.hidden_size
    up = (2 if model.gated_mlp else 1) * ffn
    total = cdiv(h * up, tp) + cdiv(ffn * h, tp)
    if model.mlp_bias:
        total += cdiv(up, tp) + h
    return total


def dense_mlp_params(model: ModelSpec, tp: int = 1) -> int:
    """Dense MLP block of one layer on one rank, its pre-MLP norm included."""
    return norm_params(model, model.hidden_size) + mlp_params(model, model.ffn_hidden_size, tp)


def moe_nonexpert_params(model: ModelSpec, tp: int = 1) -> int:
    """The parts of an MoE block that are not routed experts, on one rank: pre-MLP norm, router
    ``h x E`` (replicated, with optional bias and DeepSeek's score-correction bias), the shared
    experts (sharded over tp like a dense MLP of width ``n_s * f_s``) and, for a latent MoE,
    the ``h x L`` and ``L x h`` latent projections (Megatron-Core ``moe_layer.py``
    ``fc1_latent_proj`` / ``fc2_latent_proj``, ``parallel_mode="duplicated"``: replicated)."""
    h, e = model.hidden_size, model.num_experts
    total = norm_params(model, h) + h * e + 2 * h * model.moe_latent_size
    total += e if model.router_bias else 0
    total += e if model.router_expert_bias else 0
    if model.num_shared_experts:
        total += mlp_params(model, model.num_shared_experts * model.shared_expert_ffn_hidden_size, tp)
    return total


def one_expert_params(model: ModelSpec, etp: int = 1) -> int:
    """One routed expert on one expert-tensor-parallel rank: an MLP of width ``f_e`` from and to
    the hidden size, or from and to the latent width ``L`` of a latent MoE (Megatron-Core
    ``experts.py``: ``input_size = moe_latent_size``)."""
    if model.moe_latent_size:
        return mlp_params(model, model.expert_ffn_hidden_size, etp, width=model.moe_latent_size)
    return mlp_params(model, model.expert_ffn_hidden_size, etp)


def expert_params_per_rank(model: ModelSpec, ep: int = 1, etp: int = 1) -> int:
    """Routed experts of one MoE layer held by one rank: ``E / ep`` experts, each sharded ``etp``
    ways."""
    return cdiv(model.num_experts, ep) * one_expert_params(model, etp)


def embedding_params(model: ModelSpec, tp: int = 1, *, pad: bool = True) -> int:
    """Input embedding on one rank (vocab-parallel ``V_pad / tp x h``) plus learned positions
    (replicated). ``pad=False`` gives the unpadded Hugging Face count."""
    vocab = padded_vocab_size(model.vocab_size, tp) if pad else model.vocab_size
    total = cdiv(vocab * model.hidden_size, tp)
    if model.position_embedding is PositionEmbedding.LEARNED:
        total += model.max_position_embeddings * model.hidden_size
    return total


def output_params(model: ModelSpec, tp: int = 1, pp: int = 1, *, pad: bool = True) -> int:
    """Final norm plus the output layer on the last pipeline stage, one rank. With tied
    embeddings and ``pp == 1`` the output reuses the embedding; with tied embeddings and
    ``pp > 1`` Megatron keeps a copy of the word embeddings on the last stage."""
    total = norm_params(model, model.hidden_size)
    if not model.tied_embeddings or pp > 1:
        vocab = padded_vocab_size(model.vocab_size, tp) if pad else model.vocab_size
        total += cdiv(vocab * model.hidden_size, tp)
    return total


def mtp_extra_params(model: ModelSpec, tp: int = 1) -> int:
    """What one multi-token-prediction module adds beside its transformer layer (DeepSeek-V3):
    the embedding and hidden norms, the ``2h x h`` projection (column-parallel) and its final norm.
    Embedding and output head are shared with the main model."""
    h = model.hidden_size
    return 3 * norm_params(model, h) + cdiv(2 * h * h, tp)


def mamba_params(model: ModelSpec, tp: int = 1) -> int:
    """One Mamba-2 mixer layer on one tensor-parallel rank, its pre-norm included (Megatron-Core
    ``ssm/mamba_mixer.py``; the layer norm is fused into ``in_proj``, a
    ``TELayerNormColumnParallelLinear``).

    ``in_proj``: ``h x (2 d_inner + 2 G N + H)`` (z, x, B, C, dt) column-parallel; ``conv1d``:
    depthwise over x, B, C (``d_inner + 2 G N`` channels, kernel K, with bias), split over tp;
    ``A_log``, ``dt_bias`` and ``D`` (``D_has_hdim=False``: one per head): H each, split; the
    gated RMSNorm over ``d_inner``, split; ``out_proj``: ``d_inner x h`` row-parallel. No linear
    biases (Megatron asserts ``not bias``). tp must divide H and G (``solver/rules.py``).
    """
    m = model.mamba
    assert m is not None, "mamba_params needs a MambaSpec"
    h, di = model.hidden_size, m.d_inner
    conv_ch = di + 2 * m.num_groups * m.state_dim
    proj_out = 2 * di + 2 * m.num_groups * m.state_dim + m.num_heads
    total = norm_params(model, h)
    total += cdiv(h * proj_out, tp)
    total += cdiv(conv_ch * (m.conv_kernel + 1), tp)
    total += 3 * cdiv(m.num_heads, tp)
    total += cdiv(di, tp)  # gated RMSNorm scale
    total += cdiv(di * h, tp)
    return total


def standalone_attention_params(model: ModelSpec, tp: int = 1) -> int:
    """An attention-only layer (hybrid ``*``): the attention block and its pre-norm."""
    return attention_params(model, tp)


def standalone_mlp_params(model: ModelSpec, tp: int = 1) -> int:
    """An MLP-only layer (hybrid ``-``): the dense MLP and its pre-norm."""
    return dense_mlp_params(model, tp)


def moe_block_params(model: ModelSpec) -> int:
    """An MoE block with all its routed experts, unsharded."""
    return moe_nonexpert_params(model) + model.num_experts * one_expert_params(model)


def layer_params(model: ModelSpec, layer: int) -> int:
    """Parameters of decoder layer ``layer`` (0-based), unsharded: the sum of its blocks
    (``oracle/layers.py::kind_blocks``)."""
    per_block = {
        Block.ATTENTION: attention_params,
        Block.MLP: dense_mlp_params,
        Block.MOE: lambda m: moe_block_params(m),
        Block.MAMBA: mamba_params,
    }
    return sum(per_block[b](model) for b in kind_blocks(model, layer_kinds(model)[layer]))


def total_params(model: ModelSpec, *, include_mtp: bool = False) -> int:
    """All parameters with the unpadded vocabulary, as ``sum(p.numel() for p in
    model.parameters())`` counts them for the Hugging Face implementation (tied embeddings
    counted once). MTP modules are excluded unless asked for."""
    total = sum(layer_params(model, i) for i in range(model.num_layers))
    total += embedding_params(model, pad=False) + output_params(model, pad=False)
    if include_mtp and model.num_mtp_layers:
        per_mtp = mtp_extra_params(model) + layer_params(model, model.num_layers - 1)
        if model.is_hybrid:  # its MTP depth is attention + the last layer's block
            per_mtp += attention_params(model)
        total += model.num_mtp_layers * per_mtp
    return total


def active_params(model: ModelSpec) -> int:
    """Parameters one token passes through: all but the ``E - k`` routed experts it skips in
    every MoE layer. Equals :func:`total_params` for a dense model."""
    if not model.is_moe:
        return total_params(model)
    skipped = (model.num_experts - model.moe_top_k) * one_expert_params(model)
    return total_params(model) - model.num_moe_layers * skipped
