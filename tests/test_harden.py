"""Regression tests of the causes the issue-14 fuzz campaign found (one per cause), and of the
leftovers fixed with them: the plan's answer rule, check's stated defaults, ``--trials-out``,
node-count grammar, the Nemotron 3 parameter counts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.fuzzing import NEMOTRON_H
from tests.test_fuzz import one_line_error
from tune_cp.config.specs import ConfigError, nodes_text
from tune_cp.oracle import params as P
from tune_cp.oracle.catalog import load_model
from tune_cp.solver.defaults import DEFAULT_MEMORY_MARGIN

ROOT = Path(__file__).resolve().parent.parent
MIXTRAL_LOG = ROOT / "tests/data/logs/megatron_mixtral8x7b_h100_issue756.log"
TITAN_LOG = ROOT / "tests/data/logs/torchtitan_issue1287.log"

# ----------------------------------------------------------------- causes found by the campaign


def test_version_without_an_installed_distribution(run_cli, monkeypatch):
    """``--version`` from a checkout on PYTHONPATH (no distribution metadata) used to be an
    internal error (click's ``version_option`` raised RuntimeError); it reads pyproject.toml."""
    import importlib.metadata as md

    def missing(name: str) -> str:
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "version", missing)
    code, out, err = run_cli("--version")
    assert code == 0 and err == ""
    import tune_cp.cli as cli_module

    # a checkout has pyproject.toml beside cli.py; an installed copy (CI) has none
    beside = Path(cli_module.__file__).with_name("pyproject.toml").exists()
    expected = "0.1.0" if beside else "unknown"
    assert out == f"tune-cp, version {expected} (not installed)\n"


@pytest.mark.parametrize("old,new,field", [
    ("elapsed time per iteration (ms): 5470.7", "elapsed time per iteration (ms): " + "9" * 400,
     "elapsed time per iteration (ms)"),
    ("iteration       72/", "iteration       " + "7" * 5000 + "/", "iteration"),
    ("global batch size:   128", "global batch size:   " + "1" * 30, "global batch size"),
])
def test_log_numbers_beyond_any_measurement_are_one_line(run_cli, tmp_path, old, new, field):
    """A Megatron-LM log whose numbers overflow a float (OverflowError: cannot convert float
    infinity to integer) or Python's int parser (more than 4300 digits) is refused naming the
    log, the field and the value."""
    text = MIXTRAL_LOG.read_text()
    assert old in text
    log = tmp_path / "run.log"
    log.write_text(text.replace(old, new))
    code, _, err = run_cli("calibrate", "--log", log, "--gpu", "h100", "--model", "mixtral-8x7b")
    one_line_error(code, err, "run.log", field)
    assert len(err) < 400


def test_torchtitan_log_with_an_infinite_memory_is_one_line(run_cli, tmp_path):
    text = TITAN_LOG.read_text()
    log = tmp_path / "titan.log"
    log.write_text(text.replace("memory: ", "memory: 9" + "9" * 400, 1))
    code, _, err = run_cli("calibrate", "--log", log, "--gpu", "h100", "--model", "llama3-8b")
    one_line_error(code, err, "titan.log", "memory (GiB)")


@pytest.mark.parametrize("flag,value,says", [
    ("--hidden-size", "9" * 5000, "more than 19 digits"),
    ("--num-layers", "1" * 25, "more than 19 digits"),
])
def test_megatron_integers_beyond_int64_are_one_line(run_cli, flag, value, says):
    """``check --megatron-args`` with a 5,000-digit integer used to be an internal error
    (ValueError: Exceeds the limit (4300 digits) for integer string conversion)."""
    args = (f"--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 2048 "
            f"--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 "
            f"--vocab-size 32000 {flag} {value}")
    code, _, err = run_cli("check", "--megatron-args", args, "--gpu", "h100", "--nodes", "1")
    one_line_error(code, err, flag, says)
    assert len(err) < 300  # the value is cut, not repeated in full


def test_huge_value_in_an_error_is_cut():
    from tune_cp.formats.keys import MAX_SHOWN_CHARS, _show

    shown = _show("7" * 5000)
    assert len(shown) == MAX_SHOWN_CHARS and shown.endswith("...")
    assert _show("8k") == "'8k'"


