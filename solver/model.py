"""The CP-SAT legality model: every rule family of ``solver/rules.py`` over the free axes.

Variables (one per axis of the :class:`~solver.space.SearchSpace`; one-value domains are
constants): tp, pp, cp, vpp, ep, etp, mbs, and indices into the domains of pipeline_split,
schedule, fp8_recipe, dispatcher, optimizer and recompute. Derived values are *functions* of
them, defined by tables built with the same functions ``resolve_config`` uses: dp, ga, the
resolved pipeline split, schedule, FP8 recipe and sequence parallelism, the attributes of the
recompute option.

Families: ``ENCODERS`` has one function per family of ``solver.rules.RULES`` (same names). Each
returns a 0/1 value ``ok`` that is *determined* by the axes (true iff the family holds), and the
model adds ``lit[family] => ok`` with one Boolean literal per family. Enumeration fixes the
literals; explanations pass them as assumptions (``solver/explain.py``). Because ``ok`` and every
auxiliary variable are functions of the axes, each configuration is one solution.

Memory (families ``hbm`` and ``recompute_dominance``) is the oracle's own arithmetic: the layer-2
units of ``oracle/memory.py`` (``param_units``, ``activation_units``, ``sharding``) and the
layer-1 stage counts are tabulated over their small key domains with the oracle's functions;
:func:`oracle.memory.combine` is then *called* on :class:`~solver.symbolic.Sym` expressions, so
the model holds exactly the oracle's ``+``, ``*``, ``vmax``, ceiling and floor divisions.
See ``docs/solver.md`` for each encoding.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from functools import cached_property
from itertools import product
from typing import Any

import numpy as np

from tune_cp.config.axes import AXES, CONSTRAINT_NAMES, GEOMETRY_AXES, INT_AXES
from tune_cp.config.codes import (
    FP8_CODE,
    FP8_OF_CODE,
    METHOD_CODE,
    METHODS,
    RECOMPUTE_CODE,
    SCHEDULE_CODE,
)
from tune_cp.config.resolve import resolve_config
from tune_cp.config.specs import (
    Dispatcher,
    Fp8Recipe,
    ParallelConfig,
    PipelineSplit,
    PositionEmbedding,
    Precision,
    Recompute,
    RecomputeMethod,
    Schedule,
    derived_dp,
    derived_ga,
)
from tune_cp.oracle import memory as M
from tune_cp.solver.constraints import compile_expr
from tune_cp.solver.cpsat import CpModel, cp_model
from tune_cp.solver.problem import Problem
from tune_cp.solver.rules import (
    FAMILY_AXES,
    FP8_ARCHITECTURES_MX,
    RULES,
    backend_problems,
    layers_per_chunk,
    mamba_cp_ok,
    setting_refusals,
    split_problem,
    tp_shape_ok,
    training_precision,
)
from tune_cp.solver.space import OptimizerChoice, RecomputeOption
from tune_cp.solver.symbolic import Arith, Sym, Value

#: Geometry code of a recompute option: 0 without full recompute, else
#: ``(method index + 1) * CODE_STRIDE + min(K, largest chunk)`` (K beyond the largest virtual
#: stage recomputes the same layers).
CODE_STRIDE = 1 << 20
SPLITS: tuple[PipelineSplit, ...] = tuple(PipelineSplit)
#: Axes enumeration branches on first (``LegalityModel.add_search_strategy``).
GEOMETRY_FIRST: tuple[str, ...] = GEOMETRY_AXES


class OracleCache:
    """The oracle evaluations a model tabulates, memoised for every model of the same
    (model, cluster, training, overheads): the slices of one enumeration share the geometry
    (stage counts per (pp, vpp, split, micro-batches, recompute code)), and repeated
    enumerations (the search explores sub-spaces) share everything. Keys are axis values,
    never domain positions, so any space may use it."""

    def __init__(self, problem: Problem) -> None:
        self.model, self.cluster, self.training = problem.model, problem.cluster, problem.training
        self.overheads = problem.overheads
        self._resolved: dict[tuple[tuple[str, Any], ...], ParallelConfig] = {}
        self.act: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.shard: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.pu: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.stages: dict[tuple[Any, ...], list[M.StageCounts]] = {}
        #: decoder layers of the largest chunk per (pp, vpp, split index)
        self.chunk_max: dict[tuple[int, int, int], int] = {}
        #: whether the split is legal per (pp, vpp, split index) (``split_ok``)
        self.split_legal: dict[tuple[int, int, int], bool] = {}
        #: a geometry row's stage counts as one flat tuple, per (stage-count key, slots,
        #: recompute groups) (``MemoryEncoding._geometry``)
        self.flat: dict[tuple[Any, ...], tuple[int, ...]] = {}

    def resolved(self, **fields: Any) -> ParallelConfig:
        """``resolve_config`` of a configuration with the given fields (others default)."""
        key = tuple(sorted(fields.items(), key=lambda kv: kv[0]))
        cfg = self._resolved.get(key)
        if cfg is None:
            cfg = resolve_config(ParallelConfig(**fields), self.model, self.cluster, self.training)
            self._resolved[key] = cfg
        return cfg


#: Caches of the latest problems (least recently used first).
_CACHES: OrderedDict[tuple[Any, ...], OracleCache] = OrderedDict()
CACHE_PROBLEMS = 4


#: The tables of :class:`OracleCache` that do not depend on the cluster (node count, GPU), per
#: (model, training, overheads), shared by the caches of every cluster (``tune-cp plan`` builds
#: models for many node counts and GPUs): ``act`` (``activation_units`` takes no cluster and
#: reads no dp or ga; its key holds every field it reads), ``pu`` (``param_units``: the model and
#: the layout), ``stages`` and ``chunk_max`` (the model's pipeline geometry).
_SHARED: OrderedDict[tuple[Any, ...], tuple[dict, dict, dict, dict]] = OrderedDict()


def oracle_cache(problem: Problem) -> OracleCache:
    """The :class:`OracleCache` of ``problem``'s model, cluster, training and overheads."""
    key = (problem.model, problem.cluster, problem.training, problem.overheads)
    cache = _CACHES.get(key)
    if cache is None:
        cache = _CACHES[key] = OracleCache(problem)
        common = (problem.model, problem.training, problem.overheads)
        shared = _SHARED.get(common)
        if shared is None:
            shared = _SHARED[common] = (cache.act, cache.pu, cache.stages, cache.chunk_max)
            while len(_SHARED) > CACHE_PROBLEMS:
                _SHARED.popitem(last=False)
        else:
            _SHARED.move_to_end(common)
        cache.act, cache.pu, cache.stages, cache.chunk_max = shared
        while len(_CACHES) > CACHE_PROBLEMS:
            _CACHES.popitem(last=False)
    else:
        _CACHES.move_to_end(key)
    return cache


