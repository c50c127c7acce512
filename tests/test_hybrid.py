"""Hybrid Mamba models (issue 10, part 4): the workload inventory's Mamba-2 layer kind, the
Nemotron-H / Nemotron 3 catalog entries, their legality rules, pipeline split, import, export
and search. Expected numbers are worked by hand from the shapes in the docstrings of
``oracle/params.py::mamba_params`` and ``oracle/inventory.py::mamba_tensors``."""

from __future__ import annotations

import json

import pytest

from tests.conftest import resolved, setting
from tune_cp.config.specs import ConfigError, ParallelConfig, Recompute, TrainingSpec
from tune_cp.formats.export import to_megatron_args, to_primus_overrides
from tune_cp.formats.parse import parse_megatron_args
from tune_cp.formats.runs import read_runs, scored_rows
from tune_cp.oracle import params as P
from tune_cp.oracle.catalog import load_model
from tune_cp.oracle.layers import KINDS, Block, LayerKind, kind_blocks, layer_kinds
from tune_cp.oracle.memory import activation_units, stage_counts
from tune_cp.solver.rules import check, mamba_cp_ok

H8 = "nemotron-h-8b"


def test_nemotron_h_8b_parameters_hand_worked():
    """Nemotron-H 8B (h 4096, 52 layers: 24 Mamba-2, 4 attention, 24 MLP; vocab 131,072 untied):
    embedding and output 2 x 131,072 x 4,096 = 1,073,741,824, final norm 4,096; one Mamba layer
    = norm 4,096 + in_proj 4,096 x (2 x 8,192 + 2 x 8 x 128 + 128 = 18,560) = 76,021,760 + conv
    (8,192 + 2,048) x 5 = 51,200 + A_log, dt_bias, D 3 x 128 + gated-norm 8,192 + out_proj
    8,192 x 4,096 = 33,554,432 -> 109,640,064; one attention layer = 4,096 + 4,096 x 48 x 128 +
    4,096 x 4,096 = 41,947,136; one MLP layer (squared ReLU, not gated) = 4,096 + 2 x 4,096 x
    21,504 = 176,164,864. Total 8,100,852,736: "8B" as published (nvidia/Nemotron-H-8B-Base-8K)."""
    m = load_model(H8)
    assert P.mamba_params(m) == 109_640_064
    assert P.attention_params(m) == 41_947_136
    assert P.dense_mlp_params(m) == 176_164_864
    total = 2 * 131_072 * 4_096 + 4_096 + 24 * 109_640_064 + 4 * 41_947_136 + 24 * 176_164_864
    assert total == 8_100_852_736
    assert P.total_params(m) == total


@pytest.mark.parametrize(("name", "total_b", "active_b"), [
    ("nemotron-h-8b", 8, 8), ("nemotron-h-47b", 47, 47), ("nemotron-h-56b", 56, 56),
    # Nemotron 3: "30B-A3B" (31.6B total, 3.5B active on its model card), "120B-A12B",
    # "550B-A55B" (Hugging Face names)
    ("nemotron-3-nano", 31.6, 3.5), ("nemotron-3-super", 120, 12), ("nemotron-3-ultra", 550, 55),
])
def test_catalog_sizes_match_the_published_names(name, total_b, active_b):
    m = load_model(name)
    assert P.total_params(m) / 1e9 == pytest.approx(total_b, rel=0.02)
    assert P.active_params(m) / 1e9 == pytest.approx(active_b, rel=0.08)  # names round down


