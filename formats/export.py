"""Write a configuration the way each framework launches it.

* :func:`to_megatron_args` — Megatron-LM command-line flags, one per line with ``\\``
  continuations, spelled as ``megatron/training/arguments.py`` and the dataclasses it turns into
  flags spell them (NVIDIA/Megatron-LM ``d98e8a64dd``). Virtual stages use
  ``--num-virtual-stages-per-pipeline-rank`` (Megatron-LM has no
  ``--virtual-pipeline-model-parallel-size``).
* :func:`to_primus_overrides` — a Primus experiment fragment (``modules.pre_trainer.overrides``,
  Megatron argument names with underscores, as in AMD-AGI/Primus
  ``examples/megatron/configs/*/*.yaml`` at ``fd1eeabbad``).
* :func:`to_nemo_overrides` — Python assignments to the ``ConfigContainer`` a Megatron-Bridge
  recipe returns (``cfg.model.*``, ``cfg.train.*``, ``cfg.ddp.*``, ``cfg.optimizer.*``,
  ``cfg.dataset.*``, ``cfg.mixed_precision``), the idiom of the recipes under
  ``src/megatron/bridge/recipes/`` (NVIDIA-NeMo/Megatron-Bridge ``067f987df0``). Python lines, not
  Hydra-style ``key=value`` overrides: they run as written after the recipe call.

Every exporter writes :func:`canonical_config`: the resolved configuration with the fields that
have several equivalent spellings written one way, so Megatron-LM arguments read back with
:func:`formats.parse_megatron_args` give exactly it.
"""

from __future__ import annotations

import json
import math
import numbers
import re
import shlex
from functools import cache
from pathlib import Path
from typing import Any

from tune_cp.config.axes import KNOB, PLAIN_AXES
from tune_cp.config.specs import (
    DEFAULT_SELECTIVE_MODULES,
    LIGHT_SPLITS,
    Activation,
    ClusterSpec,
    ConfigError,
    Dispatcher,
    FlexBackend,
    Fp8Recipe,
    GroupedGemm,
    ModelSpec,
    ParallelConfig,
    PipelineSplit,
    PositionEmbedding,
    Precision,
    Recompute,
    RecomputeMethod,
    RopeScaling,
    RouterScore,
    Schedule,
    TrainingSpec,
    compute_precision,
    nodes_text,
)
from tune_cp.formats.keys import (
    KNOB_BRIDGE,
    KNOB_DEST,
    PRIMUS_CLI_KEYS,
    Fp8Format,
    megatron_flag,
)
from tune_cp.formats.model import LLAMA3_ORIGINAL_POSITIONS
from tune_cp.oracle.memory import (
    FULL_ITERATION,
    RunOptions,
    pipeline_chunks,
    split_fields,
    split_layout,
    uneven_stage_layers,
)

FP4_FORMAT = "e2m1"  # TransformerConfig.fp4 (--fp4-format): the only FP4 element format
FP4_RECIPE = "nvfp4"  # --fp4-recipe: NVFP4BlockScaling, what Precision.FP4 models
FSDP_STRATEGY = "optim_grads_params"  # full sharding, what tune-cp's fsdp models
#: the checkpoint format Megatron-FSDP needs: Megatron-LM asserts it (arguments.py l.1169-1170 at
#: d98e8a64dd; the default, training_config.py l.486, is torch_dist), Megatron-Bridge when a run
#: saves or loads (training/config.py l.1105-1109 at 067f987df0)
FSDP_CKPT_FORMAT = "fsdp_dtensor"
UNFUSED_BACKEND = "unfused"  # --attention-backend that materialises the attention scores


def max_chunk_layers(model: ModelSpec, cfg: ParallelConfig) -> int:
    """Decoder layers of the largest virtual stage (``cfg`` resolved)."""
    assert cfg.pipeline_split is not None
    stages = pipeline_chunks(model.num_layers, model.num_mtp_layers, cfg.pp, cfg.vpp,
                             cfg.pipeline_split, *split_fields(cfg))
    return max(len(chunk.layers) for stage in stages for chunk in stage)


def written_layout(model: ModelSpec, c: ParallelConfig) -> str | None:
    """The ``--pipeline-model-parallel-layout`` the configuration is written with: its own
    layout, the layout of ``embedding_mtp_loss`` (Megatron-LM's account-for flags give MTP no
    slot: ``oracle/memory.py::split_layout``), else None."""
    if c.pipeline_split is PipelineSplit.EMBEDDING_MTP_LOSS:
        return split_layout(model.num_layers, model.num_mtp_layers, c.pp, c.vpp,
                            c.pipeline_split)
    return c.pipeline_layout


def end_stage_layers(model: ModelSpec, c: ParallelConfig) -> tuple[int | None, int | None]:
    """What ``--decoder-first/last-pipeline-num-layers`` say for the configuration's split
    (the light splits' counts from ``oracle.memory.uneven_stage_layers``); (None, None) for
    the other splits."""
    if c.pipeline_split not in (PipelineSplit.UNEVEN, *LIGHT_SPLITS):
        return None, None
    assert c.pipeline_split is not None
    ends = uneven_stage_layers(model.num_layers, c.pp, c.vpp, c.pipeline_split,
                               c.first_stage_layers, c.last_stage_layers)
    return ends if ends is not None else (None, None)


def canonical_config(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cfg: ParallelConfig
) -> ParallelConfig:
    """``resolve_config(cfg)`` with equivalent spellings written one way.

    Full recompute of every layer (``recompute_layers`` None) becomes the explicit count
    Megatron-LM needs (``--recompute-num-layers`` is required with full recompute): the layers of
    the largest virtual stage for ``block``, 1 for ``uniform`` (Megatron-Core ``recompute.py``: a
    group of one layer each). Fields that do not apply are reset: the recompute method unless
    full, the modules unless selective, the dispatcher and expert-tensor size of a dense model.
    """
    from tune_cp.config.resolve import resolve_config  # numpy: only when a flag line is written

    c = resolve_config(cfg, model, cluster, training)
    update: dict[str, Any] = {}
    if c.recompute is not Recompute.FULL:
        update["recompute_method"] = RecomputeMethod.BLOCK
    elif c.recompute_layers is None:
        block = c.recompute_method is RecomputeMethod.BLOCK
        update["recompute_layers"] = max_chunk_layers(model, c) if block else 1
    if c.recompute is not Recompute.SELECTIVE:
        update["recompute_modules"] = DEFAULT_SELECTIVE_MODULES
    if not model.is_moe:
        update |= {"dispatcher": Dispatcher.ALLTOALL, "etp": c.tp}
    return c.model_copy(update=update)