class LegalityModel:
    """The CP-SAT model of one :class:`~solver.problem.Problem`.

    ``families`` selects the families to build (default: all of ``RULES``); a family left out
    is simply absent (enumeration without it), which keeps solutions unique. ``lit[f]`` is the
    literal of family ``f``; ``ok[f]`` its determined truth value.
    """

    def __init__(self, problem: Problem, families: Iterable[str] | None = None, *,
                 enforced: bool = False, none_option: bool | None = None,
                 none_fits: Sequence[tuple[int, ...]] | None = None) -> None:
        self.p = problem
        #: every family literal will be fixed true (enumeration): tables may then leave out key
        #: combinations an enabled family refuses (the solutions stay the same)
        self.enforced = enforced
        #: no recomputation is an option of the search (``recompute_dominance`` compares with
        #: it): default, whether the space has it; a part of a slice without that option
        #: (``feasible.recompute_parts``) is told True when the whole space has it
        self.none_option = problem.space.has_no_recompute if none_option is None else none_option
        #: the layouts (raw values of the axes before ``recompute``, ``AXES`` order) where no
        #: recomputation passes every family: the solutions of the slice's no-recomputation
        #: model (``feasible.solve_slice``). Given to an enforced model without that option,
        #: "no recomputation fits" is these layouts refused (``MemoryEncoding.fits_none``)
        #: instead of a third evaluation of the memory
        self.none_fits = none_fits
        assert none_fits is None or enforced
        wanted = set(RULES if families is None else families)
        unknown = wanted - set(RULES)
        if unknown:
            raise ValueError(f"unknown families {sorted(unknown)}; choose from {list(RULES)}")
        self.families = tuple(f for f in RULES if f in wanted)
        self.cache = oracle_cache(problem)
        self.cp = CpModel()
        self.ar = Arith(self.cp)
        self.ar.linear_division = self.ar.record_relations = self.ar.direct_tables = enforced
        self._axes()
        self._derived()
        self.ok: dict[str, Value] = {}
        self.lit: dict[str, Any] = {}
        for name in self.families:
            encoder = ENCODERS.get(name)
            self.ok[name] = encoder(self) if encoder else encode_from_rule(self, name)
            lit = self.cp.NewBoolVar(name)
            self.lit[name] = lit
            ok = self.ok[name]
            if isinstance(ok, int):
                if not ok:
                    self.cp.AddBoolOr([lit.Not()])
            else:
                self.cp.AddImplication(lit, self.ar.literal(ok))

    # -------------------------------------------------------------------- axes

    def _axes(self) -> None:
        sp, ar = self.p.space, self.ar
        #: the decision variables, in the order of ``solver.space.AXES``: an integer axis's
        #: value is the value itself, a choice axis's an index into its domain
        self.axis: dict[str, Value] = {}
        for name in AXES:
            if name in INT_AXES:
                values = sp.etp_all_values if name == "etp" else getattr(sp, name)
                self.axis[name] = ar.var(values, name)
            else:
                values = (self._split_domain() if name == "pipeline_split"
                          else range(len(getattr(sp, name))))
                self.axis[name] = ar.var(values, f"{name}_i")
            if name == "etp":  # the etp policy (the space, not a rule)
                self.etp_pairs = [(t, e) for t in sp.tp for e in sp.etp_values(t)]
                ar.allow([self.axis["tp"], self.axis["etp"]], self.etp_pairs)
        # the mechanisms' names for them
        self.tp, self.pp, self.cp_ = self.axis["tp"], self.axis["pp"], self.axis["cp"]
        self.vpp, self.ep, self.etp = self.axis["vpp"], self.axis["ep"], self.axis["etp"]
        self.mbs, self.split_i = self.axis["mbs"], self.axis["pipeline_split"]
        self.sched_i, self.fp8_i = self.axis["schedule"], self.axis["fp8_recipe"]
        self.disp_i, self.opt_i = self.axis["dispatcher"], self.axis["optimizer"]
        self.rc = self.axis["recompute"]

    def _split_domain(self) -> list[int]:
        """The split indices of the space; in an enforced model with the ``pipeline_split``
        family, only those legal at some (pp, vpp) of the space (the light splits exist at few
        geometries, and a slice of one pp often admits none of them: fewer values to branch
        on, the same solutions)."""
        sp = self.p.space
        every = list(range(len(sp.pipeline_split)))
        if not (self.enforced and "pipeline_split" in self.families):
            return every
        kept = [i for i in every if any(
            split_ok(self, p, v, SPLITS.index(self._resolved(
                pp=p, vpp=v, pipeline_split=sp.pipeline_split[i]).pipeline_split))
            for p in sp.pp for v in sp.vpp)]
        return kept or every[:1]

    def family_predicate(self, keys: Sequence[Value], fn: Callable[..., bool],
                         stem: str) -> Value:
        """A family's 0/1 value ``fn(*key)`` (``Arith.predicate``). In an enforced model the
        family's literal is fixed true, so the keys are restricted to where ``fn`` holds and
        the value is 1 (tables of the allowed rows only: fewer variables to carry)."""
        return self.ar.predicate(keys, fn, stem, required=self.enforced)

    def _resolved(self, **fields: Any) -> ParallelConfig:
        """``resolve_config`` of a configuration with the given fields (others default)."""
        return self.cache.resolved(**fields)

    def _derived(self) -> None:
        sp, ar, p = self.p.space, self.ar, self.p
        world, gbs = p.cluster.world_size, p.training.global_batch_size
        self.dp = ar.lookup([self.tp, self.pp, self.cp_],
                            lambda t, pp_, c: (derived_dp(world, t, pp_, c),), "dp")[0]
        self.ga = ar.lookup([self.mbs, self.dp], lambda b, d: (derived_ga(gbs, b, d),), "ga")[0]
        self.split = ar.lookup(
            [self.split_i, self.pp, self.vpp],
            lambda i, pp_, v: (SPLITS.index(self._resolved(
                pp=pp_, vpp=v, pipeline_split=sp.pipeline_split[i]).pipeline_split),),
            "split")[0]
        self.sched = ar.lookup(
            [self.sched_i, self.vpp],
            lambda i, v: (SCHEDULE_CODE[self._resolved(vpp=v,
                                                       schedule=sp.schedule[i]).schedule],),
            "sched")[0]
        self.fp8 = ar.lookup(
            [self.fp8_i],
            lambda i: (FP8_CODE[self._resolved(fp8_recipe=sp.fp8_recipe[i]).fp8_recipe],),
            "fp8")[0]
        self.sp = ar.lookup([self.tp], lambda t: (int(self._resolved(tp=t).sp),), "sp")[0]
        opts = sp.recompute
        self.rc_kind = ar.element(self.rc, [RECOMPUTE_CODE[o.kind] for o in opts], "rc_kind")
        self.is_none = ar.element(self.rc, [int(o.kind is Recompute.NONE) for o in opts], "none")
        block = sp.full_layers
        self.is_full_block = ar.element(self.rc, [int(o.is_full_block) for o in opts], "fb")
        self.is_kmin = ar.element(
            self.rc, [int(o.is_full_block and o.layers == block[0]) for o in opts], "kmin")
        modsets = sorted({o.modules for o in opts if o.kind is Recompute.SELECTIVE})
        self.modsets: list[tuple[str, ...]] = [(), *modsets]
        self.modset = ar.element(
            self.rc, [self.modsets.index(o.modules if o.kind is Recompute.SELECTIVE else ())
                      for o in opts], "modset")
        #: the values constraints may name (solver.constraints.NAMES: axes, and dp and ga)
        self.names: dict[str, Value] = {
            n: self.axis[n] if n in self.axis else getattr(self, n) for n in CONSTRAINT_NAMES}

    @cached_property
    def layers_per_chunk(self) -> Value:
        """Decoder layers of the largest virtual stage (``solver.rules.layers_per_chunk``)."""
        return self.ar.lookup(
            [self.pp, self.vpp, self.split],
            lambda p, v, s: (layers_per_chunk(self.p.model, self._resolved(
                pp=p, vpp=v, pipeline_split=SPLITS[s])),), "lpc")[0]

    # ------------------------------------------------------------------ memory

    @cached_property
    def memory(self) -> MemoryEncoding:
        return MemoryEncoding(self)

    # --------------------------------------------------------------- decisions

    def decision_vars(self) -> list[Any]:
        """The decision variables in branching order (constants left out)."""
        return [self.ar.as_var(v) for v in self.axis.values() if isinstance(v, Sym)]

    def add_search_strategy(self) -> None:
        """Branch on the pipeline geometry first (pp, vpp, split, schedule: they fix the stage
        counts, so the later decisions propagate through constant counts; ~8% faster
        enumeration), then the other axes in :data:`solver.space.AXES` order, the recompute
        option last (options are listed with K increasing), smallest value first. Splitting
        the recompute option's range in halves instead costs ~2% more instructions on the
        MoE searches (measured in docs/solver.md). The order of the solutions found does
        not matter: enumeration sorts them."""
        order = [*GEOMETRY_FIRST, *(k for k in self.axis if k not in GEOMETRY_FIRST)]
        head = [self.ar.as_var(self.axis[k]) for k in order
                if isinstance(self.axis[k], Sym) and k != "recompute"]
        if isinstance(self.rc, Sym):
            head.append(self.ar.as_var(self.rc))
        if head:
            self.cp.AddDecisionStrategy(head, cp_model.CHOOSE_FIRST, cp_model.SELECT_MIN_VALUE)

    def candidate(self, values: dict[str, int]) -> dict[str, Any]:
        """The candidate (axis name -> domain value) of decision-variable values."""
        sp = self.p.space
        out: dict[str, Any] = {}
        for name, v in self.axis.items():
            raw = values[name] if isinstance(v, Sym) else v
            if name in INT_AXES:
                out[name] = raw
            else:
                out[name] = getattr(sp, name)[raw]
        return out


