"""Issue 28: the three-state memory verdict, the overhead spread it reads, the default margin
derived from it, --framework's recipe defaults, and the two published FP8 + FSDP runs."""

from __future__ import annotations

import csv
import json
import math

import pytest

from benchmarks.memory import ROOT, peak_ratios, spread_table
from tune_cp.config.specs import Fp8Recipe
from tune_cp.formats.frameworks import Framework, framework_defaults
from tune_cp.formats.runs import read_runs
from tune_cp.oracle.memory_verdict import (
    SPREAD_FILE,
    MemoryState,
    Spread,
    memory_state,
    quantile,
    spread_for,
)
from tune_cp.solver.defaults import DEFAULT_MEMORY_MARGIN

RUNS = ROOT / "benchmarks" / "published_runs.csv"


def test_spread_file_is_what_the_calibration_peaks_give():
    """oracle/catalog/memory_spread.json is recomputed from the published peaks with today's
    memory model: a change to the model that moves a ratio must rewrite it
    (python benchmarks/memory.py --write-spread)."""
    raw = {r["row_id"]: r for r in csv.DictReader(open(RUNS, newline=""))}
    fams = spread_table(peak_ratios(read_runs(RUNS), raw))
    assert fams == json.loads(SPREAD_FILE.read_text())["families"]
    assert sorted(fams) == ["megatron", "torchtitan"]
    assert len(fams["megatron"]["ratios"]) == 5 and len(fams["torchtitan"]["ratios"]) == 14
    for v in fams.values():  # the stated spread holds every calibration peak (acceptance: 80%)
        assert all(v["low"] <= x <= v["high"] for x in v["ratios"].values())


def test_default_margin_is_derived_from_the_spread_once():
    """The default margin is 1 - 1/low of the Megatron family, rounded up to 0.001, not a 5%
    added on top of the fragmentation term."""
    low = spread_for("megatron").low
    assert DEFAULT_MEMORY_MARGIN == math.ceil((1 - 1 / low) * 1000) / 1000
    assert 0 <= DEFAULT_MEMORY_MARGIN < 0.05


def test_three_states_by_hand():
    s = Spread("megatron", low=1.0, median=1.1, high=1.2, rows=5)
    hbm = 120
    assert memory_state(100, hbm, s) is MemoryState.FITS  # 100 x 1.2 = 120: fits
    assert memory_state(101, hbm, s) is MemoryState.EDGE  # 121.2 > 120 >= 101
    assert memory_state(120, hbm, s) is MemoryState.EDGE
    assert memory_state(121, hbm, s) is MemoryState.OUT_OF_MEMORY
    assert Spread("t", low=0.9, median=1, high=1.1, rows=3).margin() == 0.0  # never above HBM
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert spread_for("unknown").family == "megatron"


def test_framework_defaults_follow_the_recipes():
    bridge = {d.field: d.value for d in framework_defaults(Framework.BRIDGE, None, True)}
    assert bridge == {"grad_reduce_in_fp32": False, "fp8_param_gather": True}
    block = {d.field: d.value for d in framework_defaults(Framework.BRIDGE, Fp8Recipe.BLOCKWISE,
                                                          True)}
    assert block == {"grad_reduce_in_fp32": False}  # blockwise recipes: fp8_param_gather False
    assert {d.field: d.value for d in framework_defaults(Framework.BRIDGE, None, False)} == \
        {"grad_reduce_in_fp32": False}
    for fw in (Framework.MEGATRON_LM, Framework.PRIMUS, Framework.TORCHTITAN):
        assert {d.field: d.value for d in framework_defaults(fw, None, True)} == \
            {"grad_reduce_in_fp32": True, "fp8_param_gather": False}


LLAMA70_FSDP = ("check", "--model", "llama3-70b", "--gpu", "gb200", "--nodes", "16",
                "--gpus-per-node", "4", "--precision", "fp8", "--seq-len", "8192", "--gbs",
                "256", "--mbs", "2", "--tp", "1", "--pp", "1", "--fsdp", "--recompute", "full")
LLAMA405_FSDP = ("check", "--model", "llama3.1-405b", "--gpu", "gb200", "--nodes", "32",
                 "--gpus-per-node", "4", "--precision", "fp8", "--seq-len", "8192", "--gbs",
                 "64", "--mbs", "1", "--tp", "2", "--pp", "1", "--fsdp", "--recompute", "full")


@pytest.mark.parametrize(("args", "peak_gib", "bridge_gib"), [
    (LLAMA70_FSDP, 192.84, 58.26), (LLAMA405_FSDP, 472.96, 81.57)])