def fp8_format(recipe: Fp8Recipe) -> Fp8Format:
    """e4m3 for MXFP8 (Megatron-Bridge ``bf16_with_mxfp8_mixed``), hybrid for the per-tensor and
    blockwise recipes (``bf16_with_fp8_{delayed,current,subchannel}_scaling_mixed``)."""
    return Fp8Format.E4M3 if recipe is Fp8Recipe.MXFP8 else Fp8Format.HYBRID


def _refuse_zero_bubble(c: ParallelConfig, framework: str) -> None:
    if c.schedule_ is Schedule.ZERO_BUBBLE:
        raise ConfigError(f"schedule zero_bubble has no {framework} setting (it is Primus's "
                          "zero-bubble runtime): export to primus, or choose schedule "
                          "interleaved or 1f1b")


def _header(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, c: ParallelConfig,
            prefix: str = "# ") -> list[str]:
    recompute = c.recompute.value
    precision = {Precision.FP8: f"fp8 {c.fp8_recipe and c.fp8_recipe.value}",
                 Precision.FP4: f"fp4 {FP4_RECIPE}",
                 Precision.BF16: "bf16"}[compute_precision(training, c)]
    sharding = ("fsdp" if c.fsdp else "distributed optimizer" if c.distributed_optimizer
                else "replicated optimizer")
    if not c.grad_reduce_in_fp32:
        sharding += ", bf16 gradients"
    if c.recompute is Recompute.FULL:
        recompute += f" {c.recompute_method.value} {c.recompute_layers} layer(s)/virtual stage"
    elif c.recompute is Recompute.SELECTIVE:
        recompute += f" ({', '.join(c.recompute_modules)})"
    return [
        f"{prefix}tune-cp: {model.name} on {nodes_text(cluster.num_nodes)} x {cluster.gpus_per_node} "
        f"{cluster.gpu.name} ({cluster.world_size} GPUs), seq {training.seq_len}, "
        f"gbs {training.global_batch_size}, {precision}",
        f"{prefix}{c.label()}, mbs {c.mbs}, ga {c.ga}, recompute {recompute}, {sharding}"
        + (f", {c.dispatcher.value} dispatcher" if model.is_moe else "")
        + f", {c.schedule_.value} schedule",
    ]


# ------------------------------------------------------------------------------ Megatron-LM


def _batch_args(model: ModelSpec, training: TrainingSpec,
                c: ParallelConfig) -> list[tuple[str, Any]]:
    """Batch and sequence arguments, spelled alike by Megatron-LM and Primus; the position
    table is at least the sequence length."""
    return [
        (KNOB_DEST["mbs"], c.mbs),
        ("global_batch_size", training.global_batch_size),
        ("seq_length", training.seq_len),
        ("max_position_embeddings", max(model.max_position_embeddings, training.seq_len)),
    ]


def moe_backend_args(c: ParallelConfig, primus: bool = False) -> list[tuple[str, Any]]:
    """The MoE dispatcher and backend as Megatron-LM arguments (``primus``: with Primus-Turbo's
    keys, ``primus_turbo.yaml``; Megatron-LM has none: :func:`turbo_missing`). Primus-Turbo's
    DeepEP is the flex dispatcher without ``--moe-flex-dispatcher-backend``."""
    out: list[tuple[str, Any]] = [("moe_token_dispatcher_type", c.dispatcher.value)]
    fb = c.flex_backend
    if c.dispatcher is Dispatcher.FLEX and fb is not FlexBackend.TURBO:
        out.append(("moe_flex_dispatcher_backend", (fb or FlexBackend.DEEPEP).value))
    if primus:  # Primus's language_model.yaml turns grouped GEMMs on: say it either way
        out.append(("moe_grouped_gemm", c.grouped_gemm is not GroupedGemm.SEQUENTIAL))
    elif c.grouped_gemm is not GroupedGemm.SEQUENTIAL:
        out.append(("moe_grouped_gemm", True))
    if c.grouped_gemm is GroupedGemm.LEGACY and primus:
        out.append(("moe_use_legacy_grouped_gemm", True))
    if c.permute_fusion:
        out.append(("moe_permute_fusion", True))
    if c.shared_expert_overlap:
        out.append(("moe_shared_expert_overlap", True))
    if c.router_fp32:
        out.append(("moe_router_dtype", "fp32"))
    if primus:
        turbo = (fb is FlexBackend.TURBO, c.grouped_gemm is GroupedGemm.TURBO,
                 c.sync_free_stage > 0)
        if any(turbo):
            out.append(("enable_primus_turbo", True))
        if turbo[0]:
            out.append(("use_turbo_deepep", True))
        if turbo[1]:
            out.append(("use_turbo_grouped_gemm", True))
        if turbo[2]:
            out.append(("turbo_sync_free_moe_stage", c.sync_free_stage))
    return out


def turbo_missing(c: ParallelConfig) -> list[str]:
    """The Primus-Turbo settings Megatron-LM has no arguments for (written by the Primus
    exporter only)."""
    out = []
    if c.grouped_gemm is GroupedGemm.LEGACY:
        out.append("legacy grouped GEMM (--moe-use-legacy-grouped-gemm is gone from Megatron-LM "
                   "d98e8a64; Primus moe_use_legacy_grouped_gemm: true)")
    if c.flex_backend is FlexBackend.TURBO:
        out.append("Primus-Turbo DeepEP (Primus use_turbo_deepep: true)")
    if c.grouped_gemm is GroupedGemm.TURBO:
        out.append("Primus-Turbo grouped GEMM (use_turbo_grouped_gemm: true)")
    if c.sync_free_stage:
        out.append(f"sync-free MoE stage {c.sync_free_stage} (turbo_sync_free_moe_stage)")
    return out


def _dispatcher_and_dtype_args(model: ModelSpec, c: ParallelConfig) -> list[tuple[str, Any]]:
    """The MoE dispatcher (DeepEP behind ``flex``), grouped GEMMs, bf16 and the gradient dtype:
    the same (dest, value) pairs for Megatron-LM and Primus."""
    out: list[tuple[str, Any]] = []
    if model.is_moe:
        out += moe_backend_args(c)
    out.append(("bf16", True))
    if not c.grad_reduce_in_fp32:
        out.append(("grad_reduce_in_bf16", True))
    if c.fp8_param_gather and c.fp8_recipe is not None:
        out.append(("fp8_param_gather", True))
    return out


#: The CUDA-graph implementation tune-cp exports per-layer scopes with (Transformer Engine's
#: ``make_graphed_callables``, what Megatron-Bridge's recipes use; arguments.py
#: ``--cuda-graph-impl``).
PER_LAYER_GRAPH_IMPL = "transformer_engine"


