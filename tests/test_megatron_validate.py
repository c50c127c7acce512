"""Every exported answer passes Megatron-LM's own split and divisibility assertions.

``formats/megatron_validate.py`` transcribes them (NVIDIA/Megatron-LM d98e8a64, each with its
file and line); these tests pin it on hand-worked cases, then run it on the Megatron-LM,
Primus and Megatron-Bridge exports of every top-10 row of searches of DeepSeek-V3,
Llama 3.1 405B, Mixtral 8x22B and Qwen3 235B, parsing the exported text back, and require the
layers Megatron-Core builds per virtual stage to be tune-cp's own (``chunk_spans``).
"""

from __future__ import annotations

import ast

import pytest

from tune_cp.config.specs import (
    ClusterSpec,
    ParallelConfig,
    PipelineSplit,
    TrainingSpec,
)
from tune_cp.formats.export import (
    canonical_config,
    megatron_model_args,
    nemo_assignments,
    primus_overrides,
    to_megatron_args,
)
from tune_cp.formats.megatron_validate import read_flags, validate
from tune_cp.oracle.catalog import load_gpu, load_model
from tune_cp.oracle.memory import chunk_spans, split_fields, split_layout
from tune_cp.solver.rules import split_problem

DS = load_model("deepseek-v3")


def flags(model, **kw) -> dict:
    """Megatron-LM dests of the model's flags plus ``kw``."""
    pairs, _ = megatron_model_args(model)
    return {**dict(pairs), **kw}


# ------------------------------------------------------------------- hand-worked cases


def test_deepseek_v3_account_flags_at_pp16_fail_as_in_megatron():
    # the export: 61 + 2 = 63 layers over 16 stages (arguments.py l.997)
    got = validate(flags(DS, pipeline_model_parallel_size=16, tensor_model_parallel_size=2,
                         expert_model_parallel_size=8, expert_tensor_parallel_size=1,
                         account_for_embedding_in_pipeline_split=True,
                         account_for_loss_in_pipeline_split=True, global_batch_size=4096,
                         micro_batch_size=2, sequence_parallel=True), 256)
    assert got.failures == ["arguments.py l.997: Number of layers should be divisible by the "
                            "pipeline-model-parallel size"]
    # and tune-cp's rule says so too, naming the pp that divide 63
    problem = split_problem(DS, 16, 1, PipelineSplit.EMBEDDING_LOSS)
    assert problem is not None and "(63)" in problem and "{1, 3, 7, 9, 21, 63}" in problem


def test_deepseek_v3_at_pp7_with_account_flags_builds_mtp_on_the_last_stage():
    got = validate(flags(DS, pipeline_model_parallel_size=7, expert_model_parallel_size=8,
                         account_for_embedding_in_pipeline_split=True,
                         account_for_loss_in_pipeline_split=True), 56)
    assert got.failures == []
    # 63 slots / 7 = 9: the first and last stage one decoder layer fewer, MTP beside the loss
    assert got.stages == [(8, 0)] + [(9, 0)] * 5 + [(8, 1)]
    assert split_problem(DS, 7, 1, PipelineSplit.EMBEDDING_LOSS) is None


def test_embedding_mtp_loss_is_the_layout_megatron_accepts():
    text = split_layout(61, 1, 16, 1, PipelineSplit.EMBEDDING_MTP_LOSS)
    assert text == "Ettt|" + "tttt|" * 14 + "ttmL"
    got = validate(flags(DS, pipeline_model_parallel_size=16, expert_model_parallel_size=8,
                         pipeline_model_parallel_layout=text), 128)
    assert got.failures == [] and got.stages == [(3, 0)] + [(4, 0)] * 14 + [(2, 1)]
    # pp 16 x vpp 2: 32 virtual stages of 2 slots; MTP in virtual stage 31 (rank 15's last)
    text = split_layout(61, 1, 16, 2, PipelineSplit.EMBEDDING_MTP_LOSS)
    got = validate(flags(DS, pipeline_model_parallel_size=16, expert_model_parallel_size=8,
                         pipeline_model_parallel_layout=text), 128)
    assert got.failures == [] and got.stages[-1] == (0, 1) and got.stages[0] == (1, 0)


