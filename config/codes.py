"""The one integer coding of each configuration enum.

A columnar batch of configurations (:class:`config.resolve.Columns`, the oracle's
:class:`oracle.work.ConfigBatch`) and the CP-SAT model's derived values (``solver/model.py``)
hold enums as these integers. Each coding is a tuple of the members in code order (a member's
code is its position) and the dict from member to code; the FP8 recipe's code of "no recipe"
(BF16 or FP4 GEMMs) is ``-1``, so the recipes keep the codes 0-3 the oracle's arrays test.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any, TypeVar

from tune_cp.config.specs import (
    VALUELESS_SPLITS,
    Dispatcher,
    FlexBackend,
    Fp8Recipe,
    GroupedGemm,
    ParallelConfig,
    PipelineSplit,
    Recompute,
    RecomputeMethod,
    Schedule,
)

E = TypeVar("E", bound=Enum)


def coding(members: tuple[E, ...]) -> dict[E, int]:
    """Member -> code of a coding given as its members in code order."""
    return {m: i for i, m in enumerate(members)}


#: recompute kind: 0 none, 1 selective, 2 full
RECOMPUTES: tuple[Recompute, ...] = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
RECOMPUTE_CODE = coding(RECOMPUTES)
#: full-recompute method: 0 uniform, 1 block
METHODS: tuple[RecomputeMethod, ...] = (RecomputeMethod.UNIFORM, RecomputeMethod.BLOCK)
METHOD_CODE = coding(METHODS)
#: MoE token dispatcher: 0 alltoall, 1 allgather, 2 flex
DISPATCHERS: tuple[Dispatcher, ...] = (Dispatcher.ALLTOALL, Dispatcher.ALLGATHER,
                                       Dispatcher.FLEX)
DISPATCH_CODE = coding(DISPATCHERS)
#: the flex dispatcher's library: 0 deepep, 1 hybridep, 2 turbo (-1: none)
FLEX_BACKENDS: tuple[FlexBackend, ...] = (FlexBackend.DEEPEP, FlexBackend.HYBRIDEP,
                                          FlexBackend.TURBO)
FLEX_CODE: dict[FlexBackend | None, int] = {None: -1, **coding(FLEX_BACKENDS)}
#: expert GEMM implementation: 0 sequential, 1 legacy, 2 te, 3 turbo
GROUPED_GEMMS: tuple[GroupedGemm, ...] = (GroupedGemm.SEQUENTIAL, GroupedGemm.LEGACY,
                                          GroupedGemm.TE, GroupedGemm.TURBO)
GROUPED_GEMM_CODE = coding(GROUPED_GEMMS)
#: pipeline schedule: 0 1f1b, 1 interleaved, 2 zero-bubble
SCHEDULES: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED,
                                   Schedule.ZERO_BUBBLE)
SCHEDULE_CODE = coding(SCHEDULES)
#: FP8 recipe: -1 none, 0 delayed, 1 tensorwise, 2 blockwise, 3 mxfp8
FP8_RECIPES: tuple[Fp8Recipe, ...] = (Fp8Recipe.DELAYED, Fp8Recipe.TENSORWISE,
                                      Fp8Recipe.BLOCKWISE, Fp8Recipe.MXFP8)
FP8_CODE: dict[Fp8Recipe | None, int] = {None: -1, **coding(FP8_RECIPES)}
#: code -> FP8 recipe (None for -1)
FP8_OF_CODE: dict[int, Fp8Recipe | None] = {v: k for k, v in FP8_CODE.items()}
#: selective-recompute modules as bits of one mask
MODULE_BITS: dict[str, int] = {"core_attn": 1, "layernorm": 2, "mlp": 4, "moe": 8,
                               "moe_act": 16, "shared_experts": 32, "mla_up_proj": 64}


def module_mask(modules: tuple[str, ...] | frozenset[str]) -> int:
    """The :data:`MODULE_BITS` mask of selective-recompute modules."""
    return sum(MODULE_BITS[m] for m in set(modules))


def mask_modules(mask: int) -> tuple[str, ...]:
    """The modules of a :data:`MODULE_BITS` mask, in the mask's bit order."""
    return tuple(m for m, bit in MODULE_BITS.items() if mask & bit)


#: A pipeline split with its values: (split, first stage layers, last stage layers, layout).
SplitKey = tuple[PipelineSplit, int | None, int | None, str | None]
#: The splits without values (``config/specs.py::VALUELESS_SPLITS``), by code: 0 even,
#: 1 embedding_loss, the light splits next, embedding_mtp_loss last. Every batch's split table
#: (``split_keys`` of a columnar batch) starts with them; the splits with values (uneven,
#: layout) follow in the batch's own table (:func:`split_table`), so a code means the same in
#: every process and needs no registry.
VALUELESS_SPLIT_KEYS: tuple[SplitKey, ...] = tuple((s, None, None, None) for s in VALUELESS_SPLITS)
SPLIT_CODE = {k[0]: i for i, k in enumerate(VALUELESS_SPLIT_KEYS)}


def split_key(cfg: ParallelConfig) -> SplitKey:
    """A resolved configuration's split with its values (as ``oracle/memory.py::split_fields``
    reads them)."""
    assert cfg.pipeline_split is not None
    return (cfg.pipeline_split, cfg.first_stage_layers, cfg.last_stage_layers,
            cfg.pipeline_layout)


def split_table(configs: Sequence[ParallelConfig]) -> tuple[SplitKey, ...]:
    """The split table of a batch of ``configs``: :data:`VALUELESS_SPLIT_KEYS`, then each split
    with values the configurations use, in the order they first appear (a code is a position
    in it)."""
    keys = dict.fromkeys(VALUELESS_SPLIT_KEYS)
    for c in configs:
        keys.setdefault(split_key(c))
    return tuple(keys)


def split_config(key: SplitKey) -> dict[str, Any]:
    """The ``ParallelConfig`` fields of a split with its values (:func:`split_key`)."""
    split, first, last, layout = key
    return {"pipeline_split": split, "first_stage_layers": first, "last_stage_layers": last,
            "pipeline_layout": layout}


__all__ = [
    "DISPATCHERS", "DISPATCH_CODE", "FLEX_BACKENDS", "FLEX_CODE", "FP8_CODE", "FP8_OF_CODE",
    "FP8_RECIPES", "GROUPED_GEMMS", "GROUPED_GEMM_CODE", "METHODS", "METHOD_CODE",
    "MODULE_BITS", "RECOMPUTES", "RECOMPUTE_CODE", "SCHEDULES", "SCHEDULE_CODE", "coding",
    "mask_modules", "module_mask", "SPLIT_CODE", "VALUELESS_SPLIT_KEYS", "SplitKey",
    "split_config", "split_key", "split_table",
]
