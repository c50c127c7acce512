"""What launch arguments mean: the key tables, value readers, shell splitting and Primus YAML
loading behind :mod:`formats`.

Spellings, defaults and value sets come from these sources (read at the named commits):

* Megatron-LM ``megatron/training/arguments.py`` and the dataclasses its ``ArgumentGroupFactory``
  turns into flags (``megatron/core/transformer/transformer_config.py``,
  ``megatron/core/model_parallel_config.py``, ``megatron/training/config/*.py``) at
  NVIDIA/Megatron-LM ``d98e8a64dd`` (2026-08-22). A dataclass field ``foo_bar`` becomes
  ``--foo-bar``; boolean fields that default to False become ``store_true`` flags; the parser
  has ``allow_abbrev=False``.
* Primus ``primus/configs/modules/megatron/{pre_trainer,trainer_base,zero_bubble}.yaml``,
  ``primus/configs/models/megatron/language_model.yaml`` and ``primus/core/config/yaml_loader.py``
  (``${VAR:default}`` placeholders, ``extends:`` presets) at AMD-AGI/Primus ``fd1eeabbad``
  (2026-08-22).
  Primus experiment overrides use the Megatron argument names with underscores.

Internally every argument is named by its Megatron ``dest`` (``tensor_model_parallel_size``); the
Megatron-LM flag and the Primus key are two spellings of it (:func:`spell`).
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

from tune_cp.config.axes import KNOBS
from tune_cp.config.specs import ConfigError
from tune_cp.formats.shell import UNSET, describe_unset, unset_name
from tune_cp.oracle.inputs import is_file, read_mapping, show_name


class Flavor(StrEnum):
    """Where the arguments came from: a Megatron-LM command line or a Primus experiment YAML."""

    MEGATRON = "megatron"
    PRIMUS = "primus"


class Fp8Format(StrEnum):
    """Megatron-LM ``--fp8-format``: ``e4m3`` everywhere, or ``hybrid`` (e4m3 forward, e5m2 for
    gradients)."""

    E4M3 = "e4m3"
    HYBRID = "hybrid"


FRAMEWORK_NAME = {Flavor.MEGATRON: "Megatron-LM", Flavor.PRIMUS: "Primus"}


class Kind(StrEnum):
    """Value type of an argument (decides how many command-line words a flag takes)."""

    INT = "int"
    FLOAT = "float"
    BOOL = "bool"  # Megatron-LM: a flag without value (store_true/store_false); Primus: a bool
    CHOICE = "choice"
    STR = "str"
    LIST = "list"  # Megatron-LM: nargs="*"; Primus: a YAML list
    FREQ = "freq"  # an int or a Python list expression such as "([0]*3+[1]*58)" (moe_layer_freq)


@dataclass(frozen=True)
class Key:
    """One argument tune-cp reads.

    ``flag``: the Megatron-LM spelling when it is not ``--`` + dest with ``-`` (``None``: derived);
    ``flag_stores``: for a flag without value, the value it stores (``--disable-bias-linear``
    stores False into ``add_bias_linear``); ``cli``: False when Megatron-LM has no such flag (a
    Primus / Megatron-Bridge field name only); ``lo``: least legal integer.
    """

    kind: Kind
    lo: int = 0
    choices: tuple[str, ...] = ()
    flag: str | None = None
    flag_stores: Any = True
    cli: bool = True


def _int(lo: int = 1) -> Key:
    return Key(Kind.INT, lo=lo)


BOOL = Key(Kind.BOOL)

#: The Megatron-LM (and Primus) argument dest of each axis-registry knob that has one name there
#: (``config/axes.py::KNOBS``: ``KNOB_DEST["tp"]`` is ``tensor_model_parallel_size``); the
#: exporters and readers spell those knobs through it. Knobs the frameworks say in several
#: arguments (pipeline split, schedule, FP8 format and recipe) are written out where they are
#: read and exported.
KNOB_DEST: dict[str, str] = {k.field: k.megatron for k in KNOBS if k.megatron}
#: The Megatron-Bridge ``ConfigContainer`` field path of each knob that has one.
KNOB_BRIDGE: dict[str, str] = {k.field: k.bridge for k in KNOBS if k.bridge}

#: Switches Primus's command line takes that Megatron-LM d98e8a64's does not (read, with a
#: note, from Megatron-LM-style launches; written only by the Primus exporter).
PRIMUS_CLI_KEYS = frozenset({"moe_use_legacy_grouped_gemm", "enable_primus_turbo",
                             "use_turbo_deepep", "use_turbo_grouped_gemm",
                             "turbo_sync_free_moe_stage"})

# Arguments that set tune-cp's ParallelConfig / TrainingSpec (Megatron dest -> Key).
CONFIG_KEYS: dict[str, Key] = {
    "tensor_model_parallel_size": _int(),
    "pipeline_model_parallel_size": _int(),
    "context_parallel_size": _int(),
    "expert_model_parallel_size": _int(),
    "expert_tensor_parallel_size": _int(),
    "num_layers_per_virtual_pipeline_stage": _int(),
    "num_virtual_stages_per_pipeline_rank": _int(),
    # a ModelParallelConfig field Primus projection and Megatron-Bridge read; no Megatron-LM flag
    # (excluded in arguments.py::_add_network_size_args, "no CLI argument exists for these")
    "virtual_pipeline_model_parallel_size": Key(Kind.INT, lo=1, cli=False),
    "account_for_embedding_in_pipeline_split": BOOL,
    "account_for_loss_in_pipeline_split": BOOL,
    # uneven first/last stages and hand-written layouts (arguments.py::_add_distributed_args)
    "decoder_first_pipeline_num_layers": _int(),
    "decoder_last_pipeline_num_layers": _int(),
    "pipeline_model_parallel_layout": Key(Kind.STR),
    # their TransformerConfig names, which Primus YAML and Megatron-Bridge also take; no
    # Megatron-LM flag
    "num_layers_in_first_pipeline_stage": Key(Kind.INT, lo=1, cli=False),
    "num_layers_in_last_pipeline_stage": Key(Kind.INT, lo=1, cli=False),
    "micro_batch_size": _int(),
    "global_batch_size": _int(),
    "seq_length": _int(),
    "sequence_parallel": BOOL,
    "recompute_granularity": Key(Kind.CHOICE, choices=("full", "selective")),
    "recompute_method": Key(Kind.CHOICE, choices=("uniform", "block")),
    "recompute_num_layers": _int(0),
    "recompute_modules": Key(Kind.LIST),
    # Primus: full recompute of these global layer ids ("0,3,4" or a list); no Megatron-LM flag
    "recompute_layer_ids": Key(Kind.STR, cli=False),
    "recompute_activations": BOOL,  # legacy alias of --recompute-granularity selective
    "moe_layer_recompute": BOOL,  # deprecated: selective recompute of the MoE block
    "use_distributed_optimizer": BOOL,
    "use_megatron_fsdp": BOOL,
    "use_torch_fsdp2": BOOL,
    # gradient buffer dtype (arguments.py::_add_mixed_precision_args; validate_args: under --bf16
    # accumulate_allreduce_grads_in_fp32 is forced on unless --grad-reduce-in-bf16)
    "grad_reduce_in_bf16": BOOL,
    "fp8_param_gather": BOOL,
    "accumulate_allreduce_grads_in_fp32": BOOL,
    "data_parallel_sharding_strategy": Key(
        Kind.CHOICE, choices=("no_shard", "optim", "optim_grads", "optim_grads_params")
    ),
    # alltoall_seq: removed from Megatron-LM, still listed in Primus's language_model.yaml comment
    "moe_token_dispatcher_type": Key(
        Kind.CHOICE, choices=("allgather", "alltoall", "flex", "alltoall_seq")
    ),
    "moe_flex_dispatcher_backend": Key(Kind.CHOICE, choices=("deepep", "hybridep", "ncclep")),
    "moe_enable_deepep": BOOL,  # deprecated: flex dispatcher with DeepEP
    # the MoE backend (config/specs.py::ParallelConfig backend fields; formats/parse.py::_backend)
    "moe_grouped_gemm": BOOL,
    # legacy GroupedMLP: gone from Megatron-LM d98e8a64's arguments (gpt_layer_specs.py l.616
    # still reads it with getattr); Primus's Megatron-LM and Primus-Turbo take it
    "moe_use_legacy_grouped_gemm": Key(Kind.BOOL, cli=False),
    "moe_permute_fusion": BOOL,
    "moe_shared_expert_overlap": BOOL,
    "moe_router_dtype": Key(Kind.CHOICE, choices=("fp32", "fp64")),
    # Primus-Turbo (primus/configs/modules/megatron/primus_turbo.yaml; no Megatron-LM flags)
    "enable_primus_turbo": Key(Kind.BOOL, cli=False),
    "use_turbo_deepep": Key(Kind.BOOL, cli=False),
    "use_turbo_grouped_gemm": Key(Kind.BOOL, cli=False),
    "turbo_sync_free_moe_stage": Key(Kind.INT, lo=0, cli=False),
    "bf16": BOOL,
    "fp16": BOOL,
    # TransformerConfig.fp8 is spelled --fp8-format on the command line; Primus writes fp8:
    "fp8": Key(Kind.CHOICE, choices=("e4m3", "hybrid"), flag="--fp8-format"),
    "fp8_recipe": Key(
        Kind.CHOICE, choices=("tensorwise", "delayed", "mxfp8", "blockwise", "custom")
    ),
    # TransformerConfig.fp4 (--fp4-format e2m1) with --fp4-recipe nvfp4 (NVFP4BlockScaling)
    "fp4": Key(Kind.CHOICE, choices=("e2m1", "nvfp4"), flag="--fp4-format"),
    # mxfp4: Primus's AMD MXFP4 recipe (not a Megatron-LM choice)
    "fp4_recipe": Key(Kind.CHOICE, choices=("nvfp4", "mxfp4", "custom")),
    "attention_backend": Key(
        Kind.CHOICE, choices=("flash", "fused", "unfused", "local", "auto")
    ),
    "use_flash_attn": BOOL,
    # Primus zero-bubble runtime (zero_bubble.yaml, primus_pipeline.yaml); no Megatron-LM flags
    "patch_zero_bubble": Key(Kind.BOOL, cli=False),
    "enable_zero_bubble": Key(Kind.BOOL, cli=False),
    "zero_bubble_v_schedule": Key(Kind.BOOL, cli=False),
    "enable_1f1b_v": Key(Kind.BOOL, cli=False),
    "patch_primus_pipeline": Key(Kind.BOOL, cli=False),
    "pp_algorithm": Key(Kind.STR, cli=False),
    "make_vocab_size_divisible_by": _int(),
    # framework run settings (config/axes.py::RUN_KNOBS; formats/parse.py::_run_options):
    # CUDA graphs (arguments.py / TransformerConfig at d98e8a64dd: --cuda-graph-impl,
    # --cuda-graph-modules, the hidden deprecated --cuda-graph-scope (dest
    # cuda_graph_scope_deprecated), the deprecated --enable-cuda-graph / --external-cuda-graph;
    # Primus trainer_base.yaml: enable_cuda_graph, external_cuda_graph, cuda_graph_scope)
    "cuda_graph_impl": Key(Kind.CHOICE,
                           choices=("none", "local", "transformer_engine", "full_iteration")),
    "cuda_graph_modules": Key(Kind.LIST),
    "cuda_graph_scope_deprecated": Key(Kind.LIST, flag="--cuda-graph-scope"),
    "cuda_graph_scope": Key(Kind.LIST, cli=False),
    "enable_cuda_graph": BOOL,
    "external_cuda_graph": BOOL,
    # MoE all-to-all overlap (combined 1F1B) and its delayed weight gradients
    "overlap_moe_expert_parallel_comm": BOOL,
    "delay_wgrad_compute": BOOL,
    # token-drop MoE (TransformerConfig: a negative capacity factor means dropless)
    "moe_expert_capacity_factor": Key(Kind.FLOAT),
    "moe_pad_expert_input_to_capacity": BOOL,
}

# Arguments that describe the model (enough of them build a ModelSpec when no --model is given).
MODEL_KEYS: dict[str, Key] = {
    "num_layers": _int(),
    "hidden_size": _int(),
    "ffn_hidden_size": _int(),
    "num_attention_heads": _int(),
    "group_query_attention": BOOL,
    "num_query_groups": _int(),
    "kv_channels": _int(),
    "num_experts": _int(0),
    "moe_ffn_hidden_size": _int(),
    "moe_router_topk": _int(),
    "moe_shared_expert_intermediate_size": _int(),
    "moe_layer_freq": Key(Kind.FREQ),
    "moe_router_enable_expert_bias": BOOL,
    "swiglu": BOOL,
    "normalization": Key(Kind.CHOICE, choices=("LayerNorm", "RMSNorm")),
    "untie_embeddings_and_output_weights": BOOL,
    # TransformerConfig.add_bias_linear (default True) is turned off by --disable-bias-linear
    "add_bias_linear": Key(Kind.BOOL, flag="--disable-bias-linear", flag_stores=False),
    "add_qkv_bias": BOOL,
    "qk_layernorm": BOOL,
    "vocab_size": _int(),
    "padded_vocab_size": Key(Kind.INT, lo=1, cli=False),
    "max_position_embeddings": _int(),
    "position_embedding_type": Key(
        Kind.CHOICE, choices=("learned_absolute", "rope", "yarn", "mrope", "relative", "none")
    ),
    "hidden_dropout": Key(Kind.FLOAT),
    "attention_dropout": Key(Kind.FLOAT),
    "multi_latent_attention": BOOL,
    "q_lora_rank": _int(),
    "kv_lora_rank": _int(),
    "qk_head_dim": _int(),
    "qk_pos_emb_head_dim": _int(0),
    "v_head_dim": _int(),
    "mtp_num_layers": _int(0),
    "tokenizer_model": Key(Kind.STR),
    "tokenizer_type": Key(Kind.STR),
    # settings that define the model without changing memory or time (read so that the
    # model read back is the model exported; TransformerConfig / arguments.py at d98e8a64dd)
    "rotary_base": Key(Kind.FLOAT),
    "use_rope_scaling": BOOL,
    "rope_scaling_factor": Key(Kind.FLOAT),
    "rotary_scaling_factor": Key(Kind.FLOAT),  # YaRN factor (--position-embedding-type yarn)
    "yarn_original_max_position_embeddings": _int(),
    # arguments.py: --norm-epsilon (dest layernorm_epsilon); Primus model YAMLs: norm_epsilon
    "norm_epsilon": Key(Kind.FLOAT, flag="--norm-epsilon"),
    "quick_geglu": BOOL,
    "squared_relu": BOOL,
    "activation_func_clamp_value": Key(Kind.FLOAT),
    "glu_linear_offset": Key(Kind.FLOAT),
    "window_size": Key(Kind.STR),  # "left,right" (TE window); sliding-window attention
    "window_attn_skip_freq": Key(Kind.STR),  # every N-th layer full attention (or a pattern)
    "softmax_type": Key(Kind.CHOICE, choices=("vanilla", "off-by-one", "learnable")),
    # hybrid Mamba models (pretrain_hybrid.py / pretrain_mamba.py; arguments.py at d98e8a64dd:
    # --hybrid-layer-pattern, its deprecated spelling --hybrid-override-pattern, the Mamba-2
    # mixer's --mamba-* dimensions) and the latent MoE of Nemotron 3 Super / Ultra
    "hybrid_layer_pattern": Key(Kind.STR),
    "hybrid_override_pattern": Key(Kind.STR),
    "is_hybrid_model": BOOL,
    "mamba_state_dim": _int(),
    "mamba_head_dim": _int(),
    "mamba_num_groups": _int(),
    "mamba_num_heads": _int(),
    "moe_latent_size": _int(),
    "moe_shared_expert_gate": BOOL,
    "moe_router_score_function": Key(Kind.CHOICE, choices=("softmax", "sigmoid")),
    "moe_router_num_groups": _int(),
    "moe_router_group_topk": _int(),
    "moe_router_topk_scaling_factor": Key(Kind.FLOAT),
}


@dataclass(frozen=True)
class Unmodeled:
    """An argument tune-cp understands but cannot represent; noted when not ``neutral``."""

    key: Key
    why: str
    neutral: tuple[Any, ...] = (None, False)


UNMODELED: dict[str, Unmodeled] = {
    "microbatch_group_size_per_vp_stage": Unmodeled(
        Key(Kind.INT, lo=1, flag="--microbatch-group-size-per-virtual-pipeline-stage"),
        "tune-cp assumes the default group size (pp)"),
    "overlap_p2p_comm": Unmodeled(
        Key(Kind.BOOL, flag="--no-overlap-p2p-communication", flag_stores=False),
        "without p2p overlap Megatron-LM needs pp > 2 for virtual stages; tune-cp assumes the "
        "overlap", neutral=(None, True)),
    "first_last_layers_bf16": Unmodeled(BOOL, "bf16 first/last layers in FP8 runs are not modeled"),
    "moe_router_force_load_balancing": Unmodeled(
        BOOL, "routing is forced balanced (a benchmark setting), as tune-cp's default "
        "moe_routing_imbalance=0 assumes; for real routing set --overhead moe_routing_imbalance=0.5"),
    "use_precision_aware_optimizer": Unmodeled(
        BOOL, "reduced-precision optimizer states are not modeled (fp32 states counted)"),
    "main_grads_dtype": Unmodeled(Key(Kind.STR), "fp32 main gradients are assumed",
                                  neutral=(None, "fp32")),
    "main_params_dtype": Unmodeled(Key(Kind.STR), "fp32 master weights are assumed",
                                   neutral=(None, "fp32")),
    "exp_avg_dtype": Unmodeled(Key(Kind.STR), "fp32 Adam moments are assumed",
                               neutral=(None, "fp32")),
    "exp_avg_sq_dtype": Unmodeled(Key(Kind.STR), "fp32 Adam moments are assumed",
                                  neutral=(None, "fp32")),
    "optimizer": Unmodeled(Key(Kind.STR), "tune-cp models Adam's optimizer states",
                           neutral=(None, "adam")),
    "optimizer_cpu_offload": Unmodeled(BOOL, "optimizer offload to CPU is not modeled"),
    "cpu_offloading": Unmodeled(BOOL, "activation/weight offload to CPU is not modeled"),
    "num_distributed_optimizer_instances": Unmodeled(
        _int(), "several distributed-optimizer instances are not modeled", neutral=(None, 1)),
    "hierarchical_context_parallel_sizes": Unmodeled(
        Key(Kind.LIST), "hierarchical context parallelism is not modeled"),
    "cp_comm_type": Unmodeled(Key(Kind.STR), "tune-cp models the p2p (ring) context-parallel "
                              "exchange", neutral=(None, "p2p")),
    "distribute_saved_activations": Unmodeled(
        BOOL, "distributing checkpointed activations over tp is not modeled"),
    "tp_comm_overlap": Unmodeled(BOOL, "tensor-parallel communication overlap is not modeled"),
}

def _on(value: Any) -> bool:
    """A setting that is switched on / given (not None, False, 0, "", [], "none")."""
    return value not in (None, False, 0, "", "none", "None", "null") and value != []


# Architectures tune-cp does not model: a launch that sets one of these is refused with the
# reason (never modelled as a plain transformer). Keys: Megatron dest / Primus model-YAML key.
ARCH_REFUSED: dict[str, tuple[Any, str]] = {
    "model_type": (lambda v: str(v).lower() == "mamba",
                   "Primus Mamba model configs (model_type mamba; Megatron-LM pretrain_mamba.py)"),
    "experimental_attention_variant": (_on, "linear-attention layers "
                                            "(experimental_attention_variant)"),
    "linear_attention_freq": (_on, "linear-attention layers (linear_attention_freq: gated "
                                   "DeltaNet / KDA)"),
    "lfm_layer_types": (_on, "LFM2 short-convolution layers (lfm_layer_types)"),
    "compress_ratios": (_on, "DeepSeek-V4 compressed sparse attention (compress_ratios, "
                             "index_topk) and hyper-connections"),
    "use_v4_attention_backend": (_on, "DeepSeek-V4 compressed sparse attention"),
    "hc_mult": (lambda v: _on(v) and v != 1, "hyper-connections (hc_mult)"),
    "heterogeneous_layers_config_path": (_on, "heterogeneous layers "
                                              "(heterogeneous_layers_config_path)"),
    "heterogeneous_layers_config_encoded_json": (_on, "heterogeneous layers"),
}


def refused_architecture(values: Mapping[str, Any]) -> str | None:
    """The first architecture feature in ``values`` that tune-cp does not model, as words."""
    for key, (applies, reason) in ARCH_REFUSED.items():
        if key in values and applies(values[key]):
            return reason
    return None


# Recompute modules Megatron-LM accepts that tune-cp does not model (TransformerConfig docstring).
UNMODELED_RECOMPUTE_MODULES = frozenset({"gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc"})

#: Keys read and set aside because they change neither memory nor time as the frameworks run
#: them (each pattern with its reason; ``IGNORED`` is their alternation, ``tests/
#: test_moe_backend.py`` checks that every pattern has a reason). Keys that do change time or
#: memory and are not modelled are :data:`UNMODELLED_KEYS` (a warning).
IGNORED_REASONS: dict[str, str] = {
    r"lr|min_lr|lr_\w+|\w*weight_decay\w*|adam_\w+|sgd_momentum|clip_grad":
        "optimizer hyper-parameters: values of the same element-wise update",
    r"\w*loss_scale\w*|hysteresis": "fp16 loss scaling values (a scalar per step)",
    r"init_method_std|seed|use_cpu_initialization|perform_initialization":
        "initialisation values and where they are drawn, before training",
    r"train_iters|train_samples|eval_\w+|exit_\w+|skip_train|auto_continue_train":
        "how long the job runs and when it evaluates, not a step's time",
    r"log_\w+|\w+_log_\w+|tensorboard_\w+|wandb_\w+|mlflow_\w+|timing_\w+|debug_\w+|"
    r"stderr_sink_level": "logging destinations and verbosity",
    r"profile\w*": "profiler windows (outside the measured steps)",
    r"save|load|save_interval|no_save_\w+|no_load_\w+|ckpt_\w+|async_save|use_checkpoint_args|"
    r"finetune|pretrained_checkpoint": "checkpoint paths and schedule, between steps",
    r"\w*data_path|data_\w+|split|mock_data|num_workers|dataloader_type|vocab_file|merge_file|"
    r"vocab_extra_ids|tokenizer_\w+|legacy_tokenizer|trust_remote_code|reset_\w+|"
    r"create_attention_mask_in_dataloader|no_create_attention_mask_in_dataloader|"
    r"num_dataset_builder_threads|eod_mask_loss":
        "the data pipeline on CPU workers and which tokens the loss masks (same tensor shapes)",
    r"distributed_backend|distributed_timeout_minutes|manual_gc\w*":
        "process-group back end (NCCL/RCCL is what runs), timeouts, Python GC scheduling",
    r"use_mcore_models|use_legacy_models|use_mcore|yaml_cfg|spec|trainable":
        "which model classes and config files describe the same network",
    r"rotary_\w+|rope_\w+|use_rope_scaling|use_rotary_position_embeddings|norm_epsilon|"
    r"mscale\w*|original_max_position_embeddings|apply_layernorm_1p":
        "position-embedding and norm constants: the same kernels on other numbers",
    r"attention_softmax_in_fp32": "the fused attention kernel computes its softmax in fp32 "
        "either way (Transformer Engine flash/fused attention)",
    r"moe_aux_loss_coeff|moe_z_loss_coeff|moe_router_load_balancing_type|"
    r"moe_router_score_function|moe_router_pre_softmax|moe_input_jitter_eps|"
    r"moe_router_bias_update_rate|moe_router_num_groups|moe_router_group_topk|"
    r"moe_router_topk_scaling_factor|mtp_loss_scaling_factor|moe_token_drop_policy":
        "router and loss coefficients: values in the same router operations",
    r"moe_per_layer_logging|check_for_\w+|no_check_for_\w+":
        "per-step scalar checks and logs (one small reduction per step)",
    r"num_layers_at_\w+": "FP8 layers kept in bf16 at the ends: tune-cp's FP8 recipes "
        "already count the embedding and output layers in bf16",
    r"untie_embeddings": "read as the model's untie_embeddings_and_output_weights",
    r"fp8_margin|fp8_interval|fp8_amax_\w+": "delayed-scaling history values (same kernels)",
    r"disable_\w+": "Primus's switches that turn off saving, logging and tracking "
        "(disable_last_saving, disable_wandb, disable_tensorboard, ...)",
    r"te_rng_tracker": "the RNG state tracker for dropout, which pre-training runs without",
}
IGNORED = re.compile("(" + "|".join(IGNORED_REASONS) + ")")

#: Keys of Primus and Megatron-LM that change time or memory and that tune-cp reads but does
#: not model (the audit of IGNORED, ``tests/test_moe_backend.py``): Primus-Turbo's other
#: kernels (attention, GEMM, norms, fused activations, their backends and CU counts), CUDA-graph
#: keys beyond the run settings' (which are read: ``config/axes.py::RUN_KNOBS``), the layer
#: implementation (``transformer_impl`` local vs transformer_engine), kernel fusions (``*_fusion``: bias-GeLU,
#: bias-dropout, masked softmax, rope, cross-entropy, gradient accumulation). Printed as
#: "changes time or memory, not modelled".
#: Also (moved out of IGNORED): the DDP overlap and bucket settings (``overlap_grad_reduce``,
#: ``overlap_param_gather``, ``align_*``, ``ddp_*``: how much gradient traffic hides), the
#: allocator's cache emptying (``empty_unused_memory_level``), Transformer Engine switches
#: (``use_te_*``), persistent layer norm, fused cross-entropy (``cross_entropy_*``), per-token
#: loss (an extra reduction), deterministic mode (slower kernels), FP8 weight gradients
#: (``fp8_wgrad``: the wgrad GEMM in bf16 when off).
UNMODELLED_KEYS = re.compile(
    r"(use_turbo_\w+|turbo_\w+|enable_turbo_\w+|enable_primus_turbo|cuda_graph_\w+|"
    r"enable_cuda_graph|external_cuda_graph|transformer_impl|\w+_fusion|\w+_fusion_impl|"
    r"no_\w+_fusion|gradient_accumulation_fusion|no_gradient_accumulation_fusion|"
    r"overlap_grad_reduce|overlap_param_gather|align_\w+|no_align_\w+|ddp_\w+|"
    r"empty_unused_memory_level|use_te_\w+|persist_layer_norm|no_persist_layer_norm|"
    r"cross_entropy_\w+|calculate_per_token_loss|deterministic_mode|fp8_wgrad)")

# torchrun (torch.distributed.run) options: name -> number of values. Both spellings
# (--nproc-per-node, --nproc_per_node) are accepted by torchrun; keys use hyphens.
TORCHRUN_OPTIONS: dict[str, int] = {
    "nnodes": 1, "nproc-per-node": 1, "node-rank": 1, "master-addr": 1, "master-port": 1,
    "rdzv-backend": 1, "rdzv-endpoint": 1, "rdzv-id": 1, "rdzv-conf": 1, "standalone": 0,
    "max-restarts": 1, "monitor-interval": 1, "start-method": 1, "role": 1, "log-dir": 1,
    "redirects": 1, "tee": 1, "local-ranks-filter": 1, "no-python": 0, "module": 0,
    "run-path": 0, "logs-specs": 1, "local-addr": 1, "use-env": 0, "use_env": 0,
}

SHELL_SEPARATORS = frozenset({"|", "||", "&", "&&", ";", ";;", "(", ")", "|&"})
SHELL_REDIRECTS = frozenset({"<", ">", ">>", ">&", "&>", "<<", "<&", "&>>", ">|"})
LAUNCHER_WORDS = frozenset({
    "torchrun", "python", "python3", "bash", "sh", "env", "export", "srun", "mpirun", "exec",
    "time", "nohup", "tee", "torch.distributed.run", "torch.distributed.launch", "set", "-x",
})
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")

ALL_KEYS: dict[str, Key] = {**CONFIG_KEYS, **MODEL_KEYS, **{d: u.key for d, u in UNMODELED.items()}}
# Every dest tune-cp reads (the classification of data/megatron_flags.json calls them "read").
READ_DESTS = frozenset(ALL_KEYS) | frozenset(ARCH_REFUSED) | {"layernorm_epsilon"}

MEGATRON_FLAGS_FILE = Path(__file__).parent / "data" / "megatron_flags.json"


@cache
def megatron_flags() -> dict[str, dict[str, Any]]:
    """Megatron-LM flag -> {dest, arity (0, 1 or "*"), group, effect (read / none /
    unmodelled)}: ``data/megatron_flags.json``, generated from ``arguments.py`` by
    :mod:`formats.gen_megatron_flags`."""
    return json.loads(MEGATRON_FLAGS_FILE.read_text())["flags"]


@cache
def dest_effects() -> dict[str, str]:
    """Megatron dest -> effect (for Primus keys, which use the dests)."""
    return {info["dest"]: info["effect"] for info in megatron_flags().values()}


def megatron_flag(dest: str) -> str:
    """The Megatron-LM spelling of an argument: its explicit flag, or ``--`` + dest with ``-``."""
    key = ALL_KEYS.get(dest)
    if key is not None and key.flag is not None:
        return key.flag
    return "--" + dest.replace("_", "-")


def spell(dest: str, flavor: Flavor) -> str:
    """How a user of ``flavor`` writes the argument ``dest``."""
    return megatron_flag(dest) if flavor is Flavor.MEGATRON else dest


# Megatron-LM flag -> (dest, value stored when the flag takes no value).
FLAG_TO_DEST: dict[str, str] = {megatron_flag(d): d for d, k in ALL_KEYS.items() if k.cli}


# ------------------------------------------------------------------------------ raw arguments


@dataclass
class RawArgs:
    """Arguments as written: dest -> raw value (a str from a command line, a YAML scalar or list
    from Primus), the spelling the user wrote (for messages), and what was noticed on the way."""

    flavor: Flavor
    where: str = ""
    values: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    num_nodes: int | None = None
    gpus_per_node: int | None = None
    has_vocab_files: bool = False  # --vocab-file and --merge-file (GPT-2 BPE without a type)
    unmodelled: list[str] = field(default_factory=list)  # change memory or time; not modelled

    def has(self, dest: str) -> bool:
        return self.values.get(dest) is not None

    def label(self, dest: str) -> str:
        return self.labels.get(dest) or spell(dest, self.flavor)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def fail(self, dest: str, value: Any, problem: str) -> ConfigError:
        prefix = f"{self.where}: " if self.where else ""
        return ConfigError(f"{prefix}{self.said(dest, value)}: {problem}")

    def said(self, dest: str, value: Any, *, quote: bool = True) -> str:
        """How the argument was written: ``--flag 'value'``, a bare ``--flag``, ``key 'value'``
        (strings quoted when ``quote``)."""
        if self.flavor is Flavor.MEGATRON and isinstance(value, bool):
            return self.label(dest)
        shown = _show(value) if quote or not isinstance(value, str) else value
        return f"{self.label(dest)} {shown}"

    def read(self, dest: str) -> Any:
        """The typed value of ``dest`` (None when absent); ConfigError names flag and value."""
        if not self.has(dest):
            return None
        return read_value(self, dest, ALL_KEYS[dest], self.values[dest])


#: Longest value an error message repeats (longer ones are cut, with "...").
MAX_SHOWN_CHARS = 60


def _show(value: Any) -> str:
    if isinstance(value, list):
        text = " ".join(str(v) for v in value)
    else:
        text = repr(value) if isinstance(value, str) else str(value).lower() if isinstance(
            value, bool) else str(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS - 3] + "..."


def fmt_value(value: Any) -> str:
    """A setting for a statement: on / off / none / the value."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    return "none" if value is None else str(value)


