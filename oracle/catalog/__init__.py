"""Catalogs of models and GPUs (data files beside this module) and loaders for user files.

``--model`` takes a catalog name or alias, a Hugging Face ``config.json`` (Llama, Mistral,
Mixtral, Qwen2/Qwen3, Qwen2-MoE/Qwen3-MoE, DeepSeek-V2/V3, GPT-OSS families) or a tune-cp model
file (YAML or JSON with the fields of :class:`config.specs.ModelSpec`). ``--gpu`` takes a catalog
name or alias or a YAML/JSON file in the catalog's entry format (see ``gpus.json``). Every error
is a :class:`config.specs.ConfigError` with a one-line message.
"""

from __future__ import annotations

import difflib
import json
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator

from tune_cp.config.specs import (
    GIB,
    ConfigError,
    GpuSpec,
    MambaSpec,
    ModelSpec,
    Spec,
    Vendor,
    validation_message,
)
from tune_cp.oracle.inputs import exists, is_dir, read_mapping, show_name, validate

HERE = Path(__file__).parent


# ------------------------------------------------------------------------------------ GPUs


#: Plausible range of each physical quantity of a GPU file, in the file's units: (lowest,
#: highest). Every accelerator tune-cp models lies well inside (the catalog spans 80-288 GiB,
#: 312-2,500 dense BF16 TFLOP/s, 2-8 TB/s HBM, 160-900 GB/s scale-up, 25-50 GB/s NIC, 400-1,400
#: W); the bounds are about what the arithmetic can hold, more than tenfold beyond any real
#: part on either side (``tests/test_input_classes.py``), so that only typos and hostile
#: values are refused:
#:
#: * floors: the time model divides work by every rate (FLOPs / FLOP/s, bytes / bytes/s); a
#:   rate of 1e-300 makes a step time overflow to inf (numpy warns, the CLI used to exit 3) and
#:   5e-324 made MFU ``nan``. The floors are those of the slowest parts anyone trains on, cut
#:   tenfold: 1 TFLOP/s of tensor math (a T4 has 65), 0.01 TB/s of HBM, 1 GB/s scale-up (PCIe 3
#:   x16 is 16), 0.1 GB/s NIC (1 GbE is 0.125), 1 GiB of HBM (the memory tables work in bytes;
#:   less cannot hold a layer), 10 W of board power;
#: * ceilings: HBM up to 2**20 GiB keeps a GPU's bytes below 2**50 (int64 with room for the
#:   CP-SAT sums of ``solver/model.py``); rates up to 1e6 TFLOP/s, 1,000 TB/s, 1e5 GB/s keep
#:   every step time above 1e-18 s of a 1-FLOP step.
GPU_RANGES: dict[str, tuple[float, float]] = {
    "hbm_gib": (1.0, float(1 << 20)),
    "peak_bf16_tflops": (1.0, 1e6),
    "peak_fp8_tflops": (1.0, 1e6),
    "peak_fp4_tflops": (1.0, 1e6),
    "hbm_tb_per_s": (0.01, 1e3),
    "sfu_exp_tera_per_s": (0.01, 1e4),
    "scale_up_gb_per_s": (1.0, 1e5),
    "nic_gb_per_s": (0.1, 1e5),
    "tdp_w": (10.0, 1e5),
}


def _in_range(key: str, value: float | None) -> float | None:
    """``value`` when it lies in :data:`GPU_RANGES` (None: not given); else a one-line error
    with the range and why it exists."""
    lo, hi = GPU_RANGES[key]
    if value is not None and not lo <= value <= hi:
        raise ValueError(f"outside the plausible range [{lo:g}, {hi:g}] (every "
                         f"real GPU lies far inside; see oracle/catalog/__init__.py::GPU_RANGES)")
    return value


#: Band of the power model's sustained tensor rate over a GPU's stated peak
#: (``oracle/compute.py::sustained_rate``, taken at both ends of ``power_clock_exponent``'s range
#: [0, 1], between which it is monotone). The catalog's parts lie in 0.90-1.33; outside 0.5-2 a
#: file's ``compute_units`` and ``tdp_w`` contradict its own peak (10 W with 2**20 compute units
#: projected an MFU of 114%).
POWER_FACTOR_RANGE = (0.5, 2.0)


