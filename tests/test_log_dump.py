"""Real training logs calibrate without edits (formats/logs.py: every value kind the argument dump
prints; formats/parse.py::parse_argument_dump), and calibrate's before/after columns are the
projection `check` prints for the same log (solver/check.py::check_projection, issue 30 items 2
and 3). The fixture megatron_gpt_mi300x_lumi_workflow_tests.log is a verbatim excerpt of a public
Megatron-LM log (tests/data/logs/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tune_cp.formats import parse_argument_dump
from tune_cp.formats.logs import dump_value, read_argument_dump, read_log
from tune_cp.oracle.catalog import load_model

LOGS = Path(__file__).parent / "data" / "logs"
LUMI = LOGS / "megatron_gpt_mi300x_lumi_workflow_tests.log"


@pytest.mark.parametrize("text,value", [
    ("AttnBackend.auto", "auto"),  # an enum member (str(Enum))
    ("None", None), ("True", True), ("False", False),
    ("4294967296", 4294967296), ("1e-05", 1e-05), ("0.00015", 0.00015), ("-1", -1),
    ("['p2p']", ["p2p"]), ("[0]", [0]), ("[]", []), ("(128, 0)", [128, 0]),
    ("[<CudaGraphModule.attn: 'attn'>, <CudaGraphModule.mlp: 'mlp'>]", ["attn", "mlp"]),
    ("torch.bfloat16", "bf16"), ("torch.float32", "fp32"),
    ("torch.float8_e4m3fn", "float8_e4m3fn"), ("969, 30, 1", "969, 30, 1"),
    ("data/fineweb-10BT-BPE_text_document", "data/fineweb-10BT-BPE_text_document"),
    ("", ""), ("<function gelu at 0x7f00>", "<function gelu at 0x7f00>"), ("[1, 2", "[1, 2"),
    # numbers past formats/logs.py's bounds (24 characters, 19 digits) or not finite stay text
    ("9" * 30, "9" * 30), ("9" * 20, float("9" * 20)), ("inf", "inf"), ("nan", "nan"),
])
def test_every_value_kind_the_dump_prints(text, value):
    assert dump_value(text) == value


def test_dump_lines_without_dots_or_value():
    """_print_args writes 48 - len(name) dots: none for a 48-character name (two spaces); an
    empty value leaves the line ending in dots once trailing spaces are stripped."""
    lines = ["------------------------ arguments ------------------------",
             "  " + "n" * 50 + "  7", "  wandb_project ...................................",
             "[rank0]: [INFO] prefix   tensor_model_parallel_size ...... 4",
             "-------------------- end of arguments ---------------------"]
    assert read_argument_dump(lines) == {"n" * 50: "7", "wandb_project": "",
                                         "tensor_model_parallel_size": "4"}
    # Primus's logger prefix (its trainer line format, tests/data/logs/primus_mi3xx_*.log) on
    # every line of the dump; what follows the end line is not read
    prefix = "[20251202 09:12:08][rank-0/8][INFO ] [--------trainer.py:2560] : "
    primus = [prefix + x for x in (lines[0], "  attention_backend ........ AttnBackend.auto",
                                   lines[-1], "  seq_length ........ 4096")]
    assert read_argument_dump(primus) == {"attention_backend": "AttnBackend.auto"}


def test_a_real_log_with_enum_values_is_read():
    """The public MI300X log (8 GPUs, TP4 PP2, 56 layers of hidden 6144): 17 iterations, the
    median of iterations 3-17 is 419,234.8 ms; 512 x 8192 tokens per step on 8 GPUs is
    1,250.6 tokens/s/GPU; max allocated 74,046.685546875 MiB (rank 4). Its dump prints
    attention_backend AttnBackend.auto, params_dtype torch.bfloat16, lists and empty values."""
    m = read_log(LUMI)
    assert (m.framework, m.iterations, m.used, m.world_size) == ("megatron", 17, 15, 8)
    assert m.step_time_s == pytest.approx(419.2348)
    assert m.peak_bytes == int(74046.685546875 * 2**20)
    assert len(m.args) == 403 and m.args["attention_backend"] == "AttnBackend.auto"
    run = parse_argument_dump(m.args, sizes=m.sizes)
    c, model = run.config, run.require_model()
    assert (c.tp, c.pp, c.cp, c.mbs, c.sequence_parallel, c.distributed_optimizer) == (
        4, 2, 1, 1, True, True)
    assert c.recompute.value == "selective"
    assert (model.num_layers, model.hidden_size, model.ffn_hidden_size, model.num_kv_heads,
            model.num_experts, model.mla) == (56, 6144, 21504, 24, 0, None)
    assert (run.seq_len, run.global_batch_size, run.flash_attention) == (8192, 512, True)
    # what the launch set that tune-cp does not model (--no-bias-swiglu-fusion,
    # --no-gradient-accumulation-fusion); the flags' defaults, derived values and the p2p
    # overlap that validate_args turns off without interleaving are not listed
    assert run.unmodelled == ["bias_swiglu_fusion: False", "gradient_accumulation_fusion: False"]
    [note] = [n for n in run.notes if n.startswith("log's argument dump")]
    assert "65 of 403 arguments read" in note and "params_dtype" in note
    assert "world_size" in note and "skipped " not in note


def test_values_of_another_kind_are_skipped_and_named():
    """A choice a newer Megatron-LM adds, or a number where a size belongs, is skipped (the
    default taken) and named with its value in the one-line note; nothing is refused."""
    dump = {"tensor_model_parallel_size": "2", "pipeline_model_parallel_size": "four",
            "attention_backend": "AttnBackend.new_kernel", "micro_batch_size": "1",
            "virtual_pipeline_model_parallel_size": "2",
            "num_virtual_stages_per_pipeline_rank": "2", "seq_length": "4096"}
    run = parse_argument_dump(dump, model=load_model("llama3-8b"))
    assert (run.config.tp, run.config.pp, run.config.vpp) == (2, 1, 2)  # pp: the default
    [note] = [n for n in run.notes if n.startswith("log's argument dump")]
    assert ("skipped 2 whose value is not one tune-cp reads (the default is taken): "
            "pipeline_model_parallel_size=four, attention_backend=AttnBackend.new_kernel") in note


def test_calibrate_table_is_what_check_prints(tmp_path, run_json):
    """Issue 30 item 3: calibrate's before and after columns are exactly the projections
    `tune-cp check --log LOG` prints without and with the refitted file, and the text table
    names that command (the refit as `tune-cp calibrate --log LOG --gpu mi300x --out FILE`
    makes it)."""
    from tune_cp.calibration.refit import calibrate_from_logs, read_log_runs
    from tune_cp.oracle.catalog import load_gpu

    out = tmp_path / "cluster.json"
    runs = read_log_runs([str(LUMI)], gpu=load_gpu("mi300x"), gpus_per_node=8,
                         gpu_name="mi300x")
    result = calibrate_from_logs(runs, out)
    [row] = result.to_json()["rows"]
    assert row["measured_tokens_per_s_per_gpu"] == pytest.approx(512 * 8192 / 419.2348 / 8)
    assert row["check"] == f"tune-cp check --log {LUMI} --gpu mi300x"
    _, before = run_json("check", "--log", LUMI, "--gpu", "mi300x")
    _, after = run_json("check", "--log", LUMI, "--gpu", "mi300x", "--calibration", out)
    assert before["projection"]["tokens_per_s_per_gpu"] == row["projected_before"]
    assert after["projection"]["tokens_per_s_per_gpu"] == row["projected_after"]
    assert row["projected_after"] != row["projected_before"]
    assert before["imported"]["source"] == "log's argument dump"
    assert f"check: tune-cp check --log {LUMI} --gpu mi300x --calibration {out}" \
        in result.summary()


def test_log_size_limit_is_one(tmp_path, run_cli, monkeypatch):
    """--log is read up to oracle/inputs.py::MAX_LOG_BYTES by the CLI and the reader alike (the
    CLI used to stop at the 16 MiB of other inputs): a 17 MiB log is read; one over the limit is
    refused in one line naming it."""
    from tune_cp.oracle import inputs

    big = tmp_path / "big.log"
    text = LUMI.read_text()
    big.write_text(text + ("#" * 1023 + "\n") * (17 * 2**10))  # over 17 MiB
    code, out, err = run_cli("check", "--log", big, "--gpu", "mi300x")
    assert code == 0 and "projection:" in out, err
    monkeypatch.setattr(inputs, "MAX_LOG_BYTES", 2**20)
    for cmd in (("check", "--log", big, "--gpu", "mi300x"),
                ("calibrate", "--log", big, "--gpu", "mi300x")):
        code, _, err = run_cli(*cmd)
        assert code == 2 and "at most 1,048,576 bytes are read" in err
        assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("log,gpu,model,config", [
    ("megatron_gpt_mi300x_lumi_workflow_tests.log", "mi300x", None, None),
    ("megatron_mixtral8x7b_h100_issue756.log", "h100", "mixtral-8x7b", None),  # a cut dump
    ("torchtitan_issue1287.log", "h100", "llama3-8b", "torchtitan_llama3_8b_fsdp8.toml"),
])
def test_public_logs_read_as_runs_without_edits(log, gpu, model, config):
    """Every public log of tests/data/logs that prints (or is given) its configuration is read as
    a measured run as it is (the Primus excerpt is one iteration line, without its dump)."""
    from tune_cp.calibration.refit import read_log_runs
    from tune_cp.oracle.catalog import load_gpu

    [run] = read_log_runs([str(LOGS / log)], gpu=load_gpu(gpu), gpus_per_node=8,
                          model=load_model(model) if model else None,
                          nodes=1 if config else None,
                          config=str(LOGS / config) if config else None)
    assert run.reason is None and run.row is not None
    assert run.row.measured_tokens_per_s_per_gpu > 0
