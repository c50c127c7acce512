"""Uneven first/last pipeline stages, the light splits and hand-written layouts: the layer lists
(hand-worked from Megatron-Core's ``get_num_layers_to_build`` / ``get_transformer_layer_offset``
and ``PipelineParallelLayerLayout``), their legality, memory, the search's choice, import and
export."""

from __future__ import annotations

import pytest

from tests.conftest import resolved, setting
from tune_cp.config.specs import (
    ConfigError,
    ParallelConfig,
    PipelineSplit,
    parse_pipeline_layout,
)
from tune_cp.formats.export import to_megatron_args, to_primus_overrides
from tune_cp.formats.parse import parse_megatron_args
from tune_cp.oracle.catalog import load_model
from tune_cp.oracle.memory import (
    memory_report,
    pipeline_chunks,
    uneven_stage_layers,
)
from tune_cp.solver.rules import split_problem

P = PipelineSplit


def layers(chunks) -> list[list[tuple[int, ...]]]:
    return [[ch.layers for ch in stage] for stage in chunks]


def sizes(chunks) -> list[list[int]]:
    return [[len(ch.layers) for ch in stage] for stage in chunks]


def test_uneven_first_and_last_stage_llama_405b():
    """Meta's Llama 3 405B balance (one layer off the first and the last of 16 stages):
    ``--decoder-first/last-pipeline-num-layers 7`` gives 7 + 14 x 8 + 7 = 126."""
    ch = pipeline_chunks(126, 0, 16, 1, P.UNEVEN, 7, 7)
    assert sizes(ch) == [[7]] + [[8]] * 14 + [[7]]
    assert layers(ch)[0] == [tuple(range(0, 7))] and layers(ch)[1] == [tuple(range(7, 15))]
    assert layers(ch)[15] == [tuple(range(119, 126))]
    assert ch[0][0].has_embedding and ch[15][0].has_output
    # only the first stage given: the other 15 stages split the remaining 120 layers
    assert sizes(pipeline_chunks(126, 0, 16, 1, P.UNEVEN, 6, None)) == [[6]] + [[8]] * 15


def test_uneven_with_virtual_stages_follows_megatron_offsets():
    """16 layers, pp 4, vpp 2, first = last = 2: the middle 12 layers give 6 per middle rank, 3
    per chunk; the end ranks 1 per chunk. Virtual stage order (round 0, then round 1), as
    ``get_transformer_layer_offset`` numbers them: rank 1's second chunk starts at
    1 x 8 + 2 / 2 + 0 = 9."""
    ch = pipeline_chunks(16, 0, 4, 2, P.UNEVEN, 2, 2)
    assert layers(ch) == [
        [(0,), (8,)],
        [(1, 2, 3), (9, 10, 11)],
        [(4, 5, 6), (12, 13, 14)],
        [(7,), (15,)],
    ]
    assert ch[0][0].has_embedding and not ch[0][1].has_embedding
    assert ch[3][1].has_output and not ch[3][0].has_output


def test_light_splits_counts():
    # light_last: 32 layers at pp 3 become 11 + 11 + 10 (no even split exists)
    assert uneven_stage_layers(32, 3, 1, P.LIGHT_LAST) == (None, 10)
    assert sizes(pipeline_chunks(32, 0, 3, 1, P.LIGHT_LAST)) == [[11], [11], [10]]
    # light_ends with vpp 2: 60 layers, pp 4 -> c = (30 + 2) / 4 = 8 per chunk, ends 7 per chunk
    assert uneven_stage_layers(60, 4, 2, P.LIGHT_ENDS) == (14, 14)
    assert sizes(pipeline_chunks(60, 0, 4, 2, P.LIGHT_ENDS)) == [[7, 7], [8, 8], [8, 8], [7, 7]]
    # last_to_first: one layer from the output stage to the embedding stage (vpp 1 only)
    assert sizes(pipeline_chunks(32, 0, 4, 1, P.LAST_TO_FIRST)) == [[9], [8], [8], [7]]
    assert "the first stage's 9 layers (last_to_first split) must be positive and divisible " \
           "by vpp (2)" in split_problem(load_model("llama3-8b"), 4, 2, P.LAST_TO_FIRST)
    assert uneven_stage_layers(33, 4, 1, P.LIGHT_LAST) is None  # 34 / 4 is not whole


