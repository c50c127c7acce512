"""Host (CPU) overhead terms of the time model: the operations the host issues per layer and how
much of their time the GPU cannot hide.

* **Host overhead**: the host issues :data:`KERNELS_PER_LAYER` operations per layer (forward;
  backward twice as many; a MoE layer adds a fixed set plus four per local expert) at
  ``kernel_overhead_s`` each (:func:`layer_host_time`). The host runs ahead of the GPU: a dense
  layer exposes only host time beyond its GPU time. A dropless MoE layer synchronises host and
  device once (token counts, :func:`oracle.work.moe_host_sync`), so the host cannot run ahead
  across it: the layer takes the smooth maximum ``(host^p + gpu^p)^(1/p)`` (p =
  ``host_gpu_overlap_exponent``, fitted) of its host and GPU times (:func:`host_exposed`). The
  excess over the GPU time is ``kernel_overhead``. Small micro-batches of fine-grained MoE models
  (many local experts, little work per expert) become host-bound. The pipeline chunk boundaries
  of such a stage: :func:`oracle.schedule.chunk_boundary_host`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Host operations (Python-dispatched kernels and collectives) per forward pass of one layer part;
#: the backward issues twice as many. attention: norm, QKV, rope, attention, output projection,
#: residual, bias/dropout; mlp: norm, fc1, activation, fc2, residual; moe (on top of the mlp
#: entry's norm/residual/activation), order-of-magnitude count of Megatron-Core's dropless MoE
#: layer: router GEMM, softmax/top-k, load-balancing and z losses (a dozen small ops), token
#: counts and their device-to-host copy, the count exchange, permutation index ops, two token
#: all-to-alls, unpermute, probability scaling, ~40; moe_per_local_expert: the grouped expert
#: MLP is a loop over the rank's experts (Transformer Engine GroupedLinear: per expert an
#: input quantisation and a GEMM for fc1 and for fc2 forward), 4 per local expert.
KERNELS_PER_LAYER = {"attention": 7.0, "mlp": 5.0, "moe": 40.0, "moe_per_local_expert": 4.0}


#: Host operations of one context-parallel ring step and direction (Transformer Engine
#: ``AttnFuncWithCPAndKVP2P``, Megatron's default ``cp_comm_type p2p``): isend, irecv, their
#: wait, up to two flash-attention calls (the load-balanced halves of the step's block) and the
#: softmax-LSE / output correction; order-of-magnitude count.
CP_OPS_PER_RING_STEP = 6.0


def layer_host_time(moe: bool, local_experts: Any, kernel_overhead_s: Any,
                    cp_steps: Any = 0.0) -> np.ndarray:
    """Host time to issue one layer's forward and backward (backward: twice the forward's
    operations): ``3 x (attention + mlp [+ moe + moe_per_local_expert x local experts] +
    CP_OPS_PER_RING_STEP x cp_steps) x kernel_overhead_s`` with the counts of
    :data:`KERNELS_PER_LAYER` (``cp_steps``: the ``cp - 1`` ring steps of context
    parallelism)."""
    ops = (KERNELS_PER_LAYER["attention"] + KERNELS_PER_LAYER["mlp"]
           + CP_OPS_PER_RING_STEP * np.asarray(cp_steps, dtype=np.float64))
    if moe:
        ops = ops + KERNELS_PER_LAYER["moe"] + KERNELS_PER_LAYER["moe_per_local_expert"] * \
            np.asarray(local_experts, dtype=np.float64)
    return 3.0 * ops * np.asarray(kernel_overhead_s, dtype=np.float64)


def host_exposed(host: Any, gpu: Any, p: Any) -> np.ndarray:
    """Host time a layer exposes beyond its GPU time: ``(host^p + gpu^p)^(1/p) - gpu``, the
    smooth maximum of the two with exponent ``p`` (``host_gpu_overlap_exponent``) minus the GPU
    time. Worked example (p = 2): host 3 ms, GPU 4 ms -> (9 + 16)^(1/2) - 4 = 1 ms."""
    h, g = np.asarray(host, dtype=np.float64), np.asarray(gpu, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    return (h**p + g**p) ** (1.0 / p) - g
