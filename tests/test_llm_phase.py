"""The DSPy planner phase on its own: scripted LMs (DummyLM), garbage, timeouts, dead servers,
and a loopback OpenAI-compatible server that answers garbage."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import dspy
import pytest
from dspy.utils import DummyLM

from tune_cp.agent.llm import (
    CallTimeout,
    LlmBudget,
    LlmRound,
    PlannerHints,
    call_with_timeout,
    make_lm,
    run_llm_phase,
)
from tune_cp.agent.serialize import llm_json

INPUTS = dict(model="m", cluster="c", baseline="b", best_so_far="b", bottleneck="x", goal="",
              axes="tp pp", history="")
GOOD = {"hard_constraints": [{"expr": "ep*etp<=8", "rationale": "keep a2a in a node"}],
        "soft_objectives": [{"expr": "cp==1", "weight": 0.1, "rationale": "simpler"}],
        "combinations": [{"settings": {"tp": 2, "ep": 4}, "rationale": "try"}]}


def explore_recorder(seen):
    def explore(hints: PlannerHints, rnd: LlmRound) -> None:
        seen.append(hints)
        rnd.accepted.append(f"{len(hints.combinations)} combinations")

    return explore


def test_valid_hints_run_every_round():
    lm = DummyLM([{"hints": json.dumps(GOOD)}] * 3)
    seen: list[PlannerHints] = []
    report = run_llm_phase(lm, "dummy", lambda rounds: INPUTS, explore_recorder(seen),
                           LlmBudget(rounds=3, calls=3))
    assert report.status == "completed" and report.calls == 3 and len(seen) == 3
    assert seen[0].hard_constraints[0].expr == "ep*etp<=8"
    assert seen[0].combinations[0].settings == {"tp": 2, "ep": 4}
    assert report.rounds[0].hints["soft_objectives"][0]["weight"] == 0.1


def test_history_reaches_later_rounds():
    lm = DummyLM([{"hints": json.dumps(GOOD)}] * 2)
    histories: list[int] = []

    def context(rounds):
        histories.append(len(rounds))
        return INPUTS | {"history": f"{len(rounds)} earlier rounds"}

    run_llm_phase(lm, "dummy", context, explore_recorder([]), LlmBudget(rounds=2, calls=2))
    assert histories == [0, 1]


def test_garbage_answer_stops_the_phase_with_a_warning():
    lm = DummyLM([{"hints": "I think you should use more GPUs!"}] * 4)
    seen: list[PlannerHints] = []
    report = run_llm_phase(lm, "dummy", lambda r: INPUTS, explore_recorder(seen))
    assert report.status == "stopped" and not seen
    assert report.warnings and "round 1: the LM failed" in report.warnings[0]


def test_call_budget_limits_rounds():
    lm = DummyLM([{"hints": json.dumps(GOOD)}] * 5)
    report = run_llm_phase(lm, "dummy", lambda r: INPUTS, explore_recorder([]),
                           LlmBudget(rounds=5, calls=2))
    assert report.calls == 2 and "call budget" in report.reason


def test_slow_call_times_out():
    with pytest.raises(CallTimeout):
        call_with_timeout(lambda: time.sleep(2), 0.2)


class SlowEngine:
    """A fake DSPy engine (``complete(Request) -> Response``) that never answers in time."""

    def complete(self, request):
        time.sleep(3)
        raise RuntimeError("never reached")

    def stream(self, request):
        raise RuntimeError("never reached")

    def close(self):
        pass


class SlowLM:
    def __new__(cls):
        return dspy.LM("fake/slow", engine=SlowEngine(), cache=False)


def test_slow_lm_stops_phase():
    report = run_llm_phase(SlowLM(), "slow", lambda r: INPUTS, explore_recorder([]),
                           LlmBudget(rounds=2, call_timeout_s=0.3))
    assert report.status == "stopped" and "no answer within 0.3 s" in report.reason


def test_unreachable_server_is_a_warning(monkeypatch):
    monkeypatch.setenv("TUNE_CP_LM_API_KEY", "sk-secret-123")
    lm = make_lm("openai/test-model", "http://127.0.0.1:9/v1", timeout_s=2)
    report = run_llm_phase(lm, "openai/test-model", lambda r: INPUTS, explore_recorder([]))
    assert report.status == "stopped" and report.warnings
    assert "sk-secret-123" not in json.dumps(llm_json(report))


class GarbageHandler(BaseHTTPRequestHandler):
    requests: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server API
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        GarbageHandler.requests.append({"path": self.path, "auth": self.headers.get("Authorization"),
                                        "body": json.loads(body or b"{}")})
        payload = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                              "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                  "role": "assistant", "content": "%%% not hints at all %%%"}}],
                              "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                        "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def garbage_server():
    GarbageHandler.requests = []
    server = HTTPServer(("127.0.0.1", 0), GarbageHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()


def test_loopback_server_gets_the_request_and_garbage_is_survived(garbage_server):
    lm = make_lm("openai/local-model", garbage_server, timeout_s=10)
    report = run_llm_phase(lm, "openai/local-model", lambda r: INPUTS, explore_recorder([]))
    assert GarbageHandler.requests, "the planner never reached the loopback server"
    req = GarbageHandler.requests[0]
    assert req["path"].endswith("/chat/completions") and req["body"]["model"] == "local-model"
    assert report.status == "stopped" and report.warnings