def test_hf_nemotron_h_config_reads_as_the_catalog_entry(tmp_path):
    """A NemotronHForCausalLM config.json (transformers NemotronHConfig keys) gives the catalog's
    Nemotron-H 8B shapes and parameter count."""
    cfg = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
           "hybrid_override_pattern": load_model(H8).hybrid_pattern, "hidden_size": 4096,
           "num_hidden_layers": 52, "num_attention_heads": 32, "num_key_value_heads": 8,
           "head_dim": 128, "intermediate_size": 21504, "mlp_hidden_act": "relu2",
           "ssm_state_size": 128, "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8,
           "conv_kernel": 4, "chunk_size": 128, "vocab_size": 131072,
           "tie_word_embeddings": False, "layer_norm_epsilon": 1e-5}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = load_model(str(path))
    assert m.mamba == load_model(H8).mamba and m.hybrid_pattern == load_model(H8).hybrid_pattern
    assert P.total_params(m) == 8_100_852_736
    bad = dict(cfg, hybrid_override_pattern="M-M")
    path.write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match="has 3 layers, num_hidden_layers is 52"):
        load_model(str(path))


def test_mamba_saved_bytes_hand_worked():
    """One Mamba layer of Nemotron-H 8B, mbs 1, seq 8192, bf16 (t = 8192 tokens, h 4096,
    d_inner 8192, G 8, N 128, H 128): norm input 2 t h = 67,108,864, rstd 4 t = 32,768, in_proj
    input 2 t h = 67,108,864, zxBCdt 2 t (2 x 8192 + 2 x 8 x 128 + 128) = 304,087,040, out_x,
    the gated norm's input and out_proj's input 2 t d_inner = 134,217,728 each, the gated norm's
    rstd 4 t G = 262,144: 841,252,864. tp 2 with sequence parallelism: t_sp 4096 for the norm
    and in_proj input (33,554,432 each, rstd 16,384), zxBCdt 2 t (8192 + 1024 + 64) =
    152,043,520, three 2 t 4096 = 67,108,864, rstd 4 t 4 = 131,072: 420,626,432."""
    m, cl, tr = setting(H8, "h100", 1, 8192, 8)
    au = activation_units(m, tr, resolved(m, cl, tr, tp=1))
    assert au.mamba_layer == 841_252_864
    au2 = activation_units(m, tr, resolved(m, cl, tr, tp=2))
    assert au2.mamba_layer == 420_626_432
    # the MLP-only and attention-only layers of a hybrid model carry no second block
    assert kind_blocks(m, LayerKind.DENSE) == (Block.MLP,)
    assert kind_blocks(m, LayerKind.ATTENTION) == (Block.ATTENTION,)
    assert au.dense_layer < activation_units(*_as_transformer(m, tr)).dense_layer


def _as_transformer(m, tr):
    """The same shapes as a plain transformer (every layer attention + MLP)."""
    t = m.model_copy(update={"hybrid_pattern": "", "mamba": None})
    cl = setting(H8, "h100", 1, 8192, 8)[1]
    return t, tr, resolved(t, cl, tr, tp=1)


def test_hybrid_pattern_splits_evenly_over_stages():
    """pp 4 over the 52-layer pattern: 13 consecutive characters per stage, each
    'M-M-M-M*-M-M-' rotated: 6 Mamba, 6 MLP and 1 attention layer; the embedding on stage 0, the
    output on stage 3 (Megatron-Core mamba_block.py: num_layers // pp per rank)."""
    m, cl, tr = setting(H8, "h100", 4, 8192, 64)
    cfg = resolved(m, cl, tr, pp=4)
    counts = stage_counts(m, cfg)
    assert [(c.mamba_layers, c.dense_layers, c.attention_layers, c.moe_layers) for c in counts] \
        == [(6, 6, 1, 0)] * 4
    assert [c.has_embedding for c in counts] == [1, 0, 0, 0]
    assert [c.has_output for c in counts] == [0, 0, 0, 1]
    assert layer_kinds(m)[:5] == (LayerKind.MAMBA, LayerKind.DENSE, LayerKind.MAMBA,
                                  LayerKind.DENSE, LayerKind.MAMBA)
    assert KINDS.index(LayerKind.MAMBA) == 3
    # 52 layers do not split over 3 stages; no virtual stages; no full recomputation
    for kw, family, text in (
            ({"pp": 3}, "pipeline_split", "must split evenly over pp x vpp"),
            ({"pp": 2, "vpp": 2}, "pipeline_split", "without virtual stages"),
            ({"recompute": Recompute.FULL}, "recompute", "no checkpointed forward")):
        bad = resolved(m, cl, tr, **kw)
        got = [v for v in check(_ctx(m, cl, tr, bad)) if v.rule == family]
        assert got and text in got[0].message, (kw, got)


