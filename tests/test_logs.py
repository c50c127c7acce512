"""Training logs (formats/logs.py), the refit for a cluster (calibration/refit.py,
``tune-cp calibrate --log``), the verification launches (``--verify``) and the intervals
(oracle/uncertainty.py). The real excerpts in tests/data/logs are quoted from public threads
(tests/data/logs/SOURCES.md has each URL)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import setting
from tune_cp.agent.search import GROUP_TOLERANCE, SearchOptions, memory_fits, search
from tune_cp.calibration.refit import read_log_runs
from tune_cp.config.resolve import resolve_config
from tune_cp.config.specs import ClusterSpec, ParallelConfig, TrainingSpec
from tune_cp.formats.logs import read_log
from tune_cp.oracle.catalog import load_gpu, load_model
from tune_cp.oracle.uncertainty import ResidualTable, class_features
from tune_cp.solver.check import check_configuration, check_projection

LOGS = Path(__file__).parent / "data" / "logs"


def test_megatron_log_from_issue_756():
    """Megatron-LM, Mixtral 8x7B on 16 H100: iterations 71-73 (5361.6, 5470.7, 5829.9 ms; the
    median is 5470.7), 238.7 TFLOP/s/GPU median, global batch 128, and the start-up size line."""
    m = read_log(LOGS / "megatron_mixtral8x7b_h100_issue756.log")
    assert m.framework == "megatron" and m.iterations == 3
    assert m.step_time_s == pytest.approx(5.4707)
    assert m.tflops_per_gpu == pytest.approx(238.7)
    assert m.global_batch_size == 128 and m.world_size == 16
    assert m.sizes == {"data_parallel": 4, "context_parallel": 1, "tensor_parallel": 4,
                       "pipeline_parallel": 1}
    assert m.args["accumulate_allreduce_grads_in_fp32"] == "True" and len(m.args) == 12  # + bf16
    # read as a run: tp 4 from the size line (the quoted dump stops before it), 128 x 4096
    # tokens (Mixtral's catalog sequence length) per 5.4707 s on 16 GPUs
    [run] = read_log_runs([str(LOGS / "megatron_mixtral8x7b_h100_issue756.log")],
                          gpu=load_gpu("h100"), gpus_per_node=8, model=load_model("mixtral-8x7b"))
    assert run.reason is None
    assert (run.row.cfg.tp, run.row.cfg.pp, run.row.cfg.dp) == (4, 1, 4)
    seq = run.row.training.seq_len
    assert run.row.measured_tokens_per_s_per_gpu == pytest.approx(128 * seq / 5.4707 / 16)


def test_torchtitan_logs_from_public_threads():
    """torchtitan #1287: steps 200-250, tps 5,856 5,593 5,868 5,869 5,864 5,862 (median 5,863),
    mfu median 34.335%, memory 49.66 GiB; #2389: the grad_norm column and one line per rank
    (steps 4 and 5 once each: tps 10,050 and 10,007)."""
    m = read_log(LOGS / "torchtitan_issue1287.log")
    assert m.framework == "torchtitan" and m.iterations == 6
    assert m.tokens_per_s_per_gpu == pytest.approx(5863.0)
    assert m.mfu == pytest.approx(0.34335)
    assert m.peak_bytes == int(49.66 * 2**30)
    m2 = read_log(LOGS / "torchtitan_pr2389.log")
    assert m2.iterations == 2 and m2.tokens_per_s_per_gpu == pytest.approx(10028.5)


def test_not_a_log_is_one_line_error(tmp_path, run_cli):
    p = tmp_path / "x.log"
    p.write_text("hello\n")
    code, _, err = run_cli("calibrate", "--log", str(p), "--gpu", "h100")
    assert code == 2 and "no training iteration line" in err and len(err.strip().splitlines()) == 1


def megatron_log(path: Path, model, cluster, training, cfg, tokens_per_s_per_gpu: float) -> None:
    """A log in Megatron-LM's format (size line, argument dump, iteration lines, memory report)
    for a run at ``tokens_per_s_per_gpu``; the first iteration is 30 % slower (warm-up)."""
    step_ms = (training.global_batch_size * training.seq_len / tokens_per_s_per_gpu
               / cluster.world_size * 1000)
    lines = [(f"using world size: {cluster.world_size}, data-parallel size: {cfg.dp}, "
             f"context-parallel size: {cfg.cp} tensor-model-parallel size: {cfg.tp}, "
             f"pipeline-model-parallel size: {cfg.pp} "),
             "------------------------ arguments ------------------------"]
    args = {"bf16": "True", "tensor_model_parallel_size": cfg.tp,
            "pipeline_model_parallel_size": cfg.pp, "micro_batch_size": cfg.mbs,
            "global_batch_size": training.global_batch_size, "seq_length": training.seq_len,
            "use_distributed_optimizer": "True"}
    if cfg.sequence_parallel:
        args["sequence_parallel"] = "True"
    lines += [f"  {k} {'.' * (48 - len(k))} {v}" for k, v in sorted(args.items())]
    lines.append("-------------------- end of arguments ---------------------")
    for it in range(1, 11):
        ms = step_ms * (1.3 if it == 1 else 1.0)
        lines.append(f" [2026-12-01 10:00:{it:02d}] iteration {it:>8}/      10 | consumed samples: "
                     f"{it * training.global_batch_size:>8} | elapsed time per iteration (ms): "
                     f"{ms:.1f} | throughput per GPU (TFLOP/s/GPU): 300.0 | global batch size: "
                     f"{training.global_batch_size:>5} | lm loss: 9.0E+00 |")
    lines.append("[Rank 0] (after 10 iterations) memory (MB) | allocated: 40000.0 | max "
                 "allocated: 60000.5 | reserved: 65000.0 | max reserved: 65000.0")
    path.write_text("\n".join(lines) + "\n")


def test_refit_on_a_slower_cluster_moves_its_projections_down(tmp_path, run_cli, run_json):
    """Four logs of Llama 3 8B on one H100 node, each measured at 70 % of the shipped projection
    (the projection `check` prints): the refit moves every logged configuration's projection
    towards its measurement, and a configuration that was not logged (TP4, mbs 2) projects lower
    with the cluster's calibration, by at least a third of the gap."""
    model, gpu = load_model("llama3-8b"), load_gpu("h100")
    cl = ClusterSpec(gpu=gpu, num_nodes=1, gpus_per_node=8)
    tr = TrainingSpec(seq_len=8192, global_batch_size=128)
    paths = []
    for i, (tp, pp, mbs) in enumerate([(1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 2)]):
        cfg = resolve_config(ParallelConfig(tp=tp, pp=pp, mbs=mbs), model, cl, tr)
        p = check_projection(check_configuration(model, cl, tr, cfg)).tokens_per_s_per_gpu
        megatron_log(tmp_path / f"run{i}.log", model, cl, tr, cfg, 0.7 * p)
        paths += ["--log", str(tmp_path / f"run{i}.log")]
    out = tmp_path / "cluster.json"
    code, data = run_json("calibrate", *paths, "--gpu", "h100", "--model", "llama3-8b",
                          "--out", str(out), "--json")
    assert code == 0 and out.exists()
    for r in data["rows"]:
        m, b, a = (r["measured_tokens_per_s_per_gpu"], r["projected_before"],
                   r["projected_after"])
        assert m == pytest.approx(0.7 * b, rel=1e-3)  # as read back from the arguments
        assert abs(np.log(a / m)) < abs(np.log(b / m)) / 2  # at least half the gap closed
    assert data["logs"][0]["log"]["peak_bytes"] == int(60000.5 * 2**20)
    assert all(r["modelled_peak_bytes"] > 0 and r["measured_peak_kind"] == "max allocated"
               for r in data["rows"])
    held = ["check", "--model", "llama3-8b", "--gpu", "h100", "--nodes", "1", "--gbs", "128",
            "--tp", "4", "--mbs", "2"]
    _, before = run_json(*held, "--json")
    _, after = run_json(*held, "--calibration", str(out), "--json")
    b = before["projection"]["tokens_per_s_per_gpu"]
    a = after["projection"]["tokens_per_s_per_gpu"]
    assert a < b - (b - 0.7 * b) / 3


