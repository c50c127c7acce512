"""A bounded fuzz campaign in the suite (issue 16): a fixed seed, a few hundred hostile command
lines (malformed flags, files, expressions, output paths; ``tests/fuzzing.py``), run in-process
with click's CliRunner. None may end in exit 3, print a traceback, print more than one error
line, or print invalid JSON under ``--json``. ``benchmarks/fuzz.py`` runs a larger campaign."""

from __future__ import annotations

import time

from click.testing import CliRunner

import cli
from tests.fuzzing import cases, defects

SEED = 16
CASES = 300


def test_fuzz_campaign(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    found, t0, codes = [], time.monotonic(), {}
    for case in cases(SEED, CASES, tmp_path):
        with runner.isolation() as (out, err, _):
            code = cli.run(list(case.args))
            stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
        codes[code] = codes.get(code, 0) + 1
        for d in defects(code, stdout, stderr, case.args):
            found.append(f"{d}: {case.line()} -> {stderr.strip()[:200]}")
        if code == 2:  # the error names the flag or file it is about
            named = [a for a in case.args if a.startswith("--") and a[2:] in stderr.replace(
                "_", "-")] or [a for a in case.args if a and a[:30] in stderr]
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
    import solver.feasible as F

    monkeypatch.setattr(F, "ENUMERATION_TIME_LIMIT_S", 1e-6)
    code, _, err = run_cli("--model", "mixtral-8x22b", "--nodes", "4")
    one_line_error(code, err, "did not finish within", "--constraint", "mixtral-8x22b")
