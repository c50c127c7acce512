"""Model-shape arguments -> :class:`config.specs.ModelSpec`, for launches imported without
``--model``.

Defaults for the shape flags not given: Megatron-LM ``arguments.py`` / ``TransformerConfig`` at
NVIDIA/Megatron-LM ``d98e8a64dd`` (LayerNorm, GELU, tied embeddings, biases in every linear layer,
learned absolute positions, dropout 0.1); Primus ``primus/configs/models/megatron/
language_model.yaml`` at AMD-AGI/Primus ``fd1eeabbad`` (SwiGLU, untied, no biases). The vocabulary
size comes from ``--vocab-size`` or, when the tokenizer is a catalog model's Hugging Face name,
from the catalog.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tune_cp.config.specs import (
    ConfigError,
    MlaSpec,
    ModelSpec,
    NormKind,
    PositionEmbedding,
    Spec,
    validation_message,
)
from tune_cp.formats.keys import (
    FRAMEWORK_NAME,
    Flavor,
    RawArgs,
    fmt_value,
    layer_pattern,
    spell,
)
from tune_cp.oracle.catalog import model_entries

# Model-shape defaults for flags not given (same sources; Primus: language_model.yaml).
MODEL_DEFAULTS: dict[Flavor, dict[str, Any]] = {
    Flavor.MEGATRON: {
        "swiglu": False, "normalization": "LayerNorm", "untie_embeddings_and_output_weights": False,
        "add_bias_linear": True, "add_qkv_bias": False, "qk_layernorm": False,
        "position_embedding_type": "learned_absolute", "hidden_dropout": 0.1,
        "attention_dropout": 0.1, "group_query_attention": False, "moe_router_topk": 2,
        "moe_layer_freq": 1, "multi_latent_attention": False, "kv_lora_rank": 32,
        "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128,
        "moe_router_enable_expert_bias": False,
        # TransformerConfig defaults of the Mamba-2 mixer (mamba_state_dim, mamba_head_dim,
        # mamba_num_groups; mamba_num_heads None: d_inner / head_dim with d_inner = 2 h)
        "mamba_state_dim": 128, "mamba_head_dim": 64, "mamba_num_groups": 8,
    },
    Flavor.PRIMUS: {
        "swiglu": True, "normalization": "LayerNorm", "untie_embeddings_and_output_weights": True,
        "add_bias_linear": False, "add_qkv_bias": False, "qk_layernorm": False,
        "position_embedding_type": "learned_absolute", "hidden_dropout": 0.1,
        "attention_dropout": 0.1, "group_query_attention": False, "moe_router_topk": 2,
        "moe_layer_freq": 1, "multi_latent_attention": False, "kv_lora_rank": 32,
        "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128,
        "moe_router_enable_expert_bias": False,
    },
}

# Feature switches whose default (off, or every layer MoE) needs no statement.
QUIET_MODEL_DEFAULTS = frozenset({
    "multi_latent_attention", "add_qkv_bias", "qk_layernorm", "moe_router_enable_expert_bias",
    "moe_layer_freq",
})

FFN_ROUND = 64  # Megatron-LM rounds the SwiGLU default ffn size down to a multiple of 64
FFN_EXPANSION = 4  # default ffn_hidden_size = 4 h
SWIGLU_SHRINK = (2, 3)  # ... times 2/3 with SwiGLU (same parameter count as a 4h GELU MLP)
ROPE_KINDS = frozenset({"rope", "yarn", "mrope"})


class ImportedArchitecture(Spec):
    """Model-shape arguments as given (Megatron-LM names; None: not given)."""

    num_layers: int | None = None
    hidden_size: int | None = None
    ffn_hidden_size: int | None = None
    num_attention_heads: int | None = None
    group_query_attention: bool | None = None
    num_query_groups: int | None = None
    kv_channels: int | None = None
    num_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_router_topk: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_layer_freq: int | str | None = None
    moe_router_enable_expert_bias: bool | None = None
    swiglu: bool | None = None
    normalization: str | None = None
    untie_embeddings_and_output_weights: bool | None = None
    add_bias_linear: bool | None = None
    add_qkv_bias: bool | None = None
    qk_layernorm: bool | None = None
    vocab_size: int | None = None
    padded_vocab_size: int | None = None
    max_position_embeddings: int | None = None
    position_embedding_type: str | None = None
    hidden_dropout: float | None = None
    attention_dropout: float | None = None
    multi_latent_attention: bool | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_head_dim: int | None = None
    qk_pos_emb_head_dim: int | None = None
    v_head_dim: int | None = None
    mtp_num_layers: int | None = None
    tokenizer_model: str | None = None
    tokenizer_type: str | None = None
    rotary_base: float | None = None
    use_rope_scaling: bool | None = None
    rope_scaling_factor: float | None = None
    rotary_scaling_factor: float | None = None
    yarn_original_max_position_embeddings: int | None = None
    norm_epsilon: float | None = None
    quick_geglu: bool | None = None
    squared_relu: bool | None = None
    activation_func_clamp_value: float | None = None
    glu_linear_offset: float | None = None
    window_size: str | None = None
    window_attn_skip_freq: str | None = None
    softmax_type: str | None = None
    moe_shared_expert_gate: bool | None = None
    moe_router_score_function: str | None = None
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    moe_router_topk_scaling_factor: float | None = None
    hybrid_layer_pattern: str | None = None
    hybrid_override_pattern: str | None = None
    is_hybrid_model: bool | None = None
    mamba_state_dim: int | None = None
    mamba_head_dim: int | None = None
    mamba_num_groups: int | None = None
    mamba_num_heads: int | None = None
    moe_latent_size: int | None = None


def _spell(raw: RawArgs, dest: str) -> str:
    return spell(dest, raw.flavor)


TOKENIZERS_FILE = Path(__file__).parent / "data" / "tokenizers.json"


@cache
def tokenizer_table() -> list[dict[str, Any]]:
    """The tokenizer -> vocabulary size table (``data/tokenizers.json``, sources per entry)."""
    return json.loads(TOKENIZERS_FILE.read_text())["tokenizers"]


def vocab_from_tokenizer(tokenizer_type: str | None, tokenizer_model: str | None,
                         has_vocab_files: bool) -> tuple[int, str] | None:
    """The vocabulary size of a named tokenizer and a statement of where it comes from: the
    model name first (``--tokenizer-model``: a catalog model, then the table), then the type
    (``--vocab-file`` with ``--merge-file`` and no type is GPT-2 BPE, Megatron-LM's legacy
    default)."""
    if tokenizer_model:
        twin = catalog_by_tokenizer(tokenizer_model)
        if twin is not None:
            return twin.vocab_size, f"the catalog model {twin.name}"
        for entry in tokenizer_table():
            pattern = entry.get("model")
            if pattern and re.fullmatch(pattern, tokenizer_model.strip(), re.I):
                return entry["vocab_size"], f"{entry['name']}: {entry['source']}"
    kind = tokenizer_type or ("GPT2BPETokenizer" if has_vocab_files else None)
    for entry in tokenizer_table():
        if kind and entry.get("type") == kind:
            return entry["vocab_size"], f"{entry['name']}: {entry['source']}"
    return None


def catalog_by_tokenizer(name: str | None) -> ModelSpec | None:
    """The catalog model whose name or alias is the tokenizer's Hugging Face name."""
    if not name:
        return None
    key = name.strip().lower()
    for canonical, entry in model_entries().items():
        if key == canonical or key in (a.lower() for a in entry.aliases):
            return entry.to_spec()
    return None


