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
* **FP8 current scaling**: Transformer Engine quantises every GEMM operand of a per-tensor
  current-scaling recipe with three launches (amax, scale, cast) where the other recipes use one,
  and quantises a grouped GEMM's experts one by one (:func:`current_scaling_host_time`); the
  extra launches are host time like every other operation of the layer.
* **Combined 1F1B schedule** (MoE all-to-all overlap): every layer part is a schedule node with
  its own stream events and its own autograd call in backward
  (:func:`combined_schedule_host_time`).
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
#: mamba (one Mamba-2 mixer layer, Megatron-Core 0.16.1 training path): fused norm + in_proj,
#: two layout copies (rearrange), the fused conv1d + SSD scan (causal_conv1d and the five
#: mamba_ssm chunk kernels: cumsum, chunk state, state passing, C B^T, chunk scan), the gated
#: RMSNorm, out_proj and the residual add, ~11.
KERNELS_PER_LAYER = {"attention": 7.0, "mlp": 5.0, "moe": 40.0, "moe_per_local_expert": 4.0,
                     "mamba": 11.0}
#: Host operations of the MoE parts that Megatron-Core's per-layer CUDA graphs can capture
#: (``--cuda-graph-scope moe_router`` / ``moe_preprocess``; part of the ``moe`` count above):
#: router: gating GEMM, (fused) top-k / softmax, aux-loss and z-loss ops, ~10; preprocess: the
#: token-count histogram, the count exchange's inputs, the permutation indices, ~6
#: (Megatron-Core ``moe/router.py`` ``TopKRouter.forward``, ``token_dispatcher.py``
#: ``dispatch_preprocess``; order-of-magnitude counts). ``attn`` and ``mlp`` capture the
#: attention and dense-MLP parts of :data:`KERNELS_PER_LAYER`.
GRAPH_SCOPE_OPS = {"attn": KERNELS_PER_LAYER["attention"], "mlp": KERNELS_PER_LAYER["mlp"],
                   "moe_router": 10.0, "moe_preprocess": 6.0}
#: Bits of :attr:`oracle.work.RunTraits.cuda_graph_scope` in the work arrays
#: (``full_iteration``: the step's whole forward-backward pass is one graph,
#: ``--cuda-graph-impl full_iteration``).
GRAPH_BITS = {"attn": 1, "mlp": 2, "moe_router": 4, "moe_preprocess": 8, "full_iteration": 16}


#: Host operations of one context-parallel ring step and direction (Transformer Engine
#: ``AttnFuncWithCPAndKVP2P``, Megatron's default ``cp_comm_type p2p``): isend, irecv, their
#: wait, up to two flash-attention calls (the load-balanced halves of the step's block) and the
#: softmax-LSE / output correction; order-of-magnitude count.
CP_OPS_PER_RING_STEP = 6.0

#: Extra host launches per quantised GEMM operand under FP8 per-tensor current scaling
#: ("FP8-CS", tensorwise): Transformer Engine's ``Float8CurrentScalingQuantizer::quantize_impl``
#: (``transformer_engine/pytorch/csrc/quantizer.cpp``) launches ``nvte_compute_amax``,
#: ``nvte_compute_scale_from_amax`` and ``nvte_quantize_v2`` for every tensor (the scale of the
#: tensor being cast is needed before the cast), where delayed scaling (scale from the amax
#: history, amax recorded by the cast kernel) and the block-scaled recipes (MXFP8, blockwise:
#: ``Float8BlockQuantizer::quantize``, ``MXFP8Quantizer``) launch one kernel. A grouped GEMM's
#: inputs are quantised expert by expert: ``multi_tensor_quantize_impl``
#: (``extensions/cast.cpp``, behind GroupedLinear's ``split_quantize``) has a fused
#: multi-tensor kernel only for delayed scaling ("Quantize kernels individually" otherwise).
#: So each quantised operand costs 3 - 1 = 2 more launches, counted once per operand quantised
#: in forward (each linear's input) and once per operand quantised in backward (each linear's
#: output gradient, cast and transposed together for dgrad and wgrad).
CURRENT_SCALING_EXTRA_KERNELS = 2.0