def run_option_args(model: ModelSpec, o: RunOptions | None) -> list[tuple[str, Any]]:
    """Megatron-LM (dest, value) pairs of the framework run settings
    (``config/axes.py::RUN_KNOBS``; arguments.py / TransformerConfig at ``d98e8a64dd``):
    ``--cuda-graph-impl transformer_engine --cuda-graph-modules ...`` or ``--cuda-graph-impl
    full_iteration --no-check-for-nan-in-loss-and-grad`` (required there, cuda_graph.md);
    ``--overlap-moe-expert-parallel-comm --delay-wgrad-compute``; ``--moe-expert-capacity-factor
    C --moe-pad-expert-input-to-capacity``. Nothing for the defaults."""
    o = o or RunOptions()
    out: list[tuple[str, Any]] = []
    if FULL_ITERATION in o.cuda_graph_scope:
        out += [("cuda_graph_impl", FULL_ITERATION), ("check_for_nan_in_loss_and_grad", False)]
    elif o.cuda_graph_scope:
        out += [("cuda_graph_impl", PER_LAYER_GRAPH_IMPL),
                ("cuda_graph_modules", list(o.cuda_graph_scope))]
    return out + moe_run_args(model, o)


def moe_run_args(model: ModelSpec, o: RunOptions) -> list[tuple[str, Any]]:
    """The MoE run settings as Megatron-LM argument names, which Primus takes unchanged: the
    all-to-all overlap (``--overlap-moe-expert-parallel-comm --delay-wgrad-compute``) and
    token-drop (``--moe-expert-capacity-factor F --moe-pad-expert-input-to-capacity``); nothing
    for a dense model or the defaults."""
    out: list[tuple[str, Any]] = []
    if model.is_moe and o.moe_a2a_overlap:
        out += [("overlap_moe_expert_parallel_comm", True), ("delay_wgrad_compute", True)]
    if model.is_moe and o.moe_capacity_factor is not None:
        out += [("moe_expert_capacity_factor", float(o.moe_capacity_factor)),
                ("moe_pad_expert_input_to_capacity", True)]
    return out


def plain_axis_values(c: ParallelConfig, names: dict[str, str]) -> list[tuple[str, Any]]:
    """(framework name, value) of each plain axis (``config/axes.py::PLAIN_AXES``) that has a
    name in ``names`` (``KNOB_DEST``, ``KNOB_BRIDGE``) and a value other than its default: the
    exporters write a plain axis without a line of their own."""
    return [(names[a], getattr(c, a)) for a in PLAIN_AXES
            if a in names and getattr(c, a) != KNOB[a].default]


def megatron_config_args(model: ModelSpec, training: TrainingSpec,
                         c: ParallelConfig) -> list[tuple[str, Any]]:
    """(dest, value) pairs of a canonical configuration; True means a flag without value."""
    out: list[tuple[str, Any]] = [(KNOB_DEST["tp"], c.tp), (KNOB_DEST["pp"], c.pp)]
    layout = written_layout(model, c)
    if layout is not None:  # the layout gives the virtual stages (pp x vpp)
        out.append((KNOB_DEST["pipeline_layout"], layout))
    elif c.vpp > 1:
        out.append((KNOB_DEST["vpp"], c.vpp))
    if c.pipeline_split is PipelineSplit.EMBEDDING_LOSS:
        out += [("account_for_embedding_in_pipeline_split", True),
                ("account_for_loss_in_pipeline_split", True)]
    for field, n in zip(("first_stage_layers", "last_stage_layers"), end_stage_layers(model, c),
                        strict=True):
        if n is not None:
            out.append((KNOB_DEST[field], n))
    out.append((KNOB_DEST["cp"], c.cp))
    out += plain_axis_values(c, KNOB_DEST)
    if model.is_moe or c.ep > 1:
        out.append((KNOB_DEST["ep"], c.ep))
    if model.is_moe:
        out.append((KNOB_DEST["etp"], c.etp_))
    if c.sp:
        out.append(("sequence_parallel", True))
    out += _batch_args(model, training, c)
    if c.recompute is Recompute.FULL:
        out += [("recompute_granularity", "full"), ("recompute_method", c.recompute_method.value),
                ("recompute_num_layers", c.recompute_layers)]
    elif c.recompute is Recompute.SELECTIVE:
        out += [("recompute_granularity", "selective"),
                ("recompute_modules", list(c.recompute_modules))]
    if c.fsdp:
        # Megatron-FSDP v1 runs with the distributed optimizer (arguments.py turns it on)
        out += [("use_megatron_fsdp", True), ("data_parallel_sharding_strategy", FSDP_STRATEGY),
                ("use_distributed_optimizer", True), ("ckpt_format", FSDP_CKPT_FORMAT)]
    elif c.distributed_optimizer:
        out.append(("use_distributed_optimizer", True))
    out.append(("overlap_grad_reduce", True))
    if c.fsdp or c.distributed_optimizer:  # --overlap-param-gather needs one of them
        out.append(("overlap_param_gather", True))
    # Megatron-LM keeps fp32 gradients under --bf16 unless --grad-reduce-in-bf16
    out += _dispatcher_and_dtype_args(model, c)
    if c.fp8_recipe is not None:
        out += [("fp8", fp8_format(c.fp8_recipe).value), ("fp8_recipe", c.fp8_recipe.value)]
    elif compute_precision(training, c) is Precision.FP4:
        out += [("fp4", FP4_FORMAT), ("fp4_recipe", FP4_RECIPE)]
    if not training.flash_attention:
        out.append(("attention_backend", UNFUSED_BACKEND))
    return out


