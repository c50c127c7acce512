"""The search space as data: the domain of every axis the solver may choose.

A :class:`SearchSpace` lists, per axis, the values a search may pick; an axis the user fixes is a
one-value domain. The raw candidate space is the product of the domains (with the expert-TP
policy tying etp to tp); :mod:`solver.model` and :mod:`solver.reference` enumerate the legal
subset of exactly this product, and ``removed`` counts are over it.

:func:`default_space` builds the space a search starts from (see ``docs/solver.md``):

* tp, pp and cp over the divisors of the world size; tp within the scale-up domain unless
  crossing it is allowed; pp at most the layer count; cp where the sequence splits in 2 cp;
* vpp over the values some pipeline size and the layer count allow (1 always);
* ep over the divisors of the expert count (1 for a dense model); etp from a policy: {1, tp}
  (default), the same as tp, or every divisor of the expert FFN width within the scale-up domain;
* mbs in {1, 2, 4, 8} up to the global batch;
* recomputation: none; selective with a few useful module sets per model (``moe_act`` for MoE,
  ``mla_up_proj`` for MLA, ``core_attn`` only without flash attention); full recompute of the
  first K layers of every virtual stage (``block``), K = 1 .. the largest virtual stage;
* distributed optimizer on, dispatcher alltoall, schedule from vpp (zero-bubble when asked),
  precision from the training spec (every FP8 recipe when asked), pipeline split automatic.

Fixed settings of a space that are not axes (one value for every candidate):
``grad_reduce_in_fp32`` (the gradient buffer's dtype, fp32 by default; ``--grad-reduce-in-bf16``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from enum import StrEnum
from itertools import product
from typing import Any

from pydantic import Field, create_model, model_validator

from tune_cp.config.axes import (
    AXES,
    AXIS,
    CHOICE_AXES,
    INT_AXES,
    PLAIN_AXES,
    SEARCH_MBS,
    SEARCH_SELECTIVE,
    module_sets,
)
from tune_cp.config.specs import (
    SEARCHED_LIGHT_SPLITS,
    SLOT_SPLITS,
    VALUELESS_SPLITS,
    ClusterSpec,
    ConfigError,
    Dispatcher,
    Fp8Recipe,
    ModelSpec,
    OptimizerState,
    ParallelConfig,
    PipelineSplit,
    Precision,
    Recompute,
    RecomputeMethod,
    Schedule,
    Spec,
    TrainingSpec,
    default_fp8_recipe,
)
from tune_cp.oracle.memory import arithmetic_problem, max_chunk_layers
from tune_cp.solver.rules import divisors, split_slots

#: Micro-batch sizes a default search tries (capped by the global batch): the registry's
#: ``mbs`` values (``config/axes.py::SEARCH_MBS``).
DEFAULT_MBS: tuple[int, ...] = SEARCH_MBS


class EtpPolicy(StrEnum):
    """How the expert-tensor-parallel size relates to tp.

    ``same``: etp = tp (Megatron's default when ``--expert-tensor-parallel-size`` is unset);
    ``one_or_tp``: etp in {1, tp} (the two layouts Megatron-Core recipes use); ``all``: any value
    of the ``etp`` domain.
    """

    SAME = "same"
    ONE_OR_TP = "one_or_tp"
    ALL = "all"


class OptimizerChoice(StrEnum):
    """Optimizer-state sharding: the distributed optimizer (ZeRO-1), replicated, or FSDP."""

    DISTRIBUTED = "distributed"
    REPLICATED = "replicated"
    FSDP = "fsdp"


class RecomputeOption(Spec):
    """One activation-recomputation choice: none, selective with ``modules``, or full with
    ``method`` and ``layers`` (K layers per virtual stage)."""

    kind: Recompute = Recompute.NONE
    method: RecomputeMethod = RecomputeMethod.BLOCK
    layers: int | None = Field(default=None, ge=0, le=100_000)
    modules: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> RecomputeOption:
        if self.kind is Recompute.FULL and self.layers is None:
            raise ValueError("a full-recompute option needs layers (K per virtual stage)")
        if self.kind is Recompute.SELECTIVE and not self.modules:
            raise ValueError("a selective-recompute option needs modules")
        if self.kind is not Recompute.FULL and self.layers is not None:
            raise ValueError(f"layers only apply to full recompute, not {self.kind.value}")
        if self.kind is not Recompute.SELECTIVE and self.modules:
            raise ValueError(f"modules only apply to selective recompute, not {self.kind.value}")
        return self

    @property
    def is_full_block(self) -> bool:
        return self.kind is Recompute.FULL and self.method is RecomputeMethod.BLOCK

    def config_fields(self) -> dict[str, Any]:
        """The :class:`ParallelConfig` fields of this option."""
        out: dict[str, Any] = {"recompute": self.kind}
        if self.kind is Recompute.FULL:
            out |= {"recompute_method": self.method, "recompute_layers": self.layers}
        if self.kind is Recompute.SELECTIVE:
            out["recompute_modules"] = self.modules
        return out

    def label(self) -> str:
        if self.kind is Recompute.FULL:
            return f"full {self.method.value} {self.layers}"
        if self.kind is Recompute.SELECTIVE:
            return f"selective {'+'.join(self.modules)}"
        return "none"


NO_RECOMPUTE = RecomputeOption()



def _positive_sorted(name: str, values: tuple[int, ...]) -> tuple[int, ...]:
    if not values:
        raise ValueError(f"{name}: the domain is empty")
    if any(v < 1 for v in values):
        raise ValueError(f"{name}: values must be positive, got {list(values)}")
    return tuple(sorted(set(values)))


class SearchSpace(Spec):
    """The domain of every axis. Values are listed in the order solutions are reported."""

    tp: tuple[int, ...]
    pp: tuple[int, ...]
    vpp: tuple[int, ...] = (1,)
    cp: tuple[int, ...] = (1,)
    ep: tuple[int, ...] = (1,)
    etp: tuple[int, ...] = Field(default=(1,), description="etp values for policy 'all'")
    etp_policy: EtpPolicy = EtpPolicy.ONE_OR_TP
    mbs: tuple[int, ...] = (1,)
    recompute: tuple[RecomputeOption, ...] = (NO_RECOMPUTE,)
    optimizer: tuple[OptimizerChoice, ...] = (OptimizerChoice.DISTRIBUTED,)
    dispatcher: tuple[Dispatcher, ...] = (Dispatcher.ALLTOALL,)
    schedule: tuple[Schedule | None, ...] = Field(
        default=(None,), description="None: interleaved when vpp > 1, else 1f1b")
    fp8_recipe: tuple[Fp8Recipe | None, ...] = Field(default=(None,), description="None: BF16")
    pipeline_split: tuple[PipelineSplit | None, ...] = Field(
        default=(None,), description="None: even when the layers divide, else embedding_loss")
    #: a fixed setting, not an axis: every candidate gets it (``ParallelConfig`` field)
    grad_reduce_in_fp32: bool = Field(
        default=True, description="gradient buffer in fp32 (True) or bf16 (False); not searched")
    fp8_param_gather: bool = Field(
        default=False, description="FP8 parameters for the candidates with an FP8 recipe "
        "(--fp8-param-gather; --framework bridge's default); not searched")
    optimizer_state: OptimizerState = Field(
        default_factory=OptimizerState, description="the optimizer state's dtypes "
        "(--use-precision-aware-optimizer, --main-params-dtype, --exp-avg-dtype, "
        "--exp-avg-sq-dtype); not searched")

    @model_validator(mode="after")
    def _check(self) -> SearchSpace:
        for name in INT_AXES:
            values = getattr(self, name)
            if tuple(values) != _positive_sorted(name, values):
                raise ValueError(f"{name}: list distinct values in increasing order, got "
                                 f"{list(values)}")
        for name in CHOICE_AXES:
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise ValueError(f"{name}: the domain must be non-empty without repeats")
        if self.optimizer_state.precision_aware and self.optimizer != (
                OptimizerChoice.DISTRIBUTED,):
            # the rule ``solver/rules.py::optimizer_state_problem``, kept out of the space
            raise ValueError(
                "the precision-aware optimizer's state dtypes need the distributed optimizer "
                "alone (Megatron-Core optimizer/__init__.py L1057); got optimizer "
                f"{[o.value for o in self.optimizer]}: drop --search-fsdp")
        return self

    # ------------------------------------------------------------------ views

    def etp_values(self, tp: int) -> tuple[int, ...]:
        """The etp domain once tp is chosen."""
        if self.etp_policy is EtpPolicy.SAME:
            return (tp,)
        if self.etp_policy is EtpPolicy.ONE_OR_TP:
            return (1, tp) if tp > 1 else (1,)
        return self.etp

    @property
    def etp_all_values(self) -> tuple[int, ...]:
        return tuple(sorted({e for t in self.tp for e in self.etp_values(t)}))

    @property
    def full_layers(self) -> tuple[int, ...]:
        """The K values of the full block-recompute options, increasing."""
        return tuple(sorted({r.layers for r in self.recompute if r.is_full_block}))  # type: ignore[misc]

    @property
    def has_no_recompute(self) -> bool:
        """Whether no recomputation is among the options (it then dominates the others when it
        fits: family ``recompute_dominance``)."""
        return any(r.kind is Recompute.NONE for r in self.recompute)

    def size(self) -> int:
        """Number of raw candidates (the product of the domains, etp per the policy)."""
        per_tp = sum(len(self.etp_values(t)) for t in self.tp)
        n = per_tp
        for name in AXES:
            if name not in ("tp", "etp"):
                n *= len(getattr(self, name))
        return n

    def candidates(self) -> Iterator[dict[str, Any]]:
        """Every raw candidate as a dict of axis values, in :data:`AXES` order."""
        cut = AXES.index("etp")  # etp's domain follows tp (the policy), the axes before it
        rest = [getattr(self, a) for a in AXES[cut + 1:]]
        for head in product(*(getattr(self, a) for a in AXES[:cut])):
            for etp in self.etp_values(head[0]):
                for tail in product(*rest):
                    yield dict(zip(AXES, (*head, etp, *tail), strict=True))

    def sample(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` raw candidates drawn uniformly (with replacement) from the product."""
        rng = random.Random(seed)
        weights = [len(self.etp_values(t)) for t in self.tp]
        out = []
        for _ in range(n):
            tp = rng.choices(self.tp, weights)[0]
            c = {a: rng.choice(getattr(self, a)) for a in AXES if a not in ("tp", "etp")}
            out.append({"tp": tp, "etp": rng.choice(self.etp_values(tp)), **c})
        return [{a: c[a] for a in AXES} for c in out]

    def with_domains(self, **domains: Any) -> SearchSpace:
        """A copy with the given axes' domains replaced (``with_domains(tp=(1, 2))``)."""
        unknown = sorted(set(domains) - set(type(self).model_fields))
        if unknown:
            raise ConfigError(f"unknown field(s) {unknown}; choose from "
                              f"{', '.join(type(self).model_fields)}")
        return SearchSpace(**(self.model_dump() | domains))

    def fix(self, **axes: Any) -> SearchSpace:
        """A copy with the given axes fixed to one value each (``fix(tp=1, pp=4)``)."""
        update: dict[str, Any] = {}
        for name, value in axes.items():
            if name not in AXES:
                raise ConfigError(f"unknown axis {name!r}; choose from {', '.join(AXES)}")
            update[name] = (value,)
            if name == "etp":
                update["etp_policy"] = EtpPolicy.ALL
        return SearchSpace(**(self.model_dump() | update))


if PLAIN_AXES:  # the registry's plain integer axes: a domain each, (1,) unless searched
    SearchSpace = create_model(  # type: ignore[misc]
        "SearchSpace", __base__=SearchSpace, __doc__=SearchSpace.__doc__,
        **{a: (tuple[int, ...], (1,)) for a in PLAIN_AXES})


def candidate_config(c: Mapping[str, Any], grad_reduce_in_fp32: bool = True,
                     fp8_param_gather: bool = False,
                     optimizer_state: OptimizerState | None = None) -> ParallelConfig:
    """The (unresolved) configuration of one candidate; ``grad_reduce_in_fp32`` and
    ``fp8_param_gather`` are the space's fixed settings (:attr:`SearchSpace.grad_reduce_in_fp32`,
    :attr:`SearchSpace.fp8_param_gather`: FP8 parameters only where the candidate has an FP8
    recipe)."""
    opt = c["optimizer"]
    rc: RecomputeOption = c["recompute"]
    return ParallelConfig(
        tp=c["tp"], pp=c["pp"], vpp=c["vpp"], cp=c["cp"], ep=c["ep"], etp=c["etp"],
        mbs=c["mbs"], distributed_optimizer=opt is OptimizerChoice.DISTRIBUTED,
        fsdp=opt is OptimizerChoice.FSDP, dispatcher=c["dispatcher"], schedule=c["schedule"],
        fp8_recipe=c["fp8_recipe"], pipeline_split=c["pipeline_split"],
        grad_reduce_in_fp32=grad_reduce_in_fp32,
        fp8_param_gather=fp8_param_gather and c["fp8_recipe"] is not None,
        optimizer_state=optimizer_state or OptimizerState(), **rc.config_fields(),
        **{a: c[a] for a in PLAIN_AXES},
    )


# ------------------------------------------------------------------------- default space


def searched_optimizers(fsdp: bool = False) -> tuple[OptimizerChoice, ...]:
    """The optimizer-state choices a search enumerates: the distributed optimizer, and with
    ``fsdp`` (``--fsdp``) Megatron-FSDP too (parameters, gradients and optimizer state sharded
    over the data-parallel group: Megatron-LM ``--use-megatron-fsdp``, whose checks in
    ``megatron/training/arguments.py`` (l.1118-1187 at ``d98e8a64dd``) refuse no tp, pp, cp or
    ep: FSDP is legal wherever the layout is; its memory is ``oracle/memory.py``'s FSDP terms).

    Opt-in, not searched by default: with it every layout is enumerated twice (distributed
    optimizer and Megatron-FSDP), +40 to +55% CPU time on the README's cases, and canonical
    answers change where FSDP's lighter model state buys a faster layout (Llama 3.1 405B on
    16 x 8 H100: TP4 PP32 176 -> TP4 PP8 FSDP 180 tokens/s/GPU); the default answers and
    their cost stay as they are."""
    if fsdp:
        return (OptimizerChoice.DISTRIBUTED, OptimizerChoice.FSDP)
    return (OptimizerChoice.DISTRIBUTED,)


#: Full-recompute depths K tried one by one (1 .. this); deeper virtual stages (models of more
#: layers than any published one: the largest catalog model has 126) get the powers of two
#: above it and the whole stage, so the space stays small for a 100,000-layer model.
RECOMPUTE_LAYERS_EXACT = 128


def recompute_layer_values(k_max: int) -> tuple[int, ...]:
    """The full-recompute depths of the default space: every K up to
    :data:`RECOMPUTE_LAYERS_EXACT`, then powers of two, then ``k_max`` (all layers)."""
    exact = range(1, min(k_max, RECOMPUTE_LAYERS_EXACT) + 1)
    powers = (1 << b for b in range(RECOMPUTE_LAYERS_EXACT.bit_length(), k_max.bit_length()))
    return tuple(sorted({*exact, *(p for p in powers if p <= k_max), k_max}))


#: the splits the search space may hold (the uneven and layout splits need values it has not)
SEARCHED_SPLITS: tuple[PipelineSplit, ...] = VALUELESS_SPLITS


def max_layers_per_chunk(model: ModelSpec, pp_values: tuple[int, ...],
                         vpp_values: tuple[int, ...]) -> int:
    """Decoder layers of the largest virtual stage over the pp x vpp domain (at least 1).

    No chunk holds more than the model's layers, so the walk stops once one does (pp = vpp = 1,
    in every default space, is the first geometry tried: fewest virtual stages first); before,
    every pp x vpp x split of the domain was split, most of the plan's CPU time at node counts
    with many divisors."""
    best = 1
    for pp, vpp in sorted(product(pp_values, vpp_values), key=lambda g: (g[0] * g[1], g)):
        for split in SEARCHED_SPLITS:
            best = max(best, max_chunk_layers(model.num_layers, model.num_mtp_layers, pp, vpp, split))
            if best >= model.num_layers:
                return best
    return best


def vpp_domain(model: ModelSpec, pp_values: tuple[int, ...],
               light: bool = False) -> tuple[int, ...]:
    """1, and every vpp > 1 some pp > 1 of the domain splits the layers for: pp x vpp divides
    the layer slots (even or embedding_loss split; a virtual stage may hold only the embedding
    or the loss), or, with ``light``, vpp divides the layers and ``layers / vpp + 1`` or
    ``+ 2`` divides over pp with a non-empty lightened end (the light splits). The default
    space does not add the light splits' own vpp values (it tries them at the others': their
    enumeration time)."""
    out = {1}
    L = model.num_layers
    for split in SLOT_SPLITS:
        if split is PipelineSplit.EMBEDDING_MTP_LOSS and not model.num_mtp_layers:
            continue
        slots = split_slots(model, split)
        for pp in pp_values:
            if pp == 1:
                continue
            out |= {v for v in range(2, slots // pp + 1) if slots % (pp * v) == 0}
    if light:
        for pp in pp_values:
            if pp == 1:
                continue
            out |= {v for v in divisors(L) if v > 1 and any(
                (L // v + t) % pp == 0 and (L // v + t) // pp > 1 for t in (1, 2))}
    return tuple(sorted(out))


def selective_options(model: ModelSpec, training: TrainingSpec) -> list[RecomputeOption]:
    """Selective-recompute module sets worth trying: each useful module alone
    (``config/axes.py::SEARCH_SELECTIVE``: ``core_attn`` without flash attention, ``mla_up_proj``
    for MLA, ``moe_act`` for MoE), and all of them together when there are several."""
    sets = module_sets(SEARCH_SELECTIVE, model, training)
    if len(sets) > 1:
        sets.append(tuple(m for s in sets for m in s))
    return [RecomputeOption(kind=Recompute.SELECTIVE, modules=s) for s in sets]


def default_space(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    *,
    fixed: Mapping[str, Any] | None = None,
    allow_cross_scale_up: bool = False,
    etp_policy: EtpPolicy | None = None,
    mbs: tuple[int, ...] = DEFAULT_MBS,
    full_recompute_layers: tuple[int, ...] | None = None,
    uniform_recompute: bool = False,
    zero_bubble: bool = False,
    fp8_recipes: bool = False,
    optimizers: tuple[OptimizerChoice, ...] = (OptimizerChoice.DISTRIBUTED,),
    dispatchers: tuple[Dispatcher, ...] = (Dispatcher.ALLTOALL,),
    pipeline_splits: tuple[PipelineSplit | None, ...] | None = None,
    grad_reduce_in_fp32: bool = True,
    fp8_param_gather: bool = False,
    optimizer_state: OptimizerState | None = None,
) -> SearchSpace:
    """The space a search starts from (module docstring); ``fixed`` pins axes to one value.

    ``etp_policy`` defaults to ``one_or_tp`` for MoE models (``same`` for dense ones, where etp
    means nothing). ``full_recompute_layers`` overrides K (default 1 .. the largest virtual
    stage); ``uniform_recompute`` adds the uniform method for the same K values; ``fp8_recipes``
    tries every FP8 recipe when the training precision is FP8. ``grad_reduce_in_fp32`` is the
    space's fixed gradient-buffer dtype (not an axis), ``fp8_param_gather`` its fixed FP8
    parameters (FP8 recipes only; not an axis).
    """
    world = cluster.world_size
    limit = world if allow_cross_scale_up else cluster.scale_up_gpus
    tp = tuple(t for t in divisors(world) if t <= limit)
    pp = tuple(p for p in divisors(world) if p <= model.num_layers)
    seq = training.seq_len
    cp = tuple(c for c in divisors(world) if c == 1 or seq % (2 * c) == 0)
    ep = tuple(divisors(model.num_experts)) if model.is_moe else (1,)
    policy = etp_policy or (EtpPolicy.ONE_OR_TP if model.is_moe else EtpPolicy.SAME)
    etp_all = tuple(e for e in divisors(model.expert_ffn_hidden_size or 1) if e <= limit)
    gbs = training.global_batch_size
    mbs_dom = tuple(b for b in mbs if b <= gbs) or (1,)
    # no figure of the space beyond what int64 and CP-SAT hold (every command's search space)
    if why := arithmetic_problem(model, training, max(mbs_dom)):
        raise ConfigError(why)
    # a hybrid Mamba model has neither virtual stages nor full recomputation (solver/rules.py
    # pipeline_split and recompute reject every such candidate): the space does not offer them
    # (full recomputation still when ``full_recompute_layers`` asks for it: the rule's tests)
    if pipeline_splits is None:  # the automatic split, and the light ones (not for hybrids)
        pipeline_splits = (None,) if model.is_hybrid else (None, *SEARCHED_LIGHT_SPLITS)
    vpp = (1,) if model.is_hybrid else vpp_domain(model, pp)
    k_max = max_layers_per_chunk(model, pp, vpp)
    ks = full_recompute_layers or recompute_layer_values(k_max)
    methods = [RecomputeMethod.BLOCK] + ([RecomputeMethod.UNIFORM] if uniform_recompute else [])
    recompute = (
        [NO_RECOMPUTE]
        + selective_options(model, training)
        + ([] if model.is_hybrid and full_recompute_layers is None else
           [RecomputeOption(kind=Recompute.FULL, method=m, layers=k) for m in methods for k in ks])
    )
    if training.precision is Precision.FP8:
        fp8: tuple[Fp8Recipe | None, ...] = (
            tuple(Fp8Recipe) if fp8_recipes else (default_fp8_recipe(cluster.gpu),))
    else:
        fp8 = (None,)
    space = SearchSpace(
        tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp_all or (1,), etp_policy=policy,
        mbs=mbs_dom, recompute=tuple(recompute), optimizer=optimizers, dispatcher=dispatchers,
        schedule=(None, Schedule.ZERO_BUBBLE) if zero_bubble else (None,), fp8_recipe=fp8,
        pipeline_split=pipeline_splits, grad_reduce_in_fp32=grad_reduce_in_fp32,
        fp8_param_gather=fp8_param_gather and training.precision is Precision.FP8,
        optimizer_state=optimizer_state or OptimizerState(),
        # the plain axes: the registry's values (config/axes.py::Axis.values)
        **{a: AXIS[a].values or (1,) for a in PLAIN_AXES},
    )
    return space.fix(**fixed) if fixed else space
