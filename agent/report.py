"""The search report as text (``render_search``); the same facts as JSON are
``agent/serialize.py::search_json``."""

from __future__ import annotations

import shlex

from tune_cp.agent.evaluate import Trial
from tune_cp.agent.llm import LlmReport
from tune_cp.agent.search import SearchResult
from tune_cp.config.specs import (
    GIB,
    SLOT_SPLITS,
    ClusterSpec,
    Dispatcher,
    FlexBackend,
    GroupedGemm,
    ModelSpec,
    ParallelConfig,
    PipelineSplit,
    Recompute,
    Schedule,
    TrainingSpec,
)
from tune_cp.oracle.memory import TERMS, split_label
from tune_cp.oracle.memory_verdict import MemoryState, legal_state, memory_state
from tune_cp.oracle.uncertainty import band_text, bias_notes
from tune_cp.solver.settings import RunSettings
from tune_cp.solver.space import OptimizerChoice

# ------------------------------------------------------------------------------ text


def recompute_label(c: ParallelConfig) -> str:
    if c.recompute is Recompute.FULL:
        n = "all" if c.recompute_layers is None else str(c.recompute_layers)
        return f"full {n}" + ("" if c.recompute_method.value == "block" else " unif")
    if c.recompute is Recompute.SELECTIVE:
        return "sel " + "+".join(c.recompute_modules)
    return "none"


def short_layout(c: ParallelConfig) -> str:
    s = f"TP{c.tp} PP{c.pp}"
    if c.vpp > 1:
        s += f" VPP{c.vpp}"
    if c.cp > 1:
        s += f" CP{c.cp}"
    if c.ep > 1 or c.etp_ != c.tp:
        s += f" EP{c.ep} ETP{c.etp_}"
    return s + f" DP{c.dp}" + (" FSDP" if c.fsdp else "")


