"""Bad input is refused with exit 2 and one line naming the value (issue 16): files (type, size,
encoding, nesting, aliases, numbers), flags (NaN/inf, integer spellings), output paths (checked
before any work). Every case fails before the search starts, so the file runs in seconds."""

from __future__ import annotations

import json
import os

import pytest

from tune_cp.config.specs import ConfigError
from tune_cp.oracle.constants import load_calibration
from tune_cp.oracle.inputs import MAX_EXPANDED_NODES, check_tree, parse_json, parse_yaml, read_text

LLAMA = ("--model", "llama3-8b", "--gpu", "h100", "--nodes", "1")
MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000,
           "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2}


def bomb(levels: int = 9) -> str:
    """The 9-levels-of-9-aliases YAML bomb (9**9 values once expanded, a few hundred bytes)."""
    text, prev = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n', "a"
    for name in "bcdefghijk"[: levels - 1]:
        text += f"{name}: &{name} [" + ",".join(["*" + prev] * 9) + "]\n"
        prev = name
    return text


def one_error(run_cli, *args: str, code: int = 2) -> str:
    got, out, err = run_cli(*args)
    assert got == code, (got, out, err)
    assert err.count("\n") == 1 and err.startswith("tune-cp: error: "), err
    return err


# ---------------------------------------------------------------------------------- files


@pytest.mark.parametrize("flag", ["--model", "--gpu"])
def test_devices_fifos_directories_refused_before_reading(run_cli, tmp_path, flag):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    for path, word in (("/dev/zero", "not a regular file"), (str(fifo), "not a regular file"),
                       (str(tmp_path), "directory")):
        args = dict(zip(LLAMA[::2], LLAMA[1::2], strict=True)) | {flag: path}
        err = one_error(run_cli, *[x for kv in args.items() for x in kv])
        assert word in err and repr(path) in err


def test_size_limit_checked_before_reading(tmp_path, monkeypatch):
    import tune_cp.oracle.inputs as inputs

    big = tmp_path / "big.json"
    big.write_text("{}" + " " * 100)
    monkeypatch.setattr(inputs, "MAX_INPUT_BYTES", 50)
    with pytest.raises(ConfigError, match=r"is 102 bytes; at most 50 bytes are read"):
        read_text(big, "model file")


@pytest.mark.parametrize("content, match", [
    (bytes(range(256)), "is not UTF-8 text (byte 0x80 at offset 128)"),
    (b"[" * 100_000, "nest more than 64 deep"),
    (b'{"x": NaN}', "NaN is not a number JSON allows"),
    (b'{"x": Infinity}', "Infinity is not a number JSON allows"),
    (b'{"x": ' + b"9" * 5000 + b"}", "not valid JSON: Exceeds the limit"),
    (b'{"x": ' + b"9" * 30 + b"}", "x is an integer of 30 digits; integers must lie within int64"),
])
def test_json_files(run_cli, tmp_path, content, match):
    path = tmp_path / "m.json"
    path.write_bytes(content)
    assert match in one_error(run_cli, "--model", str(path), "--nodes", "1")


@pytest.mark.parametrize("content, match", [
    ("[" * 5000, "nesting deeper than 64"),
    ("loop: &L [*L]\n", "loop.0 contains itself (a recursive YAML anchor)"),
    (bomb(), f"expands to more than {MAX_EXPANDED_NODES:,} values"),
    ("num_layers: " + "9" * 5000, "Exceeds the limit (4300 digits)"),
    ("num_layers: .nan", "num_layers is nan; give a finite number"),
])
def test_yaml_files(run_cli, tmp_path, content, match):
    path = tmp_path / "m.yaml"
    path.write_text(content)
    assert match in one_error(run_cli, "--model", str(path), "--nodes", "1")


def test_aliases_shared_and_bounded():
    # aliases share the anchored object (no copy) and count where they are used
    data = parse_yaml("a: &a [1, 2]\nb: *a\n", "f")
    assert data["a"] is data["b"]
    with pytest.raises(ConfigError, match="expands to more than"):
        parse_yaml(bomb(7), "f")  # 9**7 = 4.8 million values
    assert check_tree(parse_json('{"a": [1, 2.5, "x", null]}', "f"), "f")