# =========================================================================== families


def enc_world_size(m: LegalityModel) -> Value:
    """tp x pp x cp divides the world (then dp = world / (tp pp cp) exactly)."""
    w = m.p.cluster.world_size
    return m.family_predicate([m.tp, m.pp, m.cp_], lambda t, p, c: w % (t * p * c) == 0, "world")


def enc_tensor_parallel(m: LegalityModel) -> Value:
    """tp divides the heads, KV heads (or is a multiple), dense and shared FFN widths."""
    return m.family_predicate([m.tp], lambda t: tp_shape_ok(m.p.model, t), "tp_shape")


def enc_scale_up(m: LegalityModel) -> Value:
    """tp and etp at most the scale-up domain."""
    if m.p.allow_cross_scale_up:
        return 1
    lim = m.p.cluster.scale_up_gpus
    return m.family_predicate([m.tp, m.etp], lambda t, e: t <= lim and e <= lim, "scale_up")


def enc_expert_layout(m: LegalityModel) -> Value:
    """MoE: ep divides the experts and pp x ep x etp the world; dense: ep = 1."""
    model, w = m.p.model, m.p.cluster.world_size
    if not model.is_moe:
        return m.family_predicate([m.ep], lambda e: e == 1, "ep_dense")
    return m.family_predicate(
        [m.pp, m.ep, m.etp],
        lambda p, e, et: model.num_experts % e == 0 and w % (p * e * et) == 0, "expert_layout")


def enc_expert_tensor_parallel(m: LegalityModel) -> Value:
    """MoE: etp divides the expert FFN width; biased experts need etp = 1."""
    model = m.p.model
    if not model.is_moe:
        return 1
    return m.family_predicate(
        [m.etp], lambda e: model.expert_ffn_hidden_size % e == 0 and (not model.mlp_bias or e == 1),
        "etp_shape")