def variant_label(c: ParallelConfig) -> str:
    light = c.pipeline_split not in (None, *SLOT_SPLITS)
    return f"{short_layout(c)} mbs {c.mbs}" + (
        "" if c.recompute is Recompute.NONE else f" recompute {recompute_label(c)}") + (
        f" {c.pipeline_split.value}" if light and c.pipeline_split is not None else "")


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def render_search(r: SearchResult, timings: bool = False) -> list[str]:
    m, cl, tr = r.model, r.cluster, r.training
    out = [f"search: {m.name} on {cl.num_nodes} x {cl.gpus_per_node} {cl.gpu.name} "
           f"({cl.world_size} GPUs), seq {tr.seq_len}, gbs {tr.global_batch_size}, "
           f"{tr.precision.value}"]
    if r.defaults:
        out.append("defaults: " + "; ".join(r.defaults))
    run = r.options.settings.options.label()  # the framework run settings, when set
    if run:
        out.append(f"run settings: {run}")
    enum = r.enumeration
    removed = ", ".join(f"{k} {v:,}" for k, v in enum.removed.items() if v)
    took = f"{enum.timings.get('total', 0):.1f} s, " if timings else ""
    out.append(f"feasible: {len(enum.configs):,} of {enum.space_size:,} candidates "
               f"(CP-SAT, {took}removed by {removed})")
    if r.options.constraints:
        out.append("constraints: " + ", ".join(c.expr for c in r.options.constraints))
    if OptimizerChoice.FSDP in r.enumeration.problem.space.optimizer:
        out.append("optimizer state: the distributed optimizer and Megatron-FSDP, both searched "
                   "(--fsdp)")
    out.append("")
    b = r.best
    spread0 = r.options.memory_spread  # the run's framework family (RunSettings.framework)
    if r.baseline is not None:
        base = r.baseline
        state = (f"{base.throughput:,.0f} tokens/s/GPU" if base.legal else
                 f"illegal: [{base.outcome.violations[0].rule}] {base.outcome.violations[0].message}")
        out.append(f"baseline: {short_layout(base.config)}, mbs {base.config.mbs}, recompute "
                   f"{recompute_label(base.config)}: {state}")
        out.append(f"  ({r.baseline_source.split(' (')[0]}; --json has the source)")
    peak = b.outcome.memory.peak_bytes if b.outcome.memory else 0
    base_peak = (r.baseline.outcome.memory.peak_bytes
                 if r.baseline is not None and r.baseline.outcome.memory else 0)
    # a slower answer than the baseline is the memory rule's choice: say so
    base_edge = (r.speedup is not None and r.speedup < 1
                 and memory_state(base_peak, cl.gpu.hbm_bytes, spread0)
                 is MemoryState.EDGE
                 and legal_state(peak, cl.gpu.hbm_bytes, spread0) is MemoryState.FITS)
    gain = (f" ({pct(r.speedup - 1)} over the baseline"
            + (", which is at the edge of memory" if base_edge else "") + ")"
            if r.speedup else "")
    # the non-layout settings a seed move can change, when not the default (else the printed
    # best could not be reproduced from this line)
    extra = "".join((
        f", MoE backend: {b.config.backend_label()}" if r.model.is_moe else "",
        f", {b.config.schedule_.value} schedule"
        if b.config.schedule_ is Schedule.ZERO_BUBBLE else "",
        ", replicated optimizer" if not b.config.distributed_optimizer and not b.config.fsdp
        else "",
        f", fp8 {b.config.fp8_recipe.value}" if b.config.fp8_recipe is not None else "",
        f", {split}" if (split := split_label(r.model, b.config)) else ""))
    out.append(f"best: {short_layout(b.config)}, mbs {b.config.mbs}, ga {b.config.ga}, recompute "
               f"{recompute_label(b.config)}{extra}: {b.throughput:,.0f} tokens/s/GPU{gain}, MFU "
               f"{100 * b.projection.mfu:.1f}%, step {b.projection.step_time_s:.2f} s, peak "
               f"{peak / GIB:.1f} of {b.outcome.limit_bytes / GIB:.1f} GiB"
               + (", at the edge of memory" if legal_state(peak, cl.gpu.hbm_bytes, spread0)
                  is not MemoryState.FITS else ""))
    seed_best = r.seed.best if r.seed else None
    found = {"exhaustive": "the exhaustive ranking of the feasible set",
             "seed": "the seed phase (single-axis moves, combined)",
             "llm": "the LLM phase"}[r.best_phase]
    regret = f"; the agent's best is {100 * r.regret:.1f}% below the oracle's optimum" if r.regret is not None else ""
    out.append(f"  found by {found}{regret}")
    if r.interval is not None:
        out.append(f"  interval: {r.interval.text()}")
    out.append(f"  rule: {r.rule}")
    if r.check_command:
        out.append(f"  check it: {r.check_command}")
    if legal_state(peak, cl.gpu.hbm_bytes, spread0) is MemoryState.EDGE \
            and r.ranked.configs:
        from tune_cp.agent.search import choose_answer, memory_fits

        fits = memory_fits(r.ranked, cl.gpu.hbm_bytes, spread0)
        if fits.any():
            j = choose_answer(r.ranked, fits, float("inf"))  # the best that fits
            c = r.ranked.configs[j]
            out.append(f"  at the edge of memory: the best configuration that fits is "
                       f"{short_layout(c)}, mbs {c.mbs}, recompute {recompute_label(c)}: "
                       f"{float(r.ranked.tokens[j]):,.0f} tokens/s/GPU, peak "
                       f"{r.ranked.peak_bytes[j] / GIB:.1f} GiB (the answer's lower bound is "
                       f"more than the near-tie band above it)")
        else:
            out.append("  at the edge of memory: no configuration of the space fits at the "
                       "largest measured overhead")
    fastest = int(r.ranked.order[0])
    if r.answer_index is not None and fastest != r.answer_index and r.ranked.intervals:
        c = r.ranked.configs[fastest]
        iv = r.ranked.intervals[fastest]
        out.append(f"  the oracle's fastest is {short_layout(c)}, mbs {c.mbs}, recompute "
                   f"{recompute_label(c)}: {iv.projected:,.0f} tokens/s/GPU "
                   f"({iv.low:,.0f}-{iv.high:,.0f}, class {iv.used.key}"
                   + (f", {iv.bias_text()}" if iv.bias is not None else "") + "); "
                   + ("it is at the edge of memory (it may not fit): the answer is the best "
                      "configuration that fits"
                      if legal_state(int(r.ranked.peak_bytes[fastest]), cl.gpu.hbm_bytes,
                                      spread0) is not MemoryState.FITS
                      and legal_state(peak, cl.gpu.hbm_bytes, spread0)
                      is MemoryState.FITS
                      else "its lower bound ties with the answer's (within 0.5%): the less "
                      "exotic wins"
                      if r.ranked.lower[fastest] <= r.ranked.lower[r.answer_index] * 1.005 + 1e-9
                      and r.ranked.lower[fastest] >= r.ranked.lower[r.answer_index]
                      else "its lower bound is lower"))
    for note in (b.projection.evidence, b.projection.mfu_note):
        if note:
            out.append(f"  note: {note}")
    if seed_best is not None and seed_best.legal and r.best_phase != "seed":
        out.append(f"  seed phase reached {seed_best.throughput:,.0f} tokens/s/GPU with "
                   f"{', '.join(s.move for s in r.seed.steps) or 'no improving move'}")
    if r.attribution:
        out.append("  gain by change (path from the baseline):")
        for s in r.attribution:
            out.append(f"    {s.move:56} {pct(s.gain):>8}  ({s.before:,.0f} -> {s.after:,.0f})")
    for p in r.preference_costs:
        cost = p["cost"]
        out.append(f"  preference {p['condition']} (weight {p['weight']:g}, {p['origin']}): costs "
                   f"{100 * cost:.1f}% of the best projected throughput" if cost is not None else "")
    out.extend(render_llm(r.llm))
    out.append("")
    nconf = sum(len(g.members) for g in r.groups)
    # a best from the seed or LLM phase lies outside the ranked space (e.g. the flex dispatcher):
    # the starred row is then the ranking's answer, not the best printed above
    star, near = ("answer", "answer") if r.best_phase == "exhaustive" else (
        f"ranking's answer (the best above, from {found.split(' (')[0]}, is not among the "
        f"ranked configurations)", "ranking's answer")
    out.append(f"top {len(r.groups)} distinct configurations of {len(enum.configs):,} "
               f"({nconf} configurations; projections within 0.1% are one row, variants below "
               f"it; * the {star}, ~ a near tie: within {100 * r.near_tie_band:.1f}% of the "
               f"{near}, the median error of the projected ratio of two published runs):")
    head = (f"{'#':>4}  {'layout':32} {'mbs':>3} {'ga':>4} {'recompute':10} {'peak GiB':>9} "
            f"{'HBM':>5} {'tok/s/GPU':>10} {'80% interval':>15} {'MFU':>6} {'step s':>7} memory")
    out.append(head)
    s = r.ranked.scores
    hbm = cl.gpu.hbm_bytes / GIB
    spread = r.options.memory_spread
    edges = 0
    def row(rank: str, mark: str, i: int) -> bool:
        """One table row of configuration ``i``; returns whether it is at the edge of memory."""
        c = r.ranked.configs[i]
        iv = r.ranked.intervals[i] if r.ranked.intervals else None
        band = band_text(iv.low, iv.high, iv.bias is not None) if iv else ""
        edge = legal_state(int(r.ranked.peak_bytes[i]), cl.gpu.hbm_bytes,
                           spread) is not MemoryState.FITS
        out.append(f"{rank:>3}{mark}  {short_layout(c):32} {c.mbs:>3} {c.ga:>4} "
                   f"{recompute_label(c):10} {r.ranked.peak_bytes[i] / GIB:>9.1f} {hbm:>5.0f} "
                   f"{s['tokens_per_s_per_gpu'][i]:>10,.0f} {band:>15} "
                   f"{100 * s['mfu'][i]:>5.1f}% {s['step_time_s'][i]:>7.2f} "
                   f"{'edge' if edge else 'fits'}")
        return edge

    for rank, g in enumerate(r.groups, 1):
        edges += row(str(rank), "*" if g.answer else "~" if g.near_tie else " ", g.head)
        if g.variants:
            shown = [variant_label(r.ranked.configs[v]) for v in g.variants[:6]]
            more = f", +{len(g.variants) - 6} more" if len(g.variants) > 6 else ""
            out.append(f"      = {', '.join(shown)}{more}")
    if r.answer_index is not None and r.groups and not any(g.answer for g in r.groups):
        # the answer ranks below the rows shown (faster configurations are at the edge of
        # memory): its own row, numbered by its place in the ranking of every configuration
        place = [int(x) for x in r.ranked.order].index(r.answer_index) + 1
        out.append(f"  ... the answer, configuration {place:,} of the ranking by projection (the "
                   f"rule picks by memory verdict, then lower bound):")
        row(f"{place}", "*", r.answer_index)
    if edges:
        out.append(f"  memory edge: legal, but above {hbm / spread.high:.1f} GiB ({hbm:.0f} GiB "
                   f"HBM / {spread.high:.2f}), where "
                   f"{spread.text()}: it may not fit (oracle/memory_verdict.py; `tune-cp check` "
                   f"names the deciding term and the cheapest change that gives room)")
    classes = sorted({r.ranked.intervals[g.head].used.key for g in r.groups}
                     if r.ranked.intervals else set())
    if classes:
        out.append("  intervals: 10th-90th percentile of the out-of-fold residuals of class "
                   + "; ".join(classes) + " (oracle/catalog/residuals.json)")
        out.extend("  " + n for n in bias_notes([r.ranked.intervals[g.head].bias_text()
                                                 for g in r.groups]))
    out.append("")
    out.extend(render_best_memory(b))
    if timings:
        out.append("timings: " + ", ".join(f"{k} {v:.2f}" for k, v in r.timings.items()))
    return out


