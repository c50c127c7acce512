"""Model FLOPs: the useful arithmetic of one training step, as MFU and model TFLOP/s count it.

Convention (one function per term below): Narayanan et al. 2021 ("Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM", appendix) as implemented today by Megatron-LM
``megatron/training/training.py::num_floating_point_operations`` (MLM HEAD d98e8a64) and
Megatron-Bridge ``src/megatron/bridge/training/utils/flop_utils.py`` (067f987df):

* every GEMM costs ``2 m n k`` FLOPs forward and twice that backward (dgrad + wgrad), so a token
  costs ``3 x 2 x (matmul parameters it touches)``;
* core attention (``QK^T`` and ``PV``) is causal: a token attends on average to ``s/2`` keys
  (sliding-window layers: ``W - W (W - 1) / (2 s)``, Megatron-Bridge's exact average);
* mixture of experts counts the ``k`` routed experts a token visits plus the shared experts; the
  router (``h x E``, under 0.1 % of the total) is not counted, as in Megatron;
* the logits GEMM uses Megatron's padded vocabulary (a multiple of ``128 x tp``); the embedding
  lookup is not a GEMM and is not counted; norms, activations and softmax are not counted;
* multi-token-prediction modules count as one more layer of the last layer's kind plus their
  ``2h x h`` projection and another logits GEMM (Megatron counts them when ``mtp_num_layers`` is set);
* recomputation is excluded (that is hardware FLOPs, not model FLOPs);
* a layer is the sum of its blocks (``oracle/layers.py::kind_blocks``: a hybrid model's
  layers are one block each); a Mamba-2 mixer counts ``in_proj``, ``out_proj`` and Megatron's
  ``7 d_inner N`` per token for the scan (``hybrid_flops`` / ``mamba_layer_flops``, with the
  model's own ``d_inner = H P`` where Megatron assumes ``2 h``); a latent MoE's routed experts
  run on the latent width and add the ``h x L`` up and down projections (``moe_layer_flops``).

Known convention differences in published numbers (documented, not corrected for):
MosaicML llm-foundry counts attention non-causally (``6N + 12 L h s`` per token) and the SC21
Megatron table counts the recompute forward (hardware FLOPs); both give larger numbers than this.

Symbols: h hidden, a heads, g KV heads, d head dim, f FFN width, V vocabulary, E experts, k top-k,
s sequence length, L layers.
"""

from __future__ import annotations

from tune_cp.config.specs import ModelSpec
from tune_cp.oracle import params as P
from tune_cp.oracle.layers import Block, kind_blocks, layer_kinds

#: forward (1) + backward dgrad (1) + backward wgrad (1) GEMMs per forward GEMM.
FWD_BWD_FACTOR = 3
#: FLOPs per multiply-accumulate.
FMA = 2


def mlp_matmul_params(model: ModelSpec, ffn: int) -> int:
    """Matmul weights of one MLP of width ``ffn`` (biases excluded): ``h x ffn`` per projection,
    three projections when gated (SwiGLU), two otherwise."""
    return model.hidden_size * ffn * (3 if model.gated_mlp else 2)


