"""The MoE backend per layout, chosen after the enumeration.

The backend fields (``config/axes.py::BACKEND_FIELDS``: flex library, sync-free stage,
grouped-GEMM implementation, permute fusion, shared-expert overlap, fp32 router) change no
memory term but the flex dispatcher's buffers, so they are not CP-SAT axes: every feasible
layout is projected with each backend preset its vendor offers (:func:`presets`) that the
rules accept (``solver/rules.py::backend_problems``, the ``dispatcher`` family's ep > 1, the
run settings' refusals) and whose memory still fits (a preset that turns on the flex dispatcher
adds ``dispatcher_buffer_bytes`` to every stage: ``oracle/memory.py::combine``, an unfragmented
runtime term), and keeps the fastest. Sync-free stage 3 is not searched: its worst-case
permutation buffers (Primus ``primus_turbo.py`` ``permute_max_token_num``; "consumes
significantly more GPU memory", ``examples/moe_package/README.md`` Table 2) are counted only as
a lower bound (``oracle/memory.py::sync_free_buffer_bytes``: one layer's), so only
``tune-cp check`` takes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np

from tune_cp.config.resolve import Columns, set_fields
from tune_cp.config.specs import (
    ClusterSpec,
    Dispatcher,
    FlexBackend,
    GroupedGemm,
    ModelSpec,
    ParallelConfig,
    TrainingSpec,
    Vendor,
)
from tune_cp.oracle.inventory import act_shape
from tune_cp.oracle.memory import sync_free_buffer_bytes
from tune_cp.solver.rules import backend_problems, hbm_limit_bytes


@cache
def presets(model: ModelSpec, cluster: ClusterSpec) -> tuple[dict[str, Any], ...]:
    """The backend presets the search tries on every layout of an MoE model (the first, {}:
    the layout as enumerated). Each is consistent on its own (what Primus's sync-free stages
    turn on together, ``rocm_arg_validation.py::_get_sync_free_moe_options``)."""
    if not model.is_moe:
        return ({},)
    fused = {"permute_fusion": True}
    if cluster.gpu.vendor is Vendor.AMD:
        turbo_gg = {"grouped_gemm": GroupedGemm.TURBO}
        flex = {"dispatcher": Dispatcher.FLEX, "flex_backend": FlexBackend.TURBO,
                "router_fp32": True}
        out: list[dict[str, Any]] = [
            {}, fused, {**turbo_gg, "sync_free_stage": 1},
            {**flex, **turbo_gg, "sync_free_stage": 1},
            {**flex, **turbo_gg, "sync_free_stage": 2},
        ]
    else:
        out = [{}, fused, {**fused, "dispatcher": Dispatcher.FLEX,
                           "flex_backend": FlexBackend.DEEPEP}]
    if model.num_shared_experts:  # Primus-Turbo DeepEP refuses it (rules.backend_problems)
        out.append({**fused, "shared_expert_overlap": True})
        if cluster.gpu.vendor is not Vendor.AMD:
            out.append({**fused, "shared_expert_overlap": True, "dispatcher": Dispatcher.FLEX,
                        "flex_backend": FlexBackend.DEEPEP})
    return tuple(out)


def expand_rows(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                configs: Sequence[ParallelConfig], peak: np.ndarray, settings: Any
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (layout, preset) pair the rules and the memory accept, as ``(index of the layout,
    index of the preset in :func:`presets`, peak bytes)`` per pair, layouts in order, presets
    in order within a layout. ``settings``: the run's ``RunSettings``. A preset's bytes beyond
    the enumerated layout's are runtime terms of every stage with MoE layers
    (``dispatcher_buffers`` in ``oracle/memory.py::combine``: the flex dispatcher's buffer, the
    sync-free worst-case buffers), so the stage peak grows by exactly them."""
    opts = settings.options
    limit = hbm_limit_bytes(cluster.gpu.hbm_bytes, settings.memory_margin)
    buffer = settings.overheads.dispatcher_buffer_bytes
    # a --constraint on the dispatcher is the user's: the presets keep the enumerated one
    constrained = any("dispatcher" in c.expr for c in settings.constraints)
    owner: list[int] = []
    which: list[int] = []
    peaks: list[int] = []
    # the rules read no layout field (backend_problems): once per (preset, enumerated backend)
    legal: dict[tuple[int, tuple], bool] = {}
    # the sync-free buffers grown by a preset, per (preset, the fields
    # oracle/memory.py::sync_free_buffer_bytes reads: dispatcher, stage, tp, ep, and the
    # tokens per rank t_sp, which no preset changes)
    grown: dict[tuple[Any, ...], int] = {}
    for i, cfg in enumerate(configs):
        t_sp = None
        for p, upd in enumerate(presets(model, cluster)):
            if not upd:
                owner.append(i)
                which.append(p)
                peaks.append(int(peak[i]))
                continue
            add = 0
            if upd.get("dispatcher") is Dispatcher.FLEX and cfg.dispatcher is not Dispatcher.FLEX:
                if (cfg.ep < 2 or constrained or opts.moe_capacity_factor is not None):
                    continue
                add = buffer
            if t_sp is None:
                t_sp = act_shape(model, training, cfg).t_sp
            gkey = (p, cfg.dispatcher, cfg.sync_free_stage, cfg.tp, cfg.ep, t_sp)
            new = None
            if gkey not in grown:
                new = cfg.model_copy(update=upd)
                grown[gkey] = (sync_free_buffer_bytes(model, t_sp, new)
                               - sync_free_buffer_bytes(model, t_sp, cfg))
            add += grown[gkey]
            if int(peak[i]) + add > limit:
                continue
            key = (p, (cfg.dispatcher, cfg.flex_backend, cfg.sync_free_stage, cfg.grouped_gemm,
                       cfg.shared_expert_overlap, cfg.router_fp32))
            if key not in legal:
                if new is None:
                    new = cfg.model_copy(update=upd)
                legal[key] = not backend_problems(model, cluster.gpu, new, opts.moe_a2a_overlap)
            if not legal[key]:
                continue
            owner.append(i)
            which.append(p)
            peaks.append(int(peak[i]) + add)
    return (np.array(owner, dtype=np.int64), np.array(which, dtype=np.int64),
            np.array(peaks, dtype=np.int64))


