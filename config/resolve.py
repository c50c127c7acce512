"""The one resolver of a configuration's derived fields, vectorised over a columnar batch.

:class:`Columns` holds configurations of one (model, cluster, training) as one numpy array per
:class:`~config.specs.ParallelConfig` field the oracle reads, with the enums in the coding of
:mod:`config.codes`. A field left to the resolver (``None`` on a ``ParallelConfig``) is the
sentinel :data:`UNSET` (``-1``; for ``etp``, ``dp`` and ``ga`` also any value below 1).
:func:`resolve` derives them, for every row at once:

* dp = world // (tp pp cp) and ga = gbs // (mbs dp), each at least 1 (whether the identities
  hold exactly is the solver's rule ``batch``, which names the values);
* etp = tp;
* sequence parallelism on when tp > 1, and off at tp 1 whatever was given (Megatron-LM
  ``megatron/training/arguments.py`` l.1433-1439 at ``d98e8a64``, the commit
  ``formats/megatron_validate.py`` reads: ``args.sequence_parallel = False`` at tp 1);
* the distributed optimizer off under FSDP: tune-cp's one spelling of FSDP's sharding
  (``fsdp`` alone; Megatron-FSDP shards the optimizer state itself, and the exporters write
  the ``--use-distributed-optimizer`` it needs: ``formats/export.py``);
* schedule interleaved iff vpp > 1, else 1F1B;
* the FP8 recipe of an FP8 training without one: :func:`config.specs.default_fp8_recipe`;
* the pipeline split, where none is given: :func:`config.specs.auto_pipeline_split`;
* recompute layers only under full recompute (else ``-1``, all);
* the flex dispatcher's library: :func:`config.specs.resolved_flex_backend`'s choice, Primus-
  Turbo's DeepEP on AMD, NVIDIA DeepEP elsewhere, none without the flex dispatcher;
* the fp32 router where not given: on with Primus-Turbo's DeepEP, which needs it;
* permute fusion on from sync-free stage 1 (Primus ``rocm_arg_validation.py``
  ``_get_sync_free_moe_options``).

:func:`resolve_config` is this resolver on a batch of one, viewed as a ``ParallelConfig``
(:func:`columns_of`, then :func:`resolved_update`). ``oracle/work.py::ConfigBatch`` is a
resolved :class:`Columns` with the run's traits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from tune_cp.config.codes import (
    DISPATCH_CODE,
    DISPATCHERS,
    FLEX_BACKENDS,
    FLEX_CODE,
    FP8_CODE,
    FP8_OF_CODE,
    GROUPED_GEMM_CODE,
    GROUPED_GEMMS,
    METHOD_CODE,
    METHODS,
    RECOMPUTE_CODE,
    RECOMPUTES,
    SCHEDULE_CODE,
    SCHEDULES,
    SPLIT_CODE,
    VALUELESS_SPLIT_KEYS,
    SplitKey,
    mask_modules,
    module_mask,
    split_config,
)
from tune_cp.config.specs import (
    ClusterSpec,
    Dispatcher,
    FlexBackend,
    ModelSpec,
    ParallelConfig,
    Precision,
    Recompute,
    Schedule,
    TrainingSpec,
    auto_pipeline_split,
    default_flex_backend,
    default_fp8_recipe,
    given_pipeline_split,
)

#: the code of a field the resolver derives (``None`` on a ``ParallelConfig``)
UNSET = -1
_FULL = RECOMPUTE_CODE[Recompute.FULL]
_FLEX = DISPATCH_CODE[Dispatcher.FLEX]
_TURBO = FLEX_CODE[FlexBackend.TURBO]
_INTERLEAVED = SCHEDULE_CODE[Schedule.INTERLEAVED]
_ONE_F_ONE_B = SCHEDULE_CODE[Schedule.ONE_F_ONE_B]


@dataclass
class Columns:
    """Configurations of one (model, cluster, training) as numpy arrays, one per field.

    Codes (:mod:`config.codes`): ``recompute`` :data:`~config.codes.RECOMPUTE_CODE`,
    ``recompute_method`` :data:`~config.codes.METHOD_CODE`, ``recompute_layers`` ``-1`` = every
    layer, ``recompute_modules`` a :data:`~config.codes.MODULE_BITS` mask, ``dispatcher``
    :data:`~config.codes.DISPATCH_CODE`, ``schedule`` :data:`~config.codes.SCHEDULE_CODE`,
    ``split`` a position in :attr:`split_keys`, ``fp8`` :data:`~config.codes.FP8_CODE`,
    ``flex`` :data:`~config.codes.FLEX_CODE`, ``grouped_gemm``
    :data:`~config.codes.GROUPED_GEMM_CODE`; ``grad_fp32`` the gradient buffer and reduction
    in fp32, ``sync_free`` the sync-free MoE stage 0-3, ``shared_overlap`` the shared-expert
    overlap. Before :func:`resolve`, :data:`UNSET` marks what it derives (``etp``, ``dp``,
    ``ga``, ``sp``, ``schedule``, ``fp8``, ``split``, ``flex``, ``router_fp32``: ``sp`` and
    ``router_fp32`` are then int8 arrays of -1/0/1); after, every field holds its value
    (``sp`` and ``router_fp32`` bool).
    """

    tp: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    dp: np.ndarray
    mbs: np.ndarray
    ga: np.ndarray
    sp: np.ndarray
    recompute: np.ndarray
    recompute_method: np.ndarray
    recompute_layers: np.ndarray
    recompute_modules: np.ndarray
    distributed_optimizer: np.ndarray
    fsdp: np.ndarray
    dispatcher: np.ndarray
    schedule: np.ndarray
    split: np.ndarray
    fp8: np.ndarray
    grad_fp32: np.ndarray
    sync_free: np.ndarray
    flex: np.ndarray
    grouped_gemm: np.ndarray
    permute_fusion: np.ndarray
    shared_overlap: np.ndarray
    router_fp32: np.ndarray
    #: the splits (with their values) the codes of ``split`` name: this batch's own table
    #: (:func:`config.codes.split_table`)
    split_keys: tuple[SplitKey, ...] = VALUELESS_SPLIT_KEYS

    def __len__(self) -> int:
        return len(self.tp)

    @property
    def turbo_flex(self) -> np.ndarray:
        """Whether the flex dispatcher's library is Primus-Turbo's DeepEP (0/1 per row)."""
        return self.flex == _TURBO

    def take(self, index: Any) -> Columns:
        """The rows ``index`` (an index array or a mask), the same split table."""
        return replace(self, **{f: getattr(self, f)[index] for f in COLUMN_FIELDS})


#: the array fields of :class:`Columns`, in declaration order
COLUMN_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Columns) if f.name != "split_keys")
#: the dtype of each field of an unresolved :class:`Columns` (the resolved ``sp`` and
#: ``router_fp32`` are bool)
_DTYPES: dict[str, Any] = {f: np.int64 for f in COLUMN_FIELDS} | {
    "sp": np.int8, "router_fp32": np.int8, "distributed_optimizer": bool, "fsdp": bool,
    "grad_fp32": bool, "permute_fusion": bool, "shared_overlap": bool}


def columns(n: int | None = None, split_keys: tuple[SplitKey, ...] = VALUELESS_SPLIT_KEYS,
            **values: Any) -> Columns:
    """Unresolved columns from arrays or scalars (broadcast to one length: ``n``, else the
    longest array given); a field not given is its ``ParallelConfig`` default (:data:`UNSET`
    for the derived ones). Enum fields take codes (:mod:`config.codes`)."""
    unknown = sorted(set(values) - set(COLUMN_FIELDS))
    if unknown:
        raise TypeError(f"unknown column(s) {unknown}; choose from {', '.join(COLUMN_FIELDS)}")
    arrays = {k: np.asarray(v) for k, v in values.items()}
    if n is None:
        n = max((a.size for a in arrays.values() if a.ndim), default=1)
    out = {f: np.broadcast_to(np.asarray(arrays.get(f, _DEFAULTS[f]), dtype=_DTYPES[f]).ravel(),
                              (n,)).copy() for f in COLUMN_FIELDS}
    return Columns(**out, split_keys=split_keys)


_CFG = ParallelConfig()
#: each field's default: the ``ParallelConfig`` default, coded
_DEFAULTS: dict[str, Any] = {
    "tp": _CFG.tp, "pp": _CFG.pp, "vpp": _CFG.vpp, "cp": _CFG.cp, "ep": _CFG.ep, "etp": UNSET,
    "dp": UNSET, "mbs": _CFG.mbs, "ga": UNSET, "sp": UNSET,
    "recompute": RECOMPUTE_CODE[_CFG.recompute],
    "recompute_method": METHOD_CODE[_CFG.recompute_method], "recompute_layers": UNSET,
    "recompute_modules": module_mask(_CFG.recompute_modules),
    "distributed_optimizer": _CFG.distributed_optimizer, "fsdp": _CFG.fsdp,
    "dispatcher": DISPATCH_CODE[_CFG.dispatcher], "schedule": UNSET, "split": UNSET,
    "fp8": UNSET, "grad_fp32": _CFG.grad_reduce_in_fp32, "sync_free": _CFG.sync_free_stage,
    "flex": UNSET, "grouped_gemm": GROUPED_GEMM_CODE[_CFG.grouped_gemm],
    "permute_fusion": _CFG.permute_fusion, "shared_overlap": _CFG.shared_expert_overlap,
    "router_fp32": UNSET,
}


def _tri(v: bool | None) -> int:
    return UNSET if v is None else int(v)


def columns_of(configs: Sequence[ParallelConfig]) -> Columns:
    """Unresolved (or resolved) ``ParallelConfig`` s as :class:`Columns`; a split given on a
    configuration (:func:`config.specs.given_pipeline_split`) is a code in the batch's split
    table, an automatic one :data:`UNSET`."""
    keys = dict.fromkeys(VALUELESS_SPLIT_KEYS)
    split = []
    for c in configs:
        given = given_pipeline_split(c)
        if given is None:
            split.append(UNSET)
            continue
        key = (given, c.first_stage_layers, c.last_stage_layers, c.pipeline_layout)
        keys.setdefault(key)
        split.append(key)
    table = tuple(keys)
    code = {k: i for i, k in enumerate(table)}
    rows = [c.__dict__ for c in configs]
    masks: dict[Any, int] = {}
    for r in rows:
        mods = r["recompute_modules"]
        if mods not in masks:
            masks[mods] = module_mask(mods)

    def arr(name: str, dtype: Any = np.int64, of: Any = None, unset: bool = False) -> np.ndarray:
        vals = [r[name] for r in rows]
        if unset:
            vals = [UNSET if v is None else v for v in vals]
        return np.array(vals if of is None else [of[v] for v in vals], dtype=dtype)

    return Columns(
        tp=arr("tp"), pp=arr("pp"), vpp=arr("vpp"), cp=arr("cp"), ep=arr("ep"),
        etp=arr("etp", unset=True), dp=arr("dp", unset=True), mbs=arr("mbs"),
        ga=arr("ga", unset=True),
        sp=np.array([_tri(r["sequence_parallel"]) for r in rows], dtype=np.int8),
        recompute=arr("recompute", of=RECOMPUTE_CODE),
        recompute_method=arr("recompute_method", of=METHOD_CODE),
        recompute_layers=arr("recompute_layers", unset=True),
        recompute_modules=arr("recompute_modules", of=masks),
        distributed_optimizer=arr("distributed_optimizer", bool), fsdp=arr("fsdp", bool),
        dispatcher=arr("dispatcher", of=DISPATCH_CODE),
        schedule=np.array([UNSET if r["schedule"] is None else SCHEDULE_CODE[r["schedule"]]
                           for r in rows], dtype=np.int64),
        split=np.array([s if s == UNSET else code[s] for s in split], dtype=np.int64),
        fp8=arr("fp8_recipe", of=FP8_CODE), grad_fp32=arr("grad_reduce_in_fp32", bool),
        sync_free=arr("sync_free_stage"), flex=arr("flex_backend", of=FLEX_CODE),
        grouped_gemm=arr("grouped_gemm", of=GROUPED_GEMM_CODE),
        permute_fusion=arr("permute_fusion", bool),
        shared_overlap=arr("shared_expert_overlap", bool),
        router_fp32=np.array([_tri(r["router_fp32"]) for r in rows], dtype=np.int8),
        split_keys=table,
    )


def resolve(cols: Columns, model: ModelSpec, cluster: ClusterSpec,
            training: TrainingSpec) -> Columns:
    """Every derived field of every row of ``cols`` (the rules of the module docstring); given
    values are kept, except sequence parallelism at tp 1 and the distributed optimizer under
    FSDP, which are turned off."""
    tp, pp, cp, vpp = cols.tp, cols.pp, cols.cp, cols.vpp
    dp = np.where(cols.dp >= 1, cols.dp, np.maximum(1, cluster.world_size // (tp * pp * cp)))
    ga = np.where(cols.ga >= 1, cols.ga,
                  np.maximum(1, training.global_batch_size // (cols.mbs * dp)))
    fp8 = cols.fp8
    if training.precision is Precision.FP8:
        fp8 = np.where(fp8 == UNSET, FP8_CODE[default_fp8_recipe(cluster.gpu)], fp8)
    split = cols.split
    auto = split == UNSET
    if auto.any():
        # auto_pipeline_split reads pp * vpp only: once per distinct product
        virtual = pp[auto] * vpp[auto]
        uniq, inverse = np.unique(virtual, return_inverse=True)
        codes = np.array([SPLIT_CODE[auto_pipeline_split(model, int(v), 1)] for v in uniq],
                         dtype=np.int64)
        split = split.copy()
        split[auto] = codes[inverse.ravel()]
    default_flex = FLEX_CODE[default_flex_backend(cluster.gpu)]
    flex = np.where(cols.flex != UNSET, cols.flex,
                    np.where(cols.dispatcher == _FLEX, default_flex, UNSET))
    return replace(
        cols, dp=dp, ga=ga,
        etp=np.where(cols.etp >= 1, cols.etp, tp),
        sp=np.where(cols.sp == UNSET, tp > 1, cols.sp == 1) & (tp > 1),
        distributed_optimizer=cols.distributed_optimizer & ~cols.fsdp,
        schedule=np.where(cols.schedule != UNSET, cols.schedule,
                          np.where(vpp > 1, _INTERLEAVED, _ONE_F_ONE_B)),
        fp8=fp8, split=split,
        recompute_layers=np.where(cols.recompute == _FULL, cols.recompute_layers, UNSET),
        flex=flex,
        router_fp32=np.where(cols.router_fp32 == UNSET, flex == _TURBO, cols.router_fp32 == 1),
        permute_fusion=cols.permute_fusion | (cols.sync_free >= 1),
    )


#: the ``ParallelConfig`` fields :func:`resolve` derives or may change
RESOLVED_FIELDS: tuple[str, ...] = (
    "dp", "ga", "etp", "sequence_parallel", "distributed_optimizer", "schedule", "fp8_recipe",
    "pipeline_split", "recompute_layers", "flex_backend", "router_fp32", "permute_fusion")


def resolved_update(cols: Columns, i: int) -> dict[str, Any]:
    """The :data:`RESOLVED_FIELDS` of row ``i`` of resolved ``cols`` as ``ParallelConfig``
    values (the update that turns the row's unresolved configuration into its resolved
    view)."""
    layers = int(cols.recompute_layers[i])
    flex = int(cols.flex[i])
    return {
        "dp": int(cols.dp[i]), "ga": int(cols.ga[i]), "etp": int(cols.etp[i]),
        "sequence_parallel": bool(cols.sp[i]),
        "distributed_optimizer": bool(cols.distributed_optimizer[i]),
        "schedule": SCHEDULES[int(cols.schedule[i])],
        "fp8_recipe": FP8_OF_CODE[int(cols.fp8[i])],
        "pipeline_split": cols.split_keys[int(cols.split[i])][0],
        "recompute_layers": None if layers == UNSET else layers,
        "flex_backend": None if flex == UNSET else FLEX_BACKENDS[flex],
        "router_fp32": bool(cols.router_fp32[i]),
        "permute_fusion": bool(cols.permute_fusion[i]),
    }


def resolve_config(cfg: ParallelConfig, model: ModelSpec, cluster: ClusterSpec,
                   training: TrainingSpec) -> ParallelConfig:
    """Fill every derived field of ``cfg``: :func:`resolve` on the batch of one, viewed as the
    ``ParallelConfig`` (the module docstring lists the rules). Integer division is deliberate:
    whether ``tp*pp*cp*dp == world`` and ``mbs*ga*dp == gbs`` hold exactly is checked by the
    solver's rules, which name the values and the legal alternatives."""
    return cfg.model_copy(update=resolved_update(
        resolve(columns_of([cfg]), model, cluster, training), 0))


