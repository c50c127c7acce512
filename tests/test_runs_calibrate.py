"""Published runs as specs, and the calibration of the time constants."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tune_cp.calibration.calibrate import calibrate
from tune_cp.config.specs import (
    ConfigError,
    Dispatcher,
    Fp8Recipe,
    Precision,
    Recompute,
    RecomputeMethod,
)
from tune_cp.formats.runs import (
    parse_row,
    read_runs,
    row_dispatcher,
    row_precision,
    row_recompute,
    row_traits,
)
from tune_cp.oracle.constants import load_calibration
from tune_cp.oracle.projection import project

RUNS = Path(__file__).resolve().parents[1] / "benchmarks" / "published_runs.csv"

COLUMNS = (
    "row_id,source_id,source,framework,model,num_layers,hidden_size,ffn_hidden_size,"
    "num_attention_heads,num_kv_heads,vocab_size,num_experts,moe_topk,expert_ffn_hidden_size,"
    "moe_notes,gpu_type,num_gpus,gpus_per_node,seq_len,global_batch_size,micro_batch_size,tp,pp,"
    "vpp,cp,ep,etp,dp,fsdp,precision,recompute,optimizer_sharding,other_settings,"
    "tokens_per_sec_per_gpu,model_tflops_per_gpu,completeness,notes"
).split(",")


def row(**kw: str) -> dict[str, str]:
    out = dict.fromkeys(COLUMNS, "")
    out.update(kw)
    return out


def test_amd_mixtral_row_becomes_specs() -> None:
    r = parse_row(row(
        row_id="438", source_id="AMD-PRIMUS", framework="Primus (Megatron-LM backend, ROCm)",
        model="Mixtral 8x22B", num_layers="56", hidden_size="6144", ffn_hidden_size="16384",
        num_attention_heads="48", num_kv_heads="8", num_experts="8", moe_topk="2",
        expert_ffn_hidden_size="16384", gpu_type="MI355X", num_gpus="64", gpus_per_node="8",
        seq_len="8192", micro_batch_size="2", tp="1", pp="4", vpp="2", cp="1", ep="8",
        precision="BF16", recompute="yaml: recompute_granularity full, method block, "
        "recompute_num_layers 0", tokens_per_sec_per_gpu="3534",
    ))
    assert r.representable, r.reason
    assert r.model and r.cluster and r.training and r.cfg
    assert r.model.name == "mixtral-8x22b" and r.model.vocab_size == 32768  # from the catalog
    assert r.cluster.gpu.name == "mi355x" and r.cluster.num_nodes == 8
    assert (r.cfg.tp, r.cfg.pp, r.cfg.vpp, r.cfg.ep, r.cfg.etp, r.cfg.dp) == (1, 4, 2, 8, 1, 16)
    assert r.cfg.recompute is Recompute.FULL and r.cfg.recompute_layers == 0  # i.e. none
    assert r.training.global_batch_size == 512  # catalog default (Primus 4-node reference)
    assert r.cfg.ga == 16
    p = project(r.model, r.cluster, r.training, r.cfg)
    assert p.tokens_per_s_per_gpu == pytest.approx(3534, rel=0.10)


def test_unrepresentable_rows_say_why() -> None:
    r = parse_row(row(row_id="1", model="Nemotron_3_5_Lightning", gpu_type="GB200", num_gpus="64",
                      tp="1", pp="1", tokens_per_sec_per_gpu="7040",
                      completeness="partial (arch not transcribed)"))
    assert not r.representable and "not transcribed" in (r.reason or "")
    r = parse_row(row(row_id="2", model="llama3-70b", gpu_type="H100", num_gpus="64", tp="4",
                      pp="2", vpp="interleaved (degree not stated)", seq_len="8192",
                      tokens_per_sec_per_gpu="1"))
    assert not r.representable and "vpp" in (r.reason or "")
    # torchtitan's unnumbered interleaving is its default of 2 stages per rank
    r = parse_row(row(row_id="2", model="llama3-70b", gpu_type="H100", num_gpus="64", tp="4",
                      pp="2", vpp="interleaved (degree not stated)", seq_len="8192",
                      framework="torchtitan (PyTorch FSDP2/DTensor)",
                      tokens_per_sec_per_gpu="1"))
    assert r.representable, r.reason
    assert r.cfg and r.cfg.vpp == 2 and any("stages per rank" in n for n in r.notes)
    r = parse_row(row(row_id="3", model="llama3-70b", gpu_type="H100", num_gpus="64", tp="4",
                      pp="2", seq_len="8192", precision="NVFP4", tokens_per_sec_per_gpu="1"))
    assert not r.representable and "FP4" in (r.reason or "")


def test_catalog_fallbacks_and_defaults() -> None:
    # GPU variant named by prefix; MHA when kv heads are blank; GELU when ffn = 4h
    r = parse_row(row(row_id="4", model="MPT-7b", num_layers="32", hidden_size="4096",
                      ffn_hidden_size="16384", num_attention_heads="32", vocab_size="50368",
                      gpu_type="H100 96GB HBM2e SXM-variant, 500W limit", num_gpus="8",
                      seq_len="2048", global_batch_size="64", micro_batch_size="8", tp="1",
                      pp="1", fsdp="8", framework="MosaicML Composer / llm-foundry (PyTorch FSDP)",
                      precision="amp_bf16", recompute="full activation checkpointing",
                      tokens_per_sec_per_gpu="1"))
    assert r.representable, r.reason
    assert r.cluster and r.cluster.gpu.name == "h100"
    assert r.model and r.model.num_kv_heads == 32 and not r.model.gated_mlp
    assert r.cfg and r.cfg.fsdp and r.cfg.recompute is Recompute.FULL
    assert r.software == "llm-foundry"
    # missing vocabulary from the catalog family (gpt3 -> GPT-2 BPE 50257)
    r = parse_row(row(row_id="5", model="GPT3-5B", num_layers="24", hidden_size="4096",
                      ffn_hidden_size="16384", num_attention_heads="32", num_kv_heads="32",
                      gpu_type="H100-SXM-80GB", num_gpus="64", seq_len="2048",
                      global_batch_size="2048", micro_batch_size="4", tp="1", pp="1",
                      precision="FP8", tokens_per_sec_per_gpu="1"))
    assert r.model and r.model.vocab_size == 50257 and not r.model.gated_mlp


def test_precision_and_recompute_vocabulary() -> None:
    assert row_precision("FP8-CS") == (Precision.FP8, Fp8Recipe.TENSORWISE)
    assert row_precision("FP8-MX (block-scaled) per table footnote") == (
        Precision.FP8, Fp8Recipe.MXFP8)
    assert row_precision("FP8 blockwise (128x128 weights, 1x128 activations)")[1] is (
        Fp8Recipe.BLOCKWISE)
    assert row_precision("NVFP4") == (Precision.FP4, None)
    assert row_precision("FP16 (--fp16, loss scale 8192)") == (Precision.BF16, None)
    assert row_recompute("") == {"recompute": Recompute.NONE}
    full = row_recompute("full (--activations-checkpoint-method uniform)")
    assert full["recompute"] is Recompute.FULL
    assert full["recompute_method"] is RecomputeMethod.UNIFORM
    sel = row_recompute("selective modules [mla_up_proj, mlp] (deepseek/h100)")
    assert sel == {"recompute": Recompute.SELECTIVE, "recompute_modules": ("mla_up_proj", "mlp")}


def test_published_rows_mostly_representable() -> None:
    rows = [r for r in read_runs(RUNS) if r.measured_tokens_per_s_per_gpu]
    share = sum(r.representable for r in rows) / len(rows)
    assert share >= 0.80


def test_calibrate_writes_a_loadable_file_that_beats_priors(tmp_path: Path) -> None:
    with RUNS.open(newline="") as fh:
        reader = csv.DictReader(fh)
        keep = [r for r in reader if r["source_id"] in ("AMD-PRIMUS", "MOSAIC", "NEMO2407")]
    small = tmp_path / "runs.csv"
    with small.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(keep[0]))
        w.writeheader()
        w.writerows(keep)
    out = tmp_path / "calibration.json"
    report = calibrate(small, out)
    assert report.mape <= report.prior_mape
    data = json.loads(out.read_text())
    assert data["fitted_on"]["rows"] == report.rows_used and "date" in data["fitted_on"]
    table = load_calibration(out)
    assert table.constants("cdna3")["gemm_efficiency_bf16"] > 0
    assert table.software_factors("llm-foundry")["gemm_factor"] > 0


def test_calibrate_rejects_a_file_without_runs(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="lacks column"):
        calibrate(bad)


def test_crossval_keeps_each_configuration_in_one_fold() -> None:
    """benchmarks/crossval.py deals configurations, not rows, to folds: the repeats of one
    configuration across releases never sit on both sides of a split."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(
        "tune_cp_crossval", RUNS.parent / "crossval.py")
    assert spec is not None and spec.loader is not None
    cv = importlib.util.module_from_spec(spec)
    sys.modules["tune_cp_crossval"] = cv
    spec.loader.exec_module(cv)
    rows = [r for r in read_runs(RUNS) if r.representable and r.measured_tokens_per_s_per_gpu]
    fold = cv.assign_folds(rows, 5, 0)
    by_key: dict = {}
    for r, f in zip(rows, fold, strict=True):
        by_key.setdefault(cv.config_key(r), set()).add(int(f))
    assert all(len(fs) == 1 for fs in by_key.values())
    assert any(len([r for r in rows if cv.config_key(r) == k]) > 3 for k in by_key)
    assert sorted(set(fold.tolist())) == [0, 1, 2, 3, 4]


