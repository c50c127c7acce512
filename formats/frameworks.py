"""The framework a run is launched with, and the defaults its recipes use for the settings that
change memory (``--framework megatron-lm|bridge|primus|torchtitan``; an import sets it:
Megatron-LM arguments -> ``megatron-lm``, a Primus YAML -> ``primus``).

Only settings tune-cp models are listed (:data:`FRAMEWORK_DEFAULTS`), each with the line of the
framework's code that sets it. What the framework's recipes set beyond them (communication
overlap, CUDA graphs, CPU offloading of activations) is not applied here: the time model reads
the published rows' own columns (``formats/runs.py``), and a check states its run settings with
their own flags (``--cuda-graph-scope``, ``--moe-a2a-overlap``).

Sources (read at Megatron-LM d98e8a64, Megatron-Bridge 067f987d, Primus fd1eeabb):

* Megatron-LM: ``--fp8-param-gather`` is ``store_true`` (``megatron/training/arguments.py``
  L2016); under ``--bf16`` gradients are accumulated and reduced in fp32 unless
  ``--grad-reduce-in-bf16`` (L1213-1216).
* Megatron-Bridge: the FP8 mixed-precision recipes with per-tensor or MXFP8 scaling set
  ``fp8_param_gather = True`` (``src/megatron/bridge/training/mixed_precision.py``
  L231-368: ``bf16_with_fp8_delayed_scaling_mixed``, ``bf16_with_mxfp8_mixed``,
  ``bf16_with_fp8_current_scaling_mixed``), the blockwise (sub-channel) ones ``False``
  (L384-400); its performance recipes set ``mixed_precision.grad_reduce_in_fp32 = False``
  (bf16 gradient buffers; ``formats/runs.py::recipe_settings`` for the published rows).
* Primus (Megatron backend): ``primus/configs/modules/megatron/trainer_base.yaml`` L41
  ``grad_reduce_in_bf16: false`` (so Megatron-LM's fp32 gradients) and L59
  ``fp8_param_gather: false``.
* torchtitan: FSDP2 reduces gradients in fp32 (``Parallelism.mixed_precision_reduce =
  "float32"``) and gathers float8 weights only with ``enable_fsdp_float8_all_gather``, default
  False (``torchtitan/config/job_config.py``, ``Float8``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tune_cp.config.specs import Fp8Recipe


class Framework(StrEnum):
    MEGATRON_LM = "megatron-lm"
    BRIDGE = "bridge"
    PRIMUS = "primus"
    TORCHTITAN = "torchtitan"


#: The family of each framework whose measured peaks give the memory spread
#: (``oracle/memory_verdict.py``): Megatron-Bridge and Primus run Megatron-Core.
FAMILY: dict[Framework, str] = {
    Framework.MEGATRON_LM: "megatron", Framework.BRIDGE: "megatron",
    Framework.PRIMUS: "megatron", Framework.TORCHTITAN: "torchtitan",
}

#: FP8 recipes whose Megatron-Bridge mixed-precision recipe gathers FP8 parameters.
BRIDGE_FP8_PARAM_RECIPES = (Fp8Recipe.DELAYED, Fp8Recipe.TENSORWISE, Fp8Recipe.MXFP8)


@dataclass(frozen=True)
class FrameworkDefault:
    """One setting a framework's recipe uses: the ``ParallelConfig`` field, its value, the
    command-line flag that would set it, and where the framework sets it."""

    field: str
    value: bool
    flag: str
    source: str

    def text(self) -> str:
        return f"{self.flag} ({self.source})"


def framework_fragmentation(fw: Framework, model_name: str, fsdp: bool) -> float | None:
    """The allocator-fragmentation allowance a framework's recipes imply, or None (tune-cp's
    default, ``oracle/memory.py::MemoryOverheads.fragmentation``): 0 for Megatron-Bridge, whose
    performance runs set ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
    (``scripts/performance/utils/executors.py::PERF_ENV_VARS``) except for Llama under
    Megatron-FSDP (``perf_plugins.py`` removes it there); the same rule as the published rows'
    ``formats/runs.py::recipe_fragmentation``."""
    if fw is not Framework.BRIDGE:
        return None
    if fsdp and model_name.lower().startswith("llama"):
        return None
    return 0.0


def framework_defaults(fw: Framework, fp8_recipe: Fp8Recipe | None,
                       fp8: bool) -> tuple[FrameworkDefault, ...]:
    """The memory settings ``fw``'s recipes use for a run (module docstring). ``fp8``: the run
    trains in FP8; ``fp8_recipe``: its recipe when known (None: the GPU's default recipe, which
    is never blockwise)."""
    if fw is Framework.BRIDGE:
        out = [FrameworkDefault("grad_reduce_in_fp32", False, "--grad-reduce-in-bf16",
                                "Megatron-Bridge performance recipes: mixed_precision."
                                "grad_reduce_in_fp32 = False")]
        if fp8 and (fp8_recipe is None or fp8_recipe in BRIDGE_FP8_PARAM_RECIPES):
            out.append(FrameworkDefault("fp8_param_gather", True, "--fp8-param-gather",
                                        "Megatron-Bridge mixed_precision.py: fp8_param_gather = "
                                        "True in its per-tensor and MXFP8 recipes"))
        return tuple(out)
    where = {
        Framework.MEGATRON_LM: "Megatron-LM arguments.py defaults",
        Framework.PRIMUS: "Primus trainer_base.yaml: grad_reduce_in_bf16 false, "
                          "fp8_param_gather false",
        Framework.TORCHTITAN: "torchtitan: FSDP2 reduce dtype float32, "
                              "enable_fsdp_float8_all_gather False",
    }[fw]
    return (FrameworkDefault("grad_reduce_in_fp32", True, "fp32 gradients", where),
            FrameworkDefault("fp8_param_gather", False, "no FP8 parameters", where))