@pytest.mark.parametrize("update, match", [
    ({"max_position_embeddings": "8k"}, "'max_position_embeddings' must be an integer, got '8k'"),
    ({"attention_dropout": "high"}, "'attention_dropout' must be a number (without quotes), got 'high'"),
    ({"model_type": "qwen2_moe", "num_experts": 8, "moe_intermediate_size": 1024,
      "decoder_sparse_step": "two"}, "'decoder_sparse_step' must be an integer, got 'two'"),
])
def test_hf_config_strings_where_numbers_belong(run_cli, tmp_path, update, match):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MIXTRAL | update))
    assert match in one_error(run_cli, "--model", str(path), "--nodes", "1")


def test_names_over_255_characters(run_cli):
    long = "x" * 5000
    assert "unknown model 'xxx" in one_error(run_cli, "--model", long, "--nodes", "1")
    assert "unknown gpu" in one_error(run_cli, "--model", "llama3-8b", "--gpu", long, "--nodes",
                                      "1")
    assert "(5005 characters)': File name too long" in one_error(run_cli, "--model", long + ".json",
                                                                "--nodes", "1")
    assert "unknown gpu" in one_error(run_cli, "plan", "--model", "llama3-8b", "--gpu",
                                      "h100," + long)


# --------------------------------------------------------------------------- calibration


@pytest.mark.parametrize("content, match", [
    ("null", "must hold a mapping"), ("3", "must hold a mapping"), ("[1]", "must hold a mapping"),
    ('{"foo": 1}', "unknown key(s) ['foo']"),
    ('{"defaults": {"gemm_efficiency_bf16": -1}}', "-1 is outside the constant's range (>= 0.01"),
    ('{"defaults": {"gemm_efficiency_bf16": 0}}', "0 is outside the constant's range (>= 0.01"),
    ('{"defaults": {"gemm_efficiency_bf16": 1e308}}', "outside the constant's range"),
    ('{"defaults": {"gemm_efficiency_bf16": NaN}}', "NaN is not a number JSON allows"),
    ('{"defaults": {"gemm_efficiency_bf16": "fast"}}', "'fast' is a string, not a number"),
    ('{"defaults": 3}', "defaults must be a mapping of keys to values, got 3"),
])
def test_calibration_files(run_cli, tmp_path, content, match):
    path = tmp_path / "cal.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=None) as e:
        load_calibration(path)
    assert match in str(e.value)
    assert match in one_error(run_cli, "check", *LLAMA, "--calibration", str(path))


# -------------------------------------------------------------------------------- runs CSV


def test_runs_csv(run_cli, tmp_path):
    header = open("benchmarks/published_runs.csv").readline()
    row = open("benchmarks/published_runs.csv").readlines()[1]
    bad = tmp_path / "quote.csv"
    bad.write_text(header + row.replace(",MB,", ',"MB,', 1))
    assert "is not valid CSV" in one_error(run_cli, "calibrate", "--runs", str(bad))
    binary = tmp_path / "bin.csv"
    binary.write_bytes(bytes(range(256)))
    assert "not UTF-8" in one_error(run_cli, "calibrate", "--runs", str(binary))
    assert "not a regular file" in one_error(run_cli, "calibrate", "--runs", "/dev/zero")


def test_runs_csv_numbers(tmp_path):
    from tune_cp.formats.runs import read_runs

    header = open("benchmarks/published_runs.csv").readline().strip().split(",")
    rows = open("benchmarks/published_runs.csv").read().splitlines()[1:3]
    cols = {c: i for i, c in enumerate(header)}
    out = [",".join(header)]
    for line, (col, value) in zip(rows, (("tokens_per_sec_per_gpu", "-8"),
                                         ("num_gpus", "9" * 5000)), strict=True):
        import csv
        import io

        cells = next(csv.reader(io.StringIO(line)))
        cells[cols[col]] = value
        buf = io.StringIO()
        csv.writer(buf).writerow(cells)
        out.append(buf.getvalue().strip())
    path = tmp_path / "runs.csv"
    path.write_text("\n".join(out) + "\n")
    neg, nines = read_runs(path)
    assert neg.measured_tokens_per_s_per_gpu is None and "not a positive throughput" in neg.reason
    assert nines.cfg is None and nines.reason


# ---------------------------------------------------------------------------------- flags


