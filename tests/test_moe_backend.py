"""The MoE backend (issue 27): each lever moves the projection through its named term, the rules
name the framework's refusal, the search picks a backend per layout and names it."""

from __future__ import annotations

import numpy as np
import pytest

from tune_cp.oracle.catalog import load_gpu, load_model
from tune_cp.oracle.collectives import DEEPEP_OVERLAP_EFFICIENCY, flex_exposed
from tune_cp.oracle.host import backend_ops
from tune_cp.oracle.projection import project
from tune_cp.oracle.specs import (
    ClusterSpec,
    Dispatcher,
    FlexBackend,
    GroupedGemm,
    ParallelConfig,
    TrainingSpec,
    resolve_config,
)
from tune_cp.solver.rules import backend_problems

MIXTRAL = dict(pp=4, vpp=2, ep=8, recompute="full", recompute_layers=1)


def _setup(gpu: str):
    m = load_model("mixtral-8x22b")
    c = ClusterSpec(gpu=load_gpu(gpu), num_nodes=4, gpus_per_node=8)
    t = TrainingSpec(seq_len=8192, global_batch_size=512)
    return m, c, t


def _proj(gpu: str, **kw):
    m, c, t = _setup(gpu)
    cfg = resolve_config(ParallelConfig(**{**MIXTRAL, **kw}), m, c, t)
    return cfg, project(m, c, t, cfg)


def test_flex_exposed_hand_worked() -> None:
    # a2a 2 ms, window 10 ms, efficiency 0.65, base 0.2 -> 0.7 ms; window 1 ms -> 1 ms
    assert flex_exposed(2.0, 10.0, 0.65, 0.2) == pytest.approx(0.7)
    assert flex_exposed(2.0, 1.0, 0.65, 0.2) == pytest.approx(1.0)
    # a base overlap larger than the flex efficiency is kept
    assert flex_exposed(2.0, 10.0, 0.65, 0.74) == pytest.approx(2.0 * 0.26)
    assert DEEPEP_OVERLAP_EFFICIENCY == (0.65, 0.75, 0.80, 0.85)


def test_backend_ops_hand_worked() -> None:
    fixed, per = backend_ops(np.array([3, 2, 0]), np.array([False, False, True]),
                             np.array([2, 0, 0]))
    assert list(fixed) == [2 - 7 - 6, 0, -7]
    assert list(per) == [0.0, 4.0, 5.0]


def test_flex_moves_the_canonical_case_through_ep_comm() -> None:
    cfg_a, a = _proj("mi355x")
    cfg_f, f = _proj("mi355x", dispatcher=Dispatcher.FLEX)
    assert cfg_f.flex_backend is FlexBackend.TURBO and cfg_f.router_fp32
    assert f.breakdown["ep_comm"] < 0.6 * a.breakdown["ep_comm"]
    assert f.breakdown["elementwise"] > a.breakdown["elementwise"]  # the fp32 router's cast
    assert f.tokens_per_s_per_gpu > a.tokens_per_s_per_gpu


def test_sync_free_stage_3_removes_the_host_sync() -> None:
    base = dict(dispatcher=Dispatcher.FLEX, grouped_gemm=GroupedGemm.TURBO)
    _, s2 = _proj("mi355x", sync_free_stage=2, **base)
    _, s3 = _proj("mi355x", sync_free_stage=3, **base)
    assert s3.step_time_s < s2.step_time_s
    assert s3.breakdown["kernel_overhead"] <= s2.breakdown["kernel_overhead"]


def test_one_local_expert_gains_nothing_from_a_grouped_kernel() -> None:
    _, te = _proj("mi355x")
    _, turbo = _proj("mi355x", grouped_gemm=GroupedGemm.TURBO)
    assert turbo.breakdown["expert_gemm"] == pytest.approx(te.breakdown["expert_gemm"])


@pytest.mark.parametrize(("gpu", "kw", "needle"), [
    ("h100", {"grouped_gemm": GroupedGemm.TURBO}, "ROCm library"),
    ("mi355x", {"dispatcher": Dispatcher.FLEX, "flex_backend": FlexBackend.DEEPEP},
     "NVIDIA CUDA library"),
    ("mi355x", {"sync_free_stage": 2, "grouped_gemm": GroupedGemm.TURBO}, "turns on"),
    ("mi355x", {"dispatcher": Dispatcher.FLEX, "sync_free_stage": 2}, "--grouped-gemm turbo"),
    ("mi355x", {"dispatcher": Dispatcher.FLEX, "router_fp32": False}, "fp32 router"),
    ("h100", {"dispatcher": Dispatcher.ALLGATHER, "shared_expert_overlap": True},
     "alltoall or flex"),
])
def test_backend_refusals_name_the_value(gpu: str, kw: dict, needle: str) -> None:
    m, c, t = _setup(gpu)
    cfg = resolve_config(ParallelConfig(**{**MIXTRAL, **kw}), m, c, t)
    problems = backend_problems(m, c.gpu, cfg)
    assert any(needle in p for p in problems), problems


def test_defaults_are_legal_on_both_vendors() -> None:
    for gpu in ("mi355x", "h100"):
        m, c, t = _setup(gpu)
        for d in Dispatcher:
            cfg = resolve_config(ParallelConfig(**{**MIXTRAL, "dispatcher": d}), m, c, t)
            assert backend_problems(m, c.gpu, cfg) == []