def megatron_model_args(model: ModelSpec) -> tuple[list[tuple[str, Any]], list[str]]:
    """(dest, value) pairs describing the model, and what Megatron-LM flags cannot say."""
    out: list[tuple[str, Any]] = [("num_layers", model.num_layers),
                                  ("hidden_size", model.hidden_size)]
    missing: list[str] = []
    if model.ffn_hidden_size:
        out.append(("ffn_hidden_size", model.ffn_hidden_size))
    elif model.is_moe and model.num_dense_layers:
        missing.append("dense layers without a dense MLP width")
    out.append(("num_attention_heads", model.num_attention_heads))
    if model.mla is not None:
        out.append(("multi_latent_attention", True))
        if model.mla.q_lora_rank:
            out.append(("q_lora_rank", model.mla.q_lora_rank))
        out += [("kv_lora_rank", model.mla.kv_lora_rank),
                ("qk_head_dim", model.mla.qk_nope_head_dim),
                ("qk_pos_emb_head_dim", model.mla.qk_rope_head_dim),
                ("v_head_dim", model.mla.v_head_dim)]
    else:
        if model.num_kv_heads != model.num_attention_heads:
            out += [("group_query_attention", True), ("num_query_groups", model.num_kv_heads)]
        if model.head_dim * model.num_attention_heads != model.hidden_size:
            out.append(("kv_channels", model.head_dim))
    if model.activation is Activation.QUICK_GEGLU:
        out.append(("quick_geglu", True))  # a gated MLP with the quick-GELU gate
        if not model.gated_mlp:
            missing.append("quick-GeGLU without a gated MLP")
    elif model.gated_mlp:
        out.append(("swiglu", True))
    if model.activation is Activation.SQUARED_RELU:
        out.append(("squared_relu", True))
    if model.activation_clamp:
        out.append(("activation_func_clamp_value", model.activation_clamp))
    if model.glu_linear_offset:
        out.append(("glu_linear_offset", model.glu_linear_offset))
    out += [("normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"),
            ("norm_epsilon", model.norm_epsilon)]
    if not model.tied_embeddings:
        out.append(("untie_embeddings_and_output_weights", True))
    biases = (model.qkv_bias, model.attn_out_bias, model.mlp_bias)
    if biases == (False, False, False):
        out.append(("disable_bias_linear", True))
    elif biases == (True, False, False):
        out += [("disable_bias_linear", True), ("add_qkv_bias", True)]
    elif biases != (True, True, True):
        missing.append(f"bias pattern qkv/out/mlp = {biases} (Megatron-LM has all, none or "
                       "QKV only)")
    if model.is_moe and model.router_bias != model.mlp_bias:
        missing.append(f"router bias {model.router_bias} with linear biases {model.mlp_bias}")
    if model.qk_norm:
        out.append(("qk_layernorm", True))
    learned = model.position_embedding is PositionEmbedding.LEARNED
    no_position = model.position_embedding is PositionEmbedding.NONE
    yarn = model.rope_scaling is RopeScaling.YARN
    out.append(("position_embedding_type", "learned_absolute" if learned else "none"
                if no_position else "yarn" if yarn else "rope"))
    if not (learned or no_position):
        out.append(("rotary_base", _number(model.rotary_base)))
    if yarn:
        out.append(("rotary_scaling_factor", model.rope_scaling_factor))
        if model.rope_original_max_position_embeddings:
            out.append(("yarn_original_max_position_embeddings",
                        model.rope_original_max_position_embeddings))
    elif model.rope_scaling is RopeScaling.LLAMA3:
        out += [("use_rope_scaling", True), ("rope_scaling_factor", model.rope_scaling_factor)]
        if model.rope_original_max_position_embeddings not in (0, LLAMA3_ORIGINAL_POSITIONS):
            missing.append(f"llama3 rope scaling from {model.rope_original_max_position_embeddings}"
                           f" positions (Megatron-LM fixes {LLAMA3_ORIGINAL_POSITIONS})")
    out += [("attention_dropout", model.attention_dropout),
            ("hidden_dropout", model.hidden_dropout),
            ("vocab_size", model.vocab_size)]
    if model.is_moe:
        out += [("num_experts", model.num_experts),
                ("moe_ffn_hidden_size", model.expert_ffn_hidden_size),
                ("moe_router_topk", model.moe_top_k)]
        if model.num_shared_experts:
            out.append(("moe_shared_expert_intermediate_size",
                        model.num_shared_experts * model.shared_expert_ffn_hidden_size))
        if model.num_dense_layers:
            dense, moe = model.num_dense_layers, model.num_layers - model.num_dense_layers
            out.append(("moe_layer_freq", f"([0]*{dense}+[1]*{moe})"))
        if model.router_expert_bias:
            out.append(("moe_router_enable_expert_bias", True))
        if model.shared_expert_gate:
            out.append(("moe_shared_expert_gate", True))
        if model.router_score is not RouterScore.SOFTMAX:
            out.append(("moe_router_score_function", model.router_score.value))
        if model.router_num_groups:
            out += [("moe_router_num_groups", model.router_num_groups),
                    ("moe_router_group_topk", model.router_group_topk)]
        if model.router_topk_scaling_factor != 1:
            out.append(("moe_router_topk_scaling_factor", model.router_topk_scaling_factor))
    if model.num_mtp_layers:
        out.append(("mtp_num_layers", model.num_mtp_layers))
    if model.moe_latent_size:
        out.append(("moe_latent_size", model.moe_latent_size))
    out += hybrid_model_args(model)
    if model.sliding_window and model.num_sliding_window_layers:
        # --window-size LEFT,0 attends LEFT earlier tokens and the token itself
        out.append(("window_size", f"{model.sliding_window - 1},0"))
        every = model.num_sliding_window_layers >= model.num_layers
        alternate = model.num_sliding_window_layers == model.num_layers - model.num_layers // 2
        if alternate and not every:
            out.append(("window_attn_skip_freq", 2))
        elif not every:
            missing.append(f"sliding-window attention on {model.num_sliding_window_layers} of "
                           f"{model.num_layers} layers (Megatron-LM: every layer, or every "
                           "layer but each N-th)")
    if model.attention_sinks:
        out.append(("softmax_type", "learnable"))  # a learnable sink logit per head
    return out, missing


#: Megatron-LM's hybrid-model entry point and layer spec at d98e8a64dd (examples/mamba/train.sh:
#: ``pretrain_hybrid.py ... --spec megatron.core.models.hybrid.hybrid_layer_specs
#: hybrid_stack_spec``; ``pretrain_mamba.py`` is its deprecated wrapper).
HYBRID_ENTRY = "pretrain_hybrid.py"
HYBRID_SPEC = ["megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"]


def hybrid_model_args(model: ModelSpec) -> list[tuple[str, Any]]:
    """A hybrid Mamba model's flags: the layer pattern (``--hybrid-layer-pattern``, with its MTP
    depths after ``/``; the older ``--hybrid-override-pattern`` is its deprecated alias), the
    Mamba-2 mixer's dimensions and the hybrid stack spec. Empty for a transformer."""
    if not model.is_hybrid:
        return []
    # an MTP depth of a hybrid model runs attention + the last layer's block (inventory:
    # mtp_extra_blocks): Megatron-LM's unified pattern appends "/" + its pattern per depth
    # (megatron/core/models/hybrid/hybrid_layer_allocation.py: "M*M*/MM/MM")
    mtp = "/" + "*" + model.hybrid_pattern[-1] if model.num_mtp_layers else ""
    out: list[tuple[str, Any]] = [("hybrid_layer_pattern",
                                   model.hybrid_pattern + mtp * model.num_mtp_layers)]
    if model.mamba is not None:
        m = model.mamba
        out += [("mamba_state_dim", m.state_dim), ("mamba_head_dim", m.head_dim),
                ("mamba_num_groups", m.num_groups), ("mamba_num_heads", m.num_heads)]
    return out + [("spec", HYBRID_SPEC)]