PATH_KEYS = frozenset({"tokenizer_model"})  # file paths tune-cp reads only as names
SHELL_VARIABLE = re.compile(r"\$\{?[A-Za-z_]")
WHOLE_NUMBER = re.compile(r"[+-]?\d+")
#: Most digits of an integer read from a placeholder or a YAML string (int64 has 19).
MAX_INT_DIGITS = 19
TRUE_WORDS = {"true": True, "false": False}


def quoted_number(key: Key, value: str) -> bool:
    """Whether a YAML string where a number of ``key``'s kind belongs spells one that YAML would
    have read as a number unquoted: an integer, or a float with no exponent. A float with an
    exponent stays readable: YAML 1.1 (PyYAML, Primus's loader) resolves ``1e-05`` and
    ``1.0e5`` (no point, or no exponent sign) as strings, which Megatron-LM receives as the
    number they spell."""
    text = value.strip()
    if key.kind is Kind.INT:
        return bool(WHOLE_NUMBER.fullmatch(text))
    if key.kind is Kind.FLOAT:
        return bool(PRIMUS_FLOAT.fullmatch(text)) and "e" not in text.lower()
    return False


def read_value(raw: RawArgs, dest: str, key: Key, value: Any) -> Any:
    """Check and convert one raw value by its kind."""
    if isinstance(value, str) and UNSET in value:
        name = unset_name(value)
        raise raw.fail(dest, value.replace(UNSET, ""),
                       f"the value is {describe_unset(name, value)}")
    if isinstance(value, str) and SHELL_VARIABLE.search(value):
        raise raw.fail(dest, value, "an unexpanded shell variable; pass its value with --env "
                       "NAME=VALUE or paste the command with its values filled in (for example "
                       "from the launch log)")
    if raw.flavor is Flavor.PRIMUS and isinstance(value, str) and quoted_number(key, value):
        # numbers in files are numbers: a YAML string that spells one was quoted (``'8'``); a
        # ``${VAR:8}`` placeholder has become a number already (resolve_placeholders)
        raise raw.fail(dest, value, "a string, not a number; write the number without quotes")
    if key.kind is Kind.INT:
        if isinstance(value, bool) or not (
            isinstance(value, int) or (isinstance(value, str) and WHOLE_NUMBER.fullmatch(value))
        ):
            raise raw.fail(dest, value, f"not a whole number; give an integer of at least {key.lo}")
        if isinstance(value, str) and len(value.lstrip("+-")) > MAX_INT_DIGITS:
            raise raw.fail(dest, value, f"more than {MAX_INT_DIGITS} digits; give an integer of "
                           f"at least {key.lo} that fits in 64 bits")
        number = int(value)
        if number < key.lo:
            raise raw.fail(dest, value, f"must be at least {key.lo}")
        return number
    if key.kind is Kind.FLOAT:
        try:
            if isinstance(value, bool) or (isinstance(value, str) and len(value) > 64):
                raise ValueError
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise raw.fail(dest, value, "not a number") from None
        if not math.isfinite(number):
            raise raw.fail(dest, value, "not a finite number")
        return number
    if key.kind is Kind.BOOL:
        if isinstance(value, str) and value.lower() in TRUE_WORDS:
            return TRUE_WORDS[value.lower()]
        if raw.flavor is Flavor.PRIMUS and not isinstance(value, bool) and value in (0, 1):
            return bool(value)  # Primus YAMLs write 1/0; Megatron-LM reads them as truthy
        if not isinstance(value, bool):
            raise raw.fail(dest, value, "not true or false")
        return value
    if key.kind is Kind.CHOICE:
        if not isinstance(value, str) or value not in key.choices:
            choices = ", ".join(key.choices)
            raise raw.fail(dest, value, f"not a valid choice; choose one of {choices}")
        return value
    if key.kind is Kind.LIST:
        items = value if isinstance(value, list) else str(value).split()
        if not all(isinstance(v, str) for v in items):
            raise raw.fail(dest, value, "must be a list of names")
        return [str(v) for v in items]
    if key.kind is Kind.FREQ:
        return value if isinstance(value, int) and not isinstance(value, bool) else str(value)
    return str(value)


