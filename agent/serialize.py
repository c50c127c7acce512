"""Every JSON shape tune-cp prints or writes for a check, a search, a plan or a sweep, in one
module: ``check --json``, ``search --json``, ``--trials-out`` lines, ``plan --json``,
``models --json`` and the sweep's settings (its digest). The classes they describe hold data
only; the shapes are here. The oracle's own files (the calibration table, the residuals, the
refit report, a parsed training log) keep their readers and writers beside them in ``oracle/``
and ``formats/logs.py``.

Light on purpose (the CLI imports it at start-up): the specs and the parameter counts, nothing
that loads numpy, OR-Tools or DSPy.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tune_cp.config.axes import CONFIG_COLUMNS, KNOB, shown_value
from tune_cp.config.specs import (
    ClusterSpec,
    ModelSpec,
    ParallelConfig,
    TrainingSpec,
    compute_precision,
)
from tune_cp.oracle import params as P

if TYPE_CHECKING:
    from tune_cp.agent.evaluate import Trial
    from tune_cp.agent.llm import LlmReport, LlmRound
    from tune_cp.agent.plan import GpuPlan, PlanPoint
    from tune_cp.agent.search import SearchResult
    from tune_cp.agent.seed import Step
    from tune_cp.agent.sweep import Settings
    from tune_cp.oracle.memory import MemoryReport
    from tune_cp.solver.check import CheckOutcome


def strict_json(data: Any) -> Any:
    """``data`` with every non-finite float (NaN, infinities) replaced by ``null``, so that
    ``--json`` output is always strict JSON (RFC 8259 has no NaN/Infinity)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: strict_json(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [strict_json(v) for v in data]
    return data


# ------------------------------------------------------------------------- specs, check


def model_json(m: ModelSpec) -> dict[str, Any]:
    """A model with its parameter counts (``models --json``, ``check --json``)."""
    return {"name": m.name, "total_params": P.total_params(m),
            "active_params": P.active_params(m), **m.model_dump(mode="json", exclude={"name"})}


def cluster_json(c: ClusterSpec) -> dict[str, Any]:
    return {"gpu": c.gpu.name, "num_nodes": c.num_nodes, "gpus_per_node": c.gpus_per_node,
            "world_size": c.world_size, "hbm_bytes": c.gpu.hbm_bytes}


def config_json(cfg: ParallelConfig, training: TrainingSpec) -> dict[str, Any]:
    """The configuration keys shared by ``check --json`` and the search's ``best``: the
    registry's columns (``config/axes.py::CONFIG_COLUMNS``), in its order."""
    derived: dict[str, Any] = {
        "dp": cfg.dp, "ga": cfg.ga, "gbs": training.global_batch_size,
        "seq_len": training.seq_len, "precision": compute_precision(training, cfg).value,
        # the precision-aware optimizer's dtypes, only when set (older answers unchanged)
        "optimizer_state": (None if cfg.optimizer_state.is_default
                            else cfg.optimizer_state.model_dump(mode="json")),
    }
    out: dict[str, Any] = {}
    for col in CONFIG_COLUMNS:
        if not col.derived:
            out[col.name] = shown_value(cfg, KNOB[col.name])
        elif (value := derived[col.name]) is not None or col.name != "optimizer_state":
            out[col.name] = value
    return out


def memory_json(report: MemoryReport | None, limit: int, margin: float) -> dict[str, Any] | None:
    if report is None:
        return None
    return {
        "stages": [
            {
                "stage": s.stage,
                "decoder_layers": s.decoder_layers,
                "terms": dict(s.terms),
                "total_bytes": s.total_bytes,
            }
            for s in report.stages
        ],
        "peak_stage": report.peak_stage,
        "peak_bytes": report.peak_bytes,
        "hbm_bytes": report.hbm_bytes,
        "memory_margin": margin,
        "limit_bytes": limit,
        "headroom_bytes": limit - report.peak_bytes,
        "fits": report.peak_bytes <= limit,
        "dominant_term": report.dominant_term,
        "dominant_group": report.dominant_group,
    }


def violations_json(outcome: CheckOutcome) -> list[dict[str, str]]:
    return [{"rule": v.rule, "message": v.message} for v in outcome.violations]


def check_json(outcome: CheckOutcome) -> dict[str, Any]:
    """Legality, violations, configuration and memory of one check."""
    return {
        "legal": outcome.legal,
        "violations": violations_json(outcome),
        "config": config_json(outcome.ctx.cfg, outcome.ctx.training),
        "memory": memory_json(outcome.memory, outcome.limit_bytes, outcome.ctx.memory_margin),
    }


# ------------------------------------------------------------------------------ search


def trial_line(t: Trial) -> dict[str, Any]:
    """One judged candidate as a ``--trials-out`` line."""
    return {
        "phase": t.phase,
        "label": t.label,
        "config": config_json(t.config, t.outcome.ctx.training),
        "legal": t.legal,
        "violations": violations_json(t.outcome),
        "peak_bytes": t.outcome.memory.peak_bytes if t.outcome.memory else None,
        "tokens_per_s_per_gpu": t.throughput if t.legal else None,
    }


def ranking_lines(result: SearchResult) -> Iterator[dict[str, Any]]:
    """The exhaustive ranking as ``--trials-out`` lines, best first (after the judged trials)."""
    ranked, training = result.ranked, result.training
    for rank, i in enumerate(ranked.order.tolist(), start=1):
        yield {"phase": "exhaustive ranking", "label": f"rank {rank}",
               "config": config_json(ranked.configs[i], training), "legal": True,
               "violations": [], "peak_bytes": int(ranked.peak_bytes[i]),
               "tokens_per_s_per_gpu": float(ranked.tokens[i]),
               "adjusted_tokens_per_s_per_gpu": float(ranked.adjusted[i]), "rank": rank} | (
                   {"interval": ranked.intervals[i].to_json()} if ranked.intervals else {})


def trial_json(t: Trial) -> dict[str, Any]:
    """A candidate with the configuration keys of ``check --json``, its projection and memory."""
    out = config_json(t.config, t.outcome.ctx.training)
    out["projection"] = t.projection.model_dump() if t.projection else None
    out["memory"] = memory_json(t.outcome.memory, t.outcome.limit_bytes,
                                t.outcome.ctx.memory_margin)
    out["legal"] = t.legal
    out["violations"] = violations_json(t.outcome)
    return out


def step_json(s: Step) -> dict[str, Any]:
    return {"change": s.move, "phase": s.phase, "tokens_per_s_per_gpu_before": s.before,
            "tokens_per_s_per_gpu_after": s.after, "gain": s.gain}


def llm_round_json(r: LlmRound) -> dict[str, Any]:
    return {"round": r.index, "hints": r.hints, "accepted": r.accepted,
            "rejected": r.rejected, "results": r.results, "error": r.error}


def llm_json(r: LlmReport) -> dict[str, Any]:
    return {"status": r.status, "reason": r.reason, "model": r.model,
            "calls": r.calls, "rounds": [llm_round_json(x) for x in r.rounds],
            "warnings": r.warnings}


def _breakdown_keys(scores: dict[str, Any]) -> list[str]:
    from tune_cp.oracle.timing import BREAKDOWN

    return [k for k in BREAKDOWN if k in scores]


def memory_verdict_json(r: SearchResult, peak_bytes: int, cfg: ParallelConfig) -> dict[str, Any]:
    """A searched configuration's memory verdict (``oracle/memory_verdict.py``) under the run's
    framework family (``RunSettings.memory_spread``): ``state`` and the term that decides it,
    ``deciding_term`` (the largest term of the most loaded stage, as ``check`` names it: its
    memory report, ``oracle/memory.py::memory_report``)."""
    from tune_cp.oracle.memory import memory_report
    from tune_cp.oracle.memory_verdict import legal_state

    report = memory_report(r.model, r.cluster, r.training, cfg, r.options.overheads)
    return {"state": legal_state(peak_bytes, r.cluster.gpu.hbm_bytes,
                                  r.options.memory_spread).value,
            "deciding_term": report.dominant_term}


def ranked_row(r: SearchResult, i: int) -> dict[str, Any]:
    cfg = r.ranked.configs[i]
    row = config_json(cfg, r.training)
    s = r.ranked.scores
    row["projection"] = {
        "step_time_s": float(s["step_time_s"][i]),
        "tokens_per_s_per_gpu": float(s["tokens_per_s_per_gpu"][i]),
        "model_tflops_per_gpu": float(s["model_tflops_per_gpu"][i]),
        "mfu": float(s["mfu"][i]),
        "breakdown": {k: float(s[k][i]) for k in _breakdown_keys(s)},
    }
    row["memory"] = {"peak_bytes": int(r.ranked.peak_bytes[i]),
                     "hbm_bytes": r.cluster.gpu.hbm_bytes,
                     "limit_bytes": r.best.outcome.limit_bytes,
                     **memory_verdict_json(r, int(r.ranked.peak_bytes[i]), cfg)}
    row["score"] = float(r.ranked.adjusted[i])
    if r.ranked.intervals:
        row["interval"] = r.ranked.intervals[i].to_json()
    return row


def group_row(r: SearchResult, g: Any) -> dict[str, Any]:
    """A distinct configuration: its head as a ranked row, plus ``variants`` (the members the
    oracle cannot tell apart from it, as ranked rows), ``near_tie`` and ``answer``."""
    row = ranked_row(r, g.head)
    row["variants"] = [ranked_row(r, i) for i in g.variants]
    row["near_tie"] = g.near_tie
    row["answer"] = g.answer
    return row


def run_settings_json(options: Any) -> dict[str, Any]:
    """The framework run settings a check, search or plan ran with
    (:class:`oracle.memory.RunOptions`): CUDA-graph scope (``[]``: none), MoE all-to-all
    overlap, MoE token-drop capacity factor (``null``: dropless)."""
    return {"cuda_graph_scope": list(options.cuda_graph_scope),
            "moe_a2a_overlap": options.moe_a2a_overlap,
            "moe_capacity_factor": options.moe_capacity_factor}


#: The top-level keys of ``search --json``, in order: every outcome (``status`` "ok", "infeasible"
#: or "error") has all of them, those the outcome does not reach null (or empty); their meaning is
#: ``docs/json.md`` (``tests/test_cli_search.py`` holds the outcomes, the doc and this to one set).
SEARCH_KEYS: tuple[str, ...] = (
    "status", "error", "explanation", "infeasibility",
    "model", "cluster", "training", "defaults", "run_settings",
    "best", "check_command", "answer_rule", "near_tie_band", "oracle_best", "top",
    "baseline", "baseline_source", "speedup_vs_baseline",
    "feasible_count", "candidates", "optimizers_searched", "removed_by_rule", "regret",
    "exhaustive_best", "seed_best", "attribution", "seed_moves",
    "constraints", "preferences", "llm",
    "timings", "export", "verify", "pareto",
)
#: The value of each key that an outcome does not reach.
_EMPTY: dict[str, Any] = {k: None for k in SEARCH_KEYS} | {
    "defaults": [], "top": [], "optimizers_searched": [], "removed_by_rule": {},
    "attribution": [], "seed_moves": [],
    "constraints": [], "preferences": [], "feasible_count": 0}


def search_outcome_json(status: str, **values: Any) -> dict[str, Any]:
    """A ``search --json`` document of ``status`` with the keys of :data:`SEARCH_KEYS` in order
    (``values`` sets some; the others keep their empty value)."""
    unknown = set(values) - set(SEARCH_KEYS)
    assert not unknown, f"not search --json keys: {sorted(unknown)}"
    return {k: values.get(k, _EMPTY[k]) for k in SEARCH_KEYS} | {"status": status}


def search_setting_json(model: ModelSpec | None, cluster: ClusterSpec | None,
                        training: TrainingSpec | None) -> dict[str, Any]:
    """The ``model``, ``cluster`` and ``training`` keys (null where not known yet)."""
    return {"model": model.name if model is not None else None,
            "cluster": {"gpu": cluster.gpu.name, "num_nodes": cluster.num_nodes,
                        "gpus_per_node": cluster.gpus_per_node,
                        "world_size": cluster.world_size} if cluster is not None else None,
            "training": training.model_dump(mode="json") if training is not None else None}


def infeasible_search_json(explanation: Any, model: ModelSpec, cluster: ClusterSpec,
                           training: TrainingSpec, defaults: list[str], options: Any,
                           constraints: list[str]) -> dict[str, Any]:
    """``search --json`` when nothing is legal and fits: the explanation as text and as data
    (``solver/explain.py::Explanation``), the setting, the defaults and run settings taken."""
    e = explanation
    return search_outcome_json(
        "infeasible", explanation=e.text(),
        infeasibility={"conflict": list(e.conflict), "min_peak_bytes": e.min_peak_bytes,
                       "min_peak_config": e.min_peak_config, "limit_bytes": e.limit_bytes,
                       "min_nodes": e.min_nodes, "max_nodes": e.max_nodes,
                       "relaxations": list(e.relaxations), "nearest_gbs": e.nearest_gbs},
        **search_setting_json(model, cluster, training), defaults=defaults,
        run_settings=run_settings_json(options), constraints=constraints)


def error_search_json(message: str) -> dict[str, Any]:
    """``search --json`` of a run refused (exit 2) or failed (exit 3): ``error`` is the line
    stderr says."""
    return search_outcome_json("error", error=message)


def _with_verdict(r: SearchResult, best: dict[str, Any]) -> dict[str, Any]:
    """The answer's ``memory`` with its verdict's ``state`` (``deciding_term`` is its
    ``dominant_term``, as ``check --json``'s ``memory_verdict`` names it)."""
    mem = r.best.outcome.memory
    if best.get("memory") is None or mem is None:
        return best
    from tune_cp.oracle.memory_verdict import legal_state

    verdict = {"state": legal_state(mem.peak_bytes, r.cluster.gpu.hbm_bytes,
                                     r.options.memory_spread).value,
               "deciding_term": mem.dominant_term}
    return best | {"memory": best["memory"] | verdict}


def search_json(r: SearchResult, timings: bool = False) -> dict[str, Any]:
    """Everything the text report says (keys :data:`SEARCH_KEYS`, ``status`` "ok"). Deterministic
    for the same inputs unless ``timings`` adds the wall-clock seconds of each phase;
    ``export``, ``verify`` and ``pareto`` are null here (the CLI fills them when asked)."""
    top = [group_row(r, g) for g in r.groups]
    enum = r.enumeration
    return search_outcome_json(
        "ok",
        **search_setting_json(r.model, r.cluster, r.training),
        defaults=r.defaults,
        run_settings=run_settings_json(r.options.settings.options),
        best=_with_verdict(r, trial_json(r.best)) | {"phase": r.best_phase} | (
            {"interval": r.interval.to_json()} if r.interval else {}),
        check_command=r.check_command,
        answer_rule=r.rule,
        near_tie_band=r.near_tie_band,
        oracle_best=ranked_row(r, int(r.ranked.order[0])),
        top=top,
        baseline=trial_json(r.baseline) if r.baseline is not None else None,
        baseline_source=r.baseline_source,
        speedup_vs_baseline=r.speedup,
        feasible_count=len(enum.configs),
        candidates=enum.space_size,
        # the optimizer-state choices of the space (``--fsdp`` adds "fsdp")
        optimizers_searched=[o.value for o in enum.problem.space.optimizer],
        removed_by_rule={k: v for k, v in enum.removed.items() if v},
        regret=r.regret,
        exhaustive_best=trial_json(r.exhaustive_best),
        seed_best=trial_json(r.seed.best) if r.seed else None,
        attribution=[step_json(s) for s in r.attribution],
        seed_moves=[
            {"change": mv.label, "axis": mv.axis, "legal": t.legal,
             "tokens_per_s_per_gpu": t.throughput if t.legal else None,
             "violations": [v.rule for v in t.outcome.violations]}
            for mv, t in (r.seed.moves if r.seed else ())
        ],
        constraints=[c.expr for c in r.options.constraints],
        preferences=r.preference_costs,
        llm=llm_json(r.llm),
        timings=(r.timings | {f"enumerate_{k}": v for k, v in enum.timings.items()}
                 if timings else None),
    )


# ------------------------------------------------------------------------- plan, sweep


def plan_point_json(p: PlanPoint) -> dict[str, Any]:
    return dict(p.__dict__)


def plan_json(p: GpuPlan) -> dict[str, Any]:
    return {"gpu": p.gpu, "gpus_per_node": p.gpus_per_node, "min_nodes": p.min_nodes,
            "price_per_gpu_hour": p.price_per_gpu_hour, "note": p.note,
            "points": [plan_point_json(x) for x in p.points]}


def sweep_settings_json(s: Settings) -> dict[str, Any]:
    """What every scenario of a grid shares (part of each scenario's digest; a setting added
    later is written only when set, so the digests of grids without it stay as they were)."""
    return {"constraints": list(s.constraints), "preferences": list(s.preferences),
            "memory_margin": s.memory_margin, "grad_reduce_in_bf16": s.grad_reduce_in_bf16,
            "overheads": dict(s.overheads), "calibration": s.calibration} | (
        {"allow_cross_scale_up": True} if s.allow_cross_scale_up else {}) | (
        {"fsdp": True} if s.fsdp else {}) | (
        {"framework": s.framework} if s.framework is not None else {}) | (
        {"fp8_param_gather": True} if s.fp8_param_gather else {}) | {
        k: list(v) if isinstance(v, tuple) else v for k, v in s.run_options}