def enc_sequence_parallel(m: LegalityModel) -> Value:
    """MoE with tp > 1 needs sequence parallelism."""
    if not m.p.model.is_moe:
        return 1
    return m.family_predicate([m.tp, m.sp], lambda t, s: t == 1 or s == 1, "moe_sp")


def enc_sequence_length(m: LegalityModel) -> Value:
    """seq divisible by 2 cp (cp > 1), seq / cp by tp (sequence parallel); learned positions
    cover seq."""
    s, model = m.p.training.seq_len, m.p.model
    if (model.max_position_embeddings and model.position_embedding is PositionEmbedding.LEARNED
            and s > model.max_position_embeddings):
        return 0

    def ok(t: int, c: int, sp_: int) -> bool:
        if c > 1 and s % (2 * c):
            return False
        if not mamba_cp_ok(model, t, c):
            return False
        return not (sp_ and t > 1 and (s // c) % t)

    return m.family_predicate([m.tp, m.cp_, m.sp], ok, "seq_len")


def split_ok(m: LegalityModel, pp: int, vpp: int, split: int) -> bool:
    """The split is legal at pp x vpp (``solver.rules.split_problem``; the uneven and layout
    splits need their values, which the search space never holds)."""
    key = (pp, vpp, split)
    got = m.cache.split_legal.get(key)
    if got is None:
        got = m.cache.split_legal[key] = split_problem(m.p.model, pp, vpp, SPLITS[split]) is None
    return got


def enc_pipeline_split(m: LegalityModel) -> Value:
    return m.family_predicate([m.pp, m.vpp, m.split],
                          lambda p, v, s: split_ok(m, p, v, s), "pipeline_split")


def enc_virtual_pipeline(m: LegalityModel) -> Value:
    """vpp > 1 needs pp > 1 and the interleaved schedule, which needs vpp > 1 and a micro-batch
    count (ga) that is a positive multiple of pp; 1f1b needs vpp = 1."""
    inter, f1b = SCHEDULE_CODE[Schedule.INTERLEAVED], SCHEDULE_CODE[Schedule.ONE_F_ONE_B]

    def ok(p: int, v: int, s: int, ga: int) -> bool:
        if v > 1 and p == 1:
            return False
        if s == inter and v == 1 or s == f1b and v > 1:
            return False
        return not (s == inter and p > 1 and (ga < p or ga % p))

    return m.family_predicate([m.pp, m.vpp, m.sched, m.ga], ok, "virtual_pipeline")


def enc_schedule(m: LegalityModel) -> Value:
    """Zero-bubble: no recomputation, pp > 1, vpp in {1, 2}, untied embeddings."""
    zb, none = SCHEDULE_CODE[Schedule.ZERO_BUBBLE], RECOMPUTE_CODE[Recompute.NONE]
    tied = m.p.model.tied_embeddings

    def ok(s: int, kind: int, p: int, v: int) -> bool:
        return s != zb or (kind == none and p > 1 and v in (1, 2) and not tied)

    return m.family_predicate([m.sched, m.rc_kind, m.pp, m.vpp], ok, "schedule")


def recompute_k_ok(o: RecomputeOption, per: int) -> bool:
    """Full recompute: K within ``per`` layers of one virtual stage (uniform needs K >= 1)."""
    if o.kind is not Recompute.FULL or o.layers is None:
        return True
    return o.layers <= per and not (o.layers == 0 and o.method is RecomputeMethod.UNIFORM)


def enc_recompute(m: LegalityModel) -> Value:
    """Full: K within the layers of one virtual stage (uniform needs K >= 1); selective modules
    the model has, and none the delayed FP8 recipe cannot recompute."""
    model, opts = m.p.model, m.p.space.recompute
    lpc = m.layers_per_chunk

    def k_ok(r: int, per: int) -> bool:
        if model.is_hybrid and opts[r].kind is Recompute.FULL:
            return False  # rules.recompute: no full recomputation of hybrid Mamba models
        return recompute_k_ok(opts[r], per)

    needs = {"mla_up_proj": model.mla is not None, "moe": model.is_moe,
             "moe_act": model.is_moe, "shared_experts": model.num_shared_experts > 0}

    def mod_ok(r: int, f: int) -> bool:
        o = opts[r]
        if o.kind is not Recompute.SELECTIVE:
            return True
        mods = set(o.modules)
        if any(not needs[x] for x in mods if x in needs):
            return False
        return not (FP8_OF_CODE[f] is Fp8Recipe.DELAYED and mods & {"moe_act", "layernorm"})

    return m.ar.all_of([m.family_predicate([m.rc, lpc], k_ok, "rc_k"),
                        m.family_predicate([m.rc, m.fp8], mod_ok, "rc_mod")], "recompute")


def enc_precision(m: LegalityModel) -> Value:
    """FP8 needs FP8 tensor cores; MXFP8 needs Blackwell or CDNA4; no FP8 recipe under fp4
    training; NVFP4 training needs FP4 tensor cores (``rules.training_precision``: false for
    every layout)."""
    gpu = m.p.cluster.gpu
    precision_ok = not training_precision(m.p.cluster, m.p.training)
    fp4 = m.p.training.precision is Precision.FP4

    def ok(f: int) -> bool:
        if not precision_ok:
            return False
        r = FP8_OF_CODE[f]
        if r is None:
            return True
        if fp4 or gpu.peak_fp8_flops is None:  # an FP8 recipe under fp4 training: illegal
            return False
        return r is not Fp8Recipe.MXFP8 or gpu.architecture in FP8_ARCHITECTURES_MX

    return m.family_predicate([m.fp8], ok, "precision")


def enc_dispatcher(m: LegalityModel) -> Value:
    """The flex (DeepEP) dispatcher needs an MoE model with ep > 1."""
    ds, moe = m.p.space.dispatcher, m.p.model.is_moe
    return m.family_predicate([m.disp_i, m.ep],
                          lambda d, e: ds[d] is not Dispatcher.FLEX or (moe and e > 1), "disp")


def enc_moe_backend(m: LegalityModel) -> Value:
    """The MoE backend's rules (``rules.backend_problems``) of each dispatcher of the space with
    the other backend fields at their resolved defaults (the backend fields are not CP-SAT
    axes: the search picks them per layout after the enumeration, checked by the same
    function)."""
    ds, p = m.p.space.dispatcher, m.p
    a2a = p.settings.options.moe_a2a_overlap

    def ok(d: int) -> bool:
        cfg = m._resolved(dispatcher=ds[d], ep=2 if p.model.is_moe else 1)
        return not backend_problems(p.model, p.cluster.gpu, cfg, a2a)
    return m.family_predicate([m.disp_i], ok, "moeb")


def enc_run_settings(m: LegalityModel) -> Value:
    """What Megatron-Core refuses of the layout under the run settings: the refusals of
    ``rules.SETTING_REFUSALS`` that apply, one table per group of axes they read (the same
    ``refuses`` functions the rule ``run_settings`` calls); 1 without run settings."""
    refusals = setting_refusals(m.p.settings.options)
    if not refusals:
        return 1
    opts, ds = m.p.space.recompute, m.p.space.dispatcher
    # each field a refusal reads: the axis it comes from and its value at a domain position
    read: dict[str, tuple[str, Callable[[int], Any]]] = {
        "ep": ("ep", lambda e: e), "pp": ("pp", lambda p: p), "vpp": ("vpp", lambda v: v),
        "recompute": ("recompute", lambda r: opts[r].kind),
        "recompute_modules": ("recompute", lambda r: opts[r].modules),
        "dispatcher": ("dispatcher", lambda d: ds[d]),
    }
    groups: dict[tuple[str, ...], list[Any]] = {}
    for r in refusals:
        axes = tuple(dict.fromkeys(read[f][0] for f in r.fields))
        groups.setdefault(axes, []).append(r)
    parts = []
    for axes, group in groups.items():
        def ok(*key: int, axes: tuple[str, ...] = axes, group: list[Any] = group) -> bool:
            at = dict(zip(axes, key, strict=True))
            return not any(r.refuses(*(read[f][1](at[read[f][0]]) for f in r.fields))
                           for r in group)

        parts.append(m.family_predicate([m.axis[a] for a in axes], ok, "run_" + "_".join(axes)))
    return m.ar.all_of(parts, "run_settings")


def enc_batch(m: LegalityModel) -> Value:
    """mbs x dp divides the global batch (then ga = gbs / (mbs dp) exactly)."""
    gbs = m.p.training.global_batch_size
    return m.family_predicate([m.mbs, m.dp], lambda b, d: gbs % (b * d) == 0, "batch")


def enc_extra(m: LegalityModel) -> Value:
    """Every extra hard constraint, compiled from its syntax tree (``m.extra_ok``: one 0/1 value
    per constraint, for explanations)."""
    m.extra_ok = [compile_expr(c.tree, m.names, m.ar) for c in m.p.constraints]
    return m.ar.all_of(m.extra_ok, "extra")


def enc_recompute_dominance(m: LegalityModel) -> Value:
    """No recomputation; or no recomputation does not fit (when it is an option), and: not full
    block recompute, or the smallest K of the domain, or the next smaller K of the domain does
    not fit (then no smaller K fits: memory never rises with K; docs/solver.md)."""
    ar = m.ar
    mem = m.memory
    # the next smaller K's memory only where an option is full block above the smallest K
    opts, block = m.p.space.recompute, m.p.space.full_layers
    k_open = any(o.is_full_block and o.layers != block[0] for o in opts)
    k_ok = 1 if not k_open else ar.any_of(
        [ar.negate(m.is_full_block), m.is_kmin, ar.negate(mem.fits_prev)], "dom_k")
    if not mem.by_none:
        return k_ok
    return ar.any_of([m.is_none, ar.all_of([ar.negate(mem.fits_none), k_ok], "dom_rc")],
                     "dominance")


def enc_hbm(m: LegalityModel) -> Value:
    """Every stage of the most loaded kind fits in HBM x (1 - margin)."""
    return m.memory.fits


def encode_from_rule(m: LegalityModel, name: str) -> Value:
    """A family without an encoder of its own in :data:`ENCODERS`: a table over the integer
    axes it reads (``solver/rules.py::FAMILY_AXES``), each row the Python rule's own verdict on
    the configuration of those values (the two cannot disagree). A family that reads a choice
    axis or derived values needs its own encoder."""
    axes = FAMILY_AXES[name]
    if not axes or any(a not in INT_AXES for a in axes):
        raise ValueError(f"family {name!r} reads {list(axes)}: a family without a CP-SAT "
                         "encoder of its own (solver/model.py::ENCODERS) must read integer "
                         "axes only")
    rule = RULES[name]

    def ok(*values: int) -> bool:
        cfg = m._resolved(**dict(zip(axes, values, strict=True)))
        return not rule(m.p.context(cfg))

    return m.family_predicate([m.axis[a] for a in axes], ok, name)


ENCODERS: dict[str, Callable[[LegalityModel], Value]] = {
    "world_size": enc_world_size,
    "tensor_parallel": enc_tensor_parallel,
    "scale_up": enc_scale_up,
    "expert_layout": enc_expert_layout,
    "expert_tensor_parallel": enc_expert_tensor_parallel,
    "sequence_parallel": enc_sequence_parallel,
    "sequence_length": enc_sequence_length,
    "pipeline_split": enc_pipeline_split,
    "virtual_pipeline": enc_virtual_pipeline,
    "schedule": enc_schedule,
    "recompute": enc_recompute,
    "precision": enc_precision,
    "dispatcher": enc_dispatcher,
    "moe_backend": enc_moe_backend,
    "run_settings": enc_run_settings,
    "batch": enc_batch,
    "extra": enc_extra,
    "recompute_dominance": enc_recompute_dominance,
    "hbm": enc_hbm,
}


# ============================================================================ memory


def _fields(obj: Any) -> tuple[int, ...]:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))


