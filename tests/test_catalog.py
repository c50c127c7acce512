"""Catalog loaders: names and aliases, Hugging Face config.json files, user GPU files, errors."""

from __future__ import annotations

import json

import pytest

from tune_cp.config.specs import GIB, ConfigError
from tune_cp.oracle import params as P
from tune_cp.oracle.catalog import load_gpu, load_model, model_from_hf_config

# Abridged Hugging Face config.json files (the keys tune-cp reads, values as published).
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
}
MIXTRAL_8X22B = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 6144,
    "intermediate_size": 16384, "num_attention_heads": 48, "num_hidden_layers": 56,
    "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
    "vocab_size": 32768, "max_position_embeddings": 65536, "tie_word_embeddings": False,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_attention_heads": 32,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
    "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 40960,
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_attention_heads": 128,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "num_nextn_predict_layers": 1, "topk_method": "noaux_tc",
    "vocab_size": 129280, "tie_word_embeddings": False, "max_position_embeddings": 163840,
}


@pytest.mark.parametrize(
    "config,catalog",
    [(LLAMA3_8B, "llama3-8b"), (MIXTRAL_8X22B, "mixtral-8x22b"),
     (QWEN3_30B_A3B, "qwen3-30b-a3b"), (DEEPSEEK_V3, "deepseek-v3")],
)
def test_hf_config_gives_catalog_counts(tmp_path, config, catalog):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    spec = load_model(str(path))
    ref = load_model(catalog)
    assert P.total_params(spec) == P.total_params(ref)
    assert P.active_params(spec) == P.active_params(ref)
    assert spec.num_mtp_layers == ref.num_mtp_layers


def test_names_and_aliases_are_case_insensitive():
    assert load_model("Mixtral-8x22B-v0.1").name == "mixtral-8x22b"
    assert load_gpu("H100-SXM-80GB").name == "h100"
    assert load_gpu("mi355x").hbm_bytes == 288 * GIB


def test_unknown_model_suggests_close_names():
    with pytest.raises(ConfigError, match=r"unknown model 'mixtral-8x2b': did you mean mixtral-8x22b"):
        load_model("mixtral-8x2b")


def test_malformed_config_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "hidden_size": 4096,')
    with pytest.raises(ConfigError, match=r"is not valid JSON: .* at line 1 column"):
        load_model(str(path))


def test_config_json_missing_key_and_bad_type(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in LLAMA3_8B.items() if k != "num_hidden_layers"}))
    with pytest.raises(ConfigError, match=r"needs 'num_hidden_layers', which is missing"):
        load_model(str(path))
    path.write_text(json.dumps(LLAMA3_8B | {"hidden_size": "big"}))
    with pytest.raises(ConfigError, match=r"'hidden_size' must be an integer, got 'big'"):
        load_model(str(path))
    path.write_text(json.dumps(LLAMA3_8B | {"num_attention_heads": 0}))
    with pytest.raises(ConfigError):
        load_model(str(path))


def test_unsupported_model_type():
    with pytest.raises(ConfigError, match=r"unsupported model_type 'bert'; supported: .*llama"):
        model_from_hf_config({"model_type": "bert"})


def test_missing_file():
    with pytest.raises(ConfigError, match=r"cannot read model file"):
        load_model("/nonexistent/config.json")


def test_user_gpu_file_yaml(tmp_path):
    path = tmp_path / "my-gpu.yaml"
    path.write_text(
        "name: my-gpu\nvendor: nvidia\narchitecture: hopper\nhbm_gib: 96\n"
        "peak_bf16_tflops: 989\npeak_fp8_tflops: 1979\nhbm_tb_per_s: 3.35\n"
        "scale_up_gb_per_s: 450\nscale_up_domain_gpus: 8\nnic_gb_per_s: 50\n"
    )
    gpu = load_gpu(str(path))
    assert gpu.hbm_bytes == 96 * GIB and gpu.peak_bf16_flops == 989e12


def test_user_gpu_file_errors(tmp_path):
    path = tmp_path / "gpu.yaml"
    path.write_text("name: x\nhbm_gib: -3\n")
    with pytest.raises(ConfigError, match=r"GPU file .*hbm_gib"):
        load_gpu(str(path))
    path.write_text("[1, 2")
    with pytest.raises(ConfigError, match=r"not valid YAML"):
        load_gpu(str(path))


def test_tune_cp_model_file(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text("num_layers: 2\nhidden_size: 64\nffn_hidden_size: 128\nnum_attention_heads: 4\n"
                    "num_kv_heads: 2\nhead_dim: 16\nvocab_size: 1000\n")
    m = load_model(str(path))
    assert m.name == "tiny" and m.num_layers == 2


def test_no_catalog_alias_is_ambiguous():
    """Every alias names one entry and is no family name of several (``mixtral`` was both
    Mixtral 8x7B's family and an alias of 8x22B: issue 30 item 10)."""
    from tune_cp.oracle.catalog import family_members, gpu_entries, model_entries

    for entries in (model_entries(), gpu_entries()):
        names = list(entries)
        owners: dict[str, str] = {}
        for name, entry in entries.items():
            for alias in entry.aliases:
                key = alias.lower()
                assert key not in owners and key not in names, (alias, name, owners.get(key))
                owners[key] = name
                assert len(family_members(alias, names)) <= 1, alias


def test_a_family_name_is_refused_with_its_members():
    import pytest

    from tune_cp.config.specs import ConfigError
    from tune_cp.oracle.catalog import load_model

    with pytest.raises(ConfigError) as e:
        load_model("mixtral")
    assert str(e.value) == ("model 'mixtral' names 2 catalog models: choose one of mixtral-8x7b, "
                            "mixtral-8x22b (`tune-cp models` lists them)")
    with pytest.raises(ConfigError, match="names 3 catalog models: choose one of "
                                          "nemotron-h-8b, nemotron-h-47b, nemotron-h-56b"):
        load_model("Nemotron-H")  # any letter case; three members
    assert load_model("Mixtral-8x7B").name == "mixtral-8x7b"


def test_an_alias_is_stated_on_the_defaults_line(run_json):
    """An alias given to --model or --gpu is stated with the catalog name it stands for; the
    catalog name itself (any letter case) is not."""
    code, data = run_json("check", "--model", "llama3.1-70b", "--gpu", "h100-sxm", "--nodes", "1",
                          "--tp", "8")
    assert code in (0, 1) and data["model"]["name"] == "llama3-70b"
    assert data["defaults"][:2] == [
        "--model llama3-70b (the catalog's alias 'llama3.1-70b'; `tune-cp models --json` lists "
        "every alias)",
        "--gpu h100 (the catalog's alias 'h100-sxm'; `tune-cp gpus --json` lists every alias)"]
    code, data = run_json("check", "--model", "Llama3-70B", "--gpu", "h100", "--nodes", "1",
                          "--tp", "8")
    assert not any(d.startswith(("--model ", "--gpu ")) for d in data["defaults"])


def test_plan_states_an_alias(run_json):
    code, data = run_json("plan", "--model", "llama3.1-8b", "--gpu", "h100", "--points", "1")
    assert code == 0 and data["model"] == "llama3-8b"
    assert data["defaults"] == ["--model llama3-8b (the catalog's alias 'llama3.1-8b'; "
                                "`tune-cp models --json` lists every alias)"]
