"""Extra constraints as data: hard constraints that narrow the search, soft objectives that rank.

This is the interface the tuning agent (and ``--constraint`` on the command line) uses::

    HardConstraint.of("ep * etp <= 8")          # or HardConstraint(expr=..., rationale=...)
    HardConstraint.of("pp in {2, 4} and cp == 1")
    SoftObjective.of("tp", direction="minimize", weight=2, rationale="TP collectives are slow")
    SoftObjective.of("vpp > 1", direction="maximize", rationale="smaller pipeline bubble")

Grammar (parsed with Python's ``ast``, nothing is evaluated by Python): integer literals, the
names of :data:`NAMES`, ``+ - * //``, unary minus, comparisons ``== != < <= > >=`` (chains
allowed), ``x in {1, 2}`` / ``x not in {...}``, ``and``, ``or``, ``not``, parentheses. Anything
else is a :class:`~config.specs.ConfigError` naming the offending token and the allowed names.

A hard constraint is compiled twice from the same syntax tree: to CP-SAT (:func:`compile_expr`,
used by ``solver/model.py``, family ``extra``) and to a Python evaluator (:meth:`holds`, used by
the ``extra`` rule in ``solver/rules.py`` and by ``tune-cp check --constraint``). Hard
constraints only ever add restrictions: every legality family stays in force.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Mapping, Sequence
from enum import StrEnum
from functools import cached_property
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError, field_validator

from tune_cp.config.axes import CONSTRAINT_NAME_AXES, CONSTRAINT_NAMES, KNOB
from tune_cp.config.specs import ConfigError, ParallelConfig, Spec

if TYPE_CHECKING:  # compile_expr works on the solver's values; a check needs no OR-Tools
    from tune_cp.solver.symbolic import Arith, Value

#: Names a constraint may use: the integer axes and the derived dp and ga
#: (``config/axes.py::CONSTRAINT_NAMES``).
NAMES: tuple[str, ...] = CONSTRAINT_NAMES
#: The search axes (``solver/space.AXES``) each name depends on.
NAME_AXES: dict[str, tuple[str, ...]] = CONSTRAINT_NAME_AXES
GRAMMAR = ("integers, + - * //, comparisons (== != < <= > >=), 'in {...}', 'not in {...}', "
           "and, or, not")

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//"}
_CMPOPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
           ast.In: "in", ast.NotIn: "not in"}
_BAD_OPS = {ast.Pow: "**", ast.Div: "/", ast.Mod: "%", ast.MatMult: "@", ast.BitAnd: "&",
            ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>",
            ast.Is: "is", ast.IsNot: "is not", ast.Invert: "~"}


def axis_values(cfg: ParallelConfig) -> dict[str, int]:
    """The values of :data:`NAMES` for a resolved configuration."""
    assert cfg.dp is not None and cfg.ga is not None, "resolve_config() first"
    return {n: getattr(cfg, KNOB[n].view or n) if n in KNOB else getattr(cfg, n) for n in NAMES}


# ------------------------------------------------------------------------------- parsing


def _error(text: str, what: str) -> ConfigError:
    return ConfigError(f"{what} in constraint '{text}'; use {GRAMMAR} over "
                       f"{', '.join(NAMES)}")


def parse(text: str) -> tuple[ast.expr, str]:
    """The checked syntax tree of ``text`` and its kind, ``"condition"`` or ``"number"``."""
    src = text.strip()
    if not src:
        raise ConfigError(f"empty constraint; write e.g. 'ep * etp <= 8' over {', '.join(NAMES)}")
    if len(src) > MAX_EXPR_CHARS:
        raise ConfigError(f"constraint '{src[:60]}...' is {len(src):,} characters; at most "
                          f"{MAX_EXPR_CHARS:,} (split it into several --constraint)")
    try:
        tree = ast.parse(src, mode="eval").body
    except SyntaxError as e:
        raise ConfigError(f"constraint '{src}' is not an expression ({e.msg}); use {GRAMMAR} "
                          f"over {', '.join(NAMES)}") from None
    except (RecursionError, MemoryError):
        raise ConfigError(f"constraint '{src[:60]}...' nests too deeply; at most "
                          f"{MAX_EXPR_DEPTH} levels") from None
    _check_spelling(src)
    depth = _depth(tree)
    if depth > MAX_EXPR_DEPTH:
        raise ConfigError(f"constraint '{src[:60]}{'...' if len(src) > 60 else ''}' nests "
                          f"{depth} levels deep; at most {MAX_EXPR_DEPTH}")
    return tree, _kind(tree, src)


#: Longest constraint or preference (characters) and deepest nesting of its syntax tree: far
#: beyond any real one (``pp in {2, 4} and ep * etp <= 8`` is 4 deep), small enough that
#: parsing and compiling stay instant and never reach Python's recursion limit.
MAX_EXPR_CHARS = 2000
MAX_EXPR_DEPTH = 64
#: Largest integer a constraint may hold, and the largest magnitude any of its
#: subexpressions may reach over the search space: CP-SAT works in signed 64-bit integers.
MAX_EXPR_INT = 2**62


#: How an integer of a constraint is spelled: ASCII digits only (as every number tune-cp reads:
#: ``oracle/inputs.py::NUMBER_SPELLING``). Python also reads ``1_000``, ``0x10``, ``0o7`` and
#: ``0b1``; a name is read after NFKC normalisation (``ｔｐ`` is ``tp``); tune-cp reads neither,
#: so that what it reads is what the user sees.
INT_SPELLING = re.compile(r"[0-9]+")


def _check_spelling(src: str) -> None:
    """Every number of ``src`` in ASCII digits and every name in ASCII (one tokenizer pass over
    text that already parsed)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(src).readline))
    except (tokenize.TokenError, SyntaxError):  # parsed by ast: cannot happen, checked there
        return
    for tok in tokens:
        if tok.type == tokenize.NUMBER and not INT_SPELLING.fullmatch(tok.string):
            raise _error(src, f"'{tok.string}' is not an integer in ASCII digits (such as 8 "
                              f"or 1000)")
        if tok.type == tokenize.NAME and not tok.string.isascii():
            raise _error(src, f"'{tok.string}' is not an ASCII name")


