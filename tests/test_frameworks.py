"""Launch-configuration import and export: Megatron-LM arguments, Primus experiment YAML,
Megatron-Bridge recipe overrides. Exact flag names, round trips, stated defaults, exact errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tune_cp.agent.serialize import check_json, config_json
from tune_cp.config.resolve import resolve_config
from tune_cp.config.specs import (
    ClusterSpec,
    ConfigError,
    Dispatcher,
    Fp8Recipe,
    GroupedGemm,
    ParallelConfig,
    PipelineSplit,
    Precision,
    Recompute,
    RecomputeMethod,
    Schedule,
    TrainingSpec,
)
from tune_cp.formats import (
    Fp8Format,
    canonical_config,
    parse_megatron_args,
    parse_primus_config,
    to_megatron_args,
    to_nemo_overrides,
    to_primus_overrides,
)
from tune_cp.formats.keys import megatron_flags
from tune_cp.oracle.catalog import load_gpu, load_model, model_entries, model_from_hf_config
from tune_cp.oracle.memory import split_layout
from tune_cp.solver.check import check_configuration

DATA = Path(__file__).parent / "data"
PRIMUS_EXPERIMENT = DATA / "primus" / "examples" / "MI355X" / "mixtral_8x22B_v0.1-BF16-4node.yaml"
MEGATRON_SCRIPT = DATA / "megatron" / "pretrain_llama3_8b_h100.sh"


def setting(model: str, gpu: str, nodes: int, seq: int, gbs: int, *, gpn: int = 8,
            precision: str = "bf16", flash: bool = True):
    m = load_model(model)
    cl = ClusterSpec(gpu=load_gpu(gpu), num_nodes=nodes, gpus_per_node=gpn)
    tr = TrainingSpec(seq_len=seq, global_batch_size=gbs, precision=precision,
                      flash_attention=flash)
    return m, cl, tr


AMD_REF = dict(tp=1, pp=4, vpp=2, ep=8, mbs=1, recompute="full", recompute_method="block",
               recompute_layers=1, distributed_optimizer=True, dispatcher="alltoall")


def amd_reference():
    m, cl, tr = setting("mixtral-8x22b", "mi355x", 4, 8192, 512)
    return m, cl, tr, ParallelConfig(**AMD_REF)


# ------------------------------------------------------------------------------ exporters


def flag_lines(text: str) -> list[str]:
    return [ln.removesuffix(" \\") for ln in text.splitlines() if ln and not ln.startswith("#")]


def test_megatron_export_of_amd_reference_has_exact_flags():
    text = to_megatron_args(*amd_reference(), include_model=False)
    assert flag_lines(text) == [
        "--tensor-model-parallel-size 1",
        "--pipeline-model-parallel-size 4",
        "--num-virtual-stages-per-pipeline-rank 2",
        "--context-parallel-size 1",
        "--expert-model-parallel-size 8",
        "--expert-tensor-parallel-size 1",
        "--micro-batch-size 1",
        "--global-batch-size 512",
        "--seq-length 8192",
        "--max-position-embeddings 8192",
        "--recompute-granularity full",
        "--recompute-method block",
        "--recompute-num-layers 1",
        "--use-distributed-optimizer",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--moe-token-dispatcher-type alltoall",
        "--moe-grouped-gemm",
        "--bf16",
    ]
    lines = text.splitlines()
    assert all(ln.endswith(" \\") for ln in lines[3:-1]) and not lines[-1].endswith("\\")
    assert lines[0] == ("# tune-cp: mixtral-8x22b on 4 nodes x 8 mi355x (32 GPUs), seq 8192, "
                        "gbs 512, bf16")
    assert "--virtual-pipeline-model-parallel-size" not in text


def test_megatron_export_model_flags():
    m, cl, tr, cfg = amd_reference()
    model_part = flag_lines(to_megatron_args(m, cl, tr, cfg))[19:]
    assert model_part == [
        "--num-layers 56", "--hidden-size 6144", "--ffn-hidden-size 16384",
        "--num-attention-heads 48", "--group-query-attention", "--num-query-groups 8",
        "--swiglu", "--normalization RMSNorm", "--norm-epsilon 1e-05",
        "--untie-embeddings-and-output-weights", "--disable-bias-linear",
        "--position-embedding-type rope", "--rotary-base 1000000", "--attention-dropout 0.0",
        "--hidden-dropout 0.0", "--vocab-size 32768", "--num-experts 8",
        "--moe-ffn-hidden-size 16384", "--moe-router-topk 2",
    ]
    ds, cl2, tr2 = setting("deepseek-v3", "h200", 32, 4096, 4096)
    flags = flag_lines(to_megatron_args(ds, cl2, tr2, ParallelConfig(pp=8, ep=32)))
    for expected in ("--multi-latent-attention", "--q-lora-rank 1536", "--kv-lora-rank 512",
                     "--qk-head-dim 128", "--qk-pos-emb-head-dim 64", "--v-head-dim 128",
                     "--moe-shared-expert-intermediate-size 2048",
                     "--moe-layer-freq '([0]*3+[1]*58)'", "--moe-router-enable-expert-bias",
                     "--mtp-num-layers 1", "--moe-router-score-function sigmoid",
                     "--moe-router-num-groups 8", "--moe-router-group-topk 4",
                     "--moe-router-topk-scaling-factor 2.5", "--position-embedding-type yarn",
                     "--rotary-scaling-factor 40.0",
                     "--yarn-original-max-position-embeddings 4096", "--norm-epsilon 1e-06"):
        assert expected in flags


def test_megatron_export_variants():
    m, cl, tr = setting("llama3-70b", "h100", 8, 8192, 128, precision="fp8", flash=False)
    cfg = ParallelConfig(tp=8, pp=4, vpp=5, cp=2, recompute="selective",
                         recompute_modules=("core_attn", "mlp"), pipeline_split="embedding_loss")
    flags = flag_lines(to_megatron_args(m, cl, tr, cfg, include_model=False))
    assert flags[:8] == [
        "--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 4",
        "--num-virtual-stages-per-pipeline-rank 5",
        "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
        "--context-parallel-size 2", "--sequence-parallel", "--micro-batch-size 1",
    ]
    assert "--recompute-granularity selective" in flags
    assert "--recompute-modules core_attn mlp" in flags
    assert flags[-3:] == ["--fp8-format hybrid", "--fp8-recipe tensorwise",
                          "--attention-backend unfused"]
    # full recompute of every layer is written as the explicit count Megatron-LM requires
    full = flag_lines(to_megatron_args(m, cl, tr, ParallelConfig(tp=8, pp=4, recompute="full"),
                                       include_model=False))
    assert "--recompute-num-layers 20" in full and "--recompute-method block" in full
    fsdp = flag_lines(to_megatron_args(m, cl, tr, ParallelConfig(tp=8, fsdp=True),
                                       include_model=False))
    assert ["--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params",
            "--use-distributed-optimizer"] == fsdp[8:11]
    b = setting("qwen3-30b-a3b", "b200", 2, 4096, 512, precision="fp8")
    flex = flag_lines(to_megatron_args(*b, ParallelConfig(ep=8, dispatcher="flex"),
                                       include_model=False))
    assert "--moe-token-dispatcher-type flex" in flex
    assert "--moe-flex-dispatcher-backend deepep" in flex
    assert flex[-2:] == ["--fp8-format e4m3", "--fp8-recipe mxfp8"]


def test_megatron_export_launcher_line():
    text = to_megatron_args(*amd_reference(), launcher=True)
    assert flag_lines(text)[0] == "torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py"


def test_primus_export_of_amd_reference():
    text = to_primus_overrides(*amd_reference())
    body = [ln for ln in text.splitlines() if not ln.startswith("#")]
    # then the model, in Primus keys (they override the model YAML with the checked model)
    assert body[28:] == [
        "      swiglu: true", "      quick_geglu: false", "      squared_relu: false",
        "      untie_embeddings_and_output_weights: true", "      add_bias_linear: false",
        "      add_qkv_bias: false", "      qk_layernorm: false",
        "      group_query_attention: true", "      multi_latent_attention: false",
        "      use_rope_scaling: false", "      moe_router_enable_expert_bias: false",
        "      num_layers: 56", "      hidden_size: 6144", "      ffn_hidden_size: 16384",
        "      num_attention_heads: 48", "      num_query_groups: 8",
        "      normalization: RMSNorm", "      norm_epsilon: 1.0e-05",
        "      position_embedding_type: rope", "      rotary_base: 1000000",
        "      attention_dropout: 0.0", "      hidden_dropout: 0.0", "      vocab_size: 32768",
        "      num_experts: 8", "      moe_ffn_hidden_size: 16384", "      moe_router_topk: 2",
    ]
    assert body[:28] == [
        "modules:",
        "  pre_trainer:",
        "    overrides:",
        "      tensor_model_parallel_size: 1",
        "      pipeline_model_parallel_size: 4",
        "      num_virtual_stages_per_pipeline_rank: 2",
        "      context_parallel_size: 1",
        "      expert_model_parallel_size: 8",
        "      expert_tensor_parallel_size: 1",
        "      sequence_parallel: false",
        "      account_for_embedding_in_pipeline_split: false",
        "      account_for_loss_in_pipeline_split: false",
        "      micro_batch_size: 1",
        "      global_batch_size: 512",
        "      seq_length: 8192",
        "      max_position_embeddings: 8192",
        "      recompute_granularity: full",
        "      recompute_method: block",
        "      recompute_num_layers: 1",
        "      use_distributed_optimizer: true",
        "      use_megatron_fsdp: false",
        "      overlap_grad_reduce: true",
        "      overlap_param_gather: true",
        "      moe_token_dispatcher_type: alltoall",
        "      moe_grouped_gemm: true",
        "      bf16: true",
        "      fp8: null",
        "      patch_zero_bubble: false",
    ]
    assert yaml.safe_load(text)["modules"]["pre_trainer"]["overrides"]["recompute_num_layers"] == 1


def test_nemo_export_of_amd_reference():
    text = to_nemo_overrides(*amd_reference())
    lines = [ln for ln in text.splitlines() if ln.startswith("cfg.")]
    model_block = text.split("# the model tune-cp checked (mixtral-8x22b), on the recipe's "
                             "model provider\n")[1].splitlines()
    assert model_block[:3] == ["cfg.model.num_layers = 56", "cfg.model.hidden_size = 6144",
                               "cfg.model.ffn_hidden_size = 16384"]
    assert "cfg.model.rotary_base = 1000000" in model_block
    assert "cfg.model.activation_func = F.silu" in model_block
    lines = lines[:len(lines) - len(model_block)]
    assert lines == [
        "cfg.model.tensor_model_parallel_size = 1",
        "cfg.model.pipeline_model_parallel_size = 4",
        "cfg.model.pipeline_dtype = torch.bfloat16",
        "cfg.model.virtual_pipeline_model_parallel_size = 2",
        "cfg.model.pipeline_model_parallel_layout = None",
        "cfg.model.num_layers_in_first_pipeline_stage = None",
        "cfg.model.num_layers_in_last_pipeline_stage = None",
        "cfg.model.account_for_embedding_in_pipeline_split = False",
        "cfg.model.account_for_loss_in_pipeline_split = False",
        "cfg.model.context_parallel_size = 1",
        "cfg.model.expert_model_parallel_size = 8",
        "cfg.model.expert_tensor_parallel_size = 1",
        "cfg.model.sequence_parallel = False",
        "cfg.model.seq_length = 8192",
        "cfg.dataset.seq_length = 8192",
        "cfg.train.micro_batch_size = 1",
        "cfg.train.global_batch_size = 512",
        'cfg.model.recompute_granularity = "full"',
        'cfg.model.recompute_method = "block"',
        "cfg.model.recompute_num_layers = 1",
        "cfg.model.recompute_modules = None",
        "cfg.ddp.use_distributed_optimizer = True",
        "cfg.optimizer.use_distributed_optimizer = True",
        "cfg.ddp.use_megatron_fsdp = False",
        "cfg.ddp.overlap_grad_reduce = True",
        "cfg.ddp.overlap_param_gather = True",
        'cfg.model.moe_token_dispatcher_type = "alltoall"',
        "cfg.model.moe_flex_dispatcher_backend = None",
        "cfg.model.moe_grouped_gemm = True",
        "cfg.model.moe_permute_fusion = False",
        "cfg.model.moe_shared_expert_overlap = False",
        "cfg.model.moe_router_dtype = None",
        "cfg.mixed_precision = bf16_mixed()",
    ]
    assert "from megatron.bridge.training.mixed_precision import bf16_mixed" in text
    compile(text, "<nemo overrides>", "exec")  # valid Python


def test_nemo_export_fp8_and_unfused_attention():
    m, cl, tr = setting("llama3-8b", "h100", 1, 8192, 128, precision="fp8", flash=False)
    text = to_nemo_overrides(m, cl, tr, ParallelConfig(tp=2, fp8_recipe="delayed"))
    assert 'cfg.mixed_precision.fp8 = "hybrid"' in text
    assert 'cfg.mixed_precision.fp8_recipe = "delayed"' in text
    assert "cfg.mixed_precision.fp8_param_gather = False" in text
    assert "cfg.model.attention_backend = AttnBackend.unfused" in text
    assert "from megatron.core.transformer.enums import AttnBackend" in text
    compile(text, "<nemo overrides>", "exec")


def test_zero_bubble_only_exports_to_primus():
    m, cl, tr = setting("llama3-8b", "mi300x", 1, 4096, 64)
    cfg = ParallelConfig(pp=4, schedule="zero_bubble")
    message = ("schedule zero_bubble has no Megatron-LM setting (it is Primus's zero-bubble "
               "runtime): export to primus, or choose schedule interleaved or 1f1b")
    with pytest.raises(ConfigError) as e:
        to_megatron_args(m, cl, tr, cfg)
    assert str(e.value) == message
    with pytest.raises(ConfigError, match="no Megatron-Bridge setting"):
        to_nemo_overrides(m, cl, tr, cfg)
    text = to_primus_overrides(m, cl, tr, cfg)
    assert "      patch_zero_bubble: true\n      enable_zero_bubble: true\n" in text
    assert "      overlap_grad_reduce: false\n" in text


# ---------------------------------------------------------------------------- round trips

SETTINGS = {
    "mixtral": ("mixtral-8x22b", "mi355x", 4, 8192, 512, "bf16", True),
    "llama70": ("llama3-70b", "h100", 8, 8192, 128, "bf16", True),
    "llama70_fp8": ("llama3-70b", "h100", 8, 8192, 128, "fp8", False),
    "deepseek": ("deepseek-v3", "h200", 32, 4096, 4096, "bf16", True),
    "qwen_fp8": ("qwen3-30b-a3b", "b200", 2, 4096, 512, "fp8", True),
    "gpt3": ("gpt3-175b", "a100", 16, 2048, 1536, "bf16", True),
    "gptoss": ("gpt-oss-120b", "h100", 4, 4096, 1280, "bf16", True),
}

DENSE = [
    dict(tp=8, pp=2),
    dict(tp=8, pp=4, vpp=5, recompute="selective", recompute_modules=("core_attn", "mlp")),
    dict(tp=4, cp=2, pp=2, recompute="full", recompute_method="uniform", recompute_layers=2),
    dict(tp=4, pp=4, recompute="full"),
    dict(tp=4, pp=4, recompute="full", recompute_method="uniform"),
    dict(tp=8, pp=4, vpp=3, pipeline_split="embedding_loss", mbs=2),
    dict(tp=2, sequence_parallel=False, distributed_optimizer=False),
    dict(tp=8, fsdp=True),
    dict(tp=4, pp=2, fp8_recipe="blockwise", recompute="full", recompute_layers=0),
]
MOE = [
    AMD_REF,
    dict(tp=2, ep=4, etp=1, dispatcher="flex", pp=2),
    dict(tp=2, cp=2, ep=8, etp=2, dispatcher="allgather"),
    dict(ep=8, pp=2, recompute="selective", recompute_modules=("moe_act", "layernorm")),
    dict(ep=8, pp=4, vpp=2, recompute="full", recompute_method="uniform", recompute_layers=1,
         fp8_recipe="delayed"),
]
CASES = [(s, c) for s in ("llama70", "llama70_fp8", "gpt3") for c in DENSE] + [
    (s, c) for s in ("mixtral", "deepseek", "qwen_fp8", "gptoss") for c in MOE] + [
    # bf16 gradient buffer (--grad-reduce-in-bf16 / grad_reduce_in_bf16: true)
    ("llama70", dict(tp=8, pp=2, grad_reduce_in_fp32=False)),
    ("gpt3", dict(tp=8, fsdp=True, grad_reduce_in_fp32=False)),
    ("mixtral", dict(ep=8, pp=2, grad_reduce_in_fp32=False)),
]


def expected_notes(c: ParallelConfig) -> list[str]:
    out = []
    if c.pipeline_split is PipelineSplit.EMBEDDING_MTP_LOSS:  # written as a layout
        out.append(f"pipeline_model_parallel_layout {written_layout_of(c)} is the "
                   f"embedding_mtp_loss split over {c.pp * c.vpp} virtual stages (pp {c.pp} x "
                   f"vpp {c.vpp})")
    if c.recompute is Recompute.FULL and c.recompute_layers == 0:
        out.append("full recompute with the block method and 0 layers recomputes nothing")
    return out


def written_layout_of(c: ParallelConfig) -> str:
    """The layout the exporters write for an embedding_mtp_loss configuration of DeepSeek-V3
    (the only MTP model of these cases)."""
    m = load_model("deepseek-v3")
    return split_layout(m.num_layers, m.num_mtp_layers, c.pp, c.vpp, c.pipeline_split)


def exported_training(tr: TrainingSpec, c: ParallelConfig) -> TrainingSpec:
    """The exporters write FP8 flags whenever the configuration has an FP8 recipe."""
    precision = Precision.FP8 if c.fp8_recipe is not None else tr.precision
    return tr.model_copy(update={"precision": precision})


@pytest.mark.parametrize(("name", "kw"), CASES)
def test_megatron_args_round_trip(name, kw):
    model, gpu, nodes, seq, gbs, precision, flash = SETTINGS[name]
    m, cl, tr = setting(model, gpu, nodes, seq, gbs, precision=precision, flash=flash)
    cfg = ParallelConfig(**kw)
    expected = canonical_config(m, cl, tr, cfg)
    text = to_megatron_args(m, cl, tr, cfg, launcher=True)
    run = parse_megatron_args(text, model=m)
    # the Primus-Turbo settings of an AMD flex run are Primus command-line overrides, read back
    # with a note each (tests/test_moe_backend.py pins them)
    notes = [n for n in run.notes if not n.startswith(("--enable_primus_turbo", "--use_turbo_",
                                                       "--turbo_", "--moe_use_legacy",
                                                       "Primus-Turbo MoE settings read"))]
    assert run.unknown == [] and notes == expected_notes(expected)
    assert (run.num_nodes, run.gpus_per_node) == (nodes, 8)
    training = run.training_spec(m, cl)
    assert training == exported_training(tr, expected)
    assert resolve_config(run.config, m, cl, training) == expected
    assert config_json(expected, tr) == config_json(resolve_config(cfg, m, cl, tr), tr) | {
        "recompute_layers": expected.recompute_layers, "etp": expected.etp_,
        "dispatcher": expected.dispatcher.value}
    if name != "gptoss":  # sliding windows and attention sinks have no Megatron-LM flags
        rebuilt = parse_megatron_args(text)
        assert rebuilt.model is not None
        keep = {"name", "family", "source", "default_seq_len", "default_global_batch_size",
                "max_position_embeddings"}
        assert rebuilt.model.model_dump(exclude=keep) == m.model_dump(exclude=keep)
        assert resolve_config(rebuilt.config, rebuilt.model, cl, training) == expected


@pytest.mark.parametrize(("name", "kw"), CASES[::3])
def test_primus_overrides_round_trip(name, kw, tmp_path):
    model, gpu, nodes, seq, gbs, precision, flash = SETTINGS[name]
    m, cl, tr = setting(model, gpu, nodes, seq, gbs, precision=precision, flash=flash)
    cfg = ParallelConfig(**kw)
    path = tmp_path / "exp.yaml"
    path.write_text(to_primus_overrides(m, cl, tr, cfg))
    run = parse_primus_config(path, model=m)
    expected = canonical_config(m, cl, tr, cfg)
    assert run.unknown == [] and run.notes == expected_notes(expected)
    training = run.training_spec(m, cl)
    assert training == exported_training(tr, expected)
    assert resolve_config(run.config, m, cl, training) == expected


def test_canonical_config_is_resolve_for_explicit_configs():
    m, cl, tr, cfg = amd_reference()
    assert canonical_config(m, cl, tr, cfg) == resolve_config(cfg, m, cl, tr)


def test_imported_amd_reference_checks_like_the_flags():
    m, cl, tr, cfg = amd_reference()
    run = parse_megatron_args(to_megatron_args(m, cl, tr, cfg), model=m)
    direct = check_configuration(m, cl, tr, cfg)
    imported = check_configuration(m, cl, run.training_spec(m, cl), run.config)
    assert check_json(imported) == check_json(direct)


# ------------------------------------------------------------------------- Megatron import

MIXTRAL_LAUNCH = r"""
# AMD-style 4-node Mixtral 8x22B run, as it would appear in a launch log
CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes=4 --nproc_per_node 8 --node_rank 0 \
    --master_addr 10.0.0.1 --master_port 29500 pretrain_gpt.py \
    --num-layers 56 --hidden-size 6144 --ffn-hidden-size 16384 --num-attention-heads 48 \
    --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm \
    --untie-embeddings-and-output-weights --disable-bias-linear \
    --position-embedding-type rope --attention-dropout 0.0 --hidden-dropout 0.0 \
    --num-experts 8 --moe-router-topk 2 --moe-token-dispatcher-type alltoall --moe-grouped-gemm \
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 \
    --num-layers-per-virtual-pipeline-stage 7 --expert-model-parallel-size=8 \
    --micro-batch-size 1 --global-batch-size 512 --seq-length 8192 \
    --max-position-embeddings 8192 \
    --recompute-granularity full --recompute-method block --recompute-num-layers 1 \
    --use-distributed-optimizer --overlap-grad-reduce --bf16 \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model "mistralai/Mixtral-8x22B-v0.1" \
    --data-path '/data/mix tral/text_document' --lr 1e-5 --my-site-flag 3 \
    --exit-signal-handler 2>&1 | tee /logs/mixtral.log