@pytest.mark.parametrize("args, match", [
    (("--memory-margin", "nan"), "'nan' is not a finite number"),
    (("--overhead", "runtime_context_bytes=1e400"), "is not a size below 1 EiB"),
    (("--overhead", "fragmentation=inf"), "'inf' is not a number (write ASCII digits"),
    (("--overhead", "moe_routing_imbalance=٣٢"), "'٣٢' is not a number"),
    (("--overhead", "fragmentation=1e400"), "'1e400' is not a finite number"),
    (("--memory-margin", "٠"), "is not a number (write ASCII digits"),
    (("--tp", "１"), "'１' is not an integer (write ASCII digits"),
    (("--tp", "1_0"), "'1_0' is not an integer"),
    (("--tp", "+4"), "'+4' is not an integer"),
    (("--tp", "٤"), "is not an integer"),
])
def test_check_flags(run_cli, args, match):
    assert match in one_error(run_cli, "check", *LLAMA, *args)


def test_world_size_bounded(run_cli):
    err = one_error(run_cli, "--model", "llama3-8b", "--nodes", "1048576")
    assert "1048576 nodes x 8 GPUs = 8,388,608 GPUs; at most 1,048,576 GPUs" in err


@pytest.mark.parametrize("args, match", [
    (("--tokens", "nan"), "'nan' is not a finite number"),
    (("--tokens", "inf"), "inf is not in the range 1<=x<=1e+18"),
    (("--price-per-gpu-hour", "nan"), "'nan' is not a number"),
    (("--price-per-gpu-hour", "h100=1e308"), "a price is a finite number from 0 to 1e+06"),
    (("--price-per-gpu-hour", "1e400"), "'1e400' is not a finite number"),
    (("--price-per-gpu-hour", "１"), "'１' is not a number"),
])
def test_plan_flags(run_cli, args, match):
    assert match in one_error(run_cli, "plan", "--model", "llama3-8b", "--gpu", "h100", *args)


def test_lm_name_needs_provider_and_model(run_cli):
    assert "write PROVIDER/MODEL" in one_error(run_cli, *LLAMA, "--lm", "/")


def test_strict_json_helper():
    from tune_cp import cli

    assert cli.strict_json({"a": [float("nan"), 1.5, float("inf")]}) == {"a": [None, 1.5, None]}


# --------------------------------------------------------------------------- output paths


@pytest.mark.parametrize("flag, name, match", [
    ("--pareto", "out.txt", ".txt is not a supported format; end the name with .png"),
    ("--pareto", "/etc/passwd/x.png", "cannot be written: Not a directory"),
    ("--pareto", "nodir/x.png", "the directory 'nodir' does not exist"),
    ("--pareto", "x" * 300 + ".png", "cannot be written: File name too long"),
    ("--trials-out", "/proc/version", "no extension is not a supported format"),
    ("--trials-out", "", "the file name is empty"),
    ("--trials-out", "DIR.jsonl", "is a directory"),
    ("--trials-out", "LOOP.jsonl", "cannot be written: Too many levels of symbolic links"),
    ("--trials-out", "DANGLING.jsonl", "is a symbolic link to nothing"),
])
def test_search_output_paths_checked_first(run_cli, tmp_path, monkeypatch, flag, name, match):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "DIR.jsonl").mkdir()
    os.symlink("LOOP.jsonl", tmp_path / "LOOP.jsonl")
    os.symlink("nowhere/x", tmp_path / "DANGLING.jsonl")
    assert match in one_error(run_cli, *LLAMA, flag, name)


def test_unwritable_directory(run_cli, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):  # root ignores permissions
        pytest.skip("running as root")
    assert "Permission denied" in one_error(run_cli, *LLAMA, "--trials-out",
                                            str(locked / "t.jsonl"))


def test_plan_and_calibrate_output_paths(run_cli):
    assert ".json is not a supported format" in one_error(
        run_cli, "plan", "--model", "llama3-8b", "--plot", "p.json")
    runs = "benchmarks/published_runs.csv"
    assert "the file name is empty" in one_error(run_cli, "calibrate", "--runs", runs, "--out", "")
    assert "does not exist" in one_error(run_cli, "calibrate", "--runs", runs, "--out",
                                         "/nonexistent/x.json")
    assert "not a supported format" in one_error(run_cli, "calibrate", "--runs", runs, "--out",
                                                 "cal.yaml")
