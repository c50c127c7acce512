"""The named constants of the time model, their physical meaning and priors, and the calibration
file that stores their fitted values per GPU architecture.

Every constant is dimensionless or in seconds and means one physical thing (see :data:`CONSTANTS`).
Values live in ``oracle/catalog/calibration.json``: ``defaults`` (shared by all architectures)
and ``architectures.<arch>`` (overrides for ``ampere``, ``hopper``, ``blackwell``, ``cdna3``,
``cdna4``; GPUs name their architecture in ``gpus.json``). :func:`calibration.calibrate.calibrate`
rewrites that file from published or logged runs; the header records which rows, when, and the
fit error. A constant is *per architecture* when the hardware sets it (kernel efficiencies,
link efficiencies, launch overhead) and *shared* when the software sets it (overlap fractions,
collective latency, grouped-GEMM penalty).

Priors (the starting point and the value the fit is regularised towards) come from public
kernel benchmarks, each cited in :data:`CONSTANTS`; the fit moves a constant away from its prior
only as far as the rows support (Gaussian penalty in logit space for fractions, log space for
positive quantities, of width ``prior_sigma``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field

from tune_cp.config.specs import ConfigError, Spec

HERE = Path(__file__).parent
CALIBRATION_PATH = HERE / "catalog" / "calibration.json"
ARCHITECTURES: tuple[str, ...] = ("ampere", "hopper", "blackwell", "cdna3", "cdna4")
#: The architecture of a GPU file that states none: no published row stands behind it, so its
#: per-architecture constants are the conservative ``generic`` priors of :data:`CONSTANTS`
#: (at or below the lowest fitted value of any architecture), never the fitted defaults.
GENERIC_ARCHITECTURE = "generic"
#: What a GPU file's ``architecture`` may say ("" or omitted: ``generic``).
KNOWN_ARCHITECTURES: tuple[str, ...] = (*ARCHITECTURES, GENERIC_ARCHITECTURE)


def architecture_key(architecture: str) -> str:
    """The constants key of a GPU's ``architecture`` ("" -> ``generic``); an unknown value is a
    one-line error listing the known ones."""
    a = (architecture or GENERIC_ARCHITECTURE).strip().lower()
    if a not in KNOWN_ARCHITECTURES:
        raise ConfigError(
            f"unknown GPU architecture {architecture!r}; choose one of "
            f"{', '.join(KNOWN_ARCHITECTURES)} (generic: conservative constants, no fitted rows)"
        )
    return a


def mfu_class(is_moe: bool, architecture: str, precision: str) -> str:
    """The class a published MFU ceiling is kept for: ``dense|moe / architecture / precision``
    (:func:`calibration.calibrate.mfu_ceilings` writes the ceilings; here so that reading one does
    not import the calibration and the framework readers)."""
    return f"{'moe' if is_moe else 'dense'}/{architecture_key(architecture)}/{precision}"


@dataclass(frozen=True)
class ConstantDef:
    """One constant: ``kind`` is ``fraction`` (0..1, fitted in logit space) or ``positive``
    (fitted in log space); ``per_arch`` says whether each architecture gets its own value;
    ``priors`` gives per-architecture priors (the shared ``prior`` otherwise)."""

    name: str
    kind: str
    prior: float
    prior_sigma: float
    per_arch: bool
    meaning: str
    source: str
    priors: tuple[tuple[str, float], ...] = ()
    lower: float = 0.0
    upper: float = 1.0

    def prior_for(self, arch: str) -> float:
        return dict(self.priors).get(arch, self.prior)


CONSTANTS: tuple[ConstantDef, ...] = (
    ConstantDef(
        "gemm_efficiency_bf16", "fraction", 0.75, 0.6, True,
        "fraction of the dense BF16 peak a large, well-shaped GEMM sustains in training "
        "(cuBLAS / hipBLASLt / TE) on the architecture's reference part; other parts of the "
        "architecture run at their sustained rate relative to it (power_clock_exponent)",
        "priors (order of magnitude; the fit sets the value): large BF16 GEMMs commonly reach "
        "~85% of peak on A100, ~75% on H100, ~70% on B200, ~50-60% on MI300X/MI355X "
        "(vendor GEMM benchmarks and MLPerf-era reports)",
        priors=(("ampere", 0.85), ("hopper", 0.75), ("blackwell", 0.70), ("cdna3", 0.50),
                ("cdna4", 0.60), ("generic", 0.40)),
    ),
    ConstantDef(
        "gemm_efficiency_fp8", "fraction", 0.65, 0.6, True,
        "fraction of the dense FP8 peak a large FP8 GEMM sustains (scaling included), on the "
        "reference part as for BF16",
        "priors (order of magnitude): FP8 GEMMs reach a somewhat lower fraction of their "
        "doubled peak than BF16 (~65% on Hopper/Blackwell), lower on CDNA",
        priors=(("hopper", 0.65), ("blackwell", 0.65), ("cdna3", 0.45), ("cdna4", 0.50),
                ("generic", 0.35)),
    ),
    ConstantDef(
        "block_scaled_gemm_efficiency", "fraction", 0.93, 0.5, False,
        "throughput of a block-scaled FP8 GEMM (MXFP8 1x32, blockwise 1x128/128x128 scales) "
        "relative to a per-tensor-scaled FP8 GEMM of the same shape (scale loads, smaller tiles)",
        "prior: Megatron-Bridge's performance summary lists FP8-CS 2-5% faster than FP8-MX "
        "for the same Llama 3 8B configurations (published_runs.csv rows 229/230, 238/239)",
    ),
    ConstantDef(
        "gemm_efficiency_fp4", "fraction", 0.45, 0.6, True,
        "fraction of the dense NVFP4 peak an NVFP4 training GEMM sustains (block scaling and "
        "the random Hadamard transform of the wgrad inputs included)",
        "prior (order of magnitude): NVFP4 end-to-end speed-ups over MXFP8 of ~1.3-1.5x in "
        "the Megatron-Bridge summary imply well under the FP8 fraction of a 2x peak",
        priors=(("generic", 0.30),),
    ),
    ConstantDef(
        "gemm_half_dim", "positive", 128.0, 0.5, True,
        "GEMM dimension (rows, columns or reduction length) at which the tile pipeline runs at "
        "half its large-GEMM efficiency; each of M, N, K contributes a factor x / (x + half_dim) "
        "(tile quantisation, prologue/epilogue and wave effects of skinny GEMMs from high tp, "
        "small experts or few tokens per expert), in BF16 work; an FP8/FP4 GEMM's half dimension "
        "is this times its peak over the BF16 peak (the fixed part of a GEMM takes as long at any "
        "precision; oracle.compute.gemm_half_dims)",
        "prior: 128 = one output-tile edge of common Hopper/Blackwell GEMM kernels (CUTLASS "
        "128x128 / 128x256 tiles); generic: 256 (larger tiles, worse small-GEMM behaviour "
        "assumed)",
        priors=(("generic", 256.0),),
        lower=8.0, upper=4096.0,
    ),
    ConstantDef(
        "grouped_gemm_efficiency", "fraction", 0.85, 0.5, False,
        "extra efficiency factor of MoE grouped GEMMs (many expert GEMMs in one launch, uneven "
        "sizes) relative to a plain GEMM of the same shape",
        "prior (order of magnitude): grouped GEMMs of uneven expert sizes run somewhat below "
        "one GEMM of the same total shape",
    ),
    ConstantDef(
        "attention_efficiency", "fraction", 0.50, 0.6, True,
        "fraction of the dense BF16 peak the fused (flash) attention kernel sustains at head dim "
        "128 and long context; backward does 2.5x the forward FLOPs at the same efficiency",
        "priors: FlashAttention-2 reaches 50-73% of A100 peak in its forward pass (Dao 2023, "
        "abstract); FlashAttention-3 up to 75% of H100 peak (Shah et al. 2024, abstract), "
        "backward lower; CDNA flash attention lower (order of magnitude)",
        priors=(("ampere", 0.55), ("hopper", 0.50), ("blackwell", 0.45), ("cdna3", 0.30),
                ("cdna4", 0.35), ("generic", 0.25)),
    ),
    ConstantDef(
        "attention_head_dim_half", "positive", 64.0, 0.5, False,
        "head dimension at which flash attention runs at half its asymptotic rate; the "
        "efficiency at head dim d is scaled by [d/(d+x)] / [128/(128+x)] (1 at d = 128)",
        "prior: flash-attention throughput is lower at head dim 64 than at 128 (Dao 2023 "
        "benchmarks); x = 64 makes head dim 64 run at 75% of head dim 128",
        lower=1.0, upper=4096.0,
    ),
    ConstantDef(
        "hbm_efficiency", "fraction", 0.70, 0.5, True,
        "fraction of the HBM bandwidth memory-bound element-wise kernels reach (norms, "
        "activations, rope, residual adds, permutes, casts, cross-entropy, optimizer step)",
        "prior (order of magnitude): streaming kernels reach 80-90% of HBM peak, training "
        "kernels with reductions and short tensors less; generic 0.55",
        priors=(("generic", 0.55),),
    ),
    ConstantDef(
        "scale_up_efficiency", "fraction", 0.75, 0.5, True,
        "fraction of the per-GPU scale-up (NVLink / xGMI) bandwidth a collective's bus "
        "bandwidth reaches for large messages",
        "prior (order of magnitude): large-message NCCL/RCCL bus bandwidth is 65-80% of the "
        "link rate; generic 0.55",
        priors=(("cdna3", 0.65), ("cdna4", 0.65), ("generic", 0.55)),
    ),
    ConstantDef(
        "nic_efficiency", "fraction", 0.75, 0.5, True,
        "fraction of the per-GPU NIC bandwidth a collective reaches across nodes",
        "prior (order of magnitude): ~75% of the NIC line rate for large messages; generic 0.55",
        priors=(("generic", 0.55),),
    ),
    ConstantDef(
        "collective_latency_s", "positive", 10e-6, 0.7, False,
        "fixed latency of one collective or point-to-point step (launch, synchronisation, "
        "protocol); a collective over n ranks pays it (1 + log2 n) times",
        "prior (order of magnitude): NCCL/RCCL small-message latency of tens of microseconds",
        lower=1e-7, upper=1e-2,
    ),
    ConstantDef(
        "kernel_overhead_s", "positive", 10e-6, 0.7, False,
        "host time to issue one operation of a layer (Python and framework dispatch, kernel "
        "launch), counted per operation of each layer (oracle.host.KERNELS_PER_LAYER: "
        "a MoE layer issues a fixed set plus four per local expert); a layer takes the smooth "
        "maximum of its host and GPU times, so it binds only where the GPU work per layer is "
        "small (fine-grained MoE at small micro-batches)",
        "prior (order of magnitude): ~10 us of eager PyTorch dispatch and launch per operation; "
        "shared (a property of the framework and host CPU, not of the GPU architecture)",
        lower=1e-8, upper=1e-3,
    ),
    ConstantDef(
        "pipeline_chunk_host_s", "positive", 200e-6, 0.7, False,
        "host time of the pipeline schedule at one model-chunk boundary and direction (Megatron-"
        "Core schedules.py: switching the virtual pipeline rank, posting the chunk's isend / "
        "irecv and waiting on the receive, deallocating the sent output tensor, the DDP and "
        "parameter-gather hooks of the chunk, the forward_step / backward_step wrappers); a "
        "dense or token-drop stage hides it behind the GPU's queue, a dropless MoE stage (one "
        "host-device synchronisation per layer) exposes it at each of its 2 vpp boundaries per "
        "micro-batch (oracle.schedule.chunk_boundary_host)",
        "prior (order of magnitude): a few hundred microseconds of Python per chunk in "
        "forward_backward_pipelining_with_interleaving (two NCCL p2p calls of ~20-50 us each, "
        "tensor allocation and bookkeeping); shared (host and framework, not GPU)",
        lower=1e-6, upper=1e-2,
    ),
    ConstantDef(
        "chunk_start_serial_fraction", "fraction", 0.5, 2.0, False,
        "fraction of the first layer of a pipeline chunk of a dropless MoE stage during which "
        "host and GPU do not overlap: the chunk starts with an empty GPU queue after the "
        "schedule's boundary work, so the host's issue time and the GPU time add there instead "
        "of taking their smooth maximum (oracle.schedule.chunk_boundary_host)",
        "prior: half (between an empty queue for the whole first layer, 1, and a host that "
        "catches up at once, 0); very wide (sigma 2 in logit space): the published runs decide",
    ),
    ConstantDef(
        "host_gpu_overlap_exponent", "positive", 1.71, 0.5, False,
        "exponent p of the smooth maximum (host^p + gpu^p)^(1/p) that combines a dropless MoE "
        "layer's host time with its GPU time: the layer synchronises host and device once per "
        "forward (token counts), so host and GPU overlap only within the segments between "
        "synchronisations; p -> infinity is full overlap (the larger time alone), p = 1 none "
        "(their sum)",
        "prior: the neutral midpoint: equal host and GPU times expose half of either "
        "(2^(1/p) = 1.5, p = 1.71); wide (sigma 0.5 in log space). It replaces the earlier "
        "fixed assumption p = 4, which grouped cross-validation rejected (docs/projection.md)",
        lower=1.0, upper=16.0,
    ),
    ConstantDef(
        "power_clock_exponent", "fraction", 0.4, 0.5, False,
        "exponent gamma of the power-limited sustained clock: within an architecture a part "
        "with U compute units (SMs / CUs) and board power P sustains a dense tensor rate "
        "~ U^(1-gamma) P^gamma, relative to the architecture's reference part (a100, h100, b200, "
        "mi300x, mi355x); GEMMs, attention and the softmax units run at that rate, memory and "
        "links do not",
        "prior: dynamic power ~ U f V^2 with V rising with f gives P ~ U f^3, i.e. gamma = 1/3; "
        "with leakage and a voltage floor gamma lies between 1/3 and 1 (0.4, order of "
        "magnitude); TDP and unit counts in gpus.json with their sources",
    ),
    ConstantDef(
        "step_overhead_s", "positive", 0.05, 1.0, False,
        "fixed time per training step beyond the modelled GPU work: host work the GPUs wait "
        "for once per step (gradient-norm and clipping reductions, loss averaging and the "
        "logging synchronisation, optimizer kernel launches over the parameter buckets, the "
        "next batch)",
        "prior (order of magnitude): tens of milliseconds of per-iteration host work in "
        "Megatron/PyTorch training loops; wide (sigma 1 in log space)",
        lower=1e-4, upper=10.0,
    ),
    ConstantDef(
        "tp_comm_overlap", "fraction", 0.5, 0.6, False,
        "fraction of a layer's GEMM time that can hide its tensor-parallel all-gather / "
        "reduce-scatter in runs that overlap TP communication (Transformer Engine userbuffers, "
        "torchtitan async TP; oracle.work.RunTraits.tp_comm_overlap); runs without it "
        "expose all of it",
        "prior: half; Transformer Engine TP-comm overlap and async TP hide most of it, "
        "plain Megatron/torchtitan TP hides none",
    ),
    ConstantDef(
        "ep_comm_overlap", "fraction", 0.2, 0.6, False,
        "fraction of the MoE dispatch/combine all-to-all hidden behind computation",
        "prior: Megatron-Core overlaps EP all-to-all only with --overlap-moe-expert-parallel-"
        "comm or shared-expert overlap; most published runs expose most of it",
    ),
    ConstantDef(
        "ep_a2a_overlap", "fraction", 0.7, 0.6, False,
        "fraction of the MoE dispatch/combine all-to-all hidden in runs with Megatron-Core's "
        "expert-parallel overlap (--overlap-moe-expert-parallel-comm --delay-wgrad-compute; "
        "Megatron-Bridge moe_a2a_overlap): the forward of one micro-batch and the backward of "
        "another run as one schedule, each all-to-all beside the other's computation "
        "(oracle.projection.RunTraits.moe_a2a_overlap)",
        "prior: most of it (0.7); the overlap needs compute of the other micro-batch of at "
        "least the all-to-all's length, which fine-grained MoE at small micro-batches may lack",
    ),
    ConstantDef(
        "pp_comm_overlap", "fraction", 0.5, 0.6, False,
        "fraction of one virtual-stage chunk's compute (forward or backward) that can hide that "
        "chunk's activation send/receive in the interleaved schedule; the 1F1B schedule exposes "
        "its transfers fully",
        "prior: half; Megatron-LM overlap_p2p_comm (default on for interleaved schedules) runs "
        "the transfer beside the next chunk's compute",
    ),
    ConstantDef(
        "dp_comm_overlap", "fraction", 0.8, 0.6, False,
        "fraction of the overlap window (one micro-batch's backward for gradient reduce-scatter,"
        " its forward for parameter all-gather) the data-parallel collectives can use",
        "prior: Megatron overlap_grad_reduce / overlap_param_gather and FSDP prefetching hide "
        "most DP traffic when it fits in the window",
    ),
    ConstantDef(
        "mamba_kernel_efficiency", "positive", 1.0, 0.5, True,
        "rate of the Mamba-2 mixer's own kernels relative to the kernels they are modelled on: "
        "mamba_ssm's Triton SSD kernels (``ops/triton/ssd_combined.py``: _chunk_cumsum, "
        "_chunk_state, _state_passing, _bmm_chunk, _chunk_scan and their backward), "
        "causal_conv1d and the Triton gated RMSNorm (``ops/triton/layernorm_gated.py``) run at "
        "attention_efficiency x this (the scan's matmuls) and hbm_efficiency x this (their HBM "
        "traffic: chunk states, C B^T, conv and norm bytes); the in/out projections are GEMMs",
        "prior 1 (the kernels as efficient as flash attention and the element-wise kernels), "
        "log-space width 0.5; fitted per architecture on the hybrid Mamba rows (Nemotron 3 Nano "
        "/ Super on H100, B200, GB200): the Triton kernels are autotuned per GPU from one "
        "config list with small tl.dot tiles (chunk 128 x head dim 64 / state 128), not the "
        "architecture's own MMA pipelines that cuDNN attention and cuBLAS use",
        lower=0.05, upper=2.0,
    ),
)

CONSTANT_NAMES: tuple[str, ...] = tuple(c.name for c in CONSTANTS)
#: The part of each architecture whose catalog peak the kernel-efficiency constants refer to;
#: other parts of the architecture sustain a rate scaled by their compute units and board power
#: (``power_clock_exponent``; :func:`oracle.compute.sustained_rate`).
POWER_REFERENCE_GPU: dict[str, str] = {
    "ampere": "a100", "hopper": "h100", "blackwell": "b200", "cdna3": "mi300x", "cdna4": "mi355x",
}
BY_NAME: dict[str, ConstantDef] = {c.name: c for c in CONSTANTS}

#: Software stacks whose kernels differ from the reference (Megatron-Core with Transformer
#: Engine: cuBLASLt GEMMs, cuDNN fused attention, fused norms and casts). Megatron-LM,
#: Megatron-Bridge, NeMo, Primus (ROCm Megatron) and other Megatron forks are ``megatron``;
#: ``pytorch-fsdp`` is a plain PyTorch training script on FSDP (AMD-AIG-AIMA/pytorch-training-
#: benchmark ``train_fsdp.py``: torch FSDP FULL_SHARD, torch.compile or Transformer Engine layers
#: under FP8, flash-attn), a PyTorch-native stack like torchtitan and llm-foundry.
SOFTWARE_STACKS: tuple[str, ...] = ("megatron", "torchtitan", "llm-foundry", "pytorch-fsdp")
REFERENCE_SOFTWARE = "megatron"
#: Per-stack factors (fitted, log space, prior 1): they scale the reference stack's kernel
#: efficiencies for another stack's kernels.
SOFTWARE_FACTORS: tuple[ConstantDef, ...] = (
    ConstantDef(
        "attention_factor", "positive", 1.0, 0.3, False,
        "attention-kernel efficiency of the stack relative to Megatron/TE's cuDNN fused "
        "attention (PyTorch SDPA FlashAttention-2, Triton flash attention in llm-foundry)",
        "prior 1: no difference assumed until runs show one",
        lower=0.2, upper=2.0,
    ),
    ConstantDef(
        "gemm_factor", "positive", 1.0, 0.3, False,
        "GEMM and element-wise efficiency of the stack relative to Megatron/TE (torch.compile "
        "or eager kernels, FSDP2 mixed-precision casts, the GPU variant the stack published on: "
        "torchtitan's H100s are an HBM2e variant; their stated 500 W limit enters as the GPU's "
        "tdp_w, not here)",
        "prior 1: no difference assumed until runs show one",
        lower=0.2, upper=2.0,
    ),
)
SOFTWARE_BY_NAME: dict[str, ConstantDef] = {c.name: c for c in SOFTWARE_FACTORS}


def software_stack(framework: str) -> str:
    """The stack key of a framework name (``published_runs.csv`` ``framework`` column)."""
    f = framework.lower()
    if "torchtitan" in f:
        return "torchtitan"
    if "llm-foundry" in f or "composer" in f or "mosaic" in f:
        return "llm-foundry"
    if "pytorch fsdp" in f or "train_fsdp" in f:
        return "pytorch-fsdp"
    return REFERENCE_SOFTWARE


def prior_table() -> dict[str, Any]:
    """Calibration-file content with every constant at its prior (no fit)."""
    defaults = {c.name: c.prior for c in CONSTANTS}
    archs: dict[str, dict[str, float]] = {}
    for arch in ARCHITECTURES:
        over = {c.name: c.prior_for(arch) for c in CONSTANTS if c.per_arch}
        archs[arch] = {k: v for k, v in over.items() if v != defaults[k]}
    return {
        "_about": "tune-cp time-model constants: priors only (no calibration run).",
        "fitted_on": None,
        "defaults": defaults,
        "architectures": archs,
        "software": {},
    }


@dataclass(frozen=True)
class CalibrationTable:
    """The content of a calibration file: shared defaults, per-architecture overrides and the
    header (``about``, ``fitted_on``: which rows, when, and the fit error)."""

    defaults: dict[str, float]
    architectures: dict[str, dict[str, float]]
    about: str = ""
    fitted_on: dict[str, Any] | None = None
    software: dict[str, dict[str, float]] | None = None

    def constants(self, arch: str, software: str = REFERENCE_SOFTWARE) -> dict[str, float]:
        """Every constant for one architecture (override, else default, else prior), with the
        software stack's factors applied to the kernel efficiencies (capped below 1)."""
        arch = architecture_key(arch)
        out = {c.name: c.prior for c in CONSTANTS}
        out.update(self.defaults)
        if arch not in self.architectures:
            # no fitted values for this architecture: its own priors, not the shared defaults
            # (generic: the conservative priors)
            out.update({c.name: c.prior_for(arch) for c in CONSTANTS if c.per_arch})
        out.update(self.architectures.get(arch, {}))
        f = self.software_factors(software)
        out["attention_efficiency"] = min(0.999, out["attention_efficiency"] * f["attention_factor"])
        for key in ("gemm_efficiency_bf16", "gemm_efficiency_fp8", "gemm_efficiency_fp4",
                    "hbm_efficiency"):
            out[key] = min(0.999, out[key] * f["gemm_factor"])
        return out

    def software_factors(self, software: str) -> dict[str, float]:
        if software not in SOFTWARE_STACKS:
            raise ConfigError(
                f"unknown software stack {software!r}; choose one of {', '.join(SOFTWARE_STACKS)}"
            )
        out = {c.name: c.prior for c in SOFTWARE_FACTORS}
        out.update((self.software or {}).get(software, {}))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "_about": self.about,
            "fitted_on": self.fitted_on,
            "constants": {
                c.name: {"meaning": c.meaning, "prior_source": c.source,
                         "per_architecture": c.per_arch}
                for c in CONSTANTS
            },
            "software_factors": {
                c.name: {"meaning": c.meaning, "prior_source": c.source}
                for c in SOFTWARE_FACTORS
            },
            "defaults": self.defaults,
            "architectures": self.architectures,
            "software": self.software or {},
        }