def _dominated(a: M.StageCounts, b: M.StageCounts) -> bool:
    """Every coefficient of ``a`` is at most ``b``'s and each of ``a``'s recompute groups is
    covered by one of ``b``'s: ``combine`` is monotone, so ``a``'s total is at most ``b``'s."""
    return all(x <= y for x, y in zip(a.as_vector(), b.as_vector(), strict=True)) and _covered(a, b)


def prune_stages(stages: Sequence[M.StageCounts]) -> list[M.StageCounts]:
    """The stages that may be the most loaded one: drop those another stage dominates."""
    uniq: dict[tuple, M.StageCounts] = {}
    for s in stages:
        uniq.setdefault((s.as_vector(), s.recompute_groups), s)
    vals = list(uniq.values())
    if len(vals) <= 8:
        return [a for i, a in enumerate(vals)
                if not any(j != i and _dominated(a, b) for j, b in enumerate(vals))]
    # the coefficient comparisons of every pair at once; groups only where those hold
    vec = np.array([k[0] for k in uniq], dtype=np.int64)
    below = np.all(vec[:, None, :] <= vec[None, :, :], axis=2)
    np.fill_diagonal(below, False)
    return [a for i, a in enumerate(vals)
            if not any(_covered(a, vals[j]) for j in np.flatnonzero(below[i]))]


