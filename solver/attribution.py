"""How many raw candidates each rule family removed: sequential attribution.

Definition. The raw candidates are the product of the space's domains (``SearchSpace.size``).
Each candidate that is not feasible is charged to the *first* family, in ``RULES`` order, that
it breaks; families switched off charge nothing. So ``sum(removed) + feasible == space size``.

Computation, cheap and exact:

* families up to ``extra`` (everything but ``recompute_dominance`` and ``hbm``) are counted by a
  memoised walk over the axes (:func:`walk`): each family is evaluated with the Python rule of
  ``solver/rules.py`` once per distinct value of the axes it reads (``FAMILY_AXES``), and whole
  sub-products are charged at once;
* ``recompute_dominance`` charges, for each kept configuration without recomputation, the other
  recompute options of its layout, and for each kept full block-recompute configuration with K
  layers, the K' > K of the domain (those fit too and are dominated: memory never rises with K,
  see ``docs/solver.md``); in both cases only options the earlier families allow;
* ``hbm`` is charged the rest: candidates that pass every earlier family minus the feasible ones
  minus the dominated ones.

``solver/reference.py`` computes the same numbers literally (one candidate at a time); a test
requires equality.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from tune_cp.config.axes import AXES, WALK_AXES
from tune_cp.config.specs import Recompute
from tune_cp.solver.problem import Problem
from tune_cp.solver.rules import FAMILY_AXES, RULES, RuleContext

#: Axis order of the walk: cheap, strongly pruning families first; recompute options and the
#: optimizer (read only by memory) last.
WALK_ORDER: tuple[str, ...] = WALK_AXES  # the registry's ``Axis.walk``
assert sorted(WALK_ORDER) == sorted(AXES)
#: Axes :func:`walk` can count the passing candidates of (the first ones it assigns).
PROBE_AXES: tuple[str, ...] = WALK_ORDER[:3]
#: Families counted after the walk (they read memory).
MEMORY_FAMILIES = ("recompute_dominance", "hbm")
#: Axes whose walk nodes derive their rule context from the parent's (``Problem.vary``).
VARY_AXES = frozenset(("recompute", "mbs"))


class _Node:
    """A node of the walk: the axis assigned last, and the rule context once made."""

    __slots__ = ("axis", "ctx", "parent")

    def __init__(self, parent: _Node | None, axis: str) -> None:
        self.parent, self.axis, self.ctx = parent, axis, None


def family_axes(problem: Problem, family: str) -> tuple[str, ...]:
    if family == "extra":
        return tuple(sorted({a for c in problem.constraints for a in c.axes}))
    return FAMILY_AXES[family]


def walk(problem: Problem, families: Sequence[str], by: Sequence[str] = (),
         passing: dict[tuple[Any, ...], int] | None = None) -> Counter[str]:
    """Sequential first-failing counts of ``families`` (none may read memory) over the raw
    candidates, plus ``"pass"``: the candidates that break none of them.

    ``passing``, if given, receives the candidates that pass per value of the axes ``by``
    (axes of :data:`PROBE_AXES`; tuples in ``by`` order, those without any left out)."""
    sp = problem.space
    fams = [f for f in RULES if f in families]
    assert not set(fams) & set(MEMORY_FAMILIES)
    axes = [frozenset(family_axes(problem, f)) for f in fams]
    pos = {a: i for i, a in enumerate(WALK_ORDER)}
    # depth at which every axis of family j is bound
    ready = [max((pos[a] + 1 for a in ax), default=0) for ax in axes]
    n_axes = len(WALK_ORDER)
    base = {a: getattr(sp, a)[0] for a in AXES if a != "etp"}
    verdicts: dict[tuple[int, tuple[Any, ...]], bool] = {}

    def domain(axis: str, assign: dict[str, Any]) -> Sequence[Any]:
        return sp.etp_values(assign["tp"]) if axis == "etp" else getattr(sp, axis)

    sorted_axes = [tuple(sorted(ax)) for ax in axes]

    def context(node: _Node, assign: dict[str, Any]) -> RuleContext:
        """The rule context of a walk node (unassigned axes at their first value), made once
        per node; where only recompute or mbs differs from the parent node, derived from the
        parent's (``Problem.vary``)."""
        if node.ctx is None:
            par = node.parent
            if node.axis in VARY_AXES and par is not None:
                if par.ctx is None:
                    value = assign.pop(node.axis)
                    context(par, assign)
                    assign[node.axis] = value
                assert par.ctx is not None
                node.ctx = problem.context(problem.vary(par.ctx.cfg, node.axis,
                                                        assign[node.axis]))
            else:
                cand = dict(base)
                cand.update(assign)
                cand.setdefault("etp", sp.etp_values(cand["tp"])[0])
                node.ctx = problem.context(problem.resolve(cand))
        return node.ctx

    # per family: its axes' values of an assignment (one value, a tuple, or () for none)
    values_of = [itemgetter(*ax) if ax else (lambda _: ()) for ax in sorted_axes]

    def verdict(j: int, assign: dict[str, Any], node: _Node) -> bool:
        """Family j's verdict (memoised on the axes it reads)."""
        key = (j, values_of[j](assign))
        v = verdicts.get(key)
        if v is None:
            v = verdicts[key] = not RULES[fams[j]](context(node, assign))
        return v

    etp_depth = pos["etp"]
    sizes: dict[tuple[int, Any], int] = {}

    def size(d: int, assign: dict[str, Any]) -> int:
        """Candidates below depth d (the etp domain depends on tp: keyed on it above etp)."""
        k = (d, assign.get("tp") if d <= etp_depth else None)
        n = sizes.get(k)
        if n is None:
            n = 1
            for a in WALK_ORDER[d:]:
                n *= len(domain(a, assign))
            sizes[k] = n
        return n

    memo: dict[tuple[Any, ...], dict[str, int]] = {}
    n_fams = len(fams)
    plans: dict[tuple[int, int], tuple[list[int], Callable[[dict[str, Any]], Any]]] = {}

    def plan(d: int, ptr: int) -> tuple[list[int], Callable[[dict[str, Any]], Any]]:
        """The pending families already decidable at depth d (blocked behind an earlier one),
        and the values of the axes the others read (those assigned above depth d: the walk
        assigns ``WALK_ORDER[:d]``): with d and ptr, their verdicts and those values determine
        the rest of the walk."""
        got = plans.get((d, ptr))
        if got is None:
            blocked = [j for j in range(ptr, n_fams) if ready[j] <= d]
            reads = {a for j in range(ptr, n_fams) if ready[j] > d for a in axes[j]}
            if d <= pos["etp"]:
                reads.add("tp")  # the etp domain depends on tp
            bound = sorted(a for a in reads if pos[a] < d)
            got = plans[(d, ptr)] = (blocked, itemgetter(*bound) if bound else (lambda _: ()))
        return got

    assert set(by) <= set(PROBE_AXES)
    # above this depth every node is walked on its own (no shared sub-walks, no early "pass"),
    # so each value of the ``by`` axes reaches the depth where it is recorded
    probe_depth = max((pos[a] + 1 for a in by), default=0) if passing is not None else 0

    def rec(d: int, ptr: int, assign: dict[str, Any], node: _Node) -> dict[str, int]:
        while ptr < n_fams and ready[ptr] <= d:
            if not verdict(ptr, assign, node):
                return {fams[ptr]: size(d, assign)}
            ptr += 1
        if d == probe_depth and d and passing is not None:
            got = rec_shared(d, ptr, assign, node)
            if got.get("pass"):
                k = tuple([assign[a] for a in by])
                passing[k] = passing.get(k, 0) + got["pass"]
            return got
        if d < probe_depth:
            return children(d, ptr, assign, node)
        return rec_shared(d, ptr, assign, node)

    def rec_shared(d: int, ptr: int, assign: dict[str, Any], node: _Node) -> dict[str, int]:
        if ptr == n_fams:
            return {"pass": size(d, assign)}
        blocked, read = plan(d, ptr)
        key = (d, ptr, tuple([verdict(j, assign, node) for j in blocked]), read(assign))
        got = memo.get(key)
        if got is not None:
            return got
        memo[key] = out = children(d, ptr, assign, node)
        return out

    def children(d: int, ptr: int, assign: dict[str, Any], node: _Node) -> dict[str, int]:
        out: dict[str, int] = {}
        axis = WALK_ORDER[d]
        for value in domain(axis, assign):
            assign[axis] = value
            for k, n in rec(d + 1, ptr, assign, _Node(node, axis)).items():
                out[k] = out.get(k, 0) + n
        del assign[axis]
        return out

    result = Counter(rec(0, 0, {}, _Node(None, "")))
    assert sum(result.values()) == sp.size() or n_axes == 0
    return result