class MfuCeiling(Spec):
    """One class's published MFU ceiling in a calibration header (``calibration/calibrate.py::
    mfu_ceilings``): the best measured MFU, a fraction of the peak, and the row that set it."""

    mfu: float = Field(gt=0, le=1)
    row: str
    model: str
    gpu: str


class FittedOn(Spec):
    """A calibration file's ``fitted_on`` header: what ``calibrate`` (``calibration/calibrate.py::
    calibrate``) and ``calibrate --log`` (``calibration/refit.py::calibrate_from_logs``) write. The
    keys read by the projection (``gpus_fitted``, ``architectures_fitted``,
    ``gpus_by_architecture``: ``evidence_note``; ``mfu_ceilings``: ``projection.mfu_note``;
    ``user_residuals``: ``uncertainty.residuals_for``) and every other key written are typed;
    further keys (of a later version) are kept unread."""

    model_config = ConfigDict(frozen=True, extra="allow", defer_build=True)

    runs_file: str = ""
    date: str = ""
    rows: list[str] | int = []
    logs: list[str] = []
    user_row_weight: float = Field(default=1.0, gt=0)
    excluded_sources: list[str] = []
    architectures_fitted: list[str] = []
    gpus_fitted: list[str] = []
    gpus_by_architecture: dict[str, list[str]] = {}
    software_stacks_fitted: list[str] = []
    tokens_per_s_mape: float | None = Field(default=None, ge=0)
    tokens_per_s_median_ape: float | None = Field(default=None, ge=0)
    tokens_per_s_mape_priors_only: float | None = Field(default=None, ge=0)
    method: str = ""
    mfu_ceilings: dict[str, MfuCeiling] = {}
    #: log(measured / projected) of each log's row (finite: ``oracle/inputs.py::check_tree``)
    user_residuals: list[float] = []