def test_published_fp8_fsdp_runs_fit_with_bridge_defaults(run_json, run_cli, args, peak_gib,
                                                           bridge_gib):
    """The two Megatron-Bridge FP8 + FSDP runs of issue 28. Under Megatron-LM's defaults (bf16
    parameters) Transformer Engine caches every layer's FP8 weights whole, and the check says
    so and names --fp8-param-gather as the change that gives room; with Megatron-Bridge's
    recipe defaults (FP8 parameters, bf16 gradients) they fit."""
    code, data = run_json(*args)
    assert code == 1 and round(data["memory"]["peak_bytes"] / 2**30, 2) == peak_gib
    assert data["memory_verdict"]["state"] == "out of memory"
    assert data["memory_verdict"]["deciding_term"] == "fp8_weight_cache"
    assert data["memory_verdict"]["room"].startswith("--fp8-param-gather (")
    code, data = run_json(*args, "--framework", "bridge")
    assert code == 0 and round(data["memory"]["peak_bytes"] / 2**30, 2) == bridge_gib
    assert data["memory_verdict"]["state"] == "fits"
    code, out, _ = run_cli(*args, "--framework", "bridge")
    assert "--framework bridge: --grad-reduce-in-bf16 (" in out and "--fp8-param-gather (" in out
    assert "verdict: legal, fits" in out


def test_edge_verdict_names_the_term_and_the_change(run_cli):
    """Llama 3 70B on 64 H100, TP4 PP8 VPP5, FP8, no recompute (Megatron-Bridge's recipe: FP8
    parameters, bf16 gradients, no fragmentation allowance under expandable segments): 72.0 GiB
    predicted, above 80 / 1.18 = 68.0 GiB, below 80 GiB: at the edge; FSDP (67.9 GiB) is the
    fastest single change that fits, before full recompute."""
    code, out, _ = run_cli("check", "--model", "llama3-70b", "--gpu", "h100", "--nodes", "8",
                           "--precision", "fp8", "--seq-len", "8192", "--gbs", "128", "--mbs",
                           "1", "--tp", "4", "--pp", "8", "--vpp", "5", "--framework", "bridge")
    assert code == 0 and "verdict: legal, at the edge" in out
    assert "memory: peak 72.0 GiB" in out and "activations (46.7 GiB) decides" in out
    assert "--overhead fragmentation=0 (--framework bridge: expandable_segments" in out
    assert "cheapest change that gives room: --fsdp (peak 67.9 GiB, fits; " in out


def test_search_ranks_edge_configurations_and_marks_them(run_cli, run_json):
    """Llama 3 70B FP8 on 64 H100: the fastest layouts keep every activation (no recompute,
    70-80 GiB of 80): legal, ranked, and marked at the edge; --json rows carry the state."""
    args = ("--model", "llama3-70b", "--gpu", "h100", "--nodes", "8", "--precision", "fp8")
    code, data = run_json(*args)
    states = [row["memory"]["state"] for row in data["top"]]
    assert code == 0 and states[0] == "at the edge"
    hbm = data["top"][0]["memory"]["hbm_bytes"]
    for row in data["top"]:
        peak = row["memory"]["peak_bytes"]
        assert row["memory"]["state"] == ("fits" if peak * spread_for(None).high <= hbm
                                          else "at the edge")
        assert peak <= row["memory"]["limit_bytes"]
    code, out, _ = run_cli(*args)
    assert "at the edge of memory" in out and "  memory edge: legal, but above 68.0 GiB" in out


def test_search_takes_the_framework_defaults(run_json):
    """--framework bridge fixes FP8 parameters and bf16 gradients for the whole search (the
    space's fixed settings, like --grad-reduce-in-bf16): every ranked configuration has them,
    and the defaults line says where they come from; Megatron-LM's defaults are the flags'."""
    args = ("--model", "llama3-8b", "--gpu", "b200", "--nodes", "1", "--precision", "fp8",
            "--top", "3")
    code, data = run_json(*args, "--framework", "bridge")
    assert code == 0 and data["best"]["fp8_param_gather"] is True
    assert all(r["fp8_param_gather"] and not r["grad_reduce_in_fp32"] for r in data["top"])
    assert any(d.startswith("--framework bridge: --grad-reduce-in-bf16 (")
               for d in data["defaults"])
    code, plain = run_json(*args)
    assert plain["best"]["fp8_param_gather"] is False and plain["best"]["grad_reduce_in_fp32"]
    assert "--framework megatron-lm (default)" in plain["defaults"]
    code, data = run_json(*args, "--fp8-param-gather")
    assert data["best"]["fp8_param_gather"] is True and data["best"]["grad_reduce_in_fp32"]