def test_two_mtp_layers_split_over_two_virtual_stages_are_refused_by_both():
    m = DS.model_copy(update={"num_mtp_layers": 2})
    # 61 + 2 + 2 = 65 slots at pp 5 x vpp 13 = 65 stages: one slot each, MTP in two stages
    text = split_layout(61, 2, 5, 13, PipelineSplit.EMBEDDING_MTP_LOSS)
    got = validate(flags(m, pipeline_model_parallel_size=5, mtp_num_layers=2,
                         pipeline_model_parallel_layout=text), 5)
    assert got.failures and "All of the MTP layers must be in the same one virtual" in \
        got.failures[0]
    problem = split_problem(m, 5, 13, PipelineSplit.EMBEDDING_MTP_LOSS)
    assert problem is not None and "must all be in one virtual stage" in problem


def test_uneven_ends_leaving_middle_stages_empty_are_a_mismatch():
    m = load_model("llama3-8b")
    got = validate(flags(m, pipeline_model_parallel_size=3, decoder_first_pipeline_num_layers=16,
                         decoder_last_pipeline_num_layers=16), 3)
    assert got.failures == ["transformer_config.py l.2341: Mismatch: 0 middle layers remaining "
                            "but 1 middle PP stages available."]
    problem = split_problem(m, 3, 1, PipelineSplit.UNEVEN, 16, 16)
    assert problem is not None and "Mismatch" in problem


def test_read_flags_parses_an_export():
    m, cl, tr = (load_model("mixtral-8x22b"),
                 ClusterSpec(gpu=load_gpu("h100"), num_nodes=4, gpus_per_node=8),
                 TrainingSpec(seq_len=4096, global_batch_size=256))
    text = to_megatron_args(m, cl, tr, ParallelConfig(pp=4, vpp=2, ep=8, recompute="full"),
                            launcher=True)
    args, world = read_flags(text)
    assert world == 32 and args["pipeline_model_parallel_size"] == 4
    assert args["num_virtual_stages_per_pipeline_rank"] == 2 and args["num_layers"] == 56
    assert args["overlap_grad_reduce"] is True


# ------------------------------------------------------------- every top-10 answer


def _config(row: dict) -> ParallelConfig:
    fields = {k: row[k] for k in ParallelConfig.model_fields if row.get(k) is not None}
    return ParallelConfig(**fields)


def _tunecp_stages(m, c: ParallelConfig) -> list[tuple[int, int]]:
    return [(hi - lo, mtp) for lo, hi, _, _, mtp in chunk_spans(
        m.num_layers, m.num_mtp_layers, c.pp, c.vpp, c.pipeline_split, *split_fields(c))]


#: Megatron-Bridge ``model.*`` (TransformerConfig) fields -> the Megatron-LM dests read here
BRIDGE_DESTS = {
    "model.tensor_model_parallel_size": "tensor_model_parallel_size",
    "model.pipeline_model_parallel_size": "pipeline_model_parallel_size",
    "model.virtual_pipeline_model_parallel_size": "num_virtual_stages_per_pipeline_rank",
    "model.pipeline_model_parallel_layout": "pipeline_model_parallel_layout",
    "model.num_layers_in_first_pipeline_stage": "decoder_first_pipeline_num_layers",
    "model.num_layers_in_last_pipeline_stage": "decoder_last_pipeline_num_layers",
    "model.account_for_embedding_in_pipeline_split": "account_for_embedding_in_pipeline_split",
    "model.account_for_loss_in_pipeline_split": "account_for_loss_in_pipeline_split",
    "model.context_parallel_size": "context_parallel_size",
    "model.expert_model_parallel_size": "expert_model_parallel_size",
    "model.expert_tensor_parallel_size": "expert_tensor_parallel_size",
    "model.sequence_parallel": "sequence_parallel",
    "model.recompute_granularity": "recompute_granularity",
    "model.recompute_method": "recompute_method",
    "model.recompute_num_layers": "recompute_num_layers",
    "train.micro_batch_size": "micro_batch_size",
    "train.global_batch_size": "global_batch_size",
    "model.seq_length": "seq_length",
    "ddp.use_megatron_fsdp": "use_megatron_fsdp",
    "checkpoint.ckpt_format": "ckpt_format",
}