def build_model(raw: RawArgs, arch: ImportedArchitecture, name: str,
                source: str) -> tuple[ModelSpec | None, str, list[str]]:
    """A ModelSpec from model-shape arguments with the framework's defaults for the shape flags
    not given, and the defaults it used (as statements); None and the reason when the shape is
    incomplete. Megatron-LM derivations: ffn_hidden_size = 4h (SwiGLU: int(4h x 2/3 / 64) x 64,
    arguments.py), kv_channels = h / a, moe_ffn_hidden_size = ffn_hidden_size, routed-expert
    router bias unless --disable-bias-linear (theoretical_memory_usage.py)."""
    required = ("num_layers", "hidden_size", "num_attention_heads")
    absent = [_spell(raw, d) for d in required if getattr(arch, d) is None]
    if absent:
        return None, f"no {', '.join(absent)}", []
    vocab = arch.vocab_size or arch.padded_vocab_size
    vocab_note = ""
    if vocab is None:
        found = vocab_from_tokenizer(arch.tokenizer_type, arch.tokenizer_model,
                                     raw.has_vocab_files)
        if found is None:
            named = " / ".join(repr(t) for t in (arch.tokenizer_type, arch.tokenizer_model) if t)
            tok = f"tokenizer {named} is not in tune-cp's tokenizer table" if named else \
                f"no {_spell(raw, 'tokenizer_model')} either"
            return None, (f"the vocabulary size is unknown: no {_spell(raw, 'vocab_size')}, "
                          f"and {tok}; add {_spell(raw, 'vocab_size')} N, or pass --model"), []
        vocab, origin_text = found
        shown = arch.tokenizer_model or arch.tokenizer_type or "--vocab-file/--merge-file"
        vocab_note = f"vocab_size: {vocab} (tokenizer {shown}; {origin_text})"
    stated: list[str] = []
    fdefaults = MODEL_DEFAULTS[raw.flavor]
    origin = FRAMEWORK_NAME[raw.flavor]

    def get(dest: str) -> Any:
        value = getattr(arch, dest)
        if value is None:
            value = fdefaults.get(dest)
            if dest not in QUIET_MODEL_DEFAULTS:
                stated.append(f"{dest}: {fmt_value(value)} ({origin} default)")
        return value

    h, a, layers = arch.hidden_size, arch.num_attention_heads, arch.num_layers
    assert h is not None and a is not None and layers is not None
    features, refused = model_features(raw, arch, layers)
    if refused:
        return None, refused, []
    swiglu = get("swiglu") or bool(arch.quick_geglu)
    ffn = arch.ffn_hidden_size
    if ffn is None:
        ffn = FFN_EXPANSION * h
        if swiglu:
            ffn = ffn * SWIGLU_SHRINK[0] // SWIGLU_SHRINK[1] // FFN_ROUND * FFN_ROUND
        stated.append(f"ffn_hidden_size: {ffn} ({origin} default for hidden_size {h})")
    mla = None
    if get("multi_latent_attention"):
        try:
            mla = MlaSpec(q_lora_rank=arch.q_lora_rank or 0, kv_lora_rank=get("kv_lora_rank"),
                          qk_nope_head_dim=get("qk_head_dim"),
                          qk_rope_head_dim=get("qk_pos_emb_head_dim"),
                          v_head_dim=get("v_head_dim"))
        except ValidationError as e:
            raise ConfigError(f"the multi-latent attention described by the {source} is not "
                              f"valid: {validation_message(e)}") from e
        kv_heads, head_dim = a, mla.qk_nope_head_dim + mla.qk_rope_head_dim
    else:
        kv_heads = arch.num_query_groups if get("group_query_attention") else a
        kv_heads = kv_heads or a
        head_dim = arch.kv_channels or h // a
    bias = get("add_bias_linear")
    position = get("position_embedding_type")
    hybrid, refused = hybrid_fields(raw, arch, h, get)
    if refused:
        return None, refused, []
    spec: dict[str, Any] = {
        "name": name,
        "num_layers": layers, "hidden_size": h, "ffn_hidden_size": ffn,
        "num_attention_heads": a, "num_kv_heads": kv_heads, "head_dim": head_dim,
        "vocab_size": vocab, "mla": mla,
        "tied_embeddings": not get("untie_embeddings_and_output_weights"),
        "norm": NormKind.RMSNORM if get("normalization") == "RMSNorm" else NormKind.LAYERNORM,
        "gated_mlp": bool(swiglu),
        "qkv_bias": bool(bias or get("add_qkv_bias")), "attn_out_bias": bool(bias),
        "mlp_bias": bool(bias), "qk_norm": bool(get("qk_layernorm")),
        "position_embedding": (PositionEmbedding.LEARNED if position == "learned_absolute"
                               else PositionEmbedding.NONE if position == "none"
                               else PositionEmbedding.ROPE),
        # only a learned table has positions to count; rope models keep 0 (as the catalog)
        "max_position_embeddings": (arch.max_position_embeddings or 0)
        if position == "learned_absolute" else 0,
        "attention_dropout": get("attention_dropout"), "hidden_dropout": get("hidden_dropout"),
        "num_mtp_layers": arch.mtp_num_layers or 0,
        "source": source,
        **features,
        **hybrid,
    }
    for field_name, dest in (("default_seq_len", "seq_length"),
                             ("default_global_batch_size", "global_batch_size")):
        if raw.has(dest):
            spec[field_name] = raw.read(dest)
    if position not in ROPE_KINDS | {"learned_absolute", "none"}:
        raw.note(f"position_embedding_type {position} is modeled like rope (no position "
                   "parameters)")
    if hybrid:
        spec["num_layers"] = len(hybrid["hybrid_pattern"])
        if "-" not in hybrid["hybrid_pattern"] and arch.ffn_hidden_size is None:
            spec["ffn_hidden_size"] = 0  # no MLP layer: the dense width is unused
    if arch.num_experts:
        freq = get("moe_layer_freq") if not hybrid else 1
        dense = leading_dense_layers(freq, layers)
        if dense is None:
            return None, (f"{_spell(raw, 'moe_layer_freq')} {freq} interleaves dense and MoE "
                          "layers, which tune-cp does not model (only leading dense layers)"), []
        spec |= {
            "num_experts": arch.num_experts, "moe_top_k": get("moe_router_topk"),
            "expert_ffn_hidden_size": arch.moe_ffn_hidden_size or ffn,
            "num_dense_layers": dense, "router_bias": bool(bias),
            "router_expert_bias": bool(get("moe_router_enable_expert_bias")),
        }
        if arch.moe_ffn_hidden_size is None:
            stated.append(f"moe_ffn_hidden_size: {ffn} ({origin} default: ffn_hidden_size)")
        if arch.ffn_hidden_size is None and dense == 0:
            spec["ffn_hidden_size"] = 0  # every layer is MoE: the dense MLP width is unused
            stated.remove(f"ffn_hidden_size: {ffn} ({origin} default for hidden_size {h})")
        if arch.moe_shared_expert_intermediate_size:
            spec |= {"num_shared_experts": 1,
                     "shared_expert_ffn_hidden_size": arch.moe_shared_expert_intermediate_size}
    if spec["position_embedding"] is PositionEmbedding.LEARNED and not spec[
            "max_position_embeddings"]:
        return None, (f"learned position embeddings ({_spell(raw, 'position_embedding_type')} "
                      f"learned_absolute) need {_spell(raw, 'max_position_embeddings')}"), []
    try:
        built = ModelSpec(**spec)
    except ValidationError as e:
        raise ConfigError(f"the model described by the {source} is not valid: "
                          f"{validation_message(e)}") from e
    return built, "", stated + ([vocab_note] if vocab_note else [])