def test_deepseek_v3_layout():
    """DeepSeek-V3's ``Et*3|(tt|)*29,m|L`` on pp 16 (32 virtual stages): virtual stage v goes
    to rank v mod 16; rank 0 holds E + layers 0-2 and 33-34, rank 14 layers 29-30 and the MTP
    layer alone, rank 15 layers 31-32 and the loss alone."""
    text = "Et*3|(tt|)*29,m|L"
    stages = parse_pipeline_layout(text)
    assert len(stages) == 32 and stages[0] == "Ettt" and stages[30:] == ("m", "L")
    assert parse_pipeline_layout("Et*3|(tt|)*29m|L") == stages  # commas are cosmetic
    ch = pipeline_chunks(61, 1, 16, 2, P.LAYOUT, layout=text)
    assert layers(ch)[0] == [(0, 1, 2), (33, 34)] and ch[0][0].has_embedding
    assert layers(ch)[14] == [(29, 30), ()] and ch[14][1].mtp_layers == 1
    assert layers(ch)[15] == [(31, 32), ()] and ch[15][1].has_output
    assert split_problem(load_model("deepseek-v3"), 16, 2, P.LAYOUT, layout=text) is None


def test_embedding_loss_allows_embedding_only_virtual_stages():
    """Meta's Llama 3 405B: "the first model chunk on the first stage has only the embedding,
    and the last model chunk on the last stage has only output projection and loss" (126
    layers + 2 slots = 128 = pp 16 x vpp 8, one slot per chunk); Megatron-Core builds 0 layers
    there (``get_num_layers_to_build`` asserts >= 0)."""
    m = load_model("llama3.1-405b")
    assert split_problem(m, 16, 8, P.EMBEDDING_LOSS) is None
    ch = pipeline_chunks(126, 0, 16, 8, P.EMBEDDING_LOSS)
    assert ch[0][0].layers == () and ch[0][0].has_embedding
    assert ch[15][7].layers == () and ch[15][7].has_output
    assert sizes(ch)[1] == [1] * 8


@pytest.mark.parametrize(("split", "first", "last", "pp", "vpp", "words"), [
    (P.UNEVEN, 6, 7, 16, 1, "the 113 layers between the first and last stage"),
    (P.UNEVEN, 7, None, 16, 2, "the first stage's 7 layers (uneven split) must be positive "
                               "and divisible by vpp (2)"),
    (P.UNEVEN, None, None, 16, 1, "needs first and/or last stage layers"),
    (P.UNEVEN, 7, 7, 1, 1, "needs pp > 1"),
    (P.UNEVEN, 70, 70, 16, 1, "first + last stage layers (140) must be at most num_layers"),
    (P.LIGHT_LAST, None, None, 16, 1, "the light_last split needs num_layers / vpp + 1"),
    (P.LIGHT_ENDS, None, None, 16, 1, "gives the same stages as the embedding_loss split"),
])
def test_uneven_legality_messages(split, first, last, pp, vpp, words):
    problem = split_problem(load_model("llama3.1-405b"), pp, vpp, split, first, last)
    assert problem is not None and words in problem and "\n" not in problem


def test_layout_legality():
    m = load_model("llama3.1-405b")
    assert "has 3 virtual stages but pp x vpp = 16 x 1" in split_problem(
        m, 16, 1, P.LAYOUT, layout="Et*60|t*60|t*6L")
    assert "120 decoder layers (t); llama3.1-405b has 126" in split_problem(
        m, 2, 1, P.LAYOUT, layout="Et*60|t*60L")
    assert split_problem(m, 2, 1, P.LAYOUT, layout="Et*60|t*66L") is None
    no_mtp = split_problem(m, 2, 1, P.LAYOUT, layout="Et*60|t*66,mL")
    assert "1 MTP layers (m) but llama3.1-405b has 0" in no_mtp and "remove the m" in no_mtp
    with pytest.raises(ValueError, match="unknown character"):
        parse_pipeline_layout("Et*3|x|L")


def test_first_stage_with_fewer_layers_holds_less_memory():
    """Llama 3.1 405B, TP8 PP16, seq 8192, mbs 1, 1F1B: stage 0 holds 16 micro-batches in
    flight, so one layer fewer there (first 6 instead of 7, last 8) saves 16 layer activations
    (16 x 577,249,280 B) and one layer's bf16 weights: 2 B x (attention (2 x 16384^2 + 2 x 16384
    x 1024) / 8 + 16384 + MLP 3 x 16384 x 53248 / 8 + 16384) = 2 x 398,491,648 B."""
    m, cl, tr = setting("llama3.1-405b", "h100", 1024, 8192, 2048)
    seven = memory_report(m, cl, tr, resolved(m, cl, tr, tp=8, pp=16, first_stage_layers=7,
                                              last_stage_layers=7)).stages[0].terms
    six = memory_report(m, cl, tr, resolved(m, cl, tr, tp=8, pp=16, first_stage_layers=6,
                                            last_stage_layers=8)).stages[0].terms
    assert seven["activations"] - six["activations"] == 16 * 577_249_280
    assert seven["weights"] - six["weights"] == 2 * 398_491_648


