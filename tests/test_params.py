"""Parameter counts pinned to the Hugging Face implementations' counts and Megatron padding."""

from __future__ import annotations

import pytest

from tune_cp.oracle import params as P
from tune_cp.oracle.catalog import load_model

# sum(p.numel() for p in model.parameters()) of the Hugging Face implementation
# (transformers' modeling_*.py with each model's config.json), MTP excluded.
HF_TOTAL = {
    "mixtral-8x7b": 46_702_792_704,
    "mixtral-8x22b": 140_630_071_296,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3.1-405b": 405_853_388_800,
    "qwen3-30b-a3b": 30_532_122_624,
    "qwen3-235b-a22b": 235_093_634_560,
    "deepseek-v3": 671_026_419_200,
    "gpt-oss-120b": 116_829_156_672,  # OpenAI model card: 116.83B
}


@pytest.mark.parametrize("name,total", HF_TOTAL.items())
def test_total_params_match_hugging_face(name, total):
    assert P.total_params(load_model(name)) == total


def test_active_params_published():
    # Mixtral 8x22B: 39.16B active (2 of 8 experts); Mixtral 8x7B: 12.9B; Qwen3-30B-A3B: 3.3B
    assert P.active_params(load_model("mixtral-8x22b")) == 39_161_468_928
    assert P.active_params(load_model("mixtral-8x7b")) == 12_879_925_248
    assert round(P.active_params(load_model("qwen3-30b-a3b")) / 1e9, 1) == 3.4
    assert round(P.active_params(load_model("qwen3-235b-a22b")) / 1e9, 1) == 22.2
    # gpt-oss-120b: the model card's 5.13B active excludes the input embedding (V x h)
    gpt = load_model("gpt-oss-120b")
    assert P.active_params(gpt) - gpt.vocab_size * gpt.hidden_size == 5_132_849_472
    # DeepSeek-V3: "671B total, 37B activated" (same convention: input embedding excluded)
    ds = load_model("deepseek-v3")
    assert round((P.active_params(ds) - ds.vocab_size * ds.hidden_size) / 1e9) == 37
    assert P.total_params(load_model("deepseek-v3"), include_mtp=True) == 682_636_487_424


def test_gpt3_175b_by_hand():
    # 96 layers x (12 h^2 + 13 h) + embeddings (50257 + 2048 positions) x h + final LayerNorm 2h
    h = 12288
    expected = 96 * (12 * h * h + 13 * h) + (50257 + 2048) * h + 2 * h
    assert P.total_params(load_model("gpt3-175b")) == expected == 174_604_259_328


@pytest.mark.parametrize(
    "vocab,tp,padded",
    [(128256, 1, 128256), (128256, 2, 128256), (128256, 4, 128512), (128256, 8, 129024),
     (32000, 1, 32000), (32000, 4, 32256), (50257, 1, 50304), (50257, 8, 51200)],
)
def test_vocab_padding_like_megatron(vocab, tp, padded):
    assert P.padded_vocab_size(vocab, tp) == padded


def test_per_rank_sharding_sums_to_whole():
    m = load_model("llama3-70b")
    for tp in (1, 2, 4, 8):
        # sharded parts times tp plus the replicated norm(s) tp-1 extra times
        attn_norm = m.hidden_size
        assert P.attention_params(m, tp) * tp - (tp - 1) * attn_norm == P.attention_params(m)
        assert P.dense_mlp_params(m, tp) * tp - (tp - 1) * attn_norm == P.dense_mlp_params(m)


def test_kv_heads_replicate_beyond_their_count():
    m = load_model("qwen3-30b-a3b")  # 4 KV heads
    assert P.kv_heads_per_rank(m, 2) == 2
    assert P.kv_heads_per_rank(m, 4) == 1
    assert P.kv_heads_per_rank(m, 8) == 1  # tp 8 > 4 KV heads: one replica per rank


def test_experts_shard_over_ep_and_etp():
    m = load_model("mixtral-8x22b")
    one = 3 * 6144 * 16384
    assert P.expert_params_per_rank(m, 8, 1) == one
    assert P.expert_params_per_rank(m, 4, 2) == 2 * one // 2
    assert P.expert_params_per_rank(m, 1, 1) == 8 * one