def attention_projection_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of one layer's attention projections.

    GQA/MHA: QKV ``h (a + 2 g) d`` and output ``a d h``. MLA (DeepSeek-V3), exactly as Megatron
    counts it (including its ``+1`` per latent for the latent norms): q ``q_lora (h + a (d_nope +
    d_rope) + 1)`` (or ``h a (d_nope + d_rope)`` without a q latent), kv ``kv_lora (h + a (d_nope +
    d_v) + 1) + h d_rope``, output ``a d_v h``.
    """
    h, a = model.hidden_size, model.num_attention_heads
    if model.mla is not None:
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = m.q_lora_rank * (h + a * qk + 1) if m.q_lora_rank else h * a * qk
        kv = m.kv_lora_rank * (h + a * (m.qk_nope_head_dim + m.v_head_dim) + 1)
        kv += h * m.qk_rope_head_dim
        return FMA * (q + kv + a * m.v_head_dim * h)
    d, g = model.head_dim, model.num_kv_heads
    return FMA * (h * (a + 2 * g) * d + a * d * h)


def attention_context(model: ModelSpec, seq_len: int, sliding: bool) -> float:
    """Average number of keys one query attends to: ``s / 2`` (causal), or for a sliding-window
    layer of window ``W`` (the HF ``sliding_window`` plus the token itself, Megatron-Bridge's
    ``window_size + 1``): ``W - W (W - 1) / (2 s)`` when ``W < s``."""
    if sliding and model.sliding_window:
        w = model.sliding_window + 1
        if w < seq_len:
            return w - w * (w - 1) / (2 * seq_len)
    return seq_len / 2


def core_attention_flops(model: ModelSpec, seq_len: int, sliding: bool = False) -> float:
    """Forward FLOPs per token of one layer's core attention (``QK^T`` and ``PV``):
    ``2 a (d_qk + d_v) x context`` with context from :func:`attention_context`
    (= ``2 a d s`` for causal GQA, Megatron's ``4 a d s / 2``)."""
    a = model.num_attention_heads
    if model.mla is not None:
        d_qk = model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim
        d_v = model.mla.v_head_dim
    else:
        d_qk = d_v = model.head_dim
    return FMA * a * (d_qk + d_v) * attention_context(model, seq_len, sliding)


def dense_mlp_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of one dense MLP: ``2 x mlp_matmul_params(f)``."""
    return FMA * mlp_matmul_params(model, model.ffn_hidden_size)


def moe_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of one MoE block: ``k`` routed experts plus the shared experts
    (``n_s f_s`` wide); the router is not counted (Megatron convention). A latent MoE's experts
    run ``L x f_e`` and it adds the ``h x L`` and ``L x h`` projections."""
    latent = model.moe_latent_size
    per_expert = mlp_matmul_params(model, model.expert_ffn_hidden_size)
    if latent:
        per_expert = per_expert * latent // model.hidden_size
    routed = model.moe_top_k * per_expert + 2 * model.hidden_size * latent
    shared = mlp_matmul_params(
        model, model.num_shared_experts * model.shared_expert_ffn_hidden_size
    )
    return FMA * (routed + shared)


#: Megatron-LM ``training.py::mamba_layer_flops``: the SSM scan counts ``7 d_inner N`` FLOPs per
#: token ("flops estimate for scan should be updated based on new SSD kernels, but small
#: percent of overall layer flops").
MAMBA_SCAN_FLOPS_PER_STATE = 7


#: Megatron-LM ``mamba_layer_flops`` takes ``d_in = 2 h`` (Mamba's default expand of 2) whatever
#: the mixer's heads: the model TFLOP/s Megatron-Bridge publishes for Nemotron 3 Nano
#: (``d_inner = 64 x 64 = 4096 = 1.52 h``) are counted so (published_runs.csv rows 28, 57, ...).
MEGATRON_MAMBA_EXPAND = 2


def mamba_flops(model: ModelSpec) -> float:
    """Forward model FLOPs per token of one Mamba-2 mixer as Megatron counts them: ``in_proj``
    ``h x (2 d_in + 2 G N + H)``, ``out_proj`` ``d_in x h`` and the scan estimate
    (:data:`MAMBA_SCAN_FLOPS_PER_STATE` ``x d_in x N``), with Megatron's ``d_in = 2 h``
    (:data:`MEGATRON_MAMBA_EXPAND`; the time model uses the real ``d_inner = H P``)."""
    m = model.mamba
    assert m is not None
    h, n = model.hidden_size, m.state_dim
    di = MEGATRON_MAMBA_EXPAND * h
    proj = h * (2 * di + 2 * m.num_groups * n + m.num_heads) + di * h
    return FMA * proj + MAMBA_SCAN_FLOPS_PER_STATE * di * n


def logits_flops(model: ModelSpec, tp: int = 1) -> float:
    """Forward FLOPs per token of the output layer over Megatron's padded vocabulary."""
    return FMA * model.hidden_size * P.padded_vocab_size(model.vocab_size, tp)


def mtp_extra_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token an MTP module adds beside its transformer layer and logits:
    Megatron's ``3 h + 2 h h`` (norms and the ``2h -> h`` projection)."""
    h = model.hidden_size
    return FMA * (3 * h + 2 * h * h)


def layer_is_sliding(model: ModelSpec, layer: int) -> bool:
    """Sliding-window layers alternate with full-attention layers (GPT-OSS: even layers slide),
    ``num_sliding_window_layers`` of them."""
    if not model.sliding_window or not model.num_sliding_window_layers:
        return False
    if model.num_sliding_window_layers >= model.num_layers:
        return True
    return layer % 2 == 0 and layer // 2 < model.num_sliding_window_layers


def layer_forward_flops(model: ModelSpec, layer: int, seq_len: int) -> float:
    """Forward model FLOPs per token of decoder layer ``layer`` (0-based): the sum of its blocks
    (``oracle/layers.py``)."""
    total = 0.0
    for block in kind_blocks(model, layer_kinds(model)[layer]):
        if block is Block.ATTENTION:
            total += attention_projection_flops(model) + core_attention_flops(
                model, seq_len, layer_is_sliding(model, layer))
        elif block is Block.MLP:
            total += dense_mlp_flops(model)
        elif block is Block.MOE:
            total += moe_flops(model)
        else:
            total += mamba_flops(model)
    return total


def forward_flops_per_token(model: ModelSpec, seq_len: int, tp: int = 1) -> float:
    """Forward model FLOPs per token of the whole model (decoder layers, MTP modules, logits)."""
    total = sum(layer_forward_flops(model, i, seq_len) for i in range(model.num_layers))
    if model.num_mtp_layers:
        last = layer_forward_flops(model, model.num_layers - 1, seq_len)
        if model.is_hybrid:  # an MTP depth is attention + the last layer's MoE/MLP block
            last += attention_projection_flops(model) + core_attention_flops(model, seq_len)
        total += model.num_mtp_layers * (last + mtp_extra_flops(model))
    total += (1 + model.num_mtp_layers) * logits_flops(model, tp)
    return total


def model_flops_per_token(model: ModelSpec, seq_len: int, tp: int = 1) -> float:
    """Model FLOPs per trained token: forward plus backward, ``3 x`` forward."""
    return FWD_BWD_FACTOR * forward_flops_per_token(model, seq_len, tp)
