"""Every legality rule of tune-cp, as a named family that checks one resolved configuration.

Each family is a function ``rule(ctx) -> list[Violation]`` registered in :data:`RULES`; the
messages name the offending values and the legal alternatives. The CP-SAT model
(``solver/model.py``) encodes the same families, family by family, and a test requires the two
to accept exactly the same configurations. Families can be switched off (``--allow`` on the
command line, assumptions in CP-SAT) to explain infeasibility.

Families, in the order they are checked:

=======================  =====================================================================
world_size               tp x pp x cp x dp = nodes x gpus_per_node
tensor_parallel          tp divides the attention heads, the KV heads (or is a multiple of
                         them: KV heads are then replicated), the dense and shared FFN widths,
                         and a Mamba-2 mixer's heads and groups
scale_up                 tp and etp stay within one scale-up domain (NVLink / xGMI)
expert_layout            ep divides the experts; pp x ep x etp divides the world (whole
                         expert-data-parallel size); ep = etp = 1 for dense models
expert_tensor_parallel   etp divides the expert FFN; MoE with biases needs etp = 1
sequence_parallel        MoE with tp > 1 needs sequence parallelism
sequence_length          seq divisible by 2 cp (context parallel) and seq / cp by tp (SP);
                         Mamba heads over tp x cp, Mamba groups over tp x cp or cp over them
pipeline_split           layers split evenly over pp x vpp virtual stages (with embedding and
                         loss as slots, uneven end stages, or a layout: ``split_problem``); a
                         hybrid Mamba model: even split, no virtual stages
virtual_pipeline         vpp > 1 needs pp > 1 and the interleaved schedule; the interleaved
                         schedule needs a micro-batch count that is a multiple of pp
schedule                 zero-bubble: no recomputation, pp > 1, vpp in {1, 2}, untied
                         embeddings (Primus ``config_validation.py``)
recompute                full: 1..layers-per-chunk layers (not in hybrid Mamba models);
                         selective modules that exist
precision                FP8 needs FP8 tensor cores; MXFP8 needs Blackwell or CDNA4
dispatcher               the DeepEP ``flex`` dispatcher needs an MoE model with ep > 1
moe_backend              the MoE backend (flex library per vendor, Primus-Turbo on AMD only,
                         sync-free stage >= 2 needs Turbo DeepEP and Turbo grouped GEMM, Turbo
                         DeepEP needs the fp32 router and no shared-expert overlap)
run_settings             what Megatron-Core refuses of the layout under the framework run
                         settings (CUDA graphs, MoE all-to-all overlap, token-drop):
                         ``SETTING_REFUSALS``
batch                    gbs = mbs x ga x dp
extra                    the user's or the agent's extra hard constraints (``solver/constraints``)
recompute_dominance      search only: recomputation costs time and only saves memory, so drop a
                         recompute option when no recomputation fits, and of full block recompute
                         keep the smallest K (layers per virtual stage) that fits
hbm                      the most loaded stage fits in HBM x (1 - margin)
=======================  =====================================================================

:data:`FAMILY_AXES` names the search axes (``solver/space.AXES``) each family reads; the
removal counts of a search (``solver/attribution.py``) rely on it and a test checks it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from tune_cp.config.axes import AXES
from tune_cp.config.specs import (
    EMBEDDING_LOSS_SLOTS,
    GIB,
    LIGHT_TRIM,
    SLOT_SPLITS,
    ClusterSpec,
    Dispatcher,
    FlexBackend,
    Fp8Recipe,
    GroupedGemm,
    ModelSpec,
    ParallelConfig,
    PipelineSplit,
    Precision,
    Recompute,
    RecomputeMethod,
    Schedule,
    TrainingSpec,
    nodes_text,
    parse_pipeline_layout,
)
from tune_cp.oracle.memory import (
    FULL_ITERATION,
    TERM_GROUPS,
    MemoryReport,
    RunOptions,
    max_chunk_layers,
    memory_report,
    pipeline_chunks,
    split_fields,
    split_layout,
    uneven_stage_layers,
)
from tune_cp.solver.defaults import DEFAULT_MEMORY_MARGIN  # noqa: F401 (re-exported)
from tune_cp.solver.settings import RunSettings, SettingsView

PPM = 1_000_000


@dataclass(frozen=True)
class Violation:
    """One broken rule. ``axes`` names the configuration axes the message is about."""

    rule: str
    message: str
    axes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RuleContext(SettingsView):
    """Everything a rule may look at. ``cfg`` must be resolved (``resolve_config``); the run's
    settings (overheads, margin, cross-scale-up, the ``extra`` family's constraints) are
    ``settings`` (read as ``ctx.memory_margin`` etc.)."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    cfg: ParallelConfig
    settings: RunSettings = field(default_factory=RunSettings)
    #: the K values a search tries for full block recompute (family ``recompute_dominance``);
    #: empty: the family does not apply (``tune-cp check``)
    full_recompute_layers: tuple[int, ...] = ()
    #: whether the search also tries no recomputation (then it dominates every recompute option
    #: that it fits beside)
    recompute_none_option: bool = False

    @cached_property
    def memory(self) -> MemoryReport:
        return memory_report(self.model, self.cluster, self.training, self.cfg, self.overheads)

    @property
    def limit_bytes(self) -> int:
        return hbm_limit_bytes(self.cluster.gpu.hbm_bytes, self.memory_margin)

    @property
    def world(self) -> int:
        return self.cluster.world_size

    @property
    def num_microbatches(self) -> int:
        assert self.cfg.ga is not None
        return self.cfg.ga


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def fmt_set(values: Iterable[int]) -> str:
    vals = sorted(set(values))
    if len(vals) > 12:
        vals_s = ", ".join(str(v) for v in vals[:10]) + f", ... {vals[-1]}"
    else:
        vals_s = ", ".join(str(v) for v in vals)
    return "{" + vals_s + "}"


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def hbm_limit_bytes(hbm_bytes: int, margin: float) -> int:
    """The usable HBM: ``hbm x (1 - margin)``, floor, in integer parts per million."""
    return hbm_bytes * (PPM - round(margin * PPM)) // PPM


# ------------------------------------------------------------------------ rule families


def world_size(ctx: RuleContext) -> list[Violation]:
    c, w = ctx.cfg, ctx.world
    assert c.dp is not None
    prod = c.tp * c.pp * c.cp
    where = f"the {w} GPUs ({nodes_text(ctx.cluster.num_nodes)} x {ctx.cluster.gpus_per_node})"
    if w % prod:
        tp_ok = [t for t in divisors(w) if w % (t * c.pp * c.cp) == 0
                 and tp_shape_ok(ctx.model, t)
                 and (ctx.allow_cross_scale_up or t <= ctx.cluster.scale_up_gpus)]
        cp_ok = [x for x in divisors(w) if w % (c.tp * c.pp * x) == 0]
        pp_ok = [x for x in divisors(w) if w % (c.tp * x * c.cp) == 0]
        hint = f"with pp {c.pp} and cp {c.cp} choose tp in {fmt_set(tp_ok)}" if tp_ok else (
            f"with tp {c.tp} and pp {c.pp} choose cp in {fmt_set(cp_ok)}" if cp_ok else
            f"with tp {c.tp} and cp {c.cp} choose pp in {fmt_set(pp_ok)}"
        )
        return [Violation("world_size", f"tp x pp x cp ({c.tp} x {c.pp} x {c.cp} = {prod}) "
                          f"must divide {where}; {hint}", ("tp", "pp", "cp"))]
    if prod * c.dp != w:
        return [Violation("world_size", f"dp ({c.dp}) must equal {where} / (tp x pp x cp = "
                          f"{prod}) = {w // prod}", ("dp",))]
    return []


def tp_shape_ok(model: ModelSpec, tp: int) -> bool:
    """The tensor-parallel shape rules alone (used for messages and alternatives)."""
    return not _tp_shape_problems(model, tp)


def _tp_shape_problems(model: ModelSpec, tp: int) -> list[str]:
    m, out = model, []
    if m.num_attention_heads % tp:
        out.append(f"tp ({tp}) must divide the {m.num_attention_heads} attention heads of "
                   f"{m.name}")
    if m.mla is None and m.num_kv_heads % tp and tp % m.num_kv_heads:
        out.append(f"tp ({tp}) must divide the {m.num_kv_heads} KV heads (num_kv_heads) of "
                   f"{m.name}, or be a multiple of them")
    if m.num_dense_layers_effective and m.ffn_hidden_size % tp:
        out.append(f"tp ({tp}) must divide ffn_hidden_size ({m.ffn_hidden_size}) of {m.name}")
    shared = m.num_shared_experts * m.shared_expert_ffn_hidden_size
    if shared and shared % tp:
        out.append(f"tp ({tp}) must divide the shared-expert FFN width ({shared}) of {m.name}")
    if m.mamba is not None:
        # Megatron-Core ssm/mamba_mixer.py: "nheads must be evenly divisble by tp_size",
        # "ngroups must be evenly divisible by tp_size"
        for what, n in (("heads (mamba num_heads)", m.mamba.num_heads),
                        ("groups (mamba num_groups)", m.mamba.num_groups)):
            if n % tp:
                out.append(f"tp ({tp}) must divide the {n} Mamba {what} of {m.name}")
    return out


def mamba_cp_ok(model: ModelSpec, tp: int, cp: int) -> bool:
    """Megatron-Core ``ssm/mamba_context_parallel.py`` (0.16.1): the all-to-all context
    parallelism of a Mamba mixer needs ``H / tp`` divisible by cp, and ``G / tp`` divisible by
    cp or cp divisible by ``G / tp`` (the groups are then replicated over the CP ranks)."""
    m = model.mamba
    if m is None or cp == 1 or m.num_heads % tp or m.num_groups % tp:
        return True
    heads, groups = m.num_heads // tp, m.num_groups // tp
    return heads % cp == 0 and (groups % cp == 0 or cp % groups == 0)


def hybrid_split_ok(model: ModelSpec, vpp: int, split: PipelineSplit) -> bool:
    """A hybrid Mamba model splits its layer pattern evenly over pp stages, without virtual
    stages: Megatron-Core 0.16.1 ``ssm/mamba_block.py::_select_layers_for_pipeline_parallel``
    asserts ``virtual_pipeline_model_parallel_size is None`` and takes ``num_layers // pp``
    consecutive pattern characters per stage (the embedding and loss are not layer slots); at
    d98e8a64 a pattern without ``|`` stage separators still does
    (``hybrid_layer_allocation.py::select_pipeline_segment`` l.384-391, l.436-441) and
    ``arguments.py`` l.829-837 refuses the embedding/loss slots. Megatron-LM d98e8a64 also takes
    uneven first/last stages there (l.408-433); tune-cp does not search or model them."""
    return not model.is_hybrid or (vpp == 1 and split is PipelineSplit.EVEN)


def tensor_parallel(ctx: RuleContext) -> list[Violation]:
    problems = _tp_shape_problems(ctx.model, ctx.cfg.tp)
    if not problems:
        return []
    legal = [t for t in divisors(ctx.world) if tp_shape_ok(ctx.model, t)
             and (ctx.allow_cross_scale_up or t <= ctx.cluster.scale_up_gpus)]
    return [Violation("tensor_parallel", f"{p}; choose tp in {fmt_set(legal)}", ("tp",))
            for p in problems]


def scale_up(ctx: RuleContext) -> list[Violation]:
    if ctx.allow_cross_scale_up:
        return []
    c, cl = ctx.cfg, ctx.cluster
    limit = cl.scale_up_gpus
    if cl.scale_up_gpus == cl.gpus_per_node:
        bound = f"gpus_per_node ({cl.gpus_per_node})"
    else:
        bound = f"the {limit}-GPU scale-up domain of {cl.gpu.name}"
    out = []
    for axis, value, what in (("tp", c.tp, "tensor-parallel"), ("etp", c.etp_, "expert-TP")):
        if value > limit:
            legal = [t for t in divisors(limit) if axis == "etp" or tp_shape_ok(ctx.model, t)]
            out.append(Violation("scale_up", f"{axis} ({value}) must be at most {bound} so "
                                 f"{what} traffic stays on the scale-up links; choose {axis} in "
                                 f"{fmt_set(legal)}", (axis,)))
    return out


def expert_layout(ctx: RuleContext) -> list[Violation]:
    c, m, w = ctx.cfg, ctx.model, ctx.world
    if not m.is_moe:
        out = []
        if c.ep != 1:
            out.append(Violation("expert_layout", f"ep ({c.ep}) needs a mixture-of-experts model; "
                                 f"{m.name} is dense: use ep 1", ("ep",)))
        return out
    out = []
    if m.num_experts % c.ep:
        out.append(Violation("expert_layout", f"ep ({c.ep}) must divide the {m.num_experts} experts "
                             f"(num_experts) of {m.name}; choose ep in "
                             f"{fmt_set(divisors(m.num_experts))}", ("ep",)))
    prod = c.pp * c.ep * c.etp_
    if w % prod:
        legal_ep = [e for e in divisors(m.num_experts) if w % (c.pp * e * c.etp_) == 0]
        legal_etp = [t for t in divisors(w) if w % (c.pp * c.ep * t) == 0
                     and m.expert_ffn_hidden_size % t == 0]
        hint = (f"choose ep in {fmt_set(legal_ep)}" if legal_ep else
                f"choose etp in {fmt_set(legal_etp)}")
        out.append(Violation("expert_layout", f"pp x ep x etp ({c.pp} x {c.ep} x {c.etp_} = {prod}) "
                             f"must divide the {w} GPUs so the expert-data-parallel size is whole; "
                             f"{hint}", ("ep", "etp") if legal_ep else ("etp",)))
    return out


def expert_tensor_parallel(ctx: RuleContext) -> list[Violation]:
    c, m = ctx.cfg, ctx.model
    if not m.is_moe:
        return []
    out = []
    if m.expert_ffn_hidden_size % c.etp_:
        legal = [d for d in divisors(m.expert_ffn_hidden_size) if d <= ctx.cluster.scale_up_gpus]
        out.append(Violation("expert_tensor_parallel", f"etp ({c.etp_}) must divide the expert FFN "
                             f"width ({m.expert_ffn_hidden_size}); choose etp in {fmt_set(legal)}",
                             ("etp",)))
    if m.mlp_bias and c.etp_ != 1:
        out.append(Violation("expert_tensor_parallel", f"etp ({c.etp_}) must be 1: {m.name}'s experts "
                             f"have biases, which Megatron-Core shards only with etp 1", ("etp",)))
    return out


def sequence_parallel(ctx: RuleContext) -> list[Violation]:
    c = ctx.cfg
    if ctx.model.is_moe and c.tp > 1 and not c.sp:
        return [Violation("sequence_parallel", f"an MoE model with tp ({c.tp}) > 1 needs sequence "
                          f"parallelism (Megatron-Core raises otherwise); turn sequence parallel on")]
    return []


def sequence_length(ctx: RuleContext) -> list[Violation]:
    c, s, out = ctx.cfg, ctx.training.seq_len, []
    if c.cp > 1 and s % (2 * c.cp):
        legal = [x for x in divisors(s) if x == 1 or s % (2 * x) == 0]
        out.append(Violation("sequence_length", f"seq_len ({s}) must be divisible by 2 x cp "
                             f"(2 x {c.cp}) for context parallelism; choose cp in {fmt_set(legal)}"))
    elif c.sp and c.tp > 1 and (s // c.cp) % c.tp:
        out.append(Violation("sequence_length", f"seq_len / cp ({s} / {c.cp} = {s // c.cp}) must "
                             f"be divisible by tp ({c.tp}) for sequence parallelism"))
    m = ctx.model
    if not mamba_cp_ok(m, c.tp, c.cp):
        legal = [x for x in divisors(ctx.world) if mamba_cp_ok(m, c.tp, x)]
        assert m.mamba is not None
        out.append(Violation("sequence_length", f"cp ({c.cp}) must divide the "
                             f"{m.mamba.num_heads} / {c.tp} Mamba heads per tp rank and the "
                             f"{m.mamba.num_groups} / {c.tp} groups (or be a multiple of them) "
                             f"for Mamba context parallelism (Megatron-Core "
                             f"mamba_context_parallel.py); with tp {c.tp} choose cp in "
                             f"{fmt_set(legal)}", ("cp",)))
    if m.max_position_embeddings and m.position_embedding == "learned" and s > m.max_position_embeddings:
        out.append(Violation("sequence_length", f"seq_len ({s}) exceeds the learned position "
                             f"embeddings ({m.max_position_embeddings}) of {m.name}"))
    return out


def split_slots(model: ModelSpec, split: PipelineSplit) -> int:
    """Layer slots the pipeline split divides: decoder layers, plus the embedding and the loss
    under ``embedding_loss``. MTP layers are no slot: Megatron-LM counts ``num_layers + 1 + 1``
    (``arguments.py`` l.988-998 at d98e8a64, ``TransformerConfig.__post_init__``
    ``transformer_config.py`` l.2370-2414, ``transformer_block.py::get_num_layers_to_build``
    l.148-159) and builds every MTP layer on the last virtual stage besides its share
    (``multi_token_prediction.py::get_mtp_num_layers_to_build`` l.878-882)."""
    if split is PipelineSplit.EVEN:
        return model.num_layers
    if split is PipelineSplit.EMBEDDING_MTP_LOSS:  # written as a layout (config/specs.py)
        return model.num_layers + EMBEDDING_LOSS_SLOTS + model.num_mtp_layers
    return model.num_layers + EMBEDDING_LOSS_SLOTS


def split_problem(model: ModelSpec, pp: int, vpp: int, split: PipelineSplit,
                  first: int | None = None, last: int | None = None,
                  layout: str | None = None) -> str | None:
    """Why the split of ``pp x vpp`` virtual stages is illegal (one line naming the values and
    what would be legal), or None. The one home of the split's legality: the rule
    :func:`pipeline_split` and the CP-SAT model (``solver/model.py::split_ok``) call it. Each
    condition is an assertion of Megatron-LM (read at d98e8a64; the same assertions, cited
    line by line, are transcribed in ``formats/megatron_validate.py``, which the tests run on
    every export).

    ``even``: ``num_layers % pp == 0`` and ``(num_layers / pp) % vpp == 0``
    (``transformer_block.py::get_num_layers_to_build`` l.156-158, l.175-178; without virtual
    stages also ``arguments.py`` l.997). ``embedding_loss``: the same with ``num_layers + 2``
    (``arguments.py`` l.988-998, ``transformer_config.py`` l.2370-2414,
    ``get_num_layers_to_build`` l.148-159); MTP layers are no slot (they are built on the last
    virtual stage besides its share, ``multi_token_prediction.py`` l.878-882), and a virtual
    stage may hold only the embedding or only the loss (``get_num_layers_to_build`` l.191-201
    asserts ``>= 0`` layers; Meta's Llama 3 405B runs that way).
    ``uneven`` / light splits (``transformer_config.py`` l.2295-2368): pp > 1; the first / last
    stage layers positive and divisible by vpp; with middle stages, middle layers > 0 (l.2341,
    "Mismatch"), divisible by the middle stages and each middle stage's share by vpp; with none,
    first + last = layers. A light split that gives the same stages as the even or
    embedding_loss split is left to that split (one configuration, one name). ``layout``
    (``pipeline_parallel_layer_layout.py`` l.41-45, ``validate_layer_layout`` l.95-131):
    ``pp x vpp`` stages, the embedding first and the loss last, once each, every decoder and
    MTP layer, MTP after the decoder layers, all in one virtual stage, a rank's last.
    ``embedding_mtp_loss`` (a model with MTP): ``num_layers + 2 + mtp`` slots divide over
    ``pp x vpp``, and the layout it is written as (``oracle/memory.py::split_layout``) passes
    the layout's rules."""
    virtual = pp * vpp
    L = model.num_layers
    if not hybrid_split_ok(model, vpp, split):
        legal_pp = [p for p in divisors(L) if p <= L]
        return (f"{model.name} is a hybrid Mamba model: Megatron-Core splits its {L}-layer "
                f"pattern evenly over pp stages without virtual stages (vpp {vpp}, {split.value} "
                f"split given); use vpp 1, the even split and pp in {fmt_set(legal_pp)}")
    mtp_slots = split is PipelineSplit.EMBEDDING_MTP_LOSS
    if mtp_slots and not model.num_mtp_layers:
        return (f"the {split.value} split needs MTP layers; {model.name} has none (use "
                f"{PipelineSplit.EMBEDDING_LOSS.value})")
    if split in SLOT_SPLITS:
        slots = split_slots(model, split)
        if slots % virtual == 0:
            if not mtp_slots:
                return None
            # written as a layout: that layout's own rules (validate_layer_layout)
            text = split_layout(L, model.num_mtp_layers, pp, vpp, split)
            problem = _layout_problem(model, pp, vpp, text)
            return None if problem is None else (
                f"the {split.value} split at pp {pp} x vpp {vpp} is the layout {text}: {problem}")
        what = ("num_layers" if split is PipelineSplit.EVEN else
                "num_layers + embedding + loss" + (" + MTP" if mtp_slots else
                " (MTP layers are no slot in Megatron-Core)" if model.num_mtp_layers else ""))
        legal_pp = [p for p in divisors(slots) if slots % (p * vpp) == 0]
        return (f"{what} ({slots}) must split evenly over pp x vpp = {pp} x {vpp} = {virtual} "
                f"virtual stages ({split.value} split); with vpp {vpp} choose pp in "
                f"{fmt_set(legal_pp)}")
    if split is PipelineSplit.LAYOUT:
        return _layout_problem(model, pp, vpp, layout)
    if pp == 1:
        return f"the {split.value} split needs pp > 1 (first and last stage are one at pp 1)"
    ends = uneven_stage_layers(L, pp, vpp, split, first, last)
    if ends is None:
        a, b = LIGHT_TRIM[split]
        legal_pp = [p for p in divisors(L // vpp + a + b) if p > 1] if L % vpp == 0 else []
        per = (f"{L} / {vpp} + {a + b} = {L // vpp + a + b}" if L % vpp == 0 else
               f"{L} / {vpp} is not whole")
        fix = (f"with vpp {vpp} choose pp in {fmt_set(legal_pp)}" if legal_pp else
               f"choose vpp in {fmt_set(divisors(L))} (divisors of num_layers {L})")
        return (f"the {split.value} split needs num_layers / vpp + {a + b} ({per}) to divide "
                f"over pp ({pp}); {fix}")
    f, la = ends
    if f is None and la is None:
        return ("the uneven split needs first and/or last stage layers (Megatron-LM "
                "--decoder-first/last-pipeline-num-layers)")
    for name, n in (("first", f), ("last", la)):
        if n is not None and (n < 1 or n % vpp):
            return (f"the {name} stage's {n} layers ({split.value} split) must be positive and "
                    f"divisible by vpp ({vpp}) (Megatron-Core num_layers_in_{name}_pipeline_stage)")
    middle_ranks = pp - (f is not None) - (la is not None)
    middle = L - (f or 0) - (la or 0)
    ends_sum = (f or 0) + (la or 0)
    if middle < 0:
        return f"first + last stage layers ({ends_sum}) must be at most num_layers ({L})"
    # transformer_config.py l.2341-2345: middle layers exactly when there are middle stages
    if bool(middle) != bool(middle_ranks):
        return (f"first + last stage layers ({ends_sum}) must "
                f"{'equal' if middle_ranks == 0 else 'be below'} num_layers ({L}) with "
                f"{middle_ranks} middle stage(s) (Megatron-Core: 'Mismatch: {middle} middle "
                f"layers remaining but {middle_ranks} middle PP stages')")
    if middle_ranks and (middle % middle_ranks or (middle // middle_ranks) % vpp):
        return (f"the {middle} layers between the first and last stage ({split.value} split) "
                f"must divide over the {middle_ranks} middle stages in multiples of vpp ({vpp})")
    if split in LIGHT_TRIM:
        chunks = pipeline_chunks(L, model.num_mtp_layers, pp, vpp, split)
        for other in SLOT_SPLITS:
            if (split_problem(model, pp, vpp, other) is None
                    and pipeline_chunks(L, model.num_mtp_layers, pp, vpp, other) == chunks):
                return (f"the {split.value} split gives the same stages as the {other.value} "
                        f"split at pp {pp} x vpp {vpp}; use {other.value}")
    return None


def _layout_problem(model: ModelSpec, pp: int, vpp: int, layout: str | None) -> str | None:
    """:func:`split_problem` of a hand-written layout."""
    if layout is None:
        return ("the layout split needs a layout (Megatron-LM --pipeline-model-parallel-layout, "
                "tune-cp --pipeline-layout)")
    stages = parse_pipeline_layout(layout)
    if len(stages) != pp * vpp:
        return (f"the layout has {len(stages)} virtual stages but pp x vpp = {pp} x {vpp} = "
                f"{pp * vpp}; give pp in {fmt_set(divisors(len(stages)))} with vpp = {len(stages)} / pp")
    flat = "".join(stages)
    mtp = model.num_mtp_layers
    if flat[:1] != "E" or flat[-1:] != "L" or flat.count("E") != 1:
        return "the layout must begin with the embedding (E) and end with the loss (L), one E"
    if flat.count("L") != 1:
        return ("the layout's several loss slots (MTP loss split) are not modelled; give one L, "
                "last")
    # validate_layer_layout l.106-114 (d98e8a64): "Number of decoder layers ... must match
    # num_layers", "Number of mtp layers in layout must match mtp_num_layers"
    if flat.count("t") != model.num_layers:
        return (f"the layout has {flat.count('t')} decoder layers (t); {model.name} has "
                f"{model.num_layers} (Megatron-Core validate_layer_layout asserts they match)")
    if flat.count("m") != mtp:
        fix = (f"put its {mtp} MTP layer(s) as m in one rank's last virtual stage (e.g. the stage "
               f"before the loss: '...,m|L'), or train without MTP (mtp_num_layers: null, "
               f"Megatron-LM's default)" if mtp else "remove the m, or use a model with MTP layers")
        return (f"the layout has {flat.count('m')} MTP layers (m) but {model.name} has {mtp} "
                f"(Megatron-Core validate_layer_layout: 'Number of mtp layers in layout must "
                f"match mtp_num_layers'); {fix}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        return "the layout must place every decoder layer (t) before the MTP layers (m)"
    for v, st in enumerate(stages):  # validate_layer_layout l.121-136
        if "m" in st and v // pp != vpp - 1:
            return (f"the layout's MTP layers must be in a rank's last virtual stage (Megatron-"
                    f"Core), not virtual stage {v}")
        if "m" in st and st.count("m") != mtp:  # l.127-131
            return (f"the layout's {mtp} MTP layers must all be in one virtual stage (Megatron-"
                    f"Core); virtual stage {v} holds {st.count('m')}")
    return None


def pipeline_split(ctx: RuleContext) -> list[Violation]:
    c = ctx.cfg
    assert c.pipeline_split is not None
    problem = split_problem(ctx.model, c.pp, c.vpp, c.pipeline_split, *split_fields(c))
    return [] if problem is None else [Violation("pipeline_split", problem)]


def virtual_pipeline(ctx: RuleContext) -> list[Violation]:
    c, out = ctx.cfg, []
    sched = c.schedule_
    if c.vpp > 1 and c.pp == 1:
        out.append(Violation("virtual_pipeline", f"vpp ({c.vpp}) needs pp > 1; use vpp 1 with pp 1"))
    if sched is Schedule.INTERLEAVED and c.vpp == 1:
        out.append(Violation("virtual_pipeline", "the interleaved schedule needs vpp > 1"))
    if sched is Schedule.ONE_F_ONE_B and c.vpp > 1:
        out.append(Violation("virtual_pipeline", f"vpp ({c.vpp}) > 1 runs the interleaved schedule, "
                             f"not 1f1b"))
    if sched is Schedule.INTERLEAVED and c.pp > 1:
        m = ctx.num_microbatches
        if m < c.pp or m % c.pp:
            out.append(Violation("virtual_pipeline", f"the interleaved schedule needs the number of "
                                 f"micro-batches (ga = {m}) to be a multiple of pp ({c.pp}); "
                                 f"change gbs or mbs so that ga is in "
                                 f"{fmt_set(c.pp * i for i in range(1, 5))}..."))
    return out


def schedule(ctx: RuleContext) -> list[Violation]:
    c, out = ctx.cfg, []
    if c.schedule_ is not Schedule.ZERO_BUBBLE:
        return out
    if c.recompute is not Recompute.NONE:
        out.append(Violation("schedule", f"the zero-bubble schedule excludes recomputation "
                             f"(recompute is {c.recompute.value}); use recompute none or another schedule"))
    if c.pp == 1:
        out.append(Violation("schedule", "the zero-bubble schedule needs pp > 1"))
    if c.vpp not in (1, 2):
        out.append(Violation("schedule", f"the zero-bubble schedule supports vpp 1 (ZB-H1) or 2 "
                             f"(ZB-V), not {c.vpp}"))
    if ctx.model.tied_embeddings:
        out.append(Violation("schedule", f"the zero-bubble schedule needs untied embeddings; "
                             f"{ctx.model.name} ties them"))
    return out


def layers_per_chunk(model: ModelSpec, cfg: ParallelConfig) -> int:
    """Decoder layers of the largest virtual stage (``oracle.memory.max_chunk_layers``: the
    chunks the memory model counts, not ``ceil(slots / (pp vpp))``)."""
    assert cfg.pipeline_split is not None
    return max_chunk_layers(model.num_layers, model.num_mtp_layers, cfg.pp, cfg.vpp,
                            cfg.pipeline_split, *split_fields(cfg))


def recompute(ctx: RuleContext) -> list[Violation]:
    c, m, out = ctx.cfg, ctx.model, []
    if c.recompute is Recompute.FULL and m.is_hybrid:
        out.append(Violation("recompute", f"full recomputation is not available for the hybrid "
                             f"Mamba model {m.name} (Megatron-Core 0.16.1 MambaStack has no "
                             f"checkpointed forward); use selective or no recomputation"))
    if c.recompute is Recompute.FULL and c.recompute_layers is not None:
        per = layers_per_chunk(m, c)
        if c.recompute_layers > per or (c.recompute_layers == 0 and c.recompute_method == "uniform"):
            lo = 0 if c.recompute_method == "block" else 1
            out.append(Violation("recompute", f"recompute_layers ({c.recompute_layers}) must be in "
                                 f"{lo}..{per}, the layers of one virtual stage "
                                 f"({c.recompute_method.value} method)"))
    if c.recompute is Recompute.SELECTIVE:
        mods = set(c.recompute_modules)
        needs = {"mla_up_proj": (m.mla is not None, "multi-latent attention"),
                 "moe": (m.is_moe, "an MoE model"), "moe_act": (m.is_moe, "an MoE model"),
                 "shared_experts": (m.num_shared_experts > 0, "shared experts")}
        for mod, (ok, what) in needs.items():
            if mod in mods and not ok:
                out.append(Violation("recompute", f"recompute module {mod} needs {what}; "
                                     f"{m.name} has none"))
        if c.fp8_recipe is Fp8Recipe.DELAYED and mods & {"moe_act", "layernorm"}:
            out.append(Violation("recompute", "recompute modules moe_act and layernorm are not "
                                 "supported with the delayed FP8 recipe; use tensorwise or drop them"))
    return out


FP8_ARCHITECTURES_MX = frozenset({"blackwell", "cdna4"})


def training_precision(cluster: ClusterSpec, training: TrainingSpec) -> list[Violation]:
    """What the training precision needs of the GPU whatever the layout (so a search checks it
    before enumerating): NVFP4 needs FP4 tensor cores (a catalog ``peak_fp4_tflops``)."""
    gpu = cluster.gpu
    if training.precision is Precision.FP4 and gpu.peak_fp4_flops is None:
        return [Violation("precision", f"precision fp4 (NVFP4) needs FP4 tensor cores; {gpu.name} "
                          f"has no peak_fp4_tflops in the catalog: use precision bf16 or fp8")]
    return []


def precision(ctx: RuleContext) -> list[Violation]:
    c, gpu = ctx.cfg, ctx.cluster.gpu
    out = training_precision(ctx.cluster, ctx.training)
    if why := optimizer_state_problem(c.optimizer_state, c.distributed_optimizer, c.fsdp):
        out.append(Violation("precision", why))
    if c.fp8_recipe is None:
        return out
    if ctx.training.precision is Precision.FP4:
        out.append(Violation("precision", f"the fp8 recipe {c.fp8_recipe.value} with precision "
                             f"fp4: a configuration computes in one precision; drop the FP8 "
                             f"recipe or use precision fp8"))
    if gpu.peak_fp8_flops is None:
        out.append(Violation("precision", f"FP8 needs FP8 tensor cores; {gpu.name} has none: "
                             f"use precision bf16"))
    elif c.fp8_recipe is Fp8Recipe.MXFP8 and gpu.architecture not in FP8_ARCHITECTURES_MX:
        out.append(Violation("precision", f"the mxfp8 recipe needs block-scaled FP8 (Blackwell or "
                             f"CDNA4); {gpu.name} is {gpu.architecture or 'unknown'}: use tensorwise "
                             f"or delayed"))
    return out


def optimizer_state_problem(state: Any, distributed_optimizer: bool, fsdp: bool) -> str | None:
    """What Megatron-Core refuses in this optimizer state (:class:`OptimizerState`) under this
    optimizer: the precision-aware optimizer needs the distributed optimizer
    (Megatron-LM ``megatron/core/optimizer/__init__.py`` L1057-1060 at d98e8a6: "only supported
    with distributed optimizer"). Megatron-FSDP sets its master dtype apart
    (``--megatron-fsdp-main-params-dtype``, "Replaces --main-params-dtype",
    ``megatron/training/arguments.py`` L3687-3690), which tune-cp does not model: refused
    under FSDP. A search holds only distributed-optimizer candidates under such a state
    (``solver/space.py::SearchSpace``), so the CP-SAT model needs no constraint of its own."""
    if not state.precision_aware:
        return None
    if fsdp:
        return ("the precision-aware optimizer's state dtypes under FSDP: Megatron-FSDP takes "
                "--megatron-fsdp-main-params-dtype instead, which tune-cp does not model; drop "
                "--fsdp or the optimizer-state dtypes")
    if not distributed_optimizer:
        return ("the precision-aware optimizer (--use-precision-aware-optimizer) needs the "
                "distributed optimizer (Megatron-Core optimizer/__init__.py L1057); drop "
                "--no-distributed-optimizer or the optimizer-state dtypes")
    return None


def dispatcher(ctx: RuleContext) -> list[Violation]:
    c = ctx.cfg
    if c.dispatcher == "flex" and (not ctx.model.is_moe or c.ep == 1):
        return [Violation("dispatcher", "the flex (DeepEP) dispatcher needs an MoE model with "
                          f"ep > 1 (ep is {c.ep}); use alltoall")]
    return []


# ------------------------------------------------ moe_backend: the MoE backend's own rules
#
# Sources: Megatron-Core ``transformer/transformer_config.py`` at d98e8a64 (dispatcher backends
# l.895-907 and l.1743-1762, shared-expert overlap l.1820-1825 and l.3038-3041), Primus
# ``primus/backends/megatron/patches/args/rocm_arg_validation.py`` at fd1eeabbad
# (``validate_args_on_rocm``: sync-free stages l.199-217 with the options of
# ``_get_sync_free_moe_options`` l.44-71, Turbo DeepEP l.221-233), Primus-Turbo being a ROCm
# library (``enable_primus_turbo``), NVIDIA DeepEP / HybridEP CUDA libraries (Megatron-Core
# ``moe/fused_a2a.py`` imports ``deep_ep``).


def backend_problems(model: ModelSpec, gpu: Any, cfg: ParallelConfig,
                     a2a_overlap: bool = False) -> list[str]:
    """What the frameworks refuse of a resolved configuration's MoE backend (one line each,
    naming the value and what would be legal); [] when legal."""
    out: list[str] = []
    amd = gpu.vendor == "amd"
    flex = cfg.dispatcher == Dispatcher.FLEX
    fb = cfg.flex_backend
    if not model.is_moe:
        if cfg.sync_free_stage or fb is not None or cfg.shared_expert_overlap:
            out.append("the MoE backend settings (--sync-free-stage, --flex-backend, "
                       "--shared-expert-overlap) need an MoE model; drop them")
        return out
    if fb is not None and not flex:
        out.append(f"--flex-backend {fb.value} is the flex dispatcher's library; give "
                   f"--dispatcher flex or drop it (dispatcher is {cfg.dispatcher.value})")
    turbo = {"--flex-backend turbo": fb is FlexBackend.TURBO,
             "--grouped-gemm turbo": cfg.grouped_gemm is GroupedGemm.TURBO,
             f"--sync-free-stage {cfg.sync_free_stage}": cfg.sync_free_stage > 0}
    for what, on in turbo.items():
        if on and not amd:
            out.append(f"{what} is Primus-Turbo, a ROCm library: it needs an AMD GPU "
                       f"({gpu.name} is {gpu.vendor}); use the defaults (deepep, te, stage 0)")
    if flex and fb in (FlexBackend.DEEPEP, FlexBackend.HYBRIDEP) and amd:
        out.append(f"--flex-backend {fb.value} is an NVIDIA CUDA library (Megatron-Core "
                   f"moe/fused_a2a.py); on {gpu.name} use turbo (Primus-Turbo DeepEP)")
    if cfg.sync_free_stage >= 2 and not (flex and fb is FlexBackend.TURBO):
        out.append(f"--sync-free-stage {cfg.sync_free_stage} turns on Primus-Turbo DeepEP "
                   "(rocm_arg_validation.py: use_turbo_deepep); give --dispatcher flex "
                   "--flex-backend turbo or stage 0-1")
    if cfg.sync_free_stage >= 2 and cfg.grouped_gemm is not GroupedGemm.TURBO:
        out.append(f"--sync-free-stage {cfg.sync_free_stage} needs --grouped-gemm turbo (Primus: "
                   "'Sync-Free MoE stage 2 or 3 require PrimusTurboGroupedLinear'); grouped "
                   f"GEMM is {cfg.grouped_gemm.value}")
    if flex and fb is FlexBackend.TURBO:
        if cfg.shared_expert_overlap:
            out.append("Primus-Turbo DeepEP refuses --shared-expert-overlap ('DeepEP not "
                       "support moe_shared_expert_overlap'); drop it or use alltoall")
        if not cfg.router_fp32:
            out.append("Primus-Turbo DeepEP needs the fp32 router ('DeepEP only supports float32 "
                       "probs'); give --router-fp32")
    if cfg.shared_expert_overlap and cfg.dispatcher == Dispatcher.ALLGATHER:
        out.append("--shared-expert-overlap works only with the alltoall or flex dispatcher "
                   "(Megatron-Core transformer_config.py l.1820-1825); dispatcher is allgather")
    if cfg.shared_expert_overlap and a2a_overlap:
        out.append("--shared-expert-overlap and --moe-a2a-overlap exclude each other "
                   "(Megatron-Core: 'disable moe_shared_expert_overlap when enabling "
                   "overlap_moe_expert_parallel_comm'); drop one")
    return out


def moe_backend(ctx: RuleContext) -> list[Violation]:
    return [Violation("moe_backend", msg, ("dispatcher",))
            for msg in backend_problems(ctx.model, ctx.cluster.gpu, ctx.cfg,
                                        ctx.settings.options.moe_a2a_overlap)]


# ------------------------------------------------ run_settings: the framework run settings
#
# What Megatron-Core refuses under the framework run settings (``RunSettings``: CUDA graphs,
# MoE all-to-all overlap, token-drop). Sources: Megatron-Core ``transformer/transformer_config.py``
# ``__post_init__`` and Megatron-LM ``docs/user-guide/features/cuda_graph.md`` at ``d98e8a64dd``.
# Refused alone: ``oracle/memory.py::RunOptions`` validators; with the model whatever the layout
# (exit 2 before any check or search): :func:`options_problem`; with the layout: the family
# ``run_settings``, one row of :data:`SETTING_REFUSALS` per condition, which the rule
# :func:`run_settings` evaluates on a configuration and the CP-SAT model tabulates over the
# axes (``solver/model.py::enc_run_settings``).


def options_problem(model: ModelSpec, options: RunOptions) -> str | None:
    """What Megatron-Core refuses in these run settings for ``model`` whatever the layout (one
    line, the CLI's exit 2), or None. What depends on the layout is the family
    ``run_settings`` (:data:`SETTING_REFUSALS`)."""
    scope = options.cuda_graph_scope
    if not model.is_moe:
        if options.moe_a2a_overlap:
            return (f"--moe-a2a-overlap overlaps the MoE all-to-all, but {model.name} is a dense "
                    "model (Megatron-Core: 'overlap_moe_expert_parallel_comm is only supported "
                    "with expert model parallelism'); drop it")
        if options.moe_capacity_factor is not None:
            return (f"--moe-token-drop sets an expert capacity, but {model.name} is a dense model "
                    "with no experts; drop it")
        moe_parts = [x for x in scope if x.startswith("moe_")]
        if moe_parts:
            return (f"--cuda-graph-scope {','.join(moe_parts)} captures MoE parts, but "
                    f"{model.name} is a dense model (Megatron-Core: 'moe cuda graph is only "
                    "supported for MoE'); choose from attn,mlp or full_iteration")
        return None
    if "mlp" in scope and model.num_dense_layers == 0 and not model.is_hybrid:
        return (f"--cuda-graph-scope mlp captures dense MLP layers, but every layer of "
                f"{model.name} is MoE (Megatron-Core: 'mlp cuda graph is only supported for dense "
                "layers'); use moe_router (with moe_preprocess) instead")
    if FULL_ITERATION in scope and options.moe_capacity_factor is None:
        return (f"--cuda-graph-scope full_iteration on the MoE model {model.name} needs static "
                "expert shapes: a dropless layer copies its token counts to the host, which a "
                "graph cannot capture (Megatron-LM cuda_graph.md: 'MoE expert dispatch involves "
                "dynamic shapes and cannot be captured'; its full-iteration MoE recipe adds "
                "--moe-paged-stash, which tune-cp does not model); add --moe-token-drop 1.0 or "
                "capture attn,moe_router,moe_preprocess")
    if options.moe_a2a_overlap and "mlp" in scope:
        return ("--moe-a2a-overlap with a per-layer mlp graph is refused by Megatron-Core "
                "('CUDA graph scope on moe and mlp is not supported with "
                "overlap_moe_expert_parallel_comm'); drop mlp from --cuda-graph-scope")
    if options.moe_a2a_overlap and model.num_mtp_layers > 1:
        return (f"--moe-a2a-overlap supports at most one MTP layer (Megatron-Core: 'MTP supports "
                f"at most one layer when enabling overlap_moe_expert_parallel_comm'); "
                f"{model.name} has {model.num_mtp_layers}")
    return None


@dataclass(frozen=True)
class SettingRefusal:
    """One layout condition of a framework run setting: when ``applies(options)``, a
    configuration whose ``fields`` (``ParallelConfig`` field names, in this order) make
    ``refuses(*values)`` true is illegal, with ``message(options)``; ``axes``: the
    configuration axes the message is about (:class:`Violation`)."""

    fields: tuple[str, ...]
    applies: Callable[[RunOptions], bool]
    refuses: Callable[..., bool]
    message: Callable[[RunOptions], str]
    axes: tuple[str, ...] = ()


#: Every layout condition of the run settings, in the order check reports them.
SETTING_REFUSALS: tuple[SettingRefusal, ...] = (
    SettingRefusal(
        ("ep",), lambda o: o.moe_a2a_overlap, lambda ep: ep == 1,
        lambda o: ("--moe-a2a-overlap needs ep > 1 (Megatron-Core: "
                   "'overlap_moe_expert_parallel_comm is only supported with expert model "
                   "parallelism')"), ("ep",)),
    SettingRefusal(
        ("pp", "vpp"), lambda o: o.moe_a2a_overlap, lambda pp, vpp: pp > 1 and vpp == 1,
        lambda o: ("--moe-a2a-overlap with pp > 1 needs virtual stages (Megatron-Core: "
                   "'virtual_pipeline_model_parallel_size must be specified when "
                   "pipeline_model_parallel_size > 1'); use vpp > 1"), ("vpp",)),
    SettingRefusal(
        ("recompute",), lambda o: o.per_layer_graphs, lambda rc: rc is Recompute.FULL,
        lambda o: ("full recomputation with per-layer CUDA graphs (--cuda-graph-scope "
                   f"{','.join(o.cuda_graph_scope)}) is refused by Megatron-Core ('full "
                   "recompute is only supported with full iteration CUDA graph'); use selective "
                   "or no recomputation, or full_iteration graphs")),
    SettingRefusal(
        ("recompute",), lambda o: o.moe_a2a_overlap, lambda rc: rc is Recompute.FULL,
        lambda o: ("full recomputation with --moe-a2a-overlap is refused by Megatron-Core "
                   "('disable full recomputation when enabling overlap_moe_expert_parallel_comm'"
                   "); use selective or no recomputation")),
    SettingRefusal(
        ("recompute", "recompute_modules"), lambda o: o.moe_a2a_overlap,
        lambda rc, mods: rc is Recompute.SELECTIVE and "moe" in mods,
        lambda o: ("the moe recompute module with --moe-a2a-overlap is refused by Megatron-Core "
                   "('disable moe in recompute_modules when enabling "
                   "overlap_moe_expert_parallel_comm'); drop it")),
    SettingRefusal(
        ("dispatcher",), lambda o: o.moe_a2a_overlap, lambda d: d is Dispatcher.ALLGATHER,
        lambda o: ("--moe-a2a-overlap needs the alltoall or flex dispatcher (Megatron-Core: "
                   "'overlap_moe_expert_parallel_comm is supported with alltoall/flex token "
                   "dispatcher')")),
    SettingRefusal(
        ("dispatcher",), lambda o: o.moe_capacity_factor is not None,
        lambda d: d is Dispatcher.FLEX,
        lambda o: ("--moe-token-drop pads expert inputs, which the flex (DeepEP) dispatcher "
                   "refuses (Megatron-Core: 'Flex token dispatcher with deepep backend does not "
                   "support moe_pad_expert_input_to_capacity'); use alltoall")),
)
#: The search axis of each field a refusal reads (``recompute_modules`` is part of the
#: ``recompute`` option).
SETTING_FIELD_AXIS: dict[str, str] = {"ep": "ep", "pp": "pp", "vpp": "vpp",
                                      "recompute": "recompute", "recompute_modules": "recompute",
                                      "dispatcher": "dispatcher"}
#: The search axes the family reads (``FAMILY_AXES``).
SETTING_AXES: tuple[str, ...] = tuple(a for a in AXES if a in SETTING_FIELD_AXIS.values())


def setting_refusals(options: RunOptions) -> tuple[SettingRefusal, ...]:
    """The refusals that apply under ``options`` (none for the defaults)."""
    return tuple(r for r in SETTING_REFUSALS if r.applies(options))


def refused_by_settings(options: RunOptions, **values: Any) -> list[SettingRefusal]:
    """The applicable refusals that ``values`` (``ParallelConfig`` field names) break; a
    refusal reading a field not given is not evaluated."""
    return [r for r in setting_refusals(options)
            if all(f in values for f in r.fields) and r.refuses(*(values[f] for f in r.fields))]


def settings_space_problem(space: Any, options: RunOptions) -> str | None:
    """Why the run settings leave a search space no recomputation option or no dispatcher at
    all (one line: an input error, exit 2), or None. A search checks it before enumerating."""
    for what, values in (
            ("recomputation options", [{"recompute": r.kind, "recompute_modules": r.modules}
                                       for r in space.recompute]),
            ("dispatchers", [{"dispatcher": d} for d in space.dispatcher])):
        if all(refused_by_settings(options, **v) for v in values):
            return (f"the run settings ({options.label()}) leave no {what} in the search "
                    "space; drop one of them or widen the space")
    return None


def run_settings(ctx: RuleContext) -> list[Violation]:
    """What Megatron-Core refuses of this layout under the run's framework settings
    (:data:`SETTING_REFUSALS`)."""
    c, o = ctx.cfg, ctx.settings.options
    return [Violation("run_settings", r.message(o), r.axes)
            for r in refused_by_settings(o, **{f: getattr(c, f) for f in SETTING_FIELD_AXIS})]


def batch(ctx: RuleContext) -> list[Violation]:
    c, gbs = ctx.cfg, ctx.training.global_batch_size
    assert c.dp is not None and c.ga is not None
    per_step = c.mbs * c.dp
    if gbs % per_step:
        lo, hi = gbs // per_step * per_step, (gbs // per_step + 1) * per_step
        near = [x for x in (lo, hi) if x > 0]
        mbs_ok = [b for b in divisors(gbs) if gbs % (b * c.dp) == 0]
        alt = f" or mbs in {fmt_set(mbs_ok)}" if mbs_ok else ""
        return [Violation("batch", f"global batch ({gbs}) is not divisible by mbs x dp "
                          f"({c.mbs} x {c.dp} = {per_step}); choose gbs in {fmt_set(near)}{alt}")]
    if c.mbs * c.ga * c.dp != gbs:
        return [Violation("batch", f"ga ({c.ga}) must equal gbs / (mbs x dp) = {gbs} / "
                          f"{per_step} = {gbs // per_step}")]
    return []


def extra(ctx: RuleContext) -> list[Violation]:
    """The extra hard constraints, each evaluated on the resolved configuration."""
    from tune_cp.solver.constraints import axis_values

    env = axis_values(ctx.cfg)
    out = []
    for con in ctx.constraints:
        if not con.holds(env):
            out.append(Violation("extra", f"constraint '{con.expr}' does not hold: "
                                 f"{con.describe(env)}", con.axes))
    return out


def recompute_dominance(ctx: RuleContext) -> list[Violation]:
    """Search only: recomputation only costs time. Any recompute option is dominated when the
    search also tries no recomputation (``ctx.recompute_none_option``) and that fits; full block
    recompute of K layers per virtual stage is dominated when a smaller K of the search's domain
    (``ctx.full_recompute_layers``) fits."""
    c = ctx.cfg
    if c.recompute is Recompute.NONE:
        return []
    limit = ctx.limit_bytes
    if ctx.recompute_none_option:
        none = c.model_copy(update={"recompute": Recompute.NONE, "recompute_layers": None})
        peak = memory_report(ctx.model, ctx.cluster, ctx.training, none, ctx.overheads)
        if peak.peak_bytes <= limit:
            return [Violation("recompute_dominance", f"{c.recompute.value} recomputation is "
                              f"dominated: no recomputation already fits ({gib(peak.peak_bytes)} "
                              f"of {gib(limit)}); recomputation only costs time", ("recompute",))]
    if (c.recompute is not Recompute.FULL or c.recompute_method is not RecomputeMethod.BLOCK
            or c.recompute_layers is None):
        return []
    for k in sorted(x for x in ctx.full_recompute_layers if x < c.recompute_layers):
        smaller = c.model_copy(update={"recompute_layers": k})
        peak = memory_report(ctx.model, ctx.cluster, ctx.training, smaller, ctx.overheads)
        if peak.peak_bytes <= limit:
            return [Violation("recompute_dominance", f"full recompute of {c.recompute_layers} "
                              f"layers per virtual stage is dominated: {k} already fits "
                              f"({gib(peak.peak_bytes)} of {gib(limit)}); more recomputation only "
                              f"costs time", ("recompute_layers",))]
    return []


GROUP_HINTS = {
    "model_state": "shard the model state further (more pp, ep or tp, the distributed optimizer "
                   "or FSDP) or add nodes",
    "activations": "recompute more (full recompute), a smaller micro-batch, or more tp/cp/pp",
    "runtime": "lower the runtime overheads (--overhead) or use a GPU with more HBM",
}
#: The model-state hint when Transformer Engine's FP8 copies of bf16 parameters decide under
#: FSDP (``oracle/memory.py::fsdp_fp8_fractions``: every layer's copy stays whole).
FSDP_FP8_CACHE_HINT = ("use FP8 parameters (--fp8-param-gather; Megatron-Bridge's FP8 recipes "
                       "set it): under FSDP, Transformer Engine keeps the FP8 copy of every "
                       "bf16-parameter layer whole on each GPU, FP8 parameters are sharded")
#: The activations hint when the run settings refuse full recomputation (per-layer CUDA graphs,
#: the MoE all-to-all overlap: :data:`SETTING_REFUSALS`).
NO_FULL_RECOMPUTE_HINT = ("recompute more (selective modules: the run settings refuse full "
                          "recompute), a smaller micro-batch, or more tp/cp/pp")


def hbm(ctx: RuleContext) -> list[Violation]:
    mem = ctx.memory
    limit = ctx.limit_bytes
    if mem.peak_bytes <= limit:
        return []
    group = mem.dominant_group
    terms = [t for t in TERM_GROUPS[group] if mem.peak.terms[t]]
    parts = ", ".join(f"{t} {gib(mem.peak.terms[t])}" for t in terms)
    name = group.replace("_", " ")
    hint = (NO_FULL_RECOMPUTE_HINT if group == "activations"
            and refused_by_settings(ctx.settings.options, recompute=Recompute.FULL)
            else GROUP_HINTS[group])
    if (mem.dominant_term == "fp8_weight_cache" and ctx.cfg.fsdp
            and not ctx.cfg.fp8_param_gather):
        hint = FSDP_FP8_CACHE_HINT
    return [Violation("hbm", f"stage {mem.peak_stage} needs {gib(mem.peak_bytes)} but the limit "
                      f"is {gib(limit)} ({gib(mem.hbm_bytes)} HBM of {ctx.cluster.gpu.name} x "
                      f"(1 - {ctx.memory_margin:g} margin)); {name} dominates ({parts}): "
                      f"{hint}")]


#: Families in check order. ``batch`` and ``hbm`` need the earlier ones to hold to be meaningful.
#: The order is also the order of the sequential removal counts of a search.
RULES: dict[str, Callable[[RuleContext], list[Violation]]] = {
    "world_size": world_size,
    "tensor_parallel": tensor_parallel,
    "scale_up": scale_up,
    "expert_layout": expert_layout,
    "expert_tensor_parallel": expert_tensor_parallel,
    "sequence_parallel": sequence_parallel,
    "sequence_length": sequence_length,
    "pipeline_split": pipeline_split,
    "virtual_pipeline": virtual_pipeline,
    "schedule": schedule,
    "recompute": recompute,
    "precision": precision,
    "dispatcher": dispatcher,
    "moe_backend": moe_backend,
    "run_settings": run_settings,
    "batch": batch,
    "extra": extra,
    "recompute_dominance": recompute_dominance,
    "hbm": hbm,
}
#: Families that depend on the layout only (checked before ``batch``, ``extra`` and ``hbm``).
STRUCTURAL = tuple(RULES)[: tuple(RULES).index("batch")]
#: Families a search applies that are preferences, not legality: ``tune-cp check`` skips them.
SEARCH_ONLY = ("recompute_dominance",)
#: What makes a configuration legal.
LEGALITY = tuple(r for r in RULES if r not in SEARCH_ONLY)

#: Search axes (``solver/space.AXES``) each family reads, besides the model, cluster and training
#: spec. dp and ga are derived from tp, pp, cp (and mbs). ``extra`` reads the axes its
#: constraints name; ``recompute_dominance`` and ``hbm`` read every axis.
ALL_AXES: tuple[str, ...] = AXES
FAMILY_AXES: dict[str, tuple[str, ...]] = {
    "world_size": ("tp", "pp", "cp"),
    "tensor_parallel": ("tp",),
    "scale_up": ("tp", "etp"),
    "expert_layout": ("pp", "ep", "etp"),
    "expert_tensor_parallel": ("etp",),
    "sequence_parallel": ("tp",),
    "sequence_length": ("tp", "cp"),
    "pipeline_split": ("pp", "vpp", "pipeline_split"),
    "virtual_pipeline": ("tp", "pp", "cp", "vpp", "mbs", "schedule"),
    "schedule": ("pp", "vpp", "schedule", "recompute"),
    "recompute": ("pp", "vpp", "pipeline_split", "recompute", "fp8_recipe"),
    "precision": ("fp8_recipe",),
    "dispatcher": ("ep", "dispatcher"),
    "moe_backend": ("dispatcher",),
    "run_settings": SETTING_AXES,
    "batch": ("tp", "pp", "cp", "mbs"),
    "extra": (),  # the axes the constraints name (see solver.constraints.HardConstraint.axes)
    "recompute_dominance": ALL_AXES,
    "hbm": ALL_AXES,
}


def register_rule(name: str, rule: Callable[[RuleContext], list[Violation]],
                  axes: tuple[str, ...]) -> None:
    """Add a structural family (checked before ``batch``) that reads ``axes``: what a test does
    to show that a new family is one function here (the CP-SAT model encodes a family of
    integer axes from the rule itself: ``solver/model.py::encode_from_rule``). Call it before
    the solver's other modules are imported (they read :data:`RULES` at import)."""
    global RULES, STRUCTURAL, LEGALITY
    items = list(RULES.items())
    at = tuple(RULES).index("batch")
    RULES = dict([*items[:at], (name, rule), *items[at:]])
    STRUCTURAL = tuple(RULES)[: tuple(RULES).index("batch")]
    LEGALITY = tuple(r for r in RULES if r not in SEARCH_ONLY)
    FAMILY_AXES[name] = axes


def check(ctx: RuleContext, families: Iterable[str] | None = None) -> list[Violation]:
    """All violations of the given families (default: :data:`LEGALITY`). ``hbm`` is evaluated
    only when every earlier family holds: memory of a configuration that cannot exist is not
    meaningful. ``batch`` is skipped when the world size does not decompose."""
    wanted = list(LEGALITY) if families is None else [f for f in RULES if f in set(families)]
    out: list[Violation] = []
    for name in wanted:
        if name == "batch" and any(v.rule == "world_size" for v in out):
            continue
        if name in ("hbm", "recompute_dominance") and out:
            continue
        out.extend(RULES[name](ctx))
    if ctx.cfg.etp_ == ctx.cfg.tp and any("tp" in v.axes for v in out):
        # etp defaults to tp: a message about etp alone repeats the one about tp
        out = [v for v in out if v.axes != ("etp",)]
    return out
