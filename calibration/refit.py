"""Refit the time model for one cluster from its own training logs (``tune-cp calibrate --log``).

Each log (:mod:`formats.logs`) becomes a measured run (:class:`formats.runs.RunRow`):
the configuration from the arguments the log printed (Megatron-LM / Primus argument dump, read by
:func:`formats.parse_argument_dump` in :func:`log_launch`; a ``--config`` file beside it:
Megatron-LM arguments, or a torchtitan job TOML), the cluster from ``--gpu`` / ``--nodes`` (or
the world size the log prints), the measured tokens/s/GPU from the log's median step. A
Megatron-LM / Primus log's configuration is checked as ``tune-cp check --log`` checks it
(:func:`log_check`: the launch's run settings, the precision its FP8 recipe trains in), and the
row carries that check's resolved configuration and traits.

The fit is :func:`calibration.calibrate.fit` (the shipped MAP fit) on the published runs (the prior:
``benchmarks/published_runs.csv`` and ``amd_published_runs.csv``) plus the user's rows, each user row weighted
:data:`USER_ROW_WEIGHT` times a published row: the constants of the user's GPU architecture (and
the shared ones) move as far as the user's measurements support against 180 published rows and
the priors. The result is a calibration file for ``--calibration FILE``; the report gives every
log's measured throughput beside the projection before (the shipped calibration) and after, each
the projection ``tune-cp check --log LOG [--calibration FILE]`` prints
(:func:`solver.check.check_projection`), with that command.
Measured peaks (Megatron ``max allocated``, torchtitan peak reserved, Primus device memory used)
are reported beside tune-cp's peak counted the same way (:data:`NOT_COUNTED`); the memory
overheads are not refitted from them (yet): the gap says which way ``--overhead`` (or the
memory model) is off for that cluster.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tune_cp.calibration.calibrate import fit, fit_hybrid_terms, prepare, table_from_fit
from tune_cp.config.resolve import resolve_config
from tune_cp.config.specs import (
    ClusterSpec,
    ConfigError,
    GpuSpec,
    ModelSpec,
    ParallelConfig,
    Recompute,
    TrainingSpec,
    training_as_run,
)
from tune_cp.formats import ImportedRun
from tune_cp.formats.logs import (
    LogMeasurement,
    read_log,
    read_torchtitan_config,
)
from tune_cp.formats.runs import (
    PUBLISHED_RUNS_FILES,
    RunRow,
    read_runs_files,
    runs_label,
    scored_rows,
)
from tune_cp.oracle.constants import load_calibration, utc_now
from tune_cp.oracle.work import RunTraits

PUBLISHED_RUNS: tuple[Path, ...] = PUBLISHED_RUNS_FILES
#: weight of one of the user's rows against one published row in the fit (its squared residual
#: counts 16 times): a handful of the cluster's own runs outweighs the few published rows of the
#: same architecture and class, not the priors of constants they say nothing about.
USER_ROW_WEIGHT = 4.0
#: a log's TFLOP/s/GPU and its tokens/s/GPU (as read with the arguments) disagree by more than
#: this share under tune-cp's FLOP count: the sequence length, batch or model read is likely wrong.
FLOPS_MISMATCH = 0.25


@dataclass
class LogRun:
    """One log read as a measured run (or the reason it cannot be used). ``outcome``: the
    check of the logged configuration with the log's run settings (:func:`log_check`), the one
    ``tune-cp check --log`` makes; ``check_command``: that command."""

    measurement: LogMeasurement
    row: RunRow | None
    reason: str | None = None
    notes: list[str] = field(default_factory=list)
    outcome: Any = None  # solver.check.CheckOutcome (Megatron-LM / Primus logs)
    check_command: str = ""


def log_launch(m: LogMeasurement, config_text: str, model: ModelSpec | None) -> ImportedRun:
    """The launch a Megatron-LM / Primus log describes: its argument dump
    (:func:`formats.parse_argument_dump`; the start-up size line fills what a cut dump lacks;
    ``config_text``, Megatron-LM arguments, completes or overrides it), with the global batch
    its iteration lines print. ``tune-cp check --log`` and ``calibrate --log`` both read a log
    through this function."""
    from tune_cp.formats import parse_argument_dump

    if not m.args and not config_text.strip():
        raise ConfigError(f"{m.path}: the log prints no argument dump; give the launch arguments "
                          f"(calibrate: --config FILE; check: --megatron-args FILE)")
    run = parse_argument_dump(m.args, model=model, extra=config_text, sizes=m.sizes)
    if m.global_batch_size and m.global_batch_size != run.global_batch_size:
        run = run.model_copy(update={"global_batch_size": m.global_batch_size})
    return run


def log_nodes(m: LogMeasurement, nodes: int | None, gpus_per_node: int) -> int:
    """The node count of a logged run: its world size (the start-up line or the dump's
    ``world_size``) over ``gpus_per_node``, else ``nodes`` (``--nodes``)."""
    world = m.world_size or (nodes * gpus_per_node if nodes else None)
    if world is None:
        raise ConfigError(f"{m.path}: the log does not print the world size; give --nodes")
    if world % gpus_per_node:
        raise ConfigError(f"{m.path}: world size {world} is not a multiple of --gpus-per-node "
                          f"{gpus_per_node}")
    return world // gpus_per_node


def log_check(run: ImportedRun, model: ModelSpec, cluster: ClusterSpec,
              settings: Any = None) -> Any:
    """The check of a logged launch as ``tune-cp check`` makes it: the run settings the launch
    sets (CUDA graphs, all-to-all overlap, token-drop; ``settings`` when given), the precision its
    FP8 recipe trains in, every rule family and the memory. Its projection is
    :func:`solver.check.check_projection`."""
    from tune_cp.solver.check import check_configuration
    from tune_cp.solver.settings import RunSettings

    settings = settings or RunSettings().with_(**dict(run.options))
    training = training_as_run(run.training_spec(model, cluster), run.config)
    return check_configuration(model, cluster, training, run.config, settings=settings)


def _megatron_run(m: LogMeasurement, config_text: str, model: ModelSpec | None, gpu: GpuSpec,
                  nodes: int | None, gpus_per_node: int) -> tuple[RunRow, list[str], Any]:
    run = log_launch(m, config_text, model)
    mdl = run.require_model()
    n = log_nodes(m, nodes, gpus_per_node)
    cluster = ClusterSpec(gpu=gpu, num_nodes=n, gpus_per_node=gpus_per_node)
    outcome = log_check(run, mdl, cluster)
    if any(v.rule == "precision" for v in outcome.violations):
        raise ConfigError(f"{m.path}: the logged configuration cannot be projected: "
                          + "; ".join(v.message for v in outcome.violations))
    cfg, training = outcome.ctx.cfg, outcome.ctx.training
    world = cluster.world_size
    notes = []
    if outcome.memory is None:  # the log ran it: its (cut) dump lacks what made it legal
        notes.append("as read, the configuration breaks a rule ("
                     + "; ".join(v.message for v in outcome.violations) + "), so `check` "
                     "prints no projection for it; it is projected as read (give the missing "
                     "arguments with --config)")
    if m.sizes:
        for k, v in m.sizes.items():
            mine = {"tensor_parallel": cfg.tp, "pipeline_parallel": cfg.pp, "data_parallel": cfg.dp,
                    "context_parallel": cfg.cp}.get(k)
            if mine is not None and mine != v:
                notes.append(f"the log's {k} size {v} differs from the arguments' {mine}")
    if m.step_time_s is None:
        raise ConfigError(f"{m.path}: no 'elapsed time per iteration (ms)' value")
    # the framework's own tokens/s/GPU when it prints one (Primus), else from the step time
    tokens = m.tokens_per_s_per_gpu or (
        training.global_batch_size * training.seq_len / m.step_time_s / world)
    # the traits every projection of this configuration gets (check's, search's): the fit and
    # the before/after columns are that projection (solver.check.check_projection)
    traits = outcome.ctx.settings.traits
    overlap = m.args.get("tp_comm_overlap") == "True" or "--tp-comm-overlap" in config_text
    if cfg.tp > 1 and not overlap:
        notes.append("the log runs without --tp-comm-overlap; tune-cp's projections (check, "
                     "search, plan) assume Transformer Engine's TP overlap, so the refit folds "
                     "the exposed TP communication into this cluster's constants")
    if m.tflops_per_gpu:
        from tune_cp.solver.check import check_projection

        p = check_projection(outcome, illegal_layouts=True)
        flops_per_token = p.model_tflops_per_gpu * 1e12 / p.tokens_per_s_per_gpu
        implied = m.tflops_per_gpu * 1e12 / flops_per_token
        if abs(implied / tokens - 1) > FLOPS_MISMATCH:
            notes.append(f"the log's {m.tflops_per_gpu:.1f} TFLOP/s/GPU means {implied:,.0f} "
                         f"tokens/s/GPU with tune-cp's FLOP count, not the {tokens:,.0f} read "
                         f"from the step time (seq {training.seq_len}, gbs "
                         f"{training.global_batch_size}): check the sequence length, batch and "
                         f"model (give --config)")
    row = RunRow(row_id=f"log:{Path(m.path).name}", source=f"training log {m.path}",
                 source_id="user-log", model_name=mdl.name, gpu_name=gpu.name,
                 measured_tokens_per_s_per_gpu=tokens,
                 measured_model_tflops_per_gpu=m.tflops_per_gpu, model=mdl, cluster=cluster,
                 training=training, cfg=cfg, software="megatron", traits=traits)
    defaults = [d for d in run.defaults if d.split(":")[0] in (
        "expert_model_parallel_size", "seq_length", "micro_batch_size", "context_parallel_size",
        "num_layers_per_virtual_pipeline_stage")]
    if defaults:
        notes.append("defaults taken: " + "; ".join(defaults))
    if run.unmodelled:
        notes.append("these change memory or time and are not modelled: "
                     + "; ".join(run.unmodelled))
    return row, notes + run.notes, outcome


def _titan_run(m: LogMeasurement, config_path: str | None, model: ModelSpec | None, gpu: GpuSpec,
               nodes: int | None, gpus_per_node: int) -> tuple[RunRow, list[str]]:
    if config_path is None:
        raise ConfigError(f"{m.path}: torchtitan logs do not print their configuration; give the "
                          f"job TOML with --config FILE")
    if model is None:
        raise ConfigError(f"{m.path}: give --model for a torchtitan log (its TOML names "
                          f"torchtitan's own flavours)")
    if nodes is None:
        raise ConfigError(f"{m.path}: give --nodes for a torchtitan log")
    t = read_torchtitan_config(config_path)
    cluster = ClusterSpec(gpu=gpu, num_nodes=nodes, gpus_per_node=gpus_per_node)
    tp, pp, cp, ep = (int(t.get(k, 1)) for k in ("tp", "pp", "cp", "ep"))
    world = cluster.world_size
    if world % (tp * pp * cp):
        raise ConfigError(f"{config_path}: tp x pp x cp = {tp * pp * cp} does not divide the "
                          f"{world} GPUs")
    dp = world // (tp * pp * cp)
    local = int(t.get("local_batch_size", 1))
    gbs = int(t.get("global_batch_size", -1))
    if gbs == -1:  # torchtitan's default: the local batch on every data-parallel rank
        gbs = local * dp
    mbs = int(t.get("mbs") or (max(1, local // pp) if pp > 1 else local))
    ac = str(t.get("ac_mode", "none")).lower()
    rc: dict[str, Any] = {"recompute": Recompute.NONE}
    if ac == "full":
        rc = {"recompute": Recompute.FULL}
    elif ac == "selective":  # per-op selective AC recomputes every second matmul (formats/runs.py)
        rc = {"recompute": Recompute.SELECTIVE, "recompute_modules": ("mlp",)}
    seq = int(t.get("seq_len") or model.default_seq_len)
    training = TrainingSpec(seq_len=seq, global_batch_size=gbs)
    cfg = resolve_config(ParallelConfig(tp=tp, pp=pp, cp=cp, ep=ep, mbs=mbs,
                                        fsdp=int(t.get("dp_shard", -1)) != 1, **rc),
                         model, cluster, training)
    if m.tokens_per_s_per_gpu is None:
        raise ConfigError(f"{m.path}: no 'tps:' value")
    row = RunRow(row_id=f"log:{Path(m.path).name}", source=f"training log {m.path}",
                 source_id="user-log", model_name=model.name, gpu_name=gpu.name,
                 measured_tokens_per_s_per_gpu=m.tokens_per_s_per_gpu,
                 measured_model_tflops_per_gpu=m.tflops_per_gpu, model=model, cluster=cluster,
                 training=training, cfg=cfg, software="torchtitan",
                 traits=RunTraits(tp_comm_overlap=bool(t.get("async_tp", False))))
    return row, [f"torchtitan settings from {config_path}: {t}"]


def check_command(path: str, gpu: GpuSpec, model: ModelSpec | None, nodes: int | None,
                  gpus_per_node: int, config: str | None, *, gpu_name: str | None = None,
                  model_name: str | None = None) -> str:
    """The ``tune-cp check`` command that checks and projects a log's configuration as
    ``calibrate --log`` does (add ``--calibration FILE`` for the refitted projection)."""
    import shlex

    words = ["tune-cp", "check", "--log", path, "--gpu", gpu_name or gpu.name]
    if model is not None:
        words += ["--model", model_name or model.name]
    if nodes is not None:
        words += ["--nodes", str(nodes)]
    if gpus_per_node != gpu.gpus_per_node:
        words += ["--gpus-per-node", str(gpus_per_node)]
    if config is not None:
        words += ["--megatron-args", config]
    return " ".join(shlex.quote(w) for w in words)


def read_log_runs(paths: list[str], *, gpu: GpuSpec, gpus_per_node: int,
                  model: ModelSpec | None = None, nodes: int | None = None,
                  config: str | None = None, gpu_name: str | None = None,
                  model_name: str | None = None) -> list[LogRun]:
    """Every log as a measured run; a log that cannot be represented says why. ``gpu_name`` /
    ``model_name``: how the user named them (for the ``check`` command of each log)."""
    config_text = ""
    if config is not None and not config.endswith(".toml"):
        from tune_cp.oracle.inputs import read_text

        config_text = read_text(config, "--config file")
    out = []
    for p in paths:
        m = read_log(p)
        try:
            if m.framework == "torchtitan":
                row, notes = _titan_run(m, config, model, gpu, nodes, gpus_per_node)
                out.append(LogRun(m, row, None, notes))
            else:
                row, notes, outcome = _megatron_run(m, config_text, model, gpu, nodes,
                                                    gpus_per_node)
                out.append(LogRun(m, row, None, notes, outcome,
                                  check_command(p, gpu, model, nodes, gpus_per_node, config,
                                                gpu_name=gpu_name, model_name=model_name)))
        except ConfigError as e:
            out.append(LogRun(m, None, str(e)))
    return out


@dataclass
class ClusterCalibration:
    """What :func:`calibrate_from_logs` did."""

    runs: list[LogRun]
    table: Any  # CalibrationTable
    before: list[float]  # projected tokens/s/GPU of each used log, shipped calibration
    after: list[float]  # the same with the refitted constants
    measured: list[float]
    out_path: str | None = None
    modelled_peaks: list[int | None] = field(default_factory=list)  # tune-cp's peak per used log

    def to_json(self) -> dict[str, Any]:
        used = [r for r in self.runs if r.row is not None]
        return {
            "logs": [{"log": r.measurement.to_json(), "used": r.row is not None,
                      "reason": r.reason, "notes": r.notes} for r in self.runs],
            "rows": [{"row_id": r.row.row_id, "measured_tokens_per_s_per_gpu": m,  # type: ignore
                      "projected_before": b, "projected_after": a,
                      "check": r.check_command or None,
                      "measured_peak_bytes": r.measurement.peak_bytes,
                      "measured_peak_kind": r.measurement.peak_kind, "modelled_peak_bytes": pk}
                     for r, m, b, a, pk in zip(used, self.measured, self.before, self.after,
                                               self.modelled_peaks, strict=True)],
            "out": self.out_path, "calibration": self.table.to_json(),
        }

    def summary(self) -> str:
        lines = []
        used = [r for r in self.runs if r.row is not None]
        for r in self.runs:
            if r.row is None:
                lines.append(f"skipped {r.measurement.path}: {r.reason}")
        lines.append(f"refitted on {len(used)} log(s) (weight {USER_ROW_WEIGHT:g} each) with the "
                     f"published runs as the prior")
        lines.append(f"{'log':40} {'measured':>10} {'before':>10} {'after':>10}  tok/s/GPU")
        for r, m, b, a, pk in zip(used, self.measured, self.before, self.after,
                                  self.modelled_peaks, strict=True):
            c = r.row.cfg  # type: ignore[union-attr]
            lines.append(f"{Path(r.measurement.path).name[:40]:40} {m:>10,.0f} {b:>10,.0f} "
                         f"{a:>10,.0f}  ({r.row.model_name}, {c.label()}, mbs {c.mbs})")  # type: ignore
            for note in r.notes:
                lines.append(f"{'':40} note: {note}")
            if r.check_command:  # the same projection, from check (solver.check)
                calib = f" --calibration {shlex.quote(self.out_path)}" if self.out_path else ""
                what = "after; without --calibration, before" if calib else "before"
                if r.outcome is not None and r.outcome.memory is None:
                    what = "no projection: the layout breaks a rule as read, see the note"
                lines.append(f"{'':40} check: {r.check_command}{calib}  ({what})")
            if r.measurement.peak_bytes:
                ours = (f"; tune-cp's peak counted alike {pk / 2**30:.1f} GiB "
                        f"({100 * (r.measurement.peak_bytes / pk - 1):+.0f}%)" if pk else "")
                lines.append(f"{'':40} measured peak {r.measurement.peak_bytes / 2**30:.1f} GiB "
                             f"({r.measurement.peak_kind}){ours}")
        if self.out_path:
            lines.append(f"written to {self.out_path}; pass it with --calibration "
                         f"{self.out_path}")
        return "\n".join(lines)


def calibrate_from_logs(runs: list[LogRun], out_path: str | Path | None = None,
                        published: str | Path | tuple[Path, ...] = PUBLISHED_RUNS,
                        user_weight: float = USER_ROW_WEIGHT,
                        progress: Callable[[int, int], None] | None = None) -> ClusterCalibration:
    """Refit on the published runs plus the logs' rows weighted ``user_weight`` (module
    docstring); write the calibration JSON to ``out_path`` when given."""
    user = [r.row for r in runs if r.row is not None]
    if not user:
        raise ConfigError("no log could be read as a run: " + "; ".join(
            str(r.reason) for r in runs))
    published_rows = read_runs_files(published)
    # as the shipped fit: the shared constants on the fitted rows, the hybrid terms apart
    prior = [r for r in scored_rows(published_rows) if r.fitted]
    prep = prepare(prior + user)
    n_user = len(user)
    prep.weight[-n_user:] *= user_weight
    layout, theta, stats = fit(prep, progress=progress)
    shipped = load_calibration()
    header = {
        "runs_file": runs_label(published), "logs": [r.row_id for r in user],
        "user_row_weight": user_weight, "date": utc_now(),
        "rows": len(prep.rows), "tokens_per_s_mape": round(stats["mape"], 4),
        "method": "calibration/refit.py: calibration.calibrate.fit on the published runs plus the logs' "
                  "rows weighted up",
    }
    about = (f"tune-cp time-model constants refitted for a cluster on {n_user} training log(s) "
             f"plus {len(prior)} published rows ({header['date']})")
    table = fit_hybrid_terms(published_rows, table_from_fit(layout, theta, header, about))
    used = [r for r in runs if r.row is not None]
    # before / after: the projection `tune-cp check` prints for each log's configuration with
    # the shipped and the refitted constants (solver.check.check_projection; torchtitan logs,
    # which check does not read, the same projection with their own stack and traits)
    before = [_projected(r, shipped) for r in used]
    after = [_projected(r, table) for r in used]
    measured = [float(r.row.measured_tokens_per_s_per_gpu) for r in used]  # type: ignore
    # the logs' residuals with the refitted constants: projections made with this file take
    # their interval from them (oracle.uncertainty.residuals_for)
    assert table.fitted_on is not None
    table.fitted_on["user_residuals"] = [round(float(x), 4)
                                         for x in np.log(np.array(measured) / np.array(after))]
    out = ClusterCalibration(runs, table, before, after, measured,
                             modelled_peaks=[_modelled_peak(r) for r in used])
    if out_path is not None:
        Path(out_path).write_text(json.dumps(table.to_json(), indent=2) + "\n")
        out.out_path = str(out_path)
    assert all(math.isfinite(x) for x in out.after)
    return out


#: memory terms outside what each kind of measured peak counts: PyTorch's ``max allocated``
#: (Megatron-LM's memory report) counts neither the allocator's cached blocks (fragmentation) nor
#: the CUDA/HIP context and NCCL/RCCL buffers, which are not allocated through it; torchtitan's
#: peak reserved counts the cached blocks; Primus's ``hip mem usage`` (device used memory,
#: ``torch.cuda.mem_get_info``) counts everything.
NOT_COUNTED = {
    "max allocated": ("fragmentation", "runtime_context", "collective_buffers"),
    "peak reserved": ("runtime_context", "collective_buffers"),
    "hip mem usage": (),
}


def _modelled_peak(r: LogRun) -> int | None:
    """tune-cp's peak bytes of the logged configuration (the most loaded stage, as ``check``
    counts it), counted like the log's measured peak (:data:`NOT_COUNTED`)."""
    out = r.outcome
    if out is None:
        from tune_cp.solver.check import check_configuration

        row = r.row
        assert row is not None and row.model and row.cluster and row.training and row.cfg
        out = check_configuration(row.model, row.cluster, row.training, row.cfg)
    if out.memory is None:
        return None
    peak = out.memory.peak
    kind = r.measurement.peak_kind
    return peak.total_bytes - sum(peak.terms.get(t, 0) for t in NOT_COUNTED.get(kind, ()))


def _projected(r: LogRun, table: Any) -> float:
    """tokens/s/GPU of a log's configuration with ``table``'s constants, as ``check`` projects
    it (:func:`solver.check.check_projection` of the log's check)."""
    if r.outcome is not None:
        from tune_cp.solver.check import check_projection

        p = check_projection(r.outcome, table, illegal_layouts=True)
        assert p is not None  # _megatron_run refuses a log whose precision is refused
        return float(p.tokens_per_s_per_gpu)
    from tune_cp.oracle.projection import project

    row = r.row
    assert row is not None and row.model and row.cluster and row.training and row.cfg
    return float(project(row.model, row.cluster, row.training, row.cfg, calib=table,
                         software=row.software, traits=row.traits).tokens_per_s_per_gpu)


def log_ratio(measured: list[float], projected: list[float]) -> float:
    """Mean log(projected / measured) (0: no bias)."""
    return float(np.mean(np.log(np.array(projected) / np.array(measured))))
