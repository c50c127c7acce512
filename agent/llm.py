"""LLM phase: a DSPy planner proposes cross-axis combinations, hard constraints and soft
objectives; tune-cp validates them, turns them into solver constraints, enumerates and ranks the
constrained sets with the same oracle, and feeds the results back for the next round.

The LLM never scores, approves or executes anything: its output is parsed into typed hints
(pydantic), every expression goes through the solver's whitelisted parser, every candidate through
the full legality check. An LM that is unreachable, slow, or answers garbage ends the phase with a
warning; the run completes with what the deterministic phases found.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tune_cp.config.axes import COMBINATION_AXES

#: What the LLM phase sets in the environment before DSPy (and litellm, which it may load) is
#: imported: the model metadata (prices, context windows) from the copy bundled with the
#: package, not refreshed from the internet on first use. DSPy 3.4's
#: ``dspy/clients/model_metadata/__init__.py::_load`` (and litellm's
#: ``litellm_core_utils/get_model_cost_map.py``) fetch
#: ``raw.githubusercontent.com/BerriAI/litellm/.../model_prices_and_context_window.json`` unless
#: ``LITELLM_LOCAL_MODEL_COST_MAP`` is ``True``; tune-cp reads no prices, and with a loopback
#: ``--lm-base-url`` nothing may leave the machine. ``LITELLM_OFFLINE_MODE``: litellm's own
#: switch for every catalog, check or tokenizer it would fetch on its own rather than from a
#: destination the user configured (``litellm_core_utils/offline_mode.py``); the LM calls go
#: where ``--lm`` / ``--lm-base-url`` say. (litellm's telemetry: DSPy sets
#: ``litellm.telemetry = False`` itself, ``dspy/clients/_litellm.py``.)
OFFLINE_ENV: dict[str, str] = {"LITELLM_LOCAL_MODEL_COST_MAP": "True",
                               "LITELLM_OFFLINE_MODE": "True"}

MAX_ITEMS = 6  # per list, per round: keeps a round's enumeration bounded
MAX_TEXT = 300  # characters kept of an expression or rationale
API_KEY_ENVS = ("TUNE_CP_LM_API_KEY", "OPENAI_API_KEY")


class ConstraintHint(BaseModel):
    model_config = ConfigDict(defer_build=True)  # built on first use (the LLM phase)

    expr: str = Field(description="a hard constraint over the axes, e.g. 'ep*etp<=8' or 'cp==1'")
    rationale: str = ""


class ObjectiveHint(BaseModel):
    model_config = ConfigDict(defer_build=True)  # built on first use (the LLM phase)

    expr: str = Field(description="a condition the user prefers, e.g. 'ep*etp<=8'")
    weight: float = Field(default=0.1, description="0..0.5: share of throughput worth giving up")
    rationale: str = ""


class CombinationHint(BaseModel):
    model_config = ConfigDict(defer_build=True)  # built on first use (the LLM phase)

    settings: dict[str, int | str | bool | None] = Field(
        description=(f"axis -> value to try together, e.g. {{'tp': 2, 'ep': 4, 'mbs': 2}}; "
                     f"axes: {', '.join(COMBINATION_AXES)}")
    )
    rationale: str = ""


class PlannerHints(BaseModel):
    """What the planner may say: nothing else is read."""

    model_config = ConfigDict(defer_build=True)

    hard_constraints: list[ConstraintHint] = []
    soft_objectives: list[ObjectiveHint] = []
    combinations: list[CombinationHint] = []


def import_dspy() -> Any:
    """DSPy, imported with :data:`OFFLINE_ENV` set first (the one place tune-cp imports it)."""
    os.environ.update(OFFLINE_ENV)
    import dspy

    return dspy


def planner_signature() -> type:
    """The DSPy Signature (built lazily so importing tune-cp never imports DSPy)."""
    dspy = import_dspy()

    class TuningPlanner(dspy.Signature):
        """You tune a distributed LLM training run (Megatron-LM style parallelism). Given the
        model, the cluster, the baseline, the best configuration found so far and where its step
        time goes, propose (1) up to 6 cross-axis combinations worth trying that single-axis
        changes cannot reach, as axis -> value settings; (2) hard constraints that keep the
        search on promising ground; (3) soft objectives expressing the user's goal, each a
        condition with a weight in 0..0.5. Use only the listed axis names; expressions use
        integers, + - * //, comparisons and 'in {..}'. Every proposal is checked for legality
        and scored by an analytical oracle; illegal ones are discarded."""

        model: str = dspy.InputField(desc="model architecture")
        cluster: str = dspy.InputField(desc="GPUs, nodes, interconnect")
        baseline: str = dspy.InputField(desc="baseline configuration and its projected throughput")
        best_so_far: str = dspy.InputField(desc="best configuration found so far and throughput")
        bottleneck: str = dspy.InputField(desc="step-time breakdown of the best so far")
        goal: str = dspy.InputField(desc="the user's goal in words (may be empty)")
        axes: str = dspy.InputField(desc="axis names and their legal values")
        history: str = dspy.InputField(desc="results of earlier rounds")
        hints: PlannerHints = dspy.OutputField()

    return TuningPlanner


@dataclass(frozen=True)
class LlmBudget:
    rounds: int = 3
    calls: int = 3
    wall_s: float = 180.0
    call_timeout_s: float = 60.0


@dataclass
class LlmRound:
    index: int
    hints: dict[str, Any] | None = None
    accepted: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


@dataclass
class LlmReport:
    status: str  # "skipped", "completed", "stopped"
    reason: str = ""
    model: str | None = None
    calls: int = 0
    rounds: list[LlmRound] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def api_key_from_env() -> str | None:
    for name in API_KEY_ENVS:
        if os.environ.get(name):
            return os.environ[name]
    return None


def make_lm(model: str, base_url: str | None = None, timeout_s: float = 60.0) -> Any:
    """A DSPy LM for any OpenAI-compatible server (OpenAI, vLLM, Ollama): ``model`` like
    ``openai/gpt-4o-mini``; the key comes from TUNE_CP_LM_API_KEY or OPENAI_API_KEY (a local
    server needs none) and is never printed."""
    dspy = import_dspy()

    key = api_key_from_env() or ("none" if base_url else None)
    kwargs: dict[str, Any] = {"num_retries": 0, "cache": False, "timeout": timeout_s,
                              "max_tokens": 2000, "temperature": 0.2}
    if base_url:
        kwargs["api_base"] = base_url
    if key:
        kwargs["api_key"] = key
    return dspy.LM(model, **kwargs)


class CallTimeout(Exception):
    pass


def call_with_timeout(fn: Callable[[], Any], timeout_s: float) -> Any:
    """Run ``fn`` in a daemon thread; raise :class:`CallTimeout` if it outlives ``timeout_s``
    (the thread is abandoned, never joined, so a hung server cannot hold the run)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise CallTimeout(f"no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` on one line, at most ``limit`` characters: cut at a word boundary, with
    ``...`` when cut (never mid-word)."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    head = text[:limit - 3]
    cut = head.rsplit(" ", 1)[0] if " " in head else head
    return cut.rstrip(" ,;:-") + "..."


#: Exception type names (DSPy 3.4 ``LMNotConfiguredError``; litellm / OpenAI clients'
#: ``AuthenticationError``) that mean no key, or a refused one.
NO_KEY_ERRORS = ("LMNotConfiguredError",)
BAD_KEY_ERRORS = ("AuthenticationError",)


def describe_error(e: BaseException) -> str:
    """One line about an LM failure, with nothing that could hold a key; a missing or refused
    key says which variables tune-cp reads (not the provider library's advice cut short)."""
    name = type(e).__name__
    variables = " or ".join(API_KEY_ENVS)
    if name in NO_KEY_ERRORS:
        return (f"no API key ({name}): set {variables}, or give --lm-base-url for a local "
                f"OpenAI-compatible server that needs none")
    if name in BAD_KEY_ERRORS:
        return f"the server refused the API key ({name}): check {variables}"
    msg = " ".join(str(e).split()).replace(api_key_from_env() or "\0", "***")
    return clip(f"{name}: {msg}")


def ask_planner(lm: Any, inputs: dict[str, str], timeout_s: float) -> PlannerHints:
    """One planner call. Raises on transport errors, timeouts and unparseable answers."""
    dspy = import_dspy()

    predictor = dspy.Predict(planner_signature())

    def call() -> Any:
        with dspy.context(lm=lm):
            return predictor(**inputs)

    prediction = call_with_timeout(call, timeout_s)
    hints = prediction.hints
    if isinstance(hints, PlannerHints):
        return hints
    try:
        return PlannerHints.model_validate(hints)
    except ValidationError as e:
        raise ValueError(f"planner answer is not valid hints: {e.errors()[0]['msg']}") from e


def run_llm_phase(
    lm: Any,
    lm_name: str,
    context: Callable[[list[LlmRound]], dict[str, str]],
    explore: Callable[[PlannerHints, LlmRound], None],
    budget: LlmBudget = LlmBudget(),
) -> LlmReport:
    """Rounds of ask -> validate/explore (``explore`` fills the round) -> feed back, within the
    budget. Any failure ends the phase with a warning; nothing the LM says is executed."""
    report = LlmReport(status="completed", model=lm_name)
    start = time.monotonic()
    for i in range(budget.rounds):
        if report.calls >= budget.calls:
            report.reason = f"LM call budget ({budget.calls}) used"
            break
        left = budget.wall_s - (time.monotonic() - start)
        if left <= 0:
            report.status, report.reason = "stopped", f"wall-time budget ({budget.wall_s:g} s) used"
            break
        rnd = LlmRound(index=i + 1)
        report.rounds.append(rnd)
        report.calls += 1
        try:
            hints = ask_planner(lm, context(report.rounds[:-1]), min(budget.call_timeout_s, left))
        except Exception as e:  # noqa: BLE001 - any LM failure ends the phase, never the run
            rnd.error = describe_error(e)
            report.status = "stopped"
            report.reason = f"round {i + 1}: the LM failed ({rnd.error})"
            report.warnings.append(report.reason)
            break
        rnd.hints = hints.model_dump()
        explore(hints, rnd)
    return report