def entry_point(model: ModelSpec) -> str:
    """The Megatron-LM training script of the model: ``pretrain_hybrid.py`` for hybrid Mamba
    models, ``pretrain_gpt.py`` otherwise."""
    return HYBRID_ENTRY if model.is_hybrid else "pretrain_gpt.py"


def _number(value: float) -> int | float:
    """An integral float as an int (``--rotary-base`` is an int flag in arguments.py)."""
    return int(value) if float(value).is_integer() else value


def _render_flag(dest: str, value: Any) -> str:
    if dest in PRIMUS_CLI_KEYS:  # Primus's command-line spelling (underscored, with a value)
        return f"--{dest} {value}"
    if value is False:  # a store_false flag (--no-check-for-nan-in-loss-and-grad)
        return "--no-" + dest.replace("_", "-")
    flag = megatron_flag(dest)
    if value is True:
        return flag
    if isinstance(value, list):
        return " ".join([flag, *(shlex.quote(str(v)) for v in value)])
    return f"{flag} {shlex.quote(str(value))}"


def to_megatron_args(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cfg: ParallelConfig, *,
    include_model: bool = True, launcher: bool = False, options: RunOptions | None = None,
) -> str:
    """Ready-to-paste Megatron-LM flags for ``cfg`` (after :func:`canonical_config`).

    Comment lines first (the setting and how to launch it), then one flag per line joined with
    ``\\``: parallel layout, batch, recompute, optimizer sharding, MoE, precision, and with
    ``include_model`` the model shape (``--vocab-size`` is Megatron-LM's size before padding).
    ``launcher`` prefixes ``torchrun --nnodes N --nproc-per-node G pretrain_gpt.py``.
    ``options``: the framework run settings (:func:`run_option_args`). Data, tokenizer,
    optimizer hyper-parameters and checkpointing are yours to add.
    """
    c = canonical_config(model, cluster, training, cfg)
    _refuse_zero_bubble(c, "Megatron-LM")
    pairs = megatron_config_args(model, training, c) + run_option_args(model, options)
    missing: list[str] = []
    if include_model:
        model_pairs, missing = megatron_model_args(model)
        pairs += model_pairs
    turbo = [(d, v) for d, v in moe_backend_args(c, primus=True)
             if d in PRIMUS_CLI_KEYS] if model.is_moe else []
    pairs += turbo
    lines = _header(model, cluster, training, c)
    lines.append("# Megatron-LM flags (megatron/training/arguments.py); launch on every node with "
                 f"torchrun --nnodes {cluster.num_nodes} --nproc-per-node {cluster.gpus_per_node}"
                 f" {entry_point(model)}")
    if missing:
        lines.append(f"# not expressible as Megatron-LM flags: {'; '.join(missing)}")
    if turbo:
        lines.append("# " + ", ".join(f"--{d}" for d, _ in turbo) + ": Primus command-line "
                     "overrides (Primus's Megatron-LM and Primus-Turbo; upstream Megatron-LM "
                     f"d98e8a64 has no such flags): {'; '.join(turbo_missing(c))}")
    body = [_render_flag(d, v) for d, v in pairs]
    if launcher:
        body.insert(0, f"torchrun --nnodes {cluster.num_nodes} --nproc-per-node "
                       f"{cluster.gpus_per_node} {entry_point(model)}")
    lines += [line + " \\" for line in body[:-1]] + body[-1:]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- Primus

YAML_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
YAML_RESERVED = frozenset({"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"})


def yaml_float(x: float) -> str:
    """``x`` spelled so that a YAML 1.1 loader reads it back as the same float. Primus loads its
    YAML with PyYAML's ``SafeLoader`` (``primus/core/config/yaml_loader.py::_load_yaml``), whose
    float pattern (YAML 1.1) needs a dot in the mantissa and a sign in the exponent: Python's
    ``1e-05`` is read as the string ``'1e-05'``, ``1.0e-05`` as the float (Primus's own YAMLs
    write ``1.0e-06``); infinities and NaN are ``.inf``, ``-.inf``, ``.nan``."""
    x = float(x)
    if math.isnan(x):
        return ".nan"
    if math.isinf(x):
        return ".inf" if x > 0 else "-.inf"
    text = repr(x)  # the shortest spelling that reads back as x
    mantissa, e, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    if e and exponent[0] not in "+-":
        exponent = "+" + exponent
    return mantissa + (f"e{exponent}" if e else "")


