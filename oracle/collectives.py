"""Communication terms of the time model: the alpha-beta collective, where a group's traffic
runs, and the tensor-, context-, expert-, pipeline- and data-parallel exposure rules.

:func:`oracle.work.build_work` records the bytes, group sizes and links of every collective;
:func:`oracle.timing.timing` turns them into exposed time with the functions here.

* **Collectives** (ring): ``alpha (1 + log2 n) + (n - 1)/n x S / (link x link_eff)`` for an
  all-gather or reduce-scatter of a tensor of S bytes (all-reduce = two; :func:`collective_time`);
  all-to-all: ``alpha (1 + log2 n) + max(intra bytes / scale-up, inter bytes / NIC)``. Rank order
  tp-cp-ep-dp-pp (Megatron): a group of size n and stride st stays on the scale-up links when
  ``st x n <= scale-up domain`` (:func:`group_intra`), else its traffic crosses the NIC, with as
  many NICs per domain as the group has members there (:func:`group_local`).
* **TP/SP**: per layer forward, all-gather + reduce-scatter of ``T h`` bf16 around attention and
  around the MLP (one all-reduce each without SP); backward adds the re-gather of the input for
  the weight gradient; under an FP8 recipe with SP the input is quantised before it is gathered
  (the forward all-gather and backward re-gather move half the bytes,
  :data:`TP_FP8_ALLGATHER_FRACTION`); exposed ``max(0, comm - tp_comm_overlap x GEMM time)``
  where the run overlaps TP communication (:class:`oracle.work.RunTraits`), all of it otherwise.
* **CP** (ring p2p): ``cp - 1`` exchanges of the local K and V per layer (backward: K, V, dK,
  dV), each overlapping one ``1/cp`` block of attention: exposed ``(cp - 1) max(0, step -
  attention / cp)`` (:func:`cp_ring_exposed`, :func:`cp_attention_block`,
  :func:`cp_correction_bytes`).
* **EP**: dispatch and combine all-to-all of ``T_sp k h`` bf16 (forward and backward), plus the
  ETP all-gather / reduce-scatter; ``allgather`` dispatcher gathers ``T_sp h`` over tp x ep;
  ``flex`` (DeepEP, HybridEP) sends a token once per destination node: ``(N - 1)(1 - (1 - 1/N)^k)``
  node copies instead of ``k (N - 1)/N``; exposed ``(1 - ep_comm_overlap) x time``; the flex
  dispatcher with Primus-Turbo's DeepEP hides :data:`DEEPEP_OVERLAP_EFFICIENCY` of its all-to-all behind the layer's own
  computation, at most that computation (:func:`flex_exposed`); shared-expert overlap hides up to
  the shared experts' GEMM time more.
* **PP p2p**: one ``T_sp h`` bf16 activation per chunk boundary each way (``t_send`` each).
  In the interleaved schedule Megatron overlaps each transfer with the next chunk's compute
  (``overlap_p2p_comm``): per virtual stage and direction only ``max(0, t_send -
  pp_comm_overlap x chunk time)`` is exposed (chunk time: the stage's forward or backward
  divided by vpp); the 1F1B schedule sends and receives on the critical path (fully exposed;
  :func:`pipeline_p2p`).
* **DP**: distributed optimizer: reduce-scatter of the gradients in their buffer's dtype (fp32,
  4 B/param; bf16, 2 B/param with ``grad_reduce_in_fp32=False``) and all-gather of bf16
  parameters (2 B/param) over dp x cp (dense) and expert-dp (experts), exposed beyond
  ``dp_comm_overlap`` x one micro-batch's backward (forward for the gather); without it an
  all-reduce; FSDP (ZeRO-3): all-gather in forward and backward plus the reduce-scatter *every
  micro-batch*, overlapped the same way (:func:`dp_exposed`, :func:`ddp_bucket_params`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tune_cp.config.specs import ClusterSpec

#: Bytes of an FP8 all-gather relative to the bf16 one (1 byte per element instead of 2).
TP_FP8_ALLGATHER_FRACTION = 0.5


#: Megatron-Core DDP bucket size when ``--ddp-bucket-size`` is unset: ``max(40M, 1M x dp_cp
#: size)`` parameters (megatron/core/distributed/distributed_data_parallel_config.py,
#: ``bucket_size`` docstring; megatron/training ``resolve_ddp_bucket_size``). Model chunks after
#: the first are one bucket each (``disable_bucketing=(model_chunk_idx > 0)`` in get_model).
DDP_BUCKET_MIN_PARAMS = 40_000_000
DDP_BUCKET_PARAMS_PER_DP_RANK = 1_000_000


#: Bytes per output element of the per-step output correction of ring attention: read the fp32
#: running output (4), write it (4), read the step's bf16 partial output (2) (TE
#: ``flash_attn_fwd_out_correction``); forward, backward moves twice (element-wise convention).
CP_CORRECTION_BYTES_PER_ELEMENT = 10.0


#: Fraction of the flex dispatcher's dispatch/combine all-to-all hidden behind the same layer's
#: computation, by Primus-Turbo sync-free MoE stage (0-3): Primus's projection,
#: ``primus/core/projection/performance_projection/projection.py``
#: ``_get_deepep_overlap_efficiency`` (l.1512-1527 at fd1eeabbad: DeepEP alone ~65%, sync-free
#: stages 75/80/85%), bounded by the compute there is to hide it behind
#: (``module_profilers/transformer_layer.py`` ``_deepep_exposed_a2a_ms``, l.212-231):
#: :func:`flex_exposed`. Used for Primus-Turbo's DeepEP only: Megatron-Core's own DeepEP and
#: HybridEP dispatch on the compute stream and consume the result at once
#: (``moe/token_dispatcher.py`` ``_DeepepManager.dispatch``, ``async_finish=False``), so they
#: hide only what the schedule hides.
DEEPEP_OVERLAP_EFFICIENCY = (0.65, 0.75, 0.80, 0.85)


def flex_exposed(a2a: Any, window: Any, efficiency: Any, base_hidden: Any) -> np.ndarray:
    """Exposed time of one direction's dispatch + combine ``a2a`` under the flex dispatcher:
    ``a2a - max(base_hidden x a2a, min(efficiency x a2a, window))`` (``window``: the layer's
    computation in that direction; ``base_hidden``: what the run's schedule hides anyway,
    ``ep_comm_overlap`` / ``ep_a2a_overlap``). Worked example: a2a 2 ms, window 10 ms,
    efficiency 0.65, base 0.2 -> 2 - 1.3 = 0.7 ms; window 1 ms -> 2 - 1 = 1 ms."""
    a = np.asarray(a2a, dtype=np.float64)
    hidden = np.maximum(np.asarray(base_hidden) * a,
                        np.minimum(np.asarray(efficiency) * a, np.asarray(window)))
    return np.maximum(0.0, a - hidden)


def group_intra(cluster: ClusterSpec, span: np.ndarray) -> np.ndarray:
    """1 where a group spanning ``span`` consecutive ranks stays on the scale-up links, else 0."""
    return (span <= cluster.scale_up_gpus).astype(np.float64)


def group_local(cluster: ClusterSpec, stride: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Members of a group (``size`` ranks, ``stride`` apart) inside one scale-up domain: a ring
    collective that leaves the domain drives that many NICs per domain in parallel (NCCL builds
    one ring per NIC), so its bus bandwidth is ``min(scale-up, local x NIC)``."""
    per = np.maximum(1, cluster.scale_up_gpus // np.maximum(1, stride))
    return np.minimum(size, per).astype(np.float64)


def collective_time(bytes_: Any, n: Any, bw: Any, alpha: Any) -> np.ndarray:
    """Ring all-gather / reduce-scatter of a tensor of ``bytes_`` over ``n`` ranks."""
    n = np.asarray(n, dtype=np.float64)
    t = alpha * (1 + np.log2(np.maximum(n, 1))) + (n - 1) / np.maximum(n, 1) * bytes_ / bw
    return np.where(n > 1, t, 0.0)


def pipeline_p2p(
    t_send: Any, sends: Any, vpp: Any, fwd: Any, bwd: Any, overlap: Any
) -> np.ndarray:
    """Exposed pipeline send/receive time of one micro-batch on one stage.

    ``t_send``: one activation transfer; ``sends``: transfers per micro-batch and stage (2 vpp,
    0 without pipeline parallelism); ``fwd``/``bwd``: the stage's forward / backward time of the
    micro-batch. Interleaved schedule (vpp > 1): each of the vpp transfers per direction hides
    behind ``overlap`` x one chunk's compute (``fwd / vpp`` or ``bwd / vpp``); 1F1B: every
    transfer is on the critical path."""
    t, v = np.asarray(t_send, dtype=np.float64), np.asarray(vpp, dtype=np.float64)
    inter = v * (np.maximum(0.0, t - overlap * fwd / v) + np.maximum(0.0, t - overlap * bwd / v))
    return np.where(np.asarray(sends) > 0, np.where(v > 1, inter, np.asarray(sends) * t), 0.0)


def ddp_bucket_params(dp_cp: Any) -> np.ndarray:
    """Parameters per gradient bucket of Megatron-Core's DDP at the default bucket size:
    ``max(DDP_BUCKET_MIN_PARAMS, DDP_BUCKET_PARAMS_PER_DP_RANK x dp_cp)``. Worked example: dp_cp
    64 -> 64e6 parameters, dp_cp 8 -> 40e6."""
    return np.maximum(DDP_BUCKET_MIN_PARAMS,
                      DDP_BUCKET_PARAMS_PER_DP_RANK * np.asarray(dp_cp, dtype=np.float64))


def cp_attention_block(seq_len: int, cp: Any) -> np.ndarray:
    """Key length one flash-attention call of a context-parallel ring step sees: each rank holds
    two chunks of ``s / (2 cp)`` tokens (the load-balancing split of Megatron-Core / TE: chunk
    i and 2 cp - 1 - i), and every step after the diagonal one runs the two halves of the step's
    block separately, each over ``s / (2 cp)`` keys or queries. ``inf`` without CP (the whole
    context). Worked example: s 8192, cp 4 -> 1024."""
    c = np.asarray(cp, dtype=np.float64)
    return np.where(c > 1, seq_len / (2.0 * c), np.inf)


def cp_correction_bytes(tokens: Any, v_width: Any, cp: Any) -> np.ndarray:
    """Forward bytes of ring attention's per-step output correction on one rank: ``(cp - 1) x
    tokens x v_width x CP_CORRECTION_BYTES_PER_ELEMENT`` (``v_width``: local heads x value head
    dim). Worked example: 2048 tokens, 8 x 128 values, cp 4: 3 x 2048 x 1024 x 10 = 62.9 MB."""
    c = np.asarray(cp, dtype=np.float64)
    return (c - 1) * np.asarray(tokens) * np.asarray(v_width) * CP_CORRECTION_BYTES_PER_ELEMENT


def cp_ring_exposed(steps: Any, step_time: Any, attention: Any, alpha: Any) -> np.ndarray:
    """Exposed ring exchange of one layer and direction: ``steps x [alpha + max(0, t_step -
    attention / (steps + 1))]``: each of the ``cp - 1`` transfers hides behind one block of the
    attention (``t_step`` includes its latency), and the receiving step then synchronises
    with it (one more ``alpha``: the stream waits on the recv before the next block's kernel),
    which no overlap hides. Worked example: 3 steps of 1 ms, attention 2 ms, alpha 10 us:
    3 x (0.01 + 0.5) = 1.53 ms."""
    n = np.asarray(steps, dtype=np.float64)
    return np.where(n > 0, n * (alpha + np.maximum(0.0, step_time - attention / (n + 1))), 0.0)


def dp_exposed(total: Any, last_bucket: Any, window: Any, overlap: Any) -> np.ndarray:
    """Exposed time of an overlapped data-parallel collective: ``max(last_bucket, total -
    overlap x window)``. The collective is issued bucket by bucket while the backward (reduce-
    scatter) or forward (parameter all-gather) runs, but the bucket that fills last (the first
    layers' gradients, after the last backward) and the first bucket of the next step's forward
    (its parameters are needed before any layer runs) cannot overlap anything. Worked example:
    total 1 s, last bucket 0.1 s, window 2 s, overlap 0.8: max(0.1, -0.6) = 0.1 s."""
    return np.maximum(np.asarray(last_bucket), np.asarray(total) - np.asarray(overlap) * window)