LLAMA3_ORIGINAL_POSITIONS = 8192  # megatron/core/models/common/embeddings/rope_utils.py
MEGATRON_ROPE_SCALING_FACTOR = 8.0  # arguments.py --rope-scaling-factor default


def sliding_layers(raw: RawArgs, arch: ImportedArchitecture, layers: int) -> tuple[int, int, str]:
    """(window, sliding layers, refusal) from ``--window-size L,R`` and
    ``--window-attn-skip-freq N`` (``megatron/core/transformer/utils.py::
    is_layer_window_attention``: layer n, 1-based, is windowed unless ``n % N == 0``; without N
    every layer is). The window in tune-cp's (Hugging Face) convention counts the token itself:
    ``L + 1``."""
    if not arch.window_size or str(arch.window_size).strip().lower() in ("none", "null"):
        return 0, 0, ""
    parts = [p for p in str(arch.window_size).strip("()[] ").replace(" ", "").split(",") if p]
    try:
        left, right = (int(parts[0]), int(parts[1])) if len(parts) == 2 else (int(parts[0]), 0)
    except ValueError:
        raise raw.fail("window_size", arch.window_size, "write LEFT,RIGHT (for example 127,0)"
                       ) from None
    if right != 0 or left < 0:
        return 0, 0, (f"{_spell(raw, 'window_size')} {arch.window_size}: only causal windows "
                      "(LEFT,0) are modelled")
    freq = arch.window_attn_skip_freq
    if freq is None:
        return left + 1, layers, ""
    if str(freq).strip().isdigit() and int(freq) >= 1:
        n = int(freq)
        count = layers - layers // n
        if n == 1:
            return 0, 0, ""
        if n == 2:
            return left + 1, count, ""
    pattern = layer_pattern(str(freq))  # a list: 1 where the layer is windowed
    if pattern is not None and len(pattern) == layers:
        if all(pattern):
            return left + 1, layers, ""
        if [bool(v) for v in pattern] == [i % 2 == 0 for i in range(layers)]:
            return left + 1, layers - layers // 2, ""
    return 0, 0, (f"{_spell(raw, 'window_attn_skip_freq')} {freq}: tune-cp models sliding "
                  "windows on every layer or on every other layer (2)")