def dominated_count(problem: Problem, families: Sequence[str], kept: Sequence[Any]) -> int:
    """Candidates ``recompute_dominance`` removed, from the kept (feasible) configurations:

    * where no recomputation is kept (it fits, and is an option), every other recompute option
      of that layout that the earlier families allow;
    * where full block recompute of K is kept, every larger K of the domain the earlier families
      allow (each fits too: memory never rises with K).
    """
    sp = problem.space
    reading = [f for f in families if f not in MEMORY_FAMILIES
               and "recompute" in family_axes(problem, f)]
    options = list(sp.recompute)
    # per family: the axes it reads besides recompute; its verdicts per value of those axes,
    # one slot per option of the space (None: not evaluated yet)
    fam_rest = [tuple(a for a in family_axes(problem, f) if a != "recompute") for f in reading]
    verdicts: list[dict[tuple[Any, ...], list[bool | None]]] = [{} for _ in reading]
    others = [i for i, o in enumerate(options) if o.kind is not Recompute.NONE]
    by_none = sp.has_no_recompute and len(options) > 1
    axes = sorted({a for f in reading for a in family_axes(problem, f)} - {"recompute"})
    counts: dict[tuple[Any, ...], int] = {}
    #: per (method, K): the options of the space with the same method and a larger K
    larger_of: dict[tuple[Any, int | None], list[int]] = {}
    total = 0
    for f in kept:
        cand = f.candidate
        rc = cand["recompute"]
        if by_none and rc.kind is Recompute.NONE:
            key: tuple[Any, ...] = ("none", *(cand[a] for a in axes))
            if key not in counts:
                counts[key] = _allowed_count(problem, reading, fam_rest, verdicts, f,
                                             options, others)
        elif rc.is_full_block:
            key = ("k", rc.method, rc.layers, *(cand[a] for a in axes))
            if key not in counts:
                larger = larger_of.get((rc.method, rc.layers))
                if larger is None:
                    larger = larger_of[(rc.method, rc.layers)] = [
                        i for i, o in enumerate(options)
                        if o.is_full_block and o.method is rc.method and o.layers > rc.layers]
                counts[key] = _allowed_count(problem, reading, fam_rest, verdicts, f,
                                             options, larger)
        else:
            continue
        total += counts[key]
    return total


