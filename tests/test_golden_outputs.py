"""Recorded outputs: search, check, plan, sweep, calibrate and the error paths, byte for byte.

Each line of ``tests/golden/cases.txt`` is one ``tune-cp`` command (the README's examples, the
benchmark cases, the Primus examples, bad input); ``tests/golden/outputs/NAME.txt`` is what it
printed (stdout, then stderr, then the exit code, and any file it wrote under ``{tmp}``) when
it was recorded. A refactoring must leave every one unchanged; a change that means to move an
output re-records them and shows the difference in its commit::

    TUNE_CP_RECORD_GOLDEN=1 python -m pytest -q tests/test_golden_outputs.py
    git diff tests/golden/outputs

The commands run in this process through ``cli.run`` (the ``tune-cp`` entry point's own error
handling), from the repository root; ``{tmp}`` is a fresh folder per case and is written back
as ``{tmp}`` so the outputs do not depend on where the test runs; the clock a refit stamps its
file with is fixed (:data:`FIXED_NOW`) and a progress line's elapsed time and ETA are written
as ``{t}`` (:data:`CLOCK`): how long a command took is ``benchmarks/``' business, not an output.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
RECORD = os.environ.get("TUNE_CP_RECORD_GOLDEN") == "1"
#: what ``oracle.constants.utc_now`` says during a case (``calibrate --log`` stamps its file)
FIXED_NOW = "2026-01-01T00:00:00Z"
#: the wall-clock fields of a progress line (``sweep``: ``elapsed 0:01, ETA 0:00``)
CLOCK = re.compile(r"\b(elapsed|ETA) \d+(:\d\d)+")


def cases() -> list[tuple[str, str]]:
    out = []
    for line in (GOLDEN / "cases.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, args = line.split("|", 1)
            out.append((name, args))
    return out


def test_cases_are_named_once_and_recorded() -> None:
    names = [n for n, _ in cases()]
    assert len(names) == len(set(names)) and len(names) >= 25
    recorded = {p.stem for p in (GOLDEN / "outputs").glob("*.txt")}
    assert RECORD or recorded == set(names), "re-record: TUNE_CP_RECORD_GOLDEN=1 (see the module docstring)"


def _transcript(name: str, args: str, tmp: Path, capsys: pytest.CaptureFixture[str]) -> str:
    from tune_cp.cli import run

    argv = [a.replace("{tmp}", str(tmp)) for a in shlex.split(args)]
    code = run(argv)
    cap = capsys.readouterr()
    parts = [f"$ tune-cp {args}", "--- stdout", cap.out, "--- stderr", cap.err, f"--- exit {code}"]
    for path in sorted(tmp.rglob("*")):
        if path.is_file():
            parts += [f"--- file {{tmp}}/{path.relative_to(tmp)}", path.read_text()]
    text = "\n".join(parts).replace(str(tmp), "{tmp}").replace(str(ROOT), "{repo}")
    return CLOCK.sub(lambda m: f"{m.group(1)} {{t}}", text)


@pytest.mark.parametrize(("name", "args"), cases(), ids=[n for n, _ in cases()])
def test_output_is_the_recorded_one(name: str, args: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr("tune_cp.calibration.refit.utc_now", lambda: FIXED_NOW)
    got = _transcript(name, args, tmp_path, capsys)
    recorded = GOLDEN / "outputs" / f"{name}.txt"
    if RECORD:
        recorded.parent.mkdir(exist_ok=True)
        recorded.write_text(got)
    assert recorded.exists(), f"{name}: no recorded output (TUNE_CP_RECORD_GOLDEN=1)"
    assert got == recorded.read_text(), (
        f"{name}: the output changed; if that is intended, re-record (see the module docstring)")
