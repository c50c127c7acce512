"""An independent scalar check of the vectorised work (``oracle.work.build_work``).

Issue 10: the old "vectorised equals scalar" test ran ``score_configs`` on both sides. Here the
per-rank work of a few hand-picked configurations — the GEMM shapes and FLOPs of every slot, the
core-attention FLOPs, the parameters per pipeline stage and the bytes of every collective — is
written out in plain Python from the model dimensions and the formulas (Megatron-Core's sharding
and the module docstrings of ``oracle/work.py`` and ``oracle/collectives.py``), without calling
``oracle.params``, ``oracle.flops``, ``oracle.memory`` or ``oracle.work``, and compared with the
records ``build_work`` returns. A few numbers are worked by hand in the comments and pinned.

Cases: a dense GQA model (Llama 3 8B, tp 2 pp 2), a MoE model with expert parallelism
(Mixtral 8x7B, tp 2 ep 4), an MLA model with MTP and shared experts (DeepSeek-V3, tp 2 pp 4
ep 8), context parallelism (Llama 3 70B, tp 4 cp 2 pp 2) and an interleaved pipeline
(Llama 3 70B, tp 8 pp 4 vpp 5).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tune_cp.config.specs import ClusterSpec, ModelSpec, Precision, TrainingSpec
from tune_cp.oracle.catalog import load_gpu, load_model
from tune_cp.oracle.work import SLOTS, ConfigBatch, S, Work, build_work

BF16 = 2  # bytes per element
FP32 = 4


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Case:
    model: str
    gpu: str
    nodes: int
    seq: int
    gbs: int
    precision: str
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    mbs: int = 1

    @property
    def etp(self) -> int:  # Megatron's default: expert tensor parallelism = tp
        return self.tp

    @property
    def world(self) -> int:
        return self.nodes * 8

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)


DENSE = Case("llama3-8b", "h100", 2, 8192, 64, "bf16", tp=2, pp=2)
MOE = Case("mixtral-8x7b", "h100", 4, 4096, 256, "bf16", tp=2, ep=4)
MLA = Case("deepseek-v3", "h100", 16, 4096, 1024, "fp8", tp=2, pp=4, ep=8)
CP = Case("llama3-70b", "h100", 8, 8192, 128, "bf16", tp=4, pp=2, cp=2)
VPP = Case("llama3-70b", "h100", 8, 8192, 128, "bf16", tp=8, pp=4, vpp=5)
CASES = [DENSE, MOE, MLA, CP, VPP]


def work_of(case: Case) -> tuple[ModelSpec, Work]:
    m = load_model(case.model)
    c = ClusterSpec(gpu=load_gpu(case.gpu), num_nodes=case.nodes, gpus_per_node=8)
    t = TrainingSpec(seq_len=case.seq, global_batch_size=case.gbs,
                     precision=Precision(case.precision))
    b = ConfigBatch.resolved(m, c, t, tp=case.tp, pp=case.pp, vpp=case.vpp, cp=case.cp,
                                ep=case.ep, mbs=case.mbs)
    return m, build_work(m, c, t, b)


# ------------------------------------------------------------------ scalar formulas


def tokens(m: ModelSpec, case: Case) -> tuple[int, int]:
    """Tokens of one micro-batch on one rank: T = mbs s / cp, and T / tp under sequence
    parallelism (on whenever tp > 1)."""
    T = case.mbs * case.seq // case.cp
    return T, (T // case.tp if case.tp > 1 else T)


def padded_vocab(vocab: int, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of 128 x tp."""
    return cdiv(vocab, 128 * tp) * 128 * tp