def test_search_moves_a_layer_off_the_output_stage_only_when_it_pays():
    """Llama 3 8B at pp 4 (2 x 8 H100, seq 4096, gbs 256; tp 1, cp 1, vpp 1 pinned): its output
    layer (128,256 x 4096) is ~2.4 decoder layers of GEMM work, so the search moves one layer
    from the last stage to the first (9 + 8 + 8 + 7); with a 1,024-token vocabulary the output
    layer costs little and the even split stays."""
    from tune_cp.agent.search import SearchOptions, search
    from tune_cp.solver.settings import RunSettings

    _, cl, tr = setting("llama3-8b", "h100", 2, 4096, 256)
    opts = SearchOptions(settings=RunSettings(
        constraints=("pp==4", "vpp==1", "tp==1", "cp==1")), top_k=3)
    chosen = {}
    for vocab in (128_256, 1_024):
        m = load_model("llama3-8b").model_copy(update={"vocab_size": vocab})
        chosen[vocab] = search(m, cl, tr, opts).best.config.pipeline_split
    assert chosen == {128_256: P.LAST_TO_FIRST, 1_024: P.EVEN}


def test_megatron_and_primus_round_trip():
    m, cl, tr = setting("llama3-8b", "h100", 3, 4096, 240)
    for split in (P.LIGHT_LAST, P.LAST_TO_FIRST):
        pp = 3 if split is P.LIGHT_LAST else 4
        c = resolved(m, cl, tr, pp=pp, pipeline_split=split)
        text = to_megatron_args(m, cl, tr, c)
        ends = uneven_stage_layers(32, pp, 1, split)
        for flag, n in zip(("--decoder-first-pipeline-num-layers",
                            "--decoder-last-pipeline-num-layers"), ends, strict=True):
            assert (f"{flag} {n}" in text) == (n is not None)
        back = parse_megatron_args(text, model=m).config
        assert back.pipeline_split is P.UNEVEN
        assert (back.first_stage_layers, back.last_stage_layers) == ends
        assert pipeline_chunks(32, 0, pp, 1, back.pipeline_split, back.first_stage_layers,
                               back.last_stage_layers) == pipeline_chunks(32, 0, pp, 1, split)
        primus = to_primus_overrides(m, cl, tr, c)
        assert "decoder_last_pipeline_num_layers:" in primus
    ds = load_model("deepseek-v3")
    text = "Et*3|(tt|)*29,m|L"
    run = parse_megatron_args(f"--pipeline-model-parallel-size 16 --expert-model-parallel-size 8 "
                              f"--pipeline-model-parallel-layout '{text}' --bf16", model=ds)
    assert (run.config.vpp, run.config.pipeline_split, run.config.pipeline_layout) == (
        2, P.LAYOUT, text)
    out = to_megatron_args(ds, cl, tr, resolved(ds, cl, tr, pp=16, vpp=2, ep=8,
                                                pipeline_layout=text))
    assert f"--pipeline-model-parallel-layout '{text}'" in out
    assert "--num-virtual-stages-per-pipeline-rank" not in out


def test_bridge_names_are_read():
    """The TransformerConfig names (Primus YAML, Megatron-Bridge) of the uneven end stages."""
    from tune_cp.formats.parse import parse_primus_config

    assert ParallelConfig(first_stage_layers=7).pipeline_split is None  # resolved: uneven
    m = load_model("llama3.1-405b")
    import yaml

    def run(overrides):
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as d:
            exp = Path(d) / "exp.yaml"
            exp.write_text(yaml.safe_dump({"modules": {"pre_trainer": {
                "framework": "megatron", "overrides": overrides}}}))
            return parse_primus_config(exp, model=m, env={}).config

    c = run({"pipeline_model_parallel_size": 16, "num_layers_in_first_pipeline_stage": 7,
             "decoder_last_pipeline_num_layers": 7})
    assert (c.pipeline_split, c.first_stage_layers, c.last_stage_layers) == (P.UNEVEN, 7, 7)
    with pytest.raises(ConfigError, match="cannot go with account_for_embedding"):
        run({"pipeline_model_parallel_size": 16, "decoder_first_pipeline_num_layers": 7,
             "account_for_embedding_in_pipeline_split": True})