"""


def test_realistic_megatron_launch():
    run = parse_megatron_args(MIXTRAL_LAUNCH)
    m, cl, tr, cfg = amd_reference()
    assert (run.num_nodes, run.gpus_per_node) == (4, 8)
    assert run.model is not None and run.model.vocab_size == 32768
    assert run.unknown == ["--my-site-flag 3"]
    assert run.ignored == ["--data-path", "--lr", "--exit-signal-handler"]  # --moe-grouped-gemm read
    assert run.unmodelled == ["--overlap-grad-reduce"]  # changes time; printed as a warning
    assert run.notes == []
    assert run.defaults == [
        "moe_ffn_hidden_size: 16384 (Megatron-LM default: ffn_hidden_size)",
        "vocab_size: 32768 (tokenizer mistralai/Mixtral-8x22B-v0.1; the catalog model "
        "mixtral-8x22b)",
        "context_parallel_size: 1 (Megatron-LM default)",
        "expert_tensor_parallel_size: tensor_model_parallel_size (Megatron-LM default)",
    ]
    # 7 layers per virtual stage of 56 / pp 4 = 2 virtual stages per rank
    assert resolve_config(run.config, m, cl, run.training_spec(m, cl)) == canonical_config(
        m, cl, tr, cfg)


def test_script_with_bash_arrays():
    run = parse_megatron_args(MEGATRON_SCRIPT.read_text())
    c = run.config
    assert (c.tp, c.pp, c.cp, c.vpp, c.mbs) == (2, 2, 2, 1, 1)
    assert c.sequence_parallel is True and c.distributed_optimizer is True
    assert c.recompute is Recompute.SELECTIVE and c.recompute_modules == ("core_attn", "layernorm")
    assert (run.seq_len, run.global_batch_size, run.precision) == (8192, 128, Precision.BF16)
    assert run.model is not None and run.model.num_kv_heads == 8
    assert run.model.vocab_size == 128256  # the tokenizer is the catalog's llama3-8b
    # "/lustre/tb/llama3 8b" is split by the unquoted ${LOGGING_ARGS[@]}, as bash splits it
    assert run.unknown == ["8b", "--straggler-report-interval 50"]
    assert "--tensorboard-dir" in run.ignored and "--lr" in run.ignored
    # the script's GPUS_PER_NODE=8 / NUM_NODES=2 reach torchrun through its array
    assert (run.num_nodes, run.gpus_per_node) == (2, 8)
    assert run.notes == [
        "--cp-comm-type a2a: tune-cp models the p2p (ring) context-parallel exchange",
    ]


def test_missing_arguments_take_megatron_defaults_stated():
    m = load_model("mixtral-8x22b")
    run = parse_megatron_args("--tensor-model-parallel-size 2 --fp8-format hybrid", model=m)
    c = run.config
    assert (c.pp, c.vpp, c.cp, c.ep, c.etp, c.mbs) == (1, 1, 1, 1, None, 1)
    assert c.sequence_parallel is False and c.distributed_optimizer is False
    assert c.dispatcher is Dispatcher.ALLGATHER and c.recompute is Recompute.NONE
    assert c.fp8_recipe is Fp8Recipe.DELAYED and run.fp8_format is Fp8Format.HYBRID
    assert c.pipeline_split is PipelineSplit.EVEN and run.precision is Precision.FP8
    assert run.defaults == [
        "pipeline_model_parallel_size: 1 (Megatron-LM default)",
        "context_parallel_size: 1 (Megatron-LM default)",
        "expert_model_parallel_size: 1 (Megatron-LM default)",
        "expert_tensor_parallel_size: tensor_model_parallel_size (Megatron-LM default)",
        "micro_batch_size: 1 (not given; Megatron-LM requires --micro-batch-size, tune-cp "
        "assumes 1)",
        "global_batch_size: micro_batch_size x data-parallel size (Megatron-LM default: one "
        "micro-batch per step)",
        "seq_length: the model's default (not given; Megatron-LM requires --seq-length)",
        "sequence_parallel: off (Megatron-LM default)",
        "recompute_granularity: none (Megatron-LM default)",
        "use_distributed_optimizer: off (Megatron-LM default)",
        "moe_token_dispatcher_type: allgather (Megatron-LM default)",
        "fp8_recipe: delayed (Megatron-LM default)",
    ]
    assert run.notes == ["neither bf16 nor fp16 is on: Megatron-LM would train in fp32, which "
                         "tune-cp does not model; read as bf16"]
    cl = ClusterSpec(gpu=load_gpu("mi355x"), num_nodes=2, gpus_per_node=8)
    training = run.training_spec(m, cl)
    assert (training.seq_len, training.global_batch_size) == (8192, 8)  # mbs 1 x dp 8


def test_model_from_flags_states_megatron_model_defaults():
    run = parse_megatron_args("--num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
                              "--vocab-size 50257 --max-position-embeddings 2048 --bf16")
    model = run.require_model()
    assert (model.ffn_hidden_size, model.head_dim, model.num_kv_heads) == (8192, 128, 16)
    assert model.norm == "layernorm" and not model.gated_mlp and model.tied_embeddings
    assert model.qkv_bias and model.mlp_bias and model.position_embedding == "learned"
    assert (model.attention_dropout, model.hidden_dropout) == (0.1, 0.1)
    assert run.defaults[:9] == [
        "swiglu: off (Megatron-LM default)",
        "ffn_hidden_size: 8192 (Megatron-LM default for hidden_size 2048)",
        "group_query_attention: off (Megatron-LM default)",
        "add_bias_linear: on (Megatron-LM default)",
        "position_embedding_type: learned_absolute (Megatron-LM default)",
        "untie_embeddings_and_output_weights: off (Megatron-LM default)",
        "normalization: LayerNorm (Megatron-LM default)",
        "attention_dropout: 0.1 (Megatron-LM default)",
        "hidden_dropout: 0.1 (Megatron-LM default)",
    ]
    swiglu = parse_megatron_args("--num-layers 2 --hidden-size 4096 --num-attention-heads 32 "
                                 "--swiglu --vocab-size 32000 --position-embedding-type rope")
    assert swiglu.require_model().ffn_hidden_size == 10880  # int(4h * 2/3 / 64) * 64


def test_model_missing_is_explained():
    run = parse_megatron_args("--tensor-model-parallel-size 2 --num-layers 32")
    assert run.model is None
    with pytest.raises(ConfigError) as e:
        run.require_model()
    assert str(e.value) == ("the Megatron-LM arguments do not describe the model (no "
                            "--hidden-size, --num-attention-heads); pass --model NAME (see "
                            "`tune-cp models`) or a config.json")
    no_vocab = parse_megatron_args("--num-layers 2 --hidden-size 64 --num-attention-heads 4 "
                                   "--tokenizer-model acme/secret-tokenizer")
    assert no_vocab.model_missing == ("the vocabulary size is unknown: no --vocab-size, and "
                                      "tokenizer 'acme/secret-tokenizer' is not in tune-cp's "
                                          "tokenizer table; add --vocab-size N, or pass --model")


def test_flags_that_differ_from_the_model_are_noted():
    run = parse_megatron_args("--num-layers 32 --hidden-size 6144 --bf16",
                              model=load_model("mixtral-8x22b"))
    assert run.notes == ["--num-layers 32 differs from mixtral-8x22b's 56; tune-cp uses "
                         "mixtral-8x22b"]


def test_primus_style_underscored_flags_are_read_with_a_note():
    # the AMD 4-node run as Primus's docs print it (Primus command-line overrides)
    run = parse_megatron_args(
        "--micro_batch_size 1 --global_batch_size 512 --num_virtual_stages_per_pipeline_rank 2 "
        "--pipeline_model_parallel_size 4 --expert_model_parallel_size 8 --recompute_num_layers 1"
        " --moe_use_legacy_grouped_gemm True --bf16", model=load_model("mixtral-8x22b"))
    c = run.config
    assert (c.mbs, c.vpp, c.pp, c.ep) == (1, 2, 4, 8) and run.global_batch_size == 512
    assert run.notes[0] == ("--micro_batch_size: Megatron-LM spells it --micro-batch-size "
                            "(underscored flags are Primus's command line); read as such")
    assert "recompute_method / recompute_num_layers without recompute_granularity: no " \
           "recomputation" in run.notes
    # the reference's legacy grouped GEMM is read (gone from Megatron-LM d98e8a64; Primus takes it)
    assert run.unknown == [] and run.ignored == [] and c.grouped_gemm is GroupedGemm.LEGACY
    assert ("--moe_use_legacy_grouped_gemm is not a Megatron-LM d98e8a64 flag (Primus's "
            "Megatron-LM and Primus-Turbo take it); read") in run.notes


def test_layers_per_virtual_stage_with_embedding_loss_split():
    run = parse_megatron_args(
        "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 4 "
        "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split --bf16",
        model=load_model("llama3.1-405b"))
    # (126 layers + embedding + loss) / pp 4 = 32 slots per rank, 4 per virtual stage
    assert run.config.vpp == 8 and run.config.pipeline_split is PipelineSplit.EMBEDDING_LOSS


@pytest.mark.parametrize(("text", "message"), [
    ("--tensor-model-parallel-size x",
     "--tensor-model-parallel-size 'x': not a whole number; give an integer of at least 1"),
    ("--pipeline-model-parallel-size 0", "--pipeline-model-parallel-size '0': must be at least 1"),
    ("--micro-batch-size 2.5", "--micro-batch-size '2.5': not a whole number; give an integer of "
     "at least 1"),
    ("--tensor-model-parallel-size $TP",
     "--tensor-model-parallel-size '${TP}': the value is $TP, which the script takes from the "
     "environment; pass --env TP=VALUE"),
    ("--moe-token-dispatcher-type all2all",
     "--moe-token-dispatcher-type 'all2all': not a valid choice; choose one of allgather, "
     "alltoall, flex, alltoall_seq"),
    ("--fp8-format e5m2", "--fp8-format 'e5m2': not a valid choice; choose one of e4m3, hybrid"),
    ("--seq-length", "--seq-length: missing its value; write --seq-length VALUE"),
    ("--sequence-parallel=false", "--sequence-parallel=false: this flag takes no value; write "
     "--sequence-parallel alone to turn it on, or leave it out"),
    ("--recompute-granularity full --recompute-num-layers 1",
     "--recompute-granularity 'full': needs --recompute-method too; Megatron-LM rejects full "
     "recompute without --recompute-method uniform|block and --recompute-num-layers N"),
    ("--recompute-granularity selective --recompute-method block",
     "--recompute-method 'block': must not be given with selective recompute (Megatron-LM "
     "rejects it); drop it, or use full recompute"),
    ("--recompute-granularity selective --recompute-modules attn",
     "--recompute-modules attn: 'attn' is not a recompute module; choose from core_attn, "
     "layernorm, mla_up_proj, mlp, moe, moe_act, shared_experts"),
    ("--num-virtual-stages-per-pipeline-rank 2 --num-layers-per-virtual-pipeline-stage 7",
     "--num-virtual-stages-per-pipeline-rank and --num-layers-per-virtual-pipeline-stage are "
     "both given; Megatron-LM accepts only one of them: keep "
     "--num-virtual-stages-per-pipeline-rank"),
    ("--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 5",
     "--num-layers-per-virtual-pipeline-stage '5': must divide the 14 layers per pipeline rank "
     "(56 / pp 4); choose one of 1, 2, 7, 14, or use --num-virtual-stages-per-pipeline-rank"),
    ("--fp8-format hybrid --fp8-recipe custom",
     "--fp8-recipe 'custom': a custom quantization recipe is not modeled; choose one of delayed,"
     " tensorwise, blockwise, mxfp8"),
    ("--use-megatron-fsdp --use-torch-fsdp2",
     "--use-torch-fsdp2: cannot be used together with --use-megatron-fsdp; keep one"),
    ("--seq-length 4096 'unclosed",
     "the launch text has an unclosed ' quote; check the quotes"),
    ("   \n", "the Megatron-LM arguments are empty; paste the launch command or its arguments"),
])
def test_malformed_megatron_values_are_one_line_errors(text, message):
    with pytest.raises(ConfigError) as e:
        parse_megatron_args(text, model=load_model("mixtral-8x22b"))
    assert str(e.value) == message
    assert "\n" not in str(e.value)


def test_megatron_fsdp_strategies():
    m = load_model("llama3-8b")
    full = parse_megatron_args("--use-megatron-fsdp --bf16", model=m)
    assert full.config.fsdp is True
    zero1 = parse_megatron_args("--use-megatron-fsdp --data-parallel-sharding-strategy optim "
                                "--bf16", model=m)
    assert zero1.config.fsdp is False and zero1.config.distributed_optimizer is True
    assert zero1.notes == ["Megatron-FSDP with optim is modeled as the distributed optimizer "
                           "(optimizer states sharded; gradients counted unsharded)"]
    torch2 = parse_megatron_args("--use-torch-fsdp2 --bf16", model=m)
    assert torch2.config.fsdp is True


def test_unmodeled_flags_are_noted_not_dropped_silently():
    run = parse_megatron_args(
        "--bf16 --fp8-param-gather "
        "--no-overlap-p2p-communication --moe-expert-capacity-factor 1.25 --optimizer adam",
        model=load_model("llama3-8b"))
    assert run.notes == [
        "--no-overlap-p2p-communication: without p2p overlap Megatron-LM needs pp > 2 for "
        "virtual stages; tune-cp assumes the overlap",
    ]  # a capacity factor is a run setting now (RunOptions), without effect on a dense model
    assert run.options.moe_capacity_factor is None
    assert run.unknown == []
    assert run.config.fp8_param_gather is False  # a bf16 run has no FP8 parameters to gather


def test_deprecated_spellings():
    m = load_model("qwen3-30b-a3b")
    run = parse_megatron_args("--recompute-activations --moe-enable-deepep --bf16", model=m)
    assert run.config.recompute is Recompute.SELECTIVE
    assert run.config.dispatcher is Dispatcher.FLEX
    vpp = parse_megatron_args("--pipeline-model-parallel-size 4 "
                              "--virtual-pipeline-model-parallel-size 2 --bf16", model=m)
    assert vpp.config.vpp == 1
    assert vpp.unknown == ["--virtual-pipeline-model-parallel-size 2"]
    assert vpp.notes == ["--virtual-pipeline-model-parallel-size is not a Megatron-LM flag "
                         "(argparse would reject the launch); use "
                         "--num-virtual-stages-per-pipeline-rank"]


# ------------------------------------------------------------------------------ Primus import


def test_realistic_primus_experiment():
    run = parse_primus_config(PRIMUS_EXPERIMENT)
    m, cl, tr, cfg = amd_reference()
    assert run.model_file == "mixtral_8x22B_v0.1.yaml"
    model = run.require_model()
    assert model.name == "mixtral_8x22B_v0.1"
    keep = {"name", "family", "source", "default_seq_len", "default_global_batch_size",
            "max_position_embeddings"}
    assert model.model_dump(exclude=keep) == m.model_dump(exclude=keep)
    c = run.config
    assert (c.tp, c.pp, c.vpp, c.ep, c.mbs) == (1, 4, 2, 8, 1)
    assert c.recompute is Recompute.FULL and c.recompute_method is RecomputeMethod.BLOCK
    assert c.recompute_layers == 1 and c.distributed_optimizer and c.dispatcher == "alltoall"
    assert (run.seq_len, run.global_batch_size, run.precision) == (8192, 512, Precision.BF16)
    # the experiment runs the legacy grouped GEMM (moe_use_legacy_grouped_gemm: true)
    assert resolve_config(c, model, cl, run.training_spec(model, cl)) == canonical_config(
        m, cl, tr, cfg.model_copy(update={"grouped_gemm": GroupedGemm.LEGACY}))
    assert run.unknown == []
    assert {"wandb_project", "lr"} <= set(run.ignored)
    # read, not ignored: the Turbo switch and the router dtype (null: the parameters' dtype)
    assert not {"enable_primus_turbo", "moe_router_dtype", "use_turbo_attention"} & set(
        run.ignored)
    assert run.defaults == [
        "moe_ffn_hidden_size: 16384 (Primus default: ffn_hidden_size)",
        "vocab_size: 32768 (tokenizer mistralai/Mixtral-8x22B-v0.1; the catalog model "
        "mixtral-8x22b)",
        "context_parallel_size: 1 (Primus default, language_model.yaml)",
        "expert_tensor_parallel_size: tensor_model_parallel_size (Primus default)",
        "use_distributed_optimizer: on (Primus default, pre_trainer.yaml)",
        "bf16: on (Primus default, trainer_base.yaml)",
    ]
    assert run.notes == [
        "Primus-Turbo MoE settings read: grouped_gemm legacy",
        "moe_router_force_load_balancing true: routing is forced balanced (a benchmark setting), "
        "as tune-cp's default moe_routing_imbalance=0 assumes; for real routing set --overhead "
        "moe_routing_imbalance=0.5",
    ]


def test_primus_placeholders_take_env_values():
    run = parse_primus_config(PRIMUS_EXPERIMENT, env={"PRIMUS_TP": "2", "PRIMUS_EP": "4"})
    assert (run.config.tp, run.config.ep) == (2, 4)
    assert run.config.sequence_parallel is True  # Primus's language_model.yaml default


def test_primus_without_model_file(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("modules:\n  pre_trainer:\n    framework: megatron\n    model: llama9.yaml\n"
                   "    overrides:\n      tensor_model_parallel_size: ${PRIMUS_TP:8}\n"
                   "      fancy_new_knob: 3\n")
    run = parse_primus_config(exp)
    assert run.model is None and run.config.tp == 8
    assert run.unknown == ["fancy_new_knob: 3"]
    assert run.notes == ["model file llama9.yaml (modules.pre_trainer.model) was not found next "
                         "to the experiment or in a models/ folder above it"]
    assert "micro_batch_size: 2 (Primus default, trainer_base.yaml)" in run.defaults
    assert (run.seq_len, run.global_batch_size) == (1024, 16)
    with pytest.raises(ConfigError, match=r"pass --model NAME"):
        run.require_model()
    with_model = parse_primus_config(exp, model=load_model("llama3-70b"))
    assert with_model.require_model().name == "llama3-70b"


def test_primus_zero_bubble_and_fp8(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("modules:\n  pre_trainer:\n    overrides:\n      pipeline_model_parallel_size:"
                   " 4\n      patch_zero_bubble: true\n      fp8: hybrid\n")
    run = parse_primus_config(exp, model=load_model("llama3-8b"))
    assert run.config.schedule is Schedule.ZERO_BUBBLE
    assert run.config.fp8_recipe is Fp8Recipe.DELAYED and run.precision is Precision.FP8
    assert "fp8_recipe: delayed (Primus default, trainer_base.yaml)" in run.defaults


@pytest.mark.parametrize(("text", "message"), [
    ("modules: [unclosed", "is not valid YAML: expected ',' or ']', but got '<stream end>' at "
     "line 1 column 19"),
    ("- a\n- b\n", "must hold a mapping of keys to values, got list"),
    ("modules:\n  post_trainer: {}\n", "has no modules.pre_trainer mapping; a Primus experiment "
     "names its trainer, model and overrides there"),
    ("modules:\n  pre_trainer:\n    framework: torchtitan\n",
     "framework 'torchtitan' is not supported; tune-cp reads Megatron-backend experiments "
     "(framework: megatron)"),
])
def test_bad_primus_files_are_one_line_errors(tmp_path, text, message):
    exp = tmp_path / "bad.yaml"
    exp.write_text(text)
    with pytest.raises(ConfigError) as e:
        parse_primus_config(exp)
    assert str(e.value).endswith(message) and "\n" not in str(e.value)
    assert str(exp) in str(e.value)


def test_primus_malformed_value_names_file_and_key(tmp_path):
    exp = tmp_path / "bad.yaml"
    exp.write_text("modules:\n  pre_trainer:\n    overrides:\n"
                   "      tensor_model_parallel_size: x\n")
    with pytest.raises(ConfigError) as e:
        parse_primus_config(exp)
    assert str(e.value) == ("bad.yaml: tensor_model_parallel_size 'x': not a whole number; give "
                            "an integer of at least 1")


def test_missing_primus_file():
    with pytest.raises(ConfigError) as e:
        parse_primus_config("/nonexistent/exp.yaml")
    assert str(e.value) == ("cannot read Primus experiment '/nonexistent/exp.yaml': No such file "
                            "or directory")


def test_interleaved_moe_layers_leave_the_model_unset():
    run = parse_megatron_args("--num-layers 4 --hidden-size 64 --num-attention-heads 4 "
                              "--vocab-size 1000 --num-experts 4 --moe-layer-freq 2 "
                              "--position-embedding-type rope --bf16")
    assert run.model is None
    assert run.model_missing == ("--moe-layer-freq 2 interleaves dense and MoE layers, which "
                                 "tune-cp does not model (only leading dense layers)")
    lead = parse_megatron_args("--num-layers 4 --hidden-size 64 --num-attention-heads 4 "
                               "--vocab-size 1000 --num-experts 4 --moe-layer-freq '[0]+[1]*3' "
                               "--position-embedding-type rope --bf16")
    assert lead.require_model().num_dense_layers == 1


def test_placeholder_without_default_is_left_unset(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("modules:\n  pre_trainer:\n    overrides:\n"
                   "      pipeline_model_parallel_size: ${MY_PP}\n")
    run = parse_primus_config(exp, model=load_model("llama3-8b"))
    assert run.config.pp == 1
    assert run.notes == ["modules.pre_trainer.overrides.pipeline_model_parallel_size: ${MY_PP} "
                         "has no default and no value was given; left unset"]
    assert parse_primus_config(exp, model=load_model("llama3-8b"),
                               env={"MY_PP": "4"}).config.pp == 4


def test_canonical_full_recompute_of_every_layer():
    m, cl, tr = setting("llama3-70b", "h100", 8, 8192, 128)
    uniform = canonical_config(m, cl, tr, ParallelConfig(tp=8, pp=4, vpp=2, recompute="full",
                                                         recompute_method="uniform"))
    assert uniform.recompute_layers == 1
    block = canonical_config(m, cl, tr, ParallelConfig(tp=8, pp=4, vpp=2, recompute="full"))
    assert block.recompute_layers == 10  # 80 layers / 8 virtual stages
    dense = canonical_config(m, cl, tr, ParallelConfig(tp=8, etp=1, dispatcher="flex"))
    assert dense.etp == 8 and dense.dispatcher is Dispatcher.ALLTOALL


def test_flags_held_in_shell_variables_are_read_where_defined():
    script = """
