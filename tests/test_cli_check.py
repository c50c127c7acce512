"""`tune-cp check`, `models`, `gpus` end to end: verdicts, exit codes, exact error text."""

from __future__ import annotations

REF = ("check", "--model", "mixtral-8x22b", "--gpu", "mi355x", "--nodes", "4", "--seq-len", "8192",
       "--gbs", "512", "--mbs", "1", "--tp", "1", "--pp", "4", "--vpp", "2", "--ep", "8",
       "--recompute", "full", "--recompute-layers", "1")


def test_amd_reference_fits(run_cli, run_json):
    code, out, _ = run_cli(*REF)
    assert code == 0
    # 254.8 GiB of 288: legal, but above 288 / 1.18 (the largest measured / predicted peak of
    # the Megatron family, oracle/catalog/memory_spread.json): at the edge (issue 28)
    assert "stage 3" in out and "verdict: legal, at the edge" in out
    code, data = run_json(*REF)
    assert code == 0 and data["legal"] is True and data["violations"] == []
    mem = data["memory"]
    assert mem["fits"] is True and len(mem["stages"]) == 4
    for s in mem["stages"]:
        assert {"weights", "gradients", "optimizer", "activations"} <= set(s["terms"])
    assert mem["peak_bytes"] == max(s["total_bytes"] for s in mem["stages"])
    assert mem["hbm_bytes"] == 288 * 2**30 and mem["dominant_term"] == "activations"
    assert data["config"] | {} == data["config"] and data["config"]["dp"] == 8
    assert data["config"]["ga"] == 64 and data["config"]["recompute_layers"] == 1


def test_no_sharding_on_mi300x_is_out_of_memory(run_cli, run_json):
    args = ("check", "--model", "mixtral-8x22b", "--gpu", "mi300x", "--nodes", "4", "--gbs", "512")
    code, out, _ = run_cli(*args)
    assert code == 1 and "verdict: out of memory" in out
    assert "model state dominates (weights" in out and "optimizer" in out
    code, data = run_json(*args)
    assert data["legal"] is False and data["memory"]["fits"] is False
    assert data["memory"]["dominant_group"] == "model_state"
    assert data["violations"][0]["rule"] == "hbm"


def test_tp16_names_gpus_per_node(run_json):
    code, data = run_json("check", "--model", "mixtral-8x22b", "--nodes", "4", "--tp", "16",
                          "--pp", "2")
    assert code == 1 and data["legal"] is False
    msgs = [v["message"] for v in data["violations"]]
    assert msgs == ["tp (16) must be at most gpus_per_node (8) so tensor-parallel traffic stays on "
                    "the scale-up links; choose tp in {1, 2, 4, 8}"]


def test_tp3_names_the_kv_heads(run_json):
    code, data = run_json("check", "--model", "mixtral-8x22b", "--nodes", "4", "--tp", "3")
    assert code == 1
    kv = [v for v in data["violations"] if v["rule"] == "tensor_parallel"]
    assert kv and "tp (3) must divide the 8 KV heads (num_kv_heads) of mixtral-8x22b" in kv[0]["message"]
    assert "choose tp in {1, 2, 4, 8}" in kv[0]["message"]


def test_bad_input_is_one_line_exit_2(run_cli, tmp_path):
    code, out, err = run_cli("check", "--model", "mixtral-8x22", "--nodes", "4")
    assert code == 2 and out == ""
    assert err.startswith("tune-cp: error: unknown model 'mixtral-8x22': did you mean mixtral-8x22b, "
                          "mixtral-8x7b? choose one of mixtral-8x7b, mixtral-8x22b, llama2-7b, ")
    assert err.endswith(", or pass a path to a config.json\n") and err.count("\n") == 1
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    code, _, err = run_cli("check", "--model", str(bad), "--nodes", "1")
    assert code == 2 and err.count("\n") == 1 and "is not valid JSON" in err
    code, _, err = run_cli("check", "--model", "llama3-8b", "--nodes", "-2")
    assert code == 2 and err == ("tune-cp: error: Invalid value for '--nodes': -2 is not in the "
                                 "range 1<=x<=1048576.\n")
    code, _, err = run_cli("check", "--model", "llama3-8b", "--nodes", "1", "--tp", "0")
    assert code == 2 and "'--tp': 0 is not in the range" in err
    code, _, err = run_cli("check", "--model", "llama3-8b", "--nodes", "99999999999")
    assert code == 2 and "'--nodes'" in err and err.count("\n") == 1