def test_plan_marks_the_memory_state(run_cli, run_json):
    """Llama 3 70B on H100: 2 nodes are legal (TP8 PP2, 79.6 of 80 GiB) but at the edge."""
    code, data = run_json("plan", "--model", "llama3-70b", "--gpu", "h100", "--points", "3")
    pts = data["gpus"][0]["points"]
    assert code == 0 and pts[0]["nodes"] == 2 and pts[0]["memory_state"] == "at the edge"
    assert {p["memory_state"] for p in pts} <= {"fits", "at the edge"}
    code, out, _ = run_cli("plan", "--model", "llama3-70b", "--gpu", "h100", "--points", "3")
    assert "fits from 2 nodes (16 GPUs), at the edge of memory" in out


def test_fsdp_fp8_cache_hint_names_fp8_parameters(run_json):
    code, data = run_json(*LLAMA70_FSDP)
    (v,) = data["violations"]
    assert v["rule"] == "hbm" and "use FP8 parameters (--fp8-param-gather" in v["message"]


def test_plan_takes_the_framework(run_json):
    """plan --framework bridge: FP8 parameters and bf16 gradients for every node count."""
    code, data = run_json("plan", "--model", "llama3-8b", "--gpu", "b200", "--precision", "fp8",
                          "--points", "1", "--framework", "bridge")
    cfg = data["gpus"][0]["points"][0]["config"]
    assert code == 0 and cfg["fp8_param_gather"] is True and cfg["grad_reduce_in_fp32"] is False
    assert any(d.startswith("--framework bridge: ") for d in data["defaults"])
    code, data = run_json("plan", "--model", "llama3-8b", "--gpu", "b200", "--precision", "fp8",
                          "--points", "1")
    cfg = data["gpus"][0]["points"][0]["config"]
    assert cfg["fp8_param_gather"] is False and cfg["grad_reduce_in_fp32"] is True


def test_framework_names_are_the_frameworks():
    from tune_cp.solver.defaults import FRAMEWORK_NAMES

    assert FRAMEWORK_NAMES == tuple(f.value for f in Framework)


def test_torchtitan_search_marks_rows_by_its_spread_and_equals_check(run_cli, run_json):
    """Llama 3 8B on 8 H100 under --framework torchtitan: every row's state is read with the
    torchtitan spread (high 1.69: fits up to 80 / 1.69 = 47.3 GiB), TP2 PP1 at 58.3 GiB (which
    fits Megatron's 1.18) is at the edge, and the answer is the fastest that fits, TP2 PP2 at
    47.2 GiB; its check line (with --framework torchtitan) gives the same state and deciding
    term."""
    tt, mg = spread_for("torchtitan"), spread_for(None)
    assert tt.high == pytest.approx(1.69, abs=0.005)
    args = ("--model", "llama3-8b", "--gpu", "h100", "--nodes", "1")
    code, data = run_json(*args, "--framework", "torchtitan")
    assert code == 0
    hbm = data["top"][0]["memory"]["hbm_bytes"]
    moved = 0
    for row in data["top"]:
        peak = row["memory"]["peak_bytes"]
        assert row["memory"]["state"] == ("fits" if peak * tt.high <= hbm else "at the edge")
        moved += peak * tt.high > hbm >= peak * mg.high
    assert moved >= 1
    best = data["best"]
    assert (best["tp"], best["pp"], best["memory"]["state"]) == (2, 2, "fits")
    assert best["memory"]["deciding_term"] == best["memory"]["dominant_term"] == "activations"
    assert data["check_command"].endswith(" --framework torchtitan")
    code, plain = run_json(*args)
    assert (plain["best"]["tp"], plain["best"]["pp"]) == (2, 1)  # Megatron's spread: it fits
    code, checked = run_json(*data["check_command"].split()[1:])
    verdict = checked["memory_verdict"]
    assert (verdict["family"], verdict["state"], verdict["deciding_term"]) == (
        "torchtitan", best["memory"]["state"], best["memory"]["deciding_term"])
    code, out, _ = run_cli(*args, "--framework", "torchtitan")
    assert "  memory edge: legal, but above 47.3 GiB (80 GiB HBM / 1.69)" in out