def _ctx(m, cl, tr, cfg):
    from tune_cp.solver.rules import RuleContext

    return RuleContext(model=m, cluster=cl, training=tr, cfg=cfg)


def test_mamba_tensor_parallel_rule_names_heads_groups_and_legal_tp():
    """Nemotron 3 Nano: 32 attention heads, 2 KV heads, 64 Mamba heads, 8 Mamba groups. tp 16
    divides the attention heads and is a multiple of the KV heads but not a divisor of the 8
    groups (Megatron-Core mamba_mixer.py asserts ngroups % tp == 0)."""
    m, cl, tr = setting("nemotron-3-nano", "gb200", 4, 8192, 64, gpn=4)
    v = [x for x in check(_ctx(m, cl, tr, resolved(m, cl, tr, tp=16, ep=1)))
         if x.rule == "tensor_parallel"]
    assert len(v) == 1
    assert v[0].message == ("tp (16) must divide the 8 Mamba groups (mamba num_groups) of "
                            "nemotron-3-nano; choose tp in {1, 2, 4, 8}")


def test_mamba_context_parallel_rule():
    """Megatron-Core mamba_context_parallel.py: H / tp divisible by cp; G / tp divisible by cp,
    or cp divisible by G / tp (groups replicated). Nemotron-H 8B: H 128, G 8."""
    m = load_model(H8)
    assert mamba_cp_ok(m, 8, 16)  # 16 heads per tp rank, 1 group (replicated over cp)
    assert not mamba_cp_ok(m, 8, 32)  # 16 heads do not split over 32 CP ranks
    assert mamba_cp_ok(m, 2, 8)  # 64 heads; 4 groups, 8 % 4 == 0
    assert not mamba_cp_ok(m, 2, 3)
    assert mamba_cp_ok(m, 1, 16)  # 128 heads, 8 groups: 16 % 8 == 0
    m2, cl, tr = setting(H8, "h100", 8, 8192, 64)
    v = [x for x in check(_ctx(m2, cl, tr, resolved(m2, cl, tr, tp=8, cp=32)))
         if x.rule == "sequence_length"]
    assert v and "Mamba heads" in v[0].message


def test_megatron_export_of_a_hybrid_model():
    """pretrain_hybrid.py with --hybrid-layer-pattern (MTP depths after '/'), the --mamba-*
    dimensions, --moe-latent-size and the hybrid stack spec; read back to the same model."""
    m, cl, tr = setting("nemotron-3-super", "gb200", 16, 8192, 512, gpn=4)
    text = to_megatron_args(m, cl, tr, ParallelConfig(tp=2, ep=64))
    assert "pretrain_hybrid.py" in text
    assert f"--hybrid-layer-pattern '{m.hybrid_pattern}/*E'" in text
    for flag in ("--mamba-state-dim 128", "--mamba-head-dim 64", "--mamba-num-groups 8",
                 "--mamba-num-heads 128", "--moe-latent-size 1024",
                 "--spec megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec"):
        assert flag in text, flag
    back = parse_megatron_args(text).require_model()
    assert back.hybrid_pattern == m.hybrid_pattern and back.num_mtp_layers == 1
    assert back.mamba == m.mamba and back.moe_latent_size == 1024