#: Host operations the MoE backend removes or adds per MoE layer forward, relative to the
#: :data:`KERNELS_PER_LAYER` counts (which describe Megatron-Core's unfused permutation, the
#: unfused router and Transformer Engine's ``GroupedLinear``; order-of-magnitude counts):
#:
#: * ``permute_fusion`` (``--moe-permute-fusion``): Megatron-Core ``moe/moe_utils.py``
#:   ``permute`` / ``unpermute`` without fusion build the token map (transpose, arange/expand,
#:   masked_select), gather the tokens and probabilities (index_select x 2) and scatter them back
#:   (zeros, mul, index_add/scatter_add): ~9 operations; Transformer Engine's fused
#:   ``moe_permute_with_probs`` / ``moe_unpermute`` issue 2: 7 fewer.
#: * ``fused_router`` (Primus ``moe_use_fused_router_with_aux_score``, turned on by sync-free
#:   stage >= 1: ``rocm_arg_validation.py`` ``_get_sync_free_moe_options``): the router's
#:   softmax / top-k / aux-loss score chain (~10 operations, :data:`GRAPH_SCOPE_OPS`
#:   ``moe_router``) as one fused kernel beside the gating GEMM: 6 fewer.
#: * ``fused_act_probs`` (Primus ``use_turbo_fused_act_with_probs``, stage 3): the activation
#:   and the probability scaling of the grouped MLP in one kernel: 1 fewer.
#: * per local expert: Transformer Engine ``GroupedLinear`` quantises and launches each
#:   expert's GEMM (4 per local expert, :data:`KERNELS_PER_LAYER`); ``SequentialMLP`` runs each
#:   expert as its own MLP module (fc1, activation, fc2 and the chunk's split/copy: 5); the
#:   ``grouped_gemm`` package (``legacy``, ``gg.ops.gmm``) and Primus-Turbo's CK grouped GEMM
#:   launch one kernel per grouped linear for all local experts (Primus
#:   ``examples/moe_package/README.md``, Feature 1: "all experts in a single kernel launch"):
#:   0 per expert and 2 in all (fc1, fc2).
BACKEND_OPS = {"permute_fusion": -7.0, "fused_router": -6.0, "fused_act_probs": -1.0,
               "grouped_kernel": 2.0}
#: Host operations per local expert and forward, by grouped-GEMM implementation
#: (:data:`config.codes.GROUPED_GEMM_CODE` order: sequential, legacy, te, turbo).
OPS_PER_LOCAL_EXPERT = (5.0, 0.0, 4.0, 0.0)


def backend_ops(grouped_gemm: Any, permute_fusion: Any, sync_free: Any
                ) -> tuple[np.ndarray, np.ndarray]:
    """``(fixed, per_expert)``: operations one MoE layer's forward issues beyond
    :data:`KERNELS_PER_LAYER` ``moe`` (negative: fused away) and per local expert in place of its
    4 (:data:`BACKEND_OPS`, :data:`OPS_PER_LOCAL_EXPERT`). Sync-free stage >= 1 turns on the
    fused router and permute fusion (Primus ``_get_sync_free_moe_options``), stage 3 the fused
    activation with probabilities. Worked example: Primus-Turbo grouped GEMM at stage 2: fixed
    2 - 7 - 6 = -11, 0 per expert (TE default: 0 and 4)."""
    gg = np.asarray(grouped_gemm, dtype=np.int64)
    stage = np.asarray(sync_free, dtype=np.int64)
    fusion = np.asarray(permute_fusion, dtype=bool) | (stage >= 1)
    kernel = (gg == 1) | (gg == 3)
    fixed = (BACKEND_OPS["permute_fusion"] * fusion + BACKEND_OPS["fused_router"] * (stage >= 1)
             + BACKEND_OPS["fused_act_probs"] * (stage >= 3)
             + BACKEND_OPS["grouped_kernel"] * kernel)
    per_expert = np.asarray(OPS_PER_LOCAL_EXPERT)[gg]
    return fixed.astype(np.float64), per_expert


