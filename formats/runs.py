"""Published (or logged) training runs as specs: one :class:`RunRow` per CSV row.

The CSV has the columns of ``../shared/calibration/published_runs.csv`` (a user's own logged runs
in the same columns work too). Each row becomes either the four specs the oracle needs (model,
cluster, training, resolved parallel config) or the reason it cannot be represented.

Rules (each documented where it is applied):

* **Model**: when the row names a catalog model (name or alias, ignoring case, spaces,
  underscores, dashes and a parenthesised suffix), start from the catalog entry and take the
  row's numeric architecture columns over it; otherwise build it from the columns. A missing
  ``num_kv_heads`` means MHA (Megatron's default without ``--group-query-attention``); a missing
  vocabulary is taken from the catalog model of the same family prefix (``gpt3``, ``llama2``);
  head dim is ``kv_channels N`` from the notes, else hidden / heads. Gated MLP (SwiGLU): the
  catalog's flag, else the family (llama, mistral, mixtral, qwen, deepseek, gpt-oss gated; gpt,
  mpt not), else gated unless ``ffn == 4 h``.
* **GPU**: catalog name or alias, or the catalog name the GPU column starts with
  (``H100 96GB HBM2e SXM-variant`` -> ``h100``); a power limit stated in the column
  (``500W limit``) replaces the catalog's ``tdp_w`` (it sets the sustained tensor rate,
  :func:`oracle.compute.sustained_rate`).
* **Parallel layout**: tp, pp, vpp, cp, ep, etp, mbs from the columns (``n/a`` = 1; etp blank =
  tp, except 1 for Megatron-Bridge MoE rows, whose recipes set it); dp is always world / (tp pp cp) (the CSV's dp column is sometimes world / (tp pp ep)).
  FSDP when the ``fsdp`` column is > 0; the distributed optimizer unless the optimizer column
  says ``none``. Schedule: ``DualPipe`` and ``zero bubble`` -> zero-bubble; ``1F1B`` without
  interleaving -> 1f1b.
* **Batch**: a missing global batch is ``local batch N`` x dp when the row says so, else the
  catalog model's default, rounded up to a multiple of mbs x dp; a missing sequence length is the
  catalog model's default.
* **Software stack**: the ``framework`` column names it (:func:`oracle.constants.software_stack`:
  torchtitan, llm-foundry, pytorch-fsdp (a plain PyTorch FSDP script), else megatron).
* **FSDP**: the ``fsdp`` column is a degree (> 0) or the strategy's name (``FSDP``, ``FSDP2``).
* **Precision**: NVFP4 -> fp4; FP8 flavours -> fp8 with recipe ``blockwise`` (blockwise, 1x128,
  torchao rowwise), ``mxfp8`` (MX, block-scaled), ``delayed``, else ``tensorwise`` (current
  scaling, "FP8-CS", torchao tensorwise); FP16 / BF16 / amp / unstated -> bf16.
* **Run traits** (:class:`oracle.work.RunTraits`): TP communication overlap is on for
  Megatron-Bridge / NeMo / Primus recipes (Transformer Engine userbuffers), for torchtitan only
  with async TP (``Async TP`` / ``AsyncTP`` in the settings), for other Megatron-LM runs only
  when the settings name ``--tp-comm-overlap``; off elsewhere. FP8 ``rowwise`` (torchao) sets
  ``fp8_rowwise``. A model or workload named ``tokendrop`` / ``token-drop`` sets
  ``moe_dropless=False`` (capacity-factor MoE: no host-device synchronisation per layer).
* **MoE dispatcher**: Megatron-Bridge's MoE performance recipes use the flex dispatcher
  (``moe_flex_dispatcher_backend`` ``hybridep`` or ``deepep``: DeepSeek-V3, Qwen3-30B-A3B,
  GPT-OSS from 26.04, Kimi K2, Qwen3-235B-A22B on GB200/GB300) except Qwen3-235B-A22B on B200,
  B300 and H100, which set ``moe_token_dispatcher_type="alltoall"``, and releases whose recipe
  set no flex backend (:data:`BRIDGE_RECIPE_SETTINGS`: GPT-OSS up to 26.02, Qwen3-30B-A3B on
  H100/B200 up to 25.12)
  (``scripts/performance/configs/{deepseek,qwen,gpt_oss}/*_workload_base_configs.py``);
  :data:`BRIDGE_ALLTOALL_MOE`. A row whose settings name DeepEP, HybridEP, the flex dispatcher or
  DualPipe (DeepSeek-V3's own run: node-limited routing, tokens sent once per node over IB and
  forwarded over NVLink) uses the flex dispatcher; other frameworks the all-to-all dispatcher
  (Megatron's default).
* **Recipe settings by release** (:data:`BRIDGE_RECIPE_SETTINGS`): a Megatron-Bridge row whose
  performance recipe set CUDA graphs, the MoE all-to-all overlap or the dispatcher differently
  in the row's release (``NeMo container YY.MM``) gets those settings
  (:class:`oracle.work.RunTraits` ``cuda_graph_scope`` / ``moe_a2a_overlap``, the
  dispatcher), each entry with the Megatron-Bridge commit that set it. Settings stated in
  ``other_settings`` (``--cuda-graph-impl full_iteration``, ``--cuda-graph-scope ...``,
  ``--overlap-moe-expert-parallel-comm``, ``moe_a2a_overlap``; ``DualPipe``: the all-to-all
  overlap) apply to any row. Other rows:
  no CUDA graphs, no all-to-all overlap (the recipes' partial CUDA-graph scopes of other
  releases are not transcribed: their saving is inside the fitted per-operation host time).
* **Recompute**: ``full`` -> full (``recompute_num_layers N`` and ``method block|uniform`` when
  given, else every layer); ``selective modules [..]`` -> those modules; torchtitan's per-op
  selective AC (recomputes every second matmul) -> selective ``mlp`` (the module closest to half
  the layer's GEMMs); Megatron ``recompute-activations`` -> selective ``core_attn``;
  ``RMSNorm and MLA up-projection`` -> ``layernorm, mla_up_proj``; blank / none -> none.
* **Recipe memory settings** (:func:`recipe_settings`, kept apart in ``RunRow.recipe`` and applied
  by :meth:`RunRow.recipe_cfg`, not to ``cfg``: the time model and its calibration read the
  columns only): what the framework's recipe sets that the row does not state and that changes
  memory. Megatron-Bridge performance recipes (``scripts/performance/configs/*/
  *_llm_pretrain.py``, ``set_*_common_configs`` of Llama 3, Llama 3.1, DeepSeek-V3, Qwen3 and
  GPT-OSS) set ``grad_reduce_in_fp32 = False`` (bf16 gradient buffers); their FP8 tensorwise,
  delayed and MXFP8 mixed-precision recipes (``training/mixed_precision.py``:
  ``bf16_with_fp8_current_scaling_mixed`` etc.) set ``fp8_param_gather = True`` (blockwise /
  subchannel does not); DeepSeek-V3's sets ``recompute_granularity = "selective"`` with the
  workload's ``recompute_modules = ["mla_up_proj"]`` (``deepseek_workload_base_configs.py``,
  B200 / B300 / GB300 and GB200 MXFP8) when the row leaves recompute blank. The recipes run
  with ``expandable_segments:True`` (no fragmentation allowance, :func:`recipe_fragmentation`);
  their FSDP recipes offload activations to the CPU (:data:`BRIDGE_CPU_OFFLOAD_LAYERS`, named,
  not modelled).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tune_cp.config.resolve import resolve_config
from tune_cp.config.specs import (
    ClusterSpec,
    ConfigError,
    Dispatcher,
    Fp8Recipe,
    GpuSpec,
    ModelSpec,
    OptimizerState,
    ParallelConfig,
    Precision,
    Recompute,
    RecomputeMethod,
    Schedule,
    StateDtype,
    TrainingSpec,
)
from tune_cp.oracle.catalog import gpu_entries, load_gpu, model_entries
from tune_cp.oracle.constants import software_stack
from tune_cp.oracle.work import RunTraits

REQUIRED_COLUMNS = (
    "row_id", "source", "model", "num_gpus", "tp", "pp", "tokens_per_sec_per_gpu",
)
#: (catalog model, GPUs) whose Megatron-Bridge MoE recipe keeps the all-to-all dispatcher; every
#: other Megatron-Bridge MoE row uses the flex dispatcher (see the module docstring).
BRIDGE_ALLTOALL_MOE: dict[str, tuple[str, ...]] = {
    "qwen3-235b-a22b": ("b200", "b300", "h100"),
}
#: Megatron-Bridge performance-recipe settings that change the time of a published
#: configuration, by (catalog model, GPUs, FP8 recipe or None for any, first release, last
#: release or None, settings, source). Releases are ``(yy, mm)`` of ``NeMo container YY.MM``.
#: Settings: ``cuda_graph_scope``, ``moe_a2a_overlap``, ``dispatcher``.
BRIDGE_RECIPE_SETTINGS: tuple[tuple[str, tuple[str, ...], str | None, tuple[int, int],
                                    tuple[int, int] | None, dict[str, Any], str], ...] = (
    # full-iteration CUDA graphs (dropless MoE padded to a capacity, paged stash) with the
    # all-to-all overlap, in the MXFP8 recipes from 26.06
    ("qwen3-30b-a3b", ("gb200", "gb300"), "mxfp8", (26, 6), None,
     {"cuda_graph_scope": ("full_iteration",), "moe_a2a_overlap": True},
     "Megatron-Bridge 55443cbfb (2026-06-10) qwen3_workload_base_configs.py: "
     "cuda_graph_impl='full_iteration', moe_a2a_overlap=True for GB200/GB300 FP8_MX"),
    ("qwen3-235b-a22b", ("gb200", "gb300"), "mxfp8", (26, 6), None,
     {"cuda_graph_scope": ("full_iteration",), "moe_a2a_overlap": True},
     "Megatron-Bridge 55443cbfb (2026-06-10): the same for the 235B GB200/GB300 FP8_MX V2"),
    ("deepseek-v3", ("gb200",), "mxfp8", (26, 6), None,
     {"cuda_graph_scope": ("full_iteration",), "moe_a2a_overlap": True},
     "Megatron-Bridge afb5dd47c (2026-06-10) deepseek_workload_base_configs.py GB200 FP8_MX"),
    ("deepseek-v3", ("gb300",), "mxfp8", (26, 6), None,
     {"cuda_graph_scope": ("full_iteration",), "moe_a2a_overlap": True},
     "Megatron-Bridge 8af195c0a (2026-06-06) deepseek_workload_base_configs.py GB300 FP8_MX"),
    # before NVL8 HybridEP (7c06ec0c0, 2026-01-23) the flex backend ran only on GB200/GB300
    # (flex_dispatcher_backend.py at cb62f8620); the Qwen3-30B H100/B200 recipes asked for none,
    # so the provider's moe_token_dispatcher_type='alltoall' ran
    ("qwen3-30b-a3b", ("h100", "b200"), None, (25, 1), (25, 12),
     {"dispatcher": "alltoall"},
     "Megatron-Bridge cb62f8620 (2025-11-21) configs/qwen3/workload_base_configs.py (no flex "
     "backend for H100/B200), qwen_provider.py Qwen3MoEModelProvider"),
    ("qwen3-30b-a3b", ("h100",), None, (25, 11), (25, 12),
     {"moe_a2a_overlap": True},
     "Megatron-Bridge cb62f8620 (2025-11-21) QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG "
     "moe_a2a_overlap=True"),
    ("qwen3-235b-a22b", ("b300",), None, (26, 1), (26, 2),
     {"moe_a2a_overlap": True},
     "Megatron-Bridge 8a109954b (2026-02-03) QWEN3_235B_A22B_PRETRAIN_CONFIG_B300_*_V1 "
     "moe_a2a_overlap=True (set to the B200 configs, no overlap, by 592711afc, 2026-03-10)"),
    ("deepseek-v3", ("b200",), None, (25, 11), (25, 12),
     {"moe_a2a_overlap": True},
     "Megatron-Bridge cb62f8620 (2025-11-21) DEEPSEEK_V3_B200_BASE_CONFIG moe_a2a_overlap=True"),
    # GPT-OSS's performance recipes asked for no flex backend until 7260d6214 (2026-03-23, "perf
    # optimizations- GPT-OSS 120B": moe_flex_dispatcher_backend="hybridep" for GB200/B300/B200
    # V2), so the provider's moe_token_dispatcher_type="alltoall" ran (gpt_oss_provider.py l.72
    # at cb62f8620; configs/gpt_oss/workload_base_configs.py there sets none)
    ("gpt-oss-120b", ("h100", "b200", "b300", "gb200", "gb300"), None, (25, 1), (26, 2),
     {"dispatcher": "alltoall"},
     "Megatron-Bridge cb62f8620 (2025-11-21) gpt_oss_provider.py moe_token_dispatcher_type="
     "'alltoall', no moe_flex_dispatcher_backend in the GPT-OSS base configs until 7260d6214"),
)

GATED_FAMILIES = ("llama", "mistral", "mixtral", "qwen", "deepseek", "gptoss", "kimi")
NON_GATED_FAMILIES = ("gpt", "mpt", "nemotron")


@dataclass
class RunRow:
    """One CSV row: its identity, measurement, and specs or the reason there are none."""

    row_id: str
    source: str
    source_id: str
    model_name: str
    gpu_name: str
    measured_tokens_per_s_per_gpu: float | None
    measured_model_tflops_per_gpu: float | None
    model: ModelSpec | None = None
    cluster: ClusterSpec | None = None
    training: TrainingSpec | None = None
    cfg: ParallelConfig | None = None
    reason: str | None = None
    notes: list[str] = field(default_factory=list)
    software: str = "megatron"
    traits: RunTraits = field(default_factory=RunTraits)
    #: memory settings the framework's recipe implies (:func:`recipe_settings`) and their notes
    recipe: dict[str, Any] = field(default_factory=dict)
    recipe_notes: list[str] = field(default_factory=list)
    #: the caching allocator's fragmentation allowance the recipe implies (None: tune-cp's default)
    recipe_fragmentation: float | None = None

    def recipe_cfg(self) -> ParallelConfig | None:
        """``cfg`` with the recipe's memory settings applied (``cfg`` itself when there are none)."""
        if self.cfg is None or not self.recipe:
            return self.cfg
        return self.cfg.model_copy(update=self.recipe)

    @property
    def representable(self) -> bool:
        return self.reason is None

    @property
    def fitted(self) -> bool:
        """Whether the time model's shared constants are fitted on this row: every
        representable row but those of hybrid Mamba models, which fit only the Mamba term
        (:data:`NOT_FITTED`)."""
        return self.representable and not (self.model is not None and self.model.is_hybrid)

    @property
    def group(self) -> tuple[str, str]:
        """Same model and hardware (for within-group rank correlation)."""
        return (self.model.name if self.model else self.model_name, self.gpu_name)


