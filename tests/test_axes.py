"""The axis registry (config/axes.py) against what it describes: ParallelConfig, SearchSpace, the
command line and the framework readers."""

import re

from click.testing import CliRunner

from tune_cp import cli
from tune_cp.config.axes import (
    ATTRIBUTION_FIELDS,
    AXES,
    BASELINE_KEYS,
    COMBINATION_AXES,
    INT_AXES,
    KNOBS,
    RECOMPUTE_FIELDS,
)
from tune_cp.config.specs import ParallelConfig
from tune_cp.formats.keys import CONFIG_KEYS
from tune_cp.solver.space import NO_RECOMPUTE, OptimizerChoice, SearchSpace, candidate_config


def test_every_knob_is_a_config_field_and_every_axis_a_space_field() -> None:
    assert {k.field for k in KNOBS} <= set(ParallelConfig.model_fields)
    # the fields a user never sets: derived by resolve_config; and the optimizer state, a nested
    # spec set by the precision-aware optimizer flags (cli.py), fixed per search, not a knob
    assert set(ParallelConfig.model_fields) - {k.field for k in KNOBS} == {
        "dp", "ga", "optimizer_state"}
    assert set(AXES) == set(SearchSpace.model_fields) - {"etp_policy", "grad_reduce_in_fp32",
                                                              "fp8_param_gather",
                                                              "optimizer_state"}


def test_derived_lists_pinned() -> None:
    assert AXES == ("tp", "pp", "cp", "vpp", "ep", "etp", "mbs", "pipeline_split", "schedule",
                    "fp8_recipe", "dispatcher", "optimizer", "recompute")
    assert INT_AXES == ("tp", "pp", "cp", "vpp", "ep", "etp", "mbs")
    assert RECOMPUTE_FIELDS == ("recompute", "recompute_method", "recompute_layers",
                                "recompute_modules")
    assert "grad_reduce_in_fp32" not in BASELINE_KEYS and "sequence_parallel" in BASELINE_KEYS
    assert COMBINATION_AXES == ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "recompute",
                                "recompute_method", "recompute_layers", "dispatcher",
                                "schedule", "fp8_recipe", "distributed_optimizer")
    assert ATTRIBUTION_FIELDS == ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "recompute",
                                  "dispatcher", "flex_backend", "sync_free_stage",
                                  "grouped_gemm", "permute_fusion", "shared_expert_overlap",
                                  "router_fp32", "schedule", "fp8_recipe",
                                  "distributed_optimizer", "fsdp", "pipeline_split")


def test_a_candidate_sets_exactly_the_registry_fields_of_its_axes() -> None:
    c = {"tp": 2, "pp": 4, "cp": 1, "vpp": 2, "ep": 8, "etp": 1, "mbs": 2,
         "pipeline_split": None, "schedule": None, "fp8_recipe": None, "dispatcher": "flex",
         "optimizer": OptimizerChoice.FSDP, "recompute": NO_RECOMPUTE}
    cfg = candidate_config(c)
    default = ParallelConfig()
    changed = {f for f in ParallelConfig.model_fields if getattr(cfg, f) != getattr(default, f)}
    # tp pp vpp ep mbs dispatcher and the optimizer's fsdp + distributed_optimizer
    assert changed == {"tp", "pp", "vpp", "ep", "etp", "mbs", "dispatcher", "fsdp",
                       "distributed_optimizer"}
    assert {k.field for k in KNOBS if k.axis == "optimizer"} == {"distributed_optimizer", "fsdp"}


def test_framework_spellings_are_arguments_the_reader_knows() -> None:
    for k in KNOBS:
        if k.megatron is not None:
            assert k.megatron in CONFIG_KEYS, k.field


def test_every_knob_has_its_flag_on_check() -> None:
    out = CliRunner().invoke(cli.main, ["check", "--help"], terminal_width=200).output
    for k in KNOBS:
        assert f"--{k.flag}" in out, k.flag


def test_every_setting_has_one_flag_shared_by_search_check_and_plan() -> None:
    from tune_cp.solver.settings import SETTINGS_FIELDS

    assert set(cli.SETTINGS_FLAGS) == set(SETTINGS_FIELDS)
    helps = {}
    for command in ("search", "check", "plan"):
        params = {p.name: p for p in cli.main.commands[command].params}
        for name in SETTINGS_FIELDS:
            p = params[name]
            helps.setdefault(name, (p.opts, p.help))
            assert (p.opts, p.help) == helps[name], (command, name)
        for k in KNOBS:  # check takes every knob; search and plan the fixed gradient dtype
            if command == "check" or k.field == "grad_reduce_in_fp32":
                assert params[k.param].help == k.help


def test_run_settings_from_text_constraints_and_margin_bounds() -> None:
    import pytest
    from pydantic import ValidationError

    from tune_cp.solver.settings import RunSettings

    s = RunSettings(constraints=["ep * etp <= 8", "cp == 1"])
    assert [c.expr for c in s.constraints] == ["ep * etp <= 8", "cp == 1"]
    assert s.with_(memory_margin=0.0).memory_margin == 0.0
    assert s.with_(memory_margin=0.0).constraints == s.constraints
    with pytest.raises(ValidationError):
        RunSettings(memory_margin=0.95)


def test_plan_takes_the_constraints_search_takes(run_cli) -> None:
    """plan now runs with the same settings as search: a --constraint narrows its rows."""
    import json

    code, out, _ = run_cli("plan", "--model", "llama3-8b", "--gpu", "h100", "--max-nodes", "2",
                           "--points", "1", "--constraint", "tp == 4", "--json")
    assert code == 0
    assert [q["config"]["tp"] for p in json.loads(out)["gpus"] for q in p["points"]] == [4]


def test_bridge_model_spellings_are_provider_fields() -> None:
    """Every registry knob spelled on Megatron-Bridge's model provider (``model.X``) names a
    field of GPTModelProvider / TransformerConfig (formats/data/bridge_model_fields.json)."""
    from tune_cp.formats.export import bridge_model_fields

    fields = bridge_model_fields()
    paths = [k.bridge for k in KNOBS if k.bridge and k.bridge.startswith("model.")]
    assert paths and all(p.removeprefix("model.") in fields for p in paths), paths


def test_the_planner_is_told_every_axis_it_may_combine() -> None:
    """The planner's axis list is generated from the registry: every axis a combination may set
    (and no other) is named, the integer ones with the search's domain."""
    from tests.conftest import setting
    from tune_cp.agent.search import planner_axes
    from tune_cp.solver.space import default_space

    m, cl, tr = setting("mixtral-8x7b", "h100", 2, 4096, 256)
    text = planner_axes(default_space(m, cl, tr))
    listed = text.split(";")[0]
    for k in KNOBS:
        named = re.search(rf"(^|, ){k.field}( |,|$)", listed) is not None
        assert named == k.combinable, k.field
    assert text.startswith("tp [1, 2, 4, 8], ") and "dispatcher (alltoall/allgather/flex)" in text
    assert text.endswith("names usable in expressions: tp pp vpp cp ep etp dp mbs ga")
