"""No list of axes outside the axis registry (``config/axes.py``).

Walks every Python file of the repository (the package, the benchmarks; not ``config/``, whose
registry is the one home, nor these tests, which pin the registry's values) for

* literal tuples, lists, sets and dict keys that name three or more axes (an axis counts once
  however many of its fields are named: the recompute option's four fields are one change of
  one axis), and
* literal domains of axis values: a collection of two or more integers bound to a name that
  names an axis (``MBS_CHOICES = (1, 2, 4, 8, 16)``, ``def f(mbs=(1, 2))``).

Each such list is a second copy of a registry fact that drifts (issue 26: micro-batch sizes
(1, 2, 4, 8) in the space against (1, 2, 4, 8, 16) in the seed phase). Derive it from the
registry instead. The few literal collections that are not lists of axes (which axes a rule
family reads, a rendering's hand-written flag order, a benchmark's cases) are listed in
:data:`ALLOWED` with the reason, by file and the enclosing top-level definition, so a new one
anywhere fails with its file and line.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tune_cp.config.axes import AXES, KNOBS

ROOT = Path(__file__).resolve().parents[1]
SKIPPED = {".venv", "config", "tests", ".git", "build", ".golden-out"}

#: Field or axis name -> the axis it belongs to (a knob without an axis is its own).
AXIS_OF: dict[str, str] = {k.field: k.axis or k.field for k in KNOBS} | {a: a for a in AXES}
#: The least number of distinct axes that makes a literal collection an axis list.
MIN_AXES = 3

#: (file, enclosing top-level definition) -> why its literal collection is not an axis list.
ALLOWED: dict[tuple[str, str], str] = {
    ("solver/rules.py", "world_size"): "the axes a violation names (the rule's own message)",
    ("solver/rules.py", "RULES"): "rule family names (some spelt like the axes they check)",
    ("solver/rules.py", "FAMILY_AXES"): "which axes each rule family reads (the rule's fact)",
    ("solver/rules.py", "SETTING_FIELD_AXIS"): "the fields the run-settings refusals read",
    ("solver/model.py", "ENCODERS"): "rule family names -> their CP-SAT encoders",
    ("solver/model.py", "enc_run_settings"): "the fields the run-settings refusals read",
    ("solver/explain.py", "FAMILY_WORDS"): "rule family names -> their words",
    ("solver/explain.py", "relaxations"): "the axes the explanation widens by hand above",
    ("calibration/refit.py", "_titan_run"): "torchtitan's own key names",
    ("formats/keys.py", "CONFIG_KEYS"): "Megatron-LM argument dests -> key types (formats)",
    ("formats/parse.py", "_interpret"): "the launch's layout keys read with one key type",
    ("agent/report.py", "check_command"): "the flags check_command always writes, by hand",
    ("agent/backend.py", "presets"): "MoE backend presets (values of backend fields)",
    ("agent/search.py", "DISPATCH_FIELDS"): "the dispatcher and the fields that go with it",
    ("benchmarks/crosscheck.py", "SLICINGS"): "the slicings the cross-check draws (cases)",
    ("benchmarks/memory_truth.py", "main"): "the truth script's own command-line options",
}


def _top_level_names(tree: ast.Module) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of every top-level definition and assignment."""
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((node.lineno, node.end_lineno or node.lineno, node.name))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    out.append((node.lineno, node.end_lineno or node.lineno, t.id))
    return out


def _owner(spans: list[tuple[int, int, str]], line: int) -> str:
    return next((name for lo, hi, name in spans if lo <= line <= hi), "<module>")


def _axis_names(node: ast.AST) -> set[str]:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        elts = node.elts
    elif isinstance(node, ast.Dict):
        elts = [k for k in node.keys if k is not None]
    else:
        return set()
    return {AXIS_OF[e.value] for e in elts
            if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in AXIS_OF}


def _int_domain(node: ast.AST | None) -> bool:
    return (isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2
            and all(isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts))


def _names_axis(name: str) -> bool:
    return any(part in AXES for part in re.split(r"_+", name.lower()))


def _bound_domains(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of literal integer domains bound to an axis-named name or parameter."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                name = t.id if isinstance(t, ast.Name) else (
                    t.attr if isinstance(t, ast.Attribute) else None)
                if name and _names_axis(name) and _int_domain(node.value):
                    out.append((node.lineno, name))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults, strict=True))
            pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
                      if d is not None]
            out += [(d.lineno, arg.arg) for arg, d in pairs
                    if _names_axis(arg.arg) and _int_domain(d)]
        elif isinstance(node, ast.keyword) and node.arg and _names_axis(node.arg) and \
                _int_domain(node.value):
            out.append((node.value.lineno, node.arg))
    return out


def axis_list_findings(root: Path = ROOT) -> list[str]:
    """``file:line: why`` for every literal axis list or domain outside the registry."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in SKIPPED:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(rel))
        spans = _top_level_names(tree)
        for node in ast.walk(tree):
            axes = _axis_names(node)
            if len(axes) >= MIN_AXES:
                line = node.lineno  # type: ignore[attr-defined]
                if (rel.as_posix(), _owner(spans, line)) not in ALLOWED:
                    found.append(f"{rel}:{line}: a literal list of axes {sorted(axes)}; "
                                 "derive it from config/axes.py")
        for line, name in _bound_domains(tree):
            found.append(f"{rel}:{line}: a literal domain of {name!r}; declare it in "
                         "config/axes.py (Axis.values / seed_values) and read it from there")
    return found


def test_no_axis_list_outside_the_registry():
    found = axis_list_findings()
    assert not found, "\n".join(found)


def test_every_allowance_is_still_needed():
    """An allowance whose definition holds no axis list any more is stale: remove it."""
    used = set()
    for rel, owner in ALLOWED:
        path = ROOT / rel
        assert path.exists(), f"{rel} (allowed for {owner}) does not exist"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        spans = _top_level_names(tree)
        for node in ast.walk(tree):
            if len(_axis_names(node)) >= MIN_AXES and _owner(spans, node.lineno) == owner:
                used.add((rel, owner))
    assert set(ALLOWED) == used, f"stale allowances: {sorted(set(ALLOWED) - used)}"


def test_the_walk_finds_what_it_should(tmp_path):
    """The walk fails on the kinds of list it exists for (so it cannot pass vacuously)."""
    pkg = tmp_path / "agent"
    pkg.mkdir()
    (pkg / "x.py").write_text(
        'COLS = ("tp", "pp", "cp")\n'
        'MBS_CHOICES = (1, 2, 4, 8, 16)\n'
        'def f(tp_values=(1, 2)):\n    return {"recompute": 1, "recompute_layers": 2}\n'
        'OK = ("tp", "pp")\n', encoding="utf-8")
    found = axis_list_findings(tmp_path)
    assert [f.split(":")[1] for f in found] == ["1", "2", "3"], found
    assert "agent/x.py:1: a literal list of axes ['cp', 'pp', 'tp']" in found[0]