def test_primus_export_refuses_hybrid_models():
    m, cl, tr = setting(H8, "mi355x", 1, 8192, 64)
    with pytest.raises(ConfigError, match="hybrid Mamba model; Primus"):
        to_primus_overrides(m, cl, tr, ParallelConfig(tp=2))


def test_pipe_separated_patterns_are_refused():
    text = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --vocab-size 32000 "
            "--hybrid-layer-pattern 'M-|M*'")
    with pytest.raises(ConfigError, match="pipeline-stage separators"):
        parse_megatron_args(text).require_model()


def test_published_nemotron_3_rows_are_representable():
    """Every Nemotron 3 Nano / Super row of published_runs.csv (Megatron-Bridge performance
    summary) is representable; their projections are reported in the issue's note."""
    rows = [r for r in scored_rows(read_runs("benchmarks/published_runs.csv"))
            if r.model_name in ("Nemotron_3_Nano", "Nemotron_3_Super")]
    assert len(rows) == 22
    assert all(r.representable for r in rows), [r.reason for r in rows if not r.representable]
    # scored apart, not fitted on (formats/runs.py::NOT_FITTED): no Mamba term is fitted yet
    assert not any(r.fitted for r in rows)
    supers = [r for r in rows if r.model_name == "Nemotron_3_Super"]
    assert all(r.model and r.model.num_mtp_layers == 2 for r in supers)  # the Bridge recipe


def test_search_on_nemotron_h_56b_is_legal():
    """tune-cp --model nemotron-h-56b --gpu h100 --nodes 8: a legal answer (every rule holds,
    vpp 1, no full recomputation) that fits."""
    from tune_cp.agent.search import SearchOptions, search
    from tune_cp.solver.check import check_configuration

    m, cl, tr = setting("nemotron-h-56b", "h100", 8, 8192, 768)
    r = search(m, cl, tr, SearchOptions())
    best = r.best.config
    assert best.vpp == 1 and best.recompute is not Recompute.FULL
    out = check_configuration(m, cl, tr, best)
    assert out.legal and out.memory.peak_bytes <= out.limit_bytes
    assert m.mamba is not None and m.mamba.num_heads % best.tp == 0
    assert TrainingSpec(seq_len=8192, global_batch_size=768) == tr


@pytest.mark.parametrize("name", ["llama3-8b", "mixtral-8x7b", "deepseek-v3", "nemotron-h-8b",
                                  "nemotron-3-nano", "nemotron-3-super"])
def test_inventory_gemm_weights_are_the_block_parameters(name):
    """The inventory's GEMMs of each block (oracle/inventory.py::block_gemms, which the time
    model runs) hold exactly the block's matmul parameters of oracle/params.py (tp = ep = etp =
    1): the block parameters less its norms and small vectors (MLA latent norms, router expert
    bias, Mamba conv, A_log, dt_bias, D and gated-norm scale)."""
    import numpy as np

    from tune_cp.oracle.inventory import block_gemms

    m = load_model(name)
    one = np.ones(1)
    ops = block_gemms(m, 4096 * one, 4096 * one, one, one, one)

    def weights(block):
        return int(sum(float(np.asarray(g.n * g.k * g.count).item()) for g in ops[block]))

    h = m.hidden_size
    attn = P.attention_params(m) - P.norm_params(m, h)
    if m.mla is not None:
        attn -= P.norm_params(m, m.mla.kv_lora_rank)
        if m.mla.q_lora_rank:
            attn -= P.norm_params(m, m.mla.q_lora_rank)
    assert weights(Block.ATTENTION) == attn
    if m.num_dense_layers_effective:
        assert weights(Block.MLP) == P.dense_mlp_params(m) - P.norm_params(m, h)
    if m.is_moe:
        moe = P.moe_block_params(m) - P.norm_params(m, h)
        moe -= m.num_experts if m.router_expert_bias else 0
        assert weights(Block.MOE) == moe
    if m.mamba is not None:
        mb = m.mamba
        small = ((mb.d_inner + 2 * mb.num_groups * mb.state_dim) * (mb.conv_kernel + 1)
                 + 3 * mb.num_heads + mb.d_inner)
        assert weights(Block.MAMBA) == P.mamba_params(m) - P.norm_params(m, h) - small