def test_power_limit_in_the_gpu_column_sets_tdp() -> None:
    kw = {"row_id": "9", "source_id": "TORCHTITAN", "framework": "torchtitan",
          "model": "Llama 3 8B", "num_gpus": "8", "gpus_per_node": "8", "seq_len": "8192",
          "micro_batch_size": "2", "tp": "1", "pp": "1", "precision": "BF16",
          "tokens_per_sec_per_gpu": "6000"}
    r = parse_row(row(gpu_type="H100 96GB HBM2e SXM-variant, 500W limit (Grand Teton)", **kw))
    assert r.representable and r.cluster and r.cluster.gpu.name == "h100"
    assert r.cluster.gpu.tdp_w == 500
    plain = parse_row(row(gpu_type="H100-SXM-80GB", **kw))
    assert plain.cluster and plain.cluster.gpu.tdp_w == 700
    # 500 W of 700 W: the tensor rate falls by (5/7)^gamma
    a = project(r.model, r.cluster, r.training, r.cfg)
    b = project(plain.model, plain.cluster, plain.training, plain.cfg)
    gamma = load_calibration().constants("hopper")["power_clock_exponent"]
    assert a.breakdown["mlp_gemm"] / b.breakdown["mlp_gemm"] == pytest.approx(
        (7 / 5) ** gamma, rel=1e-9)