def test_verify_writes_launches_that_read_back(tmp_path, run_cli):
    d = tmp_path / "verify"
    code, out, _ = run_cli("--model", "llama3-8b", "--gpu", "h100", "--nodes", "1", "--top", "3",
                           "--verify", "2", "--verify-dir", str(d))
    assert code == 0 and "verify: 2 short benchmark launches" in out
    folders = sorted(p for p in d.iterdir() if p.is_dir())
    assert len(folders) == 2 and (d / "README.txt").exists()
    args = (folders[0] / "megatron.args").read_text()
    for flag in ("--train-iters 30", "--log-interval 1", "--log-throughput", "--eval-iters 0"):
        assert flag in args
    primus = yaml.safe_load((folders[0] / "primus.yaml").read_text())
    overrides = primus["modules"]["pre_trainer"]["overrides"]
    assert overrides["train_iters"] == 30 and overrides["log_throughput"] is True
    assert type(overrides["norm_epsilon"]) is float and overrides["norm_epsilon"] == 1e-05
    assert "cfg.train.train_iters = 30" in (folders[0] / "bridge.py").read_text()
    code, out, _ = run_cli("check", "--megatron-args", args, "--gpu", "h100", "--nodes", "1")
    assert code == 0 and "verdict: legal, fits" in out


