"""Framework run settings as explicit settings (issue 12): CUDA-graph scope, MoE all-to-all overlap
and token-drop. Their memory terms by hand, the CP-SAT tables seeing them, the direction of their
time effect, Megatron-Core's refusals, and the framework spellings in and out."""

from __future__ import annotations

import pytest

from tune_cp.config.axes import RUN_KNOBS
from tune_cp.config.resolve import resolve_config
from tune_cp.config.specs import (
    ClusterSpec,
    Dispatcher,
    ParallelConfig,
    Precision,
    TrainingSpec,
)
from tune_cp.formats import (
    parse_megatron_args,
    parse_primus_config,
    to_megatron_args,
    to_nemo_overrides,
    to_primus_overrides,
)
from tune_cp.oracle.catalog import load_gpu, load_model
from tune_cp.oracle.host import GRAPH_BITS
from tune_cp.oracle.inventory import act_shape
from tune_cp.oracle.layers import LayerKind
from tune_cp.oracle.memory import (
    FULL_ITERATION,
    PER_LAYER_GRAPH_SCOPES,
    MemoryOverheads,
    RunOptions,
    a2a_overlap_bytes,
    activation_units,
    capacity_scale_ppm,
    cuda_graph_static_bytes,
    memory_report,
)
from tune_cp.oracle.projection import project
from tune_cp.solver.feasible import enumerate_problem
from tune_cp.solver.problem import Problem
from tune_cp.solver.reference import reference_enumerate
from tune_cp.solver.rules import options_problem, settings_space_problem
from tune_cp.solver.settings import SETTINGS_FIELDS, RunSettings
from tune_cp.solver.space import default_space

MIB, GIB = 2**20, 2**30


def setting(model: str, gpu: str, nodes: int, seq: int, gbs: int, **cfg):
    m = load_model(model)
    g = load_gpu(gpu)
    cl = ClusterSpec(gpu=g, num_nodes=nodes, gpus_per_node=8)
    tr = TrainingSpec(seq_len=seq, global_batch_size=gbs, precision=Precision.BF16)
    c = resolve_config(ParallelConfig(**cfg), m, cl, tr)
    return m, cl, tr, c


def ov(**run) -> MemoryOverheads:
    return MemoryOverheads(run=RunOptions(**run))


# ------------------------------------------------------------------------ registry


def test_every_run_setting_has_a_knob_and_a_time_bit():
    assert [k.field for k in RUN_KNOBS] == list(RunOptions.model_fields)
    assert set(RunOptions.model_fields) <= set(SETTINGS_FIELDS)
    assert set(PER_LAYER_GRAPH_SCOPES) | {FULL_ITERATION} == set(GRAPH_BITS)


def test_settings_reach_the_memory_and_the_time_side():
    s = RunSettings(cuda_graph_scope="attn,mlp", moe_a2a_overlap=True, moe_capacity_factor=1.5)
    assert s.overheads.run == RunOptions(cuda_graph_scope=("attn", "mlp"), moe_a2a_overlap=True,
                                         moe_capacity_factor=1.5)
    t = s.traits
    assert (t.cuda_graph_scope, t.moe_a2a_overlap, t.moe_dropless, t.moe_capacity_factor) == \
        (("attn", "mlp"), True, False, 1.5)
    # a copy with other changes keeps them; the defaults are the old defaults
    assert s.with_(memory_margin=0.1).overheads.run == s.overheads.run
    assert RunSettings().overheads == MemoryOverheads()
    assert RunSettings(cuda_graph_scope="none").options.cuda_graph_scope == ()
    # stored once: the options given by name are overheads.run, given with other overheads
    both = RunSettings(overheads=MemoryOverheads(fragmentation=0.1), moe_a2a_overlap=True)
    assert both.overheads == MemoryOverheads(fragmentation=0.1,
                                             run=RunOptions(moe_a2a_overlap=True))
    assert RunSettings(overheads=both.overheads) == both
    assert both.with_(moe_capacity_factor=1.0).options == RunOptions(moe_a2a_overlap=True,
                                                                      moe_capacity_factor=1.0)
    assert "moe_a2a_overlap" not in RunSettings.model_fields


