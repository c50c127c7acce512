"""Pipeline schedule terms of the time model: the step time of the pipelined forward/backward
passes over the stages, the bubble, and the host time exposed at pipeline chunk boundaries.

* **Pipeline**: with ``t_s`` the per-micro-batch time of stage s (forward + backward +
  recompute + exposed comm) and m micro-batches, ``m max_s t_s + bubble_factor x (sum_s t_s -
  max_s t_s) / vpp`` (:func:`pipeline_time`): for equal stages this is Narayanan et al.'s
  ``(m + (p - 1)/vpp) t`` (interleaved bubble ``(p - 1)/(vpp m)``); the slowest stage sets the
  pace; zero-bubble (ZB-H1, Qi et al. 2023) keeps a third of the 1F1B bubble
  (:data:`ZERO_BUBBLE_FACTOR`). The bubble is what the schedule adds to ``m`` times the slowest
  stage (:func:`pipeline_bubble`).
* **Chunk boundaries**: a dropless MoE stage exposes the schedule's host work at every chunk
  boundary (:func:`chunk_boundary_host`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tune_cp.oracle.host import host_exposed

#: Zero-bubble (ZB-H1) keeps ~1/3 of the 1F1B bubble (Qi et al. 2023, "Zero Bubble Pipeline
#: Parallelism"); DualPipe is represented by the same factor.
ZERO_BUBBLE_FACTOR = 1.0 / 3.0


def chunk_boundary_host(
    vpp: Any, chunk_host_s: Any, host_layer: Any, gpu_layer: Any, p: Any, dropless: Any,
    serial: Any = 1.0,
) -> np.ndarray:
    """Host time a dropless MoE pipeline stage exposes at its chunk boundaries, per micro-batch.

    A pipeline stage runs ``vpp`` model chunks per micro-batch in each direction (1 for 1F1B).
    At every chunk boundary the schedule's host work (model-chunk switch, posting the isend /
    irecv of the exchange, deallocating the sent output, the DDP hooks: ``chunk_host_s`` per
    boundary and direction, ``pipeline_chunk_host_s``) runs while the GPU has nothing queued:
    a dropless MoE layer synchronises host and device every layer (token counts), so the host
    has no run-ahead to hide it. The first layer of each chunk then starts with an empty queue:
    for the fraction ``serial`` (``chunk_start_serial_fraction``) of it host and GPU times add
    instead of taking the smooth maximum of :func:`host_exposed`: ``vpp x [2 chunk_host_s +
    serial x (host + gpu - (host^p + gpu^p)^(1/p))]``. Dense or token-drop layers let the host
    run ahead, so none of it is exposed (0). Worked example, vpp 24, 0.2 ms, host 8 ms, GPU
    16 ms, p 2, serial 1: 24 x (0.4 + 24 - 17.89) = 156.3 ms."""
    v = np.asarray(vpp, dtype=np.float64)
    lost = np.asarray(serial) * (
        np.asarray(host_layer) - host_exposed(host_layer, gpu_layer, p))  # host + gpu - smax
    return np.asarray(dropless) * v * (2.0 * np.asarray(chunk_host_s) + lost)


def pipeline_time(
    stage_times: np.ndarray, m: Any, vpp: Any = 1, bubble_factor: Any = 1.0
) -> np.ndarray:
    """Time of the pipelined forward/backward passes of one step.

    ``stage_times[..., s]``: one micro-batch's forward + backward on stage s (0 for padding);
    ``m`` micro-batches; ``vpp`` virtual stages per rank. ``m x max_s t_s + bubble_factor x
    (sum_s t_s - max_s t_s) / vpp``: with p equal stages of time t this is ``(m + (p - 1)/vpp)
    t``, i.e. the bubble fraction ``(p - 1)/(vpp m)`` of Narayanan et al. 2021 (interleaved) and
    ``(p - 1)/m`` for 1F1B; with unequal stages the slowest sets the steady-state pace and each
    other stage adds its own fill/drain time. ``bubble_factor``: 1 for 1F1B/interleaved,
    :data:`ZERO_BUBBLE_FACTOR` for zero-bubble schedules.
    """
    t = np.asarray(stage_times, dtype=np.float64)
    t_max = t.max(axis=-1)
    return np.asarray(m) * t_max + np.asarray(bubble_factor) * (t.sum(axis=-1) - t_max) / vpp


def pipeline_bubble(
    stage_times: np.ndarray, m: Any, vpp: Any = 1, bubble_factor: Any = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """The critical (slowest) stage of every configuration and the pipeline bubble: what
    :func:`pipeline_time` adds to ``m`` times the slowest stage's micro-batch time.
    ``stage_times``: (n, stages). Returns ``(critical_stage, bubble_s)``, each (n,)."""
    crit = np.argmax(stage_times, axis=1)
    rows = np.arange(stage_times.shape[0])
    bubble = pipeline_time(stage_times, m, vpp, bubble_factor) - m * stage_times[rows, crit]
    return crit, bubble