def yaml_value(value: Any) -> str:
    """One YAML value as Primus's loader (PyYAML, YAML 1.1) reads it back: floats by
    :func:`yaml_float`, strings that would read as something else quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):  # float, numpy floats
        return yaml_float(float(value))
    if isinstance(value, list):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    text = str(value)
    if YAML_PLAIN.fullmatch(text) and text.lower() not in YAML_RESERVED:
        return text
    return json.dumps(text)


def primus_overrides(model: ModelSpec, training: TrainingSpec,
                     c: ParallelConfig) -> list[tuple[str, Any]]:
    """(key, value) pairs of a canonical configuration as Primus overrides. Keys whose Primus
    default differs from what tune-cp modeled are always written (sequence_parallel,
    use_distributed_optimizer, the recompute keys, fp8)."""
    zero_bubble = c.schedule_ is Schedule.ZERO_BUBBLE
    first, last = end_stage_layers(model, c)
    layout = written_layout(model, c)
    out: list[tuple[str, Any]] = [
        (KNOB_DEST["tp"], c.tp),
        (KNOB_DEST["pp"], c.pp),
        (KNOB_DEST["vpp"], c.vpp if c.vpp > 1 and layout is None else None),
        (KNOB_DEST["cp"], c.cp),
        *plain_axis_values(c, KNOB_DEST),
        (KNOB_DEST["ep"], c.ep),
        (KNOB_DEST["etp"], c.etp_ if model.is_moe else None),
        ("sequence_parallel", c.sp),
        ("account_for_embedding_in_pipeline_split",
         c.pipeline_split is PipelineSplit.EMBEDDING_LOSS),
        ("account_for_loss_in_pipeline_split", c.pipeline_split is PipelineSplit.EMBEDDING_LOSS),
        *((dest, v) for dest, v in (
            (KNOB_DEST["first_stage_layers"], first),
            (KNOB_DEST["last_stage_layers"], last),
            (KNOB_DEST["pipeline_layout"], layout)) if v is not None),
        *_batch_args(model, training, c),
    ]
    if c.recompute is Recompute.FULL:
        out += [("recompute_granularity", "full"), ("recompute_method", c.recompute_method.value),
                ("recompute_num_layers", c.recompute_layers)]
    elif c.recompute is Recompute.SELECTIVE:
        out += [("recompute_granularity", "selective"), ("recompute_method", None),
                ("recompute_num_layers", None), ("recompute_modules", list(c.recompute_modules))]
    else:
        out += [("recompute_granularity", None), ("recompute_method", None),
                ("recompute_num_layers", None)]
    out += [("use_distributed_optimizer", c.distributed_optimizer or c.fsdp),
            ("use_megatron_fsdp", c.fsdp)]
    if c.fsdp:  # Primus runs Megatron-LM's validate_args: the checkpoint format too
        out += [("data_parallel_sharding_strategy", FSDP_STRATEGY),
                ("ckpt_format", FSDP_CKPT_FORMAT)]
    # Primus's zero-bubble runtime forbids overlapped grad reduce / param gather with the
    # distributed optimizer (zbpp_utils.validate_arguments)
    overlap = not zero_bubble
    out += [("overlap_grad_reduce", overlap),
            ("overlap_param_gather", overlap and (c.distributed_optimizer or c.fsdp))]
    # Primus default (trainer_base.yaml) grad_reduce_in_bf16: false, fp32 gradients
    out += _dispatcher_and_dtype_args(model, c)
    if model.is_moe:  # Primus-Turbo's keys (primus_turbo.yaml)
        out += [kv for kv in moe_backend_args(c, primus=True) if kv not in out]
    if c.fp8_recipe is not None:
        out += [("fp8", fp8_format(c.fp8_recipe).value), ("fp8_recipe", c.fp8_recipe.value)]
    else:
        out.append(("fp8", None))
    if compute_precision(training, c) is Precision.FP4:  # trainer_base.yaml: fp4: null
        out.append(("fp4", FP4_FORMAT))
    out.append(("patch_zero_bubble", zero_bubble))
    if zero_bubble:
        out.append(("enable_zero_bubble", True))
    if not training.flash_attention:
        out.append(("attention_backend", UNFUSED_BACKEND))
    return out


# Megatron-LM flags without value whose Primus spelling is a key with the opposite value
PRIMUS_NEGATED = {"disable_bias_linear": "add_bias_linear"}
# Model switches written whatever their value: Primus's defaults (language_model.yaml) differ
# from Megatron-LM's (SwiGLU, untied, no biases), so an unwritten switch would change the model.
PRIMUS_EXPLICIT = ("swiglu", "quick_geglu", "squared_relu", "untie_embeddings_and_output_weights",
                   "add_bias_linear", "add_qkv_bias", "qk_layernorm", "group_query_attention",
                   "multi_latent_attention", "use_rope_scaling",
                   "moe_router_enable_expert_bias")


def primus_model_overrides(model: ModelSpec) -> tuple[list[tuple[str, Any]], list[str]]:
    """The model as Primus keys (the Megatron-LM model arguments with Primus's spellings and
    every switch written), and what they cannot say; they override the experiment's model YAML
    with the model tune-cp checked."""
    pairs, missing = megatron_model_args(model)
    # Megatron-LM's defaults for the switches the flags leave out (add_bias_linear: on)
    values: dict[str, Any] = {k: k == "add_bias_linear" for k in PRIMUS_EXPLICIT}
    for dest, value in pairs:
        if dest in PRIMUS_NEGATED:
            values[PRIMUS_NEGATED[dest]] = not value
        else:
            values[dest] = value
    if not model.is_moe:
        for key in ("moe_router_enable_expert_bias",):
            values.pop(key)
    return list(values.items()), missing


def primus_option_overrides(model: ModelSpec, o: RunOptions | None) -> list[tuple[str, Any]]:
    """Primus keys of the framework run settings, in the spellings of its defaults
    (``trainer_base.yaml`` / ``language_model.yaml`` at ``fd1eeabbad``): per-layer graphs as
    ``external_cuda_graph: true`` (Megatron-LM's deprecated spelling of ``--cuda-graph-impl
    transformer_engine``) with ``cuda_graph_scope: [...]``, full-iteration graphs as
    ``enable_cuda_graph: true`` (= ``local``) with ``cuda_graph_scope: [full_iteration]``
    (migrated by Megatron-LM to ``--cuda-graph-impl full_iteration``) and
    ``check_for_nan_in_loss_and_grad: false``; ``overlap_moe_expert_parallel_comm``,
    ``delay_wgrad_compute``; ``moe_expert_capacity_factor``, ``moe_pad_expert_input_to_capacity``.
    Nothing for the defaults."""
    o = o or RunOptions()
    out: list[tuple[str, Any]] = []
    if FULL_ITERATION in o.cuda_graph_scope:
        out += [("enable_cuda_graph", True), ("cuda_graph_scope", [FULL_ITERATION]),
                ("check_for_nan_in_loss_and_grad", False)]
    elif o.cuda_graph_scope:
        out += [("external_cuda_graph", True), ("cuda_graph_scope", list(o.cuda_graph_scope))]
    return out + moe_run_args(model, o)


def to_primus_overrides(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cfg: ParallelConfig, *,
    options: RunOptions | None = None,
) -> str:
    """A Primus experiment fragment: ``modules.pre_trainer.overrides`` for ``cfg``. Merge the
    keys into an experiment's overrides (its ``modules.pre_trainer.model`` names the model's
    Primus YAML); the keys are indented as in Primus's examples, ready to paste."""
    if model.is_hybrid:
        raise ConfigError(f"{model.name} is a hybrid Mamba model; Primus's Megatron backend has "
                          f"no hybrid-model keys (no hybrid pattern or mamba_* in its YAML "
                          f"defaults): export to Megatron-LM or Megatron-Bridge instead")
    c = canonical_config(model, cluster, training, cfg)
    lines = _header(model, cluster, training, c)
    lines += [
        "# Primus experiment overrides (Megatron backend): merge into modules.pre_trainer."
        "overrides of an experiment",
        f"# whose modules.pre_trainer.model is {model.name}'s Primus model YAML; run on "
        f"NNODES={cluster.num_nodes} x {cluster.gpus_per_node} GPUs",
        "modules:",
        "  pre_trainer:",
        "    overrides:",
    ]
    model_pairs, missing = primus_model_overrides(model)
    taken = {k for k, _ in model_pairs}
    pairs = [(k, v) for k, v in primus_overrides(model, training, c) if k not in taken]
    pairs += primus_option_overrides(model, options)
    pairs += model_pairs
    if missing:
        lines.insert(len(lines) - 3, f"# not expressible as Primus keys: {'; '.join(missing)}")
    extra = [k for k, _ in pairs if k not in primus_default_keys()]
    if extra:
        lines.insert(len(lines) - 3, f"# {', '.join(extra)}: Megatron-LM arguments that are in "
                     "none of Primus's YAML defaults; Primus passes overrides to Megatron-LM's "
                     "arguments as they are")
    lines += [f"      {key}: {yaml_value(value)}" for key, value in pairs]
    return "\n".join(lines) + "\n"


