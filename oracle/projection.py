"""Time projection: step time, tokens/s/GPU, model TFLOP/s/GPU, MFU and a breakdown.

The model is split in two so that one code path serves a single configuration, a vectorised
batch of configurations, and the calibration over many published runs:

1. :func:`oracle.work.build_work` — *what* one rank does per micro-batch, independent of the
   fitted constants: the shape ``(M, N, K)`` of every GEMM, core-attention FLOPs, bytes of
   memory-bound element-wise work, bytes of every collective with its group size and link, how
   many layers of each kind every pipeline stage holds and recomputes, parameters per stage (for
   data-parallel traffic and the optimizer). numpy arrays, one entry per configuration.
2. :func:`oracle.timing.timing` — *how long* that takes, given the constants of
   ``oracle/constants.py`` (scalars or one value per configuration): GEMM time from a
   shape-dependent efficiency, attention at the flash-attention efficiency
   (:mod:`oracle.compute`), element-wise work at HBM bandwidth, host overhead
   (:mod:`oracle.host`), collectives on an alpha-beta model of the right link with the overlap
   the framework achieves (:mod:`oracle.collectives`), then the pipeline schedule over the
   slowest stage (:mod:`oracle.schedule`), data-parallel traffic and the optimizer step.

Each of those modules lists in its docstring the formulas it implements. This module is the
public face: :func:`project` is ``build_work`` + ``timing`` for one configuration;
:func:`score_configs` is the same for a :class:`~oracle.work.ConfigBatch`, and returns identical
step times (a test checks it). :class:`Projection` is the result of one configuration, with MFU
over :func:`mfu_peak_flops` and the :func:`mfu_note` for an MFU above the published ceiling.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from tune_cp.config.specs import (
    ClusterSpec,
    ConfigError,
    ModelSpec,
    ParallelConfig,
    Precision,
    TrainingSpec,
)
from tune_cp.oracle import flops as F
from tune_cp.oracle import params as P
from tune_cp.oracle.constants import (
    REFERENCE_SOFTWARE,
    CalibrationTable,
    evidence_note,
    load_calibration,
)
from tune_cp.oracle.timing import BREAKDOWN, constants_arrays, timing
from tune_cp.oracle.work import ConfigBatch, RunTraits, build_work, padded_vocab


class Projection(BaseModel):
    """Projected performance of one configuration.

    ``breakdown``: seconds per step by component (:data:`BREAKDOWN`), adding up to
    ``step_time_s``; compute components are those of the slowest pipeline stage (x micro-batches),
    ``pipeline_bubble`` the schedule's fill and drain, ``dp_comm`` the exposed data-parallel
    traffic (FSDP per micro-batch, plus the step's gradient/parameter collectives) and
    ``optimizer`` the optimizer step. ``mfu`` is model FLOPs over the peak of the precision the
    GEMMs run in (BF16, FP8 or FP4 dense peak), recompute excluded.
    """

    model_config = ConfigDict(frozen=True)

    step_time_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    model_flops_per_token: float
    breakdown: dict[str, float]
    critical_stage: int
    label: str
    calibration: str
    #: "" when the calibration was fitted on rows of this GPU; else what the projection rests on
    #: (:func:`oracle.constants.evidence_note`)
    evidence: str = ""
    #: "" unless the projected MFU is above the best published MFU of its class (dense or MoE,
    #: architecture, precision): then what makes it higher (:func:`mfu_note`)
    mfu_note: str = ""


def mfu_peak_flops(cluster: ClusterSpec, training: TrainingSpec, fp8_active: bool) -> float:
    """The peak MFU is measured against: the dense peak of the precision the GEMMs run in (FP4
    when the training is FP4 and the GPU has FP4 tensor cores, else FP8 under an FP8 recipe on a
    GPU with FP8 tensor cores, else BF16). :func:`score_configs` and the published-MFU ceilings
    (:func:`calibration.calibrate.mfu_ceilings`) both use it."""
    if training.precision is Precision.FP4 and cluster.gpu.peak_fp4_flops:
        return cluster.gpu.peak_fp4_flops
    if fp8_active and cluster.gpu.peak_fp8_flops:
        return cluster.gpu.peak_fp8_flops
    return cluster.gpu.peak_bf16_flops


def _calib(calib: CalibrationTable | str | None) -> CalibrationTable:
    if isinstance(calib, CalibrationTable):
        return calib
    return load_calibration(calib)


def score_configs(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    batch: ConfigBatch,
    calib: CalibrationTable | str | None = None,
    software: str = REFERENCE_SOFTWARE,
) -> dict[str, np.ndarray]:
    """Vectorised projection of many configurations of one (model, cluster, training).

    Returns arrays: ``step_time_s``, ``tokens_per_s_per_gpu``, ``model_tflops_per_gpu``, ``mfu``
    and the :data:`BREAKDOWN` components. Legality is not checked here (the solver's job).
    ``software``: the stack whose kernel efficiencies apply (``megatron`` by default; see
    :data:`oracle.constants.SOFTWARE_STACKS`)."""
    table = _calib(calib)
    w = build_work(model, cluster, training, batch)
    res = timing(w, constants_arrays(table, cluster.gpu.architecture, len(batch), software))
    # tokens the step actually trains: mbs x dp x ga sequences (= the global batch for a legal
    # configuration; an illegal one that does not divide it is not credited with more)
    tokens = (batch.mbs * batch.dp * batch.ga).astype(np.float64) * training.seq_len
    world = cluster.world_size
    flops_tok = model_flops_per_token_array(model, training.seq_len, batch.tp)
    step = res["step_time_s"]
    res["tokens_per_s_per_gpu"] = tokens / step / world
    res["model_flops_per_token"] = flops_tok
    res["model_tflops_per_gpu"] = flops_tok * tokens / step / world / 1e12
    peak = np.where(batch.fp8 >= 0, mfu_peak_flops(cluster, training, True),
                    mfu_peak_flops(cluster, training, False))
    res["mfu"] = res["model_tflops_per_gpu"] * 1e12 / peak
    return res


@lru_cache(maxsize=1024)
def _flops_base(model: ModelSpec, seq_len: int) -> float:
    return F.model_flops_per_token(model, seq_len, 1)


def model_flops_per_token_array(model: ModelSpec, seq_len: int, tp: np.ndarray) -> np.ndarray:
    """:func:`oracle.flops.model_flops_per_token` for an array of tp (only Megatron's vocabulary
    padding, a multiple of 128 x tp, depends on tp): the tp = 1 value plus the logits FLOPs of
    the extra padded vocabulary."""
    vpad1 = P.padded_vocab_size(model.vocab_size, 1)
    per_vocab = F.FWD_BWD_FACTOR * F.FMA * model.hidden_size * (1 + model.num_mtp_layers)
    extra = (padded_vocab(model.vocab_size, np.asarray(tp)) - vpad1).astype(np.float64)
    return _flops_base(model, seq_len) + per_vocab * extra


def project(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    cfg: ParallelConfig,
    calib: CalibrationTable | str | None = None,
    software: str = REFERENCE_SOFTWARE,
    traits: RunTraits | None = None,
) -> Projection:
    """Projection of one configuration resolved by :func:`config.resolve.resolve_config`.

    ``calib``: a :class:`~oracle.constants.CalibrationTable`, a path to a calibration JSON
    (``tune-cp calibrate --out``), or None for the shipped ``oracle/catalog/calibration.json``.
    ``software``: ``megatron`` (Megatron-LM / Bridge / NeMo / Primus, the default),
    ``torchtitan`` or ``llm-foundry``. ``traits``: :class:`RunTraits` (None: the Megatron-Bridge
    defaults).
    """
    return project_many(model, cluster, training, [cfg], calib, software, traits)[0]


def project_many(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    cfgs: Sequence[ParallelConfig],
    calib: CalibrationTable | str | None = None,
    software: str = REFERENCE_SOFTWARE,
    traits: RunTraits | None = None,
) -> list[Projection]:
    """:func:`project` of each configuration of ``cfgs``, scored as one
    :class:`~oracle.work.ConfigBatch` (one :func:`score_configs` call: the same numbers as one
    call per configuration, without its fixed cost per call)."""
    table = _calib(calib)
    if not cfgs:
        return []
    for cfg in cfgs:
        if cfg.pipeline_split is None or cfg.dp is None or cfg.ga is None:
            raise ConfigError("resolve_config() the configuration before projecting it")
    batch = ConfigBatch.from_configs(list(cfgs), traits)
    res = score_configs(model, cluster, training, batch, table, software)
    evidence = evidence_note(cluster.gpu.name, cluster.gpu.architecture, table)
    about = table.about or "priors"
    out = []
    for i, cfg in enumerate(cfgs):
        breakdown = {k: float(res[k][i]) for k in BREAKDOWN}
        step, mfu = float(res["step_time_s"][i]), float(res["mfu"][i])
        out.append(Projection(
            step_time_s=step,
            tokens_per_s_per_gpu=float(res["tokens_per_s_per_gpu"][i]),
            model_tflops_per_gpu=float(res["model_tflops_per_gpu"][i]),
            mfu=mfu,
            model_flops_per_token=float(res["model_flops_per_token"][i]),
            breakdown=breakdown,
            critical_stage=int(res["critical_stage"][i]),
            label=cfg.label(),
            calibration=about,
            evidence=evidence,
            mfu_note=mfu_note(mfu, dict(breakdown), step, model.is_moe,
                              cluster.gpu.architecture, training.precision.value, table),
        ))
    return out


#: Breakdown entries that are GEMM work (what an MFU above the published ceiling rests on).
GEMM_TERMS = ("attention_gemm", "mlp_gemm", "expert_gemm", "router")
#: Exposed communication entries of the breakdown.
COMM_TERMS = ("tp_comm", "cp_comm", "ep_comm", "pp_p2p", "dp_comm")


def mfu_note(mfu: float, breakdown: dict[str, float], step_s: float, is_moe: bool,
             architecture: str, precision: str, table: CalibrationTable) -> str:
    """One line when a projected MFU is not bounded by a published run of its class
    (``fitted_on.mfu_ceilings`` of the calibration file, written by
    :func:`calibration.calibrate.mfu_ceilings`): above the best MFU a published run of the class
    reached (the ceiling and the row that set it), or in a class no published run belongs to
    (the published ceilings of the same architecture instead); either way what the projection's
    step consists of (GEMM share, bubble, exposed communication), so a user sees what the MFU
    rests on. "" when the MFU is within its class's ceiling, or when the calibration has no
    ceilings at all (a user's own calibration from logs)."""
    from tune_cp.oracle.constants import mfu_class

    ceilings = (table.fitted_on or {}).get("mfu_ceilings") or {}
    key = mfu_class(is_moe, architecture, precision)
    ceil = ceilings.get(key)
    if not ceilings or (ceil and mfu <= ceil["mfu"]):
        return ""
    gemm = sum(breakdown.get(k, 0.0) for k in GEMM_TERMS) / step_s
    comm = sum(breakdown.get(k, 0.0) for k in COMM_TERMS) / step_s
    bubble = breakdown.get("pipeline_bubble", 0.0) / step_s
    rests = (f"it rests on GEMMs taking {100 * gemm:.0f}% of the step at the fitted GEMM "
             f"efficiency, a {100 * bubble:.0f}% pipeline bubble and {100 * comm:.0f}% exposed "
             f"communication: verify the GEMM throughput at these shapes on the cluster")
    if ceil:
        return (f"MFU {100 * mfu:.1f}% is above the best published {100 * ceil['mfu']:.1f}% for "
                f"{key} (row {ceil['row']}, {ceil['model']} on {ceil['gpu']}); {rests}")
    return f"MFU {100 * mfu:.1f}% has {unbounded_class(key, ceilings)}; {rests}"


def unbounded_class(key: str, ceilings: dict[str, dict[str, Any]]) -> str:
    """"no published run of class K to bound it" and the published ceilings of the same
    architecture (``dense/blackwell/fp8 52.9%, row 33``), for a class without a ceiling."""
    arch = key.split("/")[1]
    near = [f"{k} {100 * c['mfu']:.1f}%, row {c['row']}" for k, c in sorted(ceilings.items())
            if k.split("/")[1] == arch]
    seen = f" (published on {arch}: {'; '.join(near)})" if near else f" (none on {arch})"
    return f"no published run of class {key} to bound it{seen}"


__all__ = [
    "COMM_TERMS",
    "GEMM_TERMS",
    "Projection",
    "mfu_note",
    "mfu_peak_flops",
    "unbounded_class",
    "model_flops_per_token_array",
    "project",
    "project_many",
    "score_configs",
]