def _key(name: str) -> str:
    name = re.sub(r"\(.*?\)", "", name.lower())
    return re.sub(r"[^a-z0-9.]", "", name)


#: Longest number a cell may hold (digits and sign): anything longer is not a measurement, and
#: an integer over 4,300 digits would not even convert.
MAX_CELL_DIGITS = 40


def _num(text: str) -> float | None:
    text = (text or "").strip().replace(",", "")
    if not text or text.lower() in ("n/a", "na", "none", "-"):
        return None
    m = re.fullmatch(r"[-+]?\d+(\.\d+)?", text)
    if not m or len(text) > MAX_CELL_DIGITS:
        return None
    return float(text)


def _int(text: str) -> int | None:
    x = _num(text)
    return None if x is None or x != int(x) else int(x)


def catalog_model_for(name: str) -> str | None:
    """Catalog model whose name or alias matches ``name`` (see module docstring)."""
    key = _key(name)
    for canonical, entry in model_entries().items():
        if key in {_key(canonical), *(_key(a) for a in entry.aliases)}:
            return canonical
    return None


def _family_donor(name: str) -> str | None:
    """Catalog model sharing the row's family prefix (letters + generation digit, else letters
    only): used only for a missing vocabulary and the architecture flags."""
    key = _key(name)
    for pattern in (r"[a-z]+\d", r"[a-z]+"):
        m = re.match(pattern, key)
        if not m:
            continue
        for canonical in model_entries():
            if _key(canonical).startswith(m.group(0)):
                return canonical
    return None