def test_nemotron_h_groups_error_names_the_config_keys(tmp_path):
    """Mamba heads that the groups do not divide: the error names config.json's keys
    (mamba_num_heads, n_groups), not MambaSpec's fields (num_heads, num_groups)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(NEMOTRON_H | {"mamba_num_heads": 63, "n_groups": 8}))
    with pytest.raises(ConfigError) as e:
        load_model(str(path))
    msg = str(e.value)
    assert "'mamba_num_heads' (63) must be a multiple of 'n_groups' (8)" in msg
    assert "num_heads (" not in msg
    path.write_text(json.dumps({k: v for k, v in NEMOTRON_H.items() if k != "n_groups"}
                               | {"mamba_num_heads": 20}))
    with pytest.raises(ConfigError, match=r"'n_groups' \(NemotronHConfig default\) \(8\)"):
        load_model(str(path))


def test_baseline_that_does_not_divide_the_cluster_is_refused(run_cli):
    """``--baseline tp=3`` on 8 GPUs was reported as 'TP3 PP1 DP2' (a rounded-down DP): no
    layout has it, so it is refused naming the sizes that divide."""
    code, _, err = run_cli("--model", "llama3-8b", "--gpu", "h100", "--nodes", "1",
                           "--baseline", "tp=3")
    one_line_error(code, err, "--baseline 'tp=3'", "3 x 1 x 1 = 3", "1 node x 8",
                   "choose tp in {1, 2, 4, 8}")
    assert "DP2" not in err


# ------------------------------------------------------------------------------- leftovers


def test_node_counts_in_words():
    assert nodes_text(1) == "1 node" and nodes_text(2) == "2 nodes"


def test_world_size_message_says_one_node(run_cli):
    code, out, _ = run_cli("check", "--model", "llama3-8b", "--gpu", "h100", "--nodes", "1",
                           "--tp", "3")
    assert code == 1 and "(1 node x 8)" in out and "1 nodes" not in out


def test_check_states_its_defaults(run_cli, run_json):
    code, out, _ = run_cli("check", "--model", "mixtral-8x7b", "--gpu", "h100", "--nodes", "1",
                           "--tp", "2", "--ep", "4")
    line = next(x for x in out.splitlines() if x.startswith("defaults: "))
    assert "--pp 1 --vpp 1 --cp 1 --mbs 1 --recompute none --dispatcher alltoall " \
           "--sync-free-stage 0 --grouped-gemm te (flag defaults" in line
    assert f"--memory-margin {DEFAULT_MEMORY_MARGIN:g} (default)" in line and "--tp" not in line
    code, data = run_json("check", "--model", "llama3-8b", "--gpu", "h100", "--nodes", "1",
                          "--memory-margin", "0.1", "--mbs", "2")
    assert not any("--memory-margin" in d or "--mbs" in d or "dispatcher" in d
                   or "sync-free" in d or "grouped-gemm" in d for d in data["defaults"])


def test_trials_out_holds_every_configuration_of_the_ranking(run_cli, run_json, tmp_path):
    out = tmp_path / "t.jsonl"
    code, data = run_json("--model", "llama3-8b", "--gpu", "h100", "--nodes", "1",
                          "--trials-out", out)
    assert code == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    ranking = [x for x in lines if x["phase"] == "exhaustive ranking"]
    assert len(ranking) == data["feasible_count"] > 100
    assert [x["rank"] for x in ranking] == list(range(1, len(ranking) + 1))
    assert all(x["interval"]["low_tokens_per_s_per_gpu"] <= x["tokens_per_s_per_gpu"]
               for x in ranking)
    assert lines[0]["phase"] == "baseline"


def test_plan_rows_follow_the_search_answer_rule(run_cli):
    """Each plan row is the search's answer at its node count: ``choose_answer`` of the
    exhaustive ranking (the highest lower bound of the 80% interval, near ties to the least
    exotic) unless the seed phase's best has a higher lower bound, and the output says so."""
    from tests.conftest import setting
    from tune_cp.agent.plan import plan, training_for_precision
    from tune_cp.agent.search import SearchOptions, choose_answer, memory_fits, search
    from tune_cp.config.specs import Precision
    from tune_cp.oracle.catalog import load_gpu

    model = load_model("llama3-8b")
    (p,) = plan(model, [(load_gpu("h100"), 8)], training_for_precision(8192, 128,
                                                                       Precision.BF16),
                max_nodes=2, points=2)
    for q in p.points:
        m, cl, tr = setting("llama3-8b", "h100", q.nodes, 8192, 128)
        r = search(m, cl, tr, SearchOptions())
        assert q.phase == r.best_phase
        assert q.tokens_per_s_per_gpu == pytest.approx(r.best.throughput, rel=1e-12)
        c = r.best.config
        assert (q.config["tp"], q.config["pp"], q.config["vpp"], q.config["cp"],
                q.config["mbs"]) == (c.tp, c.pp, c.vpp, c.cp, c.mbs)
        if r.best_phase == "exhaustive":
            ranked = r.ranked
            fits = memory_fits(ranked, cl.gpu.hbm_bytes, r.options.memory_spread)
            i = choose_answer(ranked, fits, r.near_tie_band)
            assert q.tokens_per_s_per_gpu == pytest.approx(float(ranked.tokens[i]), rel=1e-12)
            # the highest lower bound (within the tie) of the configurations that fit memory,
            # or one at the edge more than the near-tie band above them
            low = ranked.lower
            if fits[i] or not fits.any():
                pool = low[fits] if fits.any() else low
                assert float(low[i]) >= float(np.max(pool)) * (1 - 0.005)
            else:
                assert float(low[i]) > float(np.max(low[fits])) * (1 + r.near_tie_band)
    code, out, _ = run_cli("plan", "--model", "llama3-8b", "--gpu", "h100", "--max-nodes", "1",
                           "--points", "1")
    assert code == 0 and "by the search's rule: the answer is the configuration with the " \
                         "highest lower bound of its 80% interval" in out