def _allowed_count(problem: Problem, reading: Sequence[str],
                   fam_rest: Sequence[tuple[str, ...]],
                   verdicts: list[dict[tuple[Any, ...], list[bool | None]]], kept: Any,
                   options: Sequence[Any], idx: Sequence[int]) -> int:
    """How many of ``options[i]`` (i in ``idx``) every family of ``reading`` allows in place of
    ``kept``'s recompute option (each family's verdict memoised on the axes it reads)."""
    cand = kept.candidate
    rows = []
    for j, rest in enumerate(fam_rest):
        k = tuple([cand[a] for a in rest])
        row = verdicts[j].get(k)
        if row is None:
            row = verdicts[j][k] = [None] * len(options)
        rows.append(row)
    n = 0
    ctxs: dict[int, RuleContext] = {}
    for i in idx:
        for j, row in enumerate(rows):
            v = row[i]
            if v is None:
                ctx = ctxs.get(i)
                if ctx is None:
                    ctx = ctxs[i] = problem.context(
                        problem.vary(kept.config, "recompute", options[i]))
                v = row[i] = not RULES[reading[j]](ctx)
            if not v:
                break
        else:
            n += 1
    return n


def attribution_walk(problem: Problem, families: Sequence[str], by: Sequence[str] = (),
                     passing: dict[tuple[Any, ...], int] | None = None) -> Counter[str]:
    """The part of :func:`attribute` that needs no feasible configuration (the walk over the
    families that do not read memory): parallel enumeration runs it beside the slices, serial
    enumeration first (``passing`` per value of ``by``: slices nothing passes are skipped)."""
    return walk(problem, [f for f in families if f not in MEMORY_FAMILIES], by, passing)


def attribute(problem: Problem, families: Sequence[str], feasible: Sequence[Any],
              walker: Callable[[Problem, Sequence[str]], Counter[str]] = walk,
              walked: Counter[str] | None = None) -> dict[str, int]:
    """``removed`` per family (see the module docstring) given the feasible configurations
    (``walked``: :func:`attribution_walk`'s result when already computed)."""
    early = [f for f in families if f not in MEMORY_FAMILIES]
    counts = Counter(walked) if walked is not None else walker(problem, early)
    passing = counts.pop("pass", 0)
    removed = {f: 0 for f in RULES}
    removed.update(counts)
    if "hbm" not in families:
        # without hbm whatever the walk passes and is not feasible was dominated
        removed["recompute_dominance"] = passing - len(feasible)
        return removed
    dominated = (dominated_count(problem, families, feasible)
                 if "recompute_dominance" in families else 0)
    removed["recompute_dominance"] = dominated
    removed["hbm"] = passing - dominated - len(feasible)
    return removed