def test_gbs_not_divisible(run_cli):
    code, out, err = run_cli("check", "--model", "mixtral-8x22b", "--nodes", "4", "--pp", "4",
                             "--ep", "8", "--gbs", "100")
    # a broken rule (issue 16: exit 1, not 2), reported as the verdict
    assert code == 1 and err == ""
    assert ("verdict: illegal\n  [batch] global batch (100) is not divisible by mbs x dp "
            "(1 x 8 = 8); choose gbs in {96, 104}\n") in out
    code, out, _ = run_cli("check", "--model", "mixtral-8x22b", "--nodes", "4", "--pp", "4",
                           "--ep", "8", "--gbs", "200", "--mbs", "2")
    assert code == 1 and ("[batch] global batch (200) is not divisible by mbs x dp (2 x 8 = 16); "
                          "choose gbs in {192, 208} or mbs in {1, 5, 25}\n") in out


def test_overhead_override(run_json):
    base = ("check", "--model", "llama3-8b", "--gpu", "h100", "--nodes", "1", "--tp", "2")
    _, d0 = run_json(*base)
    _, d1 = run_json(*base, "--overhead", "runtime_context_bytes=3GiB", "--overhead",
                     "fragmentation=0")
    t0, t1 = d0["memory"]["stages"][0]["terms"], d1["memory"]["stages"][0]["terms"]
    assert t1["runtime_context"] == 3 * 2**30 and t1["fragmentation"] == 0
    assert t0["runtime_context"] == 2**30 and t0["fragmentation"] > 0


def test_overhead_bad_name(run_cli):
    code, _, err = run_cli("check", "--model", "llama3-8b", "--nodes", "1", "--overhead", "foo=1")
    assert code == 2 and "expected NAME=VALUE with NAME in runtime_context_bytes" in err


def test_models_json_counts(run_json):
    code, data = run_json("models")
    assert code == 0
    by = {m["name"]: m for m in data}
    assert by["mixtral-8x22b"]["total_params"] == 140_630_071_296
    assert by["llama3-8b"]["active_params"] == by["llama3-8b"]["total_params"] == 8_030_261_248
    assert by["qwen3-235b-a22b"]["total_params"] == 235_093_634_560


def test_gpus_listing(run_cli, run_json):
    code, out, _ = run_cli("gpus")
    assert code == 0 and "mi355x" in out and "gb200" in out
    code, data = run_json("gpus")
    h100 = next(g for g in data if g["name"] == "h100")
    assert h100["peak_bf16_tflops"] == 989 and h100["hbm_gib"] == 80


def test_gpus_json_entry_is_a_gpu_file(run_cli, run_json, tmp_path):
    """`gpus --json` prints the schema `--gpu FILE` reads (issue 13)."""
    import json

    code, data = run_json("gpus")
    mine = next(g for g in data if g["name"] == "mi355x") | {"name": "my-mi355x", "aliases": []}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(mine))
    base = ("check", "--model", "llama3-8b", "--nodes", "1", "--tp", "8")
    code_a, a = run_json(*base, "--gpu", "mi355x")
    code_b, b = run_json(*base, "--gpu", str(path))
    assert b["cluster"]["gpu"] == "my-mi355x" and b["memory"] == a["memory"]