# --------------------------------------------------------------- s3-qa regressions (one each)

SMALL_H = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
           "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 8,
           "num_key_value_heads": 2, "intermediate_size": 4096, "vocab_size": 32000,
           "max_position_embeddings": 4096, "hybrid_override_pattern": "M-M*M-M-",
           "ssm_state_size": 64, "mamba_head_dim": 64, "mamba_num_heads": 32, "n_groups": 4,
           "conv_kernel": 4, "chunk_size": 128, "mlp_hidden_act": "relu2",
           "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False}


@pytest.mark.parametrize(("change", "message"), [
    ({"hybrid_override_pattern": None},
     "a nemotron_h config.json needs 'hybrid_override_pattern', which is missing"),
    # before: "hybrid_pattern has ['X']" (the internal field, not the config.json key)
    ({"hybrid_override_pattern": "M-M*X-M-"},
     "'hybrid_override_pattern' 'M-M*X-M-' has 'X'; each character is one of M (Mamba), "
     "* (attention), - (MLP), E (MoE)"),
    # before: "... which is missing" for a pattern that is present but not a string
    ({"hybrid_override_pattern": 12},
     "'hybrid_override_pattern' must be a string of M * - E (one per layer), got 12"),
    ({"hybrid_override_pattern": "M-M*M-"},
     "hybrid_override_pattern has 6 layers, num_hidden_layers is 8; they must agree"),
    # before: "num_heads: Input should be greater than or equal to 1 (got -32)" (MambaSpec's
    # field names), and mamba_num_heads 0 silently became the default 128
    ({"mamba_num_heads": -32}, "'mamba_num_heads' must be a positive integer, got -32"),
    ({"mamba_num_heads": 0}, "'mamba_num_heads' must be a positive integer, got 0"),
    ({"ssm_state_size": -64}, "'ssm_state_size' must be a positive integer, got -64"),
    ({"n_groups": -4}, "'n_groups' must be a positive integer, got -4"),
    ({"chunk_size": -1}, "'chunk_size' must be a positive integer, got -1"),
    # before: "num_experts: Input should be greater than or equal to 0 (got -8)"
    ({"hybrid_override_pattern": "MEM*MEME", "n_routed_experts": -8, "num_experts_per_tok": 2,
      "moe_intermediate_size": 512}, "'n_routed_experts' must be a positive integer, got -8"),
])
def test_malformed_nemotron_h_config_is_one_line_exit_2(tmp_path, run_cli, change, message):
    cfg = {k: v for k, v in (SMALL_H | change).items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, out, err = run_cli("check", "--model", path, "--gpu", "h100", "--nodes", "1")
    assert code == 2 and out == ""
    assert err == f"tune-cp: error: model file '{path}': {message}\n"


def test_small_nemotron_h_config_checks(tmp_path, run_cli):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL_H))
    code, out, _ = run_cli("check", "--model", path, "--gpu", "h100", "--nodes", "1",
                           "--seq-len", "4096", "--gbs", "64")
    assert code == 0 and "verdict: legal, fits" in out