def render_llm(llm: LlmReport) -> list[str]:
    """The LLM phase as text: its status, then per round what the planner proposed that was
    accepted (as constraints, preferences), what was rejected and why, and what each narrowed
    set gave (the same facts as ``--json``'s ``llm.rounds``: ``agent/serialize.py::llm_json``)."""
    head = f"LLM phase: {llm.status}"
    about = [x for x in (llm.model, f"{llm.calls} LM call{'s' * (llm.calls != 1)}"
                         if llm.status != "skipped" else "", llm.reason) if x]
    out = [head + (f" ({'; '.join(about)})" if about else "")]
    for rnd in llm.rounds:
        if rnd.error is not None:  # said once: in the head's reason when it ended the phase
            if rnd.error not in llm.reason:
                out.append(f"  round {rnd.index}: no hints (the LM failed: {rnd.error})")
            continue
        if not (rnd.accepted or rnd.rejected or rnd.results):
            out.append(f"  round {rnd.index}: the planner proposed nothing")
            continue
        out.append(f"  round {rnd.index}: accepted "
                   + ("; ".join(rnd.accepted) if rnd.accepted else "nothing"))
        for why in rnd.rejected:
            out.append(f"    rejected {why}")
        for res in rnd.results:
            out.append(f"    tried {res['summary']}")
    for w in llm.warnings:
        if w != llm.reason:
            out.append(f"  warning: {w}")
    return out