def resolve_many(configs: Sequence[ParallelConfig], model: ModelSpec, cluster: ClusterSpec,
                 training: TrainingSpec) -> list[ParallelConfig]:
    """:func:`resolve_config` of each configuration, resolved as one batch."""
    cols = resolve(columns_of(configs), model, cluster, training)
    return [c.model_copy(update=resolved_update(cols, i)) for i, c in enumerate(configs)]


def as_read(cols: Columns) -> Columns:
    """Columns of configurations as a ``ParallelConfig``'s properties read them: sequence
    parallelism ``sp`` (tp > 1 where not given), ``etp_`` (tp), ``schedule_`` (interleaved iff
    vpp > 1), the fp32 router off where not given. For configurations already resolved (the
    oracle's batches) this changes nothing; :func:`resolve` is the resolver."""
    return replace(
        cols,
        etp=np.where(cols.etp >= 1, cols.etp, cols.tp),
        sp=np.where(cols.sp == UNSET, cols.tp > 1, cols.sp == 1),
        schedule=np.where(cols.schedule != UNSET, cols.schedule,
                          np.where(cols.vpp > 1, _INTERLEAVED, _ONE_F_ONE_B)),
        router_fp32=cols.router_fp32 == 1,
    )


def view(cols: Columns, i: int) -> ParallelConfig:
    """Row ``i`` of resolved ``cols`` as a ``ParallelConfig`` (the fields the columns hold;
    ``fp8_param_gather`` and ``optimizer_state`` their defaults)."""
    rc = RECOMPUTES[int(cols.recompute[i])]
    layers = int(cols.recompute_layers[i])
    flex = int(cols.flex[i])
    return ParallelConfig(
        tp=int(cols.tp[i]), pp=int(cols.pp[i]), vpp=int(cols.vpp[i]), cp=int(cols.cp[i]),
        ep=int(cols.ep[i]), etp=int(cols.etp[i]), dp=int(cols.dp[i]), mbs=int(cols.mbs[i]),
        ga=int(cols.ga[i]), sequence_parallel=bool(cols.sp[i]), recompute=rc,
        recompute_method=METHODS[int(cols.recompute_method[i])],
        recompute_layers=None if layers < 0 or rc is not Recompute.FULL else layers,
        recompute_modules=mask_modules(int(cols.recompute_modules[i])) or ("core_attn",),
        distributed_optimizer=bool(cols.distributed_optimizer[i]), fsdp=bool(cols.fsdp[i]),
        grad_reduce_in_fp32=bool(cols.grad_fp32[i]),
        dispatcher=DISPATCHERS[int(cols.dispatcher[i])],
        schedule=SCHEDULES[int(cols.schedule[i])], fp8_recipe=FP8_OF_CODE[int(cols.fp8[i])],
        **split_config(cols.split_keys[int(cols.split[i])]),
        sync_free_stage=int(cols.sync_free[i]),
        flex_backend=None if flex == UNSET else FLEX_BACKENDS[flex],
        grouped_gemm=GROUPED_GEMMS[int(cols.grouped_gemm[i])],
        permute_fusion=bool(cols.permute_fusion[i]),
        shared_expert_overlap=bool(cols.shared_overlap[i]),
        router_fp32=bool(cols.router_fp32[i]),
    )