GPT_ARGS="--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 \\
    --max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 16 --bf16"
PARALLEL_ARGS='--tensor-model-parallel-size 2 --sequence-parallel'
torchrun --nproc_per_node 8 pretrain_gpt.py $GPT_ARGS $PARALLEL_ARGS --vocab-size 50257
"""
    run = parse_megatron_args(script)
    assert (run.config.tp, run.config.mbs, run.config.sequence_parallel) == (2, 4, True)
    assert (run.seq_len, run.global_batch_size, run.gpus_per_node) == (2048, 16, 8)
    assert run.require_model().num_layers == 24 and run.unknown == []


def test_gradient_dtype_flags():
    """Megatron-LM validate_args: under --bf16 the gradients are fp32 unless
    --grad-reduce-in-bf16, which wins over --accumulate-allreduce-grads-in-fp32; the export writes
    the flag only for bf16 gradients; Primus reads and writes grad_reduce_in_bf16; Megatron-Bridge
    gets the mixed-precision field (which MixedPrecisionConfig.setup copies into ddp)."""
    m, cl, tr = setting("llama3-70b", "h100", 8, 8192, 128)
    base = "--tensor-model-parallel-size 8 --bf16 --use-distributed-optimizer"
    assert parse_megatron_args(base, model=m).config.grad_reduce_in_fp32 is True
    assert parse_megatron_args(base + " --accumulate-allreduce-grads-in-fp32",
                               model=m).config.grad_reduce_in_fp32 is True
    run = parse_megatron_args(base + " --grad-reduce-in-bf16", model=m)
    assert run.config.grad_reduce_in_fp32 is False and run.notes == [] and run.unknown == []
    both = parse_megatron_args(base + " --grad-reduce-in-bf16 --accumulate-allreduce-grads-in-fp32",
                               model=m)
    assert both.config.grad_reduce_in_fp32 is False
    assert any("overrides" in n for n in both.notes)
    fp32 = ParallelConfig(tp=8, pp=2)
    bf16 = ParallelConfig(tp=8, pp=2, grad_reduce_in_fp32=False)
    assert "--grad-reduce-in-bf16" not in to_megatron_args(m, cl, tr, fp32)
    assert "--grad-reduce-in-bf16" in flag_lines(to_megatron_args(m, cl, tr, bf16))
    assert "grad_reduce_in_bf16" not in to_primus_overrides(m, cl, tr, fp32)
    assert "grad_reduce_in_bf16: true" in to_primus_overrides(m, cl, tr, bf16)
    nemo32, nemo16 = to_nemo_overrides(m, cl, tr, fp32), to_nemo_overrides(m, cl, tr, bf16)
    assert "grad_reduce_in_fp32" not in nemo32
    lines = nemo16.splitlines()
    assert "cfg.mixed_precision.grad_reduce_in_fp32 = False" in lines
    assert "cfg.ddp.grad_reduce_in_fp32 = False" in lines
    # after the bf16_mixed() assignment, which would otherwise reset it to True
    assert lines.index("cfg.mixed_precision.grad_reduce_in_fp32 = False") > \
        lines.index("cfg.mixed_precision = bf16_mixed()")


# ------------------------------------------------------------------ real launch files (issue 13)

MEGATRON_EXAMPLES = Path(__file__).parent / "data" / "megatron" / "examples"


def test_megatron_llama3_8b_fp8_example_script_as_shipped():
    """examples/llama/train_llama3_8b_h100_fp8.sh at d98e8a64dd: ${1:-default} positional
    defaults, arrays, `DTYPE_ARGS+=(...)` inside `if [[ "$DTYPE" == "fp8" ]]`, the MOCK branch
    of the data arguments (--vocab-size 128256)."""
    run = parse_megatron_args((MEGATRON_EXAMPLES / "train_llama3_8b_h100_fp8.sh").read_text())
    c = run.config
    assert (run.num_nodes, run.gpus_per_node) == (1, 8)
    assert (c.tp, c.pp, c.cp, c.mbs, c.sequence_parallel) == (1, 1, 1, 1, True)
    assert c.distributed_optimizer is True and c.grad_reduce_in_fp32 is False
    assert (run.precision, run.fp8_format) == (Precision.FP8, Fp8Format.HYBRID)
    assert (run.seq_len, run.global_batch_size) == (8192, 128)
    m = run.require_model()
    assert (m.num_layers, m.hidden_size, m.num_kv_heads, m.vocab_size) == (32, 4096, 8, 128256)
    assert "--tokenizer-type" not in " ".join(run.unknown)


def test_megatron_mixtral_example_script_with_env():
    """examples/mixtral/train_mixtral_8x7b_distributed.sh: NNODES=${SLURM_NNODES:-"1"} from
    --env; $2 (the tokenizer path) is not needed: Llama2Tokenizer gives 32000."""
    text = (MEGATRON_EXAMPLES / "train_mixtral_8x7b_distributed.sh").read_text()
    run = parse_megatron_args(text, env={"SLURM_NNODES": "4"})
    c = run.config
    assert (run.num_nodes, run.gpus_per_node) == (4, 8)
    assert (c.tp, c.pp, c.ep, c.mbs, c.sequence_parallel) == (1, 4, 8, 1, True)
    m = run.require_model()
    assert (m.num_experts, m.moe_top_k, m.vocab_size, m.num_layers) == (8, 2, 32000, 32)
    assert any(n.startswith("--tokenizer-model") and "not needed" in n for n in run.notes)
    assert parse_megatron_args(text).num_nodes == 1  # the script's default


def test_megatron_gpt3_example_script_vocab_from_bpe_files():
    """examples/gpt3/train_gpt3_175b_distributed.sh: --vocab-file/--merge-file without
    --tokenizer-type is GPT-2 BPE (50257)."""
    run = parse_megatron_args((MEGATRON_EXAMPLES / "train_gpt3_175b_distributed.sh").read_text())
    assert (run.config.tp, run.config.pp) == (8, 16)
    m = run.require_model()
    assert (m.num_layers, m.hidden_size, m.vocab_size, m.ffn_hidden_size) == (96, 12288, 50257,
                                                                              49152)
    assert (run.seq_len, run.global_batch_size) == (2048, 1536)


def test_unset_script_variable_names_the_env_option():
    with pytest.raises(ConfigError) as e:
        parse_megatron_args('L=${NUM_LAYERS}\ntorchrun pretrain_gpt.py --num-layers $L '
                            "--hidden-size 64 --num-attention-heads 4 --vocab-size 100 "
                            "--position-embedding-type rope")
    assert str(e.value) == ("--num-layers '${NUM_LAYERS}': the value is $NUM_LAYERS, which the "
                            "script takes from the environment; pass --env NUM_LAYERS=VALUE")
    run = parse_megatron_args('L=${NUM_LAYERS:-4}\ntorchrun pretrain_gpt.py --num-layers $L '
                              "--hidden-size 64 --num-attention-heads 4 --vocab-size 100 "
                              "--position-embedding-type rope", env={"NUM_LAYERS": "6"})
    assert run.require_model().num_layers == 6


def test_pasted_block_with_lost_newlines_reads_every_flag():
    """A backslash-continued block pasted as one line (the newlines lost) reads as the shell
    would have read it with them."""
    text = ("--num-layers 4 \\ --hidden-size 64 \\ --num-attention-heads 4 \\ "
            "--tensor-model-parallel-size 2 \\ --vocab-size 100 \\ --position-embedding-type rope")
    run = parse_megatron_args(text)
    assert run.config.tp == 2 and run.require_model().hidden_size == 64
    assert any("newline was lost" in n for n in run.notes)


@pytest.mark.parametrize(("tokenizer", "vocab"), [
    ("--tokenizer-type GPT2BPETokenizer", 50257),
    ("--tokenizer-type Llama2Tokenizer", 32000),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Llama-3.2-1B", 128256),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model /models/Qwen2.5-72B", 152064),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model Qwen/Qwen3-4B", 151936),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model deepseek-ai/DeepSeek-V2-Lite",
     102400),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model mistralai/Mixtral-8x7B-v0.1", 32000),
])
def test_tokenizer_vocabulary_sizes(tokenizer, vocab):
    """Published config.json vocab_size of each tokenizer's model (formats/data/
    tokenizers.json)."""
    run = parse_megatron_args(f"--num-layers 2 --hidden-size 64 --num-attention-heads 4 "
                              "--position-embedding-type rope "
                              f"{tokenizer}")
    assert run.require_model().vocab_size == vocab


ARCH_IGNORED_FIELDS = {"name", "family", "source", "default_seq_len", "default_global_batch_size"}


@pytest.mark.parametrize("name", list(model_entries()))
def test_exported_megatron_flags_define_the_catalog_model(name):
    """The exported flags, checked against the flag names of the current arguments.py (data/
    megatron_flags.json, generated from it), read back to the same ModelSpec field by field."""
    m = load_model(name)
    cluster = ClusterSpec(gpu=load_gpu("mi355x"), num_nodes=64, gpus_per_node=8)
    training = TrainingSpec(seq_len=m.default_seq_len, global_batch_size=m.default_global_batch_size)
    text = to_megatron_args(m, cluster, training, ParallelConfig(tp=8, ep=8 if m.is_moe else 1))
    assert "# not expressible" not in text
    flags = [w for line in text.splitlines() if not line.startswith("#")
             for w in line.split() if w.startswith("--")]
    known = megatron_flags()
    assert [f for f in flags if f not in known] == []
    run = parse_megatron_args(text)
    assert run.unknown == [] and run.unmodelled == ["--overlap-grad-reduce",
                                                    "--overlap-param-gather"]
    back = run.require_model()
    for field_name in type(m).model_fields:
        if field_name not in ARCH_IGNORED_FIELDS:
            assert getattr(back, field_name) == getattr(m, field_name), field_name


def test_mixtral_8x22b_export_keeps_its_rope_base():
    m = load_model("mixtral-8x22b")
    cluster = ClusterSpec(gpu=load_gpu("mi355x"), num_nodes=4, gpus_per_node=8)
    text = to_megatron_args(m, cluster, TrainingSpec(seq_len=8192, global_batch_size=512),
                            ParallelConfig(tp=2, pp=4, ep=8))
    assert "--rotary-base 1000000 \\" in text.splitlines()
    oss = to_megatron_args(load_model("gpt-oss-120b"), cluster,
                           TrainingSpec(seq_len=4096, global_batch_size=128),
                           ParallelConfig(tp=1, pp=4, ep=8))
    for line in ("--quick-geglu", "--window-size 127,0", "--window-attn-skip-freq 2",
                 "--softmax-type learnable", "--glu-linear-offset 1.0",
                 "--activation-func-clamp-value 7.0", "--position-embedding-type yarn"):
        assert line in [x.rstrip(" \\") for x in oss.splitlines()]
    assert "--swiglu \\" not in oss.splitlines()


HF_DIR = Path(__file__).parent / "data" / "hf"


def test_mistral_sliding_window_changes_the_long_sequence_projection():
    """mistralai/Mistral-7B-v0.1 config.json: sliding_window 4096 on every layer; at seq 32768
    attention sees at most 4097 keys, so the step is shorter than with full causal attention."""
    from tune_cp.oracle.projection import project

    cfg_json = json.loads((HF_DIR / "mistral-7b-v0.1.json").read_text())
    windowed = model_from_hf_config(cfg_json, name="mistral")
    full = model_from_hf_config(cfg_json | {"sliding_window": None}, name="mistral")
    assert (windowed.sliding_window, windowed.num_sliding_window_layers) == (4096, 32)
    assert (full.sliding_window, windowed.norm_epsilon, windowed.rotary_base) == (0, 1e-5, 1e4)
    cluster = ClusterSpec(gpu=load_gpu("mi355x"), num_nodes=1, gpus_per_node=8)
    training = TrainingSpec(seq_len=32768, global_batch_size=8)
    cfg = ParallelConfig(tp=8)
    step_w = project(windowed, cluster, training, resolve_config(cfg, windowed, cluster,
                                                                  training)).step_time_s
    step_f = project(full, cluster, training, resolve_config(cfg, full, cluster,
                                                              training)).step_time_s
    assert step_w < 0.9 * step_f


def test_hf_config_rope_router_and_unmodelled_keys():
    ds = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
          "num_hidden_layers": 61, "vocab_size": 129280, "intermediate_size": 18432,
          "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
          "n_shared_experts": 1, "first_k_dense_replace": 3, "topk_method": "noaux_tc",
          "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
          "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
          "scoring_func": "sigmoid", "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
          "rms_norm_eps": 1e-6, "rope_theta": 10000,
          "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096}}
    m = model_from_hf_config(ds, name="deepseek-v3")
    catalog = load_model("deepseek-v3")
    for f in ("router_score", "router_num_groups", "router_group_topk",
              "router_topk_scaling_factor", "rope_scaling", "rope_scaling_factor",
              "rope_original_max_position_embeddings", "norm_epsilon", "rotary_base"):
        assert getattr(m, f) == getattr(catalog, f), f
    with pytest.raises(ConfigError, match="final_logit_softcapping 30.0 changes the model"):
        model_from_hf_config(ds | {"final_logit_softcapping": 30.0})
    with pytest.raises(ConfigError, match="rope_scaling 'longrope'"):
        model_from_hf_config(ds | {"rope_scaling": {"rope_type": "longrope", "factor": 4}})


def test_check_states_its_defaults_and_reads_a_launch_script(run_cli):
    """`check` names the GPU it assumed; a Megatron-LM example script is checked from its path
    with the environment value it reads (--env), and gives the layout it launches."""
    script = str(MEGATRON_EXAMPLES / "train_mixtral_8x7b_distributed.sh")
    code, out, _ = run_cli("check", "--megatron-args", script, "--env", "SLURM_NNODES=4")
    assert "defaults: --gpu mi355x (default; pass --gpu for the GPU you run on)" in out
    assert "check: imported on 4 x 8 mi355x (32 GPUs), seq 4096, gbs 256" in out
    assert "config: TP1 PP4 VPP1 CP1 EP8 ETP1 DP8, mbs 1, ga 32" in out
    assert "warning: these change memory or time and are not modelled: " \
           "--no-masked-softmax-fusion; --overlap-param-gather; --overlap-grad-reduce" in out
    code, out, _ = run_cli("check", "--model", str(HF_DIR / "mistral-7b-v0.1.json"), "--nodes",
                           "1", "--gpu", "h100")
    assert "defaults: --gpus-per-node 8 (usual h100 node); --seq-len 8192 --gbs 256 (tune-cp's " \
           "default for a model file" in out
    code, _, err = run_cli("check", "--megatron-args", script, "--env", "=4")
    assert code == 2 and "--env '=4': write NAME=VALUE" in err


PRIMUS_EXAMPLES = (Path(__file__).parent / "data" / "primus_examples" / "examples" / "megatron"
                   / "configs" / "MI355X")


@pytest.mark.parametrize(("name", "layout"), [
    # name: (tp, pp, ep, recompute, recompute_layers) read from the experiment and its model YAML
    ("llama2_70B-BF16-pretrain", (1, 1, 1, "full", 80)),  # sequence_parallel: 1
    ("llama3.1_8B-FP8-pretrain", (1, 1, 1, "none", None)),
    ("llama3.1_70B-BF16-pretrain", (1, 1, 1, "full", 30)),
    ("qwen2.5_7B-BF16-pretrain", (1, 1, 1, "none", None)),
    ("qwen3_30B_A3B-BF16-pretrain", (1, 1, 8, "full", 5)),
    ("deepseek_v2_lite-BF16-pretrain", (1, 1, 8, "none", None)),
    # recompute_layer_ids; its layout "Et*1|t*1|t*2|...|t*1,L" is 32 virtual stages (vpp 2)
    # whose first holds layer 0 only, of which it recomputes 1
    ("deepseek_v3-BF16-pretrain", (1, 16, 8, "full", 1)),
    ("grok1-BF16-pretrain", (1, 4, 8, "full", 4)),  # block 8 > the 4 layers of a chunk
    ("mixtral_8x22B_v0.1-BF16-pretrain", (1, 4, 8, "full", 0)),
    ("gpt_oss_20B-BF16-pretrain", (1, 1, 8, "none", None)),
])
def test_primus_mi355x_examples_check(name, layout):
    """Primus fd1eeabbad MI355X examples (copies in tests/data/primus_examples, in Primus's
    layout, so the model YAML and its extends: chain are found)."""
    run = parse_primus_config(PRIMUS_EXAMPLES / f"{name}.yaml", env={})
    c = run.config
    m = run.require_model()
    assert (c.tp, c.pp, c.ep, c.recompute.value, c.recompute_layers) == layout
    if name.startswith("llama2_70B"):
        assert c.sequence_parallel is True  # written sequence_parallel: 1
    if name.startswith("deepseek_v3"):
        assert m.vocab_size == 129280 and m.mla is not None
        assert (c.vpp, c.pipeline_split) == (2, PipelineSplit.LAYOUT)
        assert c.pipeline_layout is not None and c.pipeline_layout.startswith("Et*1|t*1|t*2|")
    assert m.vocab_size > 1000


@pytest.mark.parametrize(("name", "reason"), [
    ("mamba_370M-pretrain", "does not model Primus Mamba model configs (model_type mamba"),
    ("zebra_llama_1B-pretrain", "does not model Primus Mamba model configs"),
    ("deepseek_v4_flash-BF16-pretrain", "does not model DeepSeek-V4 compressed sparse attention"),
    ("qwen3_5_35B_A3B-BF16-pretrain", "does not model linear-attention layers "
                                      "(experimental_attention_variant)"),
])
def test_primus_mi355x_examples_refused_with_the_reason(name, reason):
    with pytest.raises(ConfigError) as e:
        parse_primus_config(PRIMUS_EXAMPLES / f"{name}.yaml", env={})
    assert reason in str(e.value) and "\n" not in str(e.value)


def test_primus_interleaved_moe_example_names_what_is_not_modelled():
    run = parse_primus_config(PRIMUS_EXAMPLES / "llama4_17B128E-BF16-pretrain.yaml", env={})
    with pytest.raises(ConfigError, match="moe_layer_freq 2 interleaves dense and MoE layers"):
        run.require_model()


def test_primus_layout_that_is_the_embedding_loss_split(tmp_path):
    """Primus qwen3_235B_A22B MI355X: "Et*5|t*6|...|t*5,L" on pp 4 is the embedding_loss split
    with 4 virtual stages per rank (94 layers + embedding + loss = 16 x 6)."""
    layout = "Et*5|" + "t*6|" * 14 + "t*5,L"
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"modules": {"pre_trainer": {"framework": "megatron",
        "overrides": {"pipeline_model_parallel_size": 4, "expert_model_parallel_size": 8,
                      "pipeline_model_parallel_layout": layout}}}}))
    run = parse_primus_config(exp, model=load_model("qwen3-235b-a22b"), env={})
    assert (run.config.pp, run.config.vpp) == (4, 4)
    assert run.config.pipeline_split is PipelineSplit.EMBEDDING_LOSS
    assert not any("custom pipeline layouts are not modeled" in n for n in run.notes)
    other = yaml.safe_dump({"modules": {"pre_trainer": {"framework": "megatron", "overrides": {
        "pipeline_model_parallel_size": 4, "pipeline_model_parallel_layout":
            "Et*4|" + "t*6|" * 14 + "t*6,L"}}}})
    exp.write_text(other)
    run = parse_primus_config(exp, model=load_model("qwen3-235b-a22b"), env={})
    # another layout is the layout split itself (its stages: oracle.memory.pipeline_chunks)
    assert run.config.pipeline_split is PipelineSplit.LAYOUT
    assert run.config.pipeline_layout == "Et*4|" + "t*6|" * 14 + "t*6,L"
    assert run.config.vpp == 4


def test_fp4_is_exported_and_read_back_as_fp4():
    """Precision has one source (TrainingSpec.precision): the Megatron-LM export writes
    --fp4-format e2m1 --fp4-recipe nvfp4 (TransformerConfig.fp4 / fp4_recipe), reads back as
    FP4; Primus writes fp4 (trainer_base.yaml), Megatron-Bridge bf16_with_nvfp4_mixed()."""
    m = load_model("llama3-8b")
    cluster = ClusterSpec(gpu=load_gpu("b200"), num_nodes=1, gpus_per_node=8)
    training = TrainingSpec(seq_len=8192, global_batch_size=128, precision=Precision.FP4)
    cfg = ParallelConfig(tp=1)
    text = to_megatron_args(m, cluster, training, cfg)
    assert text.splitlines()[0].endswith("gbs 128, fp4 nvfp4")
    assert "--fp4-format e2m1 \\" in text.splitlines() and "--fp4-recipe nvfp4 \\" in \
        text.splitlines()
    assert parse_megatron_args(text).precision is Precision.FP4
    assert "      fp4: e2m1" in to_primus_overrides(m, cluster, training, cfg).splitlines()
    assert "cfg.mixed_precision = bf16_with_nvfp4_mixed()" in to_nemo_overrides(
        m, cluster, training, cfg)
    assert config_json(resolve_config(cfg, m, cluster, training), training)["precision"] == "fp4"


def test_primus_export_keys_are_primus_defaults_or_explained():
    from tune_cp.formats.export import primus_default_keys

    m, cl, tr, _ = amd_reference()
    text = to_primus_overrides(m, cl, tr, ParallelConfig(pp=4, ep=8, dispatcher=Dispatcher.FLEX,
                                                         recompute=Recompute.SELECTIVE))
    keys = [line.split(":")[0].strip() for line in text.splitlines() if line.startswith("      ")]
    extra = [k for k in keys if k not in primus_default_keys()]
    # Primus-Turbo DeepEP is the flex dispatcher on AMD: no moe_flex_dispatcher_backend
    assert extra == ["recompute_modules"]
    assert ("# recompute_modules: Megatron-LM arguments that are in "
            "none of Primus's YAML defaults") in text
    assert "      use_turbo_deepep: true" in text and "      moe_router_dtype: fp32" in text


@pytest.mark.parametrize("name", [n for n, e in model_entries().items() if not e.hybrid_pattern])
def test_exported_primus_overrides_define_the_catalog_model(name, tmp_path):
    """The Primus export carries the model (Primus keys override the model YAML): read back
    without --model it gives the same ModelSpec, and its keys are Primus defaults or named."""
    m = load_model(name)
    cluster = ClusterSpec(gpu=load_gpu("mi355x"), num_nodes=64, gpus_per_node=8)
    training = TrainingSpec(seq_len=m.default_seq_len, global_batch_size=m.default_global_batch_size)
    path = tmp_path / "exp.yaml"
    path.write_text(to_primus_overrides(m, cluster, training,
                                        ParallelConfig(tp=8, ep=8 if m.is_moe else 1)))
    run = parse_primus_config(path, env={})
    assert run.unknown == []
    back = run.require_model()
    for field_name in type(m).model_fields:
        if field_name not in ARCH_IGNORED_FIELDS:
            assert getattr(back, field_name) == getattr(m, field_name), field_name


def _numeric_strings(value, where=""):
    """Paths of the strings in a loaded YAML tree that Python reads as a number: a float that
    the YAML 1.1 loader took for a string (``1e-05``)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _numeric_strings(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _numeric_strings(v, f"{where}[{i}]")]
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return []
        return [f"{where}={value!r}"]
    return []