def test_hybrid_space_offers_no_virtual_stages_nor_full_recompute():
    """solver/space.py::default_space no longer offers vpp > 1 or full recomputation for a
    hybrid model (the rules reject all of them): nemotron-h-8b on 1 x 8 h100 (seq 8192, gbs
    768) goes from 94,976 candidates (25,652 removed by pipeline_split, 3,952 by recompute; the
    vpp domain of a transformer with 52 layers: 1, 2, 3, 9, 13, 26, 27) to 256, with the same 39
    feasible configurations (36 under the 5% margin before issue 28)."""
    from tune_cp.solver.feasible import enumerate_feasible
    from tune_cp.solver.space import (
        NO_RECOMPUTE,
        RecomputeOption,
        default_space,
        max_layers_per_chunk,
        recompute_layer_values,
        vpp_domain,
    )

    m, cl, tr = setting(H8, "h100", 1, 8192, 768)
    sp = default_space(m, cl, tr)
    assert sp.vpp == (1,) and all(r.kind is not Recompute.FULL for r in sp.recompute)
    vpp = vpp_domain(m, sp.pp)
    full = [RecomputeOption(kind=Recompute.FULL, layers=k)
            for k in recompute_layer_values(max_layers_per_chunk(m, sp.pp, vpp))]
    old = sp.model_copy(update={"vpp": vpp, "recompute": (NO_RECOMPUTE, *full)})
    before, after = enumerate_feasible(m, cl, tr, old), enumerate_feasible(m, cl, tr, sp)
    assert (before.space_size, after.space_size) == (94_976, 256)
    assert before.removed["pipeline_split"] == 25_652 and before.removed["recompute"] == 3_952
    assert len(before.configs) == len(after.configs) == 39
    assert {f.config for f in before.configs} == {f.config for f in after.configs}


def test_vpp_constraint_on_a_hybrid_says_why(run_cli):
    """--constraint 'vpp == 2' on a hybrid: the empty space names the constraint and why vpp
    is always 1 (with vpp 1 the only offered value the core is the constraint alone)."""
    code, out, err = run_cli("--model", H8, "--gpu", "h100", "--nodes", "1",
                             "--constraint", "vpp == 2")
    assert code == 1
    assert ("conflicting rules: extra: vpp == 2; nemotron-h-8b is a hybrid Mamba model: "
            "Megatron-Core splits its layer pattern over pp stages without virtual stages (rule "
            "pipeline_split), so vpp is 1 in every legal configuration; fix: without constraint "
            "'vpp == 2'") in out + err


def test_flex_dispatcher_best_is_ranked_and_printed_reproducibly(run_cli):
    """nemotron-3-nano on 4 x 8 h100: the best uses the flex dispatcher. Before issue 27 only the
    seed phase reached it (the ranked space held alltoall only) and the table's starred row was
    another configuration; now every MoE layout is ranked with its fastest legal backend preset
    (agent/search.py), so the exhaustive ranking finds it, the best line names the backend and
    the starred row is the best."""
    # the 5% margin of before issue 28 keeps the case (with the derived 0.003 the exhaustive
    # ranking holds a better answer at the edge of memory)
    code, out, _ = run_cli("--model", "nemotron-3-nano", "--gpu", "h100", "--nodes", "4",
                           "--memory-margin", "0.05")
    assert code == 0
    best = next(line for line in out.splitlines() if line.startswith("best: "))
    assert best.startswith("best: TP1 PP1 EP16 ETP1 DP32, mbs 1, ga 16, recompute none, "
                           "MoE backend: dispatcher flex (deepep)")
    assert "15,842 tokens/s/GPU" in best
    assert "found by the exhaustive ranking of the feasible set" in out
    starred = next(line for line in out.splitlines() if line.startswith("  1*"))
    assert "TP1 PP1 EP16 ETP1 DP32" in starred and "15,842" in starred
    assert "--dispatcher flex" in next(line for line in out.splitlines()
                                       if line.startswith("  check it: "))


def test_node_scan_steps_through_2k_and_3x2k():
    """solver/explain.py::min_nodes doubles from 2^k or 3 x 2^k after the linear scan (before:
    from the last count tried, 17 -> 34 -> 68, stepping over every count that divides a
    power-of-two batch, so nemotron-3-ultra on 1 x 8 h100 said 'at least 64 nodes' and on
    4 x 8 'at least 256', though 24 and 32 nodes both fit)."""
    from tune_cp.solver.explain import _next_smooth

    assert [_next_smooth(n) for n in (1, 2, 4, 5, 16, 17, 20, 24, 32, 48)] == [
        2, 3, 6, 6, 24, 24, 24, 32, 48, 64]


