"""Run settings of the time model (issue 12): CUDA-graph scope, the MoE all-to-all overlap, the
published rows' recipe settings by release, and the shared software-stack factor of the fit."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tune_cp.calibration.calibrate import SHARED_STACK_KEY, make_layout, table_for_theta
from tune_cp.config.resolve import resolve_config
from tune_cp.config.specs import (
    ClusterSpec,
    ConfigError,
    ParallelConfig,
    Precision,
    TrainingSpec,
)
from tune_cp.formats.runs import read_runs, recipe_run_settings, stated_settings
from tune_cp.oracle.catalog import load_gpu, load_model
from tune_cp.oracle.host import a2a_sync_exponent, layer_host_time
from tune_cp.oracle.projection import project
from tune_cp.oracle.work import ConfigBatch, RunTraits

RUNS = Path(__file__).resolve().parents[1] / "benchmarks" / "published_runs.csv"


def _graphs(**on: float) -> dict[str, float]:
    parts = ("attn", "mlp", "moe_router", "moe_preprocess", "full_iteration")
    return {f"graph_{p}": on.get(p, 0.0) for p in parts}


def test_layer_host_time_with_cuda_graphs_hand_worked() -> None:
    # MoE layer, 16 local experts, 10 us per operation: 3 x (7 + 5 + 40 + 64) x 10 us = 3.48 ms;
    # attn (7 -> 1), moe_router (10 -> 1), moe_preprocess (6 -> 1) captured: 3 x 96 x 10 us
    assert layer_host_time(True, 16, 10e-6, graphs=_graphs()) == pytest.approx(3.48e-3)
    g = _graphs(attn=1, moe_router=1, moe_preprocess=1)
    assert layer_host_time(True, 16, 10e-6, graphs=g) == pytest.approx(2.88e-3)
    # a dense layer with attn and mlp captured: 3 x (1 + 1) x 10 us = 60 us (360 us without)
    assert layer_host_time(False, 0, 10e-6, graphs=_graphs(attn=1, mlp=1)) == pytest.approx(60e-6)
    # the mlp scope does not touch a MoE layer; a full-iteration graph issues nothing per layer
    assert layer_host_time(True, 16, 10e-6, graphs=_graphs(mlp=1)) == pytest.approx(3.48e-3)
    assert layer_host_time(True, 16, 10e-6, graphs=_graphs(full_iteration=1)) == 0.0


def test_a2a_overlap_with_dropless_routing_serialises_host_and_gpu() -> None:
    assert a2a_sync_exponent(2.0, 1, 1) == 1.0
    assert a2a_sync_exponent(2.0, 0, 1) == 2.0  # no overlap schedule: the fitted exponent
    assert a2a_sync_exponent(2.0, 1, 0) == 2.0  # token-drop: no synchronisation to block on


def test_unknown_cuda_graph_scope_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match="cuda_graph_scope"):
        RunTraits(cuda_graph_scope=("attention",))


def _qwen_gb200() -> tuple:
    m = load_model("qwen3-30b-a3b")
    c = ClusterSpec(gpu=load_gpu("gb200"), num_nodes=2, gpus_per_node=4)
    t = TrainingSpec(seq_len=4096, global_batch_size=512, precision=Precision.FP8)
    cfg = resolve_config(ParallelConfig(tp=1, pp=1, ep=8, mbs=4), m, c, t)
    return m, c, t, cfg


def test_full_iteration_graph_removes_host_overhead_and_overlap_hides_all_to_all() -> None:
    m, c, t, cfg = _qwen_gb200()
    plain = project(m, c, t, cfg, traits=RunTraits())
    full = project(m, c, t, cfg, traits=RunTraits(cuda_graph_scope=("full_iteration",)))
    both = project(m, c, t, cfg, traits=RunTraits(cuda_graph_scope=("full_iteration",),
                                                  moe_a2a_overlap=True))
    assert plain.breakdown["kernel_overhead"] > 0.5  # fine-grained dropless MoE: host-bound
    assert full.breakdown["kernel_overhead"] == 0.0
    assert both.breakdown["ep_comm"] < full.breakdown["ep_comm"]
    assert both.step_time_s < full.step_time_s < plain.step_time_s
    # the settings travel through the vectorised batch the same way
    batch = ConfigBatch.from_configs([cfg, cfg], [RunTraits(), both_traits := RunTraits(
        cuda_graph_scope=("full_iteration",), moe_a2a_overlap=True)])
    assert batch.traits(1) == both_traits
    from tune_cp.oracle.projection import score_configs

    res = score_configs(m, c, t, batch)
    assert res["step_time_s"][1] == pytest.approx(both.step_time_s, rel=1e-12)
    assert res["step_time_s"][0] == pytest.approx(plain.step_time_s, rel=1e-12)


def test_dropless_a2a_overlap_costs_host_time() -> None:
    m, c, t, cfg = _qwen_gb200()
    off = project(m, c, t, cfg, traits=RunTraits())
    on = project(m, c, t, cfg, traits=RunTraits(moe_a2a_overlap=True))
    drop_on = project(m, c, t, cfg, traits=RunTraits(moe_a2a_overlap=True, moe_dropless=False))
    assert on.breakdown["kernel_overhead"] > off.breakdown["kernel_overhead"]
    # token-drop with the all-to-all dispatcher has no synchronisation to block on
    assert drop_on.breakdown["kernel_overhead"] < 0.1 * on.breakdown["kernel_overhead"]


def test_stated_settings_are_read_from_other_settings() -> None:
    assert stated_settings({"other_settings": "--cuda-graph-impl full_iteration"}) == {
        "cuda_graph_scope": ("full_iteration",)}
    assert stated_settings({"other_settings": "--cuda-graph-impl transformer_engine "
                                              "--cuda-graph-scope attn moe_router"}) == {
        "cuda_graph_scope": ("attn", "moe_router")}
    assert stated_settings({"other_settings": "cuda_graph_scope=['attn', 'moe_preprocess']"}) == {
        "cuda_graph_scope": ("attn", "moe_preprocess")}
    assert stated_settings({"notes": "--overlap-moe-expert-parallel-comm --delay-wgrad-compute"}) \
        == {"moe_a2a_overlap": True}
    assert stated_settings({"other_settings": "FSDP + torch.compile"}) == {}


def test_recipe_run_settings_follow_the_release() -> None:
    row = {"framework": "Megatron-Bridge / Megatron-Core", "release_or_date": "NeMo container 26.06"}
    assert recipe_run_settings(row, "qwen3-30b-a3b", "gb200", "mxfp8") == {
        "cuda_graph_scope": ("full_iteration",), "moe_a2a_overlap": True}
    assert recipe_run_settings(row, "qwen3-30b-a3b", "gb200", "tensorwise") == {}
    old = {**row, "release_or_date": "NeMo container 26.04.01"}
    assert recipe_run_settings(old, "qwen3-30b-a3b", "gb200", "mxfp8") == {}
    h100 = {**row, "release_or_date": "NeMo container 25.11"}
    assert recipe_run_settings(h100, "qwen3-30b-a3b", "h100", "tensorwise") == {
        "dispatcher": "alltoall", "moe_a2a_overlap": True}
    assert recipe_run_settings({**h100, "framework": "Megatron-LM"}, "qwen3-30b-a3b", "h100",
                           "tensorwise") == {}


def test_published_rows_carry_their_recipe_run_settings() -> None:
    rows = {r.row_id: r for r in read_runs(RUNS)}
    # 26.06+ MXFP8 Qwen3 / DeepSeek-V3 on GB200/GB300: full-iteration graphs with the overlap
    for rid in ("2", "7", "8", "9", "20", "23", "24", "25", "42", "47", "48", "51"):
        assert rows[rid].traits.cuda_graph_scope == ("full_iteration",), rid
        assert rows[rid].traits.moe_a2a_overlap, rid
    for rid in ("93", "139", "92", "97", "84"):  # the same layouts in 26.04: neither
        assert rows[rid].traits == RunTraits(), rid
    # Qwen3-30B-A3B on H100 in 25.09 / 25.11: the all-to-all dispatcher (no HybridEP there)
    assert rows["259"].cfg.dispatcher.value == "alltoall" and rows["259"].traits.moe_a2a_overlap
    assert rows["287"].cfg.dispatcher.value == "alltoall"
    assert not rows["287"].traits.moe_dropless and not rows["287"].traits.moe_a2a_overlap


def test_stacks_share_one_non_reference_factor() -> None:
    layout = make_layout(["hopper"], ["megatron", "torchtitan"])
    assert ("gemm_factor", SHARED_STACK_KEY) in layout.entries
    theta = layout.prior_theta()
    theta[layout.entries.index(("gemm_factor", SHARED_STACK_KEY))] = math.log(0.8)
    theta[layout.entries.index(("gemm_factor", "sw:torchtitan"))] = math.log(1.1)
    table = table_for_theta(layout, theta)
    # torchtitan: 0.8 x 1.1; llm-foundry has no rows: the shared 0.8 (not Megatron/TE's 1)
    assert table.software["torchtitan"]["gemm_factor"] == pytest.approx(0.88)
    assert table.software["llm-foundry"]["gemm_factor"] == pytest.approx(0.8)
    assert table.software["llm-foundry"]["attention_factor"] == pytest.approx(1.0)
    assert np.isclose(layout.sigma()[layout.entries.index(("gemm_factor", "sw:torchtitan"))],
                      0.15)