def test_check_json_has_projection(run_json):
    code, data = run_json(*REF)
    p = data["projection"]
    assert {"step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "breakdown"} <= set(p)
    # (the breakdown adds up to the step time by construction: oracle/timing.py sums it)
    assert all(v >= 0 for v in p["breakdown"].values()) and p["breakdown"]["pipeline_bubble"] > 0
    # tokens/s/GPU = gbs x seq / step / GPUs
    assert abs(p["tokens_per_s_per_gpu"] - 512 * 8192 / p["step_time_s"] / 32) < 1e-6 * p["tokens_per_s_per_gpu"]
    assert 0 < p["mfu"] < 1


def test_amd_8_node_mixtral_within_10_percent(run_json):
    """AMD performance results: 8 x MI355X nodes, TP1 PP4 VPP2 EP8, mbs 2, seq 8192, BF16:
    3,534 tokens/s/GPU measured (global batch not published; the 4-node reference's 512)."""
    code, data = run_json("check", "--model", "mixtral-8x22b", "--gpu", "mi355x", "--nodes", "8",
                          "--pp", "4", "--vpp", "2", "--ep", "8", "--mbs", "2", "--gbs", "512",
                          "--recompute", "full", "--recompute-layers", "1")
    assert abs(data["projection"]["tokens_per_s_per_gpu"] / 3534 - 1) < 0.10


def test_calibrate_command(run_cli, tmp_path):
    import csv
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "benchmarks" / "published_runs.csv"
    rows = list(csv.DictReader(open(src)))
    keep = [r for r in rows if r["source_id"] in ("MOSAIC", "FLAGPERF")]
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(keep)
    out = tmp_path / "calib.json"
    code, text, err = run_cli("calibrate", "--runs", str(path), "--out", str(out))
    assert code == 0, err
    assert "calibrated on" in text and out.exists()
    code, _, err = run_cli("check", "--model", "llama3-8b", "--gpu", "h100", "--nodes", "2",
                           "--tp", "2", "--calibration", str(out))
    assert code == 0, err


def test_calibrate_missing_file(run_cli):
    code, _, err = run_cli("calibrate", "--runs", "/nonexistent.csv")
    assert code == 2 and err == "tune-cp: error: --runs '/nonexistent.csv': no such file\n"


def test_grad_reduce_in_bf16_flag(run_cli, run_json):
    """--grad-reduce-in-bf16 halves the gradients term; check --json carries the key; the
    exported Megatron-LM arguments read back (check --megatron-args) to the same configuration
    and the same bytes."""
    args = ("check", "--model", "llama3-8b", "--gpu", "h100", "--nodes", "1", "--tp", "2",
            "--pp", "2")
    _, fp32 = run_json(*args)
    code, bf16 = run_json(*args, "--grad-reduce-in-bf16")
    assert code == 0
    assert fp32["config"]["grad_reduce_in_fp32"] is True
    assert bf16["config"]["grad_reduce_in_fp32"] is False
    for s32, s16 in zip(fp32["memory"]["stages"], bf16["memory"]["stages"], strict=True):
        assert s16["terms"]["gradients"] * 2 == s32["terms"]["gradients"] > 0
        assert s16["total_bytes"] == s32["total_bytes"] - s16["terms"]["gradients"]
    code, exported, _ = run_cli(*args, "--grad-reduce-in-bf16", "--export", "megatron")
    assert code == 0 and "--grad-reduce-in-bf16" in exported
    _, back = run_json("check", "--model", "llama3-8b", "--gpu", "h100", "--nodes", "1",
                       "--megatron-args", exported)
    assert back["config"] == bf16["config"]
    assert back["memory"] == bf16["memory"]
    for command in ("check", "search", "plan"):
        _, text, _ = run_cli(command, "--help")
        assert "--grad-reduce-in-bf16" in text and "grad_reduce_in_fp32" in text, command


def test_an_fp8_recipe_is_one_precision_everywhere(run_cli, run_json):
    """Issue 10: precision has one source (config.specs.compute_precision). A bf16 run given an
    FP8 recipe trains in FP8: the header, --json's training and configuration and the export say
    fp8; an FP8 recipe under fp4 is a [precision] violation (exit 1), not a silent mix."""
    args = ("check", "--model", "llama3-8b", "--gpu", "b200", "--nodes", "1", "--tp", "2",
            "--fp8-recipe", "blockwise")
    code, data = run_json(*args)
    assert code == 0
    assert data["training"]["precision"] == data["config"]["precision"] == "fp8"
    assert data["config"]["fp8_recipe"] == "blockwise"
    code, out, err = run_cli(*args, "--export", "megatron")
    assert code == 0 and "seq 8192, gbs 128, fp8\n" in err
    assert out.splitlines()[0].endswith("gbs 128, fp8 blockwise")
    assert "--fp8-recipe blockwise \\" in out.splitlines() and "--fp4-format" not in out
    code, out, _ = run_cli("check", "--model", "llama3-8b", "--gpu", "b200", "--nodes", "1",
                           "--tp", "2", "--precision", "fp4", "--fp8-recipe", "tensorwise")
    assert code == 1
    assert "[precision] the fp8 recipe tensorwise with precision fp4" in out


def test_model_state_bytes_hand_worked(run_json):
    """Llama 3 8B, tp 8 on one H100 node (dp 1), counted by hand per rank: the vocabulary 128,256
    padded to a multiple of 128 x tp = 1,024 is 129,024; embedding and output layer
    129,024 x 4,096 / 8 = 66,060,288 each; per layer qkv (4,096 + 2 x 1,024) x 4,096 / 8 =
    3,145,728, out proj 4,096^2 / 8 = 2,097,152, gated fc1 2 x 14,336 x 4,096 / 8 = 14,680,064,
    fc2 7,340,032, two norms 8,192: 27,271,168 x 32 = 872,677,376; final norm 4,096. In all
    1,004,802,048 parameters: bf16 weights 2 B, fp32 gradient buffer 4 B, Adam's fp32 master
    and two moments 12 B (dp 1: nothing to shard), and the default 1 GiB runtime context."""
    code, data = run_json("check", "--model", "llama3-8b", "--gpu", "h100", "--nodes", "1",
                          "--tp", "8")
    assert code == 0 and data["config"]["dp"] == 1
    params = 872_677_376 + 2 * 66_060_288 + 4_096
    assert params == 1_004_802_048
    for s in data["memory"]["stages"]:
        terms = s["terms"]
        assert terms["weights"] == 2 * params == 2_009_604_096
        assert terms["gradients"] == 4 * params
        assert terms["optimizer"] == 12 * params
        assert terms["runtime_context"] == 2**30


def test_fp8_param_gather_needs_fp8_training(run_cli):
    """``--fp8-param-gather`` under bf16 would silently do nothing: it is refused in one line
    (exit 2); under FP8 the Llama 3 8B stage keeps no bf16 copy of its linear weights, so the
    weights term is the embedding and output only (2 x 525,336,576 parameters x 2 B = 2.0 GiB)."""
    args = ("check", "--model", "llama3-8b", "--gpu", "h100", "--nodes", "1", "--fp8-param-gather")
    code, out, err = run_cli(*args)
    assert code == 2 and out == ""
    assert err.strip() == (
        "tune-cp: error: --fp8-param-gather keeps only FP8 copies of the weights, so it needs "
        "FP8 training, but the precision is bf16: pass --precision fp8 (or an --fp8-recipe), or "
        "drop --fp8-param-gather")
    code, out, _ = run_cli(*args, "--precision", "fp8")
    assert code == 1 and "weights 2.0 GiB" in out


def test_check_flag_defaults_are_the_search_spaces_first_values():
    """Every configuration flag's default in `check` is the first value of the search's domain
    of its axis (issue 30 item 6): a layout the search prints and the same flags given to
    `check` are one configuration. etp of an MoE model: `cli.CHECK_MOE_ETP`, the first of
    `SearchSpace.etp_values(tp)` at every tp."""
    from tune_cp.cli import CHECK_MOE_ETP
    from tune_cp.config.axes import KNOBS, FlagKind
    from tune_cp.config.specs import ClusterSpec, TrainingSpec
    from tune_cp.oracle.catalog import load_gpu, load_model
    from tune_cp.solver.space import OptimizerChoice, default_space

    model = load_model("mixtral-8x7b")
    space = default_space(model, ClusterSpec(gpu=load_gpu("h100"), num_nodes=2, gpus_per_node=8),
                          TrainingSpec(seq_len=4096, global_batch_size=256))
    first_full = next(r for r in space.recompute if r.kind.value == "full")
    first = {"tp": space.tp[0], "pp": space.pp[0], "vpp": space.vpp[0], "cp": space.cp[0],
             "ep": space.ep[0], "mbs": space.mbs[0], "recompute": space.recompute[0].kind.value,
             "recompute_method": first_full.method.value,
             "dispatcher": space.dispatcher[0].value, "schedule": space.schedule[0],
             "fp8_recipe": space.fp8_recipe[0], "pipeline_split": space.pipeline_split[0],
             "distributed_optimizer": space.optimizer[0] is OptimizerChoice.DISTRIBUTED,
             "fsdp": space.optimizer[0] is OptimizerChoice.FSDP}
    walked = set()
    for k in KNOBS:
        if k.axis is None or k.field not in first:
            continue
        walked.add(k.field)
        # a flag without value leaves its field at ``negated`` (--no-distributed-optimizer: True)
        default = k.negated if k.kind is FlagKind.FLAG else k.default
        assert default == first[k.field], k.field
    assert walked == set(first)
    assert {space.etp_values(t)[0] for t in space.tp} == {CHECK_MOE_ETP}


def test_megatron_args_dash_reads_stdin(run_json, monkeypatch):
    """`--megatron-args -` reads the arguments (or a launch script) from standard input: the
    same check as the text given on the command line (issue 30 item 10); a terminal on stdin is
    refused in one line rather than waited on."""
    import io

    from tune_cp import cli

    args = ("check", "--model", "llama3-8b", "--gpu", "h100", "--nodes", "1")
    launch = "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --micro-batch-size 2"
    _, given = run_json(*args, "--megatron-args", launch)

    class Pipe(io.TextIOWrapper):
        def isatty(self) -> bool:
            return False

    monkeypatch.setattr(cli.sys, "stdin", Pipe(io.BytesIO(launch.encode())))
    code, piped = run_json(*args, "--megatron-args", "-")
    assert code == 0 and piped == given
    assert piped["config"]["tp"] == 2 and piped["config"]["mbs"] == 2

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(cli.sys, "stdin", Terminal())
    assert cli.run([*args, "--megatron-args", "-"]) == 2