def hybrid_fields(raw: RawArgs, arch: ImportedArchitecture, hidden: int,
                  get: Any) -> tuple[dict[str, Any], str]:
    """ModelSpec fields of a hybrid Mamba model (``hybrid_pattern``, ``mamba``, the latent MoE
    width) from ``--hybrid-layer-pattern`` / ``--hybrid-override-pattern`` and the
    ``--mamba-*`` flags (Megatron-Core defaults for the ones not given; ``mamba_num_heads``:
    ``2 h / mamba_head_dim``, ``MambaMixer``'s ``d_inner = expand x d_model``), and a refusal
    reason (empty when none). Empty fields for a transformer."""
    out: dict[str, Any] = {}
    if arch.moe_latent_size:
        out["moe_latent_size"] = arch.moe_latent_size
    pattern = arch.hybrid_layer_pattern or arch.hybrid_override_pattern
    if not pattern:
        if arch.is_hybrid_model:
            return {}, (f"{_spell(raw, 'is_hybrid_model')} without a layer pattern (the "
                        "attention / MLP ratios of Megatron-LM's allocation) is not modelled; "
                        f"give {_spell(raw, 'hybrid_layer_pattern')}")
        return out, ""
    main, *mtp = pattern.split("/")
    if "|" in main:
        return {}, (f"hybrid layer pattern {pattern!r} has pipeline-stage separators ('|'), "
                    "which tune-cp does not model (it splits the pattern evenly)")
    if mtp:
        want = "*" + main[-1:]
        if any(p != want for p in mtp) or (arch.mtp_num_layers or len(mtp)) != len(mtp):
            return {}, (f"hybrid MTP pattern {'/'.join(mtp)!r}: tune-cp models MTP depths of "
                        f"attention + the last layer's block ({want!r} each, as many as "
                        f"{_spell(raw, 'mtp_num_layers')})")
        out["num_mtp_layers"] = len(mtp)
    flag = _spell(raw, "hybrid_layer_pattern" if arch.hybrid_layer_pattern
                  else "hybrid_override_pattern")
    if bad := sorted(set(main) - set("M*-E")):
        return {}, (f"{flag} {main!r} has {', '.join(map(repr, bad))}; each character is one "
                    f"of M (Mamba), * (attention), - (MLP), E (MoE)")
    if arch.num_layers is not None and arch.num_layers != len(main):
        # Megatron-Core hybrid_allocate.py: "The hybrid override pattern is the wrong length"
        return {}, (f"{flag} has {len(main)} layers, {_spell(raw, 'num_layers')} is "
                    f"{arch.num_layers}; they must agree")
    pattern = main
    head_dim = get("mamba_head_dim")
    from tune_cp.config.specs import MambaSpec

    try:
        mamba = MambaSpec(state_dim=get("mamba_state_dim"), head_dim=head_dim,
                          num_heads=arch.mamba_num_heads or 2 * hidden // head_dim,
                          num_groups=get("mamba_num_groups")) if "M" in pattern else None
    except ValidationError as e:
        return {}, f"the Mamba mixer is not valid: {validation_message(e)}"
    out |= {"hybrid_pattern": pattern, "mamba": mamba}
    return out, ""