def test_search_rows_name_the_deciding_term_check_names():
    """Each --json row's memory carries the state and the term that decides it: that of
    ``check`` on the row's configuration (same peak, same largest term of the most loaded
    stage). Llama 3 70B FP8 on 64 H100: the fastest rows keep every activation, at the edge,
    activations decide."""
    from tune_cp.agent.search import SearchOptions, search
    from tune_cp.agent.serialize import ranked_row, search_json
    from tune_cp.config.specs import ClusterSpec, Precision, TrainingSpec
    from tune_cp.oracle.catalog import load_gpu, load_model
    from tune_cp.solver.check import check_configuration

    model = load_model("llama3-70b")
    cluster = ClusterSpec(gpu=load_gpu("h100"), num_nodes=8, gpus_per_node=8)
    training = TrainingSpec(seq_len=8192, global_batch_size=128, precision=Precision.FP8)
    r = search(model, cluster, training, SearchOptions(top_k=3))
    rows = [ranked_row(r, g.head) for g in r.groups]
    assert rows[0]["memory"]["state"] == "at the edge"
    assert rows[0]["memory"]["deciding_term"] == "activations"
    for g, row in zip(r.groups, rows, strict=True):
        out = check_configuration(model, cluster, training, r.ranked.configs[g.head],
                                  settings=r.options.settings)
        assert out.memory.peak_bytes == row["memory"]["peak_bytes"]
        assert out.memory.dominant_term == row["memory"]["deciding_term"]
    best = search_json(r)["best"]["memory"]
    assert best["deciding_term"] == r.best.outcome.memory.dominant_term
    assert best["state"] in ("fits", "at the edge")


def test_json_doc_lists_the_ranked_rows_memory_keys(run_json):
    """docs/json.md names the keys of a ranked row's memory object, as search --json writes
    them (each top row, its variants, oracle_best), and the verdict keys of best.memory."""
    import pathlib
    import re

    doc = (pathlib.Path(__file__).parent.parent / "docs" / "json.md").read_text()
    line = re.search(r"The memory of a ranked row \(.*?\):\s*(.*?)\.\s", doc, re.S).group(1)
    keys = re.findall(r"`(\w+)`", line)
    code, data = run_json("--model", "llama3-8b", "--gpu", "h100", "--nodes", "1", "--top", "2")
    rows = [data["oracle_best"]] + [r for t in data["top"] for r in (t, *t["variants"])]
    assert code == 0 and all(list(r["memory"]) == keys for r in rows)
    assert {"state", "deciding_term"} <= set(data["best"]["memory"])


def test_plan_reads_the_frameworks_spread(run_json):
    """plan --framework torchtitan: each node count's answer is the search's under torchtitan's
    spread (Llama 3 8B on one H100 node: TP2 PP2 at 47.2 GiB, fits below 80 / 1.69; Megatron's
    TP2 PP1 at 58.3 GiB would be at the edge there)."""
    args = ("plan", "--model", "llama3-8b", "--gpu", "h100", "--points", "1")
    code, data = run_json(*args, "--framework", "torchtitan")
    (pt,) = data["gpus"][0]["points"]
    assert code == 0 and (pt["nodes"], pt["config"]["tp"], pt["config"]["pp"]) == (1, 2, 2)
    assert pt["memory_state"] == "fits"
    assert pt["peak_bytes"] * spread_for("torchtitan").high <= 80 * 2**30
    code, data = run_json(*args)
    (pt,) = data["gpus"][0]["points"]
    assert (pt["config"]["tp"], pt["config"]["pp"], pt["memory_state"]) == (2, 1, "fits")
    assert pt["peak_bytes"] * spread_for("torchtitan").high > 80 * 2**30


@pytest.mark.parametrize("extra", [
    ("--framework", "bridge", "--allow-fp8"),  # FP8 candidates of a bf16 search: bf16 weights
    ("--framework", "torchtitan"),
    ("--framework", "bridge", "--precision", "fp8"),
])
def test_check_line_reproduces_the_answer_and_its_state_under_a_framework(run_json, extra):
    code, data = run_json("--model", "llama3-8b", "--gpu", "h100", "--nodes", "1", "--top", "1",
                          *extra)
    best = data["best"]
    code, checked = run_json(*data["check_command"].split()[1:])
    assert checked["config"]["fp8_param_gather"] == best["fp8_param_gather"]
    assert checked["memory"]["peak_bytes"] == best["memory"]["peak_bytes"]
    assert checked["projection"]["tokens_per_s_per_gpu"] == pytest.approx(
        best["projection"]["tokens_per_s_per_gpu"], rel=1e-12)
    assert checked["memory_verdict"]["state"] == best["memory"]["state"]
    assert ("--framework torchtitan" in data["check_command"]) == ("torchtitan" in extra)