class CalibrationFile(Spec):
    """The schema every calibration file is validated against (strictly: ``oracle/inputs.py::
    validate``) before any of it is used, by every command: the shape
    :meth:`CalibrationTable.to_json` writes. The constants' ranges are checked after it
    (:func:`table_from_json`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True,
                              populate_by_name=True)

    about: str = Field(default="", alias="_about")
    fitted_on: FittedOn | None = None
    constants: dict[str, dict[str, str | bool]] | None = None
    software_factors: dict[str, dict[str, str | bool]] | None = None
    defaults: dict[str, float] | None = None
    architectures: dict[str, dict[str, float]] | None = None
    software: dict[str, dict[str, float]] | None = None


#: Top-level keys of a calibration file (what :meth:`CalibrationTable.to_json` writes).
CALIBRATION_KEYS = ("_about", "fitted_on", "constants", "software_factors", "defaults",
                    "architectures", "software")


def _mapping(value: Any, where: str, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {key!r} must be a mapping, got {type(value).__name__}")
    return value


#: Lowest efficiency a calibration file may give (a fraction of the peak rate): the time model
#: divides work by peak x efficiency, and an efficiency of 5e-324 made a step time overflow to
#: inf (numpy's warning, then ``MFU nan%``). No kernel class runs below 1% of its peak (the
#: fitted values lie in 0.32-0.93: ``oracle/catalog/calibration.json``); a fit that went there
#: would be wrong, not slow.
MIN_EFFICIENCY = 0.01


def _constant_value(c: ConstantDef, raw: Any, where: str, key: str) -> float:
    """A calibration value: a finite number within the constant's range (an efficiency or
    factor also at least :data:`MIN_EFFICIENCY`: the time model divides by it)."""
    from tune_cp.oracle.inputs import finite

    v = finite(raw, f"{where}: {key}")
    divides = c.lower == 0 and ("efficiency" in c.name or c.name.endswith("factor"))
    lower = max(c.lower, MIN_EFFICIENCY) if divides else c.lower
    if not (lower <= v <= c.upper):
        low = f">= {lower:g}"
        raise ConfigError(f"{where}: {key} = {raw!r} is outside the constant's range "
                          f"({low} and <= {c.upper:g})")
    return v


def table_from_json(data: Any, where: str = "calibration file") -> CalibrationTable:
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a mapping (the output of `tune-cp calibrate "
                          f"--out`), got {type(data).__name__}")
    extra = sorted(set(data) - set(CALIBRATION_KEYS))
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {extra}; a calibration file has "
                          f"{', '.join(CALIBRATION_KEYS)}")
    from tune_cp.oracle.inputs import validate

    parsed = validate(CalibrationFile, data, where)
    if not data.get("defaults") and not data.get("architectures"):
        raise ConfigError(f"{where}: no 'defaults' or 'architectures' constants; write the "
                          f"file with `tune-cp calibrate --out`")
    defaults = _mapping(data.get("defaults"), where, "defaults")
    archs = _mapping(data.get("architectures"), where, "architectures")
    unknown = set(defaults) - set(CONSTANT_NAMES)
    for arch, vals in archs.items():
        unknown |= set(_mapping(vals, where, f"architectures.{arch}")) - set(CONSTANT_NAMES)
    if unknown:
        raise ConfigError(
            f"{where}: unknown constant(s) {sorted(unknown)}; known: {', '.join(CONSTANT_NAMES)}"
        )
    soft = _mapping(data.get("software"), where, "software")
    for stack, vals in soft.items():
        if stack not in SOFTWARE_STACKS or set(_mapping(vals, where, f"software.{stack}")) \
                - set(SOFTWARE_BY_NAME):
            raise ConfigError(
                f"{where}: software entry {stack!r} must be one of {', '.join(SOFTWARE_STACKS)} "
                f"with factors {', '.join(SOFTWARE_BY_NAME)}"
            )
    return CalibrationTable(
        defaults={k: _constant_value(BY_NAME[k], v, where, f"defaults.{k}")
                  for k, v in defaults.items()},
        architectures={
            a: {k: _constant_value(BY_NAME[k], v, where, f"architectures.{a}.{k}")
                for k, v in vals.items()}
            for a, vals in archs.items()
        },
        about=str(data.get("_about", "")),
        fitted_on=None if parsed.fitted_on is None else parsed.fitted_on.model_dump(
            exclude_unset=True),
        software={s: {k: _constant_value(SOFTWARE_BY_NAME[k], v, where, f"software.{s}.{k}")
                      for k, v in vals.items()} for s, vals in soft.items()},
    )


def load_calibration(path: str | Path | None = None) -> CalibrationTable:
    """The calibration file at ``path``, or the one shipped in ``oracle/catalog``."""
    from tune_cp.oracle.inputs import parse_json, read_text, show_name

    if path is None:
        return _default_table()
    where = f"calibration file {show_name(path)}"
    return table_from_json(parse_json(read_text(path, "calibration file"), where), where)


@cache
def _default_table() -> CalibrationTable:
    if not CALIBRATION_PATH.exists():
        return table_from_json(prior_table())
    return table_from_json(json.loads(CALIBRATION_PATH.read_text()), str(CALIBRATION_PATH))


def evidence_note(gpu_name: str, architecture: str, table: CalibrationTable) -> str:
    """What measured rows stand behind a projection on this GPU: "" when the calibration was
    fitted on rows of this very GPU; otherwise one line saying that it rests on rows of other
    GPUs of its architecture, or on none (conservative ``generic`` constants or priors)."""
    fitted = table.fitted_on or {}
    gpus = set(fitted.get("gpus_fitted", []))
    archs = set(fitted.get("architectures_fitted", []))
    arch = architecture_key(architecture)
    if gpu_name in gpus:
        return ""
    if arch == GENERIC_ARCHITECTURE:
        return (f"no measured row of {gpu_name} or its architecture (none stated): conservative "
                "generic constants; state `architecture` in the GPU file and verify on the "
                "cluster")
    if arch not in archs:
        return (f"no measured row of {gpu_name} or of architecture {arch}: its constants are "
                "priors, not fitted; verify on the cluster")
    others = sorted(g for g in gpus if g in fitted.get("gpus_by_architecture", {}).get(arch, []))
    via = f" ({', '.join(others)})" if others else ""
    return (f"no measured row of {gpu_name}: constants of architecture {arch} fitted on other "
            f"GPUs{via}")


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_constants(table: CalibrationTable) -> str:
    """Plain-text table of every constant: prior, shared value, per-architecture values, and the
    software-stack factors (``tune-cp calibrate`` prints it; docs/projection.md quotes it)."""
    archs = list(ARCHITECTURES)
    head = ["constant", "per arch", "prior", "default", *archs]
    rows = []
    for c in CONSTANTS:
        vals = [table.architectures.get(a, {}).get(c.name, table.defaults.get(c.name, c.prior))
                for a in archs]
        rows.append([c.name, "yes" if c.per_arch else "no", f"{c.prior:.4g}",
                     f"{table.defaults.get(c.name, c.prior):.4g}",
                     *(f"{v:.4g}" if c.per_arch else "" for v in vals)])
    for stack in SOFTWARE_STACKS:
        if stack == REFERENCE_SOFTWARE:
            continue
        f = table.software_factors(stack)
        for c in SOFTWARE_FACTORS:
            rows.append([f"{stack}.{c.name}", "no", f"{c.prior:.4g}", f"{f[c.name]:.4g}",
                         *([""] * len(archs))])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)