#: Longest layer pattern evaluated (a longer one matches no model: ModelSpec allows 512 layers).
MAX_PATTERN_LAYERS = 100_000


def layer_pattern(text: str) -> list[int] | None:
    """Evaluate a Megatron-LM layer pattern such as ``([0]*3+[1]*58)`` (list literals of
    integers joined by ``+`` and ``*``; ``arguments.py::moe_freq_type``) without ``eval``."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        return None

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.List):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Mult) and isinstance(left, list | int) \
                    and isinstance(right, list | int) and (isinstance(left, list)
                                                           != isinstance(right, list)):
                seq, n = (left, right) if isinstance(left, list) else (right, left)
                if len(seq) * max(n, 0) > MAX_PATTERN_LAYERS:  # checked before it is built
                    raise ValueError(f"longer than {MAX_PATTERN_LAYERS} layers")
            result = left + right if isinstance(node.op, ast.Add) else left * right
            if isinstance(result, list) and len(result) > MAX_PATTERN_LAYERS:
                raise ValueError(f"longer than {MAX_PATTERN_LAYERS} layers")
            return result
        raise ValueError(ast.dump(node))

    try:
        result = ev(tree)
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(result, list) or not all(isinstance(v, int) for v in result):
        return None
    return result


# ------------------------------------------------------------------- Megatron-LM command lines


def shell_words(text: str) -> list[str]:
    """Split a launch command or script the way a POSIX shell would: backslash-newline joins
    lines, quotes group, ``#`` starts a comment, operators (``|``, ``;``, ``>``) are words."""
    joined = re.sub(r"\\\r?\n", " ", text)
    lexer = shlex.shlex(joined, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError as e:
        raise ConfigError(f"cannot split the Megatron-LM arguments: {e}; check the quotes") from e


def _is_flag(word: str) -> bool:
    return word.startswith("--") and len(word) > 2


def _is_shell(word: str) -> bool:
    return word in SHELL_SEPARATORS or word in SHELL_REDIRECTS


def _word_value(word: str) -> bool:
    """Whether ``word`` can be the value of a preceding flag."""
    return not (_is_flag(word) or _is_shell(word) or (word.startswith("-") and not _number(word)))


def _number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def scan_megatron(text: str, env: Mapping[str, str] | None = None) -> RawArgs:
    """Read a Megatron-LM launch (``torchrun ... pretrain_gpt.py --flag value ...``, or a whole
    launch script: :func:`formats.shell.expand_launch` with ``env``) into raw
    arguments. Known flags are checked for arity; unknown ones are listed, never fatal."""
    from tune_cp.formats.shell import expand_launch

    script = expand_launch(text, env)
    words = script.words
    if not any(w not in SHELL_SEPARATORS for w in words):
        raise ConfigError("the Megatron-LM arguments are empty; paste the launch command or its "
                          "arguments")
    raw = RawArgs(Flavor.MEGATRON)
    raw.notes.extend(script.notes)
    expansions: list[str] = []
    after_script = False
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word in SHELL_REDIRECTS:
            i += 1  # the redirect target
            continue
        if word in SHELL_SEPARATORS:
            after_script = False  # a new command (| tee log, ; echo done) starts
            continue
        if not _is_flag(word):
            if ASSIGNMENT.match(word) and " --" in f" {word.partition('=')[2]}":
                # GPT_ARGS="--num-layers 24 ..." (older Megatron-LM example scripts): read the
                # flags the variable holds where it is defined
                words[i:i] = shell_words(word.partition("=")[2])
            elif word == "-m":
                i += 1  # python -m MODULE
            elif word.endswith(".py"):
                after_script = True
            elif word.startswith("$") or UNSET in word:
                expansions.append(word.replace(UNSET, ""))
            elif after_script and not (
                word.startswith("-") or word in LAUNCHER_WORDS or ASSIGNMENT.match(word)
                or word.isdigit()
            ):
                raw.unknown.append(word)
            continue
        name, eq, inline = word.partition("=")
        i = _scan_flag(raw, words, i, name, inline if eq else None)
    if expansions:
        raw.note(
            f"shell expansions left as written: {', '.join(dict.fromkeys(expansions))}; only "
            "flags that appear literally in the text are read (paste the expanded command, e.g. "
            "from the launch log, if some are missing)"
        )
    return raw


def _take(words: list[str], i: int, inline: str | None, many: bool) -> tuple[list[str], int]:
    if inline is not None:
        return [inline], i
    taken: list[str] = []
    while i < len(words) and _word_value(words[i]) and not words[i].endswith(".py"):
        taken.append(words[i])
        i += 1
        if not many:
            break
    return taken, i


def _scan_flag(raw: RawArgs, words: list[str], i: int, name: str, inline: str | None) -> int:
    bare = name[2:]
    torchrun = bare.replace("_", "-")
    if torchrun in TORCHRUN_OPTIONS or bare in TORCHRUN_OPTIONS:
        arity = TORCHRUN_OPTIONS.get(torchrun, TORCHRUN_OPTIONS.get(bare, 0))
        values, i = _take(words, i, inline, many=False) if arity else ([], i)
        if torchrun in ("nnodes", "nproc-per-node") and values:
            _launcher_size(raw, name, values[0])
        return i
    dest = FLAG_TO_DEST.get(name)
    if dest is None and "_" in bare:
        hyphenated = "--" + bare.replace("_", "-")
        dest = FLAG_TO_DEST.get(hyphenated)
        if dest is not None:
            raw.note(f"{name}: Megatron-LM spells it {hyphenated} (underscored flags are Primus's "
                     "command line); read as such")
    known = megatron_flags().get(name)
    if dest is None and known is not None:
        arity = known["arity"]
        if arity == 0:
            values = [inline] if inline is not None else []
        else:
            values, i = _take(words, i, inline, many=arity == "*")
        shown = " ".join([name, *values])
        refused = refused_architecture({known["dest"]: values[0] if values else True})
        if refused:
            raise ConfigError(f"{shown}: tune-cp does not model {refused}; it models "
                              "decoder-only transformers (dense, MoE, MLA, sliding-window "
                              "attention)")
        if known["dest"] == "merge_file":
            raw.has_vocab_files = True
        if known["effect"] == "unmodelled":
            raw.unmodelled.append(shown)
        else:
            raw.ignored.append(name)
        return i
    if dest is None:
        as_dest = bare.replace("-", "_")
        values, i = _take(words, i, inline, many=True)
        if as_dest in PRIMUS_CLI_KEYS:  # Primus's Megatron-LM takes it; d98e8a64 does not
            if CONFIG_KEYS[as_dest].kind is Kind.BOOL:
                word = values[0].lower() if values else "true"
                raw.values[as_dest] = word in ("true", "1", "yes")
            else:
                raw.values[as_dest] = values[0] if values else ""
            raw.labels[as_dest] = name
            raw.note(f"{name} is not a Megatron-LM d98e8a64 flag (Primus's Megatron-LM and "
                     "Primus-Turbo take it); read")
        elif as_dest in CONFIG_KEYS or as_dest in MODEL_KEYS:  # a field without a Megatron-LM flag
            raw.unknown.append(" ".join([name, *values]))
            raw.note(f"{name} is not a Megatron-LM flag (argparse would reject the launch)"
                     + ("; use --num-virtual-stages-per-pipeline-rank"
                        if as_dest == "virtual_pipeline_model_parallel_size" else ""))
        elif UNMODELLED_KEYS.fullmatch(as_dest):
            raw.unmodelled.append(" ".join([name, *values]))
        elif IGNORED.fullmatch(as_dest):
            raw.ignored.append(name)
            if as_dest == "merge_file":
                raw.has_vocab_files = True
        else:
            raw.unknown.append(" ".join([name, *values]))
        return i
    key = ALL_KEYS[dest]
    if key.kind is Kind.BOOL:
        if inline is not None:
            raise ConfigError(f"{name}={inline}: this flag takes no value; write {name} alone to "
                              "turn it on, or leave it out")
        value: Any = key.flag_stores
    else:
        values, i = _take(words, i, inline, many=key.kind is Kind.LIST)
        if key.kind is not Kind.LIST and not values:
            raise ConfigError(f"{name}: missing its value; write {name} VALUE")
        value = values if key.kind is Kind.LIST else values[0]
    if isinstance(value, str) and UNSET in value and dest in PATH_KEYS:
        raw.note(f"{name} {value.replace(UNSET, '')}: a path the script leaves to its caller; "
                 "not needed for the check")
        return i
    if dest in raw.values and raw.values[dest] != value:
        raw.note(f"{name} is given twice ({_show(raw.values[dest])}, then {_show(value)}); the "
                 "last one counts, as in argparse")
    raw.values[dest] = value
    raw.labels[dest] = name
    return i


def _launcher_size(raw: RawArgs, name: str, value: str) -> None:
    if WHOLE_NUMBER.fullmatch(value) and len(value.lstrip("+-")) <= MAX_INT_DIGITS \
            and int(value) >= 1:
        if name.lstrip("-").startswith("nnodes"):
            raw.num_nodes = int(value)
        else:
            raw.gpus_per_node = int(value)
        return
    what = "nodes" if name.lstrip("-").startswith("nnodes") else "GPUs per node"
    raw.note(f"torchrun {name} {_show(value)} is not a number of {what}; give it to tune-cp "
             "directly")


# ----------------------------------------------------------------------------- Primus YAML


PLACEHOLDER = re.compile(r"\$\{([^:{}]+)(?::([^}]*))?\}")
PRIMUS_FLOAT = re.compile(r"^-?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)$")


def read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """A YAML file holding a mapping; every failure is a one-line ConfigError
    (:func:`oracle.inputs.read_mapping`: regular file, size, UTF-8, nesting, aliases)."""
    return read_mapping(path, what, fmt="yaml")


def resolve_placeholders(obj: Any, env: Mapping[str, str], notes: list[str], where: str) -> Any:
    """Primus ``${VAR}`` / ``${VAR:default}`` placeholders (``primus/core/config/yaml_loader.py``):
    the value from ``env`` or the default; a substituted string that reads as a bool or number
    becomes one. ``${VAR}`` without default and not in ``env`` leaves the key unset (noted)."""
    if isinstance(obj, dict):
        return {k: resolve_placeholders(v, env, notes, _child(where, str(k)))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [resolve_placeholders(v, env, notes, where) for v in obj]
    if not isinstance(obj, str) or not PLACEHOLDER.search(obj):
        return obj
    missing: list[str] = []

    def sub(m: re.Match[str]) -> str:
        var, default = m.group(1), m.group(2)
        if var in env:
            return env[var]
        if default is None:
            missing.append(var)
            return ""
        return default

    text = PLACEHOLDER.sub(sub, obj)
    if missing:
        notes.append(f"{where}: ${{{missing[0]}}} has no default and no value was given; "
                     "left unset")
        return None
    lowered = text.lower()
    if lowered in TRUE_WORDS:
        return TRUE_WORDS[lowered]
    if WHOLE_NUMBER.fullmatch(text) and len(text) <= MAX_INT_DIGITS:
        return int(text)
    if PRIMUS_FLOAT.fullmatch(text):
        return float(text)
    return text


def _child(where: str, key: str) -> str:
    """``a.b`` paths for messages; ``where`` may end with ``": "`` (a file-name prefix)."""
    return f"{where}{key}" if not where or where.endswith(" ") else f"{where}.{key}"


#: The folders a Primus model YAML is looked up in, under the experiment's folder or a folder
#: above it (Primus keeps them in ``primus/configs/models/megatron``).
MODEL_FOLDERS = ("models", "models/megatron", "configs/models/megatron",
                 "primus/configs/models/megatron")
#: Most model YAMLs one experiment's ``extends:`` chain reads, every read counted (a preset
#: extended twice is read twice, as Primus does): real chains read two or three
#: (``mixtral_8x22B_v0.1.yaml`` -> ``mixtral_base.yaml`` -> ``language_model.yaml``); a chain
#: that fans out (each file extending the next one twice) would read 2**depth.
MAX_PRESET_READS = 64
#: Deepest ``extends:`` chain followed.
MAX_PRESET_DEPTH = 16


def _inside(path: Path, root: Path) -> bool:
    """Whether ``path`` lies in ``root``: as written (``..`` folded) and, when it exists, with
    its symbolic links followed."""
    try:
        Path(os.path.normpath(path)).relative_to(os.path.normpath(root))
        if os.path.lexists(path):
            path.resolve().relative_to(root.resolve())
    except (ValueError, OSError, RuntimeError):
        return False
    return True


def _refuse_outside(name: str, what: str, root: Path) -> ConfigError:
    return ConfigError(f"{what} {_show(name)} lies outside the experiment's Primus tree "
                       f"{_show(str(root))}; tune-cp reads model files only inside it (next to "
                       f"the experiment or in a models/ folder of it or above it), so name a "
                       f"file there")


def find_model_file(experiment: Path, name: str) -> tuple[Path, Path] | None:
    """The model YAML an experiment names, with the tree it lies in (its presets must lie in
    it too): a path relative to the experiment's folder (the tree: that folder), or ``name``
    in a folder of :data:`MODEL_FOLDERS` in the experiment's folder or any folder above it
    (the tree: that folder). An absolute path, or one that leaves its tree (``../``, a symbolic
    link out of it), is refused with the path named: tune-cp reads no file outside the
    experiment's layout (``model: /etc/shadow`` is refused)."""
    candidate = Path(name)
    here = experiment.resolve().parent
    if candidate.is_absolute() or not _inside(here / candidate, here):
        raise _refuse_outside(name, "modules.pre_trainer.model", here)
    direct = here / candidate
    if is_file(direct):
        return direct, here
    for folder in (here, *here.parents):
        for sub in MODEL_FOLDERS:
            path = folder / sub / candidate
            if is_file(path):
                if not _inside(path, folder):
                    raise _refuse_outside(name, "modules.pre_trainer.model", folder)
                return path, folder
    return None


def load_model_chain(path: Path, env: Mapping[str, str], notes: list[str],
                     root: Path | None = None) -> dict[str, Any]:
    """A Primus model YAML with its ``extends:`` presets merged (presets first, the file last).
    Primus joins each preset name to the extending file's folder
    (``primus/core/config/yaml_loader.py::_apply_extends``, ``os.path.join(os.path.dirname(path),
    ext)``); tune-cp refuses a preset outside ``root`` (the tree :func:`find_model_file` found
    the model in; default: the model file's folder) and stops a chain past
    :data:`MAX_PRESET_READS` reads or :data:`MAX_PRESET_DEPTH` links. A preset that cannot be
    found is noted and skipped."""
    reads = [0]
    return _load_chain(path, env, notes, path.parent if root is None else root, frozenset(),
                       reads)


def _load_chain(path: Path, env: Mapping[str, str], notes: list[str], root: Path,
                seen: frozenset[Path], reads: list[int]) -> dict[str, Any]:
    reads[0] += 1
    if reads[0] > MAX_PRESET_READS:
        raise ConfigError(f"Primus model file {show_name(path)}: the extends: chain reads more "
                          f"than {MAX_PRESET_READS} "
                          f"model files (MAX_PRESET_READS; presets that extend each other "
                          f"several times?); merge the presets into fewer files")
    if len(seen) >= MAX_PRESET_DEPTH:
        raise ConfigError(f"Primus model file {show_name(path)}: the extends: chain is more "
                          f"than {MAX_PRESET_DEPTH} "
                          f"files deep (MAX_PRESET_DEPTH); merge the presets into fewer files")
    data = resolve_placeholders(read_yaml_mapping(path, "Primus model file"), env, notes,
                                f"{path.name}: ")
    bases = data.pop("extends", None) or []
    if not isinstance(bases, str | list) or not all(isinstance(b, str) for b in
                                                    ([bases] if isinstance(bases, str) else bases)):
        raise ConfigError(f"{path.name}: extends: {_show(bases)} must name preset files (a name "
                          f"or a list of names)")
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        base_path = path.parent / str(base)
        if Path(str(base)).is_absolute() or not _inside(base_path, root):
            raise _refuse_outside(str(base), f"{path.name}: extends:", root)
        if is_file(base_path) and base_path.resolve() in seen | {path.resolve()}:
            notes.append(f"model preset {base} (extended by {path.name}) extends itself; "
                         "skipped")
            continue
        if not is_file(base_path):
            notes.append(f"model preset {base} (extended by {path.name}) was not found next to "
                         "it; its keys take Primus's language_model.yaml defaults")
            continue
        merged |= _load_chain(base_path, env, notes, root, seen | {path.resolve()}, reads)
    return merged | data
