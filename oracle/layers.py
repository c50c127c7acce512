"""What a decoder layer is: its kind and the blocks it runs, declared once.

A decoder layer is one *kind* (:class:`LayerKind`) made of *blocks* (:class:`Block`), each with
its own pre-norm. A transformer layer is attention + MLP (``dense``) or attention + MoE
(``moe``); in a Megatron-Core hybrid model (``ModelSpec.hybrid_pattern``, Megatron-LM
``--hybrid-override-pattern``) each layer is ONE block: Mamba-2 mixer ``M``, attention ``*``,
dense MLP ``-``, MoE ``E`` (``megatron/core/ssm/mamba_hybrid_layer_allocation.py``).

The lowest module of ``oracle``: parameters (``oracle/params.py``), the workload inventory
(``oracle/inventory.py``: saved tensors, GEMMs), FLOPs, memory and time compose layers from it.
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache

from tune_cp.config.specs import ModelSpec


class Block(StrEnum):
    """A block of a decoder layer: one operation group with its own pre-norm."""

    ATTENTION = "attention"
    MLP = "mlp"
    MOE = "moe"
    MAMBA = "mamba"


class LayerKind(StrEnum):
    """What one decoder layer is (the unit of pipeline splitting and per-stage counts).

    ``dense`` and ``moe``: attention + MLP / attention + MoE in a transformer; the MLP-only
    (``-``) and MoE-only (``E``) layers in a hybrid model. ``attention`` (``*``) and ``mamba``
    (``M``) occur only in hybrid models."""

    DENSE = "dense"
    MOE = "moe"
    ATTENTION = "attention"
    MAMBA = "mamba"


#: the order of per-kind count tuples (``StageCounts.recompute_groups``, ...)
KINDS: tuple[LayerKind, ...] = (LayerKind.DENSE, LayerKind.MOE, LayerKind.ATTENTION,
                                LayerKind.MAMBA)
#: Megatron-Core ``Symbols``: pattern character -> layer kind
SYMBOL_KIND: dict[str, LayerKind] = {"-": LayerKind.DENSE, "E": LayerKind.MOE,
                                     "*": LayerKind.ATTENTION, "M": LayerKind.MAMBA}


def kind_blocks(model: ModelSpec, kind: LayerKind) -> tuple[Block, ...]:
    """The blocks one layer of ``kind`` runs, in order."""
    if model.is_hybrid:
        return {LayerKind.DENSE: (Block.MLP,), LayerKind.MOE: (Block.MOE,),
                LayerKind.ATTENTION: (Block.ATTENTION,), LayerKind.MAMBA: (Block.MAMBA,)}[kind]
    return {LayerKind.DENSE: (Block.ATTENTION, Block.MLP),
            LayerKind.MOE: (Block.ATTENTION, Block.MOE)}.get(kind, ())


@lru_cache(maxsize=256)
def layer_kinds(model: ModelSpec) -> tuple[LayerKind, ...]:
    """The kind of every decoder layer (0-based): the hybrid pattern, else MoE from
    ``num_dense_layers`` on for an MoE model, dense otherwise."""
    if model.is_hybrid:
        return tuple(SYMBOL_KIND[ch] for ch in model.hybrid_pattern)
    return tuple(LayerKind.MOE if model.is_moe and i >= model.num_dense_layers else
                 LayerKind.DENSE for i in range(model.num_layers))


def kind_index(model: ModelSpec) -> tuple[int, ...]:
    """:func:`layer_kinds` as indices into :data:`KINDS` (hashable, for cached geometry)."""
    return tuple(KINDS.index(k) for k in layer_kinds(model))


def mtp_kind(model: ModelSpec) -> LayerKind:
    """An MTP module's transformer layer copies the last layer's kind (DeepSeek-V3). In a hybrid
    model an MTP depth runs attention and then that MoE or MLP block (Nemotron 3's MTP pattern
    ``*E``, Megatron-Bridge ``mtp_hybrid_override_pattern``): the kind is the MoE/MLP layer and
    the attention block is counted with the MTP extras (:func:`mtp_extra_blocks`)."""
    return LayerKind.MOE if model.is_moe else LayerKind.DENSE


def mtp_extra_blocks(model: ModelSpec) -> tuple[Block, ...]:
    """Blocks an MTP depth runs beside its :func:`mtp_kind` layer: the attention of a hybrid
    model's ``*E`` MTP pattern; none for a transformer (its MoE/dense layer has attention)."""
    return (Block.ATTENTION,) if model.is_hybrid else ()


def block_counts(model: ModelSpec, kinds: dict[LayerKind, int]) -> dict[Block, int]:
    """Blocks of each kind in a set of layers given per kind (``{kind: layers}``)."""
    out = dict.fromkeys(Block, 0)
    for kind, n in kinds.items():
        for b in kind_blocks(model, kind):
            out[b] += n
    return out