@pytest.mark.parametrize("value", [1e-05, 1e-06, 1.5e-05, 1e-12, 5e-324, 1e16, 1.0e20, 2.5e300,
                                   1e22, 0.0, -0.0, 1.0, -3.25, 0.1, 1000000.0, 123456789.125,
                                   1.7976931348623157e308, float("inf"), -float("inf")])
def test_yaml_float_reads_back_as_the_same_float(value):
    """PyYAML's SafeLoader (YAML 1.1, what Primus's yaml_loader.py uses) reads every spelling
    yaml_float writes as the same float: 1e-05 -> 1.0e-05, 1e+16 -> 1.0e+16."""
    from tune_cp.formats.export import yaml_float

    text = yaml_float(value)
    back = yaml.safe_load(f"x: {text}")["x"]
    assert type(back) is float and back == value, text
    assert yaml_float(1e-05) == "1.0e-05" and yaml_float(1e16) == "1.0e+16"
    assert yaml_float(0.5) == "0.5" and yaml_float(float("nan")) == ".nan"


@pytest.mark.parametrize("name", [n for n, e in model_entries().items() if not e.hybrid_pattern])
def test_primus_export_floats_load_as_floats(name):
    """Every float the Primus export writes (the model's norm epsilon, dropout, rope scaling,
    router and capacity factors, ...) loads under yaml.safe_load as that float, and no value
    loads as a string that reads as a number (Primus's loader would hand Megatron-LM the
    string '1e-05')."""
    from tune_cp.formats.export import (
        primus_model_overrides,
        primus_option_overrides,
        primus_overrides,
    )
    from tune_cp.oracle.memory import RunOptions

    m = load_model(name)
    cluster = ClusterSpec(gpu=load_gpu("mi355x"), num_nodes=64, gpus_per_node=8)
    training = TrainingSpec(seq_len=m.default_seq_len, global_batch_size=m.default_global_batch_size)
    cfg = ParallelConfig(tp=8, ep=8 if m.is_moe else 1)
    options = RunOptions(moe_capacity_factor=1.25) if m.is_moe else None
    text = to_primus_overrides(m, cluster, training, cfg, options=options)
    loaded = yaml.safe_load(text)["modules"]["pre_trainer"]["overrides"]
    assert _numeric_strings(loaded) == []
    c = canonical_config(m, cluster, training, cfg)
    written = (primus_overrides(m, training, c) + primus_option_overrides(m, options)
               + primus_model_overrides(m)[0])
    floats = {k: v for k, v in written if isinstance(v, float)}
    assert "norm_epsilon" in floats and (not m.is_moe or "moe_expert_capacity_factor" in floats)
    for key, value in floats.items():
        assert type(loaded[key]) is float and loaded[key] == value, (key, loaded[key])
    assert loaded["norm_epsilon"] == m.norm_epsilon