def power_reference(gpu: GpuSpec) -> GpuSpec | None:
    """The catalog part ``gpu``'s power model is relative to (its architecture's entry in
    :data:`oracle.constants.POWER_REFERENCE_GPU`); None for an architecture without one."""
    from tune_cp.oracle.constants import POWER_REFERENCE_GPU

    name = POWER_REFERENCE_GPU.get(gpu.architecture or "")
    return None if name is None else gpu_entries()[name].to_spec()


def gpu_power_ratios(gpu: GpuSpec) -> tuple[float, float, float]:
    """:func:`oracle.compute.power_ratios` of ``gpu`` against its :func:`power_reference`."""
    from tune_cp.oracle.compute import power_ratios

    return power_ratios(gpu, power_reference(gpu))


def power_problem(gpu: GpuSpec) -> str | None:
    """Why ``gpu``'s ``compute_units`` / ``tdp_w`` put its power-limited rate outside
    :data:`POWER_FACTOR_RANGE` of its peak; None when they do not (or are not given)."""
    from tune_cp.oracle.compute import sustained_rate

    ratios = gpu_power_ratios(gpu)
    lo, hi = POWER_FACTOR_RANGE
    for gamma in (0.0, 1.0):
        f = float(sustained_rate(*ratios, gamma))
        if not lo <= f <= hi:
            return (f"compute_units ({gpu.compute_units}) and tdp_w ({gpu.tdp_w:g}) give a "
                    f"power-limited rate of {f:.3g} x the stated peak (power_clock_exponent "
                    f"{gamma:g}), outside [{lo:g}, {hi:g}]: they contradict peak_bf16_tflops "
                    f"against the {gpu.architecture} reference part (oracle/compute.py::"
                    f"sustained_rate); correct them or leave them out")
    return None


class GpuEntry(Spec):
    """A GPU as written in ``gpus.json`` or a user's ``--gpu`` file (human units; each physical
    quantity within :data:`GPU_RANGES`)."""

    name: str = Field(min_length=1)
    aliases: list[str] = []
    vendor: Vendor = Vendor.OTHER
    architecture: str = ""
    hbm_gib: float
    peak_bf16_tflops: float
    peak_fp8_tflops: float | None = None
    peak_fp4_tflops: float | None = None
    hbm_tb_per_s: float
    sfu_exp_tera_per_s: float | None = None
    scale_up_gb_per_s: float
    scale_up_domain_gpus: int = Field(ge=1, le=1 << 20)
    nic_gb_per_s: float
    gpus_per_node: int = Field(default=8, ge=1, le=1024, description="usual node size")
    tdp_w: float | None = None
    compute_units: int | None = Field(default=None, ge=1, le=1 << 20)
    source: str = ""
    notes: str = ""

    @field_validator(*GPU_RANGES)
    @classmethod
    def _plausible(cls, v: float | None, info: ValidationInfo) -> float | None:
        return _in_range(info.field_name or "", v)

    def to_spec(self) -> GpuSpec:
        """The spec in base units (bytes, FLOP/s, bytes/s); GiB and decimal T/G prefixes."""
        return GpuSpec(
            name=self.name,
            vendor=self.vendor,
            architecture=self.architecture,
            hbm_bytes=round(self.hbm_gib * GIB),
            peak_bf16_flops=self.peak_bf16_tflops * 1e12,
            peak_fp8_flops=None if self.peak_fp8_tflops is None else self.peak_fp8_tflops * 1e12,
            peak_fp4_flops=None if self.peak_fp4_tflops is None else self.peak_fp4_tflops * 1e12,
            hbm_bytes_per_s=self.hbm_tb_per_s * 1e12,
            sfu_exp_per_s=None if self.sfu_exp_tera_per_s is None else self.sfu_exp_tera_per_s * 1e12,
            scale_up_bytes_per_s=self.scale_up_gb_per_s * 1e9,
            scale_up_domain_gpus=self.scale_up_domain_gpus,
            nic_bytes_per_s=self.nic_gb_per_s * 1e9,
            gpus_per_node=self.gpus_per_node,
            tdp_w=self.tdp_w,
            compute_units=self.compute_units,
            source=self.source,
            notes=self.notes,
        )


