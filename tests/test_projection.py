"""Time projection: definitions, hand-worked pipeline numbers, a batch = one configuration at a
time, physical properties, and the AMD MI355X Mixtral 8x22B published run (the independent
scalar check of the work: tests/test_work_scalar.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tune_cp.config.resolve import resolve_config
from tune_cp.config.specs import (
    ClusterSpec,
    ConfigError,
    ParallelConfig,
    Precision,
    Recompute,
    TrainingSpec,
)
from tune_cp.oracle.catalog import load_gpu, load_model
from tune_cp.oracle.constants import load_calibration
from tune_cp.oracle.projection import project, score_configs
from tune_cp.oracle.schedule import ZERO_BUBBLE_FACTOR, pipeline_time
from tune_cp.oracle.timing import BREAKDOWN, constants_arrays, timing
from tune_cp.oracle.work import CAST_BYTES_PER_ELEMENT, ConfigBatch, RunTraits, S, build_work


def setup(model: str, gpu: str, nodes: int, seq: int, gbs: int, precision: str = "bf16",
          gpn: int = 8):
    m = load_model(model)
    c = ClusterSpec(gpu=load_gpu(gpu), num_nodes=nodes, gpus_per_node=gpn)
    t = TrainingSpec(seq_len=seq, global_batch_size=gbs, precision=Precision(precision))
    return m, c, t


def run(m, c, t, **kw):
    return project(m, c, t, resolve_config(ParallelConfig(**kw), m, c, t))


# ------------------------------------------------------------------ definitions


def test_throughput_mfu_and_breakdown_definitions_hand_worked() -> None:
    m, c, t = setup("llama3-70b", "h100", 8, 8192, 128, "fp8")
    p = run(m, c, t, tp=4, pp=4, vpp=5, mbs=1)
    # a step trains 128 x 8192 = 1,048,576 tokens on 64 GPUs: 16,384 per GPU
    assert p.tokens_per_s_per_gpu * p.step_time_s == pytest.approx(16_384, rel=1e-12)
    # model FLOPs per token (Megatron convention, vocabulary padded to 128,512 at tp 4):
    # 6 x [80 x (8192 x 80 x 128 + 8192 x 8192 + 3 x 8192 x 28672) + 8192 x 128,512]
    # = 6 x 69,503,811,584 = 417,022,869,504, plus causal attention 3 x 80 x 2 x 64 x 256 x
    # 4096 = 32,212,254,720: 449,235,124,224
    assert p.model_flops_per_token == 449_235_124_224
    assert p.model_tflops_per_gpu == pytest.approx(16_384 * 449_235_124_224 / p.step_time_s
                                                   / 1e12, rel=1e-12)
    # MFU: model FLOPs (recompute excluded) over the H100's dense FP8 peak, 1979 TFLOP/s
    assert p.mfu == pytest.approx(p.model_tflops_per_gpu / 1979, rel=1e-12)
    assert 0 < p.mfu < 1
    assert set(p.breakdown) == set(BREAKDOWN)
    assert all(v >= 0 for v in p.breakdown.values())


def test_optimizer_step_hand_worked() -> None:
    # Llama 3 8B, tp 8 on one H100 node (dp 1, pp 1): the rank holds 32 layers of attention
    # 4096 + 4096 x (4 + 2) x 128 + 512 x 4096 = 5,246,976 and MLP 4096 + 4096 x 3584 +
    # 1792 x 4096 = 22,024,192, embedding and output 129,024 / 8 x 4096 = 66,060,288 each
    # (vocabulary padded to a multiple of 1024) and the final norm: 1,004,802,048 parameters;
    # Adam reads and writes 34 bytes per parameter at HBM speed (3.35 TB/s x hbm_efficiency)
    m, c, t = setup("llama3-8b", "h100", 1, 8192, 64)
    p = run(m, c, t, tp=8, mbs=1)
    hbm_eff = load_calibration().constants("hopper")["hbm_efficiency"]
    assert 32 * (5_246_976 + 22_024_192) + 2 * 66_060_288 + 4096 == 1_004_802_048
    assert p.breakdown["optimizer"] == pytest.approx(34 * 1_004_802_048 / (3.35e12 * hbm_eff),
                                                     rel=1e-12)
    assert p.breakdown["pipeline_bubble"] == 0.0  # one stage: nothing to fill or drain


def test_recompute_is_time_not_model_flops() -> None:
    m, c, t = setup("llama3-8b", "h100", 1, 8192, 64)
    a = run(m, c, t, tp=1, mbs=1)
    b = run(m, c, t, tp=1, mbs=1, recompute=Recompute.FULL)
    assert b.model_flops_per_token == a.model_flops_per_token
    assert b.step_time_s > a.step_time_s
    assert b.breakdown["recompute"] > 0 == a.breakdown["recompute"]


# ------------------------------------------------------------ pipeline by hand


def test_pipeline_bubble_hand_worked() -> None:
    # four equal stages of 1 s per micro-batch, 8 micro-batches
    t = np.array([1.0, 1.0, 1.0, 1.0])
    # 1F1B: (m + p - 1) t = 11 s, bubble (p - 1)/m = 3/8 of the 8 s of work
    assert pipeline_time(t, 8) == pytest.approx(11.0)
    # interleaved, 2 virtual stages: (m + (p - 1)/v) t = 9.5 s, bubble (p - 1)/(v m) = 3/16
    assert pipeline_time(t, 8, vpp=2) == pytest.approx(9.5)
    # zero-bubble ZB-H1 keeps a third of the 1F1B bubble: 8 + 1 = 9 s
    assert pipeline_time(t, 8, bubble_factor=ZERO_BUBBLE_FACTOR) == pytest.approx(9.0)
    # uneven stages: the slowest (2 s) sets the pace, the others add their fill/drain
    assert pipeline_time(np.array([1.0, 2.0, 1.0, 1.0]), 8) == pytest.approx(8 * 2 + 3)


def test_bubble_in_projection_follows_the_formula() -> None:
    m, c, t = setup("llama3-70b", "h100", 8, 8192, 128)
    for vpp in (1, 2, 5):
        p = run(m, c, t, tp=8, pp=4, vpp=vpp, mbs=1)  # dp 2 -> 64 micro-batches
        busy = p.step_time_s - p.breakdown["pipeline_bubble"] - p.breakdown["dp_comm"] \
            - p.breakdown["optimizer"]
        # stages are nearly equal (20 layers each, plus embedding / logits at the ends)
        frac = p.breakdown["pipeline_bubble"] / busy
        assert frac == pytest.approx((4 - 1) / (vpp * 64), rel=0.15)


# ------------------------------------------------ a batch = one configuration at a time
# (consistency of the batched arrays with project(); the independent scalar check of the work
# itself is tests/test_work_scalar.py)


@pytest.mark.parametrize(
    "case",
    [("mixtral-8x22b", "mi355x", 4, 8192, 512, "bf16"), ("llama3-70b", "h100", 4, 8192, 128, "fp8"),
     ("deepseek-v3", "gb200", 32, 4096, 1024, "fp8"), ("gpt-oss-120b", "b200", 2, 4096, 256,
                                                         "bf16")],
)
def test_batch_scores_equal_one_at_a_time(case) -> None:
    m, c, t = setup(*case)
    eps = (1, 8) if m.is_moe else (1,)
    grid = list(itertools.product((1, 2, 8), (1, 2, 4), (1, 2), (1, 2), eps, (1, 2), (0, 1, 2)))
    rng = np.random.default_rng(0)
    pick = [grid[i] for i in rng.choice(len(grid), size=24, replace=False)]
    tp, pp, vpp, cp, ep, mbs, rc = (np.array(x) for x in zip(*pick, strict=True))
    vpp = np.where(pp > 1, vpp, 1)
    batch = ConfigBatch.resolved(m, c, t, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, mbs=mbs,
                                 recompute=rc)
    res = score_configs(m, c, t, batch)
    for i in range(len(batch)):
        p = project(m, c, t, batch.config(i))
        assert p.step_time_s == pytest.approx(res["step_time_s"][i], rel=1e-9, abs=0)
        assert p.mfu == pytest.approx(res["mfu"][i], rel=1e-9)
        for k in BREAKDOWN:
            assert p.breakdown[k] == pytest.approx(res[k][i], rel=1e-9, abs=1e-15)


def test_batch_scores_equal_one_at_a_time_on_every_knob() -> None:
    m, c, t = setup("deepseek-v3", "h100", 16, 4096, 1024, "fp8")
    rng = np.random.default_rng(1)
    n = 40
    batch = ConfigBatch.resolved(
        m, c, t,
        tp=rng.choice([1, 2, 4], n), pp=rng.choice([2, 4, 8], n), vpp=rng.choice([1, 2], n),
        cp=rng.choice([1, 2], n), ep=rng.choice([8, 16, 32], n), mbs=rng.choice([1, 2], n),
        recompute=rng.choice([0, 1, 2], n), recompute_method=rng.choice([0, 1], n),
        recompute_layers=rng.choice([-1, 1, 2], n), recompute_modules=rng.choice([1, 66, 12], n),
        distributed_optimizer=rng.choice([True, False], n), fsdp=rng.choice([True, False], n),
        dispatcher=rng.choice([0, 1, 2], n), schedule=rng.choice([0, 1, 2], n),
        fp8=rng.choice([0, 1, 2], n), etp=rng.choice([1, 2], n),
    )
    res = score_configs(m, c, t, batch)
    for i in range(n):
        p = project(m, c, t, batch.config(i))
        assert p.step_time_s == pytest.approx(res["step_time_s"][i], rel=1e-9, abs=0)


def test_batch_scores_equal_one_at_a_time_with_run_traits() -> None:
    # the traits travel per configuration through the batch exactly as through project()
    for model, gpu, prec in (("llama3-8b", "h100", "fp8"), ("qwen3-30b-a3b", "b200", "fp8"),
                             ("llama3-70b", "gb300", "bf16")):
        m, c, t = setup(model, gpu, 2, 8192, 256, prec)
        rng = np.random.default_rng(2)
        n = 24
        batch = ConfigBatch.resolved(
            m, c, t, tp=rng.choice([1, 2, 4, 8], n), pp=rng.choice([1, 2], n),
            ep=rng.choice([1, 8], n) if m.is_moe else 1, mbs=rng.choice([1, 2], n),
            recompute=rng.choice([0, 1], n), fp8=rng.choice([1, 2], n) if prec == "fp8" else -1,
            traits=[RunTraits(tp_comm_overlap=bool(o), fp8_rowwise=bool(r)) for o, r in
                    zip(rng.choice([True, False], n), rng.choice([True, False], n), strict=True)],
        )
        res = score_configs(m, c, t, batch)
        for i in range(n):
            p = project(m, c, t, batch.config(i), traits=batch.traits(i))
            assert p.step_time_s == pytest.approx(res["step_time_s"][i], rel=1e-12, abs=0)
            for k in BREAKDOWN:
                assert p.breakdown[k] == pytest.approx(res[k][i], rel=1e-12, abs=1e-15)


def test_from_configs_matches_the_resolved_columns() -> None:
    m, c, t = setup("mixtral-8x22b", "mi355x", 8, 8192, 512)
    cfg = resolve_config(ParallelConfig(tp=1, pp=4, vpp=2, ep=8, mbs=2), m, c, t)
    a = ConfigBatch.from_configs([cfg])
    b = ConfigBatch.resolved(m, c, t, tp=1, pp=4, vpp=2, ep=8, mbs=2)
    for k, v in vars(a).items():
        assert np.array_equal(v, getattr(b, k)), k


# --------------------------------------------------------------- run traits, hand-worked


def test_fp8_all_gathers_move_half_the_bytes_under_sequence_parallelism() -> None:
    # per layer block, in units of one bf16 all-gather / reduce-scatter of T h: forward AG + RS,
    # backward RS + AG + the input re-gather; FP8 gathers (forward AG, backward re-gather) move
    # 1 byte per element instead of 2: forward 0.5 + 1 = 1.5, backward 2 + 0.5 = 2.5
    units = {}
    for prec, fp8, rowwise in (("bf16", -1, False), ("fp8", 1, False), ("fp8", 3, False),
                               ("fp8", 2, True)):
        m, c, t = setup("llama3-70b", "gb200", 4, 8192, 128, prec, gpn=4)
        b = ConfigBatch.resolved(m, c, t, tp=4, pp=2, fp8=fp8,
                                 traits=RunTraits(fp8_rowwise=rowwise))
        w = build_work(m, c, t, b)
        units[(prec, fp8, rowwise)] = (w.tp.fwd_per_block[0], w.tp.bwd_per_block[0])
    assert units[("bf16", -1, False)] == (2.0, 3.0)
    assert units[("fp8", 1, False)] == (1.5, 2.5)  # current scaling (amax reduced over TP)
    assert units[("fp8", 3, False)] == (1.5, 2.5)  # MXFP8
    assert units[("fp8", 2, True)] == (2.0, 3.0)  # torchao row-wise gathers bf16
    # without sequence parallelism: one all-reduce (2 units) each way, whatever the precision
    m, c, t = setup("llama3-70b", "h100", 2, 8192, 128, "fp8")
    w = build_work(m, c, t, ConfigBatch.resolved(m, c, t, tp=4, pp=2, sp=False))
    assert (w.tp.fwd_per_block[0], w.tp.bwd_per_block[0]) == (2.0, 2.0)


def test_tp_comm_without_overlap_is_every_collective_hand_worked() -> None:
    # Llama 3 8B, TP8 on one H100 node, bf16, mbs 1, seq 8192, gbs 8 (one micro-batch): with
    # the overlap off every TP collective is exposed. One all-gather / reduce-scatter of
    # S = T h bf16 = 8192 x 4096 x 2 B over 8 ranks: alpha (1 + log2 8) + 7/8 S / (NVLink x eff);
    # per layer 2 + 3 (attention) + 2 + 3 (MLP) = 10 of them; 32 layers
    m, c, t = setup("llama3-8b", "h100", 1, 8192, 1)
    cfg = resolve_config(ParallelConfig(tp=8, mbs=1), m, c, t)
    k = load_calibration().constants("hopper")
    S_bytes = 8192 * 4096 * 2.0
    bw = c.gpu.scale_up_bytes_per_s * k["scale_up_efficiency"]
    t_one = k["collective_latency_s"] * (1 + 3) + 7 / 8 * S_bytes / bw
    off = project(m, c, t, cfg, traits=RunTraits(tp_comm_overlap=False))
    on = project(m, c, t, cfg)
    assert off.breakdown["tp_comm"] == pytest.approx(32 * 10 * t_one, rel=1e-9)
    assert on.breakdown["tp_comm"] < off.breakdown["tp_comm"]
    assert on.step_time_s < off.step_time_s


def test_flex_dispatcher_sends_one_copy_per_node_hand_worked() -> None:
    # DeepSeek-V3 (h 7168, top-8 of 256) at EP64 on H100 nodes of 8: a rank dispatches T k h
    # bf16 token copies; all-to-all sends the 56/64 of them bound for the other 7 nodes over the
    # NIC; flex (DeepEP / HybridEP, as the Megatron-Bridge recipes run it) sends each token once
    # per destination node: (N - 1)(1 - (1 - 1/N)^k) = 7 (1 - (7/8)^8) = 4.5947 copies
    m, c, t = setup("deepseek-v3", "h100", 16, 4096, 1024, "fp8")
    T, h = 4096.0, 7168.0
    w = {d: build_work(m, c, t, ConfigBatch.resolved(m, c, t, ep=64, pp=2, dispatcher=d))
         for d in (0, 2)}
    assert w[0].ep.inter_bytes[0] == pytest.approx(T * 8 * h * 2 * 56 / 64)
    assert w[2].ep.inter_bytes[0] == pytest.approx(T * h * 2 * 7 * (1 - (7 / 8) ** 8))
    assert 7 * (1 - (7 / 8) ** 8) == pytest.approx(4.5947, abs=1e-4)
    assert w[2].ep.intra_bytes[0] == w[0].ep.intra_bytes[0]


def test_rowwise_fp8_casts_hand_worked() -> None:
    # Llama 3 8B MLP fc1 at tp 1, mbs 1, seq 8192, 8 micro-batches: M = 8192, K = 4096,
    # N = 2 x 14336. Forward cast bytes = (M K + K N / ga) x bytes per element: 6 for
    # per-tensor current scaling, 10 for torchao row-wise (each operand quantised twice)
    m, c, t = setup("llama3-8b", "h100", 1, 8192, 64, "fp8")
    for rowwise, per in ((False, 6.0), (True, 10.0)):
        b = ConfigBatch.resolved(m, c, t, mbs=1, fp8=1,
                                 traits=RunTraits(fp8_rowwise=rowwise))
        w = build_work(m, c, t, b)
        M, K, N = 8192, 4096, 2 * 14336
        assert w.gemm.cast_fwd_bytes[0, S["mlp_fc1"]] == pytest.approx((M * K + K * N / 8) * per)
        assert w.gemm.cast_bwd_bytes[0, S["mlp_fc1"]] == pytest.approx(M * N * per)
        assert w.device.block_scaled[0] == (1.0 if rowwise else 0.0)
    assert CAST_BYTES_PER_ELEMENT["rowwise"] == 10.0
    # row-wise FP8 on TP8 (torchtitan rows 384/385) is slower than per-tensor FP8
    cfg = resolve_config(ParallelConfig(tp=8, mbs=12), *setup("llama3-8b", "h100", 8, 8192,
                                                             192, "fp8"))
    m, c, t = setup("llama3-8b", "h100", 8, 8192, 192, "fp8")
    row = project(m, c, t, cfg, traits=RunTraits(fp8_rowwise=True))
    tensor = project(m, c, t, cfg)
    assert row.step_time_s > 1.1 * tensor.step_time_s


# --------------------------------------------------------------- physical properties


def test_more_data_parallel_gpus_never_slow_a_step() -> None:
    # same global batch, same layout: doubling dp halves the micro-batches per rank
    for nodes in (1, 2, 4):
        m, c1, t = setup("llama3-8b", "h100", nodes, 8192, 256)
        _, c2, _ = setup("llama3-8b", "h100", 2 * nodes, 8192, 256)
        a = run(m, c1, t, tp=2, mbs=1)
        b = run(m, c2, t, tp=2, mbs=1)
        assert b.step_time_s <= a.step_time_s


def test_fp8_never_slower_when_gemm_bound() -> None:
    for model, gpu in (("llama3-70b", "h100"), ("llama3.1-405b", "b200"),
                       ("llama3-70b", "mi300x")):
        m, c, t8 = setup(model, gpu, 8, 8192, 512, "fp8")
        t16 = t8.model_copy(update={"precision": Precision.BF16})
        kw = dict(tp=8, pp=4, mbs=2) if "405" in model else dict(tp=4, pp=2, mbs=2)
        assert run(m, c, t8, **kw).step_time_s < run(m, c, t16, **kw).step_time_s


def test_gemm_efficiency_falls_for_skinny_gemms_hand_worked() -> None:
    # same total work, tp 8 makes every MLP GEMM 8x skinnier. A GEMM of M x N x K takes
    # 2 M N K / (peak x eff x g(M) g(N) g(K)), g(x) = x / (x + gemm_half_dim): with tp 1 (dp 8,
    # 8 micro-batches) fc1 is 8192 x 28672 x 4096 and fc2 8192 x 4096 x 14336; with tp 8 (dp 1,
    # 64 micro-batches) 8192 x 3584 x 4096 and 8192 x 4096 x 1792. Peak and efficiency cancel:
    # tp x (time per micro-batch at tp 8) / (time at tp 1) = the ratio of the shape factors
    m, c, t = setup("llama3-8b", "h100", 1, 8192, 64)
    a = run(m, c, t, tp=1, mbs=1)
    b = run(m, c, t, tp=8, mbs=1)
    half = load_calibration().constants("hopper")["gemm_half_dim"]

    def work(M: int, N: int, K: int) -> float:
        return M * N * K * (M + half) * (N + half) * (K + half) / (M * N * K)

    want = 8 * (work(8192, 3584, 4096) + work(8192, 4096, 1792)) / (
        work(8192, 28672, 4096) + work(8192, 4096, 14336))
    got = 8 * (b.breakdown["mlp_gemm"] / 64) / (a.breakdown["mlp_gemm"] / 8)
    assert got == pytest.approx(want, rel=1e-9)
    assert got > 1.0  # skinnier GEMMs run less efficiently


def test_recompute_and_communication_only_add_time() -> None:
    m, c, t = setup("mixtral-8x22b", "mi355x", 4, 8192, 512)
    base = run(m, c, t, tp=1, pp=4, vpp=2, ep=8, mbs=1)
    full = run(m, c, t, tp=1, pp=4, vpp=2, ep=8, mbs=1, recompute=Recompute.FULL,
               recompute_layers=1)
    assert full.step_time_s > base.step_time_s
    assert base.breakdown["ep_comm"] > 0


def test_softmax_exponentials_bound_attention() -> None:
    # flash attention is never faster than the special-function units compute one exponential
    # per score: with a 100x slower SFU the attention time grows, the GEMMs do not change
    m, c, t = setup("llama3-8b", "gb200", 2, 8192, 128, "fp8", gpn=4)
    slow = c.model_copy(update={"gpu": c.gpu.model_copy(
        update={"sfu_exp_per_s": c.gpu.sfu_exp_per_s / 100})})
    a, b = run(m, c, t, mbs=2), run(m, slow, t, mbs=2)
    assert b.breakdown["core_attention"] > 2 * a.breakdown["core_attention"]
    assert b.breakdown["mlp_gemm"] == a.breakdown["mlp_gemm"]


def test_fp4_needs_fp4_tensor_cores() -> None:

    m, c, t = setup("llama3-70b", "h100", 8, 8192, 128, "fp4")
    with pytest.raises(ConfigError, match="FP4"):
        run(m, c, t, tp=4, pp=2)


# ------------------------------------------------------------ published measurement


def test_amd_mi355x_mixtral_8x22b_within_10_percent() -> None:
    """AMD performance results: 8 nodes of MI355X, Mixtral 8x22B BF16, TP1 PP4 VPP2 EP8, mbs 2,
    seq 8192: 3,534 tokens/s/GPU (published_runs.csv row 438; global batch 512 as in the
    4-node Primus reference, no recompute: the YAML's full/block with 0 layers)."""
    m, c, t = setup("mixtral-8x22b", "mi355x", 8, 8192, 512)
    p = run(m, c, t, tp=1, pp=4, vpp=2, ep=8, mbs=2)
    assert p.tokens_per_s_per_gpu == pytest.approx(3534, rel=0.10)


def test_shipped_calibration_names_its_rows() -> None:
    table = load_calibration()
    assert table.fitted_on and len(table.fitted_on["rows"]) > 100
    assert "438" in table.fitted_on["rows"]
    for arch in ("ampere", "hopper", "blackwell", "cdna3", "cdna4"):
        consts = table.constants(arch)
        assert 0 < consts["gemm_efficiency_bf16"] < 1


# ------------------------------------------------- host, pipeline p2p, power, step overhead


def test_layer_host_time_hand_worked() -> None:
    from tune_cp.oracle.host import layer_host_time

    # dense layer: 3 x (7 attention + 5 MLP) operations x 10 us = 360 us
    assert layer_host_time(False, 0, 10e-6) == pytest.approx(360e-6)
    # MoE layer with 16 local experts: 3 x (7 + 5 + 40 + 4 x 16) = 348 operations -> 3.48 ms
    assert layer_host_time(True, 16, 10e-6) == pytest.approx(3.48e-3)


def test_current_scaling_host_launches_hand_worked() -> None:
    from tune_cp.oracle.host import CURRENT_SCALING_EXTRA_KERNELS, current_scaling_host_time

    # Transformer Engine's current scaling: amax + scale + cast per quantised operand, 2 more
    # launches than one cast; a MoE layer with 16 local experts quantises 2 + 2 x 16 = 34
    # inputs forward and 34 output gradients backward: 2 x 34 x 2 x 10 us = 1.36 ms
    assert CURRENT_SCALING_EXTRA_KERNELS == 2.0
    assert current_scaling_host_time(34, 1.0, 10e-6) == pytest.approx(1.36e-3)
    assert current_scaling_host_time(34, 0.0, 10e-6) == 0.0
    # Qwen3-30B-A3B on 16 H100s, EP8 (16 local experts): only tensorwise FP8 sets the flag,
    # and it costs host time: the dropless layers' exposed host time grows
    m, c, t = setup("qwen3-30b-a3b", "h100", 2, 4096, 512, "fp8")
    flags, host = [], []
    consts = constants_arrays(load_calibration(None), "hopper", 1)
    for code, rowwise in ((1, False), (2, False), (1, True)):
        w = build_work(m, c, t, ConfigBatch.resolved(m, c, t, ep=8, mbs=1, fp8=code,
                                                       traits=RunTraits(fp8_rowwise=rowwise)))
        flags.append(float(w.schedule.current_scaling[0]))
        host.append(float(timing(w, consts)["kernel_overhead"][0]))
    assert flags == [1.0, 0.0, 0.0]
    assert host[0] > host[1]


def test_combined_schedule_node_host_time_hand_worked() -> None:
    from tune_cp.oracle.host import (
        COMBINED_NODE_OPS,
        COMBINED_SCHEDULE_NODES,
        combined_schedule_host_time,
    )

    # Megatron-Core's combined 1F1B schedule: 5 schedule nodes per MoE layer (attn, post_attn,
    # moe_dispatch, mlp, moe_combine), 2 per dense layer, 4 host operations per node and
    # direction: 2 x 5 x 4 x 10 us = 0.4 ms, 2 x 2 x 4 x 10 us = 0.16 ms
    assert (COMBINED_SCHEDULE_NODES, COMBINED_NODE_OPS) == ({"moe": 5.0, "dense": 2.0}, 4.0)
    assert combined_schedule_host_time(True, 1.0, 0.0, 10e-6) == pytest.approx(0.4e-3)
    assert combined_schedule_host_time(False, 1.0, 0.0, 10e-6) == pytest.approx(0.16e-3)
    # no overlap schedule, or the whole step captured in one CUDA graph: nothing
    assert combined_schedule_host_time(True, 0.0, 0.0, 10e-6) == 0.0
    assert combined_schedule_host_time(True, 1.0, 1.0, 10e-6) == 0.0


def test_host_exposed_is_a_smooth_maximum() -> None:
    from tune_cp.oracle.host import host_exposed

    # p = 2: (3^2 + 4^2)^(1/2) - 4 = 5 - 4 = 1
    assert host_exposed(3.0, 4.0, 2.0) == pytest.approx(1.0, rel=1e-12)
    # p = 4: (3^4 + 4^4)^(1/4) - 4 = 337^(1/4) - 4 = 0.284572
    assert host_exposed(3.0, 4.0, 4.0) == pytest.approx(0.284572, abs=1e-6)
    # the neutral prior p = 1.71: equal host and GPU times expose half of either
    assert host_exposed(1.0, 1.0, 1.71) == pytest.approx(0.5, abs=2e-3)
    # p = 1 is no overlap at all: the sum
    assert host_exposed(3.0, 4.0, 1.0) == pytest.approx(3.0)
    # a host far behind the GPU is hidden; one far ahead is almost fully exposed
    assert host_exposed(1e-3, 1.0, 2.0) < 1e-6
    assert host_exposed(10.0, 1.0, 2.0) == pytest.approx(9.05, abs=1e-3)


def test_pipeline_p2p_hand_worked() -> None:
    from tune_cp.oracle.collectives import pipeline_p2p

    # interleaved, vpp 4: chunk forward 8/4 = 2 s hides 0.5 x 2 = 1 s of a 2 s transfer (1 s
    # exposed), chunk backward 16/4 = 4 s hides all of it: 4 x (1 + 0) = 4 s per micro-batch
    assert pipeline_p2p(2.0, 8, 4, 8.0, 16.0, 0.5) == pytest.approx(4.0)
    # 1F1B: both transfers on the critical path, 2 x 2 s
    assert pipeline_p2p(2.0, 2, 1, 8.0, 16.0, 0.5) == pytest.approx(4.0)
    # no pipeline parallelism: nothing
    assert pipeline_p2p(2.0, 0, 1, 8.0, 16.0, 0.5) == 0.0


def test_sustained_rate_hand_worked() -> None:
    from tune_cp.oracle.catalog import gpu_power_ratios, power_reference
    from tune_cp.oracle.compute import sustained_rate

    gb300, b200 = load_gpu("gb300"), load_gpu("b200")
    assert power_reference(gb300) == b200 and power_reference(load_gpu("mi355x")).name == "mi355x"
    assert gpu_power_ratios(b200) == (1.0, 1.0, 1.0)  # the Blackwell reference part
    pk, units, tdp = gpu_power_ratios(gb300)
    assert (pk, units, tdp) == pytest.approx((2.25 / 2.5, 160 / 148, 1400 / 1000))
    # gamma 0.5: 0.9 x sqrt(160/148) x sqrt(1.4) = 0.9 x 1.039750 x 1.183216 = 1.107224
    assert sustained_rate(pk, units, tdp, 0.5) == pytest.approx(1.107224, abs=1e-6)
    # a GPU file without power data is not scaled
    bare = gb300.model_copy(update={"tdp_w": None, "name": "custom"})
    assert gpu_power_ratios(bare) == (1.0, 1.0, 1.0)


def test_gb300_sustains_its_power_advantage_on_gemms() -> None:
    # identical configuration and catalog peaks (2.5 / 5 PFLOP/s): GB300's 1400 W and 160 SMs
    # sustain (1400/1200)^g (160/148)^(1-g) of GB200's 1200 W, 148 SMs on compute-bound GEMMs
    gamma = load_calibration().constants("blackwell")["power_clock_exponent"]
    runs = {}
    for gpu in ("gb200", "gb300"):
        m, c, t = setup("llama3-70b", gpu, 16, 8192, 256, "fp8", gpn=4)
        runs[gpu] = run(m, c, t, tp=2, pp=4, vpp=5, mbs=2)
    ratio = runs["gb200"].breakdown["mlp_gemm"] / runs["gb300"].breakdown["mlp_gemm"]
    assert ratio == pytest.approx((1400 / 1200) ** gamma * (160 / 148) ** (1 - gamma), rel=1e-9)
    assert runs["gb300"].tokens_per_s_per_gpu > runs["gb200"].tokens_per_s_per_gpu


def test_small_micro_batch_fine_grained_moe_is_host_bound() -> None:
    # Qwen3-30B-A3B on 8 B200 (128 experts, 16 per rank at EP8): at mbs 1 a layer's GPU work
    # is shorter than issuing its ~100+ operations; published: ~9.5k vs ~27k tokens/s/GPU
    # (published_runs.csv rows 222/253 vs 95/141/185)
    m, c, t = setup("qwen3-30b-a3b", "b200", 1, 4096, 512, "fp8")
    small, big = run(m, c, t, ep=8, mbs=1), run(m, c, t, ep=8, mbs=4)
    assert small.tokens_per_s_per_gpu < 0.5 * big.tokens_per_s_per_gpu
    small_share = small.breakdown["kernel_overhead"] / small.step_time_s
    big_share = big.breakdown["kernel_overhead"] / big.step_time_s
    assert small_share > 0.4
    assert big_share < 0.6 * small_share


def test_interleaved_pipeline_hides_p2p_that_1f1b_exposes() -> None:
    m, c, t = setup("llama3-70b", "h100", 8, 8192, 128)
    inter = run(m, c, t, tp=8, pp=4, vpp=5, mbs=1)
    one = run(m, c, t, tp=8, pp=4, vpp=1, mbs=1)
    # the interleaved transfers hide behind the chunks' compute; what stays is one
    # synchronisation latency per chunk and direction: 2 x vpp 5 x 64 micro-batches x alpha
    alpha = load_calibration().constants("hopper")["collective_latency_s"]
    assert inter.breakdown["pp_p2p"] == pytest.approx(2 * 5 * 64 * alpha, rel=1e-9)
    assert inter.breakdown["pp_p2p"] < one.breakdown["pp_p2p"]


def test_step_overhead_is_paid_once_per_step() -> None:
    m, c, t = setup("llama3-8b", "h100", 1, 8192, 64)
    p = run(m, c, t, tp=1, mbs=1)
    assert p.breakdown["step_overhead"] == pytest.approx(
        load_calibration().constants("hopper")["step_overhead_s"])


def test_bf16_gradients_halve_the_dp_gradient_bytes_hand_worked() -> None:
    # Llama 3 8B on one H100 node at dp 8 with a replicated optimizer and no DP overlap: the
    # step's gradient all-reduce is two ring passes (reduce-scatter + all-gather) of the
    # gradient buffer, 2 [alpha (1 + log2 8) + 7/8 B / bw] over the dense group plus the same
    # latency for the (empty) expert group; B = 4 P (fp32) or 2 P (bf16). So with L = 16 alpha:
    # dp32 - L = 2 (dp16 - L), and the time saved is 2 x 7/8 x 2 P / bw.
    m, c, t = setup("llama3-8b", "h100", 1, 8192, 64)
    k = load_calibration().constants("hopper")
    out = {}
    for fp32 in (True, False):
        b = ConfigBatch.resolved(m, c, t, distributed_optimizer=False,
                                 grad_fp32=fp32)
        w = build_work(m, c, t, b)
        assert w.dp.grad_bytes[0] == (4.0 if fp32 else 2.0)
        const = constants_arrays(load_calibration(), "hopper", 1)
        const["dp_comm_overlap"] = np.zeros(1)
        out[fp32] = timing(w, const)["dp_comm"][0]
    latency = 2 * 2 * k["collective_latency_s"] * (1 + 3)
    assert out[True] - latency == pytest.approx(2 * (out[False] - latency), rel=1e-12)
    assert out[False] < out[True]
    # the default projection of a configuration is unchanged (fp32 unless asked)
    cfg = resolve_config(ParallelConfig(tp=2, pp=2), m, c, t)
    assert cfg.grad_reduce_in_fp32 is True
    assert project(m, c, t, cfg) == project(m, c, t, cfg.model_copy(
        update={"grad_reduce_in_fp32": True}))
    bf16 = project(m, c, t, cfg.model_copy(update={"grad_reduce_in_fp32": False}))
    assert bf16.step_time_s <= project(m, c, t, cfg).step_time_s


def test_time_side_counts_the_mtp_layer_parameters_like_the_memory_side() -> None:
    # issue 10: DeepSeek-V3 tp2 pp16 ep64 (etp = tp = 2), last stage: its 4 layers, the MTP
    # layer (an MoE layer plus its projection and norms) and the output layer hold
    # 1,153,970,944 parameters per rank (264,241,152 of them expert weights); the time side once
    # left out the MTP layer (1,102,569,216). Both sides now use oracle.memory.stage_params.
    from tune_cp.oracle.memory import param_units, stage_counts, stage_params

    m, c, t = setup("deepseek-v3", "h100", 128, 4096, 1024, "fp8")
    w = build_work(m, c, t, ConfigBatch.resolved(m, c, t, tp=2, pp=16, ep=64))
    dense, expert = w.stages.params_dense[0, -1], w.stages.params_expert[0, -1]
    assert int(dense + expert) == 1_153_970_944
    assert int(expert) == 264_241_152
    cfg = resolve_config(ParallelConfig(tp=2, pp=16, ep=64), m, c, t)
    last = stage_counts(m, cfg)[-1]
    mem = stage_params(last, param_units(m, 2, 16, 64, 2), True)
    assert (int(mem[0]), int(mem[1])) == (int(dense), int(expert))


def test_interleaving_cp_and_dp_terms_hand_worked() -> None:
    from tune_cp.oracle.collectives import (
        cp_attention_block,
        cp_correction_bytes,
        cp_ring_exposed,
        ddp_bucket_params,
        dp_exposed,
    )
    from tune_cp.oracle.schedule import chunk_boundary_host

    # Megatron-Core's default bucket: max(40M, 1M x dp_cp) parameters
    assert list(ddp_bucket_params([8, 64])) == [40e6, 64e6]
    # ring attention: s / (2 cp) keys per call, (cp - 1) output corrections of 10 B/element
    assert float(cp_attention_block(8192, 4)) == 1024.0
    assert float(cp_attention_block(8192, 1)) == float("inf")
    assert float(cp_correction_bytes(2048, 1024, 4)) == 3 * 2048 * 1024 * 10
    # 3 steps of 1 ms behind 2 ms of attention (0.5 ms blocks), plus a 10 us wait each
    assert float(cp_ring_exposed(3, 1e-3, 2e-3, 1e-5)) == pytest.approx(3 * (1e-5 + 0.5e-3))
    assert float(cp_ring_exposed(0, 0.0, 2e-3, 1e-5)) == 0.0
    # dropless MoE, vpp 24, 0.2 ms per boundary, host 8 ms, GPU 16 ms, p 2:
    # 24 x (2 x 0.2 + 8 + 16 - sqrt(8^2 + 16^2)) ms = 156.3 ms; token-drop: nothing
    got = float(chunk_boundary_host(24, 0.2e-3, 8e-3, 16e-3, 2.0, 1.0))
    assert got == pytest.approx(24 * (0.4e-3 + 24e-3 - (64e-6 + 256e-6) ** 0.5), rel=1e-9)
    assert got == pytest.approx(0.1563, abs=1e-4)
    assert float(chunk_boundary_host(24, 0.2e-3, 8e-3, 16e-3, 2.0, 0.0)) == 0.0
    # the last bucket is exposed even with a window that would hide the whole collective
    assert float(dp_exposed(1.0, 0.1, 2.0, 0.8)) == pytest.approx(0.1)
    assert float(dp_exposed(1.0, 0.1, 0.5, 0.8)) == pytest.approx(0.6)


def test_deeper_interleaving_has_a_price_for_dropless_moe() -> None:
    # Qwen3-30B-A3B on 2 H100 nodes, PP2 (published rows 259 dropless / 287 token-drop): the
    # chunk boundaries of a dropless stage cost host time that grows with vpp; a token-drop
    # run of the same layout with the alltoall dispatcher (fixed shapes, no synchronisation)
    # does not pay it; with the flex dispatcher (DeepEP returns its receive counts to the host)
    # token-drop synchronises as well
    from tune_cp.config.specs import Dispatcher

    m, c, t = setup("qwen3-30b-a3b", "h100", 2, 4096, 512, "fp8")
    ko = {v: run(m, c, t, pp=2, vpp=v, ep=8, mbs=2).breakdown["kernel_overhead"]
          for v in (1, 4, 24)}
    assert ko[1] < ko[4] < ko[24]
    cfg = resolve_config(ParallelConfig(pp=2, vpp=24, ep=8, mbs=2), m, c, t)
    drop = project(m, c, t, cfg)
    tokendrop = project(m, c, t, cfg, traits=RunTraits(moe_dropless=False))
    assert tokendrop.tokens_per_s_per_gpu > 1.2 * drop.tokens_per_s_per_gpu
    flex = cfg.model_copy(update={"dispatcher": Dispatcher.FLEX})
    assert (project(m, c, t, flex, traits=RunTraits(moe_dropless=False)).tokens_per_s_per_gpu
            == project(m, c, t, flex).tokens_per_s_per_gpu)


def test_context_parallel_variants_do_not_tie() -> None:
    # the same tokens per rank (cp x mbs fixed) used to project identically when the ring hid
    # behind attention; the per-step wait, launches, correction and the shorter attention
    # blocks make more CP slower
    m, c, t = setup("llama3-8b", "h100", 1, 8192, 64)
    tput = [run(m, c, t, cp=cp, mbs=cp).tokens_per_s_per_gpu for cp in (1, 2, 4)]
    assert tput[0] > tput[1] > tput[2]


def test_gpu_without_architecture_gets_generic_constants() -> None:
    from tune_cp.oracle.constants import ARCHITECTURES, BY_NAME, evidence_note

    table = load_calibration()
    generic = table.constants("")
    assert generic == table.constants("generic")
    for name in ("gemm_efficiency_bf16", "attention_efficiency", "hbm_efficiency"):
        assert generic[name] == BY_NAME[name].prior_for("generic")
        assert all(generic[name] <= table.constants(a)[name] for a in ARCHITECTURES)
    assert "no measured row" in evidence_note("my-gpu", "", table)
    assert evidence_note("h100", "hopper", table) == ""
    with pytest.raises(ConfigError, match="unknown GPU architecture 'cdna2'; choose one of "
                                          "ampere, hopper, blackwell, cdna3, cdna4, generic"):
        table.constants("cdna2")


def test_work_records_are_typed_a_misspelt_field_is_an_error() -> None:
    # issue 10: the work was a dict of ~100 string keys read by position; a typo was a silent
    # zero. Each record is a frozen dataclass with slots: reading or writing a name it does not
    # declare raises, and concat_work keeps the types (stages padded to the longest pipeline)
    import dataclasses

    from tune_cp.oracle.work import StageWork, TpWork, concat_work

    m, c, t = setup("llama3-8b", "h100", 2, 4096, 64)
    w1 = build_work(m, c, t, ConfigBatch.resolved(m, c, t, tp=2, pp=1))
    w2 = build_work(m, c, t, ConfigBatch.resolved(m, c, t, tp=[1, 4], pp=[2, 4]))
    assert isinstance(w1.tp, TpWork)
    with pytest.raises(AttributeError):
        _ = w1.tp.fwd_per_blok  # noqa: B018 (the misspelling is the point)
    with pytest.raises(dataclasses.FrozenInstanceError):
        w1.tp.n = np.ones(1)  # type: ignore[misc]
    both = concat_work([w1, w2])
    assert isinstance(both.stages, StageWork)
    assert both.stages.valid.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    # llama3-8b has 32 layers: pp 1 holds all of them, pp 2 16 per stage, pp 4 8 per stage
    assert both.stages.dense_like.tolist() == [[32, 0, 0, 0], [16, 16, 0, 0], [8, 8, 8, 8]]
    assert len(both) == 3


def test_time_names_are_imported_from_their_home_not_from_projection() -> None:
    # issue 10: projection.py was split by concern (work, compute, host, collectives, schedule,
    # timing); it exports only the public API in its __all__. An import of anything else from
    # it (it would still resolve, since projection.py itself uses those names) is a stale one.
    import ast
    from pathlib import Path

    import tune_cp.oracle.projection as proj

    root = Path(__file__).resolve().parents[1]
    stale = []
    for path in root.rglob("*.py"):
        if any(part.startswith(".") or part in ("build", "venv") for part in path.parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "tune_cp.oracle.projection":
                stale += [f"{path.relative_to(root)}: {a.name}" for a in node.names
                          if a.name not in proj.__all__]
    assert stale == []


def test_from_configs_reads_every_field_of_every_configuration() -> None:
    """``ConfigBatch.from_configs`` on a feasible set with every recompute kind, FSDP and
    replicated optimizers, FP8 recipes and zero-bubble schedules: each array entry is the
    configuration's own value (codes as the batch's tables give them); one traits for all and
    one per configuration give the same arrays."""
    from tests.test_solver_equivalence import CASES
    from tune_cp.config.codes import (
        DISPATCH_CODE,
        FP8_CODE,
        METHOD_CODE,
        MODULE_BITS,
        RECOMPUTE_CODE,
        SCHEDULE_CODE,
        split_key,
    )
    from tune_cp.solver.feasible import enumerate_problem

    cfgs = [f.config for name in ("llama3-8b-fp8-fsdp", "mixtral-8x7b")
            for f in enumerate_problem(CASES[name](), count_removed=False).configs]
    kinds = {c.recompute for c in cfgs}
    assert len(kinds) == 3 and len({c.fsdp for c in cfgs}) == 2
    b = ConfigBatch.from_configs(cfgs)
    for i, c in enumerate(cfgs):
        got = {f: getattr(b, f)[i] for f in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "mbs",
                                             "ga", "sp", "recompute", "recompute_method",
                                             "recompute_layers", "recompute_modules",
                                             "distributed_optimizer", "fsdp", "dispatcher",
                                             "schedule", "split", "fp8", "grad_fp32")}
        assert got == {
            "tp": c.tp, "pp": c.pp, "vpp": c.vpp, "cp": c.cp, "ep": c.ep, "etp": c.etp_,
            "dp": c.dp, "mbs": c.mbs, "ga": c.ga, "sp": c.sp,
            "recompute": RECOMPUTE_CODE[c.recompute],
            "recompute_method": METHOD_CODE[c.recompute_method],
            "recompute_layers": -1 if c.recompute_layers is None else c.recompute_layers,
            "recompute_modules": sum(MODULE_BITS[m] for m in set(c.recompute_modules)),
            "distributed_optimizer": c.distributed_optimizer, "fsdp": c.fsdp,
            "dispatcher": DISPATCH_CODE[c.dispatcher], "schedule": SCHEDULE_CODE[c.schedule_],
            "split": b.split_keys.index(split_key(c)), "fp8": FP8_CODE[c.fp8_recipe],
            "grad_fp32": c.grad_reduce_in_fp32}, c
    per = ConfigBatch.from_configs(cfgs, [RunTraits()] * len(cfgs))
    for f in ("tp_overlap", "fp8_rowwise", "dropless", "graph_mask", "a2a_overlap", "capacity"):
        assert (getattr(per, f) == getattr(b, f)).all() and len(getattr(b, f)) == len(cfgs)
