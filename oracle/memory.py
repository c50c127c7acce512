"""Per-GPU memory of one training configuration, per pipeline stage, in exact integer bytes.

The accounting has three layers, each a set of small pure functions, so that the CP-SAT model in
``solver/`` can encode exactly the same arithmetic (see docs/architecture.md, "Memory"):

1. **Pipeline geometry** -> :class:`StageCounts` per stage: which decoder layers, embedding,
   output layer and MTP layers a stage holds, and how many of their activations are alive at the
   stage's peak (in-flight micro-batches under the schedule, minus what recomputation drops).
   Depends only on (pp, vpp, pipeline split, number of micro-batches, schedule, recompute).
2. **Units** -> :class:`ParamUnits` (parameters per rank of one attention block, one dense MLP,
   the routed experts of one layer, ...; depend on tp, ep, etp) and :class:`ActivationUnits`
   (bytes one micro-batch stores for one layer of each kind, for the embedding, for the logits;
   depend on mbs, tp, cp, etp, selective-recompute modules, FP8 and the model's shapes).
3. **Combination** -> :func:`combine`: each named term is a sum of ``count x unit`` products, a
   ceiling division for optimizer sharding, and fixed overheads. Only ``+``, ``*``, ceiling
   division and floor division by a constant appear, so CP-SAT can mirror it exactly.

Terms (bytes per GPU on one stage; one function or one line of :func:`combine` each):

=====================  ==========================================================================
weights                bf16 parameters (2 B/param); FSDP: fp32 master shard (4 B/param / shard)
gradients              main-gradient buffer, fp32 (4 B/param) by default, bf16 (2 B/param) with
                       ``grad_reduce_in_fp32=False``; full (the distributed optimizer
                       reduce-scatters in place); FSDP: sharded
optimizer              Adam fp32 master copy + two moments (12 B/param; the precision-aware
                       optimizer's dtypes, :class:`OptimizerState`, e.g. 10 with fp32 master
                       remainders, 6 with bf16 moments), sharded over dp x cp
                       (dense) and expert-dp (experts) by the distributed optimizer, with its
                       bucket padding to lcm(group, 128) elements; FSDP: the moments sharded
fp8_weight_cache       Transformer Engine's FP8 copies of linear weights (FP8 runs only); under
                       FSDP with FP8 parameters the sharded FP8 weights (:func:`fsdp_fp8_fractions`)
fsdp_buffers           unsharded params (bf16, or FP8 parameters in their recipe's bytes) + grads
                       (fp32 or bf16 as above) of the layers being gathered (FSDP only)
activations            stored activations of all in-flight micro-batches (decoder layers,
                       checkpointed layer inputs, embedding inputs, MTP layers) and the cached
                       RoPE frequency table (:func:`rope_table_bytes`)
routing_imbalance      extra expert activations when routing is not balanced (overhead)
logits_loss            fp32 logits/softmax kept for the loss backward plus the bf16 logits alive
                       while the loss is computed (output stage)
recompute_working_set  full activations of the layer group being recomputed during backward
backward_working_set   gradients of one layer's activations while that layer runs backward
cp_buffers             context-parallel ring exchange of K/V (double buffered)
pipeline_buffers       send/receive buffers of pipeline point-to-point (one micro-batch each way)
sp_gather_buffer       Megatron's persistent all-gather buffer of sequence parallelism (t x h bf16)
cuda_graph_buffers     static input/output and gradient buffers of per-layer CUDA graphs, per
                       captured part, layer and in-flight micro-batch (:func:`cuda_graph_static_bytes`;
                       run setting ``--cuda-graph-scope``)
a2a_overlap_buffers    the second micro-batch's MoE dispatch / combine buffers alive beside the
                       first's under the all-to-all overlap schedule (:func:`a2a_overlap_bytes`;
                       run setting ``--moe-a2a-overlap``)
runtime_context        CUDA/HIP context, kernel images, BLAS workspaces (overhead)
collective_buffers     NCCL/RCCL buffers per communicator in use (overhead)
dispatcher_buffers     pre-registered MoE dispatcher buffers (DeepEP ``flex``; overhead) and Primus-Turbo
                       sync-free worst-case buffers (``sync_free_buffer_bytes``)
fragmentation          caching-allocator fragmentation over the transient (activation) terms
=====================  ==========================================================================

Sources: Megatron-LM ``megatron/training/theoretical_memory_usage.py`` (18 B/param, 6 + 12/dp
with the distributed optimizer), the gradient dtype (:func:`grad_bytes`), Megatron-Core ``distrib_optimizer.py`` / ``param_layout.py``
(bucket padding), ``schedules.py`` (in-flight micro-batches), Korthikanti et al. 2022 Table 2
(per-tensor activation sizes), the overhead defaults in :class:`MemoryOverheads`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from math import gcd
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tune_cp.config.specs import (
    EMBEDDING_LOSS_SLOTS,
    GIB,
    LIGHT_TRIM,
    MAX_MOE_CAPACITY_FACTOR,
    ClusterSpec,
    Dispatcher,
    Fp8Recipe,
    ModelSpec,
    ParallelConfig,
    PipelineSplit,
    PositionEmbedding,
    Precision,
    Recompute,
    RecomputeMethod,
    Spec,
    TrainingSpec,
    parse_pipeline_layout,
)
from tune_cp.oracle import params as P
from tune_cp.oracle.inventory import (  # the per-layer tensor lists live in the workload inventory
    BF16_BYTES,
    BOOL_BYTES,
    FP32_BYTES,
    INT64_BYTES,
    MXFP8_BLOCK,
    NVFP4_BLOCK,
    ActShape,
    act_shape,
    attention_backward_bytes,
    attention_tensors,
    dense_mlp_tensors,
    kept_bytes,
    mamba_backward_bytes,
    mamba_tensors,
    moe_tensors,
    norm_stats_bytes,
)
from tune_cp.oracle.layers import (
    KINDS,
    Block,
    LayerKind,
    kind_blocks,
    kind_index,
    layer_kinds,
    mtp_extra_blocks,
    mtp_kind,
)

MIB = 2**20
PPM = 1_000_000  # fractions are applied as integer parts-per-million, floor-divided

#: Adam with fp32 master weights: 4 (master) + 4 (exp_avg) + 4 (exp_avg_sq).
ADAM_STATE_BYTES = 12
#: Distributed-optimizer bucket ends are padded to a multiple of lcm(dp_group, 128) elements
#: (Megatron-Core ``optimizer/param_layout.py::bucket_end_divisor``).
DISTOPT_PAD_ELEMENTS = 128

TERMS: tuple[str, ...] = (
    "weights",
    "gradients",
    "optimizer",
    "fp8_weight_cache",
    "fsdp_buffers",
    "activations",
    "routing_imbalance",
    "logits_loss",
    "recompute_working_set",
    "backward_working_set",
    "cp_buffers",
    "pipeline_buffers",
    "sp_gather_buffer",
    "cuda_graph_buffers",
    "a2a_overlap_buffers",
    "runtime_context",
    "collective_buffers",
    "dispatcher_buffers",
    "fragmentation",
)
#: Terms grouped for reporting: what the model holds, what training passes hold, what the
#: runtime holds. ``model_state`` is what Megatron calls "weight and optimizer memory".
TERM_GROUPS: dict[str, tuple[str, ...]] = {
    "model_state": ("weights", "gradients", "optimizer", "fp8_weight_cache", "fsdp_buffers"),
    "activations": (
        "activations",
        "routing_imbalance",
        "logits_loss",
        "recompute_working_set",
        "backward_working_set",
        "cp_buffers",
        "pipeline_buffers",
        "sp_gather_buffer",
        "cuda_graph_buffers",
        "a2a_overlap_buffers",
    ),
    "runtime": ("runtime_context", "collective_buffers", "dispatcher_buffers", "fragmentation"),
}
#: Terms the caching allocator churns through every step; fragmentation applies to these.
TRANSIENT_TERMS: tuple[str, ...] = (
    "activations",
    "routing_imbalance",
    "logits_loss",
    "recompute_working_set",
    "backward_working_set",
    "cp_buffers",
    "pipeline_buffers",
    "a2a_overlap_buffers",
)

#: The CUDA-graph scopes that capture per-layer parts (Megatron-Core ``--cuda-graph-modules``,
#: formerly ``--cuda-graph-scope``, of ``--cuda-graph-impl transformer_engine|local``); the
#: other value tune-cp models is ``full_iteration`` (``--cuda-graph-impl full_iteration``).
PER_LAYER_GRAPH_SCOPES: tuple[str, ...] = ("attn", "mlp", "moe_router", "moe_preprocess")
FULL_ITERATION = "full_iteration"
#: Hidden-state-sized static buffers one captured graph keeps per in-flight micro-batch: its
#: forward input and its forward output (:func:`cuda_graph_static_bytes`).
GRAPH_STATIC_BUFFERS = 2


class RunOptions(Spec):
    """The framework run settings tune-cp models beyond the layout (CUDA-graph scope, MoE
    all-to-all overlap, token-drop vs dropless): ``solver/settings.py::RunSettings`` holds them
    for a run, ``oracle.work.RunTraits`` carries them into the time model, and they ride on
    :class:`MemoryOverheads` (``run``; never set by ``--overhead``) because that is the one
    per-run object every memory computation receives, the CP-SAT model's tables included.

    ``cuda_graph_scope``: the captured parts (:data:`PER_LAYER_GRAPH_SCOPES`; Megatron-LM
    ``--cuda-graph-impl transformer_engine --cuda-graph-modules ...``), or
    ``("full_iteration",)`` (``--cuda-graph-impl full_iteration``); ``()``: no CUDA graphs.
    ``moe_a2a_overlap``: Megatron-Core's combined 1F1B schedule
    (``--overlap-moe-expert-parallel-comm --delay-wgrad-compute``). ``moe_capacity_factor``:
    token-drop MoE with every expert's input padded to this capacity factor
    (``--moe-expert-capacity-factor C --moe-pad-expert-input-to-capacity``); None: dropless.
    What Megatron-Core refuses among them alone is refused here (one line); what depends on the
    model or the layout: ``solver/rules.py`` (``options_problem``, family ``run_settings``).
    """

    cuda_graph_scope: tuple[str, ...] = ()
    moe_a2a_overlap: bool = False
    moe_capacity_factor: float | None = Field(default=None, gt=0.0, le=MAX_MOE_CAPACITY_FACTOR)

    @field_validator("cuda_graph_scope", mode="before")
    @classmethod
    def _scope(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = tuple(x for x in v.replace(",", " ").split() if x)
        if isinstance(v, list | tuple):
            v = tuple(dict.fromkeys(str(x) for x in v))  # ordered, without repeats
            if v == ("none",):
                return ()
            known = (*PER_LAYER_GRAPH_SCOPES, FULL_ITERATION)
            bad = [x for x in v if x not in known]
            if bad:
                raise ValueError(f"CUDA-graph scope {', '.join(bad)} is not modelled; choose "
                                 f"parts of {','.join(PER_LAYER_GRAPH_SCOPES)}, or "
                                 f"{FULL_ITERATION}, or none")
            if FULL_ITERATION in v and len(v) > 1:
                raise ValueError("full_iteration captures the whole step, so it takes no other "
                                 "scope (Megatron-LM arguments.py: '--cuda-graph-modules must be "
                                 "empty when --cuda-graph-impl=full_iteration'); give "
                                 "full_iteration alone or per-layer parts")
            if "moe_preprocess" in v and "moe_router" not in v:
                raise ValueError("the moe_preprocess graph needs the moe_router graph "
                                 "(Megatron-Core transformer_config.py: 'moe_preprocess cuda "
                                 "graph is only supported with moe_router cuda graph'); add "
                                 "moe_router")
        return v

    @property
    def per_layer_graphs(self) -> bool:
        """Per-layer CUDA graphs are captured (a scope other than ``full_iteration``)."""
        return bool(self.cuda_graph_scope) and FULL_ITERATION not in self.cuda_graph_scope

    def label(self) -> str:
        """The settings as a reader would write them (``""`` when all are the defaults)."""
        parts = []
        if self.cuda_graph_scope:
            parts.append(f"CUDA graphs {','.join(self.cuda_graph_scope)}")
        if self.moe_a2a_overlap:
            parts.append("MoE all-to-all overlap")
        if self.moe_capacity_factor is not None:
            parts.append(f"MoE token-drop at capacity factor {self.moe_capacity_factor:g}")
        return "; ".join(parts)


class MemoryOverheads(Spec):
    """The terms analytical formulas forget, each with a documented, overridable default.

    * ``runtime_context_bytes`` (default 1 GiB) — CUDA/HIP context, kernel images and library
      workspaces of one PyTorch process. Measured contexts: 287,047,680 B with lazy loading vs
      666,632,192 B eager (pytorch/pytorch PR #86509), 612 MiB on B200 (unslothai/unsloth PR
      #8669); plus cuBLAS workspaces of 32 MiB per handle and stream on Hopper (PyTorch PR
      #120925), Transformer Engine GEMM workspaces of 32 MiB each (four for MoE grouped GEMMs), and
      kernels loaded lazily during training. ROCm: hipBLAS 128 MiB + hipBLASLt 76 MiB workspaces.
    * ``collective_bytes_per_group`` (default 512 MiB) — NCCL/RCCL buffers per communicator the
      rank uses (tp, cp, pp, dp x cp, and for MoE ep x etp and expert-dp, when larger than 1).
      NCCL allocates ~10 MiB per connection (Simple 4 MiB + LL128 4.7 MiB + LL 0.5 MiB) per
      channel; measured 544 MB per 2-rank and 688 MB per larger group on 4 x A100
      (NVIDIA/nccl#964).
    * ``dispatcher_buffer_bytes`` (default 1 GiB) — DeepEP buffers of the ``flex`` dispatcher:
      320-360 MiB NVLink + up to 350 MiB RDMA for hidden 7168 (DeepEP ``config.hpp`` sizing used
      by Megatron-Core ``fused_a2a.py``), plus NVSHMEM's 512 MiB-granular heap beyond 8 ranks.
    * ``fragmentation`` (default 0.05) — fraction of the transient (activation-like) bytes lost
      to caching-allocator fragmentation. Reserved-minus-allocated gaps reported: 2.4 % (70B,
      vllm-project/compressed-tensors PR #587), 13 % (NVIDIA/Megatron-LM PR #5662 log);
      ``expandable_segments``, which Megatron-Bridge recommends, cuts it further.
    * ``moe_routing_imbalance`` (default 0) — extra fraction of expert activations on the busiest
      rank over perfectly balanced routing. 0 matches the force-balanced, dropless benchmarks
      (Megatron-Bridge, Primus); max/mean expert load of 1.5-1.7 with auxiliary-loss balancing and
      1.04 aux-loss-free is reported (arXiv 2408.15664 Table 2) — set 0.5 for real routing.
    * ``backward_working_set`` — count the gradients of one layer's activations, alive while that
      layer runs backward (same shapes as its stored activations).
    """

    runtime_context_bytes: int = Field(default=1 * GIB, ge=0, le=1 << 40)
    collective_bytes_per_group: int = Field(default=512 * MIB, ge=0, le=1 << 40)
    dispatcher_buffer_bytes: int = Field(default=1 * GIB, ge=0, le=1 << 40)
    fragmentation: float = Field(default=0.05, ge=0.0, le=1.0)
    moe_routing_imbalance: float = Field(default=0.0, ge=0.0, le=64.0)
    backward_working_set: bool = True
    #: the run settings memory depends on (not an overhead term: ``--overhead`` does not set it)
    run: RunOptions = Field(default_factory=RunOptions)


#: The overhead terms ``--overhead NAME=VALUE`` (and a sweep grid's ``overheads``) set.
OVERHEAD_NAMES: tuple[str, ...] = tuple(f for f in MemoryOverheads.model_fields if f != "run")


def ppm(fraction: float) -> int:
    """A fraction as integer parts per million (the only float-to-int step in the accounting)."""
    return round(fraction * PPM)


def scale_ppm(x: int, parts: int) -> int:
    """``x * parts // PPM``, with the fraction reduced first (``x * 1 // 20`` for 5 %): the same
    integer, smaller intermediates (the solver's products stay far from 64-bit limits)."""
    g = gcd(parts, PPM)
    return x * (parts // g) // (PPM // g)


# ================================================================ 1. pipeline geometry


@dataclass(frozen=True)
class Chunk:
    """One virtual pipeline stage (model chunk): consecutive decoder layers and extras."""

    virtual_stage: int
    layers: tuple[int, ...]
    has_embedding: bool
    has_output: bool
    mtp_layers: int


def uneven_stage_layers(
    num_layers: int, pp: int, vpp: int, split: PipelineSplit,
    first: int | None = None, last: int | None = None,
) -> tuple[int | None, int | None] | None:
    """Decoder layers of the first and last pipeline stage under an uneven split, as Megatron-LM
    ``--decoder-first/last-pipeline-num-layers`` say them (None: that end is a middle stage).

    ``uneven``: ``(first, last)`` as given. The light splits: the first / last stage hold ``a``
    / ``b`` layers per virtual stage fewer than a middle stage of ``c`` layers per virtual stage
    (:data:`config.specs.LIGHT_TRIM`: 1 lighter, -1 heavier, 0 a middle stage):
    ``L = vpp (pp c - a - b)``, so ``c = (L / vpp + a + b) / pp`` and that end holds
    ``(c - a) vpp``. Llama 3.1 405B (126 layers) at pp 16: ``light_ends`` gives 7 + 14 x 8 + 7.
    ``last_to_first``: one layer (not one per virtual stage) moves from the last stage to the
    first, ``L / pp + 1`` and ``L / pp - 1``, so with vpp > 1 it is not divisible by vpp and
    not legal; Llama 3 8B (32 layers) at pp 4: 9 + 8 + 8 + 7. None when the counts are not
    whole (the split does not exist for this geometry)."""
    if split is PipelineSplit.UNEVEN:
        return first, last
    if split is PipelineSplit.LAST_TO_FIRST:  # one layer, so vpp 1 only (Megatron: % vpp)
        per_rank, rem = divmod(num_layers, pp)
        return None if rem or per_rank % vpp else (per_rank + 1, per_rank - 1)
    a, b = LIGHT_TRIM[split]
    if num_layers % vpp:
        return None
    c, rem = divmod(num_layers // vpp + a + b, pp)
    if rem:
        return None
    return ((c - a) * vpp if a else None, (c - b) * vpp if b else None)


def uneven_chunk_sizes(num_layers: int, pp: int, vpp: int, first: int | None,
                       last: int | None) -> list[int]:
    """Decoder layers per virtual stage ``v = j pp + r`` of an uneven split, as Megatron-Core
    builds them (``transformer_block.py::get_num_layers_to_build``,
    ``transformer_layer.py::get_transformer_layer_offset``): the first / last rank holds
    ``first`` / ``last`` layers split evenly over its ``vpp`` chunks, every middle rank
    ``(L - first - last) / middle ranks``, also split over its chunks; layers are numbered in
    virtual-stage order. Floor divisions where the counts do not divide (illegal, see
    ``solver/rules.py::split_problem``)."""
    middle_ranks = pp - (first is not None) - (last is not None)
    middle = num_layers - (first or 0) - (last or 0)
    per_middle = max(0, middle) // middle_ranks if middle_ranks > 0 else 0

    def rank_layers(r: int) -> int:
        if r == 0 and first is not None:
            return first
        if r == pp - 1 and last is not None:
            return last
        return per_middle

    return [rank_layers(r) // vpp for _ in range(vpp) for r in range(pp)]


def pipeline_chunks(
    num_layers: int, num_mtp: int, pp: int, vpp: int, split: PipelineSplit,
    first: int | None = None, last: int | None = None, layout: str | None = None,
) -> list[list[Chunk]]:
    """:func:`_pipeline_chunks`, remembered: the split depends on none of the cluster, batch or
    recomputation, so every enumeration of a search or a plan shares it (fresh lists each call;
    the chunks are frozen)."""
    return [list(stage) for stage in _pipeline_chunks(num_layers, num_mtp, pp, vpp, split, first,
                                                      last, layout)]


@lru_cache(maxsize=8192)
def _pipeline_chunks(
    num_layers: int, num_mtp: int, pp: int, vpp: int, split: PipelineSplit,
    first: int | None = None, last: int | None = None, layout: str | None = None,
) -> list[list[Chunk]]:
    """Chunks of every physical stage: ``result[stage][j]`` is virtual stage ``j * pp + stage``
    (Megatron's interleaved placement: rank r holds chunks r, r + pp, r + 2pp, ...), built from
    :func:`chunk_spans`."""
    chunks = [Chunk(v, tuple(range(lo, hi)), emb, out, mtp)
              for v, (lo, hi, emb, out, mtp) in enumerate(
                  chunk_spans(num_layers, num_mtp, pp, vpp, split, first, last, layout))]
    return [[chunks[j * pp + s] for j in range(vpp)] for s in range(pp)]


#: One virtual stage of :func:`chunk_spans`: decoder layers ``[lo, hi)``, whether it holds the
#: embedding, the output layer and loss, and its MTP layers.
Span = tuple[int, int, bool, bool, int]


def chunk_spans(
    num_layers: int, num_mtp: int, pp: int, vpp: int, split: PipelineSplit,
    first: int | None = None, last: int | None = None, layout: str | None = None,
) -> list[Span]:
    """Every virtual stage ``v`` in order, as a :data:`Span` (its decoder layers are consecutive):
    the one place the split is computed (:func:`pipeline_chunks` builds the chunks from it,
    :func:`max_chunk_layers` reads the largest without building them).

    ``even``: virtual stage v holds layers [v L/V, (v+1) L/V) with V = pp * vpp; the embedding
    rides on v = 0, the output layer, loss and MTP layers on v = V - 1.
    ``embedding_loss``: slots = embedding, L layers, loss; virtual stage v holds slots
    [v S/V, (v+1) S/V) with S = L + 2 (Megatron-Core ``get_num_layers_to_build``: MTP layers
    are no slot), the MTP layers on v = V - 1 besides its share
    (``multi_token_prediction.py::get_mtp_num_layers_to_build``).
    ``embedding_mtp_loss``: slots = embedding, L layers, MTP layers, loss; virtual stage v
    holds slots [v S/V, (v+1) S/V) with S = L + 2 + mtp.
    ``uneven`` and the light splits: :func:`uneven_chunk_sizes` of :func:`uneven_stage_layers`
    (``first`` / ``last``: ``ParallelConfig.first_stage_layers`` / ``last_stage_layers``);
    embedding on v = 0, output, loss and MTP on v = V - 1 as under ``even``.
    ``layout``: virtual stage v is stage v of :func:`config.specs.parse_pipeline_layout`
    (``layout``: ``ParallelConfig.pipeline_layout``), its ``t`` the next decoder layers, ``E``
    the embedding, ``L`` the output layer and loss, ``m`` MTP layers.
    Where the counts do not divide (illegal, see ``solver/rules.py``), the floor boundaries
    still give a total order (the last virtual stage takes what is left), so nothing crashes.
    """
    n_virtual = pp * vpp
    if split is PipelineSplit.EMBEDDING_MTP_LOSS:
        slots = num_layers + EMBEDDING_LOSS_SLOTS + num_mtp
        out: list[Span] = []
        for v in range(n_virtual):
            lo, hi = v * slots // n_virtual, (v + 1) * slots // n_virtual
            # slot i (1 <= i <= L) is decoder layer i - 1; slots L + 1 .. L + mtp are MTP layers
            first_l, stop_l = max(lo, 1), min(hi, num_layers + 1)
            mtp = max(0, min(hi, num_layers + num_mtp + 1) - max(lo, num_layers + 1))
            out.append((first_l - 1, max(first_l, stop_l) - 1, lo == 0, hi == slots, mtp))
        return out
    if split is PipelineSplit.EMBEDDING_LOSS:
        slots = num_layers + EMBEDDING_LOSS_SLOTS
        out: list[Span] = []
        for v in range(n_virtual):
            lo, hi = v * slots // n_virtual, (v + 1) * slots // n_virtual
            # slot i (1 <= i <= L) is decoder layer i - 1, slot L + 1 the loss
            first_l, stop_l = max(lo, 1), min(hi, num_layers + 1)
            last_v = v == n_virtual - 1
            out.append((first_l - 1, max(first_l, stop_l) - 1, lo == 0, last_v,
                        num_mtp if last_v else 0))
        return out
    if split is PipelineSplit.LAYOUT and layout is not None:
        stages = list(parse_pipeline_layout(layout)[:n_virtual])
        stages += [""] * (n_virtual - len(stages))
        out = []
        lo = 0
        for st in stages:
            hi = min(num_layers, lo + st.count("t"))
            out.append((lo, hi, "E" in st, "L" in st, st.count("m")))
            lo = hi
        return out
    ends = (uneven_stage_layers(num_layers, pp, vpp, split, first, last)
            if split not in (PipelineSplit.EVEN, PipelineSplit.LAYOUT) and pp > 1 else None)
    if ends is None or ends == (None, None):
        bounds = [v * num_layers // n_virtual for v in range(n_virtual + 1)]
    else:
        sizes = uneven_chunk_sizes(num_layers, pp, vpp, *ends)
        bounds = [0]
        for size in sizes[:-1]:
            bounds.append(min(num_layers, bounds[-1] + size))
        bounds.append(num_layers)
    last_v = n_virtual - 1
    return [(bounds[v], bounds[v + 1], v == 0, v == last_v, num_mtp if v == last_v else 0)
            for v in range(n_virtual)]


def split_layout(num_layers: int, num_mtp: int, pp: int, vpp: int, split: PipelineSplit,
                 first: int | None = None, last: int | None = None,
                 layout: str | None = None) -> str:
    """The split as Megatron-Core's ``--pipeline-model-parallel-layout`` string (one ``|``-
    separated entry per virtual stage in virtual-stage order, ``E`` embedding, ``t`` decoder
    layer, ``m`` MTP layer, ``L`` loss; ``pipeline_parallel_layer_layout.py::parse_str_to_list``)
    from :func:`chunk_spans`: how ``embedding_mtp_loss`` is written, and what
    ``formats/megatron_validate.py`` compares Megatron-Core's own split with.
    DeepSeek-V3 (61 layers, 1 MTP) at pp 16 under ``embedding_mtp_loss``:
    ``Ettt|tttt|...|tttt|ttmL``."""
    return "|".join(("E" if emb else "") + "t" * (hi - lo) + "m" * mtp + ("L" if out else "")
                    for lo, hi, emb, out, mtp in chunk_spans(num_layers, num_mtp, pp, vpp, split,
                                                             first, last, layout))


@lru_cache(maxsize=4096)
def max_chunk_layers(num_layers: int, num_mtp: int, pp: int, vpp: int, split: PipelineSplit,
                     first: int | None = None, last: int | None = None,
                     layout: str | None = None) -> int:
    """Decoder layers of the largest virtual stage, from :func:`chunk_spans` itself (the one
    place the split is computed; ``solver/rules.py::layers_per_chunk`` and
    ``solver/space.py::max_layers_per_chunk`` call this), without building the chunks. Under
    ``embedding_loss`` the embedding and loss slots hold no decoder layer, so this can be below
    ``ceil(slots / (pp vpp))``: Llama 3.1 405B (126 layers) at pp 2 splits 128 slots as 64 + 64
    with 63 decoder layers in the largest chunk, not 64."""
    return max((hi - lo for lo, hi, *_ in chunk_spans(num_layers, num_mtp, pp, vpp, split,
                                                      first, last, layout)), default=0)


def inflight_per_chunk(pp: int, vpp: int, num_microbatches: int, stage: int) -> tuple[int, ...]:
    """Micro-batches whose forward activations a stage holds at its peak, per local chunk.

    1F1B (vpp = 1): ``min(pp - stage, m)`` (warm-up ``pp - stage - 1`` forwards plus the one in
    steady state; Megatron-Core ``schedules.py::get_pp_rank_microbatches``). Interleaved:
    ``N = min(2 (pp - stage - 1) + (vpp - 1) pp + 1, m vpp)`` chunk forwards, issued in groups
    of ``pp`` micro-batches per chunk (forward k runs chunk ``(k // pp) % vpp``). For stage 0
    this gives Megatron's ``1 + (pp - 1) / (pp vpp)`` interleaving penalty exactly.
    Zero-bubble (ZB-H1) keeps the 1F1B activation count.
    """
    m = num_microbatches
    if vpp == 1:
        return (max(0, min(pp - stage, m)),)
    n = max(0, min(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, m * vpp))
    full_rounds, rest = divmod(n, pp * vpp)
    counts = []
    for j in range(vpp):
        counts.append(full_rounds * pp + min(pp, max(0, rest - j * pp)))
    return tuple(counts)


def inflight_saturation(pp: int, vpp: int) -> int:
    """The micro-batch count from which :func:`inflight_per_chunk` stops changing on every stage:
    ``pp`` for 1F1B (``min(pp - stage, m)``), and for interleaved schedules the smallest ``m``
    with ``m vpp`` at least stage 0's warm-up ``2 (pp - 1) + (vpp - 1) pp + 1``. Stage counts at
    ``min(m, inflight_saturation(pp, vpp))`` micro-batches equal those at ``m``; the solver
    tabulates pipeline geometry over this capped count."""
    if vpp == 1:
        return pp
    return -(-(2 * (pp - 1) + (vpp - 1) * pp + 1) // vpp)


def recompute_groups(
    n_layers: int, recompute: Recompute, method: RecomputeMethod, k: int | None
) -> list[tuple[int, int]]:
    """Full recomputation of one chunk of ``n_layers`` layers as ``(start, stop)`` groups, each
    checkpointed at its input (Megatron-Core ``TransformerBlock._checkpointed_forward``).

    ``block``: the first ``k`` layers, one group each; ``uniform``: all layers in groups of ``k``.
    ``k = None`` checkpoints every layer individually; ``k = 0`` (block) checkpoints nothing.
    """
    if recompute is not Recompute.FULL or n_layers == 0:
        return []
    if k is None:
        return [(i, i + 1) for i in range(n_layers)]
    if method is RecomputeMethod.BLOCK:
        return [(i, i + 1) for i in range(min(k, n_layers))]
    if k == 0:
        return []
    return [(i, min(i + k, n_layers)) for i in range(0, n_layers, k)]


@dataclass(frozen=True)
class StageCounts:
    """Integer coefficients of one pipeline stage (see module docstring, layer 1).

    Layers are counted per :class:`oracle.layers.LayerKind` (what each kind is made of is
    the inventory's ``kind_blocks``): ``dense``/``moe`` and, in hybrid models only,
    ``attention``/``mamba``. ``recompute_groups`` lists the distinct layer compositions (layers
    per kind, in :data:`oracle.layers.KINDS` order) of the groups recomputed on the stage;
    the recompute working set is the largest of them. The hybrid kinds' fields come last with a
    default of 0, so a transformer's counts read as before.
    """

    stage: int
    dense_layers: int
    moe_layers: int
    mtp_layers: int
    has_embedding: int
    has_output: int
    inflight_dense: int
    inflight_moe: int
    inflight_ckpt: int
    inflight_embedding: int
    inflight_output: int
    inflight_mtp: int
    inflight_microbatches: int
    has_dense: int
    has_moe: int
    has_layers: int
    recompute_groups: tuple[tuple[int, ...], ...]
    attention_layers: int = 0
    mamba_layers: int = 0
    inflight_attention: int = 0
    inflight_mamba: int = 0
    has_attention: int = 0
    has_mamba: int = 0
    #: model chunks on the stage that build the MTP's own copy of the word embeddings: a chunk
    #: with MTP layers that is not the embedding chunk (:func:`mtp_embedding_params`)
    mtp_embeddings: int = 0
    #: layers of each kind (KINDS order) fully recomputed on the stage per micro-batch (the time
    #: model's recompute term; not tabulated by the solver)
    recomputed: tuple[int, ...] = ()

    def as_vector(self) -> tuple[int, ...]:
        """The coefficients the solver tabulates (everything but the stage index and the
        groups), in :data:`VECTOR_FIELDS` order."""
        return tuple(getattr(self, f) for f in VECTOR_FIELDS)


#: :meth:`StageCounts.as_vector`'s fields, in order (the solver rebuilds counts from them)
VECTOR_FIELDS: tuple[str, ...] = (
    "dense_layers", "moe_layers", "mtp_layers", "has_embedding", "has_output",
    "inflight_dense", "inflight_moe", "inflight_ckpt", "inflight_embedding", "inflight_output",
    "inflight_mtp", "inflight_microbatches", "has_dense", "has_moe", "has_layers",
    "attention_layers", "mamba_layers", "inflight_attention", "inflight_mamba",
    "has_attention", "has_mamba", "mtp_embeddings",
)
#: per-kind fields of :class:`StageCounts`: (layers, in-flight layer activations, present)
KIND_FIELDS: dict[LayerKind, tuple[str, str, str]] = {
    LayerKind.DENSE: ("dense_layers", "inflight_dense", "has_dense"),
    LayerKind.MOE: ("moe_layers", "inflight_moe", "has_moe"),
    LayerKind.ATTENTION: ("attention_layers", "inflight_attention", "has_attention"),
    LayerKind.MAMBA: ("mamba_layers", "inflight_mamba", "has_mamba"),
}


@lru_cache(maxsize=65536)
def stage_counts_by_kind(
    kinds: tuple[int, ...],
    mtp_kind: int,
    num_mtp: int,
    pp: int,
    vpp: int,
    split: PipelineSplit,
    num_microbatches: int,
    recompute: Recompute,
    method: RecomputeMethod,
    k: int | None,
    first: int | None = None,
    last: int | None = None,
    layout: str | None = None,
) -> tuple[StageCounts, ...]:
    """``kinds``: each decoder layer's kind as an index into :data:`KINDS`
    (:func:`oracle.layers.kind_index`); ``mtp_kind``: the kind an MTP layer copies;
    ``first`` / ``last`` / ``layout``: the uneven and layout splits' fields
    (:func:`pipeline_chunks`)."""
    nk = len(KINDS)
    result = []
    for s, chunks in enumerate(pipeline_chunks(len(kinds), num_mtp, pp, vpp, split,
                                               first, last, layout)):
        inflight = inflight_per_chunk(pp, vpp, num_microbatches, s)
        live = [0] * nk
        ckpt = emb = out = mtp_in = 0
        groups: set[tuple[int, ...]] = set()
        redo = [0] * nk
        per_kind = [0] * nk
        for chunk, n_in in zip(chunks, inflight, strict=True):
            n_plan, layers_of, kept_of, redo_of, comps = _chunk_kinds(
                kinds, chunk.layers, recompute, method, k)
            for j in range(nk):
                per_kind[j] += layers_of[j]
                live[j] += n_in * kept_of[j]
                redo[j] += redo_of[j]
            groups.update(comps)
            ckpt += n_in * n_plan
            emb += n_in if chunk.has_embedding else 0
            out += n_in if chunk.has_output else 0
            mtp_in += n_in * chunk.mtp_layers
        mtp = sum(ch.mtp_layers for ch in chunks)
        present = [int(per_kind[j] > 0 or (mtp > 0 and j == mtp_kind)) for j in range(nk)]
        fields: dict[str, int] = {}
        for j, kind in enumerate(KINDS):
            n_f, in_f, has_f = KIND_FIELDS[kind]
            fields[n_f], fields[in_f], fields[has_f] = per_kind[j], live[j], present[j]
        result.append(
            StageCounts(
                stage=s,
                mtp_layers=mtp,
                has_embedding=int(any(ch.has_embedding for ch in chunks)),
                has_output=int(any(ch.has_output for ch in chunks)),
                inflight_ckpt=ckpt,
                inflight_embedding=emb,
                inflight_output=out,
                inflight_mtp=mtp_in,
                inflight_microbatches=max(inflight) if inflight else 0,
                has_layers=int(sum(per_kind) + mtp > 0),
                mtp_embeddings=sum(1 for ch in chunks if ch.mtp_layers and not ch.has_embedding),
                recompute_groups=_pareto_groups(groups),
                recomputed=tuple(redo),
                **fields,
            )
        )
    return tuple(result)


@lru_cache(maxsize=65536)
def _chunk_kinds(kinds: tuple[int, ...], layers: tuple[int, ...], recompute: Recompute,
                 method: RecomputeMethod, k: int | None
                 ) -> tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...],
                            tuple[tuple[int, ...], ...]]:
    """One chunk's layers per kind under its recompute plan (:func:`recompute_groups`): the
    plan's group count, the chunk's layers per kind, those not recomputed (their activations
    kept per in-flight micro-batch), those recomputed, and each group's composition. The same
    chunks recur across stages and geometries (a table entry for :func:`stage_counts_by_kind`)."""
    nk = len(KINDS)
    plan = recompute_groups(len(layers), recompute, method, k)
    recomputed = {i for lo, hi in plan for i in range(lo, hi)}
    per_kind, kept, redo = [0] * nk, [0] * nk, [0] * nk
    for idx, layer in enumerate(layers):
        j = kinds[layer]
        per_kind[j] += 1
        if idx in recomputed:
            redo[j] += 1
        else:
            kept[j] += 1
    comps = []
    for lo, hi in plan:
        comp = [0] * nk
        for i in range(lo, hi):
            comp[kinds[layers[i]]] += 1
        comps.append(tuple(comp))
    return len(plan), tuple(per_kind), tuple(kept), tuple(redo), tuple(comps)


def _pareto_groups(groups: set[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """Drop compositions dominated in every coordinate (they can never be the largest)."""
    keep = [g for g in groups
            if not any(o != g and all(x >= y for x, y in zip(o, g, strict=True)) for o in groups)]
    return tuple(sorted(keep))


def stage_counts(model: ModelSpec, cfg: ParallelConfig) -> tuple[StageCounts, ...]:
    """Layer 1 for a resolved configuration: one :class:`StageCounts` per pipeline stage."""
    assert cfg.ga is not None and cfg.pipeline_split is not None, "resolve_config() first"
    return stage_counts_by_kind(
        kind_index(model),
        KINDS.index(mtp_kind(model)),
        model.num_mtp_layers,
        cfg.pp,
        cfg.vpp,
        cfg.pipeline_split,
        cfg.ga,
        cfg.recompute,
        cfg.recompute_method,
        cfg.recompute_layers,
        *split_fields(cfg),
    )


def split_label(model: ModelSpec, cfg: ParallelConfig) -> str:
    """How a resolved configuration's layers split, for the reports: ``""`` for the even and
    embedding_loss splits (the layout label says enough), else the split with the end stages'
    decoder layers (``light_ends split: first stage 7, last stage 7 layers``) or the layout."""
    split = cfg.pipeline_split
    if split in (None, PipelineSplit.EVEN, PipelineSplit.EMBEDDING_LOSS):
        return ""
    if split is PipelineSplit.LAYOUT:
        return f"layout {cfg.pipeline_layout}"
    if split is PipelineSplit.EMBEDDING_MTP_LOSS:
        return f"{split.value} split (embedding, MTP and loss one layer slot each; a layout)"
    ends = uneven_stage_layers(model.num_layers, cfg.pp, cfg.vpp, split,
                               cfg.first_stage_layers, cfg.last_stage_layers)
    if ends is None:
        return f"{split.value} split"
    said = [f"{name} stage {n}" for name, n in zip(("first", "last"), ends, strict=True)
            if n is not None]
    return f"{split.value} split: {', '.join(said)} layers"


def split_fields(cfg: ParallelConfig) -> tuple[int | None, int | None, str | None]:
    """The split's own values beyond :class:`~config.specs.PipelineSplit`: first and last
    stage layers (``uneven``) and the layout (``layout``), as :func:`pipeline_chunks` takes
    them."""
    return cfg.first_stage_layers, cfg.last_stage_layers, cfg.pipeline_layout


# ====================================================================== 2a. parameter units


@dataclass(frozen=True)
class ParamUnits:
    """Parameters per rank of one building block (layer 2; see ``oracle/params.py``)."""

    attention: int
    dense_mlp: int
    moe_nonexpert: int
    experts: int
    embedding: int
    output: int
    mtp_extra: int
    largest_layer: int  # for FSDP's gathered-layer buffers
    mtp_embedding: int  # the MTP chunk's copy of the word embeddings (pp > 1; StageCounts.mtp_embeddings)
    #: the attention block inside a ``dense``/``moe`` layer: ``attention`` for a transformer,
    #: 0 in a hybrid model (its attention is a layer of its own, counted by
    #: ``StageCounts.attention_layers``)
    layer_attention: int = 0
    mamba: int = 0  # one Mamba-2 mixer layer


def param_units(model: ModelSpec, tp: int, pp: int, ep: int, etp: int) -> ParamUnits:
    """Layer 2 for parameters: each block's count per rank (``oracle/params.py``), composed into
    layer kinds as the inventory says (``oracle/layers.py::kind_blocks``)."""
    attn = P.attention_params(model, tp)
    dense = P.dense_mlp_params(model, tp) if model.num_dense_layers_effective else 0
    moe_ne = P.moe_nonexpert_params(model, tp) if model.is_moe else 0
    experts = P.expert_params_per_rank(model, ep, etp) if model.is_moe else 0
    mamba = P.mamba_params(model, tp) if model.mamba is not None else 0
    in_layer = 0 if model.is_hybrid else attn
    per_block = {Block.ATTENTION: attn, Block.MLP: dense, Block.MOE: moe_ne + experts,
                 Block.MAMBA: mamba}
    largest = max(sum(per_block[b] for b in kind_blocks(model, k)) for k in set(layer_kinds(model)))
    return ParamUnits(
        attention=attn,
        dense_mlp=dense,
        moe_nonexpert=moe_ne,
        experts=experts,
        embedding=P.embedding_params(model, tp),
        output=P.output_params(model, tp, pp),
        # a hybrid model's MTP depth also runs an attention block (layers.mtp_extra_blocks)
        mtp_extra=(P.mtp_extra_params(model, tp) + (attn if model.is_hybrid else 0)
                   if model.num_mtp_layers else 0),
        largest_layer=largest,
        layer_attention=in_layer,
        mamba=mamba,
        mtp_embedding=mtp_embedding_params(model, tp, pp),
    )


def mtp_embedding_params(model: ModelSpec, tp: int, pp: int) -> int:
    """Multi-token prediction embeds the shifted tokens in the model chunk that holds the MTP
    layers, so with ``pp > 1`` that chunk has its own copy of the word embeddings
    (Megatron-Core ``GPTModel`` builds ``LanguageModelEmbedding`` where ``pre_process or
    mtp_process``; its gradient is all-reduced with the first stage's). The MTP chunk is the
    last virtual stage, or under a layout the one with the ``m`` (``mtp_on_this_rank``;
    DeepSeek-V3's ``Et*3|(tt|)*29,m|L`` puts it on rank 14, not on the loss stage):
    ``StageCounts.mtp_embeddings`` counts the copies per stage. Measured: DeepSeek-V3 pp 16,
    926,679,040 parameters on the last stage (``embedding_loss``) and on stage 14 of the
    layout above (``benchmarks/memory_truth.py``). Memory only: :func:`stage_params`, which the
    time model shares, leaves it out."""
    if not model.num_mtp_layers or pp == 1:
        return 0
    return P.embedding_params(model, tp)


# ================================================================== 2b. activation units
# (the tensors each block saves: ``oracle/inventory.py``)


def _backward_common(model: ModelSpec, x: ActShape) -> int:
    """Gradient alive through a whole layer's backward: the incoming gradient of the layer
    output (``t_sp x h``). (The ``t x h`` input a sequence-parallel GEMM gathers again for its
    weight gradient lands in the persistent buffer of :func:`sp_gather_buffer_bytes`.)"""
    return BF16_BYTES * x.t_sp * model.hidden_size


def dense_backward_bytes(model: ModelSpec, x: ActShape) -> int:
    """Backward working set of a dense layer at its peak: the gradient of the fc1 output
    (``t x 2f`` gated, the widest activation gradient) beside :func:`_backward_common`. With
    fused kernels (SwiGLU backward, weight-gradient accumulation into ``main_grad``) nothing
    else of that size is alive. Measured on Megatron-Core 0.16.1 (``benchmarks/memory_truth.py``:
    Llama 3 8B at 4k tokens, 270.5 MB measured vs 268.4 MB here at tp 1, 169.9 vs 167.8 at tp 2
    with SP); one layer's stored activations, tune-cp's earlier bound, is 2.3x this."""
    f = P.cdiv(model.ffn_hidden_size, x.tp)
    up = (2 if model.gated_mlp else 1) * f
    return BF16_BYTES * x.t * up + _backward_common(model, x)


def moe_backward_bytes(model: ModelSpec, x: ActShape, capacity_ppm: int = 0) -> int:
    """Backward working set of an MoE layer: the gradient of the experts' fc1 output (``rows x
    2 f_e / etp`` with ``rows = t_sp k etp`` dispatched tokens), the gradient of the permuted
    tokens on their way back (``t_sp x h`` per top-k copy is folded into one more ``t_sp x h``
    as measured) and :func:`_backward_common`. Measured on Megatron-Core 0.16.1 (Mixtral 8x7B,
    4k tokens, ep 8: 539 MB measured vs 537 MB here), about half one layer's stored activations.
    Under token-drop the experts' rows are the capacity (``capacity_ppm``,
    :func:`capacity_scale_ppm`), and so is their fc1 gradient: measured at capacity factor 1.5
    on a Mixtral 8x7B middle stage (``mx7-pp4-ep8-middle-drop1.5``), 740.3 MB above the stored
    activations vs 505.4 MB dropless, the fc1 gradient 1.5 x 469.8 MB."""
    fe = P.cdiv(model.expert_ffn_hidden_size, x.etp)
    up = (2 if model.gated_mlp else 1) * fe
    rows = x.t_sp * model.moe_top_k * x.etp * (PPM + capacity_ppm) // PPM
    return BF16_BYTES * rows * up + BF16_BYTES * x.t_sp * model.hidden_size + _backward_common(model, x)


def embedding_backward_bytes(model: ModelSpec, x: ActShape, vocab_loc: int) -> int:
    """Working set of the vocab-parallel embedding's backward on the first stage: its dense
    bf16 weight gradient (``V / tp x h``, added to ``main_grad`` by the DDP hook afterwards),
    the gradient of its output, and under sequence parallelism that gradient all-gathered to
    ``t x h``. Measured on Megatron-Core 0.16.1 (Llama 3 70B, tp 8, 4k tokens: the first stage's
    peak is here). By then the micro-batch's decoder layers have run backward, so
    :func:`activation_units` nets out (at least) the first layer's stored activations."""
    h = model.hidden_size
    gathered = BF16_BYTES * x.t * h if x.t_sp != x.t else 0
    return BF16_BYTES * vocab_loc * h + BF16_BYTES * x.t_sp * h + gathered


def sp_gather_buffer_bytes(model: ModelSpec, x: ActShape) -> int:
    """Megatron-Core's persistent all-gather buffer for sequence parallelism: every
    column-parallel GEMM (QKV, fc1, the output layer) gathers its ``t_sp x h`` input into one
    ``t x h`` bf16 buffer from ``get_global_memory_buffer()`` (``tensor_parallel/layers.py``),
    allocated at the first gather and kept for the run. Measured: the last stage's peak at the
    loss is this buffer above the stored activations and logits (35.8 MB at 4k tokens, Llama 3
    8B, tp 2 and tp 4)."""
    return BF16_BYTES * x.t * model.hidden_size if x.t_sp != x.t else 0


def graphs_per_layer(model: ModelSpec, kind: LayerKind, scope: tuple[str, ...]) -> int:
    """CUDA graphs one layer of ``kind`` is captured in under the per-layer ``scope``: one for its
    attention block when ``attn`` is captured, one for a dense MLP block under ``mlp``, one for a
    MoE block's router under ``moe_router`` (``moe_preprocess`` is captured in the router's graph:
    Megatron-Core requires it with ``moe_router``, ``transformer_config.py::__post_init__``); a
    Mamba mixer is never captured (tune-cp has no ``mamba`` scope). ``full_iteration`` or no
    scope: 0."""
    if FULL_ITERATION in scope:
        return 0
    blocks = kind_blocks(model, kind)
    return (int(Block.ATTENTION in blocks and "attn" in scope)
            + int(Block.MLP in blocks and "mlp" in scope)
            + int(Block.MOE in blocks and "moe_router" in scope))


def cuda_graph_static_bytes(model: ModelSpec, x: ActShape, kind: LayerKind,
                            scope: tuple[str, ...]) -> int:
    """Bytes per layer of ``kind`` and per in-flight micro-batch that per-layer CUDA graphs keep
    beside the eager activations: :data:`GRAPH_STATIC_BUFFERS` hidden-state tensors ``t_sp x h``
    bf16 (the graph's static input and static output) per captured graph
    (:func:`graphs_per_layer`).

    Sources: Transformer Engine ``make_graphed_callables`` gives every captured graph its own
    input and output buffers, and with a pipeline ``_order`` one graph per (callable,
    micro-batch) is captured (NVIDIA/TransformerEngine PR #1234, "each cudagraph has its own
    input and output data buffer", which adds reuse among graphs that do not overlap); Megatron-
    Core ``transformer/cuda_graphs.py`` ``TECudaGraphHelper`` builds ``sample_args`` for every
    (layer, micro-batch) pair and reuses a static input only once that micro-batch's backward
    ran (``consumed_sample_queue``), so the buffers alive are those of the micro-batches in
    flight. The backward graph's ``static_grad_inputs`` / ``static_grad_outputs`` are held by weak
    references (their pool memory is reused), and the tensors the captured parts save for
    backward are the eager activations (already in ``activations``): the graphs are captured in
    schedule order into a shared pool (``create_cudagraphs``), so freed blocks are reused and no
    second copy is counted. The static input aliases the tensor the block's first norm saves,
    so this term is an upper bound by one of the two tensors. Worked example: Llama 3 8B
    (h 4096), mbs 1, seq 8192, tp 1, attn + mlp captured: 2 graphs x 2 x 2 B x 8192 x 4096
    = 256 MiB per layer and in-flight micro-batch."""
    return graphs_per_layer(model, kind, scope) * GRAPH_STATIC_BUFFERS * BF16_BYTES * x.t_sp \
        * model.hidden_size


def capacity_scale_ppm(capacity_factor: float) -> int:
    """The expert-side skew (parts per million over balanced routing,
    :func:`oracle.inventory.moe_tensors`' ``imbalance_ppm``) of token-drop MoE padded to
    ``capacity_factor``: every expert processes exactly ``capacity = C x (tokens x top-k) /
    experts`` rows (Megatron-Core ``moe/moe_utils.py::get_capacity``; with
    ``moe_pad_expert_input_to_capacity`` the router pads each expert's input to it,
    ``router.py``), so the expert tensors scale by ``C`` whatever the routing, and the
    dropless routing-imbalance allowance (``moe_routing_imbalance``) does not apply: ``ppm(C) -
    1e6``. The per-expert ceiling of ``get_capacity`` (below one row per expert) is ignored.
    Worked example: C 1.25 -> 250,000; C 1.0 -> 0 (balanced)."""
    return ppm(capacity_factor) - PPM


def a2a_overlap_bytes(model: ModelSpec, x: ActShape, capacity_factor: float | None) -> int:
    """Bytes of the second micro-batch's MoE dispatch and combine buffers under the all-to-all
    overlap schedule: ``2 x rows x h`` bf16 with ``rows = t_sp x top-k x etp`` (scaled by the
    capacity factor under token-drop), the tokens one MoE layer's all-to-all delivers to the rank
    and the expert output its combine sends back.

    Source: Megatron-Core ``pipeline_parallel/combined_1f1b.py``: with
    ``--overlap-moe-expert-parallel-comm`` each step runs one micro-batch's forward beside
    another's backward, layer by layer, so the forward micro-batch's dispatched tokens and the
    backward micro-batch's combine gradients are in flight at once (one layer of each). Worked
    example: Mixtral 8x22B (h 6144, top-2), mbs 1, seq 8192, tp 1, etp 1: 2 x 2 B x 16384 x 6144
    = 384 MiB."""
    scale = PPM if capacity_factor is None else PPM + capacity_scale_ppm(capacity_factor)
    rows = x.t_sp * model.moe_top_k * x.etp * scale // PPM
    return 2 * BF16_BYTES * rows * model.hidden_size


def sync_free_buffer_bytes(model: ModelSpec, t_sp: int, cfg: ParallelConfig) -> int:
    """Worst-case buffers of Primus-Turbo's sync-free MoE (the flex dispatcher at stage >= 2):
    the dispatch output and the combine input sized for every token of the tp x ep group,
    ``num_worst_tokens = t_sp x tp x ep`` rows of ``h`` bf16 each (Primus ``primus_turbo.py``
    l.2333-2342, ``deepep_num_worst_tokens``); stage 3 adds the permutation's worst-case output,
    ``permute_max_token_num = num_worst_tokens x top-k`` rows (counted once: a lower bound, the
    permuted tokens of every layer in flight are not). 0 otherwise. Worked example: Mixtral
    8x22B (h 6144), t_sp 8192, tp 2, ep 8, stage 2: 2 x 131072 x 6144 x 2 B = 3 GiB."""
    if not model.is_moe or cfg.dispatcher is not Dispatcher.FLEX or cfg.sync_free_stage < 2:
        return 0
    worst = t_sp * cfg.tp * cfg.ep
    rows = 2 * worst + (worst * model.moe_top_k if cfg.sync_free_stage >= 3 else 0)
    return BF16_BYTES * rows * model.hidden_size


@dataclass(frozen=True)
class ActivationUnits:
    """Bytes per micro-batch per rank (layer 2): one layer of each kind with all its activations
    (after selective recompute), a checkpointed layer input, the embedding's inputs, the output
    stage's stored logits and transient logits, an MTP module's extras, the CP ring buffers and
    the pipeline p2p buffers. ``moe_imbalance`` is the routing-imbalance extra per MoE layer."""

    dense_layer: int
    moe_layer: int
    dense_backward: int
    moe_backward: int
    embedding_backward: int
    sp_buffer: int
    moe_imbalance: int
    ckpt_input: int
    embedding: int
    output: int
    logits_transient: int
    mtp_extra: int
    cp_buffers: int
    pipeline_buffers: int
    rope_table: int
    # hybrid models only (0 otherwise): an attention-only and a Mamba layer, their backward
    attention_layer: int = 0
    mamba_layer: int = 0
    attention_backward: int = 0
    mamba_backward: int = 0
    #: the MTP heads the loss chunk computes per micro-batch (all MTP layers: output-layer
    #: input and fp32 logits each); ``mtp_extra`` is the rest of an MTP layer, in its own chunk
    mtp_heads: int = 0
    # run settings (0 without them): CUDA-graph static buffers per layer of each kind and
    # in-flight micro-batch, the all-to-all overlap's second dispatch buffers
    graph_dense: int = 0
    graph_moe: int = 0
    graph_attention: int = 0
    a2a_overlap: int = 0
    #: Primus-Turbo sync-free worst-case dispatcher buffers (:func:`sync_free_buffer_bytes`)
    sync_free_buffers: int = 0


def rope_table_bytes(model: ModelSpec, training: TrainingSpec, cp: int) -> int:
    """Megatron-Core's rotary frequency table: ``RotaryEmbedding.forward`` is an
    ``lru_cache``, so the fp32 ``seq/cp x rot_dim`` table it returns (the context-parallel
    slice when cp > 1) stays allocated for the run, one per model chunk; full recomputation's
    checkpoints keep a reference to it (measured on Megatron-Core 0.16.1: 2,097,152 B at 4k
    tokens and head dim 128, ``benchmarks/memory_truth.py``). Counted once per stage (a rank
    with ``vpp`` chunks holds ``vpp`` of them; the difference is a few MiB)."""
    if model.position_embedding is not PositionEmbedding.ROPE:
        return 0
    rot = model.mla.qk_rope_head_dim if model.mla is not None else model.head_dim
    return FP32_BYTES * P.cdiv(training.seq_len, cp) * rot


def activation_pp(pp: int) -> int:
    """The pipeline size :func:`activation_units` depends on: only whether there is a pipeline
    (pp > 1: the send/receive buffers, ``pipeline_buffers``), so every pp > 1 gives the units
    of pp 2 (the solver computes them once for all of them; a test holds the two equal)."""
    return min(pp, 2)


def activation_units(
    model: ModelSpec,
    training: TrainingSpec,
    cfg: ParallelConfig,
    overheads: MemoryOverheads | None = None,
) -> ActivationUnits:
    ov = overheads or MemoryOverheads()
    x = act_shape(model, training, cfg)
    mods = frozenset(cfg.recompute_modules) if cfg.recompute is Recompute.SELECTIVE else frozenset()
    h = model.hidden_size
    # one layer of each kind: the kept tensors of its blocks (``oracle/inventory.py``)
    present = set(layer_kinds(model)) | ({mtp_kind(model)} if model.num_mtp_layers else set())
    run = ov.run
    # token-drop: the experts' tensors are sized by the capacity factor (capacity_scale_ppm)
    drop_ppm = (0 if run.moe_capacity_factor is None
                else capacity_scale_ppm(run.moe_capacity_factor))
    block = {
        Block.ATTENTION: kept_bytes(attention_tensors(model, training, x), mods),
        Block.MLP: kept_bytes(dense_mlp_tensors(model, x), mods) if model.ffn_hidden_size else 0,
        Block.MOE: kept_bytes(moe_tensors(model, x, drop_ppm), mods) if model.is_moe else 0,
        Block.MAMBA: kept_bytes(mamba_tensors(model, x), mods) if model.mamba is not None else 0,
    }

    def layer(kind: LayerKind) -> int:
        if kind not in present and not (kind is LayerKind.DENSE and model.ffn_hidden_size
                                         and not model.is_hybrid):
            return 0
        return sum(block[b] for b in kind_blocks(model, kind))

    dense, moe = layer(LayerKind.DENSE), layer(LayerKind.MOE)
    moe_extra = 0
    if model.is_moe and run.moe_capacity_factor is None:  # capacity bounds every expert
        skew = kept_bytes(moe_tensors(model, x, ppm(ov.moe_routing_imbalance)), mods)
        moe_extra = skew - block[Block.MOE]
    vocab_loc = P.cdiv(P.padded_vocab_size(model.vocab_size, cfg.tp), cfg.tp)
    # the cross entropy keeps the int64 local target and a bool out-of-shard mask
    # (Megatron-Core ``tensor_parallel/cross_entropy.py``)
    labels = (INT64_BYTES + BOOL_BYTES) * x.t
    # token ids; with tp > 1 the vocab-parallel embedding also keeps its bool out-of-shard mask
    embedding = (INT64_BYTES * x.t + (BOOL_BYTES * x.t if cfg.tp > 1 else 0)
                 + (x.t_sp * h if model.hidden_dropout else 0))
    final_norm = BF16_BYTES * x.t_sp * h + norm_stats_bytes(model, x.t_sp)
    output_input = BF16_BYTES * x.t_sp * h
    logits_fp32 = FP32_BYTES * x.t * vocab_loc
    output = final_norm + output_input + logits_fp32 + labels
    mtp = mtp_heads = 0
    if model.num_mtp_layers:
        # the MTP layer (its chunk): enorm and hnorm inputs, the [2h] eh_proj input, its own
        # final norm
        mtp = 4 * BF16_BYTES * x.t_sp * h + final_norm
        mtp += sum(block[b] for b in mtp_extra_blocks(model))
        # its head (the loss chunk: GPTModel._postprocess runs the shared output layer on
        # each MTP hidden state there, after the chunk's own): output-layer input, fp32 logits
        mtp_heads = model.num_mtp_layers * (output_input + logits_fp32)
    kv_w = (
        P.cdiv(model.num_attention_heads, cfg.tp)
        * (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim + model.mla.v_head_dim)
        if model.mla is not None
        else P.kv_heads_per_rank(model, cfg.tp) * model.head_dim
    )
    cp_buffers = 2 * 2 * BF16_BYTES * x.t * kv_w if cfg.cp > 1 else 0
    first_kind = layer(layer_kinds(model)[0])
    # independent of the recompute kind (the solver tabulates these units without it)
    emb_bwd = max(0, embedding_backward_bytes(model, x, vocab_loc) - first_kind)
    hybrid_kinds = set(layer_kinds(model)) if model.is_hybrid else set()
    return ActivationUnits(
        dense_layer=dense,
        embedding_backward=emb_bwd,
        moe_layer=moe,
        dense_backward=dense_backward_bytes(model, x) if model.ffn_hidden_size else 0,
        moe_backward=moe_backward_bytes(model, x, drop_ppm) if model.is_moe else 0,
        sp_buffer=sp_gather_buffer_bytes(model, x),
        moe_imbalance=moe_extra,
        ckpt_input=BF16_BYTES * x.t_sp * h,
        embedding=embedding,
        output=output,
        logits_transient=BF16_BYTES * x.t * vocab_loc,
        mtp_extra=mtp,
        mtp_heads=mtp_heads,
        cp_buffers=cp_buffers,
        pipeline_buffers=2 * BF16_BYTES * x.t_sp * h if cfg.pp > 1 else 0,
        rope_table=rope_table_bytes(model, training, cfg.cp),
        attention_layer=layer(LayerKind.ATTENTION),
        mamba_layer=layer(LayerKind.MAMBA),
        attention_backward=(attention_backward_bytes(model, x)
                            if LayerKind.ATTENTION in hybrid_kinds else 0),
        mamba_backward=mamba_backward_bytes(model, x) if model.mamba is not None else 0,
        graph_dense=cuda_graph_static_bytes(model, x, LayerKind.DENSE, run.cuda_graph_scope),
        graph_moe=(cuda_graph_static_bytes(model, x, LayerKind.MOE, run.cuda_graph_scope)
                   if model.is_moe else 0),
        graph_attention=(cuda_graph_static_bytes(model, x, LayerKind.ATTENTION,
                                                 run.cuda_graph_scope)
                         if LayerKind.ATTENTION in hybrid_kinds else 0),
        a2a_overlap=(a2a_overlap_bytes(model, x, run.moe_capacity_factor)
                     if model.is_moe and run.moe_a2a_overlap else 0),
        sync_free_buffers=sync_free_buffer_bytes(model, x.t_sp, cfg),
    )


# ================================================================= 3. sharding and overheads


@dataclass(frozen=True)
class Sharding:
    """Shard counts and flags the combination needs (derived from the resolved config)."""

    dense_group: int  # dp x cp: the distributed optimizer's group for dense params
    expert_group: int  # world / (pp x ep x etp): expert data parallel
    dense_pad: int  # distopt_pad(dense_group)
    expert_pad: int  # distopt_pad(expert_group)
    distributed_optimizer: bool
    fsdp: bool
    grad_reduce_in_fp32: bool
    # optimizer state per parameter (:class:`OptimizerState`): master weights, two moments
    master_bytes: int
    moment_bytes: int
    fp8_cache_num: int  # FP8 weight-cache bytes per linear param (numerator / denominator)
    fp8_cache_den: int
    linear_weight_bytes: int  # bf16 copy of a linear weight: 2, or 0 with FP8 parameters
    # FSDP only (:func:`fsdp_fp8_fractions`): bytes per linear param of the unsharded FP8 copy
    # Transformer Engine keeps for every layer, of the sharded FP8 weight buffer, and of one
    # gathered linear weight (numerator / denominator each)
    fsdp_cache_num: int
    fsdp_cache_den: int
    fsdp_shard_num: int
    fsdp_shard_den: int
    fsdp_gather_num: int
    fsdp_gather_den: int
    collective_groups: int
    dispatcher_buffers: bool


def fp8_weight_cache_bytes(
    recipe: Fp8Recipe | None, architecture: str, fp4: bool = False
) -> tuple[int, int]:
    """Bytes per linear weight parameter of Transformer Engine's FP8 weight copies, as a fraction.

    TE keeps the bf16 weight and a quantized copy (TE docs, "performance considerations": "2 MB
    (weight) + 1 MB (weight in FP8)"). Per-tensor recipes need a second, transposed copy for the
    backward GEMMs except on Blackwell, whose tensor cores take either layout; MXFP8 keeps a
    row-wise and a column-wise copy, each with one scale byte per 32 elements. NVFP4 (``fp4``)
    keeps a row-wise and a column-wise copy of 4-bit values with one FP8 scale per 16 elements
    (TE ``NVFP4Quantizer``): ``2 x 9/16`` B.
    """
    if fp4:
        return (2 * (NVFP4_BLOCK // 2 + 1), NVFP4_BLOCK)
    if recipe is None:
        return (0, 1)
    if recipe is Fp8Recipe.MXFP8:
        return (2 * (MXFP8_BLOCK + 1), MXFP8_BLOCK)
    return (1, 1) if architecture == "blackwell" else (2, 1)


def linear_weight_bytes(cfg: ParallelConfig) -> int:
    """Bytes per linear weight parameter of its bf16 copy: 2, or 0 with FP8 parameters
    (``--fp8-param-gather``; Megatron-Bridge ``fp8_param_gather=True``, the default of its
    tensorwise, delayed and MXFP8 mixed-precision recipes). Then Transformer Engine creates
    the linear weights as FP8 tensors (``fp8_model_init``): the quantized copies of
    :func:`fp8_weight_cache_bytes` are the weights, no bf16 copy exists, the fp32 master copy
    stays in the optimizer and the distributed optimizer all-gathers FP8."""
    return 0 if cfg.fp8_param_gather and cfg.fp8_recipe is not None else BF16_BYTES


def fsdp_fp8_fractions(
    cfg: ParallelConfig, cache: tuple[int, int], fp4: bool = False
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """Under FSDP (Megatron-FSDP, ``data_parallel_sharding_strategy=optim_grads_params``), the
    bytes per linear weight parameter of ``(unsharded FP8 copy, sharded FP8 weight, gathered
    weight)``, each a fraction; ``cache`` is :func:`fp8_weight_cache_bytes` of the recipe.

    * FP8 parameters (``fp8_param_gather``): the linear weights are TE ``Float8Tensor`` /
      ``MXFP8Tensor`` parameters, so Megatron-FSDP's model-weight buffer holds them sharded in
      ``uint8`` (Megatron-LM ``megatron/core/distributed/fsdp/src/megatron_fsdp/
      param_and_grad_buffer.py`` L2630-2684: ``param_dtype = torch.uint8`` for ``float8``
      groups, a second, transposed buffer only where ``fp8_need_transpose_data``, i.e.
      MXFP8's column-wise copy). Per-tensor recipes shard 1 B per parameter; MXFP8 shards both
      copies with their scales (``2 x 33/32``). A layer is all-gathered in FP8 before its
      forward and backward and released after (``megatron_fsdp.py`` L620-633: the transpose
      cache a Hopper backward creates on the gathered weight, L498, is discarded with it unless
      ``keep_fp8_transpose_cache``, which Megatron-Bridge's FSDP override sets False,
      ``scripts/performance/utils/overrides.py`` L101): the gathered weight costs the whole
      recipe fraction (``cache``). Transformer Engine keeps no copy of its own (a quantized
      parameter is its own GEMM operand): no unsharded copy.
    * bf16 parameters: the layer is gathered in bf16 (2 B) and Transformer Engine quantizes it
      into a per-module workspace it caches across micro-batches (TE ``module/linear.py``
      ``get_weight_workspace(..., cache_name="weight")`` whenever Megatron passes
      ``is_first_microbatch``, i.e. unless ``disable_parameter_transpose_cache``: Megatron-LM
      ``megatron/core/extensions/transformer_engine.py`` L1338-1345, reset per step in
      ``pipeline_parallel/schedules.py`` L496). The workspace is built from the gathered
      weight, so every layer's FP8 copy stays whole on every rank: ``cache`` per parameter,
      unsharded, as without FSDP.
    NVFP4 (``fp4``) has no parameter-gather path modelled: the bf16 case."""
    if cfg.fp8_param_gather and cfg.fp8_recipe is not None and not fp4:
        shard = cache if cfg.fp8_recipe is Fp8Recipe.MXFP8 else (1, 1)
        return (0, 1), shard, cache
    return cache, (0, 1), (BF16_BYTES, 1)


def communicator_count(model: ModelSpec, cfg: ParallelConfig, expert_dp: int) -> int:
    """Communicators of size > 1 a rank belongs to: tp, cp, pp, the dense data-parallel group
    (dp x cp), and for MoE the expert (ep x etp) and expert-data-parallel groups."""
    assert cfg.dp is not None
    groups = [cfg.tp, cfg.cp, cfg.pp, cfg.dp * cfg.cp]
    if model.is_moe:
        groups += [cfg.ep * cfg.etp_, expert_dp]
    return sum(1 for g in groups if g > 1)


def sharding(
    model: ModelSpec, cluster: ClusterSpec, cfg: ParallelConfig, fp4: bool = False
) -> Sharding:
    """``fp4``: the training precision is NVFP4 (its weight copies, :func:`fp8_weight_cache_bytes`)."""
    assert cfg.dp is not None
    num, den = fp8_weight_cache_bytes(cfg.fp8_recipe, cluster.gpu.architecture, fp4)
    expert_dp = max(1, cluster.world_size // (cfg.pp * cfg.ep * cfg.etp_))
    cache, shard, gather = fsdp_fp8_fractions(cfg, (num, den), fp4)
    return Sharding(
        dense_group=cfg.dp * cfg.cp,
        expert_group=expert_dp,
        dense_pad=distopt_pad(cfg.dp * cfg.cp),
        expert_pad=distopt_pad(expert_dp),
        distributed_optimizer=cfg.distributed_optimizer,
        fsdp=cfg.fsdp,
        grad_reduce_in_fp32=cfg.grad_reduce_in_fp32,
        master_bytes=cfg.optimizer_state.master_bytes(cfg.fp8_recipe),
        moment_bytes=cfg.optimizer_state.moment_bytes(),
        fp8_cache_num=num,
        fp8_cache_den=den,
        linear_weight_bytes=linear_weight_bytes(cfg),
        fsdp_cache_num=cache[0],
        fsdp_cache_den=cache[1],
        fsdp_shard_num=shard[0],
        fsdp_shard_den=shard[1],
        fsdp_gather_num=gather[0],
        fsdp_gather_den=gather[1],
        collective_groups=communicator_count(model, cfg, expert_dp),
        dispatcher_buffers=model.is_moe and cfg.dispatcher is Dispatcher.FLEX and cfg.ep > 1,
    )


def grad_bytes(grad_reduce_in_fp32: bool) -> int:
    """Bytes per element of the gradient buffer: 4 (fp32) or 2 (bf16).

    Megatron-LM ``megatron/training/arguments.py::validate_args``: with ``--bf16`` it sets
    ``accumulate_allreduce_grads_in_fp32`` unless ``--grad-reduce-in-bf16`` is given;
    ``training.py`` passes it as ``DistributedDataParallelConfig.grad_reduce_in_fp32``, and
    Megatron-Core ``param_and_grad_buffer.py::group_params_for_buffers`` makes the grad buffer
    ``torch.float`` if ``grad_reduce_in_fp32`` else the param dtype (bf16). Megatron-Bridge
    ``MixedPrecisionConfig`` (``bf16_mixed()``: True) copies ``grad_reduce_in_fp32`` into the DDP
    config. Under FSDP tune-cp applies the same setting to the sharded gradients and the
    gathered layers' gradients (Megatron-FSDP spells it ``megatron_fsdp_main_grads_dtype`` /
    ``megatron_fsdp_grad_comm_dtype``; tune-cp does not model them separately)."""
    return FP32_BYTES if grad_reduce_in_fp32 else BF16_BYTES


def distopt_pad(group: int) -> int:
    """The distributed optimizer pads each buffer to a multiple of lcm(group, 128) elements."""
    return group * DISTOPT_PAD_ELEMENTS // gcd(group, DISTOPT_PAD_ELEMENTS)


def shard_elements(numel: int, group: int, pad: int | None = None) -> int:
    """Elements of a buffer of ``numel`` one rank of ``group`` owns under the distributed
    optimizer: the buffer is padded to a multiple of ``pad`` = lcm(group, 128) and split evenly
    (Megatron-Core ``param_layout.py``; per-parameter 64-element alignment and per-bucket padding
    are below a MiB and ignored). ``pad`` may be passed precomputed (:class:`Sharding` holds it,
    so that :func:`combine` needs no gcd)."""
    if pad is None:
        pad = distopt_pad(group)
    return P.cdiv(numel, pad) * pad // group


def vmax(values: Iterable[int]) -> int:
    """``max(values, default=0)``. :func:`combine` takes maxima through this function so that a
    symbolic backend (the CP-SAT model in ``solver/``) can evaluate ``combine`` on its own
    expressions: an element whose type defines ``__vmax__`` builds the maximum itself."""
    items = list(values)
    for v in items:
        hook = getattr(type(v), "__vmax__", None)
        if hook is not None:
            return hook(items)
    return max(items, default=0)


# ======================================================================= 3. combination


def stage_params(c: Any, pu: Any, is_moe: bool) -> tuple[Any, Any]:
    """Parameters of one pipeline stage on one rank: ``(dense, expert)`` (dense: everything
    replicated over the dense data-parallel group, experts: over the expert data-parallel group).
    MTP layers copy the last layer's kind (MoE for MoE models) and add their own projection and
    norms (``mtp_extra``). Layers count per kind (``StageCounts``); a ``dense``/``moe`` layer's
    attention is ``pu.layer_attention`` (0 in a hybrid model, whose attention layers count
    apart). ``c`` needs ``dense_layers, moe_layers, attention_layers, mamba_layers, mtp_layers,
    has_embedding, has_output`` and ``pu`` the :class:`ParamUnits` fields; only ``+`` and ``*``, so ints, CP-SAT
    expressions and numpy arrays all work (the time model calls it on arrays:
    ``oracle.work.build_work``)."""
    moe_like = c.moe_layers + (c.mtp_layers if is_moe else 0)
    dense_like = c.dense_layers + (0 if is_moe else c.mtp_layers)
    dense_params = (
        (dense_like + moe_like) * pu.layer_attention
        + c.attention_layers * pu.attention
        + dense_like * pu.dense_mlp
        + moe_like * pu.moe_nonexpert
        + c.mamba_layers * pu.mamba
        + c.mtp_layers * pu.mtp_extra
        + c.has_embedding * pu.embedding
        + c.has_output * pu.output
    )
    return dense_params, moe_like * pu.experts


def combine(
    c: StageCounts,
    pu: ParamUnits,
    au: ActivationUnits,
    sh: Sharding,
    ov: MemoryOverheads,
) -> dict[str, int]:
    """Every named term of one stage from its counts, units and sharding (layer 3). The solver
    mirrors exactly these operations; keep them to ``+``, ``*``, :func:`vmax`, ceiling division
    by a tabulated group size, floor division, and ``if`` on values that are flags
    (``Sharding``'s booleans) or decidable once the model is known (``is_moe``). The solver
    evaluates this very function on CP-SAT expressions."""
    is_moe = pu.moe_nonexpert > 0  # an MoE layer always has a router
    dense_params, expert_params = stage_params(c, pu, is_moe)
    dense_params = dense_params + c.mtp_embeddings * pu.mtp_embedding
    all_params = dense_params + expert_params
    t: dict[str, int] = dict.fromkeys(TERMS, 0)
    gb = grad_bytes(sh.grad_reduce_in_fp32)
    linear_params = (all_params - c.has_embedding * pu.embedding
                     - c.has_output * pu.output - c.mtp_embeddings * pu.mtp_embedding)
    if sh.fsdp:
        sharded = shard_elements(dense_params, sh.dense_group, sh.dense_pad) + shard_elements(
            expert_params, sh.expert_group, sh.expert_pad
        )
        t["weights"] = sh.master_bytes * sharded
        t["gradients"] = gb * sharded
        t["optimizer"] = sh.moment_bytes * sharded
        # current and prefetched layer gathered (bf16, or FP8 parameters in their recipe's
        # bytes), their grads reduced in the grad dtype
        t["fsdp_buffers"] = (2 * pu.largest_layer * sh.fsdp_gather_num // sh.fsdp_gather_den
                             + 2 * gb * pu.largest_layer)
        # FP8 copies (:func:`fsdp_fp8_fractions`): the sharded FP8 parameters, or TE's
        # unsharded per-layer cache of bf16 parameters
        linear_shard = shard_elements(
            dense_params - c.has_embedding * pu.embedding - c.has_output * pu.output
            - c.mtp_embeddings * pu.mtp_embedding, sh.dense_group, sh.dense_pad
        ) + shard_elements(expert_params, sh.expert_group, sh.expert_pad)
        t["fp8_weight_cache"] = (linear_shard * sh.fsdp_shard_num // sh.fsdp_shard_den
                                 + linear_params * sh.fsdp_cache_num // sh.fsdp_cache_den)
    else:
        # embedding and output layer in bf16; linear weights in bf16 or, with FP8 parameters,
        # only as the FP8 copies of ``fp8_weight_cache``
        t["weights"] = BF16_BYTES * (all_params - linear_params) + sh.linear_weight_bytes * linear_params
        t["gradients"] = gb * all_params
        if sh.distributed_optimizer:
            sharded = shard_elements(dense_params, sh.dense_group, sh.dense_pad) + shard_elements(
                expert_params, sh.expert_group, sh.expert_pad
            )
            t["optimizer"] = (sh.master_bytes + sh.moment_bytes) * sharded
        else:
            t["optimizer"] = (sh.master_bytes + sh.moment_bytes) * all_params
        t["fp8_weight_cache"] = linear_params * sh.fp8_cache_num // sh.fp8_cache_den
    mtp_layer = au.moe_layer if is_moe else au.dense_layer
    t["activations"] = (
        c.inflight_dense * au.dense_layer
        + c.inflight_moe * au.moe_layer
        + c.inflight_attention * au.attention_layer
        + c.inflight_mamba * au.mamba_layer
        + c.inflight_ckpt * au.ckpt_input
        + c.inflight_embedding * au.embedding
        + c.inflight_mtp * (mtp_layer + au.mtp_extra)
        # the MTP heads run on the loss chunk (a standalone MTP chunk of a layout sends its
        # hidden states there; otherwise MTP and loss share the last chunk)
        + c.inflight_output * au.mtp_heads
        + c.has_layers * au.rope_table
    )
    t["routing_imbalance"] = (c.inflight_moe + (c.inflight_mtp if is_moe else 0)) * au.moe_imbalance
    logits = c.inflight_output * au.output + c.has_output * au.logits_transient
    per_kind = (au.dense_layer, au.moe_layer, au.attention_layer, au.mamba_layer)  # KINDS order
    recompute_ws = vmax([sum(n * u for n, u in zip(g, per_kind, strict=False))
                         for g in c.recompute_groups])
    backward_ws = (
        vmax([c.has_dense * au.dense_backward, c.has_moe * au.moe_backward,
              c.has_attention * au.attention_backward, c.has_mamba * au.mamba_backward,
              c.has_embedding * au.embedding_backward])
        if ov.backward_working_set
        else 0
    )
    # The peak is the largest set of terms alive at one moment (:func:`coexisting_working_sets`):
    # the loss's logits are freed before any layer runs backward, so the working sets count
    # only where they exceed the logits.
    t["logits_loss"], t["recompute_working_set"], t["backward_working_set"] = (
        coexisting_working_sets(logits, recompute_ws, backward_ws)
    )
    t["cp_buffers"] = c.has_layers * au.cp_buffers
    t["pipeline_buffers"] = au.pipeline_buffers
    t["sp_gather_buffer"] = au.sp_buffer
    t["cuda_graph_buffers"] = (c.inflight_dense * au.graph_dense + c.inflight_moe * au.graph_moe
                               + c.inflight_attention * au.graph_attention)
    t["a2a_overlap_buffers"] = c.has_moe * au.a2a_overlap
    t["runtime_context"] = ov.runtime_context_bytes
    t["collective_buffers"] = sh.collective_groups * ov.collective_bytes_per_group
    t["dispatcher_buffers"] = ((ov.dispatcher_buffer_bytes if sh.dispatcher_buffers else 0)
                               + c.has_moe * au.sync_free_buffers)
    transient = sum(t[k] for k in TRANSIENT_TERMS)
    t["fragmentation"] = scale_ppm(transient, ppm(ov.fragmentation))
    return t


def transient_peak(t: dict[str, int]) -> int:
    """The transient (activation-like) bytes alive at the stage's peak."""
    return sum(t[k] for k in TRANSIENT_TERMS)


def coexisting_working_sets(logits: int, recompute_ws: int, backward_ws: int) -> tuple[int, int, int]:
    """``(logits_loss, recompute_working_set, backward_working_set)`` as reported terms, so that
    their sum is what is alive at the stage's peak, ``max(logits, recompute_ws + backward_ws)``.

    Measured on Megatron-Core 0.16.1 (``benchmarks/memory_truth.py``): on the last stage the
    live-tensor peak of a micro-batch is at the loss, where the fp32 and bf16 logits are alive
    beside every stored activation; the output layer's backward frees them before any decoder
    layer runs backward or is recomputed, so the backward and recompute working sets never
    coexist with them. ``logits_loss`` is reported whole; the recompute working set counts what
    it adds above the logits, the backward working set what it adds above both."""
    over_rws = vmax([recompute_ws - logits, 0])
    over_both = vmax([recompute_ws + backward_ws - logits, 0])
    return logits, over_rws, over_both - over_rws


# ========================================================================== the report


class StageMemory(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    stage: int
    decoder_layers: int
    terms: dict[str, int]
    total_bytes: int


class MemoryReport(BaseModel):
    """Per-stage breakdown and the most loaded stage. Whether it fits is the solver's rule
    (``solver/rules.py::hbm``); ``hbm_bytes`` is the GPU's capacity for reference.
    ``dominant_term`` is the largest term of the most loaded stage, ``dominant_group`` the largest
    of :data:`TERM_GROUPS`."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    stages: list[StageMemory]
    peak_stage: int
    peak_bytes: int
    hbm_bytes: int
    dominant_term: str
    dominant_group: str

    @property
    def peak(self) -> StageMemory:
        return self.stages[self.peak_stage]


def memory_report(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    cfg: ParallelConfig,
    overheads: MemoryOverheads | None = None,
) -> MemoryReport:
    """Memory of every pipeline stage of a resolved configuration (``resolve_config``)."""
    ov = overheads or MemoryOverheads()
    pu = param_units(model, cfg.tp, cfg.pp, cfg.ep, cfg.etp_)
    au = activation_units(model, training, cfg, ov)
    sh = sharding(model, cluster, cfg, training.precision is Precision.FP4)
    stages = []
    for c in stage_counts(model, cfg):
        terms = combine(c, pu, au, sh, ov)
        stages.append(
            StageMemory(
                stage=c.stage,
                decoder_layers=c.dense_layers + c.moe_layers + c.attention_layers + c.mamba_layers,
                terms=terms,
                total_bytes=sum(terms.values()),
            )
        )
    peak = max(stages, key=lambda s: (s.total_bytes, -s.stage))
    dominant = max(TERMS, key=lambda k: peak.terms[k])
    group = max(TERM_GROUPS, key=lambda g: sum(peak.terms[k] for k in TERM_GROUPS[g]))
    return MemoryReport(
        stages=stages,
        peak_stage=peak.stage,
        peak_bytes=peak.total_bytes,
        hbm_bytes=cluster.gpu.hbm_bytes,
        dominant_term=dominant,
        dominant_group=group,
    )


# ------------------------------------------------------------------- what the arithmetic holds

#: Largest byte figure of one GPU tune-cp computes with (64 PiB). Memory is exact integer bytes
#: in Python, numpy's int64 arrays and CP-SAT, which works in signed 64-bit integers and refuses
#: (or, from Python, receives as floats) any linear expression whose terms may sum beyond 2**63:
#: a stage slot's total sums a few tens of terms, each at most this figure, so 2**56 leaves
#: 2**7 of headroom. Real runs are far below: Llama 3.1 405B on one GPU with no sharding at
#: all, sequence 131,072 and micro-batch 8, needs 85,310,216,922,726 bytes (2**46.3;
#: ``tests/test_input_classes.py``).
MAX_FIGURE_BYTES = 2**56


@lru_cache(maxsize=32)
def unsharded_peak_bytes(model: ModelSpec, training: TrainingSpec, mbs: int) -> int:
    """The peak bytes of the one-GPU configuration with no parallelism, sharding or
    recomputation at micro-batch ``mbs``: the upper bound, within the interleaving and routing
    factors, of every figure a search of ``model`` at this training setting tabulates (every
    parallel size divides a term; an in-flight micro-batch of a pipeline stage holds only the
    stage's layers)."""
    from tune_cp.config.resolve import resolve_config
    from tune_cp.config.specs import GpuSpec

    gpu = GpuSpec(name="unsharded bound", hbm_bytes=1 << 50, peak_bf16_flops=1e15,
                  hbm_bytes_per_s=1e12, scale_up_bytes_per_s=1e11, scale_up_domain_gpus=1,
                  nic_bytes_per_s=1e10, gpus_per_node=1)
    cluster = ClusterSpec(gpu=gpu, num_nodes=1, gpus_per_node=1)
    one = training.model_copy(update={"global_batch_size": mbs})
    cfg = resolve_config(ParallelConfig(mbs=mbs), model, cluster, one)
    return memory_report(model, cluster, one, cfg).peak_bytes


def arithmetic_problem(model: ModelSpec, training: TrainingSpec, mbs: int) -> str | None:
    """Why ``model`` at this sequence length cannot be computed exactly (its
    :func:`unsharded_peak_bytes` beyond :data:`MAX_FIGURE_BYTES`), naming the dimensions that
    make it so; None when it can. Checked before a search space or a check is built, so that
    no figure reaches numpy or CP-SAT beyond int64."""
    peak = unsharded_peak_bytes(model, training, mbs)
    if peak <= MAX_FIGURE_BYTES:
        return None
    dims = ", ".join(f"{k} {getattr(model, k):,}" for k in (
        "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size",
        "num_experts", "expert_ffn_hidden_size") if getattr(model, k))
    if model.mla is not None:
        dims += (f", MLA ranks q {model.mla.q_lora_rank:,} kv {model.mla.kv_lora_rank:,}, "
                 f"head dims {model.mla.qk_nope_head_dim:,}/{model.mla.qk_rope_head_dim:,}/"
                 f"{model.mla.v_head_dim:,}")
    return (f"model {model.name!r} ({dims}) is too large for the solver's 64-bit arithmetic: "
            f"at sequence length {training.seq_len:,} and micro-batch {mbs} it needs "
            f"{peak / GIB:.3g} GiB on one unsharded GPU, beyond the {MAX_FIGURE_BYTES // GIB:,} "
            f"GiB (2**56 bytes) that exact int64 and CP-SAT figures hold "
            f"(oracle/memory.py::MAX_FIGURE_BYTES); check the model's dimensions or shorten "
            f"--seq-len")
