"""A bounded fuzz campaign in the suite (issue 16): a fixed seed, a few hundred hostile command
lines (malformed flags, files, expressions, output paths; ``tests/fuzzing.py``), run in-process
with click's CliRunner. None may end in exit 3, print a traceback, print more than one error
line, or print invalid JSON under ``--json``. ``benchmarks/fuzz.py`` runs a larger campaign."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.fuzzing import FUZZ_SECRET, SECRET_VARS, cases, defects
from tune_cp import cli

ROOT = Path(__file__).resolve().parent.parent
SEED = 16
CASES = 300
#: What an error line may name besides the command line's own flags and values: a flag (one
#: the line lacks, or one inside --megatron-args or a launch script), a quoted key or value, or
#: a file's name with the key in it (``exp.yaml: norm_epsilon true: not a number``).
NAMED = re.compile(r"--[a-z][a-z0-9-]+|'[^']+'|\"[^\"]+\"|[\w.-]+\.(?:ya?ml|json|toml): \w+")


def test_fuzz_campaign(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in SECRET_VARS:  # the generated files reference it; no output may show it
        monkeypatch.setenv(name, FUZZ_SECRET)
    runner = CliRunner()
    found, t0, codes = [], time.monotonic(), {}
    for case in cases(SEED, CASES, tmp_path):
        with runner.isolation() as (out, err, _):
            code = cli.run(list(case.args))
            stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
        codes[code] = codes.get(code, 0) + 1
        for d in defects(code, stdout, stderr, case.args):
            found.append(f"{d}: {case.line()} -> {stderr.strip()[:200]}")
        if code == 2:  # the error names the flag, key, file or value it is about
            named = [a for a in case.args if a.startswith("--") and a[2:] in stderr.replace(
                "_", "-")] or [a for a in case.args if a and a[:30] in stderr] or \
                NAMED.findall(stderr.removeprefix("tune-cp: error: "))
            if not named:
                found.append(f"names nothing: {case.line()} -> {stderr.strip()[:200]}")
    assert not found, "\n".join(found[:20])
    assert codes.get(2, 0) > CASES // 2  # mostly bad input, as generated
    assert time.monotonic() - t0 < 60


# ------------------------------------------------------------------ regression cases (issue 14)


def one_line_error(code: int, err: str, *names: str) -> None:
    """Exit 2 with one ``tune-cp: error:`` line that names each of ``names``."""
    assert code == 2, err
    assert err.startswith("tune-cp: error: ") and err.count("\n") == 1, err
    for n in names:
        assert n in err, (n, err)


def test_enumeration_past_its_time_limit_is_one_line(run_cli, monkeypatch):
    """An enumeration that does not end within its wall-clock limit (a search that used to run
    for minutes) is refused with what would narrow the space, not left running; and CP-SAT's
    time limit is the one set (a FEASIBLE status without the end of the enumeration)."""
    import tune_cp.solver.feasible as F

    monkeypatch.setattr(F, "ENUMERATION_TIME_LIMIT_S", 1e-6)
    code, _, err = run_cli("--model", "mixtral-8x22b", "--nodes", "4")
    one_line_error(code, err, "did not finish within", "--constraint", "mixtral-8x22b")


@pytest.mark.parametrize("flag,value", [("--gpus-per-node", "1048577"),
                                        ("--gpus-per-node", "9" * 19), ("--nodes", "9" * 30)])
def test_huge_cluster_sizes_are_one_line(run_cli, flag, value):
    """The "cluster size" kind of the campaign: a size beyond 2^20 GPUs or int64 is refused
    before any table is built."""
    other = ("--nodes", "1") if flag == "--gpus-per-node" else ("--gpus-per-node", "8")
    code, _, err = run_cli("check", "--model", "llama3-8b", "--gpu", "h100", flag, value, *other)
    one_line_error(code, err, flag)


@pytest.mark.parametrize("key,value", [("tensor_model_parallel_size", "9" * 400),
                                       ("seq_length", "nan"), ("micro_batch_size", "'8k'"),
                                       ("global_batch_size", "[" * 200 + "1" + "]" * 200)])
def test_mutated_primus_experiment_is_one_line(run_cli, tmp_path, key, value):
    """The "primus mutation" kind: a Primus experiment (tests/data) with one hostile value."""
    src = ROOT / "tests/data/primus/examples/MI355X/mixtral_8x22B_v0.1-BF16-4node.yaml"
    lines = [f"      {key}: {value}" if line.strip().startswith(f"{key}:") else line
             for line in src.read_text().splitlines()]
    exp = tmp_path / "exp.yaml"
    exp.write_text("\n".join(lines) + "\n")
    code, _, err = run_cli("check", "--primus-config", exp, "--model", "mixtral-8x22b",
                           "--gpu", "mi355x", "--nodes", "4")
    one_line_error(code, err)
    assert key in err or "exp.yaml" in err, err