@pytest.mark.parametrize("name", list(model_entries()))
def test_exported_bridge_fields_are_provider_fields(name):
    """Every cfg.model field the Megatron-Bridge export writes is a field of GPTModelProvider or
    the Megatron-Core config it extends (data/bridge_model_fields.json), and the model block
    sets the rope base, norm epsilon, activation and router of the checked model."""
    from tune_cp.formats.export import bridge_model_fields

    m = load_model(name)
    cluster = ClusterSpec(gpu=load_gpu("h200"), num_nodes=64, gpus_per_node=8)
    training = TrainingSpec(seq_len=m.default_seq_len, global_batch_size=m.default_global_batch_size)
    text = to_nemo_overrides(m, cluster, training, ParallelConfig(tp=8, ep=8 if m.is_moe else 1))
    fields = {line.split(" = ")[0][len("cfg.model."):]: line.split(" = ", 1)[1]
              for line in text.splitlines() if line.startswith("cfg.model.")}
    assert [f for f in fields if f not in bridge_model_fields()] == []
    assert fields["layernorm_epsilon"] == repr(m.norm_epsilon)
    assert fields["num_layers"] == str(m.num_layers) and fields["vocab_size"] == str(m.vocab_size)
    if m.position_embedding.value == "rope":
        assert fields["rotary_base"] == str(int(m.rotary_base))
    if m.activation.value == "quick_geglu":
        assert fields["activation_func"] == "quick_gelu" and fields["window_size"] == "(127, 0)"
        assert fields["softmax_type"] == '"learnable"'