def layer_host_time(moe: bool, local_experts: Any, kernel_overhead_s: Any,
                    cp_steps: Any = 0.0, graphs: dict[str, Any] | None = None,
                    backend_ops: Any = 0.0, ops_per_expert: Any = 4.0) -> np.ndarray:
    """Host time to issue one layer's forward and backward (backward: twice the forward's
    operations): ``3 x (attention + mlp [+ moe + moe_per_local_expert x local experts] +
    CP_OPS_PER_RING_STEP x cp_steps) x kernel_overhead_s`` with the counts of
    :data:`KERNELS_PER_LAYER` (``cp_steps``: the ``cp - 1`` ring steps of context
    parallelism). ``graphs``: 0/1 per :data:`GRAPH_BITS` part (``graph_attn`` ...; None: no
    CUDA graphs): a captured part (``attn``; ``mlp`` of a dense layer; ``moe_router``,
    ``moe_preprocess`` of a MoE layer) issues one graph launch instead of its
    :data:`GRAPH_SCOPE_OPS`; ``full_iteration`` issues nothing per layer. Worked example: a MoE
    layer with 16 local experts, 10 us: 3 x 116 x 10 us = 3.48 ms; with attn, moe_router and
    moe_preprocess captured 3 x (116 - 6 - 9 - 5) x 10 us = 2.88 ms."""
    ops = (KERNELS_PER_LAYER["attention"] + KERNELS_PER_LAYER["mlp"]
           + CP_OPS_PER_RING_STEP * np.asarray(cp_steps, dtype=np.float64))
    if moe:
        # the MoE backend's fused or added operations (backend_ops; the defaults: none, and
        # KERNELS_PER_LAYER's 4 per local expert)
        ops = ops + KERNELS_PER_LAYER["moe"] + np.asarray(backend_ops, dtype=np.float64) + \
            np.asarray(ops_per_expert, dtype=np.float64) * np.asarray(local_experts,
                                                                       dtype=np.float64)
    if graphs is not None:
        parts = ("attn", "moe_router", "moe_preprocess") if moe else ("attn", "mlp")
        for part in parts:
            ops = ops - np.asarray(graphs[f"graph_{part}"]) * (GRAPH_SCOPE_OPS[part] - 1.0)
        ops = ops * (1.0 - np.asarray(graphs["graph_full_iteration"]))
    return 3.0 * ops * np.asarray(kernel_overhead_s, dtype=np.float64)


def attention_host_time(kernel_overhead_s: Any, cp_steps: Any = 0.0,
                        graphs: dict[str, Any] | None = None) -> np.ndarray:
    """The attention part of :func:`layer_host_time` (its operations, the CP ring steps', one
    launch when ``attn`` is graph-captured): what a hybrid model's MLP-only and MoE-only layers
    do not issue, and what its attention-only layers do."""
    ops = KERNELS_PER_LAYER["attention"] + CP_OPS_PER_RING_STEP * np.asarray(cp_steps,
                                                                            dtype=np.float64)
    if graphs is not None:
        ops = ops - np.asarray(graphs["graph_attn"]) * (GRAPH_SCOPE_OPS["attn"] - 1.0)
        ops = ops * (1.0 - np.asarray(graphs["graph_full_iteration"]))
    return 3.0 * ops * np.asarray(kernel_overhead_s, dtype=np.float64)


def mamba_host_time(kernel_overhead_s: Any, graphs: dict[str, Any] | None = None
                    ) -> np.ndarray:
    """Host time to issue one Mamba layer's forward and backward:
    ``3 x KERNELS_PER_LAYER["mamba"] x kernel_overhead_s`` (nothing under a full-iteration
    CUDA graph; tune-cp has no per-layer ``mamba`` graph scope)."""
    ops = np.asarray(KERNELS_PER_LAYER["mamba"], dtype=np.float64)
    if graphs is not None:
        ops = ops * (1.0 - np.asarray(graphs["graph_full_iteration"]))
    return 3.0 * ops * np.asarray(kernel_overhead_s, dtype=np.float64)


def current_scaling_host_time(quantised_fwd: Any, current_scaling: Any,
                              kernel_overhead_s: Any) -> np.ndarray:
    """Extra host time of one layer part's forward and backward under FP8 per-tensor current
    scaling: ``2 x quantised_fwd x CURRENT_SCALING_EXTRA_KERNELS x kernel_overhead_s`` when
    ``current_scaling`` (0/1) is set: ``quantised_fwd`` operands are quantised in forward (the
    inputs of the part's low-precision linears, one per local expert for each grouped linear)
    and as many output gradients in backward (:data:`CURRENT_SCALING_EXTRA_KERNELS`). 0 for
    BF16, delayed scaling and the block-scaled recipes. Worked example: a MoE layer with 16
    local experts (QKV and output projection, expert fc1 and fc2: 2 + 2 x 16 = 34 quantised
    inputs) at 10 us: 2 x 34 x 2 x 10 us = 1.36 ms."""
    return (2.0 * np.asarray(quantised_fwd, dtype=np.float64) * CURRENT_SCALING_EXTRA_KERNELS
            * np.asarray(current_scaling, dtype=np.float64)
            * np.asarray(kernel_overhead_s, dtype=np.float64))