#: the ``ParallelConfig`` fields of the MoE backend as columns: (column, the field's coding;
#: None: the value itself)
BACKEND_COLUMNS: dict[str, tuple[str, dict[Any, int] | None]] = {
    "dispatcher": ("dispatcher", DISPATCH_CODE), "flex_backend": ("flex", FLEX_CODE),
    "sync_free_stage": ("sync_free", None), "grouped_gemm": ("grouped_gemm", GROUPED_GEMM_CODE),
    "permute_fusion": ("permute_fusion", None),
    "shared_expert_overlap": ("shared_overlap", None), "router_fp32": ("router_fp32", None),
}


def set_fields(cols: Columns, rows: np.ndarray, update: dict[str, Any]) -> None:
    """Set the ``ParallelConfig`` fields ``update`` (MoE backend fields,
    :data:`BACKEND_COLUMNS`) on the rows ``rows`` (a mask or index array) of resolved ``cols``,
    in place: what ``cfg.model_copy(update=update)`` is to each row's configuration."""
    for name, value in update.items():
        column, code = BACKEND_COLUMNS[name]
        getattr(cols, column)[rows] = value if code is None else code[value]


__all__ = [
    "BACKEND_COLUMNS", "COLUMN_FIELDS", "RESOLVED_FIELDS", "UNSET", "Columns", "as_read", "columns",
    "columns_of", "resolve", "resolve_config", "resolve_many", "resolved_update", "set_fields",
    "view",
]