def test_gpt3_example_script_names_the_nodes_its_layout_needs(run_cli):
    """train_gpt3_175b_distributed.sh hard-codes NUM_NODES=1 ("Change for multinode config") with
    TP8 x PP16: check says how many nodes the layout needs; with them it is legal."""
    script = str(MEGATRON_EXAMPLES / "train_gpt3_175b_distributed.sh")
    code, out, _ = run_cli("check", "--megatron-args", script, "--gpu", "h100")
    assert code == 1 and "pass --nodes 16 (or a multiple)" in out
    code, out, _ = run_cli("check", "--megatron-args", script, "--gpu", "h100", "--nodes", "16")
    assert "config: TP8 PP16 VPP1 CP1 EP1 ETP8 DP1, mbs 1, ga 1536" in out
    assert "vocab_size: 50257 (tokenizer --vocab-file/--merge-file; GPT-2 BPE" in out


def test_primus_mxfp4_recipe_is_read_and_stated(tmp_path):
    """Primus llama3.1_8B-MXFP4-pretrain.yaml writes fp4: e2m1 with fp4_recipe: mxfp4 (AMD's
    MXFP4); tune-cp's fp4 is NVFP4, so it says it checks bf16 instead of failing on the value."""
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"modules": {"pre_trainer": {"framework": "megatron",
        "overrides": {"fp4": "e2m1", "fp4_recipe": "mxfp4"}}}}))
    run = parse_primus_config(exp, model=load_model("llama3-8b"), env={})
    assert run.precision is Precision.BF16
    assert any(n.startswith("fp4_recipe mxfp4: MXFP4 GEMMs are not modeled") for n in run.notes)
    assert parse_megatron_args("--fp4-format e2m1", model=load_model("llama3-8b")).precision \
        is Precision.FP4


def test_fp8_param_gather_is_read_and_exported():
    """``--fp8-param-gather`` under an FP8 recipe keeps the linear weights in FP8 only
    (memory.py drops their bf16 copy); the Megatron-LM export writes it back."""
    m = load_model("llama3-8b")
    run = parse_megatron_args("--bf16 --fp8-format hybrid --fp8-recipe tensorwise "
                              "--fp8-param-gather", model=m)
    assert run.config.fp8_param_gather is True
    from tune_cp.formats.export import to_megatron_args

    cl = ClusterSpec(gpu=load_gpu("h100"), num_nodes=1, gpus_per_node=8)
    text = to_megatron_args(m, cl, run.training_spec(m, cl), run.config)
    assert "--fp8-param-gather" in text