@pytest.mark.parametrize(("args", "words"), [
    (["--pipeline-layout", "Et*3|x|L"], "unknown character(s) ['x']"),
    (["--first-stage-layers", "7", "--pipeline-split", "even"],
     "first/last stage layers make the uneven split"),
    (["--first-stage-layers", "0"], "--first-stage-layers"),
    (["--megatron-args", "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "
      "'Et*32|t*32|t*31L|t*31L'"], "several loss slots"),
    (["--megatron-args", "--pipeline-model-parallel-size 16 --decoder-first-pipeline-num-layers "
      "7 --account-for-loss-in-pipeline-split"], "cannot go with account_for_loss"),
])
def test_bad_split_values_exit_2_in_one_line(run_cli, args, words):
    base = ["check", "--model", "llama3.1-405b", "--gpu", "h100", "--nodes", "256"]
    code, _, err = run_cli(*base, *args)
    assert code == 2 and words in err and err.strip().count("\n") == 0, err


def test_check_an_illegal_uneven_split_exits_1(run_cli):
    code, out, _ = run_cli("check", "--model", "llama3.1-405b", "--gpu", "h100", "--nodes",
                           "1024", "--tp", "8", "--pp", "16", "--first-stage-layers", "6",
                           "--last-stage-layers", "7")
    assert code == 1 and "[pipeline_split] the 113 layers between the first and last stage" in out
    code, out, _ = run_cli("check", "--model", "llama3.1-405b", "--gpu", "h100", "--nodes",
                           "1024", "--tp", "8", "--pp", "16", "--seq-len", "8192", "--first-stage-layers",
                           "7", "--last-stage-layers", "7")
    assert "uneven split: first stage 7, last stage 7 layers" in out


def test_light_split_refusal_names_the_count_and_what_divides():
    """Llama 3 8B (32 layers), light_last: 4 stages of which the last is one layer lighter need
    (32 + 1) / 4 whole, so pp must divide 33 (3, 11, 33); with vpp 3, 32 / 3 is not whole and
    no pp helps: the refusal names the divisors of 32 for vpp instead of an empty pp set."""
    m = load_model("llama3-8b")
    assert ("(32 / 1 + 1 = 33) to divide over pp (4); with vpp 1 choose pp in {3, 11, 33}"
            in split_problem(m, 4, 1, P.LIGHT_LAST))
    assert ("(32 / 3 is not whole) to divide over pp (4); choose vpp in {1, 2, 4, 8, 16, 32}"
            in split_problem(m, 4, 3, P.LIGHT_LAST))


def test_split_codes_belong_to_the_batch():
    """A batch names its splits with values (uneven, layout) in its own table: the same
    configuration gets the same code and projection whatever other batches came before."""
    from tune_cp.config.codes import SPLIT_CODE, VALUELESS_SPLIT_KEYS
    from tune_cp.oracle.projection import score_configs
    from tune_cp.oracle.work import ConfigBatch

    m, cl, tr = setting("llama3.1-405b", "h100", 1024, 8192, 2048)
    uneven = resolved(m, cl, tr, tp=8, pp=16, first_stage_layers=6, last_stage_layers=8)
    other = resolved(m, cl, tr, tp=8, pp=16, first_stage_layers=7, last_stage_layers=7)
    even = resolved(m, cl, tr, tp=8, pp=16, pipeline_split="embedding_loss")
    a = ConfigBatch.from_configs([uneven, even])
    b = ConfigBatch.from_configs([other, uneven])
    assert a.split_keys == (*VALUELESS_SPLIT_KEYS, (P.UNEVEN, 6, 8, None))
    assert b.split_keys == (*VALUELESS_SPLIT_KEYS, (P.UNEVEN, 7, 7, None), (P.UNEVEN, 6, 8, None))
    assert list(a.split) == [len(VALUELESS_SPLIT_KEYS), SPLIT_CODE[P.EMBEDDING_LOSS]]
    assert ConfigBatch.from_configs([even]).split_keys == VALUELESS_SPLIT_KEYS
    assert [a.config(i) for i in range(2)] == [uneven, even]
    assert b.config(0) == other and b.config(1) == uneven
    ta = score_configs(m, cl, tr, a)["step_time_s"]
    tb = score_configs(m, cl, tr, b)["step_time_s"]
    assert ta[0] == tb[1]
