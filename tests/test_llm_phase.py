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


def test_missing_key_message_is_whole():
    """A missing key says which variables tune-cp reads, in full; any other error is cut at a
    word boundary, never mid-word (issue 30 item 9: "... Configure credentia")."""
    from tune_cp.agent.llm import MAX_TEXT, clip, describe_error

    LMNotConfiguredError = type("LMNotConfiguredError", (Exception,), {})
    msg = describe_error(LMNotConfiguredError("no API key found for provider 'openai-chat'. "
                                              + "Configure credentials " * 40))
    assert msg == ("no API key (LMNotConfiguredError): set TUNE_CP_LM_API_KEY or OPENAI_API_KEY, "
                   "or give --lm-base-url for a local OpenAI-compatible server that needs none")
    long = describe_error(RuntimeError("Configure credentials " * 40))
    assert len(long) <= MAX_TEXT and long.endswith("...")
    assert long[:-3].split()[-1] in ("Configure", "credentials")  # a whole word
    assert clip("abc defgh", 8) == "abc..." and clip("short", 8) == "short"


#: Run in a fresh interpreter (this module imports DSPy itself): records the environment when
#: DSPy / litellm are first imported and every urllib request, then asks a loopback server that
#: answers garbage.
OFFLINE_PROBE = r'''
import importlib.abc, json, os, sys, threading, urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
seen, urls = {}, []
class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ("dspy", "litellm") and name not in seen:
            seen[name] = [os.environ.get(k) for k in ("LITELLM_LOCAL_MODEL_COST_MAP",
                                                      "LITELLM_OFFLINE_MODE")]
sys.meta_path.insert(0, Spy())
def record(req, *args, **kwargs):
    urls.append(getattr(req, "full_url", req))
    raise OSError("no network here")
urllib.request.urlopen = record
class Garbage(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                           "choices": [{"index": 0, "finish_reason": "stop", "message": {
                               "role": "assistant", "content": "garbage"}}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                     "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = HTTPServer(("127.0.0.1", 0), Garbage)
threading.Thread(target=server.serve_forever, daemon=True).start()
from tune_cp.agent.llm import ask_planner, make_lm
lm = make_lm("openai/local", f"http://127.0.0.1:{server.server_port}/v1", timeout_s=20)
try:
    ask_planner(lm, dict(model="m", cluster="c", baseline="b", best_so_far="b", bottleneck="x",
                         goal="", axes="tp", history=""), 20)
except Exception:
    pass
print(json.dumps({"seen": seen, "urls": urls}))
'''


def test_no_internet_metadata_refresh_with_a_loopback_server():
    """LITELLM_LOCAL_MODEL_COST_MAP and LITELLM_OFFLINE_MODE are True before DSPy (or litellm) is
    imported, and a call to a loopback server makes no other request (DSPy's model-metadata
    refresh from raw.githubusercontent.com; issue 30 item 9)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("LITELLM_LOCAL_MODEL_COST_MAP", "LITELLM_OFFLINE_MODE")}
    done = subprocess.run([sys.executable, "-c", OFFLINE_PROBE], capture_output=True, text=True,
                          env=env, timeout=120, check=True)
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["seen"].get("dspy") == ["True", "True"]
    assert all(v == ["True", "True"] for v in probe["seen"].values())
    assert probe["urls"] == []