# ------------------------------------------------------------------ memory by hand


def test_cuda_graph_static_buffers_hand_worked():
    m, _, tr, c = setting("llama3-8b", "h100", 1, 8192, 32, mbs=1)
    x = act_shape(m, tr, c)
    # 2 graphs (attn, mlp) x 2 buffers x 2 B x 8192 tokens x 4096 = 256 MiB per layer and
    # in-flight micro-batch; attn alone half of it; full-iteration graphs keep none per layer
    assert cuda_graph_static_bytes(m, x, LayerKind.DENSE, ("attn", "mlp")) == 256 * MIB
    assert cuda_graph_static_bytes(m, x, LayerKind.DENSE, ("attn",)) == 128 * MIB
    assert cuda_graph_static_bytes(m, x, LayerKind.DENSE, (FULL_ITERATION,)) == 0
    # pp 1, one micro-batch in flight on 32 layers: 32 x 256 MiB = 8 GiB on the stage
    rep = memory_report(m, setting("llama3-8b", "h100", 1, 8192, 32, mbs=1)[1], tr, c,
                        ov(cuda_graph_scope=("attn", "mlp")))
    base = memory_report(m, setting("llama3-8b", "h100", 1, 8192, 32, mbs=1)[1], tr, c)
    assert rep.stages[0].terms["cuda_graph_buffers"] == 8 * GIB
    assert base.stages[0].terms["cuda_graph_buffers"] == 0
    # a private-pool buffer, not the caching allocator's: no fragmentation on it
    assert rep.peak_bytes - base.peak_bytes == 8 * GIB


def test_moe_graph_scopes_count_the_router_graph():
    m, _, tr, c = setting("mixtral-8x22b", "mi355x", 4, 8192, 512, pp=4, vpp=2, ep=8)
    x = act_shape(m, tr, c)
    # attn + the router graph (moe_preprocess rides in it): 2 x 2 x 2 B x 8192 x 6144 = 384 MiB
    scope = ("attn", "moe_router", "moe_preprocess")
    assert cuda_graph_static_bytes(m, x, LayerKind.MOE, scope) == 384 * MIB


def test_capacity_factor_sizes_the_expert_tensors():
    assert capacity_scale_ppm(1.25) == 250_000
    assert capacity_scale_ppm(1.0) == 0
    assert capacity_scale_ppm(0.5) == -500_000
    m, _, tr, c = setting("mixtral-8x7b", "h100", 2, 4096, 64, ep=8)
    base = activation_units(m, tr, c)
    # capacity 1.0 padded = balanced routing: the dropless default's bytes
    assert activation_units(m, tr, c, ov(moe_capacity_factor=1.0)).moe_layer == base.moe_layer
    # capacity 2.0: the expert-side tensors double. rows = 4096 x top-2 = 8192: expert input
    # 2 x 8192 x 4096 + fc1 output 2 x 8192 x 2 x 14336 + fc2 input 2 x 8192 x 14336
    expert = 2 * 8192 * 4096 + 2 * 8192 * 2 * 14336 + 2 * 8192 * 14336
    assert expert == 771_751_936
    assert activation_units(m, tr, c, ov(moe_capacity_factor=2.0)).moe_layer \
        - base.moe_layer == expert
    # the dropless worst case (routing imbalance) does not apply under a capacity
    skewed = MemoryOverheads(moe_routing_imbalance=0.5)
    assert activation_units(m, tr, c, skewed).moe_imbalance > 0
    capped = skewed.model_copy(update={"run": RunOptions(moe_capacity_factor=1.0)})
    assert activation_units(m, tr, c, capped).moe_imbalance == 0