def _exports(m, cl, tr, c: ParallelConfig) -> dict[str, dict]:
    """The Megatron-LM, Primus and Megatron-Bridge exports as Megatron-LM dests."""
    model = dict(megatron_model_args(m)[0])
    megatron, world = read_flags(to_megatron_args(m, cl, tr, c, launcher=True))
    assert world == cl.world_size
    canon = canonical_config(m, cl, tr, c)
    primus = {**model, **{k: v for k, v in primus_overrides(m, tr, canon) if v is not None}}
    bridge = dict(model)
    for path, expr in nemo_assignments(m, tr, canon):
        if path in BRIDGE_DESTS and expr != "None":
            bridge[BRIDGE_DESTS[path]] = ast.literal_eval(expr)
    # Megatron-Bridge builds TransformerConfig itself (no validate_args): a vpp beside a
    # layout must be the layout's (transformer_config.py l.2276-2287), then the layout says it
    vpp = bridge.get("num_virtual_stages_per_pipeline_rank")
    if vpp is not None and bridge.get("pipeline_model_parallel_layout") is not None:
        layout_stages = len(str(bridge["pipeline_model_parallel_layout"]).split("|"))
        assert vpp == layout_stages // canon.pp, "virtual_pipeline_model_parallel_size conflicts"
        bridge.pop("num_virtual_stages_per_pipeline_rank")
    if bridge.get("num_virtual_stages_per_pipeline_rank") == 1:
        bridge.pop("num_virtual_stages_per_pipeline_rank")
    return {"megatron": megatron, "primus": primus, "bridge": bridge}


SEARCHES = [("deepseek-v3", "h100", 32), ("llama3.1-405b", "h100", 16),
            ("mixtral-8x22b", None, 8), ("qwen3-235b-a22b", "h100", 8)]
MORE_SEARCHES = [("deepseek-v3", None, 16), ("deepseek-v3", "h100", 64),
                 ("llama3.1-405b", None, 64), ("mixtral-8x22b", "h100", 32),
                 ("qwen3-235b-a22b", None, 32), ("deepseek-v3", "h100", 24)]


def _check_search(run_json, model: str, gpu: str | None, nodes: int, *extra: str) -> None:
    args = ["--model", model, "--nodes", str(nodes)] + (["--gpu", gpu] if gpu else []) + [
        *extra]
    code, out = run_json(*args)
    assert code == 0, out
    m = load_model(model)
    cl = ClusterSpec(gpu=load_gpu(out["cluster"]["gpu"]), num_nodes=nodes, gpus_per_node=8)
    tr = TrainingSpec.model_validate(out["training"])
    assert len(out["top"]) == 10
    for row in out["top"]:
        c = _config(row)
        for name, dests in _exports(m, cl, tr, c).items():
            got = validate(dests, cl.world_size)
            assert got.failures == [], (model, nodes, name, row["pp"], row["pipeline_split"])
            assert got.stages == _tunecp_stages(m, c), (model, nodes, name)


@pytest.mark.parametrize(("model", "gpu", "nodes"), SEARCHES)
def test_top_answers_pass_megatrons_assertions(run_json, model, gpu, nodes):
    _check_search(run_json, model, gpu, nodes)


@pytest.mark.parametrize(("model", "gpu", "nodes"), MORE_SEARCHES)
def test_more_top_answers_pass_megatrons_assertions(run_json, model, gpu, nodes):
    _check_search(run_json, model, gpu, nodes)


def test_megatron_fsdp_needs_the_fsdp_dtensor_checkpoint_format():
    """arguments.py l.1169: Megatron-FSDP refuses the default checkpoint format (torch_dist,
    training_config.py l.486); the exports write fsdp_dtensor."""
    base = flags(load_model("llama3-8b"), tensor_model_parallel_size=8, global_batch_size=128,
                 micro_batch_size=1, sequence_parallel=True, use_megatron_fsdp=True)
    assert validate(base, 8).failures == [
        "arguments.py l.1169: Megatron-FSDP requires the `fsdp_dtensor` checkpointing format."]
    assert validate({**base, "ckpt_format": "fsdp_dtensor"}, 8).failures == []


@pytest.mark.parametrize(("model", "gpu", "nodes"), [("llama3-70b", "h100", 2),
                                                     ("mixtral-8x7b", "h100", 2)])
def test_fsdp_answers_pass_megatrons_assertions(run_json, model, gpu, nodes):
    """`search --fsdp`: Llama 3 70B on 2 H100 nodes fits only with FSDP (all ten rows FSDP);
    Mixtral 8x7B: eight FSDP rows and two distributed-optimizer rows."""
    _check_search(run_json, model, gpu, nodes, "--fsdp")