@cache
def gpu_entries() -> dict[str, GpuEntry]:
    data = json.loads((HERE / "gpus.json").read_text())
    return {g["name"]: GpuEntry(**g) for g in data["gpus"]}


def _lookup(name: str, entries: dict[str, Any]) -> str | None:
    key = name.strip().lower()
    for canonical, entry in entries.items():
        if key == canonical or key in (a.lower() for a in entry.aliases):
            return canonical
    return None


def _unknown(kind: str, name: str, entries: dict[str, Any]) -> ConfigError:
    names = list(entries)
    family = family_members(name, names)
    if len(family) > 1:  # a family name ("mixtral"): which member is meant is not ours to guess
        return ConfigError(
            f"{kind} {show_name(name)} names {len(family)} catalog {kind}s: choose one of "
            f"{', '.join(family)} (`tune-cp {kind}s` lists them)")
    close = difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return ConfigError(
        f"unknown {kind} {show_name(name)}: {hint}choose one of {', '.join(names)}, "
        f"or pass a path to a {'config.json' if kind == 'model' else 'YAML/JSON GPU file'}"
    )


#: What may follow a family name in a catalog name (``mixtral`` + ``-8x22b``).
FAMILY_SEPARATORS = ("-", "_", ".", "/")


def family_members(name: str, names: Any) -> list[str]:
    """The catalog names ``name`` is the family prefix of (``mixtral`` -> ``mixtral-8x7b``,
    ``mixtral-8x22b``): the name followed by a separator. A name, or an alias, that is the
    prefix of several is ambiguous (``tests/test_catalog.py`` keeps every alias unambiguous)."""
    key = name.strip().lower()
    return [n for n in names if any(n.lower().startswith(key + sep) for sep in FAMILY_SEPARATORS)]


def catalog_alias(name: str, kind: str) -> str | None:
    """The catalog name ``name`` stands for when it is an alias of it (not the name itself, in
    any letter case, nor a file): what the defaults line states (``--model llama3-70b (the
    catalog's alias 'llama3.1-70b')``), so no alias is taken silently."""
    entries = model_entries() if kind == "model" else gpu_entries()
    canonical = _lookup(name, entries)
    if canonical is None or name.strip().lower() == canonical.lower():
        return None
    return canonical


def _read_mapping(path: Path, what: str) -> dict[str, Any]:
    return read_mapping(path, f"{what} file")


def _looks_like_path(name: str) -> bool:
    return "/" in name or "\\" in name or name.lower().endswith((".json", ".yaml", ".yml"))


def load_gpu(name_or_path: str) -> GpuSpec:
    """A catalog GPU by name or alias, or a GPU file (YAML/JSON in the catalog's entry format)."""
    entries = gpu_entries()
    canonical = _lookup(name_or_path, entries)
    if canonical is not None:
        return entries[canonical].to_spec()
    path = Path(name_or_path)
    if not (_looks_like_path(name_or_path) or exists(path)):
        raise _unknown("gpu", name_or_path, entries)
    data = _read_mapping(path, "GPU")
    try:
        spec = validate(GpuEntry, data, f"GPU file {show_name(path)}").to_spec()
        from tune_cp.oracle.constants import architecture_key

        try:
            architecture_key(spec.architecture)
        except ConfigError as e:
            raise ConfigError(f"GPU file {str(path)!r}: {e}") from e
        if why := power_problem(spec):
            raise ConfigError(f"GPU file {show_name(path)}: {why}")
        return spec
    except ValidationError as e:
        raise ConfigError(f"GPU file {show_name(path)}: {validation_message(e)}") from e
    except TypeError as e:
        raise ConfigError(f"GPU file {show_name(path)}: {e}") from e


# ---------------------------------------------------------------------------------- models


class ModelEntry(ModelSpec):
    """A catalog model: the spec plus lookup aliases and the source of its search defaults."""

    aliases: list[str] = []
    default_source: str = ""

    def to_spec(self) -> ModelSpec:
        return ModelSpec(**self.model_dump(exclude={"aliases", "default_source"}))