def scalar_gemms(m: ModelSpec, case: Case) -> dict[str, tuple[float, float, float, float]]:
    """(M, N, K, count) of every GEMM one rank runs per micro-batch forward, Megatron-Core
    sharding: column-parallel layers split N over tp, row-parallel ones K; MLA's down
    projections are replicated; experts see the token copies routed to this rank's E / ep
    experts (each sharded over etp)."""
    T, Tsp = tokens(m, case)
    h, tp = m.hidden_size, case.tp
    a = m.num_attention_heads // tp
    out: dict[str, tuple[float, float, float, float]] = {}
    if m.mla is not None:
        q = m.mla
        out["q_down"] = (T, q.q_lora_rank, h, 1)
        out["q_up"] = (T, a * (q.qk_nope_head_dim + q.qk_rope_head_dim), q.q_lora_rank, 1)
        out["kv_down"] = (T, q.kv_lora_rank + q.qk_rope_head_dim, h, 1)
        out["kv_up"] = (T, a * (q.qk_nope_head_dim + q.v_head_dim), q.kv_lora_rank, 1)
        out["attn_out"] = (T, h, a * q.v_head_dim, 1)
    else:
        g = max(1, m.num_kv_heads // tp)
        out["qkv"] = (T, (a + 2 * g) * m.head_dim, h, 1)
        out["attn_out"] = (T, h, a * m.head_dim, 1)
    if not m.is_moe or m.num_dense_layers:
        f = m.ffn_hidden_size // tp
        out["mlp_fc1"] = (T, 2 * f, h, 1)  # gated (SwiGLU): gate and up fused
        out["mlp_fc2"] = (T, h, f, 1)
    if m.is_moe:
        local = m.num_experts // case.ep
        fe = m.expert_ffn_hidden_size // case.etp
        rows = Tsp * m.moe_top_k * case.etp  # token copies this rank's experts process
        out["exp_fc1"] = (rows / local, 2 * fe, h, local)
        out["exp_fc2"] = (rows / local, h, fe, local)
        if m.num_shared_experts:
            fs = m.num_shared_experts * m.shared_expert_ffn_hidden_size // tp
            out["sh_fc1"] = (T, 2 * fs, h, 1)
            out["sh_fc2"] = (T, h, fs, 1)
        out["router"] = (Tsp, m.num_experts, h, 1)
    out["logits"] = (T, padded_vocab(m.vocab_size, tp) / tp, h, 1)
    if m.num_mtp_layers:
        out["mtp_proj"] = (T, h / tp, 2 * h, 1)
    return out


def scalar_attention_flops(m: ModelSpec, case: Case) -> float:
    """Causal core attention of one layer on one rank, forward: QK^T and PV, each 2 FLOPs per
    multiply-add over d_qk (resp. d_v) for s/2 keys on average per query, for the rank's
    mbs s / cp queries and a / tp heads."""
    if m.mla is not None:
        d_qk = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim
        d_v = m.mla.v_head_dim
    else:
        d_qk = d_v = m.head_dim
    per_token = 2 * m.num_attention_heads * (d_qk + d_v) * case.seq / 2
    return per_token * case.mbs * case.seq / (case.tp * case.cp)


def attention_params(m: ModelSpec, tp: int) -> int:
    """One attention block on one rank (RMSNorm, no biases): input norm h; GQA: QKV column-
    parallel h x (a/tp + 2 g/tp) d, output row-parallel (a d / tp) x h; MLA: replicated down
    projections and their norms, sharded up projections and output."""
    h, a = m.hidden_size, m.num_attention_heads
    if m.mla is not None:
        q = m.mla
        qk = q.qk_nope_head_dim + q.qk_rope_head_dim
        return (h + h * q.q_lora_rank + q.q_lora_rank + q.q_lora_rank * a * qk // tp
                + h * (q.kv_lora_rank + q.qk_rope_head_dim) + q.kv_lora_rank
                + q.kv_lora_rank * a * (q.qk_nope_head_dim + q.v_head_dim) // tp
                + a * q.v_head_dim * h // tp)
    d = m.head_dim
    g = max(1, m.num_kv_heads // tp)
    return h + h * (a // tp + 2 * g) * d + a * d * h // tp


def mlp_params(m: ModelSpec, ffn: int, tp: int) -> int:
    """Gated MLP of width ffn on one rank, no norm: fc1 h x 2 ffn / tp, fc2 ffn / tp x h."""
    return m.hidden_size * 2 * ffn // tp + ffn * m.hidden_size // tp


def scalar_stage_params(m: ModelSpec, case: Case) -> list[int]:
    """Parameters per rank of every stage of an even pipeline (L / pp layers each; embedding
    on the first stage, final norm and output layer on the last; dense models only)."""
    h, tp = m.hidden_size, case.tp
    layer = attention_params(m, tp) + h + mlp_params(m, m.ffn_hidden_size, tp)
    vocab = padded_vocab(m.vocab_size, tp) * h // tp
    per_stage = [m.num_layers // case.pp * layer] * case.pp
    per_stage[0] += vocab  # embedding
    per_stage[-1] += h + vocab  # final norm + output layer
    return per_stage


def gemm_flops(M: float, N: float, K: float, count: float) -> float:
    return 2.0 * M * N * K * count


# ------------------------------------------------------------------ the checks


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.model}-tp{c.tp}pp{c.pp}v{c.vpp}cp{c.cp}ep{c.ep}")
def test_gemm_shapes_and_flops_per_slot(case: Case) -> None:
    m, w = work_of(case)
    want = scalar_gemms(m, case)
    for slot in SLOTS:
        i = S[slot]
        got = (w.gemm.M[0, i], w.gemm.N[0, i], w.gemm.K[0, i], w.gemm.count[0, i])
        if slot not in want:
            assert got[3] == 0, slot  # the model has no such GEMM
            continue
        assert got == pytest.approx(want[slot], rel=1e-12), slot
        assert gemm_flops(*got) == pytest.approx(gemm_flops(*want[slot]), rel=1e-12), slot


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.model}-tp{c.tp}pp{c.pp}v{c.vpp}cp{c.cp}ep{c.ep}")
def test_core_attention_flops(case: Case) -> None:
    m, w = work_of(case)
    assert w.attention.flops_full[0] == pytest.approx(scalar_attention_flops(m, case), rel=1e-12)
    assert w.attention.flops_slide[0] == 0.0  # none of these models has sliding-window layers


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.model}-tp{c.tp}pp{c.pp}v{c.vpp}cp{c.cp}ep{c.ep}")
def test_collective_bytes(case: Case) -> None:
    m, w = work_of(case)
    T, Tsp = tokens(m, case)
    h = m.hidden_size
    # TP: every all-gather / reduce-scatter moves the layer activation T h in bf16 over tp
    assert w.tp.tensor_bytes[0] == T * h * BF16
    assert w.tp.n[0] == case.tp
    # SP: forward AG + RS per block, backward RS + AG + the input re-gather, in units of one
    # bf16 collective; an FP8 recipe gathers the quantised input (1 byte of 2: 0.5 units)
    ag = 0.5 if case.precision == "fp8" else 1.0
    assert (w.tp.fwd_per_block[0], w.tp.bwd_per_block[0]) == ((ag + 1, 2 + ag) if case.tp > 1
                                                              else (0.0, 0.0))
    # CP ring: cp - 1 exchanges of the local K and V (GQA: the rank's g / tp KV heads)
    if m.mla is not None:
        q = m.mla
        kv_width = m.num_attention_heads // case.tp * (q.qk_nope_head_dim + q.qk_rope_head_dim
                                                       + q.v_head_dim)
    else:
        kv_width = 2 * max(1, m.num_kv_heads // case.tp) * m.head_dim
    assert w.cp.block_bytes[0] == T * kv_width * BF16
    assert w.cp.steps[0] == case.cp - 1
    # PP: one T_sp h bf16 activation per chunk boundary and direction, 2 vpp per micro-batch
    assert w.pp.activation_bytes[0] == (Tsp * h * BF16 if case.pp > 1 else 0)
    assert w.pp.sends[0] == (2 * case.vpp if case.pp > 1 else 0)
    # DP: dense gradients over dp x cp ranks (fp32 buffer), experts over world / (pp ep etp)
    assert w.dp.dense_n[0] == case.dp * case.cp
    assert w.dp.grad_bytes[0] == FP32
    if m.is_moe:
        assert w.dp.expert_n[0] == case.world // (case.pp * case.ep * case.etp)
        # EP all-to-all: a rank dispatches T_sp k token copies of h bf16; of its ep peers those
        # in its scale-up domain of 8 GPUs (ep_local of them: 8 / etp when etp x ep spans more
        # than a domain) are reached over NVLink, the rest over the NIC
        disp = Tsp * m.moe_top_k * h * BF16
        ep_local = case.ep if case.ep * case.etp <= 8 else 8 // case.etp
        assert w.ep.intra_bytes[0] == pytest.approx(disp * (ep_local - 1) / case.ep, rel=1e-12)
        assert w.ep.inter_bytes[0] == pytest.approx(disp * (case.ep - ep_local) / case.ep,
                                                    rel=1e-12)
        # ETP: the routed token copies are gathered / reduce-scattered over etp
        rows = Tsp * m.moe_top_k * case.etp
        assert w.ep.etp_bytes[0] == (rows * h * BF16 if case.etp > 1 else 0)
    else:
        assert w.ep.intra_bytes[0] == w.ep.inter_bytes[0] == w.ep.etp_bytes[0] == 0


@pytest.mark.parametrize("case", [DENSE, CP, VPP], ids=["llama3-8b", "llama3-70b-cp", "llama3-70b-vpp"])
def test_parameters_per_stage_dense(case: Case) -> None:
    m, w = work_of(case)
    want = scalar_stage_params(m, case)
    got = (w.stages.params_dense[0] + w.stages.params_expert[0]).tolist()
    assert [int(x) for x in got] == want
    assert w.stages.params_expert[0].tolist() == [0.0] * case.pp
    assert w.stages.dense_like[0].tolist() == [m.num_layers // case.pp] * case.pp


def test_hand_worked_llama3_8b_tp2_pp2() -> None:
    # Llama 3 8B (h 4096, 32 heads, 8 KV heads, d 128, f 14336, V 128,256), tp 2, mbs 1,
    # s 8192: T = 8192 tokens, T_sp = 4096.
    m, w = work_of(DENSE)
    # QKV: 8192 x (16 + 2 x 4) x 128 = 3072 x 4096 -> 2 x 8192 x 3072 x 4096 = 206,158,430,208
    i = S["qkv"]
    assert gemm_flops(w.gemm.M[0, i], w.gemm.N[0, i], w.gemm.K[0, i], w.gemm.count[0, i]) \
        == 206_158_430_208
    # core attention: 2 x 32 x 256 x 4096 = 67,108,864 FLOPs per token, x 8192 / tp 2
    assert w.attention.flops_full[0] == 274_877_906_944
    # per rank: attention 4096 + 4096 x 3072 + 2048 x 4096 = 20,975,616; MLP 4096 + 4096 x
    # 14336 + 7168 x 4096 = 88,084,480; 16 layers = 1,744,961,536; + embedding 64,128 x 4096 =
    # 262,668,288 (first stage) or + final norm and output 262,672,384 (last stage)
    assert w.stages.params_dense[0].tolist() == [2_007_629_824, 2_007_633_920]
    # (x tp 2 = 8,030,527,488 = the published 8,030,261,248 + 65 norms of 4096 counted twice)
    # TP tensor 8192 x 4096 x 2 B = 64 MiB; PP activation 4096 x 4096 x 2 B = 32 MiB
    assert (w.tp.tensor_bytes[0], w.pp.activation_bytes[0]) == (64 * 2**20, 32 * 2**20)


def test_hand_worked_deepseek_v3_mla_and_experts() -> None:
    # DeepSeek-V3 at tp 2 (64 heads per rank), mbs 1, s 4096: T = 4096, T_sp = 2048
    m, w = work_of(MLA)
    g = {slot: (w.gemm.M[0, S[slot]], w.gemm.N[0, S[slot]], w.gemm.K[0, S[slot]],
                w.gemm.count[0, S[slot]]) for slot in SLOTS}
    # q up-projection: 1536 -> 64 x (128 + 64) = 12,288; kv up: 512 -> 64 x (128 + 128) = 16,384
    assert g["q_up"] == (4096, 12288, 1536, 1)
    assert g["kv_up"] == (4096, 16384, 512, 1)
    # experts: 256 / ep 8 = 32 per rank, each of width 2048 / etp 2 = 1024; 2048 x 8 x 2 =
    # 32,768 token copies -> 1024 rows per expert
    assert g["exp_fc1"] == (1024, 2048, 7168, 32)
    assert g["exp_fc2"] == (1024, 7168, 1024, 32)
    # MTP projection 2h -> h / tp: 14,336 -> 3584
    assert g["mtp_proj"] == (4096, 3584, 14336, 1)
    # core attention: 2 x 128 x (192 + 128) x 2048 = 167,772,160 per token, x 4096 / 2
    assert w.attention.flops_full[0] == 343_597_383_680
    # EP 8 x etp 2 spans 16 GPUs > one node of 8: 4 peers per node. A rank dispatches
    # 2048 x 8 x 7168 x 2 B = 234,881,024 B: 3/8 over NVLink, 4/8 over the NIC
    assert (w.ep.intra_bytes[0], w.ep.inter_bytes[0]) == (88_080_384, 117_440_512)


def test_deepseek_v3_stage_parameters_sum_to_the_model_per_rank() -> None:
    # whatever the pipeline layout, the stages together hold every layer once per (tp, ep)
    # rank: 61 attention blocks, 3 dense MLPs, 58 MoE blocks (norm, router h x E + its
    # correction bias E, the shared expert over tp, 32 routed experts over etp), the MTP module
    # (one more MoE layer + 3 norms + the 2h x h projection over tp), embedding and output
    m, w = work_of(MLA)
    h, tp, E = m.hidden_size, MLA.tp, m.num_experts
    attn = attention_params(m, tp)
    dense_mlp = h + mlp_params(m, m.ffn_hidden_size, tp)
    moe_ne = h + h * E + E + mlp_params(m, m.shared_expert_ffn_hidden_size, tp)
    experts = E // MLA.ep * mlp_params(m, m.expert_ffn_hidden_size, MLA.etp)
    vocab = padded_vocab(m.vocab_size, tp) * h // tp
    n_moe = m.num_layers - m.num_dense_layers + m.num_mtp_layers
    dense_total = (attn * (m.num_layers + 1) + dense_mlp * m.num_dense_layers + moe_ne * n_moe
                   + 3 * h + 2 * h * h // tp + vocab + h + vocab)
    assert int(w.stages.params_dense[0].sum()) == dense_total
    assert int(w.stages.params_expert[0].sum()) == experts * n_moe
    # 32 experts x (7168 x 2 x 1024 + 1024 x 7168) = 704,643,072 per MoE layer, 59 of them
    assert experts * n_moe == 59 * 704_643_072


def test_moe_expert_parameters_hand_worked() -> None:
    # Mixtral 8x7B, ep 4 etp 2, pp 1: 2 experts per rank, each (4096 x 2 x 7168 + 7168 x 4096)
    # = 88,080,384 -> 176,160,768 per layer, 32 layers = 5,637,144,576 expert parameters
    m, w = work_of(MOE)
    assert w.stages.params_expert[0].tolist() == [5_637_144_576]
    # non-expert: 32 x (attention 20,975,616 + norm 4096 + router 4096 x 8) + embedding
    # 16,000 x 4096 + final norm 4096 + output 16,000 x 4096
    assert w.stages.params_dense[0].tolist() == [32 * (20_975_616 + 4096 + 32_768)
                                                  + 2 * 65_536_000 + 4096]