def gpu_for(text: str) -> str | None:
    """Catalog GPU for a GPU column (exact name/alias, else the longest name it starts with)."""
    low = text.strip().lower()
    entries = gpu_entries()
    names: list[tuple[str, str]] = []
    for canonical, e in entries.items():
        for alias in (canonical, *e.aliases):
            if low == alias.lower():
                return canonical
            names.append((alias.lower(), canonical))
    best = None
    for alias, canonical in names:
        if re.match(re.escape(alias) + r"(\b|[^a-z0-9])", low) and (
            best is None or len(alias) > len(best[0])
        ):
            best = (alias, canonical)
    return best[1] if best else None


def _gated(name: str, ffn: int | None, hidden: int) -> bool:
    key = _key(name)
    if any(key.startswith(f) for f in GATED_FAMILIES):
        return True
    if any(key.startswith(f) for f in NON_GATED_FAMILIES):
        return False
    return not (ffn is not None and ffn == 4 * hidden)


def row_model(row: dict[str, str]) -> tuple[ModelSpec | None, str | None]:
    """The model of a row, or (None, reason)."""
    name = row.get("model", "").strip()
    canonical = catalog_model_for(name)
    cols = {
        "num_layers": _int(row.get("num_layers", "")),
        "hidden_size": _int(row.get("hidden_size", "")),
        "ffn_hidden_size": _int(row.get("ffn_hidden_size", "")),
        "num_attention_heads": _int(row.get("num_attention_heads", "")),
        "num_kv_heads": _int(row.get("num_kv_heads", "")),
        "vocab_size": _int(row.get("vocab_size", "")),
        "num_experts": _int(row.get("num_experts", "")),
        "moe_top_k": _int(row.get("moe_topk", "")),
        "expert_ffn_hidden_size": _int(row.get("expert_ffn_hidden_size", "")),
    }
    notes = (row.get("moe_notes", "") + " " + row.get("notes", "")).lower()
    if canonical is not None:
        base = model_entries()[canonical].to_spec().model_dump()
        base.update({k: v for k, v in cols.items() if v is not None})
        try:
            return ModelSpec(**base), None
        except ValidationError as e:
            return None, f"architecture columns contradict catalog model {canonical}: {e}"
    if "not transcribed" in notes or "not transcribed" in row.get("completeness", "").lower():
        return None, "architecture not transcribed in the row and model not in the catalog"
    for key in ("num_layers", "hidden_size", "num_attention_heads"):
        if cols[key] is None:
            return None, f"{key} missing and model {name!r} not in the catalog"
        if cols[key] < 1:  # a head dimension would divide by it
            return None, f"{key} {cols[key]} is not a positive integer"
    donor = _family_donor(name)
    donor_spec = model_entries()[donor].to_spec() if donor else None
    h, a = cols["hidden_size"], cols["num_attention_heads"]
    vocab = cols["vocab_size"] or (donor_spec.vocab_size if donor_spec else None)
    if vocab is None:
        return None, f"vocab_size missing and no catalog model of the {name!r} family"
    kv = re.search(r"kv_channels\s+(\d+)", notes)
    head_dim = int(kv.group(1)) if kv else h // a
    ffn = cols["ffn_hidden_size"]
    if ffn is None and not cols["num_experts"]:
        if donor_spec is None or donor_spec.gated_mlp:
            return None, f"ffn_hidden_size missing for {name!r}"
        ffn = 4 * h  # Megatron's default for a GELU MLP
    spec: dict[str, Any] = {
        "name": name or "row",
        "num_layers": cols["num_layers"],
        "hidden_size": h,
        "ffn_hidden_size": ffn or 0,
        "num_attention_heads": a,
        "num_kv_heads": cols["num_kv_heads"] or a,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "gated_mlp": donor_spec.gated_mlp if donor_spec else _gated(name, ffn, h),
        "qk_norm": "qk_layernorm" in notes,
        "source": f"published run row {row.get('row_id')}",
    }
    if donor_spec is not None:
        spec |= {"norm": donor_spec.norm, "tied_embeddings": donor_spec.tied_embeddings}
    elif not spec["gated_mlp"]:
        spec["norm"] = "layernorm"
    if cols["num_experts"]:
        spec |= {
            "num_experts": cols["num_experts"],
            "moe_top_k": cols["moe_top_k"] or 2,
            "expert_ffn_hidden_size": cols["expert_ffn_hidden_size"] or ffn or 0,
        }
        shared = re.search(r"(\d+) shared experts? \((\d+)\)", notes)
        if shared:
            spec |= {"num_shared_experts": int(shared.group(1)),
                     "shared_expert_ffn_hidden_size": int(shared.group(2))}
        dense = re.search(r"first (\d+) layers dense", notes)
        if dense:
            spec["num_dense_layers"] = int(dense.group(1))
    try:
        return ModelSpec(**spec), None
    except ValidationError as e:
        return None, f"invalid architecture: {e.errors()[0]['msg']}"


