"""Seed phase: deterministic single-axis moves from the baseline, then the best moves combined.

For every axis the phase tries each value the axis may take with the other axes held (derived
values follow: dp and ga from the layout; etp follows tp when it did in the baseline; vpp and the
number of recomputed layers are repaired only when the move makes them illegal). Every move is
evaluated by the same :class:`~agent.evaluate.Evaluator` (legality, memory, projection); the
improving moves are then applied greedily, largest gain first, each kept only if the combination
stays legal and faster. Every accepted step is attributed to its move. Same inputs, same output.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tune_cp.agent.backend import presets
from tune_cp.agent.evaluate import Evaluator, Trial
from tune_cp.config.axes import AXIS, PLAIN_AXES, SEED_MBS, SEED_SELECTIVE, module_sets
from tune_cp.config.resolve import resolve_config
from tune_cp.config.specs import (
    Dispatcher,
    Fp8Recipe,
    ParallelConfig,
    Recompute,
    RecomputeMethod,
    Schedule,
)
from tune_cp.solver.rules import divisors, layers_per_chunk

#: The micro-batch sizes the seed phase steps through (``config/axes.py::SEED_MBS``: up to 16,
#: beyond the exhaustive space's 8).
MBS_CHOICES = SEED_MBS


@dataclass(frozen=True)
class Move:
    """A change of one axis (or one lever) from a configuration."""

    axis: str
    label: str
    update: dict[str, Any]


@dataclass(frozen=True)
class Step:
    """One accepted change with its projected gain (tokens/s/GPU, and relative)."""

    move: str
    phase: str
    before: float
    after: float

    @property
    def gain(self) -> float:
        return self.after / self.before - 1.0 if self.before else 0.0


@dataclass(frozen=True)
class SeedResult:
    baseline: Trial
    moves: tuple[tuple[Move, Trial], ...]
    best: Trial
    steps: tuple[Step, ...]


def _fmt(v: Any) -> str:
    return v.value if hasattr(v, "value") else str(v)


def axis_moves(ev: Evaluator, cfg: ParallelConfig, allow_fp8: bool) -> Iterator[Move]:
    """Every single-axis move from ``cfg``, in a fixed order."""
    m, cl = ev.model, ev.cluster
    w = cl.world_size
    scale = w if ev.allow_cross_scale_up else cl.scale_up_gpus
    follows = cfg.etp_ == cfg.tp
    for tp in divisors(w):
        if tp != cfg.tp and tp <= scale:
            upd: dict[str, Any] = {"tp": tp}
            if follows and m.is_moe:
                upd["etp"] = tp
            yield Move("tp", f"tp {cfg.tp}->{tp}", upd)
    for pp in divisors(w):
        if pp != cfg.pp and pp <= m.num_layers:
            yield Move("pp", f"pp {cfg.pp}->{pp}", {"pp": pp})
    for vpp in vpp_values(max(2, m.num_layers // max(cfg.pp, 1))):
        if vpp != cfg.vpp and cfg.pp > 1:
            yield Move("vpp", f"vpp {cfg.vpp}->{vpp}", {"vpp": vpp})
    for cp in divisors(w):
        if cp != cfg.cp:
            yield Move("cp", f"cp {cfg.cp}->{cp}", {"cp": cp})
    if m.is_moe:
        for ep in divisors(m.num_experts):
            if ep != cfg.ep and ep <= w:
                yield Move("ep", f"ep {cfg.ep}->{ep}", {"ep": ep})
        for etp in divisors(scale):
            if etp != cfg.etp_:
                yield Move("etp", f"etp {cfg.etp_}->{etp}", {"etp": etp})
    for mbs in MBS_CHOICES:
        if mbs != cfg.mbs and (mbs == cfg.mbs * 2 or mbs * 2 == cfg.mbs):
            yield Move("mbs", f"mbs {cfg.mbs}->{mbs}", {"mbs": mbs})
    for name in PLAIN_AXES:  # the registry's plain axes: each of their seed values
        for value in AXIS[name].seed_values:
            if value != getattr(cfg, name):
                yield Move(name, f"{name} {getattr(cfg, name)}->{value}", {name: value})
    yield from recompute_moves(ev, cfg)
    for sched in Schedule:
        if sched != cfg.schedule_ and sched is Schedule.ZERO_BUBBLE:
            yield Move("schedule", f"schedule {cfg.schedule_.value}->{sched.value}",
                       {"schedule": sched, "recompute": Recompute.NONE, "recompute_layers": None})
    if m.is_moe:
        for disp in Dispatcher:
            if disp != cfg.dispatcher:
                yield Move("dispatcher", f"dispatcher {cfg.dispatcher.value}->{disp.value}",
                           {"dispatcher": disp})
        # the MoE backend presets the exhaustive ranking tries per layout (agent/backend.py)
        for upd in presets(m, cl):
            if upd and any(getattr(cfg, k) != v for k, v in upd.items()):
                label = ", ".join(f"{k} {_fmt(v)}" for k, v in upd.items())
                yield Move("moe_backend", f"MoE backend -> {label}", upd)
    yield Move("distributed_optimizer",
               f"distributed optimizer {'on->off' if cfg.distributed_optimizer else 'off->on'}",
               {"distributed_optimizer": not cfg.distributed_optimizer})
    if allow_fp8 and cl.gpu.peak_fp8_flops:
        recipes = [None, *Fp8Recipe]
        for r in recipes:
            if r != cfg.fp8_recipe:
                yield Move("precision", f"fp8 {_fmt(cfg.fp8_recipe) if cfg.fp8_recipe else 'off'}->"
                           f"{_fmt(r) if r else 'off'}", {"fp8_recipe": r})


def recompute_moves(ev: Evaluator, cfg: ParallelConfig) -> Iterator[Move]:
    """Recompute levers: off, selective variants, full with fewer layers per virtual stage (one,
    a quarter, half, one fewer) or one more, full on every layer."""
    m = ev.model
    if cfg.recompute is not Recompute.NONE:
        yield Move("recompute", f"recompute {cfg.recompute.value}->none",
                   {"recompute": Recompute.NONE, "recompute_layers": None})
    for mods in selective_sets(ev):
        if cfg.recompute is not Recompute.SELECTIVE or tuple(cfg.recompute_modules) != mods:
            yield Move("recompute", f"recompute -> selective ({', '.join(mods)})",
                       {"recompute": Recompute.SELECTIVE, "recompute_modules": mods,
                        "recompute_layers": None})
    per = layers_per_chunk(m, cfg)
    if cfg.recompute is Recompute.FULL and cfg.recompute_method is RecomputeMethod.BLOCK:
        k = per if cfg.recompute_layers is None else cfg.recompute_layers
        for nk in sorted({1, k // 4, k // 2, k - 1, k + 1}):
            if 1 <= nk <= per and nk != k:
                yield Move("recompute", f"full recompute layers {k}->{nk}",
                           {"recompute_layers": nk})
    if not (cfg.recompute is Recompute.FULL and cfg.recompute_layers in (None, per)):
        yield Move("recompute", "recompute -> full (all layers)",
                   {"recompute": Recompute.FULL, "recompute_method": RecomputeMethod.BLOCK,
                    "recompute_layers": None})
    if cfg.recompute is not Recompute.FULL:
        yield Move("recompute", "recompute -> full (1 layer per virtual stage)",
                   {"recompute": Recompute.FULL, "recompute_method": RecomputeMethod.BLOCK,
                    "recompute_layers": 1})


def selective_sets(ev: Evaluator) -> list[tuple[str, ...]]:
    """Selective-recompute module sets worth trying for this model
    (``config/axes.py::SEED_SELECTIVE``)."""
    return module_sets(SEED_SELECTIVE, ev.model, ev.training)


def apply(cfg: ParallelConfig, update: dict[str, Any]) -> ParallelConfig:
    """``cfg`` with ``update``. Fields :func:`resolve_config` derives are cleared so they follow
    the change (dp, ga, pipeline split, sequence parallelism, the schedule unless zero-bubble,
    and etp when it followed tp)."""
    derived: dict[str, Any] = {"dp": None, "ga": None, "pipeline_split": None,
                               "sequence_parallel": None}
    if cfg.schedule is not Schedule.ZERO_BUBBLE:
        derived["schedule"] = None
    if cfg.etp is None or cfg.etp == cfg.tp:
        derived["etp"] = None
    return ParallelConfig(**(cfg.model_dump() | derived | update))


def try_move(ev: Evaluator, cfg: ParallelConfig, move: Move, phase: str) -> Trial:
    """Evaluate ``cfg`` + ``move``; when the move itself breaks a structural rule, try the
    repairs in order and keep the first legal (or in-memory-only failing) one."""
    cand = apply(cfg, move.update)
    trial = ev.evaluate(cand, phase, move.label)
    if trial.legal or trial.outcome.memory is not None:
        return trial
    for fixed in _repair_candidates(ev, cand):
        t = ev.evaluate(fixed, phase, move.label + " (repaired)")
        if t.outcome.memory is not None:
            return t
    return trial


#: vpp values the seed phase tries one by one (1 .. this); above, only powers of two and the
#: largest, so a 100,000-layer model or ``--baseline vpp=100000`` costs a few dozen moves.
VPP_EXACT = 32


def vpp_values(top: int) -> list[int]:
    """1 .. ``top``: every value up to :data:`VPP_EXACT`, then powers of two, then ``top``."""
    powers = (1 << b for b in range(VPP_EXACT.bit_length(), top.bit_length()))
    return sorted({*range(1, min(top, VPP_EXACT) + 1), *(p for p in powers if p <= top), top})


def _repair_candidates(ev: Evaluator, cfg: ParallelConfig) -> Iterator[ParallelConfig]:
    """vpp down to 1 (the values of :func:`vpp_values` up to the largest that leaves each virtual
    stage a layer), then recompute layers clamped to one virtual stage."""
    seen = set()
    top = max(1, min(cfg.vpp, ev.model.num_layers // max(cfg.pp, 1)))
    for vpp in reversed(vpp_values(top)):
        base = apply(cfg, {"vpp": vpp})
        options = [base]
        if cfg.recompute is Recompute.FULL and cfg.recompute_layers:
            resolved = resolve_config(base, ev.model, ev.cluster, ev.training)
            per = layers_per_chunk(ev.model, resolved)
            if cfg.recompute_layers > per:
                options.append(apply(base, {"recompute_layers": per}))
        for o in options:
            key = o  # a frozen spec hashes by value (nested specs too)
            if key not in seen:
                seen.add(key)
                yield o


def seed_phase(ev: Evaluator, baseline: ParallelConfig, allow_fp8: bool = False,
               max_rounds: int = 4) -> SeedResult:
    """Rounds of single-axis sweeps: sweep every axis from the current configuration, combine the
    improving moves greedily (largest gain first, one move per axis, each kept only if the
    combination stays legal and faster), and sweep again from the result until a round finds
    nothing better or ``max_rounds`` is reached."""
    base = ev.evaluate(baseline, "baseline", "baseline")
    current = base
    moves: list[tuple[Move, Trial]] = []
    steps: list[Step] = []
    for rnd in range(1, max_rounds + 1):
        phase = "seed" if rnd == 1 else f"seed round {rnd}"
        start = current
        sweep = list(axis_moves(ev, start.config, allow_fp8))
        # the round's moves are independent of each other: project them in one batch
        ev.prefetch([apply(start.config, mv.update) for mv in sweep])
        round_moves = [(mv, try_move(ev, start.config, mv, phase)) for mv in sweep]
        moves.extend(round_moves)
        improving = sorted(
            ((mv, t) for mv, t in round_moves if t.legal and t.throughput > start.throughput),
            key=lambda mt: (-mt[1].throughput, mt[0].label),
        )
        used_axes: set[str] = set()
        for mv, t in improving:
            if mv.axis in used_axes:
                continue
            cand = t if current is start else try_move(ev, current.config, mv, phase + " combine")
            if cand.legal and cand.throughput > current.throughput:
                steps.append(Step(mv.label, phase, current.throughput, cand.throughput))
                current = cand
                used_axes.add(mv.axis)
        if current is start:
            break
    return SeedResult(base, tuple(moves), current, tuple(steps))
