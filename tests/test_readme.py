"""The README as a user reads it: the two commands that open it, the test command CI runs, its
links, the sections other features document themselves in, and every ``tune-cp`` command of
its examples parsed by the real CLI (options and files exist; nothing is run here:
``python benchmarks/readme_examples.py`` runs each example and compares its output)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
FIRST_LINES = [
    "python3 -m venv .venv && . .venv/bin/activate && pip install . && tune-cp --model "
    "mixtral-8x22b --nodes 4",
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && python -m "
    "pytest -q",
]


def code_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(info string, lines) of each fenced block."""
    blocks, lang, lines, inside = [], "", [], False
    for line in text.splitlines():
        if line.startswith("```"):
            if inside:
                blocks.append((lang, lines))
                inside = False
            else:
                lang, lines, inside = line[3:].strip(), [], True
        elif inside:
            lines.append(line)
    assert not inside, "an unclosed code block"
    return blocks


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"(?m)^#{1,6} (.+)$", text)}


def test_the_readme_opens_with_the_two_commands_that_work_on_a_fresh_machine():
    lang, lines = code_blocks(README)[0]
    assert README.startswith("# tune-cp\n\n```bash\n")
    assert (lang, lines) == ("bash", FIRST_LINES)


def test_ci_runs_the_readmes_test_command():
    """.ci/run installs the test extra and runs the README's test command as written."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    test_command = FIRST_LINES[1].rsplit(" && ", 1)[1]
    assert test_command in ci
    assert "python -m pip install --quiet '.[test]'" in ci


def test_the_readme_has_a_table_of_contents_whose_links_resolve():
    assert "\n## Contents\n" in README
    own = anchors(README)
    links = re.findall(r"\]\(#([^)]+)\)", README)
    assert len(links) >= 15
    assert [a for a in links if a not in own] == []


def test_links_into_docs_resolve():
    for path, anchor in re.findall(r"\]\((docs/[^)#]+)(?:#([^)]+))?\)", README):
        target = ROOT / path
        assert target.is_file(), path
        if anchor:
            assert anchor in anchors(target.read_text()), f"{path}#{anchor}"


@pytest.mark.parametrize("home", ["Install", "Framework versions", "How to read the output",
                                  "Glossary", "MoE", "Memory verdict", "JSON output",
                                  "Input rules", "Exports", "Known limits"])
def test_the_sections_other_features_document_themselves_in(home):
    assert re.search(rf"(?m)^#{{2,3}} {re.escape(home)}$", README), home


@pytest.mark.parametrize("term", ["`TP PP VPP CP EP ETP DP`", "`mbs`, `ga`", "`best` / `*`",
                                  "`~`", "`80% interval`", "`MFU`", "`note: MFU",
                                  "`gain by change (path from the baseline)`"])
def test_the_glossary_explains_what_the_output_prints(term):
    glossary = README.split("### Glossary", 1)[1].split("\n### ", 1)[0]
    assert f"| {term}" in glossary


def test_the_readme_states_the_python_version_pyproject_requires():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.11"' in pyproject
    assert "Python >= 3.11" in README


def readme_commands() -> list[str]:
    """Every tune-cp command of the README's examples: the ``$ tune-cp`` lines of output blocks
    and the ``tune-cp`` lines of bash blocks (continuations joined), as typed."""
    out = []
    for lang, lines in code_blocks(README):
        joined: list[str] = []
        for line in lines:
            if joined and joined[-1].endswith("\\"):
                joined[-1] = joined[-1][:-1] + " " + line.strip()
            else:
                joined.append(line)
        for line in joined:
            if line.startswith("$ tune-cp "):
                out.append(line[2:])
            elif lang == "bash":
                out += [part.strip() for part in line.split("&&")
                        if part.strip().startswith("tune-cp ")]
    return out


def test_the_readme_has_its_examples():
    cmds = readme_commands()
    assert len(cmds) >= 15
    assert cmds[0] == "tune-cp --model mixtral-8x22b --nodes 4"


@pytest.mark.parametrize("command", readme_commands())
def test_each_readme_command_parses(command, tmp_path, monkeypatch):
    """The CLI's own parser takes the example as written (every option exists, every value
    converts, every input file it names exists); nothing is run."""
    from tune_cp.cli import DefaultGroup, main

    monkeypatch.chdir(ROOT)
    typed = command.replace('"$(cat args.txt)"', "'--tensor-model-parallel-size 1'")
    words = shlex.split(typed, comments=True)
    if ">" in words:
        words = words[:words.index(">")]
    args = words[1:]
    shipped = [w for w in args if w.startswith(("tests/", "benchmarks/", "docs/"))]
    assert [w for w in shipped if not (ROOT / w).is_file()] == []
    assert isinstance(main, DefaultGroup)
    if args[0] not in main.commands:
        args = [main.default_command, *args]
    cmd = main.commands[args[0]]
    try:
        cmd.make_context(args[0], args[1:])
    except click.exceptions.Exit:
        pass
    except click.UsageError as e:
        pytest.fail(f"{command}: {e.format_message()}")