def preset_config(model: ModelSpec, cluster: ClusterSpec, cfg: ParallelConfig,
                  preset: int) -> ParallelConfig:
    """The layout ``cfg`` with preset number ``preset`` of :func:`presets` (``cfg`` itself for
    the first, the layout as enumerated)."""
    upd = presets(model, cluster)[preset]
    return cfg.model_copy(update=upd) if upd else cfg


def expanded_columns(model: ModelSpec, cluster: ClusterSpec, cols: Columns, owner: np.ndarray,
                     which: np.ndarray) -> Columns:
    """The resolved columns of the (layout, preset) pairs of :func:`expand_rows`: row ``j`` is
    layout ``owner[j]`` of ``cols`` with preset ``which[j]`` (:func:`preset_config`, as
    columns)."""
    out = cols.take(owner)
    for p, upd in enumerate(presets(model, cluster)):
        if upd:
            set_fields(out, which == p, upd)
    return out


def expand(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
           configs: Sequence[ParallelConfig], peak: np.ndarray, settings: Any
           ) -> tuple[list[ParallelConfig], np.ndarray, np.ndarray]:
    """:func:`expand_rows` as ``(configs, peak bytes, index of the layout)``: each pair's
    configuration (:func:`preset_config`)."""
    owner, which, peaks = expand_rows(model, cluster, training, configs, peak, settings)
    wide = [preset_config(model, cluster, configs[i], p)
            for i, p in zip(owner.tolist(), which.tolist(), strict=True)]
    return wide, peaks, owner


def best_per_layout(tokens: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    """For each of ``n`` layouts the index (into the expanded list) of its fastest preset; ties
    keep the earliest preset (the layout as enumerated first)."""
    best = np.full(n, -1, dtype=np.int64)
    for j in range(len(owner)):
        i = int(owner[j])
        if best[i] < 0 or tokens[j] > tokens[best[i]]:
            best[i] = j
    return best
