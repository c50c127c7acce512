"""The data-input classes of issue 29, one regression test per class (not per case): extreme
but well-typed shapes, GPU quantities outside their plausible ranges, config.json values of the
wrong type, input that used to be accepted silently, numbers written as strings, calibration
files of the wrong shape, torchtitan job TOMLs. Each ends in one ``tune-cp: error:`` line
(exit 2) naming the key and the value, never exit 3 or a silent conversion. The generators of
the same classes are in ``tests/fuzzing.py`` (``benchmarks/fuzz.py`` runs them at scale)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tune_cp.config.specs import ConfigError, TrainingSpec
from tune_cp.formats.logs import read_torchtitan_config
from tune_cp.oracle.catalog import GPU_RANGES, gpu_entries, load_gpu, load_model
from tune_cp.oracle.constants import load_calibration
from tune_cp.oracle.inputs import parse_json, parse_yaml
from tune_cp.oracle.memory import MAX_FIGURE_BYTES, arithmetic_problem, unsharded_peak_bytes

ROOT = Path(__file__).resolve().parent.parent
MODEL = {"name": "m", "num_layers": 8, "hidden_size": 1024, "ffn_hidden_size": 4096,
         "num_attention_heads": 8, "num_kv_heads": 8, "head_dim": 128, "vocab_size": 32000}
GPU = {"name": "g", "hbm_gib": 80, "peak_bf16_tflops": 900, "hbm_tb_per_s": 3,
       "scale_up_gb_per_s": 450, "scale_up_domain_gpus": 8, "nic_gb_per_s": 50}
MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000,
           "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2}
DEEPSEEK = {"model_type": "deepseek_v3", "hidden_size": 2048, "num_attention_heads": 16,
            "num_hidden_layers": 8, "vocab_size": 129280, "intermediate_size": 8192,
            "n_routed_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 512,
            "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 512,
            "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128}


def one_error(run_cli, *args, code: int = 2) -> str:
    got, out, err = run_cli(*args)
    assert got == code, (got, out[-300:], err)
    assert err.startswith("tune-cp: error: ") and err.count("\n") == 1, err
    return err


def write(tmp_path: Path, name: str, data: object) -> str:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(p)


# ------------------------------------------------------------- extreme but well-typed shapes


#: Every dimension at the documented maximum (config/specs.py MAX_DIM, MAX_LAYERS, vocab 2**28);
#: a DeepSeek config.json with MLA ranks at MAX_DIM.
MAXIMAL = MODEL | {"num_layers": 512, "hidden_size": 2**24, "ffn_hidden_size": 2**24,
                   "num_attention_heads": 2**24, "num_kv_heads": 2**24, "head_dim": 2**24,
                   "vocab_size": 2**28}
HUGE_MLA = DEEPSEEK | {"kv_lora_rank": 2**24, "q_lora_rank": 2**24,
                       "qk_nope_head_dim": 2**23, "v_head_dim": 2**24}


@pytest.mark.parametrize("data", [MAXIMAL, HUGE_MLA], ids=["maximal", "mla"])
@pytest.mark.parametrize("command", [("check", "--nodes", "1"), ("--nodes", "1"),
                                     ("plan", "--max-nodes", "2", "--points", "1")],
                         ids=["check", "search", "plan"])
def test_extreme_shapes_stop_at_the_arithmetic_bound(run_cli, tmp_path, data, command):
    """Used to reach CP-SAT as float coefficients (search), overflow a C long (plan) or fail an
    OR-Tools constructor (MLA): every command refuses the model at the same bound, named."""
    path = write(tmp_path, "m.json", data)
    err = one_error(run_cli, *command, "--model", path, "--gpu", "h100")
    assert "too large for the solver's 64-bit arithmetic" in err and "2**56 bytes" in err


def test_the_bound_is_far_above_real_models_and_refuses_past_it(tmp_path):
    assert MAX_FIGURE_BYTES == 2**56
    # Llama 3.1 405B with nothing sharded, sequence 131,072, micro-batch 8: 2**46.3 bytes
    big = TrainingSpec(seq_len=131072, global_batch_size=256)
    assert unsharded_peak_bytes(load_model("llama3.1-405b"), big, 8) == 85_310_216_922_726
    assert arithmetic_problem(load_model("llama3.1-405b"), big, 8) is None
    # h = f = 2**19, 512 layers, 4,096 heads: 2**54.0 fits; at twice the width (4x the
    # weights) micro-batch 1 still fits, 0.6% under 2**56, micro-batch 8 does not
    edge = MODEL | {"num_layers": 512, "hidden_size": 2**19, "ffn_hidden_size": 2**19,
                    "num_attention_heads": 2**12, "num_kv_heads": 2**12, "vocab_size": 2**24}
    train = TrainingSpec(seq_len=4096, global_batch_size=256)
    fits = load_model(write(tmp_path, "edge.json", edge))
    assert arithmetic_problem(fits, train, 8) is None
    wide = load_model(write(tmp_path, "wide.json", edge | {"hidden_size": 2**20,
                                                         "ffn_hidden_size": 2**20,
                                                         "num_attention_heads": 2**13,
                                                         "num_kv_heads": 2**13}))
    assert unsharded_peak_bytes(wide, train, 1) == 71_661_976_225_841_152
    assert arithmetic_problem(wide, train, 1) is None
    assert unsharded_peak_bytes(wide, train, 8) > MAX_FIGURE_BYTES
    assert "hidden_size 1,048,576" in arithmetic_problem(wide, train, 8)


# ---------------------------------------------------------- GPU quantities: plausible ranges


@pytest.mark.parametrize("key", sorted(GPU_RANGES))
def test_gpu_quantities_outside_their_ranges_are_refused(run_cli, tmp_path, key):
    """1e-300 and 5e-324 rates overflowed the time model (numpy warnings, exit 3, MFU nan%);
    each quantity has a range (GPU_RANGES); its ends are accepted, beyond them refused."""
    lo, hi = GPU_RANGES[key]
    for value in (lo, hi):
        load_gpu(write(tmp_path, "ok.json", GPU | {key: value}))
    for value in (5e-324, 1e-300, lo * 0.99, hi * 1.01):
        err = one_error(run_cli, "check", "--model", "llama3-8b", "--nodes", "1", "--gpu",
                        write(tmp_path, "g.json", GPU | {key: value}))
        assert f"{key}: outside the plausible range [{lo:g}, {hi:g}]" in err
    for gpu in gpu_entries().values():  # every catalog GPU lies tenfold inside, both ends
        v = getattr(gpu, key)
        assert v is None or lo * 10 <= v <= hi / 10, (gpu.name, key, v)


def test_power_fields_that_contradict_the_peak_are_refused(run_cli, tmp_path):
    """10 W with 2**20 compute units projected an MFU of 114%: the power model's rate over the
    stated peak must lie in POWER_FACTOR_RANGE (the catalog's parts: 0.90-1.33)."""
    hopper = GPU | {"architecture": "hopper", "tdp_w": 10, "compute_units": 2**20}
    err = one_error(run_cli, "check", "--model", "llama3-8b", "--nodes", "1", "--gpu",
                    write(tmp_path, "g.json", hopper))
    assert "compute_units (1048576) and tdp_w (10) give a power-limited rate of 8.73e+03" in err
    # H100's own units and power beside its own peak: factor 1, accepted
    h100 = load_gpu("h100")
    ok = hopper | {"tdp_w": h100.tdp_w, "compute_units": h100.compute_units,
                   "peak_bf16_tflops": h100.peak_bf16_flops / 1e12}
    assert load_gpu(write(tmp_path, "ok.json", ok)).compute_units == h100.compute_units


def test_tiny_calibration_efficiencies_are_refused(run_cli, tmp_path):
    path = write(tmp_path, "c.json", {"defaults": {"grouped_gemm_efficiency": 5e-324}})
    err = one_error(run_cli, "check", "--model", "mixtral-8x7b", "--nodes", "1",
                    "--calibration", path)
    assert "grouped_gemm_efficiency = 5e-324 is outside the constant's range (>= 0.01" in err


# -------------------------------------------------- config.json values read with their types


@pytest.mark.parametrize("base, update, named", [
    (MIXTRAL, {"rope_theta": "big"}, "'rope_theta' must be a number (without quotes), got 'big'"),
    (MIXTRAL, {"rms_norm_eps": "tiny"}, "'rms_norm_eps' must be a number"),
    (MIXTRAL, {"rms_norm_eps": 2.5}, "'rms_norm_eps' must be a number in (0, 1), got 2.5"),
    (MIXTRAL, {"rope_scaling": {"rope_type": "llama3", "factor": "x"}},
     "rope_scaling 'factor' must be a number"),
    (MIXTRAL, {"rope_scaling": "llama3"}, "'rope_scaling' must be a mapping"),
    (MIXTRAL, {"rope_scaling": {"rope_type": "yarn", "factor": 0.5}}, "'factor' must be a number >= 1"),
    (MIXTRAL, {"rope_theta": 0}, "'rope_theta' must be a positive number, got 0"),
    (MIXTRAL, {"num_key_value_heads": 0}, "'num_key_value_heads' must be a positive integer, got 0"),
    (MIXTRAL, {"num_key_value_heads": "8"}, "'num_key_value_heads' must be an integer"),
    (MIXTRAL, {"head_dim": "128"}, "'head_dim' must be an integer"),
    (MIXTRAL, {"tie_word_embeddings": "yes"}, "'tie_word_embeddings' must be true or false"),
    (MIXTRAL, {"sliding_window": "4096"}, "'sliding_window' must be an integer"),
    (DEEPSEEK, {"scoring_func": "relu"}, "scoring_func 'relu' is not a router score function"),
    (DEEPSEEK, {"n_group": 4, "topk_group": 8},
     "router_group_topk (8) must be at most router_num_groups (4)"),
    (DEEPSEEK, {"n_group": 3, "topk_group": 1}, "router_num_groups (3) must divide num_experts"),
    (DEEPSEEK, {"n_group": 1, "topk_group": 4}, "topk_group (4) must be at most n_group (1)"),
    (DEEPSEEK, {"routed_scaling_factor": "2.5"}, "'routed_scaling_factor' must be a number"),
    (DEEPSEEK, {"routed_scaling_factor": 0}, "router_topk_scaling_factor"),
    (DEEPSEEK, {"n_shared_experts": "1"}, "'n_shared_experts' must be an integer"),
])
def test_config_json_values_are_read_with_their_types(run_cli, tmp_path, base, update, named):
    """Strings where numbers belong were a ValueError (exit 3); 0 became the default (MHA,
    theta 10000), an unknown scoring_func softmax, a string rope_scaling was ignored."""
    path = write(tmp_path, "config.json", base | update)
    assert named in one_error(run_cli, "check", "--model", path, "--nodes", "1")


def test_config_json_defaults_stay_for_absent_and_null(tmp_path):
    m = load_model(write(tmp_path, "config.json", MIXTRAL | {"rope_theta": None,
                                                            "rope_scaling": None}))
    assert m.rotary_base == 10000.0 and m.num_kv_heads == 8
    d = load_model(write(tmp_path, "config.json", DEEPSEEK | {"scoring_func": "sigmoid",
                                                             "n_group": 4, "topk_group": 2}))
    assert (d.router_score, d.router_num_groups, d.router_group_topk) == ("sigmoid", 4, 2)


# ------------------------------------------ numbers are numbers; nothing accepted silently


@pytest.mark.parametrize("text, named", [
    ("num_layers: '8'", "num_layers: '8' is a string, not a number"),
    ('num_layers: "8"', "num_layers: '8' is a string, not a number"),
    ("num_layers: true", "num_layers: true is a boolean, not a whole number"),
    ("num_layers: 8.0", "num_layers: 8.0 is not a whole number"),
    ("num_layers: 1_000", "num_layers: '1_000' is a string"),
    ("num_layers: 0x10", "num_layers: '0x10' is a string"),
    ("num_layers: 2024-01-01", "num_layers is a date"),
    ("rotary_base: 'NaN'", "rotary_base: 'NaN' is a string, not a number"),
    ("qkv_bias: 1", "qkv_bias: 1 is not a boolean"),
    ("num_layers: 8\nnum_layers: 4", "key 'num_layers' is given twice"),
])
def test_model_files_refuse_what_is_not_written_as_its_type(run_cli, tmp_path, text, named):
    """``num_layers: '8'`` and ``true`` were converted (8, a 1-layer model), a key given twice
    kept its last value, ``"NaN"`` was "should be <= 1000000"."""
    lines = [f"{k}: {json.dumps(v)}" for k, v in MODEL.items() if k not in text.split(":")[0]]
    path = write(tmp_path, "m.yaml", "\n".join([*lines, text]) + "\n")
    assert named in one_error(run_cli, "check", "--model", path, "--gpu", "h100", "--nodes", "1")


@pytest.mark.parametrize("flag, base, key, value, named", [
    ("--gpu", GPU, "hbm_gib", '"80"', "hbm_gib: '80' is a string, not a number"),
    ("--gpu", GPU, "scale_up_domain_gpus", "true", "scale_up_domain_gpus: true is a boolean"),
    ("--gpu", GPU, "peak_bf16_tflops", '"NaN"', "peak_bf16_tflops: 'NaN' is a string, not a number"),
    ("--model", MODEL, "num_layers", '"8"', "num_layers: '8' is a string"),
])
def test_json_files_refuse_strings_and_duplicates(run_cli, tmp_path, flag, base, key, value,
                                                   named):
    text = json.dumps(base).replace(f'"{key}": {json.dumps(base[key])}', f'"{key}": {value}')
    other = ("--model", "llama3-8b") if flag == "--gpu" else ("--gpu", "h100")
    assert named in one_error(run_cli, "check", flag, write(tmp_path, "f.json", text), *other,
                              "--nodes", "1")
    twice = json.dumps(base)[:-1] + f', "{key}": {json.dumps(base[key])}}}'
    assert f"key '{key}' is given twice" in one_error(
        run_cli, "check", flag, write(tmp_path, "f.json", twice), *other, "--nodes", "1")


def test_yaml_numbers_as_yaml_1_2_spells_them():
    data = parse_yaml("a: 1e-05\nb: 017\nc: 1_000\nd: 0x10\ne: 1:30\nf: .5\n", "f")
    assert data == {"a": 1e-05, "b": 17, "c": "1_000", "d": "0x10", "e": "1:30", "f": 0.5}
    # a key written twice is refused; keys merged with << may be overridden
    assert parse_yaml("base: &b {x: 1}\nm:\n  <<: *b\n  x: 2\n", "f")["m"] == {"x": 2}
    with pytest.raises(ConfigError, match="key 'x' is given twice"):
        parse_yaml("x: 1\ny: 2\nx: 3\n", "f")
    with pytest.raises(ConfigError, match="key 'x' is given twice"):
        parse_json('{"x": 1, "x": 1}', "f")


def test_primus_numbers_in_quotes_are_refused(run_cli, tmp_path):
    exp = write(tmp_path, "exp.yaml", "modules:\n  pre_trainer:\n    overrides:\n"
                "      tensor_model_parallel_size: '2'\n")
    err = one_error(run_cli, "check", "--primus-config", exp, "--model", "llama3-8b", "--nodes",
                    "1")
    assert "tensor_model_parallel_size '2': a string, not a number" in err
    # YAML 1.1 (Primus's loader) reads 1e-05 as a string: it stays the number it spells
    ok = write(tmp_path, "ok.yaml", "modules:\n  pre_trainer:\n    overrides:\n"
               "      norm_epsilon: 1e-05\n      tensor_model_parallel_size: ${TP:2}\n")
    code, out, err = run_cli("check", "--primus-config", ok, "--model", "llama3-8b", "--nodes",
                             "1")
    assert code in (0, 1) and "TP2" in out, err


# ------------------------------------------------------- calibration files: one schema


def _calibration(mutate) -> dict:
    data = json.loads((ROOT / "oracle/catalog/calibration.json").read_text())
    mutate(data)
    return data


CALIBRATION_SHAPES = [
    (lambda d: d.update(fitted_on=[1]), "fitted_on must be a mapping of keys to values, got list"),
    (lambda d: d.update(fitted_on="x"), "fitted_on must be a mapping of keys to values, got 'x'"),
    (lambda d: d.update(fitted_on=3), "fitted_on must be a mapping of keys to values, got 3"),
    (lambda d: d["fitted_on"]["mfu_ceilings"]["dense/hopper/bf16"].pop("mfu"),
     "fitted_on.mfu_ceilings.dense/hopper/bf16.mfu is missing"),
    (lambda d: d["fitted_on"]["mfu_ceilings"]["dense/hopper/bf16"].update(mfu="high"),
     "mfu: 'high' is a string, not a number"),
    (lambda d: d["fitted_on"].update(gpus_fitted=[[1]]), "fitted_on.gpus_fitted.0: [1] is not a string"),
    (lambda d: d["fitted_on"].update(user_residuals=["x"] * 10),
     "fitted_on.user_residuals.0: 'x' is a string, not a number"),
    (lambda d: d["fitted_on"].update(user_residuals=[[0.1]] * 10),
     "fitted_on.user_residuals.0: a list is not a number"),
    (lambda d: d.update(defaults={"gemm_efficiency_bf16": "fast"}),
     "defaults.gemm_efficiency_bf16: 'fast' is a string, not a number"),
]


@pytest.mark.parametrize("mutate, named", CALIBRATION_SHAPES)
@pytest.mark.parametrize("command", [("check", "--nodes", "1"),
                                     ("plan", "--max-nodes", "1", "--points", "1")],
                         ids=["check", "plan"])
def test_calibration_files_are_validated_by_every_command(run_cli, tmp_path, mutate, named,
                                                          command):
    """AttributeError / KeyError / TypeError on check; plan accepted the same files."""
    path = write(tmp_path, "cal.json", _calibration(mutate))
    err = one_error(run_cli, *command, "--model", "llama3-8b", "--gpu", "h100",
                    "--calibration", path)
    assert named in err and "cal.json" in err


def test_the_shipped_calibration_passes_its_schema():
    table = load_calibration(str(ROOT / "oracle/catalog/calibration.json"))
    assert table.fitted_on["mfu_ceilings"]["dense/hopper/bf16"]["mfu"] == 0.4209


# --------------------------------------------------------------------- torchtitan job TOML


TITAN = (ROOT / "tests/data/logs/torchtitan_llama3_8b_fsdp8.toml").read_text()


@pytest.mark.parametrize("old, new, named", [
    ("tensor_parallel_degree = 1", "tensor_parallel_degree = 0",
     "parallelism.tensor_parallel_degree: Input should be greater than or equal to 1"),
    ("tensor_parallel_degree = 1", "tensor_parallel_degree = nan",
     "parallelism.tensor_parallel_degree is nan"),
    ("tensor_parallel_degree = 1", "tensor_parallel_degree = -inf",
     "parallelism.tensor_parallel_degree is -inf"),
    ("tensor_parallel_degree = 1", "tensor_parallel_degree = 1979-05-27T07:32:00Z",
     "parallelism.tensor_parallel_degree is a datetime"),
    ("seq_len = 8192", 'seq_len = "8192"', "training.seq_len: '8192' is a string, not a number"),
    ("seq_len = 8192", "seq_len = 8192\nx = " + "[" * 5000 + "]" * 5000, "nest"),
    ('mode = "selective"', 'mode = "sometimes"', "activation_checkpoint.mode 'sometimes'"),
    ("[model]", "parallelism = 3\n[model]", "Cannot overwrite a value"),
    ("[parallelism]", "[par]", None),
])
def test_torchtitan_tomls_are_checked_like_every_file(tmp_path, old, new, named):
    """Deep nesting, tensor_parallel_degree = 0, nan/inf and a datetime were exit 3."""
    text = TITAN.replace(old, new) if named else "parallelism = 3\n" + TITAN.replace(old, new)
    named = named or "[parallelism] must be a table, got int"
    path = write(tmp_path, "job.toml", text)
    with pytest.raises(ConfigError) as e:
        read_torchtitan_config(path)
    assert named in str(e.value) and "\n" not in str(e.value)


def test_the_torchtitan_toml_of_the_tests_reads():
    t = read_torchtitan_config(ROOT / "tests/data/logs/torchtitan_llama3_8b_fsdp8.toml")
    assert t == {"tp": 1, "pp": 1, "cp": 1, "dp_shard": -1, "local_batch_size": 1,
                 "seq_len": 8192, "ac_mode": "selective", "model_name": "llama3",
                 "model_flavor": "8B"}