def test_plan_guess_starts_near_the_smallest_cluster():
    """The smallest-cluster search starts from the model state over the usable HBM (a power of
    two, at most --max-nodes); 405B on H100: 405e9 x 18 B over 8 x 76 GiB is 11.2 nodes -> 16."""
    from tune_cp.agent.plan import guess_nodes
    from tune_cp.oracle.catalog import load_gpu
    from tune_cp.solver.settings import RunSettings

    m = load_model("llama3.1-405b")
    assert guess_nodes(m, load_gpu("h100"), 8, RunSettings(), 1024) == 16
    assert guess_nodes(m, load_gpu("h100"), 8, RunSettings(), 12) == 8
    assert guess_nodes(load_model("llama3-8b"), load_gpu("h100"), 8, RunSettings(), 1024) == 1


@pytest.mark.parametrize(("name", "with_mtp_b", "without_mtp_b"), [
    # Hugging Face's safetensors parameter counts of the BF16 checkpoints (the MTP layer
    # included): NVIDIA-Nemotron-3-Super-120B-A12B-BF16 "124B", -Ultra-550B-A55B-BF16 "561B";
    # conversions that drop the MTP layer (GGUF) show "121B" for Super
    ("nemotron-3-super", 124, 121), ("nemotron-3-ultra", 561, None),
])
def test_nemotron3_mtp_parameters_match_the_published_checkpoints(name, with_mtp_b,
                                                                   without_mtp_b):
    """The MTP block of Super/Ultra (attention + a full latent MoE of 512 experts, as
    mtp_hybrid_override_pattern '*E') adds about 2.9B / 11.2B: the published checkpoint sizes
    include it, so the count is right (not ~3B too many)."""
    m = load_model(name)
    assert round(P.total_params(m, include_mtp=True) / 1e9) == with_mtp_b
    if without_mtp_b is not None:
        assert round(P.total_params(m) / 1e9) == without_mtp_b


def test_torchrun_sizes_beyond_int64_are_a_note_not_an_internal_error(run_cli, tmp_path):
    """A launch script's ``torchrun --nproc-per-node`` of 5,000 digits (the campaign's
    "megatron args" kind, through a script) used to be an internal error (int() past 4300
    digits); it is not a GPU count, so it is noted, cut, and the flags decide."""
    script = tmp_path / "launch.sh"
    script.write_text("#!/bin/bash\ntorchrun --nproc-per-node " + "9" * 5000 + " pretrain_gpt.py"
                      " --num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length "
                      "2048 --max-position-embeddings 2048 --micro-batch-size 1 "
                      "--global-batch-size 64 --vocab-size 32000 --bf16\n")
    code, out, err = run_cli("check", "--megatron-args", script, "--gpu", "h100", "--nodes", "1")
    assert code in (0, 1), err
    assert "is not a number of GPUs per node" in out and len(max(out.splitlines(), key=len)) < 2000


@pytest.mark.parametrize("out", ["/proc/s.csv", "/nonexistent/dir/s.csv", "/dev/full"])
def test_sweep_output_that_cannot_be_written_is_refused_first(run_cli, tmp_path, out):
    """``sweep GRID --out /proc/s.csv`` used to run the grid and fail writing (internal error:
    FileNotFoundError for the temporary file beside it)."""
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\nmodels: [llama3-8b]\ngpus: [h100]\nnodes: [1]\n")
    code, _, err = run_cli("sweep", grid, "--out", out, "--no-progress")
    one_line_error(code, err, "--out")


def test_runs_row_with_zero_heads_is_skipped_with_its_reason(tmp_path):
    """A runs CSV row outside the catalog with num_attention_heads 0 used to be an internal
    error (ZeroDivisionError computing the head dimension); the row is skipped, saying why."""
    import csv
    import io

    from tune_cp.formats.runs import row_model

    rows = list(csv.DictReader(io.StringIO((ROOT / "benchmarks/published_runs.csv").read_text())))
    row = dict(rows[0], model="not-a-catalog-model", num_layers="4", hidden_size="1024",
               num_attention_heads="0", vocab_size="32000", notes="", moe_notes="",
               completeness="")
    spec, reason = row_model(row)
    assert spec is None and reason == "num_attention_heads 0 is not a positive integer"