def row_precision(text: str) -> tuple[Precision, Fp8Recipe | None]:
    t = text.lower()
    if "nvfp4" in t or "fp4" in t:
        return Precision.FP4, None
    if "fp8" in t or "float8" in t:
        if "blockwise" in t or "1x128" in t or "rowwise" in t:
            return Precision.FP8, Fp8Recipe.BLOCKWISE
        if "mx" in t or "block-scaled" in t:
            return Precision.FP8, Fp8Recipe.MXFP8
        if "delayed" in t:
            return Precision.FP8, Fp8Recipe.DELAYED
        return Precision.FP8, Fp8Recipe.TENSORWISE
    return Precision.BF16, None


def row_recompute(text: str) -> dict[str, Any]:
    t = text.lower().strip()
    if not t or t.startswith("none") or t.startswith("not set"):
        return {"recompute": Recompute.NONE}
    mods = re.search(r"modules \[([^\]]*)\]", t)
    if mods:
        names = tuple(m.strip() for m in mods.group(1).split(",") if m.strip())
        return {"recompute": Recompute.SELECTIVE, "recompute_modules": names}
    if "rmsnorm" in t and "up-projection" in t:
        return {"recompute": Recompute.SELECTIVE,
                "recompute_modules": ("layernorm", "mla_up_proj")}
    if "full" in t:
        out: dict[str, Any] = {"recompute": Recompute.FULL,
                               "recompute_method": RecomputeMethod.UNIFORM}
        if "block" in t:
            out["recompute_method"] = RecomputeMethod.BLOCK
        k = re.search(r"recompute_num_layers\s+(\d+)", t)
        if k:
            out["recompute_layers"] = int(k.group(1))
        return out
    if "per-op" in t or "selective activation checkpointing" in t:
        return {"recompute": Recompute.SELECTIVE, "recompute_modules": ("mlp",)}
    if "selective" in t or "recompute-activations" in t:
        return {"recompute": Recompute.SELECTIVE, "recompute_modules": ("core_attn",)}
    return {"recompute": Recompute.NONE}


#: Megatron-Bridge FSDP performance recipes that offload activations of this many layers to the
#: CPU (``cpu_offloading_num_layers``; ``llama3_workload_base_configs.py``,
#: ``llama31_workload_base_configs.py``): keyed by (catalog model, GPU, FP8 recipe or None).
#: tune-cp does not model offloading; :mod:`benchmarks.memory` names it as the reason.
BRIDGE_CPU_OFFLOAD_LAYERS: dict[tuple[str, str, str | None], int] = {
    ("llama3-70b", "gb300", "tensorwise"): 20,
    ("llama3-70b", "gb300", None): 30,
    ("llama3-70b", "gb200", "tensorwise"): 40,
    ("llama3-70b", "gb200", None): 20,
    ("llama3-70b", "b200", "tensorwise"): 5,
    ("llama3.1-405b", "gb300", "tensorwise"): 10,
    ("llama3.1-405b", "gb300", None): 40,
    ("llama3.1-405b", "gb200", "tensorwise"): 92,
}


#: The pipeline layouts of Megatron-Bridge's DeepSeek-V3 recipes by (pp, vpp), Megatron-LM
#: ``--pipeline-model-parallel-layout`` spelling: ``set_deepseek_v3_pipeline_model_parallel_layout``
#: (``src/megatron/bridge/recipes/deepseek/deepseek_v3.py``, ``layout_map``: the embedding on the
#: first virtual stage with a full share of decoder layers, the MTP layer and the loss on the last
#: with the remainder: PP16 / PP8 VPP2 / PP4 VPP4 ``[E t*4] [t*4]*14 [t m L]``); PP2 VPP8 uses the same
#: 16-stage layout (``scripts/performance`` GB300 configs: ``set_deepseek_v3_pipeline_model_parallel_
#: layout(cfg.model, "Et*4|(t*4|)*14tmL")``), the H100 PP8 VPP4 workload ``Et|(tt|)*30mL``
#: (``deepseek_workload_base_configs.py``). Rows of other (pp, vpp) keep the automatic split.
BRIDGE_DEEPSEEK_V3_LAYOUTS: dict[tuple[int, int], str] = {
    (4, 1): "Et*16|t*16|t*16|t*13mL",
    (8, 1): "Et*8|(t*8|)*6t*5mL",
    (4, 2): "Et*8|(t*8|)*6t*5mL",
    (16, 1): "Et*4|(t*4|)*14tmL",
    (8, 2): "Et*4|(t*4|)*14tmL",
    (4, 4): "Et*4|(t*4|)*14tmL",
    (2, 8): "Et*4|(t*4|)*14tmL",
    (8, 4): "Et|(tt|)*30mL",
}


def recipe_layout(row: dict[str, str], model: ModelSpec, pp: int, vpp: int) -> str | None:
    """The pipeline layout a Megatron-Bridge DeepSeek-V3 row ran (:data:`BRIDGE_DEEPSEEK_V3_LAYOUTS`),
    None elsewhere."""
    if "megatron-bridge" not in row.get("framework", "").lower() or model.name != "deepseek-v3":
        return None
    if model.num_mtp_layers != 1:
        return None
    return BRIDGE_DEEPSEEK_V3_LAYOUTS.get((pp, vpp))


def recipe_fragmentation(row: dict[str, str], model: ModelSpec, fsdp: bool) -> float | None:
    """0 where the recipe runs PyTorch's allocator with ``expandable_segments:True`` (Megatron-
    Bridge ``scripts/performance/utils/executors.py::PERF_ENV_VARS``; its ``perf_plugins.py``
    removes it for Llama with Megatron-FSDP and for NCCL user buffers): segments grow in place,
    so the allocator's fragmentation over the activations is negligible. None elsewhere."""
    if "megatron-bridge" not in row.get("framework", "").lower():
        return None
    if fsdp and _key(model.name).startswith("llama"):
        return None
    return 0.0