#: Schedule nodes per layer in Megatron-Core's combined 1F1B schedule
#: (``--overlap-moe-expert-parallel-comm``, Megatron-Bridge ``moe_a2a_overlap``):
#: ``TransformerLayerSchedulePlan._build_callable_nodes``
#: (``megatron/core/models/common/model_chunk_schedule_plan.py``) builds attn, post_attn,
#: moe_dispatch, mlp and moe_combine nodes for a MoE layer, and only attn and mlp for a dense
#: layer (the others are ``NoopScheduleNode``).
COMBINED_SCHEDULE_NODES = {"moe": 5.0, "dense": 2.0}
#: Host operations of one schedule node per direction (``megatron/core/pipeline_parallel/
#: utils.py``, ``ScheduleNode._forward`` / ``_backward``): the stream hand-over of
#: ``stream_acquire_context`` (an event wait and an event record), the stream switch, the
#: view-less aliases of its inputs and outputs (``make_viewless``) forward; in backward the same
#: event pair, a separate autograd-engine call (``Variable._execution_engine.run_backward``) for
#: the node and ``record_stream`` of its output gradients; order-of-magnitude count, 4 each way.
COMBINED_NODE_OPS = 4.0


def combined_schedule_host_time(moe: bool, a2a_overlap: Any, full_iteration: Any,
                                kernel_overhead_s: Any) -> np.ndarray:
    """Extra host time of one layer's forward and backward inside Megatron-Core's combined 1F1B
    schedule: ``2 x nodes x COMBINED_NODE_OPS x kernel_overhead_s`` when ``a2a_overlap`` (0/1)
    is set (:data:`COMBINED_SCHEDULE_NODES`: 5 nodes per MoE layer, 2 per dense layer); nothing
    under a full-iteration CUDA graph (``full_iteration``, 0/1: the nodes are captured).
    Worked example: a MoE layer at 10 us: 2 x 5 x 4 x 10 us = 0.4 ms; a dense layer 0.16 ms."""
    nodes = COMBINED_SCHEDULE_NODES["moe" if moe else "dense"]
    on = np.asarray(a2a_overlap, dtype=np.float64) * (
        1.0 - np.asarray(full_iteration, dtype=np.float64))
    return 2.0 * nodes * COMBINED_NODE_OPS * on * np.asarray(kernel_overhead_s, dtype=np.float64)


def host_exposed(host: Any, gpu: Any, p: Any) -> np.ndarray:
    """Host time a layer exposes beyond its GPU time: ``(host^p + gpu^p)^(1/p) - gpu``, the
    smooth maximum of the two with exponent ``p`` (``host_gpu_overlap_exponent``) minus the GPU
    time. Worked example (p = 2): host 3 ms, GPU 4 ms -> (9 + 16)^(1/2) - 4 = 1 ms."""
    h, g = np.asarray(host, dtype=np.float64), np.asarray(gpu, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    return (h**p + g**p) ** (1.0 / p) - g


def a2a_sync_exponent(p: Any, a2a_overlap: Any, moe_sync: Any) -> np.ndarray:
    """Smooth-maximum exponent of a MoE layer's host and GPU times (:func:`host_exposed`):
    ``host_gpu_overlap_exponent`` normally; 1 (host and GPU times add) when the layer
    synchronises the host (dropless routing, :func:`oracle.work.moe_host_sync`) inside
    Megatron-Core's combined 1F1B schedule (``--overlap-moe-expert-parallel-comm``,
    ``pipeline_parallel/combined_1f1b.py``): that schedule issues the attention, dispatch, MLP
    and combine parts of one micro-batch's forward and another's backward from one host
    sequence, and the dispatch's device-to-host copy of the token counts blocks it until both
    streams have drained, so nothing is queued ahead of the GPU when the host resumes.
    Worked example: p 2, overlap on, dropless -> 1; overlap off -> 2."""
    on = (np.asarray(a2a_overlap) > 0) & (np.asarray(moe_sync) > 0)
    return np.where(on, 1.0, np.asarray(p, dtype=np.float64))