def test_ultra_too_small_cluster_names_what_fits(run_cli):
    code, out, err = run_cli("--model", "nemotron-3-ultra", "--gpu", "h100", "--nodes", "4")
    assert code == 1
    lines = [ln for ln in out.splitlines() if ln.startswith("no feasible configuration")]
    assert len(lines) == 1 and lines[0].endswith("fix: needs at least 24 nodes of h100 at "
                                                 "this batch")
    code, out, _ = run_cli("--model", "nemotron-3-ultra", "--gpu", "h100", "--nodes", "24")
    assert code == 0


@pytest.mark.parametrize(("pattern", "layers", "message"), [
    # before: accepted, the model silently taken from the pattern (Megatron-Core
    # hybrid_allocate.py raises "The hybrid override pattern is the wrong length")
    ("M-M*", 6, "--hybrid-layer-pattern has 4 layers, --num-layers is 6; they must agree"),
    # before: "hybrid_pattern has ['X']" (the ModelSpec field, not the flag)
    ("M-X*", 4, "--hybrid-layer-pattern 'M-X*' has 'X'; each character is one of M (Mamba), "
                "* (attention), - (MLP), E (MoE)"),
])
def test_megatron_hybrid_pattern_errors_name_the_flag(pattern, layers, message):
    text = (f"--num-layers {layers} --hidden-size 1024 --num-attention-heads 8 "
            f"--vocab-size 32000 --hybrid-layer-pattern '{pattern}'")
    with pytest.raises(ConfigError) as e:
        parse_megatron_args(text).require_model()
    assert message in str(e.value)


def test_megatron_export_reads_back_to_the_same_check(tmp_path, run_cli):
    """check --export megatron, then check --megatron-args of the flags: the same configuration,
    memory and projection (nemotron-h-8b, TP4 on 1 x 8 h100)."""
    args = ("--gpu", "h100", "--nodes", "1")
    code, out, err = run_cli("check", "--model", H8, "--tp", "4", *args, "--export", "megatron")
    assert code == 0 and out.startswith("# tune-cp:")  # the report goes to stderr
    path = tmp_path / "args.sh"
    path.write_text(out)
    code, back, _ = run_cli("check", "--megatron-args", path, *args)
    assert code == 0

    def pick(text):
        return [ln for ln in text.splitlines()
                if ln.startswith(("config:", "total ", "projection:", "verdict:"))]
    assert len(pick(err)) == 4 and pick(back) == pick(err)
    assert "config: TP4 PP1 VPP1 CP1 EP1 ETP4 DP2, mbs 1, ga 384" in back


def test_ssd_intermediate_bytes_hand_worked():
    """The SSD scan's chunk states and C B^T pass through HBM between mamba_ssm's Triton kernels
    (``oracle/inventory.py::mamba_ssd_state_bytes_per_token``). Nemotron 3 Nano (64 heads of
    64, state 128, 8 groups, chunk 128), tp 1: states 64 x 64 x 128 x 12 / 128 = 49,152 B and
    C B^T 8 x 128 x 8 = 8,192 B per token: 57,344. tp 2: 32 heads, 4 groups: 24,576 + 4,096 =
    28,672. The projection charges the scan's backward 3 forward units (recompute + gradient)."""
    from tune_cp.oracle.inventory import SSD_BACKWARD_FORWARD_UNITS, mamba_ssd_state_bytes_per_token

    nano = load_model("nemotron-3-nano")
    assert mamba_ssd_state_bytes_per_token(nano, 1) == 57_344
    assert mamba_ssd_state_bytes_per_token(nano, 2) == 28_672
    assert SSD_BACKWARD_FORWARD_UNITS == 3.0
