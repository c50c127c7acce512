"""Compute-rate terms of the time model: how fast a GPU runs a GEMM of a given shape and
precision, and the sustained tensor rate of a power-limited part.

* **GEMM** of shape (M, N, K): ``2 M N K / (peak x eff)``, ``eff = eff_prec x
  g(M) g(N) g(K)``, ``g(x) = x / (x + gemm_half_dim)`` (:func:`shape_factor`), never faster than
  moving its operands through HBM (:data:`OPERAND_BYTES`); expert GEMMs also x
  ``grouped_gemm_efficiency``. A low-precision GEMM's half dimension is ``gemm_half_dim`` x its
  peak over the BF16 peak (:func:`gemm_half_dims`: the fixed part of a GEMM's time takes as long
  at any precision, so FP8/FP4 gain less on small GEMMs). Backward = dgrad + wgrad, the same
  shape factors, twice the forward time; block-scaled recipes (MXFP8, blockwise) run at
  ``block_scaled_gemm_efficiency`` of a per-tensor FP8 GEMM. Low precision (FP8 recipes, NVFP4)
  applies to the transformer-layer linears; router and logits stay BF16 (Megatron/Transformer
  Engine default).
* **Core attention** (flash): forward FLOPs from :mod:`oracle.flops` (causal), backward
  :data:`ATTENTION_BWD_FLOPS_RATIO` x forward (FlashAttention-2 recomputes the scores: 5 matmuls
  vs 2; Dao 2023), at ``attention_efficiency`` x head-dim factor x ``g(context)``; never faster
  than the GPU's special-function units compute the softmax exponentials (one per score forward,
  one more in backward; ``sfu_exp_per_s`` in gpus.json): Blackwell Ultra doubles that rate.
* **Sustained rate**: GEMMs and attention run at a power-limited clock relative to the
  architecture's reference part (:func:`power_ratios`, :func:`sustained_rate`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from tune_cp.config.specs import GpuSpec

#: Bytes per element of a GEMM operand read from HBM (memory-bound floor of a GEMM).
OPERAND_BYTES = {0: 2.0, 1: 1.0, 2: 0.5625}  # bf16, fp8, nvfp4 (4 bit + 1 scale byte per 16)
#: Flash-attention backward FLOPs over forward (5 matmuls over 2; Dao 2023, FlashAttention-2).
ATTENTION_BWD_FLOPS_RATIO = 2.5


def shape_factor(x: np.ndarray, half: Any) -> np.ndarray:
    return x / (x + half)


def mamba_scan_time(flops: Any, chunk: Any, peak: Any, efficiency: Any, half_dim: Any
                    ) -> np.ndarray:
    """Forward time of the chunked SSD scan (``oracle/inventory.py::mamba_scan_flops_per_token``
    FLOPs): matmuls of chunk-length dimension on the BF16 tensor cores at the fitted
    flash-attention kernel efficiency (``attention_efficiency``: the scan is a fused
    chunked-matmul kernel like flash attention; no Mamba row was fitted), scaled by the GEMM-size
    saturation of the chunk length (``shape_factor(chunk, gemm_half_dim)``). Backward: twice
    the forward (``oracle/timing.py``)."""
    return np.where(flops > 0, flops / (peak * efficiency * shape_factor(chunk, half_dim)), 0.0)


def gemm_half_dims(half_dim: Any, low: np.ndarray, peak_low: Any, peak_bf16: Any) -> np.ndarray:
    """The GEMM dimension at which each slot runs at half its large-GEMM efficiency
    (``g(x) = x / (x + half)``).

    ``gemm_half_dim`` is measured in BF16 work: a GEMM's fixed part (launch and pipeline fill,
    prologue, the epilogue that writes the bf16 output, the last partial wave) takes the same
    time at any precision, while a low-precision tile computes ``peak_low / peak_bf16`` times
    faster, so the same fixed time is worth that many times more rows, columns or reduction
    length: ``half_low = gemm_half_dim x peak_low / peak_bf16`` (FP8: 2x, NVFP4: 4x-6x). Small
    GEMMs (high tp, small experts, few tokens per expert) gain less from FP8/FP4 than large
    ones. Worked example: half dim 128, FP8 at twice the BF16 peak: a 1024-wide dimension runs at
    1024/1280 = 0.80 in FP8 against 1024/1152 = 0.89 in BF16.

    ``half_dim``: (n,) or scalar; ``low``: (n, slots) bool, the slots in low precision;
    ``peak_low``/``peak_bf16``: (n,). Returns (n, slots)."""
    half = np.asarray(half_dim, dtype=np.float64)[..., None]
    ratio = (np.asarray(peak_low, dtype=np.float64)
             / np.asarray(peak_bf16, dtype=np.float64))[:, None]
    return np.where(low, half * ratio, half)


@lru_cache(maxsize=64)
def power_ratios(gpu: GpuSpec, ref: GpuSpec | None) -> tuple[float, float, float]:
    """``(reference peak / peak, units / reference units, TDP / reference TDP)`` of a GPU against
    its architecture's reference part ``ref`` (:data:`oracle.constants.POWER_REFERENCE_GPU`,
    looked up by ``oracle/catalog::power_reference``); all 1 without a reference or when the GPU
    or the reference lacks ``tdp_w`` or ``compute_units`` (nothing is modelled)."""
    if (ref is None or gpu.tdp_w is None or gpu.compute_units is None or ref.tdp_w is None
            or ref.compute_units is None):
        return (1.0, 1.0, 1.0)
    return (ref.peak_bf16_flops / gpu.peak_bf16_flops, gpu.compute_units / ref.compute_units,
            gpu.tdp_w / ref.tdp_w)


def sustained_rate(peak_ratio: Any, units_ratio: Any, tdp_ratio: Any, gamma: Any) -> np.ndarray:
    """Sustained dense tensor rate of a GPU over its catalog peak, within its architecture.

    Training GEMMs and attention run at a power-limited clock: with per-unit dynamic power
    growing as ``f^(1/gamma)``, a part with U compute units and board power P sustains
    ``rate ~ U^(1 - gamma) P^gamma``. Relative to the architecture's reference part (whose catalog
    peak the efficiency constants refer to) the rate is ``ref_peak x (U / U_ref)^(1 - gamma) x
    (P / P_ref)^gamma``; divided by the part's own catalog peak this is the factor returned (1
    for the reference part). Worked example, gamma = 0.5: GB300 (160 SMs, 1400 W, 2.5 PFLOP/s
    BF16) against B200 (148 SMs, 1000 W, 2.25): 0.9 x 1.0398 x 1.1832 = 1.107."""
    g = np.asarray(gamma, dtype=np.float64)
    return (np.asarray(peak_ratio, dtype=np.float64) * np.asarray(units_ratio) ** (1.0 - g)
            * np.asarray(tdp_ratio) ** g)