#: The NeMo Framework Launcher's H100 example launches of the NeMo 1.x (24.07) performance runs
#: (NVIDIA/NeMo-Framework-Launcher, tag ``24.07`` = 8325688d): which models' pretraining
#: launches set ``+training.model.optim.grad_sync_dtype=bf16`` (every
#: ``examples/training/gpt/h100/*.sh`` and ``examples/training/llama/h100/*.sh``; the Nemotron
#: and Mixtral ones do not), as the row's model-name prefix.
NEMO1_BF16_GRAD_MODELS = ("gpt3-", "llama2-", "llama3-")
#: The launcher's H100 SFT launches (``examples/peft/llama/h100/{7b_1node,13b_1node,
#: 70b_2node}.sh`` at tag ``24.07``), by (row model, GPUs): their virtual pipeline size
#: (``peft.model.virtual_pipeline_model_parallel_size``; 13b_1node.sh L26, 70b_2node.sh L26). All
#: three set ``++peft.model.fp8_params=true`` (70b_2node.sh L32) and run ``peft/llama/sft.yaml``
#: (L250-258: ``distributed_fused_adam``, ``grad_sync_dtype: bf16``, ``dtype: bf16``).
NEMO1_SFT_VPP: dict[tuple[str, int], int] = {("llama2-13b", 8): 10, ("llama2-70b", 16): 20}


def nemo1_recipe_settings(row: dict[str, str], model: ModelSpec,
                          recipe: Fp8Recipe | None) -> tuple[dict[str, Any], list[str]]:
    """The memory settings of a NeMo 1.x (24.07) row's launcher recipe (:data:`NEMO1_BF16_GRAD_MODELS`,
    :data:`NEMO1_SFT_VPP`), with one note each. NeMo 1.x runs Apex's ``DistributedFusedAdam``
    (``optim.name: distributed_fused_adam``), whose contiguous gradient buffer holds every
    bucket in ``grad_sync_dtype`` (apex ``contrib/optimizers/distributed_fused_adam.py``
    ``_init_grad_buffer``; default: the optimizer ``dtype``, fp32): ``grad_sync_dtype=bf16`` is a
    bf16 gradient buffer, tune-cp's ``grad_reduce_in_fp32=False``. ``fp8_params`` keeps the
    linear weights in FP8 only (Transformer Engine ``fp8_model_init``), tune-cp's
    ``fp8_param_gather``. The optimizer state's dtypes (tune-cp ``optimizer_state``; NeMo
    ``megatron_base_model.py`` L784-806 at r2.0.0rc1): fp32 state over bf16 parameters stores
    2-byte remainders of the master weights (``store_param_remainders``), 10 B per parameter;
    the SFT recipe's ``dtype: bf16`` with FP8 parameters stores bf16 master weights
    (``store_params``) and bf16 moments, 6 B per parameter. Not modelled: SFT without FP8
    parameters (``dtype`` bf16 = the model dtype: no master copy, 4 B; counted as 6)."""
    name = row.get("model", "").strip().lower()
    out: dict[str, Any] = {}
    notes: list[str] = []
    sft = row.get("workload", "").lower().startswith("sft")
    if sft or name.startswith(NEMO1_BF16_GRAD_MODELS):
        out["grad_reduce_in_fp32"] = False
        notes.append("bf16 gradient buffers (NeMo Framework Launcher 24.07: optim.grad_sync_dtype "
                     "bf16)")
    if sft and recipe is not None:
        out["fp8_param_gather"] = True
        notes.append("FP8 parameters (NeMo Framework Launcher 24.07 SFT launches: fp8_params true)")
    gpus = int(row.get("num_gpus") or 0)
    vpp = NEMO1_SFT_VPP.get((name, gpus)) if sft else None
    if vpp and not row.get("vpp", "").strip() and model.num_layers % (int(row["pp"]) * vpp) == 0:
        out |= {"vpp": vpp, "schedule": Schedule.INTERLEAVED}
        notes.append(f"virtual pipeline {vpp} (NeMo Framework Launcher 24.07 SFT launch)")
    if sft:
        bf16 = StateDtype.BF16
        out["optimizer_state"] = OptimizerState(precision_aware=True, main_params=bf16,
                                                exp_avg=bf16, exp_avg_sq=bf16)
        notes.append("optimizer state in bf16, 6 B per parameter (sft.yaml optim.dtype bf16; "
                     "NeMo megatron_base_model.py L797-806: bf16 master weights and moments)")
    else:
        out["optimizer_state"] = OptimizerState(precision_aware=True)
        notes.append("fp32 master weights as 2-byte remainders, 10 B per parameter (Apex "
                     "DistributedFusedAdam store_param_remainders: NeMo megatron_base_model.py "
                     "L802-804)")
    return out, notes


def recipe_settings(row: dict[str, str], model: ModelSpec,
                    recipe: Fp8Recipe | None) -> tuple[dict[str, Any], list[str]]:
    """Memory settings a row's framework recipe implies and the row does not state, with one
    note each (see the module docstring, "Recipe memory settings")."""
    framework = row.get("framework", "").lower()
    if framework.startswith("nemo (1.x") and row.get("release_or_date", "") == "NeMo 24.07":
        return nemo1_recipe_settings(row, model, recipe)
    if "megatron-bridge" not in framework:
        return {}, []
    out: dict[str, Any] = {"grad_reduce_in_fp32": False}
    notes = ["bf16 gradient buffers (Megatron-Bridge performance recipes: grad_reduce_in_fp32 "
             "False)"]
    if recipe in (Fp8Recipe.TENSORWISE, Fp8Recipe.DELAYED, Fp8Recipe.MXFP8):
        out["fp8_param_gather"] = True
        notes.append(f"FP8 parameters (Megatron-Bridge {recipe.value} recipe: fp8_param_gather "
                     f"True)")
    if model.mla is not None and model.is_moe and not row.get("recompute", "").strip():
        out |= {"recompute": Recompute.SELECTIVE, "recompute_modules": ("mla_up_proj",)}
        notes.append("selective recompute of mla_up_proj (Megatron-Bridge DeepSeek-V3 "
                     "performance recipe)")
    return out, notes


def row_traits(row: dict[str, str], software: str,
               recipe: dict[str, Any] | None = None) -> RunTraits:
    """The :class:`~oracle.work.RunTraits` a row states or its framework implies (see the
    module docstring); ``recipe``: its :func:`recipe_run_settings`."""
    framework = row.get("framework", "").lower()
    settings = (row.get("other_settings", "") + " " + row.get("notes", "")).lower()
    if software == "torchtitan":
        overlap = bool(re.search(r"async\s*-?\s*tp", settings))
    elif any(k in framework for k in ("bridge", "nemo", "primus")):
        overlap = True
    elif software == "megatron":
        overlap = "tp-comm-overlap" in settings or "tp_comm_overlap" in settings
    else:
        overlap = False
    precision = row.get("precision", "").lower()
    rowwise = ("rowwise" in precision or "row-wise" in precision) and (
        "fp8" in precision or "float8" in precision)
    # token-drop MoE runs say so in the model / workload name (Megatron-Bridge "(tokendrop)":
    # moe_expert_capacity_factor 1.0, moe_pad_expert_input_to_capacity); dropless otherwise
    named = (row.get("model", "") + " " + row.get("workload", "") + " " + settings).lower()
    dropless = not re.search(r"token\s*-?\s*drop", named)
    extra = {**(recipe or {}), **stated_settings(row)}
    return RunTraits(tp_comm_overlap=overlap, fp8_rowwise=rowwise, moe_dropless=dropless,
                     cuda_graph_scope=tuple(extra.get("cuda_graph_scope", ())),
                     moe_a2a_overlap=bool(extra.get("moe_a2a_overlap", False)))