PRIMUS_KEYS_FILE = Path(__file__).parent / "data" / "primus_keys.json"


@cache
def primus_default_keys() -> frozenset[str]:
    """Keys Primus's own YAML defaults define (``data/primus_keys.json``, with its source)."""
    return frozenset(json.loads(PRIMUS_KEYS_FILE.read_text())["keys"])


# ------------------------------------------------------------------------- Megatron-Bridge


def nemo_assignments(model: ModelSpec, training: TrainingSpec,
                     c: ParallelConfig) -> list[tuple[str, str]]:
    """(field path, Python expression) pairs on a Megatron-Bridge ``ConfigContainer``."""
    emb_loss = c.pipeline_split is PipelineSplit.EMBEDDING_LOSS
    first, last = end_stage_layers(model, c)
    out: list[tuple[str, str]] = [
        (KNOB_BRIDGE["tp"], repr(c.tp)),
        (KNOB_BRIDGE["pp"], repr(c.pp)),
    ]
    if c.pp > 1:  # the recipes set it whenever pp > 1
        out.append(("model.pipeline_dtype", "torch.bfloat16"))
    out += [
        (KNOB_BRIDGE["vpp"], repr(c.vpp if c.vpp > 1 else None)),
        (KNOB_BRIDGE["pipeline_layout"], repr(written_layout(model, c))),
        (KNOB_BRIDGE["first_stage_layers"], repr(first)),
        (KNOB_BRIDGE["last_stage_layers"], repr(last)),
        ("model.account_for_embedding_in_pipeline_split", repr(emb_loss)),
        ("model.account_for_loss_in_pipeline_split", repr(emb_loss)),
        (KNOB_BRIDGE["cp"], repr(c.cp)),
        *((key, repr(v)) for key, v in plain_axis_values(c, KNOB_BRIDGE)),
    ]
    if model.is_moe:
        out += [(KNOB_BRIDGE["ep"], repr(c.ep)), (KNOB_BRIDGE["etp"], repr(c.etp_))]
    out += [
        ("model.sequence_parallel", repr(c.sp)),
        ("model.seq_length", repr(training.seq_len)),
        ("dataset.seq_length", repr(training.seq_len)),
        (KNOB_BRIDGE["mbs"], repr(c.mbs)),
        ("train.global_batch_size", repr(training.global_batch_size)),
    ]
    if c.recompute is Recompute.FULL:
        out += [("model.recompute_granularity", '"full"'),
                ("model.recompute_method", json.dumps(c.recompute_method.value)),
                ("model.recompute_num_layers", repr(c.recompute_layers)),
                ("model.recompute_modules", "None")]
    elif c.recompute is Recompute.SELECTIVE:
        out += [("model.recompute_granularity", '"selective"'), ("model.recompute_method", "None"),
                ("model.recompute_num_layers", "None"),
                ("model.recompute_modules", json.dumps(list(c.recompute_modules)))]
    else:
        out += [("model.recompute_granularity", "None"), ("model.recompute_method", "None"),
                ("model.recompute_num_layers", "None")]
    sharded = c.distributed_optimizer or c.fsdp  # Megatron-FSDP v1 needs the distributed optimizer
    out += [("ddp.use_distributed_optimizer", repr(sharded)),
            ("optimizer.use_distributed_optimizer", repr(sharded)),
            ("ddp.use_megatron_fsdp", repr(c.fsdp))]
    if c.fsdp:
        out += [("ddp.data_parallel_sharding_strategy", json.dumps(FSDP_STRATEGY)),
                ("checkpoint.ckpt_format", json.dumps(FSDP_CKPT_FORMAT))]
    out += [("ddp.overlap_grad_reduce", "True"), ("ddp.overlap_param_gather", repr(sharded))]
    if model.is_moe:
        flex = c.dispatcher is Dispatcher.FLEX
        fb = (c.flex_backend or FlexBackend.DEEPEP).value
        out += [("model.moe_token_dispatcher_type", json.dumps(c.dispatcher.value)),
                ("model.moe_flex_dispatcher_backend", json.dumps(fb) if flex else "None"),
                ("model.moe_grouped_gemm", repr(c.grouped_gemm is not GroupedGemm.SEQUENTIAL)),
                ("model.moe_permute_fusion", repr(c.permute_fusion)),
                ("model.moe_shared_expert_overlap", repr(c.shared_expert_overlap)),
                ("model.moe_router_dtype", '"fp32"' if c.router_fp32 else "None")]
    fp4 = compute_precision(training, c) is Precision.FP4
    # Megatron-Bridge training/mixed_precision.py: bf16_with_nvfp4_mixed (NVFP4BlockScaling)
    out.append(("mixed_precision", "bf16_with_nvfp4_mixed()" if fp4 else "bf16_mixed()"))
    if not c.grad_reduce_in_fp32:
        # MixedPrecisionConfig.setup copies its grad_reduce_in_fp32 (bf16_mixed(): True) into
        # the DDP config, so the mixed-precision field decides; the ddp line states the result
        out += [("mixed_precision.grad_reduce_in_fp32", "False"),
                ("ddp.grad_reduce_in_fp32", "False")]
    if c.fp8_recipe is not None:
        out += [("mixed_precision.fp8", json.dumps(fp8_format(c.fp8_recipe).value)),
                ("mixed_precision.fp8_recipe", json.dumps(c.fp8_recipe.value)),
                ("mixed_precision.fp8_param_gather", str(bool(c.fp8_param_gather)))]
    if not training.flash_attention:
        out.append(("model.attention_backend", f"AttnBackend.{UNFUSED_BACKEND}"))
    return out


# Megatron-LM model arguments -> Megatron-Bridge model-provider fields (GPTModelProvider and the
# TransformerConfig it extends); the flags without a field are handled in nemo_model_assignments
BRIDGE_FIELD = {
    "norm_epsilon": "layernorm_epsilon", "num_experts": "num_moe_experts",
}
BRIDGE_SKIP = frozenset({"group_query_attention", "swiglu", "quick_geglu", "squared_relu",
                         "untie_embeddings_and_output_weights", "disable_bias_linear",
                         "use_rope_scaling", "rotary_scaling_factor",
                         "yarn_original_max_position_embeddings", "window_size",
                         "spec"})  # the recipe's provider has its layer spec
