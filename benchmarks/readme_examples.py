"""Run every ``$ ...`` example of the README and compare what it prints with what the README
shows: one line per example (ok, or the first line that differs), exit 1 when any differs.

The README's example blocks are runs pasted as they printed: a line ``$ COMMAND`` and the
lines it printed. A line ``...`` stands for any number of lines, and ``...`` inside a line for
any text. Each command runs in bash in a fresh temporary folder that links the checkout's
``tests/``, ``benchmarks/`` and ``docs/`` (so the shipped inputs are found and the files the
examples write stay out of the checkout), with ``tune-cp`` as ``python -m tune_cp.cli`` of
this interpreter and stdout and stderr together, as on a terminal. Not part of the test suite:
the search, plan and sweep examples take a minute or two together on the shared 2-core machine.

    python benchmarks/readme_examples.py            # every example
    python benchmarks/readme_examples.py --only plan,sweep
    python benchmarks/readme_examples.py --write    # also rewrite the blocks shown in full

``--write`` replaces the shown output of every example that differs and shows its output in full
(no ``...``) with what it printed now (stdout, or stderr when stdout is empty, as the README
shows them); the elided ones are listed for a hand edit.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def examples(readme: str) -> list[tuple[str, list[str]]]:
    """(command, expected lines) of each ``$ `` line of the README's plain code blocks."""
    out: list[tuple[str, list[str]]] = []
    in_block = plain = False
    for line in readme.splitlines():
        if line.startswith("```"):
            in_block, plain = not in_block, line.strip() == "```"
            current = None
            continue
        if not (in_block and plain):
            continue
        if line.startswith("$ "):
            current = (line[2:], [])
            out.append(current)
        elif current is not None:
            current[1].append(line)
    return out


def matches(expected: list[str], actual: list[str]) -> tuple[bool, str]:
    """Whether ``actual`` starts with the expected lines (``...`` lines skip any number of
    lines, ``...`` inside a line matches any text); else the first expected line not found."""
    pats = [None if e.strip() == "..." else
            re.compile("".join(".*" if p == "..." else re.escape(p)
                               for p in re.split(r"(\.\.\.)", e.rstrip())) + r"\s*")
            for e in expected]
    i = 0
    skipping = False
    for e, pat in zip(expected, pats, strict=True):
        if pat is None:
            skipping = True
            continue
        while i < len(actual) and not pat.fullmatch(actual[i]):
            if not skipping:
                return False, f"expected {e!r}, got {actual[i]!r}"
            i += 1
        if i == len(actual):
            return False, f"expected {e!r}, not printed"
        i += 1
        skipping = False
    return True, ""  # the README may show the start of a long output


def run(command: str, cwd: Path) -> tuple[list[str], list[str]]:
    """(stdout and stderr together, the lines the README would show: stdout, or stderr when
    stdout is empty)."""
    tune = f"{shlex.quote(sys.executable)} -m tune_cp.cli"
    script = f'tune-cp() {{ {tune} "$@"; }}\n{command}'
    proc = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True,
                          env=None, timeout=600)
    shown = proc.stdout if proc.stdout.strip() else proc.stderr
    return (proc.stdout + proc.stderr).splitlines(), shown.rstrip("\n").splitlines()


def rewrite(readme: str, command: str, expected: list[str], shown: list[str]) -> str:
    """``readme`` with the lines after ``$ command`` (exactly ``expected``) replaced."""
    old = "\n".join([f"$ {command}", *expected]) + "\n"
    new = "\n".join([f"$ {command}", *shown]) + "\n"
    assert readme.count(old) == 1, command
    return readme.replace(old, new)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated words; run the examples whose "
                    "command contains one of them")
    ap.add_argument("--write", action="store_true", help="rewrite the differing examples the "
                    "README shows in full")
    args = ap.parse_args()
    words = [w for w in args.only.split(",") if w]
    failed = 0
    with tempfile.TemporaryDirectory(prefix="tune-cp-readme-") as tmp:
        cwd = Path(tmp)
        for name in ("tests", "benchmarks", "docs"):
            (cwd / name).symlink_to(ROOT / name)
        readme = (ROOT / "README.md").read_text()
        for command, expected in examples(readme):
            if words and not any(w in command for w in words):
                continue
            printed, shown = run(command, cwd)
            ok, why = matches(expected, printed)
            state = "ok     "
            if not ok:
                state = "DIFFERS"
                if args.write and not any("..." in e for e in expected):
                    readme = rewrite(readme, command, expected, shown)
                    state, why = "WRITTEN", "the README block now shows this run's output"
                else:
                    failed += 1
            print(f"{state}  {command[:100]}" + ("" if ok else f"\n         {why[:300]}"))
        if args.write:
            (ROOT / "README.md").write_text(readme)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