def row_release(row: dict[str, str]) -> tuple[int, int] | None:
    """``(yy, mm)`` of a Megatron-Bridge / NeMo row's ``NeMo container YY.MM[.x]`` release."""
    m = re.search(r"container\s+(\d{2})\.(\d{2})", row.get("release_or_date", ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def recipe_run_settings(row: dict[str, str], model_name: str, gpu_name: str,
                    fp8_recipe: str | None) -> dict[str, Any]:
    """The :data:`BRIDGE_RECIPE_SETTINGS` of a Megatron-Bridge row's release (later entries
    override earlier ones)."""
    if "megatron-bridge" not in row.get("framework", "").lower():
        return {}
    rel = row_release(row)
    if rel is None:
        return {}
    out: dict[str, Any] = {}
    for name, gpus, recipe, first, last, settings, _src in BRIDGE_RECIPE_SETTINGS:
        if (name == model_name and gpu_name in gpus and (recipe is None or recipe == fp8_recipe)
                and first <= rel and (last is None or rel <= last)):
            out.update(settings)
    return out


def stated_settings(row: dict[str, str]) -> dict[str, Any]:
    """CUDA-graph and MoE-overlap settings a row states in ``other_settings`` / ``notes``
    (Megatron-LM flags or Megatron-Bridge field names)."""
    text = (row.get("other_settings", "") + " " + row.get("notes", "")).lower()
    out: dict[str, Any] = {}
    if re.search(r"cuda[-_ ]graph[-_ ]impl[= ]+full[-_]iteration|full[- ]iter(ation)? cuda graph",
                 text):
        out["cuda_graph_scope"] = ("full_iteration",)
    else:
        m = re.search(r"cuda[-_]graph[-_]scope[= \[]+([a-z_, '\"]+)", text)
        if m:
            parts = tuple(p for p in re.split(r"[\s,'\"]+", m.group(1))
                          if p in ("attn", "mlp", "moe_router", "moe_preprocess"))
            if parts:
                out["cuda_graph_scope"] = parts
    # DualPipe (DeepSeek-V3 report, section 3.2.1) overlaps the forward of one micro-batch with
    # the backward of another so that the expert-parallel all-to-all hides behind computation:
    # the same mechanism as Megatron-Core's combined 1F1B schedule
    if re.search(r"overlap[-_]moe[-_]expert[-_]parallel[-_]comm|moe_a2a_overlap\s*=?\s*true"
                 r"|dualpipe", text):
        out["moe_a2a_overlap"] = True
    return out


def row_dispatcher(row: dict[str, str], model: ModelSpec, gpu_name: str,
                   recipe: dict[str, Any] | None = None) -> Dispatcher:
    """MoE token dispatcher of a row (see the module docstring)."""
    if not model.is_moe:
        return Dispatcher.ALLTOALL
    if recipe and "dispatcher" in recipe:
        return Dispatcher(recipe["dispatcher"])
    settings = (row.get("other_settings", "") + " " + row.get("notes", "")).lower()
    if any(k in settings for k in ("deepep", "hybridep", "flex dispatcher", "dualpipe")):
        return Dispatcher.FLEX
    if "megatron-bridge" not in row.get("framework", "").lower():
        return Dispatcher.ALLTOALL
    if gpu_name in BRIDGE_ALLTOALL_MOE.get(model.name, ()):
        return Dispatcher.ALLTOALL
    return Dispatcher.FLEX


def _schedule(row: dict[str, str], vpp: int) -> Schedule:
    text = (row.get("other_settings", "") + " " + row.get("notes", "")).lower()
    if "dualpipe" in text or "zero bubble" in text or "zero-bubble" in text:
        return Schedule.ZERO_BUBBLE
    return Schedule.INTERLEAVED if vpp > 1 else Schedule.ONE_F_ONE_B


def parse_row(row: dict[str, str]) -> RunRow:
    """One CSV row as a :class:`RunRow` (specs, or the reason they cannot be built)."""
    gpu_text = row.get("gpu_type", "").strip()
    out = RunRow(
        row_id=row.get("row_id", "").strip(),
        source=row.get("source", "").strip(),
        source_id=row.get("source_id", "").strip() or row.get("source", "").strip(),
        model_name=row.get("model", "").strip(),
        gpu_name=gpu_for(gpu_text) or gpu_text,
        measured_tokens_per_s_per_gpu=_num(row.get("tokens_per_sec_per_gpu", "")),
        measured_model_tflops_per_gpu=_num(row.get("model_tflops_per_gpu", "")),
        software=software_stack(row.get("framework", "")),
    )
    measured = out.measured_tokens_per_s_per_gpu
    if measured is not None and measured <= 0:
        out.measured_tokens_per_s_per_gpu = None
        out.reason = f"tokens_per_sec_per_gpu {measured:g} is not a positive throughput"
        return out
    try:
        _fill(out, row)
    except (ConfigError, ValidationError, ValueError, OverflowError) as e:
        out.reason = f"cannot build specs: {str(e).splitlines()[0]}"
    return out


#: What a framework's recipe runs beyond the catalog model, per (framework, catalog model):
#: Megatron-Bridge's Nemotron 3 Super recipe (``recipes/nemotronh/h100/nemotron_3_super.py``
#: @067f987df, used by its performance recipes) runs the MTP block twice
#: (``mtp_num_layers = 2``, ``mtp_use_repeated_layer``); tune-cp counts two MTP depths (their
#: FLOPs and time exactly, their parameters once too many: the repeated block shares weights).
#: AMD-AIG-AIMA/pytorch-training-benchmark's Mistral 7B (``train_fsdp.py`` with
#: ``configs/mistral-7b-v0.1.json`` @c295aae: ``window_size`` 1024 at ``max_seq_len`` 8192) runs
#: sliding-window attention on every layer (``mistral.py``: flash-attn ``window_size=(1023, 0)``,
#: Transformer Engine ``(1024, 0)`` under FP8). A model outside the catalog is matched by the
#: row's model name (:func:`_key`).
RECIPE_MODEL_SETTINGS: dict[tuple[str, str], dict[str, Any]] = {
    ("megatron-bridge", "nemotron-3-super"): {"num_mtp_layers": 2},
    ("train_fsdp.py", "mistral7b"): {"sliding_window": 1024, "num_sliding_window_layers": 32},
}


def recipe_model(model: ModelSpec, row: dict[str, str], notes: list[str]) -> ModelSpec:
    """``model`` with the settings of :data:`RECIPE_MODEL_SETTINGS` for the row's framework."""
    framework = row.get("framework", "").lower()
    canonical = catalog_model_for(row.get("model", "")) or _key(row.get("model", ""))
    for (fw, name), update in RECIPE_MODEL_SETTINGS.items():
        if fw in framework and canonical == name:
            notes.append(f"{', '.join(f'{k} = {v}' for k, v in update.items())} "
                         f"({fw} recipe for {name})")
            return model.model_copy(update=update)
    return model


def _fill(out: RunRow, row: dict[str, str]) -> None:
    model, reason = row_model(row)
    if model is None:
        out.reason = reason
        return
    model = recipe_model(model, row, out.notes)
    gname = gpu_for(row.get("gpu_type", ""))
    if gname is None:
        out.reason = f"GPU {row.get('gpu_type')!r} not in the catalog"
        return
    gpu: GpuSpec = load_gpu(gname)
    watts = re.search(r"(\d{3,4})\s*W\b", row.get("gpu_type", ""))
    if watts and gpu.tdp_w is not None and float(watts.group(1)) != gpu.tdp_w:
        # a power limit stated with the GPU (torchtitan's 500 W H100s) sets the sustained rate
        gpu = gpu.model_copy(update={"tdp_w": float(watts.group(1))})
        out.notes.append(f"power limit {watts.group(1)} W from the GPU column")
    world = _int(row.get("num_gpus", ""))
    if not world:
        out.reason = "num_gpus missing"
        return
    gpn = _int(row.get("gpus_per_node", "")) or min(8, world)
    if world % gpn:
        out.reason = f"num_gpus {world} is not a multiple of gpus_per_node {gpn}"
        return
    cluster = ClusterSpec(gpu=gpu, num_nodes=world // gpn, gpus_per_node=gpn)
    vpp_text = row.get("vpp", "").strip().lower()
    vpp = _int(vpp_text)
    if vpp is None and "interleaved" in vpp_text and out.software == "torchtitan":
        # torchtitan without explicit split points gives multi-stage (interleaved) schedules
        # 2 stages per rank (generate_split_points, torchtitan/parallelisms/pipeline_llama.py,
        # 2024: "Multi-stage schedules support more than 2 stages per rank, but this is the
        # default if no pipeline split is specified")
        vpp = 2
        out.notes.append("vpp = 2 (torchtitan's default stages per rank for interleaved "
                         "schedules without split points)")
    if vpp is None and vpp_text not in ("", "n/a"):
        out.reason = f"vpp not stated as a number ({row.get('vpp')!r})"
        return
    vpp = vpp or 1
    tp = _int(row.get("tp", "")) or 1
    pp = _int(row.get("pp", "")) or 1
    cp = _int(row.get("cp", "")) or 1
    ep = _int(row.get("ep", "")) or 1
    etp = _int(row.get("etp", ""))
    if etp is None and model.is_moe and "megatron-bridge" in row.get("framework", "").lower():
        # Megatron-Bridge's MoE performance recipes set expert_tensor_parallel_size = 1
        # (src/megatron/bridge/perf_recipes/*/common.py); Megatron's own default is etp = tp.
        etp = 1
        out.notes.append("etp = 1 (Megatron-Bridge MoE recipe default)")
    mbs_stated = _int(row.get("micro_batch_size", ""))
    mbs = mbs_stated or 1
    if world % (tp * pp * cp):
        out.reason = f"num_gpus {world} not divisible by tp*pp*cp = {tp * pp * cp}"
        return
    dp = world // (tp * pp * cp)
    canonical = catalog_model_for(out.model_name)
    entry = model_entries().get(canonical) if canonical else None
    seq = _int(row.get("seq_len", ""))
    if seq is None:
        if entry is None:
            out.reason = "seq_len missing and model not in the catalog"
            return
        seq = entry.default_seq_len
        out.notes.append(f"seq_len from catalog default {seq}")
    gbs = _int(row.get("global_batch_size", ""))
    if gbs is None:
        text = (row.get("completeness", "") + " " + row.get("notes", "")).lower()
        local = re.search(r"local batch(?: size)? (\d+)", text)
        if local:
            gbs = int(local.group(1)) * dp
            out.notes.append(f"global batch = local batch x dp = {gbs}")
        elif entry is not None:
            gbs = entry.default_global_batch_size
            out.notes.append(f"global batch from catalog default {gbs}")
        else:
            gbs = mbs * dp
            out.notes.append("global batch unknown: one micro-batch per rank")
    local = gbs // dp
    if (mbs_stated is None and out.software == "torchtitan"
            and pp > 1 and local % pp == 0):
        # torchtitan splits the local batch into as many micro-batches as pipeline ranks unless
        # pipeline_parallel_microbatches is set (build_pipeline_schedule, 2024: "n_microbatches
        # = job_config.experimental.pipeline_parallel_degree" when unset)
        mbs = local // pp
        out.notes.append(f"mbs = local batch / pp = {mbs} (torchtitan's default micro-batch "
                         f"count is the pipeline degree)")
    step = mbs * dp
    if gbs % step:
        gbs = -(-gbs // step) * step
        out.notes.append(f"global batch rounded up to a multiple of mbs*dp: {gbs}")
    precision, recipe = row_precision(row.get("precision", ""))
    if precision is Precision.FP8 and recipe is Fp8Recipe.MXFP8 and gpu.architecture != "blackwell":
        recipe = Fp8Recipe.TENSORWISE
    if precision is Precision.FP8 and gpu.peak_fp8_flops is None:
        precision, recipe = Precision.BF16, None
        out.notes.append(f"FP8 on {gpu.name} (no FP8 tensor cores): projected as BF16")
    if precision is Precision.FP4 and gpu.peak_fp4_flops is None:
        out.reason = f"NVFP4 run on {gpu.name}, which has no FP4 peak in the catalog"
        return
    fsdp_col = _int(row.get("fsdp", "")) or 0
    opt = row.get("optimizer_sharding", "").lower()
    # the fsdp column holds a degree (8, 64) or the strategy's name (``FSDP``, ``FSDP2``)
    fsdp = (fsdp_col > 0 or bool(re.match(r"fsdp\d?\b", row.get("fsdp", "").strip().lower()))
            or (opt.startswith("fsdp") and fsdp_col != 0))
    training = TrainingSpec(seq_len=seq, global_batch_size=gbs, precision=precision)
    recipe_set = recipe_run_settings(row, model.name, gname,
                                     recipe.value if recipe is not None else None)
    layout = recipe_layout(row, model, pp, vpp)
    if layout is not None:
        out.notes.append(f"pipeline layout {layout} (Megatron-Bridge DeepSeek-V3 recipe)")
    cfg = ParallelConfig(
        tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, mbs=mbs, pipeline_layout=layout,
        fsdp=fsdp, distributed_optimizer=not opt.startswith("none"),
        dispatcher=row_dispatcher(row, model, gname, recipe_set),
        schedule=_schedule(row, vpp),
        fp8_recipe=recipe,
        **row_recompute(row.get("recompute", "")),
    )
    if model.num_layers % (pp * vpp) and pp * vpp > model.num_layers + 2:
        out.reason = f"pp*vpp = {pp * vpp} exceeds the {model.num_layers} layers"
        return
    resolved = resolve_config(cfg, model, cluster, training)
    if not row.get("recompute", "").strip():
        resolved = _unstated_recompute(resolved, model, cluster, training, row, out.notes)
    try:  # a row the time model cannot evaluate is unrepresentable, not a crash
        from tune_cp.oracle.work import ConfigBatch, build_work

        traits = row_traits(row, out.software, recipe_set)
        build_work(model, cluster, training, ConfigBatch.from_configs([resolved], traits))
    except (ConfigError, ValueError, ZeroDivisionError, FloatingPointError) as e:
        out.reason = f"projection failed: {str(e).splitlines()[0]}"
        return
    out.model, out.cluster, out.training, out.cfg = model, cluster, training, resolved
    out.traits = traits
    out.recipe, out.recipe_notes = recipe_settings(row, model, recipe)
    out.recipe_fragmentation = recipe_fragmentation(row, model, fsdp)
    if out.recipe_fragmentation is not None:
        out.recipe_notes.append("no fragmentation allowance (expandable_segments)")
    offload = BRIDGE_CPU_OFFLOAD_LAYERS.get((model.name, gname, recipe.value if recipe else None))
    if offload and fsdp and "megatron-bridge" in row.get("framework", "").lower():
        out.recipe_notes.append(f"CPU offloading of {offload} layers' activations (recipe "
                                f"cpu_offloading_num_layers; not modelled)")


#: A row that states no recompute and needs more than this many times its GPU's HBM without
#: recomputation (by :func:`oracle.memory.memory_report`, recipe memory settings applied) must have
#: recomputed: tune-cp's memory model is at most ~1.5x conservative on the published runs that ran
#: without a stated recompute (``benchmarks/memory.py``: 45 rows at 1.01-1.48x), so beyond twice
#: the HBM no conservativeness explains the run. Such a row is read with full recomputation of
#: every layer (Megatron ``--recompute-granularity full --recompute-method uniform``), with a note.
UNSTATED_RECOMPUTE_MEMORY_FACTOR = 2.0


def _unstated_recompute(cfg: ParallelConfig, model: ModelSpec, cluster: ClusterSpec,
                        training: TrainingSpec, row: dict[str, str],
                        notes: list[str]) -> ParallelConfig:
    """``cfg`` with full recomputation when a row without a stated recompute cannot have run
    without it (:data:`UNSTATED_RECOMPUTE_MEMORY_FACTOR`), else ``cfg``."""
    from tune_cp.oracle.memory import memory_report

    rc, _ = recipe_settings(row, model, cfg.fp8_recipe)
    try:
        peak = memory_report(model, cluster, training, cfg.model_copy(update=rc)).peak_bytes
    except (ConfigError, ValueError, ZeroDivisionError):
        return cfg
    hbm = cluster.gpu.hbm_bytes
    if peak <= UNSTATED_RECOMPUTE_MEMORY_FACTOR * hbm:
        return cfg
    notes.append(f"recompute not stated, but without it the run needs {peak / hbm:.1f}x the "
                 f"{cluster.gpu.name}'s HBM: read as full recomputation of every layer")
    return resolve_config(cfg.model_copy(update={"recompute": Recompute.FULL,
                                                 "recompute_method": RecomputeMethod.UNIFORM,
                                                 "recompute_layers": None}),
                          model, cluster, training)


#: The published runs the shipped constants are fitted on: verbatim copies of
#: ``../shared/calibration/published_runs.csv`` and of ``amd_published_runs.csv`` (its row ids and
#: derived tokens/s/GPU written by ``benchmarks/amd_runs.py``), in this order.
PUBLISHED_RUNS_FILES: tuple[Path, ...] = tuple(
    Path(__file__).resolve().parents[1] / "benchmarks" / name
    for name in ("published_runs.csv", "amd_published_runs.csv")
)


def read_runs_files(paths: str | Path | list[str | Path] | tuple[str | Path, ...]
                    ) -> list[RunRow]:
    """Every row of one runs CSV or of several in order (row ids must not repeat across them)."""
    if isinstance(paths, (str, Path)):
        return read_runs(paths)
    rows: list[RunRow] = []
    seen: dict[str, str] = {}
    for p in paths:
        for r in read_runs(p):
            if r.row_id and r.row_id in seen:
                raise ConfigError(f"row_id {r.row_id!r} of {Path(p).name} is also in "
                                  f"{seen[r.row_id]}; row ids must be unique across runs files")
            seen[r.row_id] = Path(p).name
            rows.append(r)
    return rows


def runs_label(paths: str | Path | list[str | Path] | tuple[str | Path, ...]) -> str:
    """The file names of one runs CSV or of several (``a.csv + b.csv``)."""
    if isinstance(paths, (str, Path)):
        return Path(paths).name
    return " + ".join(Path(p).name for p in paths)


def read_runs(path: str | Path) -> list[RunRow]:
    """Every row of a runs CSV (see module docstring)."""
    from tune_cp.oracle.inputs import read_text, show_name

    text = read_text(path, "runs file")
    reader = csv.DictReader(io.StringIO(text, newline=""), restval="", strict=True)
    try:
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(
                f"runs file {show_name(path)} lacks column(s) {missing}; use the columns of "
                f"published_runs.csv"
            )
        rows = []
        for r in reader:
            if None in r:  # more cells than columns
                raise ConfigError(f"runs file {show_name(path)} line {reader.line_num}: more "
                                  f"cells than the {len(reader.fieldnames or [])} columns")
            rows.append(parse_row(r))
        return rows
    except csv.Error as e:
        raise ConfigError(f"runs file {show_name(path)} is not valid CSV at line "
                          f"{reader.line_num}: {e}") from None


#: Why representable rows of hybrid Mamba models do not fit the shared constants: fitting them
#: on these rows would move the transformer rows' constants to absorb the Mamba error. They fit
#: only the Mamba mixer's own kernel rate (``calibration/calibrate.py::HYBRID_TERMS``,
#: ``fit_hybrid_terms``: second stage, the shared constants held) and are cross-validated with
#: it (``benchmarks/crossval.py::grouped_cv``).
NOT_FITTED = ("hybrid Mamba model: fits only mamba_kernel_efficiency, not the shared "
              "constants")


def scored_rows(rows: list[RunRow]) -> list[RunRow]:
    """Rows with a measured tokens/s/GPU (the ones accuracy is computed on)."""
    return [r for r in rows if r.measured_tokens_per_s_per_gpu]