ACTIVATION_IMPORT = {  # Megatron-Core modules of the activation functions
    "F.silu": "import torch.nn.functional as F",
    "F.gelu": "import torch.nn.functional as F",
    "quick_gelu": "from megatron.core.activations import quick_gelu",
    "squared_relu": "from megatron.core.activations import squared_relu",
}


def nemo_model_assignments(model: ModelSpec) -> tuple[list[tuple[str, str]], list[str]]:
    """(cfg.model field, Python expression) pairs that set the recipe's model provider to the
    checked model, and the imports they need."""
    pairs, _ = megatron_model_args(model)
    values = dict(pairs)
    out: list[tuple[str, str]] = []
    for dest, value in pairs:
        if dest in BRIDGE_SKIP:
            continue
        expr = value if dest == "moe_layer_freq" else (
            json.dumps(value) if isinstance(value, str) else repr(value))
        out.append((f"model.{BRIDGE_FIELD.get(dest, dest)}", expr))
    if model.mla is None and "num_query_groups" not in values:
        out.append(("model.num_query_groups", repr(model.num_kv_heads)))
    if model.activation is Activation.QUICK_GEGLU:
        act, gated = "quick_gelu", True
    elif model.activation is Activation.SQUARED_RELU:
        act, gated = "squared_relu", model.gated_mlp
    else:
        act, gated = ("F.silu" if model.gated_mlp else "F.gelu"), model.gated_mlp
    out += [("model.gated_linear_unit", repr(gated)), ("model.activation_func", act),
            ("model.share_embeddings_and_output_weights", repr(model.tied_embeddings)),
            ("model.add_bias_linear", repr("disable_bias_linear" not in values))]
    if model.rope_scaling is RopeScaling.LLAMA3:
        out += [("model.rope_scaling", "True"),
                ("model.rope_scaling_factor", repr(model.rope_scaling_factor))]
    elif model.rope_scaling is RopeScaling.YARN:
        if model.mla is not None:  # MLATransformerConfig's YaRN fields (rope_type selects it)
            out += [("model.rope_type", '"yarn"'),
                    ("model.rotary_scaling_factor", repr(model.rope_scaling_factor)),
                    ("model.original_max_position_embeddings",
                     repr(model.rope_original_max_position_embeddings))]
        else:
            out += [("model.yarn_rotary_scaling_factor", repr(model.rope_scaling_factor)),
                    ("model.yarn_original_max_position_embeddings",
                     repr(model.rope_original_max_position_embeddings or None))]
    if "window_size" in values:
        out.append(("model.window_size", f"({model.sliding_window - 1}, 0)"))
    return out, [ACTIVATION_IMPORT[act]]


BRIDGE_FIELDS_FILE = Path(__file__).parent / "data" / "bridge_model_fields.json"


@cache
def bridge_model_fields() -> frozenset[str]:
    """Field names of a Megatron-Bridge model provider (``data/bridge_model_fields.json``)."""
    return frozenset(json.loads(BRIDGE_FIELDS_FILE.read_text())["fields"])


def nemo_option_assignments(model: ModelSpec, o: RunOptions | None) -> list[tuple[str, str]]:
    """Megatron-Bridge fields of the framework run settings (``067f987df0``:
    ``utils/cuda_graph.py::set_cuda_graph_modules`` / ``set_full_iteration_cuda_graph``, and the
    performance scripts' ``overrides.py``, which turn on the TE RNG tracker for CUDA graphs and
    turn off the NaN check for full-iteration graphs; ``training/comm_overlap.py``
    ``overlap_moe_expert_parallel_comm`` / ``delay_wgrad_compute``; the model provider's
    ``moe_expert_capacity_factor`` / ``moe_pad_expert_input_to_capacity``). Nothing for the
    defaults."""
    o = o or RunOptions()
    out: list[tuple[str, str]] = []
    if o.cuda_graph_scope:
        full = FULL_ITERATION in o.cuda_graph_scope
        out += [("model.cuda_graph_impl", json.dumps(FULL_ITERATION if full
                                                     else PER_LAYER_GRAPH_IMPL)),
                ("model.cuda_graph_modules", "[]" if full else json.dumps(
                    list(o.cuda_graph_scope))),
                ("rng.te_rng_tracker", "True"), ("model.use_te_rng_tracker", "True")]
        if full:
            out.append(("rerun_state_machine.check_for_nan_in_loss", "False"))
    if model.is_moe and o.moe_a2a_overlap:
        out += [("comm_overlap.overlap_moe_expert_parallel_comm", "True"),
                ("comm_overlap.delay_wgrad_compute", "True")]
    if model.is_moe and o.moe_capacity_factor is not None:
        out += [("model.moe_expert_capacity_factor", repr(float(o.moe_capacity_factor))),
                ("model.moe_pad_expert_input_to_capacity", "True")]
    return out


def to_nemo_overrides(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cfg: ParallelConfig, *,
    options: RunOptions | None = None,
) -> str:
    """Python assignment lines for a Megatron-Bridge (NeMo 2) recipe: run them on the
    ``ConfigContainer`` ``cfg`` a recipe function returns, before ``pretrain(cfg, ...)``. FP8 is
    written field by field on ``bf16_mixed()`` (the named FP8 presets also turn on FP8 parameter
    gather or bf16 first/last layers, which tune-cp does not model)."""
    c = canonical_config(model, cluster, training, cfg)
    _refuse_zero_bubble(c, "Megatron-Bridge")
    lines = _header(model, cluster, training, c)
    lines += [
        "# Megatron-Bridge recipe overrides: Python assignments on the ConfigContainer `cfg` a "
        "recipe returns",
        f"# run on {nodes_text(cluster.num_nodes)} x {cluster.gpus_per_node} GPUs (e.g. a NeMo-Run "
        f"executor with nodes={cluster.num_nodes}, ntasks_per_node={cluster.gpus_per_node})",
        "import torch",
        "from megatron.bridge.training.mixed_precision import bf16_mixed, bf16_with_nvfp4_mixed",
    ]
    if not training.flash_attention:
        lines.append("from megatron.core.transformer.enums import AttnBackend")
    model_lines, imports = nemo_model_assignments(model)
    lines += imports
    lines.append("")
    lines += [f"cfg.{path} = {expr}" for path, expr in nemo_assignments(model, training, c)]
    lines += [f"cfg.{path} = {expr}" for path, expr in nemo_option_assignments(model, options)]
    lines += ["", f"# the model tune-cp checked ({model.name}), on the recipe's model provider"]
    if model.is_hybrid:
        lines.append("# (a hybrid Mamba model: start from a recipe whose provider is a "
                     "HybridModelProvider, e.g. megatron.bridge.recipes.nemotronh)")
    lines += [f"cfg.{path} = {expr}" for path, expr in model_lines]
    return "\n".join(lines) + "\n"