def model_features(raw: RawArgs, arch: ImportedArchitecture,
                   layers: int) -> tuple[dict[str, Any], str]:
    """ModelSpec fields of the settings that define the model beyond its shape (rope, norm
    epsilon, activation, sliding window, attention sinks, router), and a refusal reason for a
    setting tune-cp does not model (empty when none)."""
    out: dict[str, Any] = {}
    if arch.rotary_base is not None:
        out["rotary_base"] = arch.rotary_base
    if arch.position_embedding_type == "yarn":
        out |= {"rope_scaling": "yarn", "rope_scaling_factor": arch.rotary_scaling_factor or 1.0,
                "rope_original_max_position_embeddings":
                    arch.yarn_original_max_position_embeddings or 0}
    elif arch.use_rope_scaling:
        out |= {"rope_scaling": "llama3",
                "rope_scaling_factor": arch.rope_scaling_factor or MEGATRON_ROPE_SCALING_FACTOR,
                "rope_original_max_position_embeddings": LLAMA3_ORIGINAL_POSITIONS}
    if arch.norm_epsilon is not None:
        out["norm_epsilon"] = arch.norm_epsilon
    if arch.quick_geglu and arch.squared_relu:
        return {}, "quick_geglu and squared_relu are both on; Megatron-LM takes one activation"
    if arch.quick_geglu:
        out |= {"activation": "quick_geglu", "gated_mlp": True}
    elif arch.squared_relu:
        out["activation"] = "squared_relu"
    if arch.activation_func_clamp_value:
        out["activation_clamp"] = arch.activation_func_clamp_value
    if arch.glu_linear_offset:
        out["glu_linear_offset"] = arch.glu_linear_offset
    window, count, refused = sliding_layers(raw, arch, layers)
    if refused:
        return {}, refused
    if window:
        out |= {"sliding_window": window, "num_sliding_window_layers": count}
    if arch.softmax_type == "learnable":
        out["attention_sinks"] = True
    elif arch.softmax_type == "off-by-one":
        raw.note("softmax_type off-by-one is modelled like the vanilla softmax (one extra zero "
                 "logit per row; no parameters)")
    if arch.moe_shared_expert_gate:
        out["shared_expert_gate"] = True
    if arch.moe_router_score_function:
        out["router_score"] = arch.moe_router_score_function
    if arch.moe_router_num_groups:
        out["router_num_groups"] = arch.moe_router_num_groups
    if arch.moe_router_group_topk:
        out["router_group_topk"] = arch.moe_router_group_topk
    if arch.moe_router_topk_scaling_factor:
        out["router_topk_scaling_factor"] = arch.moe_router_topk_scaling_factor
    return out, ""