def render_best_memory(t: Trial) -> list[str]:
    mem = t.outcome.memory
    if mem is None:
        return []
    peak = mem.peak
    lines = [f"memory of the best, most loaded stage {mem.peak_stage} of {len(mem.stages)} "
             f"(GiB): " + ", ".join(f"{k} {peak.terms[k] / GIB:.1f}" for k in TERMS
                                    if peak.terms[k] >= GIB // 100)]
    lines.append(f"  total {peak.total_bytes / GIB:.1f} GiB of {mem.hbm_bytes / GIB:.0f} GiB HBM "
                 f"(limit {t.outcome.limit_bytes / GIB:.1f} GiB); `tune-cp check` with this "
                 f"configuration prints every stage")
    if t.projection is not None:
        p = t.projection
        parts = sorted(((v, k) for k, v in p.breakdown.items() if v > 0), reverse=True)[:5]
        lines.append("where the step goes: " + ", ".join(
            f"{k} {100 * v / p.step_time_s:.0f}%" for v, k in parts))
    return lines


# ------------------------------------------------------------------- the answer's check line


def _number(x: float) -> str:
    """A float as the shortest text that reads back as the same float (``repr``), an integral
    one without its ``.0``."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def input_argument(given: str, name: str, kind: str) -> str:
    """What a ``--model`` / ``--gpu`` argument is written as in a command line tune-cp prints:
    the catalog name when ``given`` names a catalog entry (its alias resolved), else the file
    path as given."""
    from tune_cp.oracle.catalog import catalog_alias, gpu_entries, model_entries

    entries = model_entries() if kind == "model" else gpu_entries()
    if catalog_alias(given, kind) is not None or given.strip().lower() in entries:
        return name
    return given


def check_command(model_arg: str, gpu_arg: str, model: ModelSpec, cluster: ClusterSpec,
                  training: TrainingSpec, cfg: ParallelConfig, settings: RunSettings) -> str:
    """The ``tune-cp check`` line of ``cfg`` (a resolved configuration) under these specs and
    run settings: run as it is, ``check`` finds the same configuration, peak memory and
    projection (``tests/test_cli_search.py::test_check_line_reproduces_the_answer``).

    Every layout axis is written (tp, pp, vpp, cp, ep and etp for an MoE model, mbs,
    recomputation); a setting only when it differs from what ``check`` derives or defaults to
    (sequence parallel on at tp > 1, the schedule from vpp, the automatic pipeline split, the
    distributed optimizer, fp32 gradients), so the line stays readable. The training flags are
    all written, and the run settings that are not their defaults (``--memory-margin``,
    ``--overhead``, ``--allow-cross-scale-up``, ``--calibration``, ``--framework`` when its
    memory spread is not the default family's, the framework run settings).
    ``--constraint`` is not written: a constraint restricts the search, the answer satisfies
    it, and a check's figures do not depend on it. ``model_arg`` / ``gpu_arg``: the catalog
    name or the file path the run was given."""
    from tune_cp.config.axes import KNOB, PLAIN_AXES
    from tune_cp.config.specs import (
        auto_pipeline_split,
        given_pipeline_split,
        resolved_flex_backend,
    )
    from tune_cp.oracle.memory import OVERHEAD_NAMES, MemoryOverheads
    from tune_cp.oracle.memory_verdict import DEFAULT_FAMILY
    from tune_cp.solver.defaults import DEFAULT_MEMORY_MARGIN

    args: list[tuple[str, object]] = [
        ("--model", model_arg), ("--gpu", gpu_arg), ("--nodes", cluster.num_nodes),
        ("--gpus-per-node", cluster.gpus_per_node), ("--seq-len", training.seq_len),
        ("--gbs", training.global_batch_size), ("--precision", training.precision.value)]

    def flag(field: str, value: object = None) -> None:
        args.append((f"--{KNOB[field].flag}", value))

    for name in ("tp", "pp", "vpp", "cp"):
        flag(name, getattr(cfg, name))
    if cfg.ep > 1 or cfg.etp_ != cfg.tp:
        flag("ep", cfg.ep)
        flag("etp", cfg.etp_)
    flag("mbs", cfg.mbs)
    flag("recompute", cfg.recompute.value)
    if cfg.recompute is Recompute.FULL:
        flag("recompute_method", cfg.recompute_method.value)
        if cfg.recompute_layers is not None:
            flag("recompute_layers", cfg.recompute_layers)
    if cfg.recompute is Recompute.SELECTIVE:
        flag("recompute_modules", ",".join(cfg.recompute_modules))
    if cfg.sp != (cfg.tp > 1):
        args.append(("--no-sequence-parallel" if not cfg.sp else "--sequence-parallel", None))
    if cfg.dispatcher is not Dispatcher.ALLTOALL:
        flag("dispatcher", cfg.dispatcher.value)
    if model.is_moe:  # the MoE backend, where it is not what check would resolve by default
        default_fb = resolved_flex_backend(cfg.model_copy(update={"flex_backend": None}),
                                           cluster.gpu)
        if cfg.flex_backend is not None and cfg.flex_backend is not default_fb:
            flag("flex_backend", cfg.flex_backend.value)
        if cfg.sync_free_stage:
            flag("sync_free_stage", cfg.sync_free_stage)
        if cfg.grouped_gemm is not GroupedGemm.TE:
            flag("grouped_gemm", cfg.grouped_gemm.value)
        if cfg.permute_fusion and cfg.sync_free_stage < 1:
            flag("permute_fusion")
        if cfg.shared_expert_overlap:
            flag("shared_expert_overlap")
        if cfg.router_fp32 is not None and cfg.router_fp32 != (default_fb is FlexBackend.TURBO):
            args.append(("--router-fp32" if cfg.router_fp32 else "--no-router-fp32", None))
    if cfg.schedule_ is not (Schedule.INTERLEAVED if cfg.vpp > 1 else Schedule.ONE_F_ONE_B):
        flag("schedule", cfg.schedule_.value)
    if cfg.fp8_recipe is not None:
        flag("fp8_recipe", cfg.fp8_recipe.value)
    if cfg.fsdp:
        flag("fsdp")
    elif not cfg.distributed_optimizer:
        flag("distributed_optimizer")  # --no-distributed-optimizer
    if not cfg.grad_reduce_in_fp32:
        flag("grad_reduce_in_fp32")  # --grad-reduce-in-bf16
    if cfg.fp8_param_gather:
        flag("fp8_param_gather")
    for name in PLAIN_AXES:  # the registry's plain axes, when not their default
        if getattr(cfg, name) != KNOB[name].default:
            flag(name, getattr(cfg, name))
    state = cfg.optimizer_state
    if state.precision_aware:  # the precision-aware optimizer's dtypes (cli.py)
        args.append(("--use-precision-aware-optimizer", None))
        for name in ("main_params", "exp_avg", "exp_avg_sq"):
            if getattr(state, name).value != "fp32":
                args.append((f"--{name.replace('_', '-')}-dtype", getattr(state, name).value))
    split = given_pipeline_split(cfg)
    if cfg.pipeline_layout is not None:
        flag("pipeline_layout", cfg.pipeline_layout)
    elif split is PipelineSplit.UNEVEN:
        flag("pipeline_split", split.value)
        for name in ("first_stage_layers", "last_stage_layers"):
            if getattr(cfg, name) is not None:
                flag(name, getattr(cfg, name))
    elif split is not None and split is not auto_pipeline_split(model, cfg.pp, cfg.vpp):
        flag("pipeline_split", split.value)
    if settings.memory_margin != DEFAULT_MEMORY_MARGIN:
        args.append(("--memory-margin", _number(settings.memory_margin)))
    default = MemoryOverheads()
    for name in OVERHEAD_NAMES:
        value = getattr(settings.overheads, name)
        if value != getattr(default, name):
            text = (str(value).lower() if isinstance(value, bool) else
                    str(value) if isinstance(value, int) else _number(value))
            args.append(("--overhead", f"{name}={text}"))
    if settings.allow_cross_scale_up:
        args.append(("--allow-cross-scale-up", None))
    if settings.calibration is not None:
        args.append(("--calibration", settings.calibration))
    # the framework's memory spread decides the verdict: written when it is not the default
    # family's (torchtitan); a Megatron-family framework's defaults are all written above as
    # flags, and --framework bridge would give FP8 parameters to an --allow-fp8 answer of a
    # bf16 search, which the search did not
    if settings.framework is not None and settings.memory_family != DEFAULT_FAMILY:
        args.append(("--framework", settings.framework))
    run = settings.options
    if run.cuda_graph_scope:
        args.append(("--cuda-graph-scope", ",".join(run.cuda_graph_scope)))
    if run.moe_a2a_overlap:
        args.append(("--moe-a2a-overlap", None))
    if run.moe_capacity_factor is not None:
        args.append(("--moe-token-drop", _number(run.moe_capacity_factor)))
    return "tune-cp check " + " ".join(
        name if value is None else f"{name} {shlex.quote(str(value))}" for name, value in args)