@cache
def model_entries() -> dict[str, ModelEntry]:
    data = json.loads((HERE / "models.json").read_text())
    return {m["name"]: ModelEntry(**m) for m in data["models"]}


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name or alias, a Hugging Face ``config.json``, or a tune-cp model file."""
    entries = model_entries()
    canonical = _lookup(name_or_path, entries)
    if canonical is not None:
        return entries[canonical].to_spec()
    path = Path(name_or_path)
    if is_dir(path) and exists(path / "config.json"):
        path = path / "config.json"
    if not (_looks_like_path(name_or_path) or exists(path)):
        raise _unknown("model", name_or_path, entries)
    data = _read_mapping(path, "model")
    label = path.parent.name if path.name == "config.json" else path.stem
    try:
        if "model_type" in data or "architectures" in data:
            return model_from_hf_config(data, name=label or "custom")
        data.setdefault("name", label or "custom")
        return validate(ModelSpec, data, "")
    except ValidationError as e:
        raise ConfigError(f"model file {show_name(path)}: {validation_message(e)}") from e
    except ConfigError as e:
        raise ConfigError(f"model file {show_name(path)}: {e}") from e
    except TypeError as e:
        raise ConfigError(f"model file {show_name(path)}: {e}") from e


HF_FAMILIES = {
    "llama": "llama",
    "mistral": "llama",
    "mixtral": "mixtral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen2_moe": "qwen2_moe",
    "qwen3_moe": "qwen3_moe",
    "deepseek_v2": "deepseek_v3",
    "deepseek_v3": "deepseek_v3",
    "gpt_oss": "gpt_oss",
    "nemotron_h": "nemotron_h",
}


def _need(cfg: dict[str, Any], key: str, family: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"a {family} config.json needs {key!r}, which is missing")
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key!r} must be an integer, got {value!r}")
    return value


def _int(cfg: dict[str, Any], key: str, default: int) -> int:
    """An optional integer of a config.json (``default`` when absent, null or 0)."""
    value = cfg.get(key) or default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key!r} must be an integer, got {value!r}")
    return value


def _num(cfg: dict[str, Any], key: str, default: Any, whole: bool = False,
         within: str = "") -> Any:
    """An optional number of a config.json: ``default`` when absent or null, else the value as
    written, which must be a JSON number (an integer when ``whole``); a string such as
    ``"big"`` or ``"8"`` and a boolean are refused, not converted (0 stays 0: the spec's bounds
    decide whether it is legal). ``within``: the mapping ``cfg`` is, for the message."""
    value = cfg.get(key)
    if value is None:
        return default
    kind = int if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        want = "an integer" if whole else "a number"
        raise ConfigError(f"config.json {within}{key!r} must be {want} (without quotes), got "
                          f"{value!r}")
    return value


def _flag(cfg: dict[str, Any], key: str, default: bool) -> bool:
    """An optional boolean of a config.json (``default`` when absent or null)."""
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"config.json {key!r} must be true or false, got {value!r}")
    return value


def _positive(cfg: dict[str, Any], key: str, default: int) -> int:
    """An optional positive integer (``default`` when absent or null; 0 is refused, not read
    as the default)."""
    value = _num(cfg, key, default, whole=True)
    if value < 1:
        raise ConfigError(f"config.json {key!r} must be a positive integer, got {value!r} (leave "
                          f"it out for the default, {default})")
    return value


#: DeepSeek-V2/V3 ``scoring_func`` values (transformers ``DeepseekV3TopkRouter``: sigmoid;
#: DeepSeek-V2's ``MoEGate``: softmax); Megatron-LM ``--moe-router-score-function`` has the
#: same two (``arguments.py``: ``choices=['softmax', 'sigmoid']``).
HF_SCORING_FUNCS = ("softmax", "sigmoid")


def model_from_hf_config(cfg: dict[str, Any], name: str = "custom") -> ModelSpec:
    """Map a Hugging Face ``config.json`` to a :class:`ModelSpec` (field names per family)."""
    model_type = cfg.get("model_type")
    if model_type not in HF_FAMILIES:
        raise ConfigError(
            f"unsupported model_type {model_type!r}; supported: {', '.join(sorted(HF_FAMILIES))} "
            f"(or write a tune-cp model file with the ModelSpec fields)"
        )
    family = HF_FAMILIES[model_type]
    h = _need(cfg, "hidden_size", family)
    heads = _need(cfg, "num_attention_heads", family)
    spec: dict[str, Any] = {
        "name": name,
        "family": family,
        "num_layers": _need(cfg, "num_hidden_layers", family),
        "hidden_size": h,
        "num_attention_heads": heads,
        "num_kv_heads": _positive(cfg, "num_key_value_heads", heads),
        "head_dim": _num(cfg, "head_dim", 0, whole=True) or (h // heads if heads else 0),
        "vocab_size": _need(cfg, "vocab_size", family),
        "tied_embeddings": _flag(cfg, "tie_word_embeddings", False),
        "ffn_hidden_size": _num(cfg, "intermediate_size", 0, whole=True),
        "default_seq_len": min(_int(cfg, "max_position_embeddings", 4096), 8192),
        "source": f"Hugging Face config.json (model_type {model_type})",
    }
    spec["attention_dropout"] = _num(cfg, "attention_dropout", 0.0)
    if family in ("qwen2", "qwen2_moe"):
        spec["qkv_bias"] = True
    if family in ("qwen3", "qwen3_moe"):
        spec["qk_norm"] = True
    if _flag(cfg, "attention_bias", False) and family in ("llama", "qwen3", "qwen3_moe"):
        spec["qkv_bias"] = spec["attn_out_bias"] = True
    if family == "mixtral":
        spec |= {
            "num_experts": _need(cfg, "num_local_experts", family),
            "moe_top_k": _need(cfg, "num_experts_per_tok", family),
            "expert_ffn_hidden_size": _need(cfg, "intermediate_size", family),
        }
    elif family in ("qwen2_moe", "qwen3_moe"):
        spec |= {
            "num_experts": _need(cfg, "num_experts", family),
            "moe_top_k": _need(cfg, "num_experts_per_tok", family),
            "expert_ffn_hidden_size": _need(cfg, "moe_intermediate_size", family),
        }
        if cfg.get("mlp_only_layers") or _int(cfg, "decoder_sparse_step", 1) != 1:
            raise ConfigError(
                "mlp_only_layers / decoder_sparse_step != 1 (interleaved dense layers) are not "
                "supported; only leading dense layers are"
            )
        if shared := _num(cfg, "shared_expert_intermediate_size", 0, whole=True):
            spec["num_shared_experts"] = 1
            spec["shared_expert_ffn_hidden_size"] = shared
    elif family == "deepseek_v3":
        spec |= {
            "num_experts": _need(cfg, "n_routed_experts", family),
            "moe_top_k": _need(cfg, "num_experts_per_tok", family),
            "expert_ffn_hidden_size": _need(cfg, "moe_intermediate_size", family),
            "num_shared_experts": _num(cfg, "n_shared_experts", 0, whole=True),
            "shared_expert_ffn_hidden_size": _num(cfg, "moe_intermediate_size", 0, whole=True),
            "num_dense_layers": _num(cfg, "first_k_dense_replace", 0, whole=True),
            "router_expert_bias": cfg.get("topk_method") == "noaux_tc",
            "num_mtp_layers": _num(cfg, "num_nextn_predict_layers", 0, whole=True),
            "num_kv_heads": heads,
            "mla": {
                "q_lora_rank": _num(cfg, "q_lora_rank", 0, whole=True),
                "kv_lora_rank": _need(cfg, "kv_lora_rank", family),
                "qk_nope_head_dim": _need(cfg, "qk_nope_head_dim", family),
                "qk_rope_head_dim": _num(cfg, "qk_rope_head_dim", 0, whole=True),
                "v_head_dim": _need(cfg, "v_head_dim", family),
            },
        }
        spec["head_dim"] = spec["mla"]["qk_nope_head_dim"] + spec["mla"]["qk_rope_head_dim"]
    elif family == "gpt_oss":
        layer_types = cfg.get("layer_types") or []
        spec |= {
            "num_experts": _need(cfg, "num_local_experts", family),
            "moe_top_k": _need(cfg, "num_experts_per_tok", family),
            "expert_ffn_hidden_size": _need(cfg, "intermediate_size", family),
            "ffn_hidden_size": 0,
            "qkv_bias": _flag(cfg, "attention_bias", True),
            "attn_out_bias": _flag(cfg, "attention_bias", True),
            "mlp_bias": True,
            "router_bias": True,
            "attention_sinks": True,
            "sliding_window": _num(cfg, "sliding_window", 0, whole=True),
            "num_sliding_window_layers": sum(1 for t in layer_types if t == "sliding_attention"),
        }
    elif family == "nemotron_h":
        spec |= _hf_nemotron_h(cfg, family)
    spec |= _hf_rope_and_norm(cfg, model_type)
    spec |= _hf_sliding_window(cfg, model_type, spec["num_layers"])
    if family == "gpt_oss":
        # openai/gpt-oss modeling: glu = gate * sigmoid(1.702 gate) * (up + 1), both clamped
        # at swiglu_limit (Megatron-LM --quick-geglu --glu-linear-offset 1.0
        # --activation-func-clamp-value 7.0)
        spec |= {"activation": "quick_geglu", "glu_linear_offset": GPT_OSS_LINEAR_OFFSET,
                 "activation_clamp": float(_num(cfg, "swiglu_limit", GPT_OSS_CLAMP))}
    if family == "deepseek_v3":
        score = cfg.get("scoring_func")
        if score is not None and score not in HF_SCORING_FUNCS:
            raise ConfigError(f"config.json scoring_func {score!r} is not a router score "
                              f"function tune-cp or Megatron-LM knows; choose "
                              f"{' or '.join(HF_SCORING_FUNCS)}")
        spec |= {"router_score": score or "softmax",
                 "router_num_groups": _num(cfg, "n_group", 0, whole=True),
                 "router_group_topk": _num(cfg, "topk_group", 0, whole=True),
                 "router_topk_scaling_factor": float(_num(cfg, "routed_scaling_factor", 1.0))}
        groups, top = spec["router_num_groups"], spec["router_group_topk"]
        if groups == 1 and top > 1:  # one group: the checks below never see it
            raise ConfigError(f"config.json topk_group ({top}) must be at most n_group "
                              f"({groups}): the router picks topk_group of the n_group groups")
        if groups <= 1:  # one group is no group-limited routing
            spec["router_num_groups"] = spec["router_group_topk"] = 0
    if family == "qwen2_moe" and spec.get("num_shared_experts"):
        spec["shared_expert_gate"] = True  # Qwen2MoeSparseMoeBlock.shared_expert_gate
    for key in UNMODELLED_HF_KEYS:
        if cfg.get(key) not in (None, False, 0):
            raise ConfigError(f"config.json {key} {cfg[key]!r} changes the model and is not "
                              "modelled by tune-cp")
    # strictly, as a model file is: a value passed on unread (a string where a number
    # belongs) is refused by the spec, not converted
    return validate(ModelSpec, {k: v.model_dump(mode="json") if isinstance(v, Spec) else v
                                for k, v in spec.items()}, "")


def _hf_nemotron_h(cfg: dict[str, Any], family: str) -> dict[str, Any]:
    """ModelSpec fields of a Hugging Face ``NemotronHForCausalLM`` config (transformers
    ``configuration_nemotron_h.py``; defaults: ``NemotronHConfig``'s): the hybrid pattern
    (``hybrid_override_pattern``, one of ``M * - E`` per layer), the Mamba-2 mixer
    (``ssm_state_size``, ``mamba_head_dim``, ``mamba_num_heads``, ``n_groups``, ``conv_kernel``,
    ``chunk_size``), squared-ReLU MLPs (``mlp_hidden_act`` relu2), RMSNorm
    (``layer_norm_epsilon``), no position embedding, and for ``E`` layers the sigmoid-routed
    MoE (``n_routed_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``, the shared
    expert ``moe_shared_expert_intermediate_size``, ``moe_latent_size``,
    ``routed_scaling_factor``) and MTP (``num_nextn_predict_layers``)."""
    pattern = cfg.get("hybrid_override_pattern")
    if pattern is None or pattern == "":
        raise ConfigError("a nemotron_h config.json needs 'hybrid_override_pattern', which is "
                          "missing")
    if not isinstance(pattern, str):
        raise ConfigError(f"'hybrid_override_pattern' must be a string of M * - E (one per "
                          f"layer), got {pattern!r}")
    if bad := sorted(set(pattern) - set("M*-E")):
        raise ConfigError(f"'hybrid_override_pattern' {pattern!r} has {', '.join(map(repr, bad))}; "
                          f"each character is one of M (Mamba), * (attention), - (MLP), E (MoE)")
    layers = _need(cfg, "num_hidden_layers", family)
    if len(pattern) != layers:
        raise ConfigError(f"hybrid_override_pattern has {len(pattern)} layers, "
                          f"num_hidden_layers is {layers}; they must agree")
    if cfg.get("mlp_hidden_act", "relu2") != "relu2":
        raise ConfigError(f"nemotron_h mlp_hidden_act {cfg['mlp_hidden_act']!r} is not modelled "
                          "(relu2 is)")
    heads = _need(cfg, "num_attention_heads", family)
    out: dict[str, Any] = {
        "hybrid_pattern": pattern,
        "num_layers": len(pattern),
        "head_dim": _num(cfg, "head_dim", 0, whole=True)
        or _num(cfg, "attention_head_dim", 0, whole=True)
        or _need(cfg, "hidden_size", family) // heads,
        "gated_mlp": False, "activation": "squared_relu", "position_embedding": "none",
        "ffn_hidden_size": _num(cfg, "intermediate_size", 0, whole=True) if "-" in pattern else 0,
        "mamba": None,
    }
    if "M" in pattern:
        def size(keys: tuple[str, ...], default: int) -> int:
            # NemotronHConfig's default when every spelling is absent or null; else a positive
            # integer, named by the key the file used (0 or -1 is no Mamba mixer)
            key = next((k for k in keys if cfg.get(k) is not None), None)
            if key is None:
                return default
            value = cfg[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{key!r} must be a positive integer, got {value!r}")
            return value

        heads_keys, groups_keys = ("mamba_num_heads",), ("n_groups", "mamba_n_groups")
        num_heads, num_groups = size(heads_keys, 128), size(groups_keys, 8)
        if num_heads % num_groups:  # named by the config.json keys, not MambaSpec's fields

            def named(keys: tuple[str, ...]) -> str:
                key = next((k for k in keys if cfg.get(k) is not None), None)
                return repr(key) if key else f"{keys[0]!r} (NemotronHConfig default)"

            raise ConfigError(f"config.json {named(heads_keys)} ({num_heads}) must be a multiple "
                              f"of {named(groups_keys)} ({num_groups}): each group of B and C "
                              f"serves a whole number of Mamba heads")
        out["mamba"] = MambaSpec(
            state_dim=size(("ssm_state_size",), 128),
            head_dim=size(("mamba_head_dim",), 64),
            num_heads=num_heads,
            num_groups=num_groups,
            conv_kernel=size(("conv_kernel", "mamba_d_conv"), 4),
            chunk_size=size(("chunk_size", "mamba_chunk_size"), 128),
        )
    if "E" in pattern:
        shared = _num(cfg, "moe_shared_expert_intermediate_size", 0, whole=True)

        def positive(key: str) -> int:
            value = _need(cfg, key, family)
            if value < 1:
                raise ConfigError(f"{key!r} must be a positive integer, got {value!r}")
            return value

        out |= {
            "num_experts": positive("n_routed_experts"),
            "moe_top_k": positive("num_experts_per_tok"),
            "expert_ffn_hidden_size": positive("moe_intermediate_size"),
            "num_shared_experts": _num(cfg, "n_shared_experts", 1, whole=True) if shared else 0,
            "shared_expert_ffn_hidden_size": shared,
            "moe_latent_size": _num(cfg, "moe_latent_size", 0, whole=True),
            "router_score": "sigmoid", "router_expert_bias": True,
            "router_topk_scaling_factor": float(_num(cfg, "routed_scaling_factor", 1.0)),
            "num_mtp_layers": _num(cfg, "num_nextn_predict_layers", 0, whole=True),
        }
    return out


GPT_OSS_LINEAR_OFFSET = 1.0  # openai/gpt-oss: (up + 1)
GPT_OSS_CLAMP = 7.0  # openai/gpt-oss config.json swiglu_limit
HF_DEFAULT_ROPE_THETA = 10000.0  # transformers PretrainedConfig default rope_theta
#: the spellings of the norm epsilon in config.json files, the first present is read
HF_EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "norm_epsilon", "layer_norm_epsilon")
UNMODELLED_HF_KEYS = ("attn_logit_softcapping", "final_logit_softcapping",
                      "router_logit_softcapping")


def _hf_rope_and_norm(cfg: dict[str, Any], model_type: str) -> dict[str, Any]:
    """``rope_theta`` (a positive number; absent or null: transformers' default), ``rope_scaling``
    (null or a mapping; llama3 / yarn, other kinds are refused) and the norm epsilon
    (``rms_norm_eps`` or its other spellings: a number in (0, 1))."""
    theta = _num(cfg, "rope_theta", HF_DEFAULT_ROPE_THETA)
    if theta <= 0:
        raise ConfigError(f"config.json 'rope_theta' must be a positive number, got {theta!r} "
                          f"(leave it out for transformers' default, {HF_DEFAULT_ROPE_THETA:g})")
    out: dict[str, Any] = {"rotary_base": float(theta)}
    key = next((k for k in HF_EPS_KEYS if cfg.get(k) is not None), None)
    if key is not None:
        eps = _num(cfg, key, 0.0)
        if not 0 < eps < 1:
            raise ConfigError(f"config.json {key!r} must be a number in (0, 1), got {eps!r}")
        out["norm_epsilon"] = float(eps)
    scaling = cfg.get("rope_scaling")
    if scaling is None:
        return out
    if not isinstance(scaling, dict):
        raise ConfigError(f"config.json 'rope_scaling' must be a mapping such as "
                          f'{{"rope_type": "llama3", "factor": 8.0}} or null, got {scaling!r}')
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind in ("llama3", "yarn"):
        factor = _num(scaling, "factor", 1.0, within="rope_scaling ")
        if factor < 1:
            raise ConfigError(f"config.json rope_scaling 'factor' must be a number >= 1, got "
                              f"{factor!r}")
        original = _num(scaling, "original_max_position_embeddings", 0, whole=True,
                        within="rope_scaling ")
        if original < 0:
            raise ConfigError(f"config.json rope_scaling 'original_max_position_embeddings' "
                              f"must be a positive integer, got {original!r}")
        out |= {"rope_scaling": kind, "rope_scaling_factor": float(factor),
                "rope_original_max_position_embeddings": original}
    elif kind not in (None, "default"):
        raise ConfigError(f"config.json rope_scaling {kind!r} (model_type {model_type}) is "
                          "not modelled; tune-cp reads llama3 and yarn rope scaling")
    return out


def _hf_sliding_window(cfg: dict[str, Any], model_type: str, layers: int) -> dict[str, Any]:
    """Mistral / Mixtral ``sliding_window``: every layer; Qwen2/3 only with
    ``use_sliding_window`` (on every layer from ``max_window_layers``: refused unless all)."""
    window = _num(cfg, "sliding_window", 0, whole=True)
    if model_type in ("mistral", "mixtral") and window:
        return {"sliding_window": window, "num_sliding_window_layers": layers}
    if model_type.startswith("qwen") and _flag(cfg, "use_sliding_window", False) and window:
        if _num(cfg, "max_window_layers", 0, whole=True) != 0:
            raise ConfigError(f"config.json use_sliding_window with max_window_layers "
                              f"{cfg.get('max_window_layers')} (sliding windows on part of the "
                              "layers) is not modelled")
        return {"sliding_window": window, "num_sliding_window_layers": layers}
    return {}