def leading_dense_layers(freq: int | str, num_layers: int) -> int | None:
    """Leading dense layers of ``moe_layer_freq`` (1: none); None when dense and MoE layers
    interleave (``arguments.py::moe_freq_type``: N means layer i is MoE iff i % N == 0)."""
    if isinstance(freq, int) or (isinstance(freq, str) and freq.strip().isdigit()):
        return 0 if int(freq) == 1 else None
    pattern = layer_pattern(str(freq))
    if pattern is None or len(pattern) != num_layers or set(pattern) - {0, 1}:
        return None
    dense = pattern.index(1) if 1 in pattern else num_layers
    return dense if all(pattern[dense:]) else None


def compare_model(raw: RawArgs, arch: ImportedArchitecture, model: ModelSpec) -> None:
    """Note where the arguments' model shape differs from the model given with --model."""
    pairs = {
        "num_layers": model.num_layers, "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "ffn_hidden_size": model.ffn_hidden_size or None,
        "num_experts": model.num_experts, "moe_router_topk": model.moe_top_k or None,
        "moe_ffn_hidden_size": model.expert_ffn_hidden_size or None,
        "vocab_size": model.vocab_size,
    }
    if arch.group_query_attention:
        pairs["num_query_groups"] = model.num_kv_heads
    pairs |= {"rotary_base": model.rotary_base, "norm_epsilon": model.norm_epsilon,
              "moe_router_score_function": model.router_score.value if model.is_moe else None,
              "moe_router_topk_scaling_factor":
                  model.router_topk_scaling_factor if model.is_moe else None}
    for dest, expected in pairs.items():
        got = getattr(arch, dest)
        if got is not None and expected is not None and got != expected:
            raw.note(f"{raw.label(dest)} {got} differs from {model.name}'s {expected}; tune-cp "
                       f"uses {model.name}")