def test_a2a_overlap_keeps_a_second_dispatch_hand_worked():
    m, cl, tr, c = setting("mixtral-8x22b", "mi355x", 4, 8192, 512, pp=4, vpp=2, ep=8)
    x = act_shape(m, tr, c)
    # 2 x 2 B x (8192 tokens x top-2) x 6144 = 384 MiB; padded to capacity 1.25: 480 MiB
    assert a2a_overlap_bytes(m, x, None) == 384 * MIB
    assert a2a_overlap_bytes(m, x, 1.25) == 480 * MIB
    rep = memory_report(m, cl, tr, c, ov(moe_a2a_overlap=True))
    assert {s.terms["a2a_overlap_buffers"] for s in rep.stages} == {384 * MIB}
    assert memory_report(m, cl, tr, c).stages[0].terms["a2a_overlap_buffers"] == 0


# --------------------------------------------------------------- the solver sees them


def test_cpsat_tables_see_the_run_settings():
    m = load_model("llama3-8b")
    g = load_gpu("h100")
    cl = ClusterSpec(gpu=g, num_nodes=1, gpus_per_node=8)
    tr = TrainingSpec(seq_len=8192, global_batch_size=32)
    space = default_space(m, cl, tr, fixed={"mbs": 1, "cp": 1})
    plain = Problem(model=m, cluster=cl, training=tr, space=space)
    settings = RunSettings(cuda_graph_scope=("attn", "mlp"))
    p = Problem(model=m, cluster=cl, training=tr, space=space, settings=settings)
    a, b = enumerate_problem(p), reference_enumerate(p)
    assert len(a) > 0
    assert all(f.config.recompute != "full" for f in a.configs)
    assert [(f.candidate, f.peak_bytes) for f in a.configs] == \
        [(f.candidate, f.peak_bytes) for f in b.configs]
    # the family run_settings removes what the graphs refuse, and the counts add up
    assert a.removed == b.removed and a.removed["run_settings"] > 0
    assert a.space_size - sum(a.removed.values()) == len(a)
    for f in a.configs[:: max(1, len(a) // 10)]:
        assert memory_report(m, cl, tr, f.config, p.overheads).peak_bytes == f.peak_bytes
    # the same layouts cost more with graphs than without
    before = {f.config: f.peak_bytes for f in enumerate_problem(plain).configs}
    assert enumerate_problem(plain).removed["run_settings"] == 0
    common = [f for f in a.configs if f.config in before]
    assert common and all(f.peak_bytes > before[f.config] for f in common)


def test_a2a_overlap_removes_what_megatron_core_refuses():
    m = load_model("mixtral-8x7b")
    cl = ClusterSpec(gpu=load_gpu("h100"), num_nodes=2, gpus_per_node=8)
    tr = TrainingSpec(seq_len=4096, global_batch_size=64)
    space = default_space(m, cl, tr, fixed={"mbs": 1}, dispatchers=tuple(Dispatcher))
    p = Problem(model=m, cluster=cl, training=tr, space=space,
                settings=RunSettings(moe_a2a_overlap=True))
    got = enumerate_problem(p)
    assert got.configs and got.removed["run_settings"] > 0
    assert got.space_size - sum(got.removed.values()) == len(got)
    for f in got.configs:
        c = f.config
        assert c.ep > 1 and c.recompute != "full" and "moe" not in c.recompute_modules
        assert c.pp == 1 or c.vpp > 1
        assert c.dispatcher != "allgather"
    # the plain Python loop agrees, count for count
    small = p.replace(space=space.with_domains(tp=(1, 2), pp=(1, 2)))
    a, b = enumerate_problem(small), reference_enumerate(small)
    assert [(f.candidate, f.peak_bytes) for f in a.configs] == \
        [(f.candidate, f.peak_bytes) for f in b.configs]
    assert a.removed == b.removed and a.removed["run_settings"] > 0


def test_settings_that_empty_a_domain_are_an_input_error():
    m = load_model("mixtral-8x7b")
    cl = ClusterSpec(gpu=load_gpu("h100"), num_nodes=2, gpus_per_node=8)
    tr = TrainingSpec(seq_len=4096, global_batch_size=64)
    space = default_space(m, cl, tr)
    full = tuple(r for r in space.recompute if r.kind == "full")
    assert settings_space_problem(space, RunOptions(moe_a2a_overlap=True)) is None
    assert "leave no recomputation options" in settings_space_problem(
        space.with_domains(recompute=full), RunOptions(cuda_graph_scope=("attn",)))
    assert "leave no dispatchers" in settings_space_problem(
        space.with_domains(dispatcher=(Dispatcher.FLEX,)), RunOptions(moe_capacity_factor=1.0))
    # the defaults refuse nothing
    assert settings_space_problem(space.with_domains(recompute=full), RunOptions()) is None


# ------------------------------------------------------------------ time direction


def test_token_drop_and_overlap_change_the_time_in_the_documented_direction():
    m, cl, tr, c = setting("mixtral-8x22b", "mi355x", 4, 8192, 512, pp=2, vpp=7, ep=8)

    def tok(**kw):
        p = project(m, cl, tr, c, traits=RunSettings(**kw).traits)
        return p.tokens_per_s_per_gpu, p.breakdown

    dropless, b0 = tok()
    drop1, b1 = tok(moe_capacity_factor=1.0)
    drop125, b125 = tok(moe_capacity_factor=1.25)
    overlap_drop, _ = tok(moe_capacity_factor=1.0, moe_a2a_overlap=True)
    overlap_dropless, _ = tok(moe_a2a_overlap=True)
    # token-drop removes the per-layer host synchronisation: faster at the same shapes
    assert drop1 > dropless and b1["expert_gemm"] == pytest.approx(b0["expert_gemm"])
    # padding to capacity 1.25 makes the experts process 1.25x the rows: slower
    assert drop125 < drop1
    assert 1.2 < b125["expert_gemm"] / b1["expert_gemm"] < 1.3
    # the all-to-all overlap hides dispatch time with fixed shapes; with dropless routing its
    # single host sequence adds host and GPU times (oracle/host.py::a2a_sync_exponent)
    assert overlap_drop > drop1
    assert overlap_dropless < dropless


def test_search_with_a_setting_states_it_and_obeys_it(run_json):
    base = ("--model", "mixtral-8x7b", "--gpu", "h100", "--nodes", "2", "--seq-len", "4096",
            "--gbs", "64")
    code, plain = run_json(*base)
    code2, drop = run_json(*base, "--moe-token-drop", "1.0")
    assert code == code2 == 0
    assert plain["run_settings"] == {"cuda_graph_scope": [], "moe_a2a_overlap": False,
                                     "moe_capacity_factor": None}
    assert drop["run_settings"]["moe_capacity_factor"] == 1.0
    # no host synchronisation per MoE layer: the answer projects faster
    assert drop["best"]["projection"]["tokens_per_s_per_gpu"] > \
        plain["best"]["projection"]["tokens_per_s_per_gpu"]
    code3, graphs = run_json(*base, "--cuda-graph-scope", "attn,moe_router,moe_preprocess")
    assert code3 == 0 and graphs["run_settings"]["cuda_graph_scope"] == [
        "attn", "moe_router", "moe_preprocess"]
    assert all(row["recompute"] != "full" for row in graphs["top"])


# ---------------------------------------------------------------- refusals (exit 2)


@pytest.mark.parametrize("args, words", [
    (("--model", "llama3-8b", "--moe-a2a-overlap"), "dense"),
    (("--model", "llama3-8b", "--moe-token-drop", "1.0"), "dense"),
    (("--model", "llama3-8b", "--cuda-graph-scope", "attn,moe_router"), "dense"),
    (("--model", "llama3-8b", "--cuda-graph-scope", "full_iteration,attn"), "full_iteration"),
    (("--model", "llama3-8b", "--cuda-graph-scope", "moe"), "not modelled"),
    (("--model", "mixtral-8x7b", "--cuda-graph-scope", "attn,moe_preprocess"), "moe_router"),
    (("--model", "mixtral-8x7b", "--cuda-graph-scope", "full_iteration"), "--moe-token-drop"),
    (("--model", "mixtral-8x7b", "--cuda-graph-scope", "mlp"), "every layer"),
    (("--model", "mixtral-8x7b", "--moe-token-drop", "0"), "moe-token-drop"),
])
def test_bad_combinations_exit_2_with_one_line(run_cli, args, words):
    for cmd in (("check", "--gpu", "h100", "--nodes", "1"), ("--gpu", "h100", "--nodes", "1")):
        code, out, err = run_cli(*cmd, *args)
        assert code == 2, (cmd, args, out, err)
        assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_layout_refusals_are_rule_violations(run_json):
    code, data = run_json("check", "--model", "mixtral-8x7b", "--gpu", "h100", "--nodes", "2",
                          "--ep", "8", "--recompute", "full", "--cuda-graph-scope",
                          "attn,moe_router", "--moe-a2a-overlap", "--dispatcher", "allgather")
    assert code == 1
    # the family run_settings (solver/rules.py::SETTING_REFUSALS), one violation per refusal
    assert [v["rule"] for v in data["violations"]] == ["run_settings"] * 3
    assert "per-layer CUDA graphs" in data["violations"][0]["message"]
    code, data = run_json("check", "--model", "mixtral-8x7b", "--gpu", "h100", "--nodes", "2",
                          "--ep", "1", "--pp", "2", "--moe-a2a-overlap")
    assert code == 1
    assert [v["rule"] for v in data["violations"]] == ["run_settings"] * 2
    code, data = run_json("check", "--model", "mixtral-8x7b", "--gpu", "h100", "--nodes", "2",
                          "--ep", "8", "--dispatcher", "flex", "--moe-token-drop", "1.0")
    assert code == 1 and [v["rule"] for v in data["violations"]] == ["run_settings"]


def test_options_problem_is_none_for_the_defaults():
    for name in ("llama3-8b", "mixtral-8x7b", "deepseek-v3"):
        assert options_problem(load_model(name), RunOptions()) is None


# ------------------------------------------------------------- framework spellings


OPTIONS = [
    RunOptions(cuda_graph_scope=("attn", "moe_router", "moe_preprocess"), moe_a2a_overlap=True,
               moe_capacity_factor=1.25),
    RunOptions(cuda_graph_scope=(FULL_ITERATION,), moe_capacity_factor=1.0),
    RunOptions(moe_a2a_overlap=True),
    RunOptions(),
]


@pytest.mark.parametrize("o", OPTIONS, ids=lambda o: o.label() or "defaults")
def test_megatron_and_primus_round_trip(o, tmp_path):
    m, cl, tr, c = setting("mixtral-8x22b", "mi355x", 4, 8192, 512, pp=4, vpp=2, ep=8)
    text = to_megatron_args(m, cl, tr, c, options=o)
    assert parse_megatron_args(text, model=m).options == o
    prim = tmp_path / "exp.yaml"
    prim.write_text(to_primus_overrides(m, cl, tr, c, options=o))
    assert parse_primus_config(prim, model=m).options == o


def test_megatron_spellings():
    m, cl, tr, c = setting("mixtral-8x22b", "mi355x", 4, 8192, 512, pp=4, vpp=2, ep=8)
    text = to_megatron_args(m, cl, tr, c, options=OPTIONS[0])
    for flag in ("--cuda-graph-impl transformer_engine",
                 "--cuda-graph-modules attn moe_router moe_preprocess",
                 "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute",
                 "--moe-expert-capacity-factor 1.25", "--moe-pad-expert-input-to-capacity"):
        assert flag in text
    full = to_megatron_args(m, cl, tr, c, options=OPTIONS[1])
    assert "--cuda-graph-impl full_iteration" in full
    assert "--no-check-for-nan-in-loss-and-grad" in full
    assert "cuda-graph" not in to_megatron_args(m, cl, tr, c)


def test_bridge_spellings():
    m, cl, tr, c = setting("mixtral-8x22b", "mi355x", 4, 8192, 512, pp=4, vpp=2, ep=8)
    text = to_nemo_overrides(m, cl, tr, c, options=OPTIONS[0])
    for line in ('cfg.model.cuda_graph_impl = "transformer_engine"',
                 'cfg.model.cuda_graph_modules = ["attn", "moe_router", "moe_preprocess"]',
                 "cfg.comm_overlap.overlap_moe_expert_parallel_comm = True",
                 "cfg.comm_overlap.delay_wgrad_compute = True",
                 "cfg.model.moe_expert_capacity_factor = 1.25",
                 "cfg.model.moe_pad_expert_input_to_capacity = True"):
        assert line in text
    full = to_nemo_overrides(m, cl, tr, c, options=OPTIONS[1])
    assert 'cfg.model.cuda_graph_impl = "full_iteration"' in full
    assert "cfg.rerun_state_machine.check_for_nan_in_loss = False" in full


def test_megatron_legacy_spellings_are_read():
    m = load_model("mixtral-8x22b")
    base = "--tensor-model-parallel-size 1 --expert-model-parallel-size 8 --bf16 "
    # the deprecated --cuda-graph-scope and --external-cuda-graph (transformer_engine)
    run = parse_megatron_args(base + "--external-cuda-graph --cuda-graph-scope attn moe_router",
                              model=m)
    assert run.options.cuda_graph_scope == ("attn", "moe_router")
    # --cuda-graph-impl local with the deprecated full_iteration module
    run = parse_megatron_args(base + "--cuda-graph-impl local --cuda-graph-scope full_iteration",
                              model=m)
    assert run.options.cuda_graph_scope == (FULL_ITERATION,)
    # a negative capacity factor is dropless (TransformerConfig.__post_init__)
    run = parse_megatron_args(base + "--moe-expert-capacity-factor -1", model=m)
    assert run.options.moe_capacity_factor is None


def test_check_from_args_reads_the_settings(run_json):
    args = ("--tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 "
            "--num-virtual-stages-per-pipeline-rank 2 --expert-model-parallel-size 8 "
            "--micro-batch-size 1 --global-batch-size 512 --seq-length 8192 --bf16 "
            "--recompute-granularity selective --moe-token-dispatcher-type alltoall "
            "--cuda-graph-impl transformer_engine "
            "--cuda-graph-modules attn moe_router moe_preprocess "
            "--overlap-moe-expert-parallel-comm --delay-wgrad-compute "
            "--moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity")
    code, data = run_json("check", "--model", "mixtral-8x22b", "--nodes", "4",
                          "--megatron-args", args)
    assert data["run_settings"] == {"cuda_graph_scope": ["attn", "moe_router", "moe_preprocess"],
                                    "moe_a2a_overlap": True, "moe_capacity_factor": 1.0}
    peak = data["memory"]["stages"][data["memory"]["peak_stage"]]["terms"]
    assert peak["cuda_graph_buffers"] > 0 and peak["a2a_overlap_buffers"] == 384 * MIB
    assert not any("capacity" in n for n in data["imported"]["notes"])
    # a flag given explicitly wins over the launch's setting
    code, data = run_json("check", "--model", "mixtral-8x22b", "--nodes", "4",
                          "--megatron-args", args, "--no-moe-a2a-overlap")
    assert data["run_settings"]["moe_a2a_overlap"] is False


def test_sweep_grid_takes_the_run_settings(tmp_path):
    from tune_cp.agent.sweep import GridError, load_grid, scenario_inputs

    grid = tmp_path / "g.yaml"
    grid.write_text("models: [mixtral-8x7b]\ngpus: [h100]\nnodes: [2]\n"
                    "cuda_graph_scope: attn,moe_router\nmoe_capacity_factor: 1.0\n")
    (sc,) = load_grid(str(grid)).scenarios
    _, _, opts = scenario_inputs(sc)
    assert opts.settings.options == RunOptions(cuda_graph_scope=("attn", "moe_router"),
                                               moe_capacity_factor=1.0)
    grid.write_text("models: [mixtral-8x7b]\ngpus: [h100]\nnodes: [2]\n"
                    "cuda_graph_scope: full_iteration,attn\n")
    with pytest.raises(GridError, match="full_iteration"):
        load_grid(str(grid))
