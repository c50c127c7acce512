"""How long the work of :func:`oracle.work.build_work` takes, given the constants of
``oracle/constants.py`` (scalars or one value per configuration): :func:`timing`.

GEMM time from a shape-dependent efficiency and attention at the flash-attention efficiency
(:mod:`oracle.compute`), element-wise work at HBM bandwidth, host overhead
(:mod:`oracle.host`), collectives on an alpha-beta model of the right link with the overlap the
framework achieves (:mod:`oracle.collectives`), then the pipeline schedule over the slowest stage
(:mod:`oracle.schedule`), data-parallel traffic and the optimizer step.

* **Element-wise**: bytes read + written / (HBM x ``hbm_efficiency``); backward moves twice the
  forward bytes.
* **Optimizer**: Adam with fp32 master weights reads and writes
  :data:`OPTIMIZER_BYTES_PER_PARAM` bytes per local parameter at HBM speed.
* **Step overhead**: ``step_overhead_s`` once per step (host work the GPU waits for: gradient
  norm and clipping, loss averaging and logging synchronisation, optimizer launches, the
  data batch); it matters for short steps (few micro-batches).

Breakdown (:data:`BREAKDOWN`): seconds per step that add up to ``step_time_s``: the components
of the slowest stage times the number of micro-batches, then the bubble, the exposed DP
traffic and the optimizer step of the stage that finishes last, and the fixed step overhead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tune_cp.oracle.collectives import (
    collective_time,
    cp_ring_exposed,
    dp_exposed,
    flex_exposed,
    pipeline_p2p,
)
from tune_cp.oracle.compute import (
    ATTENTION_BWD_FLOPS_RATIO,
    gemm_half_dims,
    mamba_scan_time,
    shape_factor,
    sustained_rate,
)
from tune_cp.oracle.constants import CONSTANT_NAMES, REFERENCE_SOFTWARE, CalibrationTable
from tune_cp.oracle.host import (
    GRAPH_BITS,
    a2a_sync_exponent,
    attention_host_time,
    combined_schedule_host_time,
    current_scaling_host_time,
    host_exposed,
    layer_host_time,
    mamba_host_time,
)
from tune_cp.oracle.inventory import SSD_BACKWARD_FORWARD_UNITS
from tune_cp.oracle.schedule import chunk_boundary_host, pipeline_bubble
from tune_cp.oracle.work import (
    ATTN_SLOTS,
    BF16,
    EXP_SLOTS,
    GROUPED_SLOTS,
    LAT_SLOTS,
    LOW_PREC_SLOTS,
    MAMBA_SLOTS,
    MLA_UP_SLOTS,
    MLP_SLOTS,
    SH_SLOTS,
    S,
    Work,
)

#: Adam step per local parameter: read fp32 grad (4), read+write fp32 master (8), exp_avg (8),
#: exp_avg_sq (8), write bf16 param (2), gradient-norm pass (4). Megatron distributed optimizer.
OPTIMIZER_BYTES_PER_PARAM = 34.0


BREAKDOWN: tuple[str, ...] = (
    "attention_gemm",  # QKV / MLA projections and the attention output projection, fwd + bwd
    "core_attention",  # flash attention fwd + bwd
    "mlp_gemm",  # dense MLP GEMMs
    "expert_gemm",  # routed (grouped) and shared expert GEMMs
    "router",  # router GEMM
    "mamba_mixer",  # Mamba-2 in/out projections and the chunked SSD scan, fwd + bwd (hybrid)
    "elementwise",  # norms, rope, activations, residuals, permutes, FP8/FP4 casts
    "embedding_logits_loss",  # embedding, final norm, logits GEMM, cross-entropy, MTP heads
    "recompute",  # recomputed forward work (selective modules or full layers)
    "kernel_overhead",  # launch / host overhead not hidden
    "tp_comm",  # exposed TP/SP collectives
    "cp_comm",  # exposed context-parallel ring exchange
    "ep_comm",  # exposed MoE dispatch / combine
    "pp_p2p",  # exposed pipeline send / receive
    "pipeline_bubble",  # fill and drain of the pipeline schedule
    "dp_comm",  # exposed data-parallel / FSDP collectives
    "optimizer",  # optimizer step
    "step_overhead",  # fixed host work per step (grad norm, loss logging sync, launches)
)


def constants_arrays(
    calib: CalibrationTable,
    archs: Sequence[str] | str,
    n: int,
    software: Sequence[str] | str = REFERENCE_SOFTWARE,
) -> dict[str, np.ndarray]:
    """Constants as arrays of length ``n`` (one architecture and software stack, or one per
    entry)."""
    if isinstance(archs, str) and isinstance(software, str):
        c = calib.constants(archs, software)
        return {k: np.full(n, c[k]) for k in CONSTANT_NAMES}
    archs_l = [archs] * n if isinstance(archs, str) else list(archs)
    soft_l = [software] * n if isinstance(software, str) else list(software)
    table = {key: calib.constants(*key) for key in set(zip(archs_l, soft_l, strict=True))}
    return {k: np.array([table[key][k] for key in zip(archs_l, soft_l, strict=True)])
            for k in CONSTANT_NAMES}


def mamba_kernel_time(t: Any, efficiency: Any) -> np.ndarray:
    """Time of the Mamba-2 mixer's own kernels (SSD scan matmuls and HBM intermediates, conv1d,
    gated norm), modelled at flash-attention / element-wise rates ``t``, at their own rate
    (``mamba_kernel_efficiency``, relative: 1 = as modelled). Worked example: 2.0 ms modelled
    at efficiency 0.5 takes 4.0 ms."""
    return np.asarray(t, dtype=np.float64) / np.asarray(efficiency, dtype=np.float64)


def timing(w: Work, c: dict[str, Any]) -> dict[str, np.ndarray]:
    """Step time and breakdown for every configuration of a work batch (see module docstring).

    Returns ``step_time_s`` and one array per :data:`BREAKDOWN` entry (seconds per step, they
    add up to the step time), plus ``critical_stage``.
    """
    eff_prec = np.choose(
        w.device.prec, [c["gemm_efficiency_bf16"], c["gemm_efficiency_fp8"],
                    c["gemm_efficiency_fp4"]]
    ) * (1 - w.device.block_scaled * (1 - np.asarray(c["block_scaled_gemm_efficiency"])))
    hbm = w.device.hbm_bw * c["hbm_efficiency"]
    up_bw = w.device.scale_up_bw * c["scale_up_efficiency"]
    nic_bw = w.device.nic_bw * c["nic_efficiency"]
    alpha = c["collective_latency_s"]
    kern = c["kernel_overhead_s"]
    peak_bf16 = w.device.peak_bf16
    rate = sustained_rate(w.device.pw_peak, w.device.pw_units, w.device.pw_tdp, c["power_clock_exponent"])

    def link(intra: np.ndarray) -> np.ndarray:
        """Point-to-point / all-to-all bandwidth per GPU."""
        return np.where(intra > 0, up_bw, nic_bw)

    def ring(intra: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Bus bandwidth of a ring collective (see :func:`group_local`)."""
        return np.where(intra > 0, up_bw, np.minimum(up_bw, local * nic_bw))

    # ---- GEMMs, forward time per slot
    M, N, K, cnt = w.gemm.M, w.gemm.N, w.gemm.K, w.gemm.count
    present = cnt > 0
    Ms, Ns, Ks = (np.where(present, x, 1.0) for x in (M, N, K))
    low = LOW_PREC_SLOTS[None, :] & (w.device.prec[:, None] > 0)
    eff = np.where(low, eff_prec[:, None], np.asarray(c["gemm_efficiency_bf16"])[..., None])
    half_s = gemm_half_dims(c["gemm_half_dim"], low, w.device.peak_low, peak_bf16)
    # one grouped kernel for every local expert (legacy grouped_gemm, Primus-Turbo): its M is
    # every local expert's rows together; per-expert launches (TE GroupedLinear, the sequential
    # loop) see each expert's rows (w.backend.fused_grouped)
    Mshape = np.where(GROUPED_SLOTS[None, :] & (w.backend.fused_grouped[:, None] > 0),
                      Ms * np.maximum(cnt, 1.0), Ms)
    eff = eff * shape_factor(Mshape, half_s) * shape_factor(Ns, half_s) * shape_factor(Ks, half_s)
    eff = np.where(GROUPED_SLOTS[None, :], eff * np.asarray(c["grouped_gemm_efficiency"])[
        ..., None], eff)
    peak = np.where(low, w.device.peak_low[:, None], peak_bf16[:, None]) * rate[:, None]
    t_compute = 2.0 * Ms * Ns * Ks * cnt / (peak * eff)
    opb = np.where(low, w.device.operand_bytes[:, None], BF16)
    t_memory = cnt * ((Ms * Ks + Ks * Ns) * opb + Ms * Ns * BF16) / hbm[:, None]
    gf = np.where(present, np.maximum(t_compute, t_memory), 0.0)  # forward; backward = 2x
    cast_f = w.gemm.cast_fwd_bytes / hbm[:, None]
    cast_b = w.gemm.cast_bwd_bytes / hbm[:, None]

    def slots(x: np.ndarray, idx: list[int]) -> np.ndarray:
        return x[:, idx].sum(axis=1)

    g_attn, g_mlp = slots(gf, ATTN_SLOTS), slots(gf, MLP_SLOTS)
    g_exp, g_sh = slots(gf, EXP_SLOTS), slots(gf, SH_SLOTS)
    g_router, g_logits, g_mtp = gf[:, S["router"]], gf[:, S["logits"]], gf[:, S["mtp_proj"]]
    g_mla_up = slots(gf, MLA_UP_SLOTS)
    cf_attn, cb_attn = slots(cast_f, ATTN_SLOTS), slots(cast_b, ATTN_SLOTS)
    cf_mlp, cb_mlp = slots(cast_f, MLP_SLOTS), slots(cast_b, MLP_SLOTS)
    cf_moe = slots(cast_f, EXP_SLOTS + SH_SLOTS)
    cb_moe = slots(cast_b, EXP_SLOTS + SH_SLOTS)
    # hybrid models (oracle/inventory.py): Mamba mixers, a latent MoE's projections; a
    # transformer has none of these (zeros), and ``nh`` = 1 keeps attention inside its
    # dense/MoE layers (``hyb`` = 1: each hybrid layer is one block)
    hyb = w.hybrid.is_hybrid
    nh = 1.0 - hyb
    g_mamba, g_lat = slots(gf, MAMBA_SLOTS), slots(gf, LAT_SLOTS)
    cf_mamba, cb_mamba = slots(cast_f, MAMBA_SLOTS), slots(cast_b, MAMBA_SLOTS)
    cf_lat, cb_lat = slots(cast_f, LAT_SLOTS), slots(cast_b, LAT_SLOTS)

    # ---- core attention
    hd = c["attention_head_dim_half"]
    dfac = (w.attention.head_dim / (w.attention.head_dim + hd)) / (128.0 / (128.0 + hd))
    a_eff = c["attention_efficiency"] * dfac
    hh = np.asarray(c["gemm_half_dim"])
    sfu = np.where(w.device.sfu_exp_per_s > 0, w.device.sfu_exp_per_s * rate, np.inf)
    core_f = np.zeros_like(w.device.peak_bf16)
    core_b = np.zeros_like(w.device.peak_bf16)
    att = w.attention
    for flops, ctx in ((att.flops_full, att.ctx_full), (att.flops_slide, att.ctx_slide)):
        eff_ctx = shape_factor(ctx, hh)
        t_mm = flops / (peak_bf16 * rate * a_eff * eff_ctx)
        # softmax exponentials on the special-function units overlap the matmuls (FA3/FA4)
        t_exp = flops * att.exp_per_flop / (sfu * c["attention_efficiency"] * eff_ctx)
        core_f = core_f + np.maximum(t_mm, t_exp)
        core_b = core_b + np.maximum(ATTENTION_BWD_FLOPS_RATIO * t_mm, t_exp)

    # ---- Mamba-2 SSD scan (compute.mamba_scan_time)
    scan_f = mamba_scan_time(w.hybrid.scan_flops, w.hybrid.chunk, peak_bf16 * rate,
                             c["attention_efficiency"], hh)

    # ---- element-wise
    ew_mamba = mamba_kernel_time(w.hybrid.ew_mamba / hbm, c["mamba_kernel_efficiency"])
    ew_attn, ew_mlp, ew_moe = w.elementwise.attn / hbm, w.elementwise.mlp / hbm, w.elementwise.moe / hbm
    ew_out_f, ew_out_b = w.elementwise.out_fwd / hbm, w.elementwise.out_bwd / hbm
    ew_emb_f, ew_emb_b = w.elementwise.emb_fwd / hbm, w.elementwise.emb_bwd / hbm

    # ---- host time per layer (forward + backward launches twice as many kernels)
    sch = w.schedule
    graphs = {f"graph_{part}": getattr(sch, f"graph_{part}") for part in GRAPH_BITS}
    host_dense = layer_host_time(False, 0.0, kern, w.cp.steps, graphs)
    host_moe = layer_host_time(True, sch.local_experts, kern, w.cp.steps, graphs,
                               w.backend.host_ops, w.backend.host_ops_per_expert)
    # a hybrid layer is one block: its dense / MoE layers issue no attention operations
    host_attn = attention_host_time(kern, w.cp.steps, graphs)
    host_dense = host_dense - hyb * host_attn
    host_moe = host_moe - hyb * host_attn
    host_mamba = mamba_host_time(kern, graphs)
    # FP8 per-tensor current scaling: 2 more launches per quantised operand (amax, scale) in
    # every part a CUDA graph does not capture (host.current_scaling_host_time)
    q_low = np.where(low, cnt, 0.0)
    cs = sch.current_scaling * (1.0 - sch.graph_full_iteration)
    cs_attn = current_scaling_host_time(slots(q_low, ATTN_SLOTS), cs * (1.0 - sch.graph_attn),
                                        kern)
    cs_mlp = current_scaling_host_time(slots(q_low, MLP_SLOTS), cs * (1.0 - sch.graph_mlp), kern)
    cs_moe = current_scaling_host_time(slots(q_low, EXP_SLOTS + SH_SLOTS + LAT_SLOTS), cs, kern)
    cs_mamba = current_scaling_host_time(slots(q_low, MAMBA_SLOTS), cs, kern)
    host_dense = host_dense + nh * cs_attn + cs_mlp
    host_moe = host_moe + nh * cs_attn + cs_moe
    # the combined 1F1B schedule (--overlap-moe-expert-parallel-comm) runs every layer part as
    # its own schedule node (host.combined_schedule_host_time)
    host_dense = host_dense + combined_schedule_host_time(
        False, sch.a2a_overlap, sch.graph_full_iteration, kern)
    host_moe = host_moe + combined_schedule_host_time(
        True, sch.a2a_overlap, sch.graph_full_iteration, kern)
    host_attn = host_attn + cs_attn
    host_mamba = host_mamba + cs_mamba

    # ---- TP
    t_tp = collective_time(w.tp.tensor_bytes, w.tp.n, ring(w.tp.intra, w.tp.local), alpha)
    ov_tp = c["tp_comm_overlap"] * w.tp.overlap
    tp_attn_f = np.maximum(0.0, w.tp.fwd_per_block * t_tp - ov_tp * g_attn)
    tp_attn_b = np.maximum(0.0, w.tp.bwd_per_block * t_tp - ov_tp * 2 * g_attn)
    tp_mlp_f = np.maximum(0.0, w.tp.fwd_per_block * t_tp - ov_tp * g_mlp)
    tp_mlp_b = np.maximum(0.0, w.tp.bwd_per_block * t_tp - ov_tp * 2 * g_mlp)
    tp_sh_f = np.maximum(0.0, w.tp.shared_blocks * w.tp.fwd_per_block * t_tp
                         - ov_tp * g_sh)
    tp_sh_b = np.maximum(0.0, w.tp.shared_blocks * w.tp.bwd_per_block * t_tp
                         - ov_tp * 2 * g_sh)
    # one bf16 collective of T h each way before the logits (SP gather) / after the embedding
    # (the output layer and the embedding stay bf16 under FP8 recipes)
    tp_out_f = w.tp.has * t_tp
    tp_out_b = w.tp.has * t_tp
    tp_mamba_f = np.maximum(0.0, w.tp.fwd_per_block * t_tp - ov_tp * g_mamba)
    tp_mamba_b = np.maximum(0.0, w.tp.bwd_per_block * t_tp - ov_tp * 2 * g_mamba)

    # ---- CP
    cp_bw = link(w.cp.intra)
    cp_step_f = np.where(w.cp.steps > 0, alpha + w.cp.block_bytes / cp_bw, 0.0)
    cp_step_b = np.where(w.cp.steps > 0, alpha + 2 * w.cp.block_bytes / cp_bw, 0.0)
    cp_f = cp_ring_exposed(w.cp.steps, cp_step_f, core_f, alpha)
    cp_b = cp_ring_exposed(w.cp.steps, cp_step_b, core_b, alpha)
    # Mamba's two all-to-alls per direction (before and after the conv + scan), not overlapped
    cp_mamba = np.where(w.cp.steps > 0, 2 * alpha + w.hybrid.cp_bytes / cp_bw, 0.0)

    # ---- EP (per direction: dispatch + combine)
    lat = alpha * (1 + np.log2(np.maximum(w.ep.n, 1)))
    a2a = w.ep.active * (lat + np.maximum(w.ep.intra_bytes / up_bw,
                                             w.ep.inter_bytes / nic_bw))
    agd = collective_time(w.ep.gather_bytes, w.ep.n, ring(w.ep.gather_intra, w.ep.gather_local),
                      alpha)
    etp = collective_time(w.ep.etp_bytes, w.ep.etp_n, ring(w.ep.etp_intra, w.ep.etp_local), alpha)
    # --overlap-moe-expert-parallel-comm hides the all-to-all behind another micro-batch
    ep_hidden = np.where(w.schedule.a2a_overlap > 0, c["ep_a2a_overlap"], c["ep_comm_overlap"])
    # ---- per-layer forward / backward (compute | comm), and selective recompute
    attn_f = g_attn + core_f + ew_attn + cf_attn
    attn_b = 2 * g_attn + core_b + 2 * ew_attn + cb_attn
    mlp_f = g_mlp + ew_mlp + cf_mlp
    mlp_b = 2 * g_mlp + 2 * ew_mlp + cb_mlp
    moe_f = g_exp + g_sh + g_router + ew_moe + cf_moe + g_lat + cf_lat
    moe_b = 2 * (g_exp + g_sh + g_router) + 2 * ew_moe + cb_moe + 2 * g_lat + cb_lat

    # the flex dispatcher hides part of its all-to-all behind the layer's own computation
    # (collectives.flex_exposed, Primus's DeepEP / sync-free efficiencies), the other
    # dispatchers what the run's schedule hides (ep_hidden); shared-expert overlap hides up to
    # the shared experts' GEMMs more (Megatron-Core moe/shared_experts.py: the shared experts
    # run on a side stream while the tokens are dispatched)
    bk = w.backend
    rest = (2 * agd + 2 * etp) * (1 - ep_hidden)
    flat = 2 * a2a * (1 - ep_hidden)
    ep_dirs = []
    for window, sh in ((nh * attn_f + moe_f, g_sh), (nh * attn_b + moe_b, 2 * g_sh)):
        exposed = np.where(bk.flex > 0, flex_exposed(2 * a2a, window, bk.flex_overlap,
                                                     ep_hidden), flat)
        exposed = np.maximum(0.0, exposed - bk.shared_overlap * sh)
        ep_dirs.append((exposed + rest) * w.schedule.has_moe)
    ep_f, ep_b = ep_dirs
    comm_attn_f, comm_attn_b = tp_attn_f + cp_f, tp_attn_b + cp_b
    comm_mlp_f, comm_mlp_b = tp_mlp_f, tp_mlp_b
    comm_moe_f, comm_moe_b = tp_sh_f + ep_f, tp_sh_b + ep_b
    dense_fwd = nh * attn_f + mlp_f + nh * comm_attn_f + comm_mlp_f
    moe_fwd = nh * attn_f + moe_f + nh * comm_attn_f + comm_moe_f
    # hybrid layer kinds: attention only, Mamba mixer (backward: twice the forward)
    attn_only_fwd = attn_f + comm_attn_f
    # the SSD scan and its HBM intermediates; its backward recomputes the forward scan first
    # (inventory.SSD_BACKWARD_FORWARD_UNITS)
    ssd_f = mamba_kernel_time(scan_f + w.hybrid.ssd_bytes / hbm, c["mamba_kernel_efficiency"])
    mamba_f = g_mamba + ssd_f + ew_mamba + cf_mamba
    mamba_b = 2 * g_mamba + SSD_BACKWARD_FORWARD_UNITS * ssd_f + 2 * ew_mamba + cb_mamba
    comm_mamba_f, comm_mamba_b = tp_mamba_f + cp_mamba, tp_mamba_b + cp_mamba
    mamba_fwd = mamba_f + comm_mamba_f
    rc_attn_only = (
        w.recompute.core_attn * core_f
        + w.recompute.layernorm * w.elementwise.attn_norm / hbm
        + w.recompute.mla_up_proj * g_mla_up
    )
    rc_common = nh * (
        w.recompute.core_attn * core_f
        + w.recompute.layernorm * (w.elementwise.attn_norm + w.elementwise.mlp_norm) / hbm
        + w.recompute.mla_up_proj * g_mla_up
    ) + hyb * w.recompute.layernorm * w.elementwise.mlp_norm / hbm
    rc_dense = rc_common + w.recompute.mlp * (mlp_f + comm_mlp_f)
    rc_moe = (
        rc_common
        + w.recompute.moe * (moe_f + comm_moe_f)
        + (1 - w.recompute.moe) * (
            w.recompute.moe_act * w.elementwise.moe_act / hbm
            + w.recompute.shared_experts * (g_sh + tp_sh_f)
        )
    )

    # ---- output, embedding, MTP heads (per micro-batch)
    out_f = g_logits + ew_out_f + tp_out_f
    out_b = 2 * g_logits + ew_out_b + tp_out_b
    emb_f, emb_b = ew_emb_f + tp_out_f, ew_emb_b + tp_out_b
    mtp_fb = 3 * g_mtp

    # ---- pipeline p2p: one activation transfer per chunk boundary and direction
    t_send = np.where(w.pp.activation_bytes > 0, alpha + w.pp.activation_bytes / link(w.pp.intra), 0.0)

    # ---- per-stage buckets for one micro-batch: (n, P)
    nd, nm = w.stages.dense_like, w.stages.moe_like
    rd, rm = w.stages.rc_dense, w.stages.rc_moe
    ne, no, nmtp = w.stages.embedding, w.stages.output_heads, w.stages.mtp
    valid = w.stages.valid
    na, nmb = w.stages.attn_only, w.stages.mamba
    ra, rmb = w.stages.rc_attn_only, w.stages.rc_mamba

    def col(x: Any) -> np.ndarray:
        return np.asarray(x)[:, None] if np.ndim(x) else np.asarray(x)

    nl = (nd + nm) * col(nh) + na  # attention blocks

    bucket: dict[str, np.ndarray] = {}
    bucket["attention_gemm"] = nl * col(3 * g_attn)
    bucket["core_attention"] = nl * col(core_f + core_b)
    bucket["mlp_gemm"] = nd * col(3 * g_mlp)
    bucket["expert_gemm"] = nm * col(3 * (g_exp + g_sh)) + nm * col(3 * g_lat)
    bucket["router"] = nm * col(3 * g_router)
    bucket["mamba_mixer"] = nmb * col(3 * g_mamba + (1 + SSD_BACKWARD_FORWARD_UNITS) * ssd_f)
    bucket["elementwise"] = (
        nl * col(3 * ew_attn + cf_attn + cb_attn) + nd * col(3 * ew_mlp + cf_mlp + cb_mlp)
        + nm * col(3 * ew_moe + cf_moe + cb_moe)
        + nmb * col(3 * ew_mamba + cf_mamba + cb_mamba) + nm * col(cf_lat + cb_lat)
    )
    bucket["embedding_logits_loss"] = (
        ne * col(emb_f + emb_b) + no * col(out_f + out_b) + nmtp * col(mtp_fb)
    )
    bucket["recompute"] = (
        nd * col(rc_dense) + nm * col(rc_moe) + rd * col(dense_fwd) + rm * col(moe_fwd)
        + na * col(rc_attn_only) + ra * col(attn_only_fwd) + rmb * col(mamba_fwd)
    )
    # the host runs ahead of the GPU: a dense layer exposes only host time beyond its GPU time;
    # a dropless MoE layer synchronises host and device once (token counts), so the host cannot
    # run ahead across it: smooth maximum of its host and GPU time, the excess is exposed
    gpu_dense = nh * attn_f + nh * attn_b + mlp_f + mlp_b + nh * comm_attn_f \
        + nh * comm_attn_b + comm_mlp_f + comm_mlp_b + rc_dense
    gpu_moe = nh * attn_f + nh * attn_b + moe_f + moe_b + nh * comm_attn_f \
        + nh * comm_attn_b + comm_moe_f + comm_moe_b + rc_moe
    gpu_attn_only = attn_f + attn_b + comm_attn_f + comm_attn_b + rc_attn_only
    gpu_mamba = mamba_f + mamba_b + comm_mamba_f + comm_mamba_b
    # dropless MoE inside the combined 1F1B schedule: host and GPU add (a2a_sync_exponent)
    p_host = a2a_sync_exponent(c["host_gpu_overlap_exponent"], w.schedule.a2a_overlap,
                               w.schedule.moe_sync)
    drop = w.schedule.moe_sync
    moe_host_exp = np.where(drop > 0, host_exposed(host_moe, gpu_moe, p_host),
                            np.maximum(0.0, host_moe - gpu_moe))
    bucket["kernel_overhead"] = (
        nd * col(np.maximum(0.0, host_dense - gpu_dense))
        + nm * col(moe_host_exp * w.schedule.has_moe)
        # pipeline chunk boundaries of a dropless MoE stage (chunk_boundary_host)
        + (nm > 0) * col(w.schedule.pp_on * w.schedule.has_moe * chunk_boundary_host(
            w.schedule.vpp, c["pipeline_chunk_host_s"], host_moe, gpu_moe, p_host, drop,
            c["chunk_start_serial_fraction"]))
        + na * col(np.maximum(0.0, host_attn - gpu_attn_only))
        + nmb * col(np.maximum(0.0, host_mamba - gpu_mamba))
    )
    bucket["tp_comm"] = (
        nl * col(tp_attn_f + tp_attn_b) + nd * col(tp_mlp_f + tp_mlp_b)
        + nm * col(tp_sh_f + tp_sh_b) + nmb * col(tp_mamba_f + tp_mamba_b)
    )
    bucket["cp_comm"] = nl * col(cp_f + cp_b) + nmb * col(2 * cp_mamba)
    bucket["ep_comm"] = nm * col(ep_f + ep_b)
    bucket["pp_p2p"] = np.zeros_like(valid)  # below, once the chunk times are known

    # forward / backward split of a stage's micro-batch (DP overlap windows)
    fwd_s = (
        nd * col(dense_fwd) + nm * col(moe_fwd) + ne * col(emb_f) + no * col(out_f)
        + nmtp * col(g_mtp) + na * col(attn_only_fwd) + nmb * col(mamba_fwd)
    )

    # ---- link time of the layer traffic (hidden or not) per micro-batch and stage, forward
    # and backward, on the scale-up links [0] and the NICs [1]: the DP collectives share them
    tp_raw_f = (2.0 + w.tp.shared_blocks) * w.tp.fwd_per_block * t_tp
    tp_raw_b = (2.0 + w.tp.shared_blocks) * w.tp.bwd_per_block * t_tp
    cp_raw_f = w.cp.steps * cp_step_f
    cp_raw_b = w.cp.steps * cp_step_b
    ep_up = w.ep.active * 2 * w.ep.intra_bytes / up_bw
    ep_nic = w.ep.active * 2 * w.ep.inter_bytes / nic_bw
    tpi, cpi = w.tp.intra, w.cp.intra
    link_busy = tuple(
        tuple(nl * col(tp_raw * (tpi if k == 0 else 1 - tpi) + cp_raw * (cpi if k == 0 else 1 - cpi))
              + nm * col(ep_up if k == 0 else ep_nic)
              # hybrid MLP-only and Mamba layers: one TP block each, Mamba's CP all-to-alls
              + (nd * col(hyb) + nmb) * col(blk * (tpi if k == 0 else 1 - tpi))
              + nmb * col(cp_mamba * (cpi if k == 0 else 1 - cpi)) for k in (0, 1))
        for tp_raw, cp_raw, blk in ((tp_raw_f, cp_raw_f, w.tp.fwd_per_block * t_tp),
                                    (tp_raw_b, cp_raw_b, w.tp.bwd_per_block * t_tp))
    )

    # ---- data parallel and FSDP
    pd, pe = w.stages.params_dense, w.stages.params_expert
    bw_dd = col(ring(w.dp.dense_intra, w.dp.dense_local))
    bw_de = col(ring(w.dp.expert_intra, w.dp.expert_local))
    nd_n, ne_n = col(w.dp.dense_n), col(w.dp.expert_n)
    alpha_c = col(alpha)
    gbytes = col(w.dp.grad_bytes)  # the gradient buffer's dtype (fp32 or bf16)
    rs = collective_time(gbytes * pd, nd_n, bw_dd, alpha_c) + collective_time(gbytes * pe, ne_n, bw_de,
                                                                       alpha_c)
    ag = collective_time(BF16 * pd, nd_n, bw_dd, alpha_c) + collective_time(BF16 * pe, ne_n, bw_de,
                                                                     alpha_c)
    ov_dp = col(c["dp_comm_overlap"])
    stage_mb = sum(bucket.values())
    bwd_s = stage_mb - fwd_s
    # interleaved: every chunk's receive is a synchronisation the overlap cannot hide (the
    # next chunk's kernels wait on it): one latency per chunk and direction
    pp_sync = np.where(w.schedule.vpp > 1, w.pp.sends * alpha, 0.0)
    bucket["pp_p2p"] = valid * (pipeline_p2p(col(t_send), col(w.pp.sends), col(w.schedule.vpp),
                                             fwd_s, bwd_s, col(c["pp_comm_overlap"]))
                                + col(pp_sync))
    stage_mb = stage_mb + bucket["pp_p2p"]
    fsdp = col(w.dp.fsdp)
    dist = col(w.dp.dist_opt)
    fsdp_mb = fsdp * (
        np.maximum(0.0, ag - ov_dp * fwd_s) + np.maximum(0.0, ag + rs - ov_dp * bwd_s)
    )
    bucket["dp_comm"] = fsdp_mb * valid
    stage_mb = stage_mb + bucket["dp_comm"]
    # the last gradient bucket and the next step's first parameter bucket are exposed
    # (dp_exposed); chunk 0 is bucketed, later chunks are one bucket each but finish earlier
    bucket_p = col(w.dp.bucket_params)
    vv = col(w.schedule.vpp)
    bd = np.minimum(bucket_p, pd / vv)
    be = np.minimum(bucket_p, pe / vv)
    rs_last = collective_time(gbytes * bd, nd_n, bw_dd, alpha_c) + collective_time(gbytes * be, ne_n,
                                                                            bw_de, alpha_c)
    ag_first = collective_time(BF16 * bd, nd_n, bw_dd, alpha_c) + collective_time(BF16 * be, ne_n,
                                                                           bw_de, alpha_c)
    # the window is shared with the layer traffic on the same links (dp_window)
    busy_f, busy_b = link_busy
    dp_on_nic = col(1.0 - w.dp.dense_intra)
    win_b = np.maximum(0.0, bwd_s - np.where(dp_on_nic > 0, busy_b[1], busy_b[0]))
    win_f = np.maximum(0.0, fwd_s - np.where(dp_on_nic > 0, busy_f[1], busy_f[0]))
    dp_step = (1 - fsdp) * np.where(
        dist > 0,
        dp_exposed(rs, rs_last, win_b, ov_dp) + dp_exposed(ag, ag_first, win_f, ov_dp),
        dp_exposed(2 * rs, 2 * rs_last, win_b, ov_dp),
    )
    sharded = (dist > 0) | (fsdp > 0)
    local = np.where(sharded, pd / nd_n + pe / ne_n, pd + pe)
    opt = OPTIMIZER_BYTES_PER_PARAM * local / col(hbm)
    tail = (dp_step + opt) * valid

    # ---- pipeline schedule
    m = w.schedule.m
    stage_mb = stage_mb * valid
    crit, bubble = pipeline_bubble(stage_mb, m, w.schedule.vpp, w.schedule.bubble_factor)
    rows = np.arange(stage_mb.shape[0])
    last = np.argmax(tail, axis=1)
    out: dict[str, np.ndarray] = {}
    for key in BREAKDOWN:
        if key in bucket:
            out[key] = m * bucket[key][rows, crit]
    out["pipeline_bubble"] = bubble
    out["dp_comm"] = out["dp_comm"] + dp_step[rows, last]
    out["optimizer"] = opt[rows, last]
    out["step_overhead"] = np.broadcast_to(np.asarray(c["step_overhead_s"], dtype=np.float64),
                                           m.shape).copy()
    out = {key: out[key] for key in BREAKDOWN}
    total = np.zeros_like(m)
    for key in BREAKDOWN:
        total = total + out[key]
    out["step_time_s"] = total
    out["critical_stage"] = crit
    return out