def _covered(a: M.StageCounts, b: M.StageCounts) -> bool:
    """Each of ``a``'s recompute groups is covered by one of ``b``'s."""
    return all(any(all(x <= y for x, y in zip(g, h, strict=True)) for h in b.recompute_groups)
               for g in a.recompute_groups)


class MemoryEncoding:
    """The memory of every candidate stage, built from the oracle's tables and ``combine``.

    * param units: ``param_units(model, tp, pp, ep, etp)`` over (tp, pp, ep, etp);
    * activation units: ``activation_units`` over (mbs, tp, cp, etp, FP8 recipe, selective
      modules, pp);
    * sharding: ``sharding`` over (tp, pp, cp, ep, etp, FP8 recipe, optimizer, dispatcher); its
      flags (FSDP, distributed optimizer, gradient dtype, DeepEP buffers) select a *scenario*:
      ``combine`` runs once per scenario present, with the flags as Python constants (the
      gradient dtype is the space's fixed ``grad_reduce_in_fp32``, so it adds no scenario);
    * geometry: ``stage_counts`` per (pp, vpp, split, min(ga, saturation), recompute code), the
      stages no other stage dominates, padded to the same number of slots.

    ``combine`` runs on the option's geometry (``fits``, ``totals``: family ``hbm``), and for
    ``recompute_dominance`` on the next smaller K's geometry (``fits_prev``) and, when no
    recomputation is an option beside others, on the no-recompute geometry and units
    (``fits_none``).
    """

    def __init__(self, m: LegalityModel) -> None:
        self.m = m
        p = m.p
        self.limit = p.limit_bytes
        self.dominance = "recompute_dominance" in m.families
        #: no recomputation is an option beside others: it dominates them when it fits
        self.by_none = self.dominance and m.none_option and any(
            o.kind is not Recompute.NONE for o in p.space.recompute)
        self._units()
        self._geometry()
        self.totals, self.fits = self._fits("row", self.au)

    @cached_property
    def fits_prev(self) -> Value:
        """Whether the next smaller K's geometry fits (built when the dominance needs it)."""
        assert self.dominance
        return self._fits("prev", self.au)[1]

    @cached_property
    def fits_none(self) -> Value:
        """Whether no recomputation fits (built when the dominance needs it). With the
        model's ``none_fits`` layouts (an enforced model, whose options are all dominated where
        no recomputation fits): those layouts refused, and 0."""
        assert self.by_none
        if self.m.none_fits is None:
            return self._fits("none", self.au_none)[1]
        m = self.m
        layout = [v for k, v in m.axis.items() if k != "recompute"]
        live = [i for i, v in enumerate(layout) if not isinstance(v, int)]
        rows = {tuple(r[i] for i in live) for r in m.none_fits
                if all(r[i] == v for i, v in enumerate(layout) if isinstance(v, int))}
        if rows and not live:
            m.cp.AddBoolOr([])  # the one layout has no recomputation fitting: nothing kept
        elif rows:
            m.cp.AddForbiddenAssignments([m.ar.as_var(layout[i]) for i in live], sorted(rows))
        return 0

    @cached_property
    def au_none(self) -> M.ActivationUnits:
        return self._activation_units(0)  # no selective modules

    # ------------------------------------------------------------ layer 2

    def _units(self) -> None:
        m, p, ar, sp = self.m, self.m.p, self.m.ar, self.m.p.space
        model, training, ov = p.model, p.training, p.overheads
        pairs = m.etp_pairs
        memo = m.cache

        def pu(t: int, pp_: int, e: int, et: int) -> tuple[int, ...]:
            key = (t, pp_, e, et)
            out = memo.pu.get(key)
            if out is None:
                out = memo.pu[key] = _fields(M.param_units(model, t, pp_, e, et))
            return out

        pu_cols = ar.lookup(
            [m.tp, m.pp, m.ep, m.etp], pu, "pu",
            tuples=[(t, pp_, e, et) for (t, et) in pairs for pp_ in sp.pp for e in sp.ep])
        self.pu = M.ParamUnits(*pu_cols)

        fp8_dom = sorted({FP8_CODE[m._resolved(fp8_recipe=f).fp8_recipe] for f in sp.fp8_recipe})

        def act(b: int, t: int, c: int, et: int, f: int, ms: int, pp_: int) -> tuple[int, ...]:
            mods = m.modsets[ms]
            pp_ = M.activation_pp(pp_)  # the units of every pp > 1 are those of pp 2
            key = (b, t, c, et, f, mods, pp_)
            out = memo.act.get(key)
            if out is None:
                cfg = m._resolved(
                    tp=t, pp=pp_, cp=c, etp=et, mbs=b, fp8_recipe=FP8_OF_CODE[f],
                    recompute=Recompute.SELECTIVE if mods else Recompute.NONE,
                    **({"recompute_modules": mods} if mods else {}))
                out = memo.act[key] = _fields(M.activation_units(model, training, cfg, ov))
            return out

        def units(modset: Value) -> M.ActivationUnits:
            cols = ar.lookup(
                [m.mbs, m.tp, m.cp_, m.etp, m.fp8, modset, m.pp], act, "au",
                tuples=[(b, t, c, et, f, ms, pp_) for b in sp.mbs for (t, et) in pairs
                        for c in sp.cp for f in fp8_dom for ms in _domain(modset)
                        for pp_ in sp.pp])
            return M.ActivationUnits(*cols)

        self._activation_units = units
        self.au = units(m.modset)

        scen: dict[tuple[bool, bool, bool, bool], int] = {}
        cluster = p.cluster
        numeric = [f.name for f in dataclasses.fields(M.Sharding)
                   if f.name not in ("distributed_optimizer", "fsdp", "grad_reduce_in_fp32",
                                     "dispatcher_buffers")]
        grad_fp32 = sp.grad_reduce_in_fp32  # fixed per problem (not an axis)

        def shard(t: int, pp_: int, c: int, e: int, et: int, f: int, o: int,
                  d: int) -> tuple[int, ...]:
            opt, disp = sp.optimizer[o], sp.dispatcher[d]
            key = (t, pp_, c, e, et, f, opt, disp, grad_fp32, sp.fp8_param_gather,
                   sp.optimizer_state)
            out = memo.shard.get(key)
            if out is None:
                cfg = m._resolved(tp=t, pp=pp_, cp=c, ep=e, etp=et, fp8_recipe=FP8_OF_CODE[f],
                                  distributed_optimizer=opt is OptimizerChoice.DISTRIBUTED,
                                  fsdp=opt is OptimizerChoice.FSDP, dispatcher=disp,
                                  grad_reduce_in_fp32=grad_fp32,
                                  fp8_param_gather=(sp.fp8_param_gather
                                                    and FP8_OF_CODE[f] is not None),
                                  optimizer_state=sp.optimizer_state)
                sh = M.sharding(model, cluster, cfg, p.training.precision is Precision.FP4)
                out = memo.shard[key] = (
                    *(getattr(sh, n) for n in numeric),
                    (sh.distributed_optimizer, sh.fsdp, sh.grad_reduce_in_fp32,
                     sh.dispatcher_buffers))
            return (*out[:-1], scen.setdefault(out[-1], len(scen)))

        cols = ar.lookup(
            [m.tp, m.pp, m.cp_, m.ep, m.etp, m.fp8, m.opt_i, m.disp_i], shard, "sh",
            tuples=[(t, pp_, c, e, et, f, o, d) for (t, et) in pairs for pp_ in sp.pp
                    for c in sp.cp for e in sp.ep for f in fp8_dom
                    for o in range(len(sp.optimizer)) for d in range(len(sp.dispatcher))])
        self.sh_numeric = dict(zip(numeric, cols[:-1], strict=True))
        self.scenario = cols[-1]
        self.scenarios = {v: k for k, v in scen.items()}

    def sharding(self, scenario: int) -> M.Sharding:
        do, fsdp, grad_fp32, disp = self.scenarios[scenario]
        return M.Sharding(**self.sh_numeric, distributed_optimizer=do, fsdp=fsdp,
                          grad_reduce_in_fp32=grad_fp32, dispatcher_buffers=disp)

    # ------------------------------------------------------------ layer 1

    def _geometry(self) -> None:
        m, p, ar, sp = self.m, self.m.p, self.m.ar, self.m.p.space
        model = p.model
        # memory is tabulated for the geometries pipeline_split admits (for the others it is not
        # defined, as in rules.check); with that family off, for every geometry
        def tabulated(a: int, b: int, c: int) -> bool:
            return "pipeline_split" not in m.families or split_ok(m, a, b, c)

        covered = ar.predicate([m.pp, m.vpp, m.split], tabulated, "covered")
        self.covered = covered

        chunk_memo = m.cache.chunk_max

        def chunk_max(pp_: int, v: int, s: int) -> int:
            if not tabulated(pp_, v, s):
                return 0
            got = chunk_memo.get((pp_, v, s))
            if got is None:
                chunks = M.pipeline_chunks(model.num_layers, model.num_mtp_layers, pp_, v,
                                           SPLITS[s])
                got = chunk_memo[(pp_, v, s)] = max(len(ch.layers) for st in chunks for ch in st)
            return got

        cmax = ar.lookup([m.pp, m.vpp, m.split], lambda a, b, c: (chunk_max(a, b, c),), "cmax")[0]
        opts = sp.recompute
        block = sp.full_layers

        below = dict(zip(block[1:], block[:-1], strict=False))  # the next smaller K

        def layers(o: RecomputeOption) -> tuple[int, int, int]:
            """(code base, K, the previous option's K): the previous option is the next smaller
            K of the domain for full block recompute (but the smallest), else the option."""
            if o.kind is not Recompute.FULL:
                return 0, 0, 0
            assert o.layers is not None
            base = (METHOD_CODE[o.method] + 1) * CODE_STRIDE
            return base, o.layers, below.get(o.layers, o.layers) if o.is_full_block else o.layers

        per_option = [layers(o) for o in opts]

        def code(r: int, cm: int) -> tuple[int, int]:
            base, k, k_prev = per_option[r]
            return (base + min(k, cm), base + min(k_prev, cm)) if base else (0, 0)

        pairs = None
        if m.enforced and "recompute" in m.families:
            # the recompute family keeps K within the layers of one virtual stage: only the
            # (option, largest chunk) pairs some geometry allows with it can occur
            rcs = _domain(m.rc)
            allowed: dict[int, list[int]] = {}  # the options recompute allows, per chunk size
            got: set[tuple[int, int]] = set()
            for a, b, c in product(_domain(m.pp), _domain(m.vpp), _domain(m.split)):
                per = layers_per_chunk(model, m._resolved(pp=a, vpp=b, pipeline_split=SPLITS[c]))
                if per not in allowed:
                    allowed[per] = [r for r in rcs if recompute_k_ok(opts[r], per)]
                cm = chunk_max(a, b, c)
                got.update((r, cm) for r in allowed[per])
            pairs = sorted(got)
        codes = ar.lookup([m.rc, cmax], code, "code", tuples=pairs)
        sat = ar.lookup([m.pp, m.vpp], lambda a, b: (M.inflight_saturation(a, b),), "sat")[0]
        mcap = ar.lookup([m.ga, sat], lambda g, st: (min(g, st),), "mcap")[0]
        # uncovered geometries (the split is illegal) share one row: their key is (pp, vpp,
        # split, 0, 0) whatever the micro-batches and recompute
        w_mcap = covered * mcap
        w_code, w_prev = covered * codes[0], covered * codes[1]

        stage_lists: dict[tuple[int, ...], list[M.StageCounts]] = {}
        world, gbs = p.cluster.world_size, p.training.global_batch_size
        all_codes = sorted(set(_domain(codes[0])) | set(_domain(codes[1]))
                           | ({0} if self.by_none else set()))
        for pp_, v, s in product(sp.pp, sp.vpp, sorted(set(_domain(m.split)))):
            if not tabulated(pp_, v, s):
                stage_lists[(pp_, v, s, 0, 0)] = []  # no geometry: hbm does not hold
                continue
            cm = chunk_max(pp_, v, s)
            sat_v = M.inflight_saturation(pp_, v)
            ga_reach = {derived_ga(gbs, b, derived_dp(world, t, pp_, c))
                        for t in sp.tp for c in sp.cp for b in sp.mbs}
            for mc in sorted({min(g, sat_v) for g in ga_reach}):
                for cd in all_codes:
                    if cd and cd % CODE_STRIDE > cm:
                        continue
                    key = (pp_, v, s, mc, cd)
                    sl = m.cache.stages.get(key)
                    if sl is None:
                        sl = m.cache.stages[key] = self._stage_counts(pp_, v, SPLITS[s], mc, cd)
                    stage_lists[key] = sl
        self.n_slots = max(len(sl) for sl in stage_lists.values())
        self.n_groups = max((len(st.recompute_groups) for sl in stage_lists.values() for st in sl),
                            default=0)
        width = len(M.VECTOR_FIELDS)  # all but stage and recompute_groups
        gw = len(M.KINDS)  # a recompute group: layers per kind
        zero = M.StageCounts(0, **dict.fromkeys(M.VECTOR_FIELDS, 0), recompute_groups=())

        vectors: dict[int, tuple[int, ...]] = {}  # as_vector per stage (by id: all kept alive)
        flat_memo = m.cache.flat

        def flat(*key: int) -> tuple[int, ...]:
            sl = stage_lists[key]  # the cache's stage counts of the key, or [] (no geometry)
            memo_key = (key, bool(sl), self.n_slots, self.n_groups)
            got = flat_memo.get(memo_key)
            if got is None:
                got = flat_memo[memo_key] = flat_row(sl)
            return got

        def flat_row(sl: list[M.StageCounts]) -> tuple[int, ...]:
            out: list[int] = []
            for j in range(self.n_slots):
                st = sl[min(j, len(sl) - 1)] if sl else zero
                vec = vectors.get(id(st))
                if vec is None:
                    vec = vectors[id(st)] = st.as_vector()
                out += vec
                for g in range(self.n_groups):
                    out += st.recompute_groups[g] if g < len(st.recompute_groups) else (0,) * gw
            return tuple(out)

        codes_of = {"row": w_code, "prev": w_prev, "none": 0}

        def geometry_slots(which: str) -> list[M.StageCounts]:
            cols = ar.lookup([m.pp, m.vpp, m.split, w_mcap, codes_of[which]], flat,
                             f"geo_{which}", tuples=list(stage_lists))
            per = width + gw * self.n_groups
            slots = []
            for j in range(self.n_slots):
                c = cols[j * per:(j + 1) * per]
                groups = tuple(tuple(c[width + gw * g + i] for i in range(gw))
                               for g in range(self.n_groups))
                slots.append(M.StageCounts(j, **dict(zip(M.VECTOR_FIELDS, c[:width], strict=True)),
                                           recompute_groups=groups))
            return slots

        self._geometry_slots = geometry_slots
        #: per geometry ("row", "prev", "none"): the stage counts of each slot, once built
        self.slots: dict[str, list[M.StageCounts]] = {}

    def _stage_counts(self, pp: int, vpp: int, split: PipelineSplit, mcap: int,
                      cd: int) -> list[M.StageCounts]:
        kind = Recompute.FULL if cd else Recompute.NONE
        extra: dict[str, Any] = {}
        if cd:
            extra = {"recompute_method": METHODS[cd // CODE_STRIDE - 1],
                     "recompute_layers": cd % CODE_STRIDE}
        cfg = ParallelConfig(pp=pp, vpp=vpp, pipeline_split=split, ga=mcap, dp=1,
                             recompute=kind, **extra)
        return prune_stages(M.stage_counts(self.m.p.model, cfg))

    # ------------------------------------------------------------ layer 3

    def _fits(self, which: str, au: M.ActivationUnits) -> tuple[list[dict[int, Value]], Value]:
        """Per slot, the total bytes under each sharding scenario; and whether all fit."""
        m, ar = self.m, self.m.ar
        ov = m.p.overheads
        totals: list[dict[int, Value]] = []
        slot_ok = []
        if which not in self.slots:
            self.slots[which] = self._geometry_slots(which)
        for c in self.slots[which]:
            per_scen: dict[int, Value] = {}
            fits_in = []
            for s in self.scenarios:
                terms = M.combine(c, self.pu, au, self.sharding(s), ov)
                total = sum(terms.values())
                if m.enforced and isinstance(total, Sym):
                    # one variable per total in the enumeration models: the fit test and the
                    # peak read per solution (feasible._Collector) touch it, not its ~10 terms
                    ar.as_var(total, "total")
                per_scen[s] = total
                le = ar.le(total, self.limit, "fits", big_m=m.enforced)
                if len(self.scenarios) == 1:
                    fits_in.append(le)
                else:
                    fits_in.append(ar.all_of([ar.predicate([self.scenario], lambda x, s=s: x == s,
                                                           "scen"), le], "fits_s"))
            totals.append(per_scen)
            slot_ok.append(ar.any_of(fits_in, "fits_any"))
        return totals, ar.all_of([self.covered, *slot_ok], "fits_all")

    def peak(self, value: Callable[[Any], int]) -> int:
        """The most loaded stage's bytes of a solution (``value`` reads a solver value)."""
        s = value(self.scenario) if isinstance(self.scenario, Sym) else self.scenario
        return max(value(t[s]) if isinstance(t[s], Sym) else t[s] for t in self.totals)


def _domain(x: Value) -> list[int]:
    from tune_cp.solver.symbolic import domain_of

    return domain_of(x)

