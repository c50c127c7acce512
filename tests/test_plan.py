"""Capacity planning's shortcuts give the answers of the plain computation: the existence probe
of the smallest-cluster search (``solver.feasible.any_feasible``) and the pipeline split read
without building the chunks (``oracle.memory.chunk_spans``, ``max_chunk_layers``)."""

from __future__ import annotations

import pytest

from tests.conftest import setting
from tune_cp.agent.plan import plan_problem
from tune_cp.config.specs import PipelineSplit
from tune_cp.oracle.memory import chunk_spans, max_chunk_layers, pipeline_chunks
from tune_cp.solver.feasible import any_feasible, enumerate_problem
from tune_cp.solver.settings import RunSettings


@pytest.mark.parametrize(("case", "constraints", "fits"), [
    # Mixtral 8x7B (47B parameters, 18 B each of model state = 846 GB) does not fit on one
    # node of H100 (8 x 80 GB), and does on two
    (("mixtral-8x7b", "h100", 1, 4096, 256), (), False),
    (("mixtral-8x7b", "h100", 2, 4096, 256), (), True),
    # no expert parallelism and at most tp 2 / pp 2: 47B over 4 GPUs' state does not fit
    (("mixtral-8x7b", "h100", 2, 4096, 256), ("ep == 1", "tp <= 2", "pp <= 2"), False),
    # the README's plan: Llama 3.1 405B fits from 6 nodes of B200, not 5
    (("llama3.1-405b", "b200", 5, 8192, 2048), (), False),
    # a constraint that nothing meets (tp 3 divides no GPU count of one node)
    (("llama3-8b", "h100", 1, 8192, 128), ("tp == 3",), False),
])
def test_any_feasible_answers_as_the_enumeration(case, constraints, fits):
    problem = plan_problem(*setting(*case), RunSettings(constraints=list(constraints)))
    assert any_feasible(problem) is fits
    assert (not enumerate_problem(problem, count_removed=False).empty) is fits


def test_max_chunk_layers_pinned_cases():
    """Legal and illegal geometries alike (explanations and the recompute tables read the
    latter): Llama 3.1 405B's 126 layers over 16 x 5 = 80 virtual stages (illegal) hold at most
    2 (the floor boundaries v 126 // 80), over 112 x 63 at most 1; under embedding_loss at pp 8
    the 128 slots split 16 each, the middle stages all decoder layers."""
    assert max_chunk_layers(126, 0, 16, 5, PipelineSplit.EVEN) == 2
    assert max_chunk_layers(126, 0, 112, 63, PipelineSplit.EVEN) == 1
    assert max_chunk_layers(126, 0, 8, 1, PipelineSplit.EMBEDDING_LOSS) == 16
    assert max_chunk_layers(126, 0, 1, 1, PipelineSplit.LIGHT_ENDS) == 126
    for pp, vpp in ((16, 5), (112, 63), (8, 1), (7, 3)):
        for split in (PipelineSplit.EVEN, PipelineSplit.EMBEDDING_LOSS, PipelineSplit.LIGHT_LAST):
            chunks = pipeline_chunks(126, 0, pp, vpp, split)
            assert sum(len(c.layers) for stage in chunks for c in stage) == 126
            assert max_chunk_layers(126, 0, pp, vpp, split) == max(
                len(c.layers) for stage in chunks for c in stage)


def test_chunk_spans_pinned_cases():
    """DeepSeek-V3 (61 layers + 1 MTP) under embedding_loss at pp 3: 63 slots (Megatron-LM
    counts num_layers + 2, the MTP layer is no slot) as 21 + 21 + 21, the embedding and layers
    0-19, layers 20-40, layers 41-60 and the loss, the MTP layer beside them on the last stage;
    under embedding_mtp_loss at pp 2: 64 slots as 32 + 32, the embedding and layers 0-30, layers
    31-60, the MTP layer and the loss; Llama 3.1 405B at pp 16 with light ends: 7 + 14 x 8 ... + 7
    (``uneven_stage_layers``)."""
    assert chunk_spans(61, 1, 3, 1, PipelineSplit.EMBEDDING_LOSS) == [
        (0, 20, True, False, 0), (20, 41, False, False, 0), (41, 61, False, True, 1)]
    assert chunk_spans(61, 1, 2, 1, PipelineSplit.EMBEDDING_MTP_LOSS) == [
        (0, 31, True, False, 0), (31, 61, False, True, 1)]
    spans = chunk_spans(126, 0, 16, 1, PipelineSplit.LIGHT_ENDS)
    assert [hi - lo for lo, hi, *_ in spans] == [7] + [8] * 14 + [7]


def test_plan_search_and_sweep_give_one_answer(tmp_path):
    """Same question, same answer (issue 30): a plan's row, ``tune-cp search`` and a sweep's
    row at one node count are one configuration with one projection. Nemotron 3 Super on 4
    nodes of B200 was a case where the seed phase's flex dispatcher (not in the space) beat
    the exhaustive answer (4,255 -> 6,796 tokens/s/GPU) and the plan printed the exhaustive
    answer only; the exhaustive ranking now tries the MoE backend presets on every layout
    (agent/backend.py) and finds the flex dispatcher with shared-expert overlap itself
    (6,433 with the fitted Mamba kernel rate; 7,263 before it)."""
    from tune_cp.agent.plan import plan, training_for_precision
    from tune_cp.agent.search import SearchOptions, search
    from tune_cp.agent.sweep import WorkerCache, load_grid, run_scenario
    from tune_cp.config.specs import Dispatcher, Precision

    model, cluster, training = setting("nemotron-3-super", "b200", 4, 8192, 512)
    (p,) = plan(model, [(cluster.gpu, 8)], training_for_precision(8192, 512, Precision.BF16),
                max_nodes=4, points=2)
    assert [q.nodes for q in p.points] == [2, 4]
    row = p.points[1]
    r = search(model, cluster, training, SearchOptions())
    assert r.best.config.dispatcher is Dispatcher.FLEX and r.best.config.shared_expert_overlap
    assert r.exhaustive_best.throughput == pytest.approx(r.best.throughput)
    grid = tmp_path / "grid.yaml"
    grid.write_text("models: [nemotron-3-super]\ngpus: [b200]\nnodes: [4]\nseq_len: 8192\n"
                    "global_batch: 512\n")
    (sc,) = load_grid(str(grid)).scenarios
    swept = run_scenario(sc, WorkerCache())
    assert row.phase == swept["best_phase"] == r.best_phase
    assert row.tokens_per_s_per_gpu == swept["tokens_per_s_per_gpu"] == r.best.throughput
    assert round(row.tokens_per_s_per_gpu) == 6433
    keys = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "mbs", "ga", "recompute",
            "recompute_layers", "dispatcher", "distributed_optimizer", "fsdp", "schedule",
            "pipeline_split")
    cfg = r.best.config
    assert {k: row.config[k] for k in keys} == {k: swept[k] for k in keys} == {
        k: (v.value if hasattr(v, "value") else v) for k, v in
        ((k, getattr(cfg, k if k != "etp" else "etp_")) for k in keys)}
    assert row.interval["low_tokens_per_s_per_gpu"] == swept["tokens_per_s_per_gpu_low"]
    # the hybrid Blackwell class (18 rows) ran 32% above measured before the Mamba kernel rate
    # was fitted (flagged then); its 80% band now holds zero: not flagged, in all three
    assert row.interval["contains_projection"] is True
    assert row.interval["class_bias"] is swept["class_bias"] is r.interval.bias is None