def _depth(tree: ast.AST) -> int:
    """Depth of a syntax tree, without recursion (operands of one and/or count once)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_EXPR_DEPTH:
            return d
        stack.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _kind(node: ast.AST, src: str) -> str:
    """Check ``node`` against the grammar; return ``condition`` or ``number``."""
    def seg() -> str:  # only for messages: computing it per node would be quadratic
        return ast.get_source_segment(src, node) or type(node).__name__

    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int):
            raise _error(src, f"{node.value!r} is not an integer")
        if abs(node.value) > MAX_EXPR_INT:
            raise _error(src, f"an integer of {len(str(node.value))} digits is beyond int64 "
                              f"(|n| <= 2**62)")
        return "number"
    if isinstance(node, ast.Name):
        if node.id not in NAMES:
            raise ConfigError(f"unknown name '{node.id}' in constraint '{src}'; allowed names: "
                              f"{', '.join(NAMES)}")
        return "number"
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise _error(src, f"'{_BAD_OPS.get(type(node.op), type(node.op).__name__)}' is not "
                              f"allowed")
        for side in (node.left, node.right):
            if _kind(side, src) != "number":
                raise _error(src, f"'{ast.get_source_segment(src, side)}' is a condition, not a "
                                  f"number,")
        return "number"
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.USub | ast.UAdd):
            if _kind(node.operand, src) != "number":
                raise _error(src, f"'{seg()}' negates a condition")
            return "number"
        if isinstance(node.op, ast.Not):
            if _kind(node.operand, src) != "condition":
                raise _error(src, f"'{seg()}' applies 'not' to a number")
            return "condition"
        raise _error(src, f"'{_BAD_OPS.get(type(node.op), type(node.op).__name__)}' is not allowed")
    if isinstance(node, ast.BoolOp):
        for v in node.values:
            if _kind(v, src) != "condition":
                raise _error(src, f"'{ast.get_source_segment(src, v)}' is a number where "
                                  f"'and'/'or' need a condition")
        return "condition"
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        for op, right in zip(node.ops, node.comparators, strict=True):
            if type(op) not in _CMPOPS:
                raise _error(src, f"'{_BAD_OPS.get(type(op), type(op).__name__)}' is not allowed")
            if isinstance(op, ast.In | ast.NotIn):
                _int_set(right, src)
        for i, x in enumerate(operands):
            is_set_side = i > 0 and isinstance(node.ops[i - 1], ast.In | ast.NotIn)
            if not is_set_side and _kind(x, src) != "number":
                raise _error(src, f"'{ast.get_source_segment(src, x)}' is a condition where a "
                                  f"comparison needs a number")
        return "condition"
    raise _error(src, f"'{seg()}' is not allowed")


def _int_set(node: ast.AST, src: str) -> frozenset[int]:
    if not isinstance(node, ast.Set | ast.Tuple | ast.List):
        raise _error(src, f"'{ast.get_source_segment(src, node)}' after 'in' is not a set of "
                          f"integers like {{2, 4}}")
    out = set()
    for e in node.elts:
        v = e
        sign = 1
        if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.USub):
            sign, v = -1, v.operand
        if not (isinstance(v, ast.Constant) and isinstance(v.value, int)
                and not isinstance(v.value, bool)):
            raise _error(src, f"'{ast.get_source_segment(src, e)}' in a set is not an integer")
        if abs(v.value) > MAX_EXPR_INT:
            raise _error(src, "an integer in a set is beyond int64 (|n| <= 2**62)")
        out.add(sign * v.value)
    return frozenset(out)


def names_in(tree: ast.AST) -> tuple[str, ...]:
    return tuple(sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}))


# ------------------------------------------------------------------------- evaluation


def evaluate(tree: ast.AST, env: Mapping[str, int]) -> int | bool:
    """The Python value of a checked tree (``//`` floors, as in Python)."""
    if isinstance(tree, ast.Constant):
        return tree.value
    if isinstance(tree, ast.Name):
        return env[tree.id]
    if isinstance(tree, ast.BinOp):
        a, b = evaluate(tree.left, env), evaluate(tree.right, env)
        op = _BINOPS[type(tree.op)]
        if op == "//" and b == 0:
            raise ConfigError("division by zero in a constraint")
        return {"+": a + b, "-": a - b, "*": a * b}.get(op) if op != "//" else a // b
    if isinstance(tree, ast.UnaryOp):
        v = evaluate(tree.operand, env)
        return (not v) if isinstance(tree.op, ast.Not) else (-v if isinstance(tree.op, ast.USub)
                                                              else v)
    if isinstance(tree, ast.BoolOp):
        vals = (bool(evaluate(v, env)) for v in tree.values)
        return all(vals) if isinstance(tree.op, ast.And) else any(vals)
    if isinstance(tree, ast.Compare):
        left = evaluate(tree.left, env)
        for op, node in zip(tree.ops, tree.comparators, strict=True):
            if isinstance(op, ast.In | ast.NotIn):
                ok = (left in _int_set(node, "")) == isinstance(op, ast.In)
                right = left
            else:
                right = evaluate(node, env)
                ok = {ast.Eq: left == right, ast.NotEq: left != right, ast.Lt: left < right,
                      ast.LtE: left <= right, ast.Gt: left > right,
                      ast.GtE: left >= right}[type(op)]
            if not ok:
                return False
            left = right
        return True
    raise AssertionError(f"unchecked node {type(tree).__name__}")


def _bounds(v: Value) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (v.lo, v.hi)


def _check_range(op: str, a: Value, b: Value) -> None:
    """Refuse ``a op b`` when its value could leave CP-SAT's 64-bit range over the space (a
    one-line error instead of an overflow inside OR-Tools)."""
    (alo, ahi), (blo, bhi) = _bounds(a), _bounds(b)
    if op == "*":
        ends = [x * y for x in (alo, ahi) for y in (blo, bhi)]
    elif op in ("+", "-"):
        ends = [alo + blo, ahi + bhi] if op == "+" else [alo - bhi, ahi - blo]
    else:
        ends = [alo, ahi]
    if max(abs(e) for e in ends) > MAX_EXPR_INT:
        raise ConfigError(f"a constraint's '{op}' reaches values beyond int64 over the search "
                          f"space (up to {max(abs(e) for e in ends):.3g}); keep every "
                          f"subexpression within 2**62")


def compile_expr(tree: ast.AST, env: Mapping[str, Value], ar: Arith) -> Value:
    """The CP-SAT value of a checked tree: a :class:`~solver.symbolic.Sym` (0/1 for a
    condition) over the model's variables ``env``; every variable it creates is determined."""
    if isinstance(tree, ast.Constant):
        return int(tree.value)
    if isinstance(tree, ast.Name):
        return env[tree.id]
    if isinstance(tree, ast.BinOp):
        a, b = compile_expr(tree.left, env, ar), compile_expr(tree.right, env, ar)
        op = _BINOPS[type(tree.op)]
        _check_range(op, a, b)
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        try:
            return a // b
        except (ValueError, ZeroDivisionError) as e:
            raise ConfigError(f"'//' in a constraint needs a positive divisor and a left side "
                              f"that keeps its sign ({e})") from None
    if isinstance(tree, ast.UnaryOp):
        v = compile_expr(tree.operand, env, ar)
        if isinstance(tree.op, ast.Not):
            return ar.negate(v)
        return -v if isinstance(tree.op, ast.USub) else v
    if isinstance(tree, ast.BoolOp):
        vals = [compile_expr(v, env, ar) for v in tree.values]
        return ar.all_of(vals, "and") if isinstance(tree.op, ast.And) else ar.any_of(vals, "or")
    if isinstance(tree, ast.Compare):
        parts = []
        left = compile_expr(tree.left, env, ar)
        for op, node in zip(tree.ops, tree.comparators, strict=True):
            if isinstance(op, ast.In | ast.NotIn):
                inside = ar.in_set(left, _int_set(node, ""), "in")
                parts.append(inside if isinstance(op, ast.In) else ar.negate(inside))
                continue
            right = compile_expr(node, env, ar)
            _check_range("-", left, right)
            diff = left - right
            if isinstance(op, ast.LtE):
                parts.append(ar.le(diff, 0, "le"))
            elif isinstance(op, ast.Lt):
                parts.append(ar.le(diff, -1, "lt"))
            elif isinstance(op, ast.GtE):
                parts.append(ar.le(-diff, 0, "ge"))
            elif isinstance(op, ast.Gt):
                parts.append(ar.le(-diff, -1, "gt"))
            elif isinstance(op, ast.Eq):
                parts.append(ar.in_set(diff, (0,), "eq"))
            else:
                parts.append(ar.negate(ar.in_set(diff, (0,), "ne")))
            left = right
        return ar.all_of(parts, "cmp")
    raise AssertionError(f"unchecked node {type(tree).__name__}")


# ----------------------------------------------------------------------------- the specs


class _Parsed(Spec):
    """A checked expression over :data:`NAMES`."""

    expr: str = Field(description="e.g. 'ep * etp <= 8', 'pp in {2, 4}'")
    rationale: str = Field(default="", description="why: shown with the constraint")

    @cached_property
    def tree(self) -> ast.expr:
        return parse(self.expr)[0]

    @cached_property
    def kind(self) -> str:
        return parse(self.expr)[1]

    @property
    def names(self) -> tuple[str, ...]:
        return names_in(self.tree)

    @property
    def axes(self) -> tuple[str, ...]:
        """The search axes the expression depends on."""
        return tuple(sorted({a for n in self.names for a in NAME_AXES[n]}))

    def value(self, env: Mapping[str, int]) -> int:
        return int(evaluate(self.tree, env))

    def describe(self, env: Mapping[str, int]) -> str:
        """The values behind a verdict: the left side of a comparison, else the names."""
        t = self.tree
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and not isinstance(t.left, ast.Name):
            seg = ast.get_source_segment(self.expr.strip(), t.left)
            return f"{seg} = {evaluate(t.left, env)}"
        return ", ".join(f"{n} = {env[n]}" for n in self.names)

    @classmethod
    def of(cls, expr: str, **kw: Any) -> Any:
        """Build from text; a bad expression is a one-line :class:`ConfigError`."""
        try:
            return cls(expr=expr, **kw)
        except ValidationError as e:
            err = e.errors()[0]
            raise ConfigError(str(err.get("ctx", {}).get("error", err["msg"]))) from None


class HardConstraint(_Parsed):
    """A condition every returned configuration satisfies, e.g. ``ep * etp <= 8``."""

    @field_validator("expr")
    @classmethod
    def _check(cls, v: str) -> str:
        _, kind = parse(v)
        if kind != "condition":
            raise ConfigError(f"constraint '{v.strip()}' is a number, not a condition; compare it, "
                              f"e.g. '{v.strip()} <= 8'")
        return v.strip()

    def holds(self, env: Mapping[str, int]) -> bool:
        return bool(evaluate(self.tree, env))


class Direction(StrEnum):
    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


class SoftObjective(_Parsed):
    """A preference: an expression (or a condition, worth 1 when it holds) to minimize or
    maximize, with an integer weight. Objectives rank feasible configurations; they never
    remove one."""

    direction: Direction = Direction.MINIMIZE
    weight: int = Field(default=1, ge=1, le=1_000_000)

    @field_validator("expr")
    @classmethod
    def _check(cls, v: str) -> str:
        parse(v)
        return v.strip()

    def score(self, env: Mapping[str, int]) -> int:
        """Signed contribution to a score that is *minimized*."""
        sign = 1 if self.direction is Direction.MINIMIZE else -1
        return sign * self.weight * self.value(env)


def as_constraints(items: Sequence[HardConstraint | str]) -> tuple[HardConstraint, ...]:
    """Constraints from objects or text (text is parsed with :meth:`HardConstraint.of`)."""
    return tuple(c if isinstance(c, HardConstraint) else HardConstraint.of(c) for c in items)


def score(objectives: Sequence[SoftObjective], cfg: ParallelConfig) -> int:
    """Weighted objective of a resolved configuration (lower is better)."""
    env = axis_values(cfg)
    return sum(o.score(env) for o in objectives)
