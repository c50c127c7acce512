"""The one resolver (``config/resolve.py``): hand-worked derivations, the rules the removed
second resolver (``ConfigBatch.from_arrays``) had drifted from, and the columnar resolver equal
to ``resolve_config`` row by row."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tune_cp.config.codes import (
    DISPATCH_CODE,
    FLEX_CODE,
    FP8_CODE,
    SCHEDULE_CODE,
    SPLIT_CODE,
    mask_modules,
    module_mask,
)
from tune_cp.config.resolve import (
    RESOLVED_FIELDS,
    UNSET,
    as_read,
    columns,
    columns_of,
    resolve,
    resolve_config,
    resolve_many,
    resolved_update,
    view,
)
from tune_cp.config.specs import (
    ClusterSpec,
    Dispatcher,
    FlexBackend,
    Fp8Recipe,
    GroupedGemm,
    ParallelConfig,
    PipelineSplit,
    Recompute,
    RecomputeMethod,
    Schedule,
    TrainingSpec,
)
from tune_cp.oracle.catalog import load_gpu, load_model
from tune_cp.oracle.work import ConfigBatch


def setting(model: str, gpu: str, nodes: int, precision: str = "bf16"):
    return (load_model(model), ClusterSpec(gpu=load_gpu(gpu), num_nodes=nodes, gpus_per_node=8),
            TrainingSpec(seq_len=4096, global_batch_size=256, precision=precision))


def test_hand_worked_resolution() -> None:
    # Mixtral 8x22B (56 layers) on 4 x 8 MI355X, gbs 256: tp 2 pp 4 -> dp 32 / 8 = 4,
    # mbs 2 -> ga 256 / 8 = 32; vpp 2 -> interleaved; 56 % 8 == 0 -> even split
    m, c, t = setting("mixtral-8x22b", "mi355x", 4)
    cols = resolve(columns(tp=[2, 1], pp=[4, 3], vpp=[2, 1], mbs=[2, 1], ep=8), m, c, t)
    assert cols.dp.tolist() == [4, 10] and cols.ga.tolist() == [32, 25]
    assert cols.etp.tolist() == [2, 1] and cols.sp.tolist() == [True, False]
    assert cols.schedule.tolist() == [SCHEDULE_CODE[Schedule.INTERLEAVED],
                                      SCHEDULE_CODE[Schedule.ONE_F_ONE_B]]
    # 56 layers over 3 stages: not even; 58 slots over 3 neither: embedding_loss (the rule
    # family pipeline_split refuses it later)
    assert cols.split.tolist() == [SPLIT_CODE[PipelineSplit.EVEN],
                                   SPLIT_CODE[PipelineSplit.EMBEDDING_LOSS]]
    assert cols.fp8.tolist() == [-1, -1]


def test_the_rules_the_second_resolver_had_drifted_from() -> None:
    """Sequence parallelism given at tp 1 is off, the distributed optimizer under FSDP is off,
    an FP8 training's unset recipe is the GPU's default, the flex dispatcher's library and the
    fp32 router follow the vendor, sync-free stage 1 turns on permute fusion."""
    m, c, t = setting("mixtral-8x22b", "mi355x", 4, "fp8")
    cols = resolve(columns(tp=[1, 2], sp=1, fsdp=[True, False],
                           dispatcher=DISPATCH_CODE[Dispatcher.FLEX], sync_free=[1, 0]), m, c, t)
    assert cols.sp.tolist() == [False, True]
    assert cols.distributed_optimizer.tolist() == [False, True]
    assert cols.fp8.tolist() == [FP8_CODE[Fp8Recipe.TENSORWISE]] * 2
    assert cols.flex.tolist() == [FLEX_CODE[FlexBackend.TURBO]] * 2
    assert cols.router_fp32.tolist() == [True, True]
    assert cols.permute_fusion.tolist() == [True, False]
    m, c, t = setting("mixtral-8x22b", "b200", 4, "fp8")
    cols = resolve(columns(dispatcher=[DISPATCH_CODE[Dispatcher.FLEX], 0]), m, c, t)
    assert cols.flex.tolist() == [FLEX_CODE[FlexBackend.DEEPEP], UNSET]
    assert cols.router_fp32.tolist() == [False, False]
    assert cols.fp8.tolist() == [FP8_CODE[Fp8Recipe.MXFP8]] * 2
    # a hybrid Mamba model always splits evenly
    m, c, t = setting("nemotron-3-nano", "gb200", 1)
    cols = resolve(columns(pp=[3, 4], vpp=[1, 2]), m, c, t)
    assert cols.split.tolist() == [SPLIT_CODE[PipelineSplit.EVEN]] * 2
    assert set(resolved_update(cols, 0)) == set(RESOLVED_FIELDS)
    # the batch says the same as resolve_config for each of those configurations
    one = resolve_config(ParallelConfig(tp=1, sequence_parallel=True, fsdp=True), m, c, t)
    assert one.sequence_parallel is False and one.distributed_optimizer is False


def _random_configs(rng: random.Random, n: int) -> list[ParallelConfig]:
    out = []
    for _ in range(n):
        kw: dict = dict(tp=rng.choice([1, 2, 4, 8]), pp=rng.choice([1, 2, 3, 4, 8]),
                        vpp=rng.choice([1, 2, 3]), cp=rng.choice([1, 2]),
                        ep=rng.choice([1, 2, 8]), mbs=rng.choice([1, 2, 4]),
                        recompute=rng.choice(list(Recompute)),
                        distributed_optimizer=rng.random() < 0.5, fsdp=rng.random() < 0.5,
                        dispatcher=rng.choice(list(Dispatcher)),
                        sync_free_stage=rng.choice([0, 0, 1, 3]),
                        grouped_gemm=rng.choice(list(GroupedGemm)),
                        permute_fusion=rng.random() < 0.5,
                        shared_expert_overlap=rng.random() < 0.5,
                        grad_reduce_in_fp32=rng.random() < 0.5)
        for field, p, values in (
                ("etp", 0.3, [1, 2]), ("dp", 0.2, [1, 3, 4]), ("ga", 0.2, [1, 5]),
                ("sequence_parallel", 0.4, [True, False]), ("recompute_layers", 0.5, [0, 1, 3]),
                ("recompute_method", 0.3, list(RecomputeMethod)),
                ("recompute_modules", 0.3, [("core_attn",), ("mlp", "layernorm"), ()]),
                ("flex_backend", 0.3, list(FlexBackend)), ("router_fp32", 0.4, [True, False]),
                ("schedule", 0.3, list(Schedule)), ("fp8_recipe", 0.4, list(Fp8Recipe)),
                ("pipeline_split", 0.2, [PipelineSplit.EVEN, PipelineSplit.EMBEDDING_LOSS,
                                         PipelineSplit.LIGHT_FIRST]),
                ("first_stage_layers", 0.1, [1, 2])):
            if rng.random() < p and not (field == "first_stage_layers" and "pipeline_split" in kw):
                kw[field] = rng.choice(values)
        out.append(ParallelConfig(**kw))
    return out


@pytest.mark.parametrize("model, gpu, precision", [
    ("mixtral-8x22b", "mi355x", "bf16"), ("llama3-8b", "h100", "fp8"),
    ("deepseek-v3", "b200", "fp8"), ("nemotron-3-nano", "gb200", "bf16")])
def test_the_batch_is_resolve_config_row_by_row(model: str, gpu: str, precision: str) -> None:
    m, c, t = setting(model, gpu, 4, precision)
    cfgs = _random_configs(random.Random(7), 300)
    cols = resolve(columns_of(cfgs), m, c, t)
    one = [resolve_config(x, m, c, t) for x in cfgs]
    assert resolve_many(cfgs, m, c, t) == one
    batch = ConfigBatch.from_configs(one)
    for i, r in enumerate(one):
        # every derived field of the row is the single resolution's
        assert (int(cols.dp[i]), int(cols.ga[i]), int(cols.etp[i]), bool(cols.sp[i])) == (
            r.dp, r.ga, r.etp, r.sequence_parallel)
        assert bool(cols.distributed_optimizer[i]) is r.distributed_optimizer
        assert cols.split_keys[int(cols.split[i])][0] is r.pipeline_split
        # the resolved columns are what the oracle's batch reads off the configuration
        for f in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "mbs", "ga", "sp", "recompute",
                  "recompute_method", "recompute_modules", "distributed_optimizer", "fsdp",
                  "dispatcher", "schedule", "fp8", "grad_fp32", "sync_free", "flex",
                  "grouped_gemm", "permute_fusion", "shared_overlap", "router_fp32"):
            assert getattr(cols, f)[i] == getattr(batch, f)[i], (f, r)


def test_views_and_module_masks_round_trip() -> None:
    m, c, t = setting("mixtral-8x22b", "mi355x", 4)
    cfgs = [resolve_config(x, m, c, t) for x in _random_configs(random.Random(3), 200)]
    cols = as_read(columns_of(cfgs))
    for i, r in enumerate(cfgs):
        v = view(cols, i)
        # a view lists the modules in the mask's bit order
        mods = mask_modules(module_mask(r.recompute_modules)) or ("core_attn",)
        expect = r.model_copy(update={"recompute_modules": mods})
        if r.recompute is not Recompute.FULL:
            expect = expect.model_copy(update={"recompute_layers": None})
        assert v == expect.model_copy(update={"fp8_param_gather": v.fp8_param_gather})
    for mods in [(), ("core_attn",), ("mlp", "moe", "layernorm")]:
        assert set(mask_modules(module_mask(mods))) == set(mods)
    assert np.array_equal(columns(n=3, tp=2).tp, [2, 2, 2])
    with pytest.raises(TypeError, match="unknown column"):
        columns(tpp=2)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "llama3-8b-fp8-fsdp"])
def test_the_search_ranks_the_enumerations_columns(name: str) -> None:
    """The enumeration carries its resolved columns (row i = configuration i, what the oracle's
    batch reads off it); ranking them (MoE: with the backend presets set on the columns) gives
    what ranking the pydantic configurations gives, figure for figure."""
    import dataclasses

    from tests.test_solver_equivalence import CASES
    from tune_cp.agent.search import rank_feasible
    from tune_cp.solver.feasible import enumerate_problem
    from tune_cp.solver.settings import RunSettings

    p = CASES[name]()
    enum = enumerate_problem(p, count_removed=False)
    configs = [fc.config for fc in enum.configs]
    assert enum.columns is not None and len(enum.columns) == len(configs) > 0
    read = ConfigBatch.from_configs(configs)
    for f in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "mbs", "ga", "sp", "recompute",
              "recompute_method", "recompute_layers", "recompute_modules",
              "distributed_optimizer", "fsdp", "dispatcher", "schedule", "fp8", "grad_fp32",
              "sync_free", "flex", "grouped_gemm", "permute_fusion", "shared_overlap",
              "router_fp32"):
        assert np.array_equal(getattr(enum.columns, f), getattr(read, f)), f
    settings = RunSettings()
    a = rank_feasible(p.model, p.cluster, p.training, enum, [], None, None, settings)
    b = rank_feasible(p.model, p.cluster, p.training, dataclasses.replace(enum, columns=None),
                      [], None, None, settings)
    assert a.configs == b.configs
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.peak_bytes, b.peak_bytes)
    assert np.array_equal(a.order, b.order)
    if p.model.is_moe:  # the pydantic path: each (layout, preset) configuration, projected
        from tune_cp.agent import backend
        from tune_cp.agent.search import score_in_chunks

        peak = np.array([fc.peak_bytes for fc in enum.configs], dtype=np.int64)
        wide, wide_peak, owner = backend.expand(p.model, p.cluster, p.training, configs, peak,
                                                settings)
        assert len(wide) > len(configs)
        tokens = np.asarray(score_in_chunks(p.model, p.cluster, p.training, wide, None,
                                            None)["tokens_per_s_per_gpu"])
        pick = backend.best_per_layout(tokens, owner, len(configs))
        assert [wide[j] for j in pick] == a.configs
        assert np.array_equal(tokens[pick], a.tokens)
        assert np.array_equal(wide_peak[pick], a.peak_bytes)


def test_the_cp_sat_tables_scalar_dp_and_ga_are_the_resolvers() -> None:
    """``solver/model.py`` tabulates dp and ga with the scalar ``derived_dp`` / ``derived_ga``
    (its tables hold Python ints); they are the columnar resolver's on every grid point."""
    from itertools import product

    from tune_cp.config.specs import derived_dp, derived_ga

    m, c, t = setting("mixtral-8x22b", "mi355x", 3)  # world 24: inexact divisions too
    grid = np.array(list(product([1, 2, 4, 8], [1, 2, 3, 5], [1, 2, 4], [1, 2, 3, 16])))
    cols = resolve(columns(tp=grid[:, 0], pp=grid[:, 1], cp=grid[:, 2], mbs=grid[:, 3]),
                   m, c, t)
    for (tp, pp, cp, mbs), dp, ga in zip(grid.tolist(), cols.dp, cols.ga, strict=True):
        assert dp == derived_dp(c.world_size, tp, pp, cp)
        assert ga == derived_ga(t.global_batch_size, mbs, dp)