def test_run_traits_from_the_framework_and_settings() -> None:
    tt = "torchtitan (PyTorch FSDP2/DTensor)"
    assert not row_traits(row(framework=tt, other_settings="torch.compile; vanilla TP"),
                          "torchtitan").tp_comm_overlap
    assert row_traits(row(framework=tt, other_settings="torch.compile; Async TP"),
                      "torchtitan").tp_comm_overlap
    assert row_traits(row(framework=tt, other_settings="torch.compile + AsyncTP + 1F1B"),
                      "torchtitan").tp_comm_overlap
    assert not row_traits(row(framework=tt, other_settings="torch.compile; 2D"),
                          "torchtitan").tp_comm_overlap
    bridge = row(framework="Megatron-Bridge / Megatron-Core")
    assert row_traits(bridge, "megatron").tp_comm_overlap
    assert row_traits(row(framework="NeMo (1.x/Megatron-Core)"), "megatron").tp_comm_overlap
    mlm = row(framework="Megatron-LM (mcore, TE)", other_settings="flash-attn 2; sequence parallel")
    assert not row_traits(mlm, "megatron").tp_comm_overlap
    mlm_ov = row(framework="Megatron-Core", other_settings="--overlap-grad-reduce --tp-comm-overlap")
    assert row_traits(mlm_ov, "megatron").tp_comm_overlap
    assert row_traits(row(precision="FP8 (float8 rowwise)"), "torchtitan").fp8_rowwise
    assert not row_traits(row(precision="FP8 (torchao Float8) + BF16"), "torchtitan").fp8_rowwise
    # parsed rows carry them
    rows = {r.row_id: r for r in read_runs(RUNS)}
    assert not rows["380"].traits.tp_comm_overlap and rows["381"].traits.tp_comm_overlap
    assert rows["384"].traits.fp8_rowwise and rows["384"].cfg.fp8_recipe is Fp8Recipe.BLOCKWISE


def test_megatron_bridge_moe_rows_use_the_recipes_dispatcher() -> None:
    from tune_cp.oracle.catalog import load_model

    mb = row(framework="Megatron-Bridge / Megatron-Core")
    assert row_dispatcher(mb, load_model("deepseek-v3"), "h100") is Dispatcher.FLEX
    assert row_dispatcher(mb, load_model("qwen3-30b-a3b"), "h100") is Dispatcher.FLEX
    assert row_dispatcher(mb, load_model("qwen3-235b-a22b"), "b300") is Dispatcher.ALLTOALL
    assert row_dispatcher(mb, load_model("qwen3-235b-a22b"), "h100") is Dispatcher.ALLTOALL
    assert row_dispatcher(mb, load_model("qwen3-235b-a22b"), "gb300") is Dispatcher.FLEX
    primus = row(framework="Primus (Megatron-LM backend, ROCm)")
    assert row_dispatcher(primus, load_model("mixtral-8x22b"), "mi355x") is Dispatcher.ALLTOALL
    assert row_dispatcher(mb, load_model("llama3-70b"), "gb300") is Dispatcher.ALLTOALL
    rows = {r.row_id: r for r in read_runs(RUNS)}
    assert rows["285"].cfg.dispatcher is Dispatcher.FLEX  # DeepSeek-V3 H100, EP64 over 8 nodes
    assert rows["438"].cfg.dispatcher is Dispatcher.ALLTOALL