def test_interval_widens_to_the_parent_class():
    """A class with fewer than MIN_CLASS_ROWS rows takes its parent's quantiles; the interval is
    projected x exp(q): 1000 x exp(log 0.9) = 900 and 1000 x exp(log 1.2) = 1200."""
    f = class_features("hopper", False, 1, 1, "bf16")
    data = {"classes": {
        "all": {"rows": 100, "q_lo": np.log(0.5), "q_mid": 0.0, "q_hi": np.log(2.0)},
        "arch=hopper": {"rows": 20, "q_lo": np.log(0.9), "q_mid": 0.0, "q_hi": np.log(1.2)},
        "arch=hopper|moe=dense": {"rows": 3, "q_lo": 0.0, "q_mid": 0.0, "q_hi": 0.0}}}
    t = ResidualTable(data)
    m, cl, tr = setting("llama3-8b", "h100", 1, 8192, 128)
    iv = t.interval(m, cl, tr, ParallelConfig(), 1000.0)
    assert iv.own == "|".join(f"{k}={v}" for k, v in zip(
        ("arch", "moe", "vpp", "cp", "prec"), f, strict=True))
    assert iv.used.key == "arch=hopper" and iv.widened
    assert (iv.low, iv.high) == (pytest.approx(900.0), pytest.approx(1200.0))
    gpu = cl.gpu.model_copy(update={"architecture": ""})
    iv2 = t.interval(m, cl.model_copy(update={"gpu": gpu}), tr, ParallelConfig(), 1000.0)
    assert iv2.used.key == "all" and iv2.low == pytest.approx(500.0)


def test_a_hybrid_model_never_borrows_a_transformer_interval():
    """A hybrid Mamba configuration takes its interval from hybrid rows only: with a Hopper
    dense class of 20 rows and a hybrid pool of 10 (log 0.7 .. log 0.8), 1000 projected gives
    700-800, and the pool is used although the Hopper class has more rows."""
    data = {"classes": {
        "all": {"rows": 100, "q_lo": np.log(0.5), "q_mid": 0.0, "q_hi": np.log(2.0)},
        "arch=hopper": {"rows": 20, "q_lo": np.log(0.9), "q_mid": 0.0, "q_hi": np.log(1.2)},
        "moe=hybrid": {"rows": 10, "q_lo": np.log(0.7), "q_mid": 0.0, "q_hi": np.log(0.8)}}}
    m, cl, tr = setting("nemotron-h-8b", "h100", 1, 8192, 128)
    iv = ResidualTable(data).interval(m, cl, tr, ParallelConfig(), 1000.0)
    assert iv.own.startswith("arch=hopper|moe=hybrid|") and iv.used.key == "moe=hybrid"
    assert (iv.low, iv.high) == (pytest.approx(700.0), pytest.approx(800.0))


def test_shipped_residuals_keep_hybrid_rows_out_of_the_transformer_classes():
    """oracle/catalog/residuals.json: the 22 published Nemotron 3 rows (cross-validated with
    the Mamba kernel term they alone fit; not fitted on the shared constants) form the hybrid
    classes; the pooled ``all`` class holds only the 194 fitted rows' out-of-fold residuals;
    the hybrid pool's median is below zero (the hybrid projections still run fast) but its
    80% band now holds zero."""
    from tune_cp.oracle.uncertainty import load_residuals

    t = load_residuals()
    assert t.provenance["rows_not_fitted"] == t.classes["moe=hybrid"].rows == 22
    assert t.classes["all"].rows == 194 and t.provenance["rows"] == 194 + 22
    hybrid = t.classes["moe=hybrid"]
    assert hybrid.q_lo < hybrid.q_mid < 0 < hybrid.q_hi


