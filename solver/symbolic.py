"""Integer arithmetic on CP-SAT expressions, so the oracle's own functions run inside the model.

:class:`Sym` wraps a CP-SAT linear expression with exact bounds. ``+``, ``-`` and ``*`` by an
integer stay linear; ``*`` of two expressions, ``//`` and :func:`oracle.memory.vmax` create one
variable each, defined by ``AddMultiplicationEquality`` / ``AddDivisionEquality`` /
``AddMaxEquality``. Every variable created here is a *function* of its operands (never free), so
solution enumeration never repeats a configuration. Floor division keeps Python's semantics on
sign-definite operands (CP-SAT truncates toward zero), which covers ``-(-a // b)`` ceiling
division. Comparisons with integers return a Python bool when the bounds decide them (``is_moe``
in :func:`oracle.memory.combine`) and raise otherwise. Values that the bounds pin to one number
are plain ``int``, so constant parts of a formula fold away.

:meth:`Arith.lookup` tabulates any function of a few small-domain variables (units per
(tp, ep, etp), stage coefficients per pipeline geometry): one ``AddAllowedAssignments`` defines a
row index, one ``AddElement`` per output column defines its value; with ``direct_tables``
(enumeration models, solved without presolve) one ``AddAllowedAssignments`` over the keys and
the output columns defines the columns (columns that are affine functions of one another share
one variable).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import product
from math import gcd
from operator import itemgetter
from typing import Any, Union

import numpy as np

from tune_cp.solver.cpsat import cp_model, cp_model_helper

Value = Union[int, "Sym"]
#: Value sets are tracked through + and * while their product stays this small.
MAX_TRACKED_VALUES = 1 << 14


class Arith:
    """A CP-SAT model plus the bookkeeping of :class:`Sym` expressions."""

    def __init__(self, model: cp_model.CpModel) -> None:
        self.model = model
        self._count = 0
        #: common subexpressions: a value already defined (a product, a division, a maximum, a
        #: variable equal to a linear expression, a table's columns) is reused, not redefined
        self._cse: dict[tuple[Any, ...], Any] = {}
        #: floor division by a constant as two linear constraints (else AddDivisionEquality)
        self.linear_division = False
        #: tables over the keys and the output columns themselves (else a row index and one
        #: element per column): less to propagate while enumerating without presolve, but
        #: OR-Tools 9.15's presolve takes tens of seconds on wide tables, so only for models
        #: solved without it
        self.direct_tables = False
        #: required predicates (``predicate(required=True)``) recorded as relations (keys'
        #: canonical forms, allowed rows); later lookups leave out the rows they refuse
        self.record_relations = False
        self.relations: list[tuple[tuple[tuple[Any, ...], ...], set[tuple[int, ...]]]] = []

    def name(self, stem: str) -> str:
        self._count += 1
        return f"{stem}#{self._count}"

    # ------------------------------------------------------------------ variables

    def var(self, values: Iterable[int], stem: str) -> Value:
        """A variable over ``values`` (an ``int`` if there is only one)."""
        vals = sorted(set(values))
        if len(vals) == 1:
            return vals[0]
        v = self.model.NewIntVarFromDomain(cp_model.Domain.FromValues(vals), self.name(stem))
        return Sym(self, v, vals[0], vals[-1], tuple(vals))

    def bool(self, stem: str) -> Sym:
        v = self.model.NewBoolVar(self.name(stem))
        return Sym(self, v, 0, 1, (0, 1))

    def as_var(self, x: Value, stem: str = "aux") -> cp_model.IntVar | int:
        """A CP-SAT variable (or int) equal to ``x``."""
        if isinstance(x, int):
            return x
        if isinstance(x.expr, cp_model.IntVar):
            return x.expr
        key = ("var", linear_key(x))
        v = self._cse.get(key)
        if v is None:
            v = self._cse[key] = self.model.NewIntVar(x.lo, x.hi, self.name(stem))
            self.model.Add(v == x.expr)
        x.expr = v
        return v

    def literal(self, x: Value) -> Any:
        """A Boolean literal for a 0/1 value (constants become fixed literals)."""
        if isinstance(x, int):
            assert x in (0, 1)
            return self.model.NewConstant(x)
        assert 0 <= x.lo and x.hi <= 1, "not a 0/1 value"
        if isinstance(x.expr, cp_model.IntVar | cp_model.NotBooleanVariable):
            return x.expr
        return self.as_var(x, "lit")

    # ------------------------------------------------------------------ tables

    def lookup(
        self,
        keys: Sequence[Value],
        fn: Callable[..., Sequence[int]],
        stem: str,
        tuples: Iterable[tuple[int, ...]] | None = None,
        required: bool = False,
    ) -> tuple[Value, ...]:
        """Columns of ``fn(*key)`` for the key the variables ``keys`` take.

        ``fn`` is called once per key tuple: the product of the keys' domains, or ``tuples``
        (which must cover every combination the keys can take together). Each output column is
        then tabulated over the smallest set of keys it depends on (found on the computed rows,
        so exact), columns with the same key set share one table: small tables propagate fast.
        ``required`` (0/1 columns): the keys are restricted to where every column is 1, and
        the columns are 1 (or the constant 0 when a column is 0 whatever the keys).
        """
        live = [i for i, k in enumerate(keys) if not isinstance(k, int)]
        consts = [(i, k) for i, k in enumerate(keys) if isinstance(k, int)]
        if tuples is None:
            keys_rows = list(product(*[domain_of(k) for k in keys]))
        elif consts:
            keys_rows = [key for key in tuples if all(key[i] == v for i, v in consts)]
        else:
            keys_rows = list(tuples)
        if not keys_rows:
            raise ValueError(f"{stem}: no key tuple matches the constant keys")
        if self.relations:
            keys_rows = self._admissible(keys, keys_rows)
        outs = [tuple(fn(*key)) for key in keys_rows]
        # the rows on the live keys only (positions 0 .. len(live) - 1)
        rows = list(map(_getter(live), keys_rows)) if consts else keys_rows
        constants, plan = _plan(rows, outs)
        out: list[Value] = [0] * len(outs[0])
        for c, v in constants:
            out[c] = v
        if not plan:
            self.allow([keys[i] for i in live], rows)
        for subset, cols, proj in plan:
            if required:
                allowed = [k for k, o in proj.items() if all(o)]
                self.allow([keys[live[i]] for i in subset], allowed)
                if self.record_relations and allowed:
                    self.relations.append(
                        (tuple(linear_key(keys[live[i]]) for i in subset), set(allowed)))
                for c in cols:
                    out[c] = 1
                continue
            distinct = {o: j for j, o in enumerate(dict.fromkeys(proj.values()))}
            assignments = [(*k, distinct[o]) for k, o in proj.items()]
            vals = self.table([keys[live[i]] for i in subset], assignments, list(distinct), stem)
            for c, v in zip(cols, vals, strict=True):
                out[c] = v
        return tuple(out)

    def _admissible(self, keys: Sequence[Value],
                    keys_rows: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """``keys_rows`` less those a recorded relation on some of ``keys`` refuses (kept
        whole if that would leave none: the model is infeasible then anyway)."""
        pos: dict[tuple[Any, ...], int] = {}
        for i, k in enumerate(keys):
            if not isinstance(k, int):
                pos.setdefault(linear_key(k), i)
        rows = keys_rows
        for rkeys, allowed in self.relations:
            if all(k in pos for k in rkeys):
                key_of = _getter([pos[k] for k in rkeys])
                rows = [r for r in rows if key_of(r) in allowed]
        return rows or keys_rows

    def table(
        self,
        keys: Sequence[Value],
        assignments: Sequence[tuple[int, ...]],
        outputs: Sequence[Sequence[int]],
        stem: str,
    ) -> tuple[Value, ...]:
        """Columns of ``outputs[row]`` where ``(*keys, row)`` is one of ``assignments``."""
        n_cols = len(outputs[0])
        key = ("table", tuple(linear_key(k) for k in keys), tuple(assignments),
               tuple(map(tuple, outputs)))
        got = self._cse.get(key)
        if got is not None:
            return got
        self._cse[key] = got = self._table(keys, assignments, outputs, stem, n_cols)
        return got

    def _table(self, keys: Sequence[Value], assignments: Sequence[tuple[int, ...]],
               outputs: Sequence[Sequence[int]], stem: str, n_cols: int) -> tuple[Value, ...]:
        if len(outputs) == 1:
            self.allow(keys, [a[:-1] for a in assignments])
            return tuple(outputs[0])
        if not self.direct_tables:
            row = self.var(range(len(outputs)), f"{stem}_row")
            self.allow([*keys, row], assignments)
            return tuple(self.element(row, [o[c] for o in outputs], f"{stem}{c}")
                         for c in range(n_cols))
        # one table over the keys and the distinct column shapes (no row index, no element
        # constraints): columns that are affine functions of one another with integer factors
        # share a shape variable (``affine_shape``), so fewer variables are value-encoded
        shapes, forms = _shapes(tuple(map(tuple, outputs)))
        base = [self.var(shape, f"{stem}{j}") for j, shape in enumerate(shapes)]
        rows = [(*a[:-1], *(shape[a[-1]] for shape in shapes)) for a in assignments]
        self.allow([*keys, *base], rows)
        return tuple(base[shapes[shape]] * scale + offset if scale else offset
                     for shape, scale, offset in forms)

    def element(self, index: Value, values: Sequence[int], stem: str) -> Value:
        """``values[index]``: an affine expression of ``index`` when the values are (a 0/1
        predicate always is), else a variable defined by ``AddElement``."""
        if isinstance(index, int):
            return values[index]
        dom = domain_of(index)
        if len({values[i] for i in dom}) == 1:
            return values[dom[0]]
        step = (values[dom[1]] - values[dom[0]]) // (dom[1] - dom[0])
        base = values[dom[0]] - step * dom[0]
        if step and all(values[i] == base + step * i for i in dom):
            if dom == [0, 1] and step == -1 and base == 1:
                return self.negate(index)  # 1 - index: the negated literal
            return index * step + base
        out = self.var([values[i] for i in dom], stem)
        assert isinstance(out, Sym)
        self.model.AddElement(self.as_var(index), list(values), self.as_var(out))
        return out

    def allow(self, keys: Sequence[Value], tuples: Iterable[tuple[int, ...]]) -> None:
        """Restrict ``keys`` to ``tuples`` (constant keys filter the tuples; nothing is added
        when every combination of the live keys' domains is allowed)."""
        live = [i for i, k in enumerate(keys) if not isinstance(k, int)]
        consts = {i: k for i, k in enumerate(keys) if isinstance(k, int)}
        if consts:
            allowed = {tuple(t[i] for i in live) for t in tuples
                       if all(t[i] == v for i, v in consts.items())}
        else:
            allowed = set(tuples)
        if not allowed:
            self.model.AddBoolOr([])  # nothing allowed: infeasible
            return
        if not live:
            return
        doms = [domain_of(keys[i]) for i in live]
        size = 1
        for d in doms:
            size *= len(d)
        if size == len(allowed) and allowed == set(product(*doms)):
            return
        self.model.AddAllowedAssignments([self.as_var(keys[i]) for i in live], sorted(allowed))

    def predicate(self, keys: Sequence[Value], fn: Callable[..., bool], stem: str,
                  required: bool = False) -> Value:
        """A 0/1 value equal to ``fn(*key)`` (a constant when ``fn`` is constant).
        ``required``: the keys are restricted to where ``fn`` holds, and the value is 1 (0
        when ``fn`` never holds)."""
        (ok,) = self.lookup(keys, lambda *k: (int(bool(fn(*k))),), stem, required=required)
        return ok

    # ------------------------------------------------------------------ logic

    def all_of(self, items: Sequence[Value], stem: str) -> Value:
        """1 iff every 0/1 item is 1."""
        live = [x for x in items if not isinstance(x, int)]
        if any(isinstance(x, int) and x == 0 for x in items):
            return 0
        if not live:
            return 1
        if len(live) == 1:
            return live[0]
        b = self.bool(stem)
        lits = [self.literal(x) for x in live]
        self.model.AddBoolAnd(lits).OnlyEnforceIf(b.expr)
        self.model.AddBoolOr([lit.Not() for lit in lits]).OnlyEnforceIf(b.expr.Not())
        return b

    def any_of(self, items: Sequence[Value], stem: str) -> Value:
        """1 iff some 0/1 item is 1."""
        return self.negate(self.all_of([self.negate(x) for x in items], stem))

    def negate(self, x: Value) -> Value:
        """1 - x for a 0/1 value."""
        if isinstance(x, int):
            return 1 - x
        return Sym(self, self.literal(x).Not(), 0, 1, (0, 1))

    def le(self, x: Value, bound: int, stem: str, big_m: bool = False) -> Value:
        """1 iff ``x <= bound``, determined, without enforcement literals:
        ``1 - min(1, max(0, x - bound))`` (two ``AddMaxEquality``). A reified linear constraint
        would do, but OR-Tools 9.15 mishandles it here both ways: with presolve, the rule
        "linear + amo: removed enforcement literal" loses solutions of this model while
        enumerating (``tests/test_solver_equivalence.py::test_presolve_regression``); without
        presolve (enumeration), the pair ``b => x <= bound``, ``not b => x >= bound + 1`` with
        byte-sized coefficients makes satisfiable models infeasible
        (``tests/test_solver_slices.py::test_no_presolve_reified_pair``).
        ``big_m``: a Boolean ``b`` with ``x + (hi - bound) b <= hi`` and
        ``x + (bound + 1 - lo) b >= bound + 1`` (``lo``, ``hi``: x's bounds), plain linear
        constraints that are vacuous on the other side; cheaper to propagate (enumeration
        models, without presolve)."""
        if isinstance(x, int):
            return int(x <= bound)
        if x.hi <= bound:
            return 1
        if x.lo > bound:
            return 0
        if big_m:
            b = self.bool(stem)
            # b = 1: x <= bound; b = 0: x >= bound + 1 (each vacuous on the other side)
            self.model.Add(x.expr - bound + (x.hi - bound) * b.expr <= x.hi - bound)
            self.model.Add(x.expr - (bound + 1) + (bound + 1 - x.lo) * b.expr >= 0)
            return b
        excess = M_vmax([x - bound, 0])
        capped = -M_vmax([-excess, -1])  # min(excess, 1)
        return 1 - capped

    def in_set(self, x: Value, values: Iterable[int], stem: str) -> Value:
        """1 iff ``x`` is one of ``values``."""
        vals = sorted(set(values))
        if isinstance(x, int):
            return int(x in vals)
        if x.lo == x.hi:
            return int(x.lo in vals)
        if x.values is not None:
            # a table on x's (tracked) values: no enforced linear constraint (see ``le``)
            return self.predicate([x], lambda v: v in vals, stem)
        dom = cp_model.Domain.FromValues(vals)
        b = self.bool(stem)
        self.model.AddLinearExpressionInDomain(x.expr, dom).OnlyEnforceIf(b.expr)
        self.model.AddLinearExpressionInDomain(x.expr, dom.complement()).OnlyEnforceIf(b.expr.Not())
        return b


#: The analysis of :meth:`Arith.lookup` per (rows, outputs): the slices of an enumeration
#: and the parts of a slice tabulate the same functions on the same rows many times (the
#: geometry of one pp for every tp, the units of a slice for both its recompute parts).
#: In memory only, for this process, the latest :data:`PLAN_MEMO` kept.
_PLANS: dict[tuple[Any, ...], tuple[Any, Any]] = {}
PLAN_MEMO = 2048
#: tables of more cells (rows x columns) than this are not kept
PLAN_MEMO_CELLS = 40_000


def _plan(rows: list[tuple[int, ...]], outs: list[tuple[int, ...]]
          ) -> tuple[list[tuple[int, int]], list[tuple[tuple[int, ...], list[int],
                                                       dict[tuple[int, ...], tuple[int, ...]]]]]:
    """``(constant columns as (column, value), groups)`` of a table: each group is the
    smallest key subset (positions in the rows) some non-constant columns are functions of,
    those columns, and their values per projected key (first row of each projection)."""
    memo_key = (tuple(rows), tuple(outs))
    got = _PLANS.get(memo_key)
    if got is not None:
        return got
    n_out = len(outs[0])
    deps = _Dependencies(rows, outs)
    positions = tuple(range(len(rows[0])))
    groups: dict[tuple[int, ...], list[int]] = {}
    constant = deps.functional(())
    constants = []
    for c in range(n_out):
        if constant[c]:
            constants.append((c, outs[0][c]))
            continue
        subset = positions
        for i in positions:
            trial = tuple(x for x in subset if x != i)
            if deps.functional(trial)[c]:
                subset = trial
        groups.setdefault(subset, []).append(c)
    plan = []
    for subset, cols in groups.items():
        proj: dict[tuple[int, ...], tuple[int, ...]] = {}
        key_of, out_of = _getter(subset), _getter(cols)
        for k, o in zip(rows, outs, strict=True):
            p = key_of(k)
            if p not in proj:
                proj[p] = out_of(o)
        plan.append((subset, cols, proj))
    got = (constants, plan)
    if len(rows) * n_out <= PLAN_MEMO_CELLS:
        if len(_PLANS) >= PLAN_MEMO:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[memo_key] = got
    return got


_SHAPES: dict[tuple[tuple[int, ...], ...], tuple[Any, Any]] = {}


def _shapes(outputs: tuple[tuple[int, ...], ...]
            ) -> tuple[dict[tuple[int, ...], int], list[tuple[tuple[int, ...], int, int]]]:
    """The distinct column shapes of a direct table's outputs (``affine_shape`` of each
    column; numbered in order of appearance) and each column's (shape, scale, offset);
    memoised like :data:`_PLANS`."""
    got = _SHAPES.get(outputs)
    if got is not None:
        return got
    shapes: dict[tuple[int, ...], int] = {}
    forms: list[tuple[tuple[int, ...], int, int]] = []
    for col in zip(*outputs, strict=True):
        shape, scale, offset = affine_shape(col)
        if scale:
            shapes.setdefault(shape, len(shapes))
        forms.append((shape, scale, offset))
    if len(_SHAPES) >= PLAN_MEMO:
        _SHAPES.pop(next(iter(_SHAPES)))
    _SHAPES[outputs] = got = (shapes, forms)
    return got


def affine_shape(col: Sequence[int]) -> tuple[tuple[int, ...], int, int]:
    """``(shape, scale, offset)`` with ``col[i] == offset + scale * shape[i]`` for every row i:
    ``offset = col[0]``, ``scale`` the gcd of the differences from it, signed so that the first
    nonzero difference is positive (``scale == 0``: a constant column, ``shape == ()``). Two
    columns are affine functions of each other with integer factors exactly when their shapes
    are equal."""
    offset = col[0]
    diffs = [v - offset for v in col]
    scale = gcd(*diffs)
    if scale == 0:
        return (), 0, offset
    if next(d for d in diffs if d) < 0:
        scale = -scale
    return tuple([d // scale for d in diffs]), scale, offset


def _getter(idx: Sequence[int]) -> Callable[[Sequence[int]], tuple[int, ...]]:
    """``lambda row: tuple(row[i] for i in idx)``, fast."""
    if not idx:
        return lambda row: ()
    if len(idx) == 1:
        i = idx[0]
        return lambda row: (row[i],)
    return itemgetter(*idx)


class _Dependencies:
    """Which output columns are functions of which key subsets (key positions)."""

    def __init__(self, keys: Sequence[tuple[int, ...]], outs: Sequence[tuple[int, ...]]) -> None:
        self.keys, self.outs = keys, outs
        self.n_out = len(outs[0])
        self._memo: dict[tuple[int, ...], list[bool]] = {}
        self._np: tuple[np.ndarray, np.ndarray] | None = None

    def functional(self, subset: tuple[int, ...]) -> list[bool]:
        """Per output column: is it a function of the key columns ``subset``?"""
        got = self._memo.get(subset)
        if got is None:
            big = len(self.keys) * self.n_out > 4096
            got = self._memo[subset] = self._numpy(subset) if big else self._python(subset)
        return got

    def _python(self, subset: tuple[int, ...]) -> list[bool]:
        ok = [True] * self.n_out
        pending = list(range(self.n_out))
        first: dict[tuple[int, ...], tuple[int, ...]] = {}
        key_of = _getter(subset)
        for k, o in zip(self.keys, self.outs, strict=True):
            f = first.setdefault(key_of(k), o)
            if f is not o and f != o:
                for c in pending:
                    if f[c] != o[c]:
                        ok[c] = False
                pending = [c for c in pending if ok[c]]
                if not pending:
                    break
        return ok

    def _numpy(self, subset: tuple[int, ...]) -> list[bool]:
        if self._np is None:
            keys = np.array(self.keys, dtype=np.int64).reshape(len(self.keys), -1)
            ranks = np.empty_like(keys)
            sizes = []
            for j in range(keys.shape[1]):
                u, ranks[:, j] = np.unique(keys[:, j], return_inverse=True)
                sizes.append(len(u))
            self._np = (ranks, np.array(self.outs, dtype=np.int64).reshape(len(self.outs), -1))
            self._sizes = sizes
        ranks, outs = self._np
        n = len(ranks)
        code = np.zeros(n, dtype=np.int64)
        for i in subset:  # mixed radix: distinct key projections get distinct codes
            code = code * self._sizes[i] + ranks[:, i]
        _, inv = np.unique(code, return_inverse=True)
        inv = inv.reshape(-1)
        first = np.empty(inv.max() + 1, dtype=np.int64)
        first[inv[::-1]] = np.arange(n)[::-1]
        return [bool(x) for x in np.all(outs == outs[first[inv]], axis=0)]


def M_vmax(items: Sequence[Value]) -> Value:
    """``max(items)`` on values (``Sym.__vmax__`` when one is a solver expression)."""
    if all(isinstance(v, int) for v in items):
        return max(items)  # type: ignore[type-var]
    return Sym.__vmax__(items)


def linear_key(x: Value) -> tuple[Any, ...]:
    """A canonical form of a linear value: its constant, and (variable index, coefficient)
    pairs, sorted (equal forms are the same expression)."""
    if isinstance(x, int):
        return ((), x)
    if isinstance(x.expr, cp_model.IntVar):
        return ((x.expr.index, 1),), 0
    f = cp_model_helper.FlatIntExpr(x.expr)
    return tuple(sorted(zip([v.index for v in f.vars], f.coeffs, strict=True))), f.offset


def domain_of(x: Value) -> list[int]:
    """The values a key can take (its exact value set when known, else its bounds' range)."""
    if isinstance(x, int):
        return [x]
    if x.values is not None:
        return list(x.values)
    return list(range(x.lo, x.hi + 1))


class Sym:
    """A CP-SAT expression with exact integer bounds (see the module docstring)."""

    __slots__ = ("_values", "ar", "expr", "hi", "lo")

    def __init__(self, ar: Arith, expr: Any, lo: int, hi: int,
                 values: tuple[int, ...] | Callable[[], Iterable[int] | None] | None = None
                 ) -> None:
        assert lo <= hi
        self.ar, self.expr, self.lo, self.hi, self._values = ar, expr, lo, hi, values

    @property
    def values(self) -> tuple[int, ...] | None:
        """The exact value set (sorted), or None when not tracked. Computed on first use: most
        expressions (memory totals) never need theirs."""
        v = self._values
        if callable(v):
            vals = v()
            v = self._values = None if vals is None else tuple(sorted(set(vals)))
        return v

    def __repr__(self) -> str:
        return f"Sym[{self.lo}..{self.hi}]"

    @staticmethod
    def _make(ar: Arith, expr: Any, lo: int, hi: int,
              values: Callable[[], Iterable[int] | None] | None = None) -> Value:
        if lo == hi:
            return lo
        return Sym(ar, expr, lo, hi, values)

    def _mapped(self, op: Callable[[int], int]) -> Callable[[], list[int] | None] | None:
        """The value set of ``op(self)``, computed when asked."""
        if self._values is None:
            return None
        return lambda: None if self.values is None else [op(v) for v in self.values]

    def _combine_values(self, other: Sym, op: Callable[[int, int], int]
                        ) -> Callable[[], list[int] | None] | None:
        """The exact value set of ``self op other`` when both are small known sets (computed
        when asked)."""
        if self._values is None or other._values is None:
            return None

        def values() -> list[int] | None:
            a, b = self.values, other.values
            if a is None or b is None or len(a) * len(b) > MAX_TRACKED_VALUES:
                return None
            return [op(x, y) for x in a for y in b]

        return values

    # -------------------------------------------------------------- linear

    def __add__(self, other: Value) -> Value:
        if isinstance(other, int):
            if not other:
                return self
            return self._make(self.ar, self.expr + other, self.lo + other, self.hi + other,
                              self._mapped(lambda v: v + other))
        if isinstance(other, Sym):
            return self._make(self.ar, self.expr + other.expr, self.lo + other.lo,
                              self.hi + other.hi, self._combine_values(other, lambda a, b: a + b))
        return NotImplemented

    __radd__ = __add__

    def __neg__(self) -> Value:
        return self._make(self.ar, -self.expr, -self.hi, -self.lo, self._mapped(lambda v: -v))

    def __sub__(self, other: Value) -> Value:
        return self + (-other)

    def __rsub__(self, other: int) -> Value:
        return (-self) + other

    def __mul__(self, other: Value) -> Value:
        if isinstance(other, int):
            if other == 0:
                return 0
            lo, hi = sorted((self.lo * other, self.hi * other))
            return self._make(self.ar, self.expr * other, lo, hi, self._mapped(lambda v: v * other))
        if isinstance(other, Sym):
            corners = [a * b for a in (self.lo, self.hi) for b in (other.lo, other.hi)]
            lo, hi = min(corners), max(corners)
            if lo == hi:
                return lo
            ar = self.ar
            key = ("mul", *sorted((linear_key(self), linear_key(other))))
            got = ar._cse.get(key)
            if got is None:
                p = ar.model.NewIntVar(lo, hi, ar.name("prod"))
                ar.model.AddMultiplicationEquality(p, [ar.as_var(self), ar.as_var(other)])
                got = ar._cse[key] = Sym(ar, p, lo, hi,
                                         self._combine_values(other, lambda a, b: a * b))
            return got
        return NotImplemented

    __rmul__ = __mul__

    # -------------------------------------------------------------- division

    def __floordiv__(self, other: Value) -> Value:
        """Python floor division by a positive divisor."""
        if isinstance(other, int | Sym):
            d_lo = other if isinstance(other, int) else other.lo
            if d_lo < 1:
                raise ValueError("floor division by a value that may be < 1")
            if self.lo >= 0:
                return _div_nonneg(self, other)
            if self.hi <= 0:
                # floor(x / d) = -ceil(-x / d) = -((-x + d - 1) // d) with -x + d - 1 >= 0
                q = _div_nonneg(-self + other - 1, other)
                return -q
            return _floor_div_linear(self, other)
        return NotImplemented

    def __rfloordiv__(self, other: int) -> Value:
        if self.lo < 1:
            raise ValueError("floor division by a value that may be < 1")
        return _div_nonneg(other, self) if other >= 0 else -_div_nonneg(-other + self - 1, self)

    # -------------------------------------------------------------- comparisons

    def _decide(self, op: str, other: Any) -> bool:
        if not isinstance(other, int):
            raise TypeError(f"cannot compare a solver expression with {type(other).__name__}")
        # an order comparison with a constant is decided when both bounds agree
        at_lo, at_hi = _OPS[op](self.lo, other), _OPS[op](self.hi, other)
        if at_lo == at_hi:
            return at_lo
        raise TypeError(f"solver expression in [{self.lo}, {self.hi}] {op} {other} is not "
                        "decided by its bounds")

    def __lt__(self, other: Any) -> bool:
        return self._decide("<", other)

    def __le__(self, other: Any) -> bool:
        return self._decide("<=", other)

    def __gt__(self, other: Any) -> bool:
        return self._decide(">", other)

    def __ge__(self, other: Any) -> bool:
        return self._decide(">=", other)

    def __bool__(self) -> bool:
        raise TypeError("a solver expression has no truth value; use Arith.predicate / le")

    __hash__ = None  # type: ignore[assignment]

    # -------------------------------------------------------------- max

    @staticmethod
    def __vmax__(items: Sequence[Value]) -> Value:
        """``max(items, default=0)`` (the hook :func:`oracle.memory.vmax` calls)."""
        lo = max((x if isinstance(x, int) else x.lo) for x in items)
        # drop items that can never be the maximum
        keep = [x for x in items if (x if isinstance(x, int) else x.hi) >= lo]
        his = [(x if isinstance(x, int) else x.hi) for x in keep]
        hi = max(his)
        if lo == hi:
            return lo
        syms = [x for x in keep if isinstance(x, Sym)]
        if len(keep) == 1:
            return keep[0]
        ar = syms[0].ar
        key = ("max", *sorted(linear_key(x) for x in keep))
        got = ar._cse.get(key)
        if got is None:
            m = ar.model.NewIntVar(lo, hi, ar.name("max"))
            ar.model.AddMaxEquality(m, [x if isinstance(x, int) else x.expr for x in keep])
            got = ar._cse[key] = Sym(ar, m, lo, hi)
        return got


_OPS: dict[str, Callable[[int, int], bool]] = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


def _floor_div_linear(num: Sym, den: Value) -> Value:
    """``num // den`` (Python floor) for a numerator whose bounds straddle 0 (interval bounds of
    a difference, although the value itself may never be negative): ``q`` with
    ``den q <= num <= den q + den - 1``, which has exactly one solution."""
    ar = num.ar
    key = ("fdiv", linear_key(num), linear_key(den))
    got = ar._cse.get(key)
    if got is not None:
        return got
    d_lo, d_hi = (den, den) if isinstance(den, int) else (den.lo, den.hi)
    corners = [num.lo // d for d in (d_lo, d_hi)] + [num.hi // d for d in (d_lo, d_hi)]
    lo, hi = min(corners), max(corners)
    q = ar.model.NewIntVar(lo, hi, ar.name("fdiv"))
    qs = Sym(ar, q, lo, hi)
    prod = qs * den
    prod_expr = prod if isinstance(prod, int) else prod.expr
    den_expr = den if isinstance(den, int) else den.expr
    ar.model.Add(prod_expr <= num.expr)
    ar.model.Add(num.expr <= prod_expr + den_expr - 1)
    ar._cse[key] = qs
    return qs


def _div_nonneg(num: Value, den: Value) -> Value:
    """``num // den`` for ``num >= 0`` and ``den >= 1`` (truncation equals floor here)."""
    if isinstance(num, int) and isinstance(den, int):
        return num // den
    n_lo, n_hi = (num, num) if isinstance(num, int) else (num.lo, num.hi)
    d_lo, d_hi = (den, den) if isinstance(den, int) else (den.lo, den.hi)
    assert n_lo >= 0 and d_lo >= 1
    lo, hi = n_lo // d_hi, n_hi // d_lo
    if lo == hi:
        return lo
    ar = (num if isinstance(num, Sym) else den).ar  # type: ignore[union-attr]
    key = ("div", linear_key(num), linear_key(den))
    got = ar._cse.get(key)
    if got is None:
        q = ar.model.NewIntVar(lo, hi, ar.name("div"))
        if ar.linear_division and isinstance(den, int) and isinstance(num, Sym):
            # by a constant: den q <= num <= den q + den - 1, two linear constraints
            ar.model.Add(den * q <= num.expr)
            ar.model.Add(num.expr <= den * q + den - 1)
        else:
            ar.model.AddDivisionEquality(q, ar.as_var(num), ar.as_var(den))
        got = ar._cse[key] = Sym(ar, q, lo, hi)
    return got