def test_shipped_calibration_keeps_published_mfu_ceilings() -> None:
    # the best measured MFU per class (dense/moe, architecture, precision) of the published
    # rows: Hopper BF16 dense is MPT-30B on H100 (row 393, 42.1%), below the 56% a 405B plan
    # projects at 32-64 nodes, which therefore carries a note
    from tune_cp.oracle.constants import load_calibration
    from tune_cp.oracle.projection import mfu_note

    table = load_calibration()
    ceil = table.fitted_on["mfu_ceilings"]["dense/hopper/bf16"]
    assert (ceil["row"], ceil["model"], ceil["gpu"]) == ("393", "MPT-30b", "h100")
    assert ceil["mfu"] == pytest.approx(0.4209, abs=5e-4)
    note = mfu_note(0.557, {"mlp_gemm": 0.7, "pipeline_bubble": 0.01}, 1.0, False, "hopper",
                    "bf16", table)
    assert note.startswith("MFU 55.7% is above the best published 42.1% for dense/hopper/bf16")
    assert mfu_note(0.40, {"mlp_gemm": 0.7}, 1.0, False, "hopper", "bf16", table) == ""


def test_mfu_of_a_class_without_a_published_run_carries_a_note() -> None:
    # no published run is dense BF16 on Blackwell (the Blackwell BF16 rows are GPT-OSS MoE): a
    # projection of that class has no ceiling to be held to, whatever its MFU, and says so,
    # naming the ceilings that Blackwell does have; a user's calibration without ceilings
    # (from logs) prints nothing
    from dataclasses import replace

    from tune_cp.oracle.constants import load_calibration
    from tune_cp.oracle.projection import mfu_note

    table = load_calibration()
    ceilings = table.fitted_on["mfu_ceilings"]
    assert "dense/blackwell/bf16" not in ceilings and "dense/blackwell/fp8" in ceilings
    note = mfu_note(0.30, {"mlp_gemm": 0.6, "pipeline_bubble": 0.05, "tp_comm": 0.1}, 1.0,
                    False, "blackwell", "bf16", table)
    assert note.startswith("MFU 30.0% has no published run of class dense/blackwell/bf16")
    fp8 = ceilings["dense/blackwell/fp8"]
    assert f"dense/blackwell/fp8 {100 * fp8['mfu']:.1f}%, row {fp8['row']}" in note
    assert "GEMMs taking 60% of the step" in note and "a 5% pipeline bubble" in note
    assert "10% exposed communication" in note
    assert "cdna" not in note and "hopper" not in note  # only the same architecture's ceilings
    bare = replace(table, fitted_on={})
    assert mfu_note(0.30, {"mlp_gemm": 0.6}, 1.0, False, "blackwell", "bf16", bare) == ""


def test_plan_names_a_class_without_a_published_run() -> None:
    from types import SimpleNamespace

    from tune_cp.cli import plan_mfu_note
    from tune_cp.oracle.catalog import load_model

    point = SimpleNamespace(feasible=True, mfu=0.5, nodes=32)
    dense = load_model("llama3.1-405b")
    note = plan_mfu_note(dense, SimpleNamespace(gpu="b200", points=[point]), "bf16", None)
    assert note.startswith("the MFU of these rows has no published run of class "
                           "dense/blackwell/bf16 to bound it (published on blackwell: ")
    # a class with a ceiling and rows below it: no note
    low = SimpleNamespace(feasible=True, mfu=0.30, nodes=16)
    assert plan_mfu_note(dense, SimpleNamespace(gpu="h100", points=[low]), "bf16", None) == ""
    # nothing feasible: nothing to bound
    none = SimpleNamespace(feasible=False, mfu=0.0, nodes=4)
    assert plan_mfu_note(dense, SimpleNamespace(gpu="b200", points=[none]), "bf16", None) == ""


def test_gpt_oss_dispatcher_by_release():
    """GPT-OSS's Megatron-Bridge recipes set no flex backend before 7260d6214 (2026-03-23): the
    25.11 GB200 / B200 rows and the 26.02.01 B300 row ran the provider's alltoall dispatcher;
    the B300 rows from 26.04 the flex (HybridEP) one."""
    rows = {r.row_id: r for r in read_runs(RUNS)}
    assert [rows[i].cfg.dispatcher for i in ("244", "252", "179")] == [Dispatcher.ALLTOALL] * 3
    assert [rows[i].cfg.dispatcher for i in ("135", "89", "46")] == [Dispatcher.FLEX] * 3