def test_search_rows_are_distinct_and_the_answer_follows_its_rule():
    """Mixtral 8x22B on 4 MI355X nodes: each row's variants project within 0.1 % of its first
    member, consecutive rows are further apart, every row has an interval, and the answer has
    the highest lower bound (within the 0.5 % tie) of the feasible configurations that fit
    memory."""
    r = search(*setting("mixtral-8x22b", "mi355x", 4, 8192, 512), SearchOptions(top_k=10))
    adj = r.ranked.adjusted
    firsts = [float(adj[g.members[0]]) for g in r.groups]
    for g, top in zip(r.groups, firsts, strict=True):
        assert all(adj[i] >= top * (1 - GROUP_TOLERANCE) for i in g.members)
    for a, b in itertools.pairwise(firsts):
        assert b < a * (1 - GROUP_TOLERANCE)
    assert sum(g.answer for g in r.groups) <= 1
    low = r.ranked.lower
    fits = memory_fits(r.ranked, r.cluster.gpu.hbm_bytes, r.options.memory_spread)
    # the highest lower bound (within the tie) of the configurations that fit memory, or one at
    # the edge of memory more than the near-tie band above them (search.choose_answer)
    assert fits[r.answer_index] or low[r.answer_index] > low[fits].max() * (1 + r.near_tie_band)
    if fits[r.answer_index]:
        assert low[r.answer_index] >= low[fits].max() * (1 - 0.005)
    assert r.best.config == r.exhaustive_best.config or r.best_phase != "exhaustive"
    assert r.interval is not None and r.interval.low < r.best.throughput < r.interval.high
    from tune_cp.agent.report import render_search
    from tune_cp.agent.serialize import search_json

    text = "\n".join(render_search(r))
    assert "80% interval" in text and "  rule: the answer is the configuration with the highest " \
        "lower bound" in text and "distinct configurations" in text
    data = search_json(r)
    assert len(data["top"]) == len(r.groups)
    assert [bool(row["answer"]) for row in data["top"]].count(True) == sum(g.answer for g in r.groups)
    for row in data["top"]:
        iv = row["interval"]
        assert iv["low_tokens_per_s_per_gpu"] < row["projection"]["tokens_per_s_per_gpu"] \
            < iv["high_tokens_per_s_per_gpu"]
        assert all("interval" in v for v in row["variants"])
    assert data["best"]["interval"]["class_used"] and data["answer_rule"]


def test_check_and_plan_json_carry_the_interval(run_json):
    code, data = run_json("check", "--model", "llama3-8b", "--gpu", "h100", "--nodes", "1",
                          "--tp", "2", "--json")
    assert code == 0 and data["interval"]["class_used"].startswith("arch=hopper")
    low, high = data["interval"]["low_tokens_per_s_per_gpu"], data["interval"]["high_tokens_per_s_per_gpu"]
    assert low < data["projection"]["tokens_per_s_per_gpu"] < high
    code, plan = run_json("plan", "--model", "llama3-8b", "--gpu", "h100", "--points", "1",
                          "--json")
    assert code == 0 and plan["gpus"][0]["points"][0]["interval"]["quantiles"] == [0.1, 0.9]


def test_primus_line_with_instantaneous_and_average_columns():
    """Primus prints ``inst/avg``: the instantaneous 13372.8 ms, 567.6 TFLOP/s/GPU and 9801.4
    tokens/s/GPU are read, and ``hip mem usage`` 153.81 GB (GiB: Primus divides by 1024**3)."""
    m = read_log(LOGS / "primus_mi3xx_trainer_line.log")
    assert m.framework == "megatron" and m.iterations == 1
    assert m.step_time_s == pytest.approx(13.3728)
    assert m.tflops_per_gpu == pytest.approx(567.6)
    assert m.tokens_per_s_per_gpu == pytest.approx(9801.4)
    assert m.global_batch_size == 128
    assert m.peak_bytes == int(153.81 * 2**30) and m.peak_kind == "hip mem usage"


def test_torchtitan_log_with_its_job_toml():
    """torchtitan prints no configuration: the job TOML gives it (FSDP over 8 GPUs, local batch
    1 -> global batch 8, selective AC -> selective mlp); the measurement is the log's tps."""
    [run] = read_log_runs([str(LOGS / "torchtitan_issue1287.log")], gpu=load_gpu("h100"),
                          gpus_per_node=8, model=load_model("llama3-8b"), nodes=1,
                          config=str(LOGS / "torchtitan_llama3_8b_fsdp8.toml"))
    assert run.reason is None
    row = run.row
    assert row.software == "torchtitan" and row.measured_tokens_per_s_per_gpu == 5863.0
    assert (row.cfg.tp, row.cfg.pp, row.cfg.dp, row.cfg.fsdp) == (1, 1, 8, True)
    assert row.training.global_batch_size == 8 and row.training.seq_len == 8192
    assert row.cfg.recompute.value == "selective" and row.cfg.recompute_modules == ("mlp",)
    [bare] = read_log_runs([str(LOGS / "torchtitan_issue1287.log")], gpu=load_gpu("h100"),
                           gpus_per_node=8, model=load_model("llama3-8b"), nodes=1)
    assert bare.row is None and "job TOML with --config" in bare.reason
