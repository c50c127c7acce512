"""Hostile inputs for tune-cp, generated from a seed: malformed flags, files and expressions and
unwritable output paths (issue 16). ``tests/test_fuzz.py`` runs a few hundred in-process;
``benchmarks/fuzz.py`` runs a larger campaign in subprocesses with a time and memory limit.

Each :class:`Case` is a command line and the kind of input it attacks. The cases that break a
rule legitimately end in exit 1; bad input in exit 2 with one line; exit 0 is allowed for inputs
that happen to be valid (a random constraint that parses). Exit 3 (internal error), a traceback,
more than one line of error, or invalid JSON under ``--json`` is a defect.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

#: Cheap settings: a check or a search that fails before its work starts.
CHECK = ("check", "--model", "llama3-8b", "--gpu", "h100", "--nodes", "1")
SEARCH = ("--model", "llama3-8b", "--gpu", "h100", "--nodes", "1")
#: A plan of one node count (one enumeration per GPU) when its other flags are valid.
PLAN = ("plan", "--model", "llama3-8b", "--max-nodes", "1", "--points", "1")

BAD_NUMBERS = ("nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400", "-1", "0", "", " ",
               "１", "٤", "1_0", "+4", "0x10", "9" * 30, "9" * 5000, "abc", "1.5", "1e-400",
               "4\n4", "٣٢", "1e308", "-0", "²", "8 ", "ↈ")
INT_FLAGS = ("--tp", "--pp", "--vpp", "--cp", "--ep", "--etp", "--mbs", "--nodes", "--seq-len",
             "--gbs", "--gpus-per-node", "--recompute-layers")
FLOAT_FLAGS = ("--memory-margin",)
OVERHEADS = ("fragmentation", "runtime_context_bytes", "moe_routing_imbalance",
             "backward_working_set", "collective_buffer_bytes", "no_such_term")
EXPR_TOKENS = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "mbs", "ga", "(", ")", "+", "-", "*",
               "//", "**", "/", "%", "<=", "<", "==", "!=", ">=", "in", "not in", "{1, 2}",
               "{}", "and", "or", "not", "9" * 25, "0", "8", "\n", "lambda", "__import__",
               "x", "[1]", "'s'", "1.5", "True", ":", ",", "１", "ｔｐ")


#: A Hugging Face config.json of Mixtral 8x7B's shape, the start of the hostile model files.
MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000,
           "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2}


def _model_files() -> list[tuple[str, bytes]]:
    """(suffix, content) of hostile model/GPU/calibration/experiment files."""
    mixtral = MIXTRAL
    bomb, prev = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n', "a"
    for name in "bcdefghi":
        bomb += f"{name}: &{name} [" + ",".join(["*" + prev] * 9) + "]\n"
        prev = name
    out = [(".json", bytes(range(256)) * 4), (".json", b"[" * 100_000), (".yaml", b"[" * 5000),
           (".json", b"{" * 3000), (".json", b""), (".json", b"null"), (".json", b"[1, 2]"),
           (".json", b"3"), (".json", b'{"x": NaN}'), (".json", b'{"foo": 1}'),
           (".yaml", b"loop: &L [*L]\n"), (".yaml", bomb.encode()),
           (".yaml", b"num_layers: " + b"9" * 5000), (".yaml", b"num_layers: .inf"),
           (".yaml", b"\xff\xfe\x00\x00"), (".yaml", b"{{{{"), (".yaml", b"- - - -"),
           (".yaml", b"extends: 12\nnum_layers: 2\n")]
    for key, value in (("max_position_embeddings", "8k"), ("attention_dropout", "high"),
                       ("hidden_size", 16777216), ("num_hidden_layers", -1),
                       ("num_hidden_layers", 10**30), ("vocab_size", 1.5),
                       ("num_attention_heads", 0), ("intermediate_size", None),
                       ("num_local_experts", "eight"), ("hidden_size", True)):
        out.append((".json", json.dumps(mixtral | {key: value}).encode()))
    for key, value in (("hbm_gib", -1), ("hbm_gib", 0), ("peak_bf16_tflops", "fast"),
                       ("scale_up_domain_gpus", 10**30), ("hbm_gib", 1e308)):
        gpu = {"name": "g", "hbm_gib": 80, "peak_bf16_tflops": 900, "hbm_tb_per_s": 3,
               "scale_up_gb_per_s": 450, "scale_up_domain_gpus": 8, "nic_gb_per_s": 50}
        out.append((".json", json.dumps(gpu | {key: value}).encode()))
    for value in (-1, 0, 1e308, "x", None, [1]):
        out.append((".json", json.dumps({"defaults": {"gemm_efficiency_bf16": value}}).encode()))
    return out


#: A Hugging Face NemotronHForCausalLM config.json (a small hybrid: Mamba, attention, MLP and
#: MoE layers, MTP), the start of the hostile hybrid files (issue 14).
NEMOTRON_H = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
              "hybrid_override_pattern": "M-M*EMEM*-ME", "num_hidden_layers": 12,
              "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 4,
              "head_dim": 128, "intermediate_size": 8192, "mlp_hidden_act": "relu2",
              "ssm_state_size": 128, "mamba_num_heads": 64, "mamba_head_dim": 64,
              "n_groups": 8, "conv_kernel": 4, "chunk_size": 128, "vocab_size": 131072,
              "n_routed_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 1024,
              "moe_shared_expert_intermediate_size": 2048, "moe_latent_size": 512,
              "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 1,
              "tie_word_embeddings": False, "layer_norm_epsilon": 1e-5}
#: A DeepSeek-V3-shaped config.json (MLA), the start of the hostile MLA files.
DEEPSEEK = {"model_type": "deepseek_v3", "hidden_size": 2048, "num_attention_heads": 16,
            "num_hidden_layers": 8, "vocab_size": 129280, "intermediate_size": 8192,
            "n_routed_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 512,
            "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 512,
            "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "num_nextn_predict_layers": 1}
#: A GPU file (the catalog's entry format).
GPU = {"name": "g", "hbm_gib": 80, "peak_bf16_tflops": 900, "hbm_tb_per_s": 3,
       "scale_up_gb_per_s": 450, "scale_up_domain_gpus": 8, "nic_gb_per_s": 50}
#: Values put where a number belongs (JSON text: NaN and Infinity are written as literals).
HOSTILE_VALUES = ("NaN", "Infinity", "-Infinity", "1e999", "-1", "0", "0.5", '"8k"', '"abc"',
                  '"high"', "9" * 400, "null", "true", "[]", "{}", '"1"', "1e18", "-1e308",
                  "[1, 2]", '{"a": 1}', "2147483648", "18446744073709551616")


def _mutated_json(base: dict, rng: random.Random, drop: float = 0.2) -> bytes:
    """``base`` as JSON text with one or two values replaced by a ``HOSTILE_VALUES`` literal
    (written verbatim, so NaN/Infinity/huge integers reach the reader) or a key dropped."""
    data = dict(base)
    marks: dict[str, str] = {}
    for _ in range(rng.randint(1, 2)):
        key = rng.choice(sorted(data))
        if rng.random() < drop:
            data.pop(key, None)
            continue
        mark = f"@@{len(marks)}@@"
        data[key] = mark
        marks[json.dumps(mark)] = rng.choice(HOSTILE_VALUES)
    text = json.dumps(data)
    for mark, value in marks.items():
        text = text.replace(mark, value)
    return text.encode()


def _hybrid_file(rng: random.Random) -> bytes:
    """A hostile NemotronH config.json: a mutated value, a bad hybrid pattern, or Mamba heads
    that groups do not divide."""
    pick = rng.random()
    if pick < 0.6:
        return _mutated_json(NEMOTRON_H, rng)
    cfg = dict(NEMOTRON_H)
    if pick < 0.8:
        pattern = "".join(rng.choice("M*-E?x ") for _ in range(rng.choice((0, 1, 12, 13, 5000))))
        cfg["hybrid_override_pattern"] = pattern
        cfg["num_hidden_layers"] = rng.choice((len(pattern), 12))
    else:
        cfg["mamba_num_heads"] = rng.choice((63, 10, 1, 2**20))
        cfg["n_groups"] = rng.choice((8, 3, 2**21))
        cfg.pop(rng.choice(("n_groups", "mamba_num_heads", "ssm_state_size", "x")), None)
    return json.dumps(cfg).encode()


#: Megatron-LM argument fragments the "megatron args" cases are assembled from.
MEGATRON_TOKENS = ("--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size",
                   "--seq-length", "--max-position-embeddings", "--micro-batch-size",
                   "--global-batch-size", "--tensor-model-parallel-size",
                   "--pipeline-model-parallel-size", "--context-parallel-size",
                   "--expert-model-parallel-size", "--num-experts", "--moe-router-topk",
                   "--moe-layer-freq", "--hybrid-override-pattern", "--hybrid-layer-pattern",
                   "--mamba-num-heads", "--mamba-num-groups", "--vocab-size", "--bf16", "--fp8-format",
                   "--fp8-param-gather", "--recompute-granularity", "--recompute-num-layers",
                   "--num-layers-per-virtual-pipeline-stage", "--group-query-attention",
                   "--num-query-groups", "--multi-latent-attention", "--kv-lora-rank",
                   "--mtp-num-layers", "--swiglu", "--untie-embeddings-and-output-weights",
                   "--no-such-flag", "--decoder-first-pipeline-num-layers", "torchrun",
                   "--nnodes", "--nproc-per-node", "pretrain_gpt.py", "\\\n", "$X", "${Y:-8}",
                   "\"", "'", "`", "$(", ";", "|", "&&", "#", "=", "--", "-", "\n")


def _megatron_line(rng: random.Random) -> str:
    """A malformed Megatron-LM launch: flags with hostile or missing values, shell noise."""
    base = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 2048 "
            "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 "
            "--vocab-size 32000 --bf16")
    parts = [base] if rng.random() < 0.7 else []
    for _ in range(rng.randint(1, 8)):
        tok = rng.choice(MEGATRON_TOKENS)
        value = rng.choice((*BAD_NUMBERS[:20], "8", "2", "e4m3", "hybrid", "full", "M-*E",
                            "'[1]*4'", "'([0]*3+[1]*1)*1'", "''", "9" * 25, ""))
        parts.append(f"{tok} {value}" if rng.random() < 0.8 else tok)
    if rng.random() < 0.1:
        parts.append("--num-layers " * rng.randint(100, 3000))
    return " ".join(parts)


def _log_text(rng: random.Random, root: Path) -> bytes:
    """A hostile training log: one of the shipped logs (tests/data/logs) mutated (numbers
    replaced by hostile ones, lines cut, duplicated or shuffled), or garbage."""
    pick = rng.random()
    if pick < 0.1:
        return rng.choice((b"", bytes(range(256)) * 8, b"\n" * 10000,
                           b"iteration 1/ 2 |" * 5000, "ιteration ３/ ４ |".encode()))
    logs = sorted((root / "tests/data/logs").glob("*.log"))
    lines = rng.choice(logs).read_text().splitlines()
    for _ in range(rng.randint(1, 6)):
        if not lines:
            break
        i = rng.randrange(len(lines))
        nums = list(re.finditer(r"\d+(?:\.\d+)?", lines[i]))
        what = rng.random()
        if nums and what < 0.6:
            n = rng.choice(nums)
            bad = rng.choice(("nan", "inf", "0", "-1", "9" * 400, "1e999", "0.0", "", "abc",
                              "1" * 25, "00000"))
            lines[i] = lines[i][:n.start()] + bad + lines[i][n.end():]
        elif what < 0.75:
            lines.pop(i)
        elif what < 0.9:
            lines[i:i] = [lines[i]] * rng.randint(1, 50)
        else:
            rng.shuffle(lines)
    return ("\n".join(lines) + "\n").encode()


def _runs_csv(rng: random.Random, root: Path) -> bytes:
    """A runs CSV: the header and a few rows of benchmarks/published_runs.csv with cells
    replaced by hostile values (NaN, inf, strings, huge numbers), or a broken header."""
    import csv
    import io

    rows = list(csv.reader(io.StringIO((root / "benchmarks/published_runs.csv").read_text())))
    head, body = rows[0], rng.sample(rows[1:], k=min(4, len(rows) - 1))
    numeric = [i for i, c in enumerate(head) if c in (
        "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads",
        "vocab_size", "num_experts", "moe_topk", "num_gpus", "gpus_per_node", "seq_len",
        "global_batch_size", "micro_batch_size", "tp", "pp", "vpp", "cp", "ep", "etp", "dp",
        "tokens_per_sec_per_gpu", "model_tflops_per_gpu", "mfu_pct", "step_time_s", "peak_mem")]
    for row in body:
        for _ in range(rng.randint(1, 3)):
            i = rng.choice(numeric)
            if i < len(row):
                row[i] = rng.choice(("nan", "inf", "-inf", "Infinity", "1e999", "-1", "0", "abc",
                                     "9" * 400, "1e18", "", "1,5", "0x10", "NaN"))
    if rng.random() < 0.1:
        head = head[:rng.randrange(len(head))]
    out = io.StringIO()
    csv.writer(out).writerows([head, *body])
    return out.getvalue().encode()


def _grid_yaml(rng: random.Random) -> str:
    """A hostile sweep grid (one field replaced), most failing before any search runs."""
    fields = {"name": "g", "models": "[llama3-8b]", "gpus": "[h100]", "nodes": "[1]",
              "seq_len": "4096", "global_batch": "128", "precision": "bf16", "tokens": "1.0e12",
              "price_per_gpu_hour": "{h100: 2.5}", "constraints": '["cp == 1", "pp == 1"]'}
    key = rng.choice([*sorted(fields), "nosuch"])
    fields[key] = rng.choice(("nan", ".inf", "-1", "0", "[]", "{}", "'8k'", "9" * 400, "~",
                              "[" * 300 + "]" * 300, "[nan]", "[.inf]", "[1048577]",
                              "[llama3-8b, /dev/zero]", "[/nonexistent.json]", "{a: 1}",
                              "['tp ** 99999']", "[h100, h100]", "fp16", "&a [*a]"))
    return "\n".join(f"{k}: {v}" for k, v in fields.items()) + "\n"


# ------------------------------------------------------- the data-input classes of issue 29

#: A tune-cp model file (the ModelSpec fields), the start of the "extreme shape" cases.
MODEL_FILE = {"name": "m", "num_layers": 8, "hidden_size": 1024, "ffn_hidden_size": 4096,
              "num_attention_heads": 8, "num_kv_heads": 8, "head_dim": 128, "vocab_size": 32000}
#: The documented maximum of each dimension (config/specs.py: MAX_DIM, MAX_LAYERS, the vocab's
#: 2**28) and values around the arithmetic bound (oracle/memory.py::MAX_FIGURE_BYTES).
SHAPE_EXTREMES = (("num_layers", (1, 256, 512)),
                  ("hidden_size", (2**18, 2**19, 2**20, 2**24)),
                  ("ffn_hidden_size", (2**19, 2**24)),
                  ("num_attention_heads", (1, 2**12, 2**24)),
                  ("head_dim", (128, 2**16, 2**24)),
                  ("vocab_size", (2**20, 2**28)))
#: MLA ranks of the "extreme shape" cases (DEEPSEEK's).
MLA_EXTREMES = (("kv_lora_rank", (512, 2**20, 2**24)), ("q_lora_rank", (0, 2**20, 2**24)),
                ("qk_nope_head_dim", (128, 2**16, 2**23)), ("v_head_dim", (128, 2**20, 2**24)),
                ("moe_intermediate_size", (512, 2**22, 2**24)))


def _extreme_shape(rng: random.Random, tmp: Path) -> tuple[str, ...]:
    """A search, check or plan of a well-typed model at or near the documented maxima: a
    model file with every dimension extreme, or a DeepSeek config.json with huge MLA ranks."""
    if rng.random() < 0.5:
        m = dict(MODEL_FILE)
        for key, values in SHAPE_EXTREMES:
            if rng.random() < 0.7:
                m[key] = rng.choice(values)
        m["num_kv_heads"] = m["num_attention_heads"]
    else:
        m = dict(DEEPSEEK)
        for key, values in MLA_EXTREMES:
            if rng.random() < 0.6:
                m[key] = rng.choice(values)
    p = tmp / f"shape{rng.randrange(10**9)}.json"
    p.write_text(json.dumps(m))
    cmd = rng.choice((("check",), (), ("plan", "--max-nodes", "2", "--points", "1")))
    nodes = () if cmd and cmd[0] == "plan" else ("--nodes", rng.choice(("1", "2")))
    return (*cmd, "--model", str(p), "--gpu", rng.choice(("h100", "mi355x")), *nodes,
            *rng.choice(((), ("--seq-len", "131072"), ("--seq-len", "1048576"))))


#: Rates and sizes of the "gpu quantity" cases: tiny positive, denormal, huge, near the bounds.
GPU_EXTREMES = (1e-300, 5e-324, 1e-9, 0.001, 0.009, 0.01, 0.099, 0.1, 0.99, 1.0, 1e5, 1e6,
                1.1e6, 1e300, 2**20, 2**20 + 1)
GPU_QUANTITIES = ("hbm_gib", "peak_bf16_tflops", "peak_fp8_tflops", "peak_fp4_tflops",
                  "hbm_tb_per_s", "sfu_exp_tera_per_s", "scale_up_gb_per_s", "nic_gb_per_s",
                  "tdp_w")


def _gpu_quantity(rng: random.Random, tmp: Path) -> tuple[str, ...]:
    """A check on a GPU file with one to all physical quantities tiny, denormal or huge (or a
    calibration file with an efficiency so): the time model divides by each."""
    if rng.random() < 0.2:
        key = rng.choice(("gemm_efficiency_bf16", "grouped_gemm_efficiency", "hbm_efficiency",
                          "nic_efficiency", "attention_efficiency"))
        p = tmp / f"eff{rng.randrange(10**9)}.json"
        p.write_text(json.dumps({"defaults": {key: rng.choice(GPU_EXTREMES[:6])}}))
        return ("check", "--model", "mixtral-8x7b", "--gpu", "h100", "--nodes", "1",
                "--calibration", str(p))
    g = dict(GPU, peak_fp8_tflops=1800, sfu_exp_tera_per_s=4, tdp_w=700)
    keys = GPU_QUANTITIES if rng.random() < 0.3 else rng.sample(GPU_QUANTITIES, 2)
    for key in keys:
        g[key] = rng.choice(GPU_EXTREMES)
    if rng.random() < 0.3:  # power fields against the reference part (oracle/compute.py)
        g |= {"architecture": rng.choice(("hopper", "blackwell", "cdna3")),
              "compute_units": rng.choice((1, 132, 304, 2**20)),
              "tdp_w": rng.choice((10, 700, 1e5))}
    p = tmp / f"gq{rng.randrange(10**9)}.json"
    p.write_text(json.dumps(g))
    return ("check", "--model", rng.choice(("llama3-8b", "mixtral-8x7b")), "--gpu", str(p),
            "--nodes", "1", *rng.choice(((), ("--precision", "fp8"), ("--json",))))


#: config.json values of the "hf types" cases: the wrong type, 0, or out of range.
HF_TYPE_VALUES = {
    "rope_theta": ("big", "500000", 0, -1, True, [1], None, 1e-300),
    "rms_norm_eps": ("tiny", "1e-5", 0, 1, 2.5, False, {}),
    "rope_scaling": ("llama3", [1], 3, {"rope_type": "llama3", "factor": "x"},
                     {"rope_type": "yarn", "factor": 0.5}, {"rope_type": 7},
                     {"rope_type": "llama3", "original_max_position_embeddings": "8k"},
                     {"rope_type": "dynamic", "factor": 2.0}, None),
    "num_key_value_heads": (0, -8, "8", 8.0, True, 3),
    "head_dim": ("128", 0, 128.5, -1),
    "tie_word_embeddings": ("yes", 1, "false"),
    "intermediate_size": ("14336", 1.5, True),
    "sliding_window": ("4096", 4096.0, True),
    "attention_dropout": ("0.1", 1, 2.0, True),
}
HF_DEEPSEEK_VALUES = {
    "scoring_func": ("relu", "tanh", 3, "", "SIGMOID", "sigmoid", "softmax"),
    "n_group": (0, 1, 3, 8, "8", 2.0), "topk_group": (0, 4, 9, "4"),
    "routed_scaling_factor": (0, -1, "2.5", True, 2.5),
    "n_shared_experts": ("1", 1.0), "q_lora_rank": ("1536", None),
}


def _hf_types(rng: random.Random, tmp: Path) -> tuple[str, ...]:
    """A check of a config.json (Mixtral or DeepSeek-V3 shaped) with one or two values of the
    wrong type, 0 where 0 is not the default, or an unknown router score function."""
    if rng.random() < 0.5:
        cfg, table = dict(MIXTRAL), HF_TYPE_VALUES
    else:
        cfg, table = dict(DEEPSEEK), HF_TYPE_VALUES | HF_DEEPSEEK_VALUES
    for _ in range(rng.randint(1, 2)):
        key = rng.choice(sorted(table))
        cfg[key] = rng.choice(table[key])
    p = tmp / f"hft{rng.randrange(10**9)}.json"
    p.write_text(json.dumps(cfg))
    return ("check", "--model", str(p), "--gpu", "h100", "--nodes", "1",
            *rng.choice(((), ("--json",))))


#: Spellings a number must not have in a file (quoted, a boolean, YAML 1.1's, a float where
#: an integer belongs), and duplicated keys.
QUOTED_VALUES = ("'8'", '"8"', "'NaN'", '"nan"', "true", "false", "1_000", "0x10", "0o17",
                 "1:30", "8.0", "'1e3'", "yes", "~", "2024-01-01", "!!binary aGk=", "[8]",
                 "{a: 8}")


def _quoted_number(rng: random.Random, tmp: Path) -> tuple[str, ...]:
    """A model or GPU file (YAML or JSON), or a Primus experiment, where one number is written
    as a string, a boolean, a YAML 1.1 spelling or a date, or where a key is given twice."""
    kind = rng.choice(("model", "gpu", "primus"))
    if kind == "primus":
        key = rng.choice(("tensor_model_parallel_size", "micro_batch_size", "seq_length",
                          "norm_epsilon", "global_batch_size"))
        value = rng.choice(QUOTED_VALUES)
        twice = f"      {key}: 1\n" if rng.random() < 0.3 else ""
        p = tmp / f"qp{rng.randrange(10**9)}.yaml"
        p.write_text(f"modules:\n  pre_trainer:\n    overrides:\n{twice}      {key}: {value}\n")
        return ("check", "--primus-config", str(p), "--model", "llama3-8b", "--gpu", "h100",
                "--nodes", "1")
    base = MODEL_FILE if kind == "model" else GPU
    key = rng.choice(sorted(k for k in base if k != "name"))
    value = rng.choice(QUOTED_VALUES)
    lines = [f"{k}: {value if k == key else json.dumps(v)}" for k, v in base.items()]
    if rng.random() < 0.3:  # a key twice (the second value legal)
        lines.append(f"{key}: {json.dumps(base[key])}")
    if rng.random() < 0.5:
        p = tmp / f"q{rng.randrange(10**9)}.yaml"
        p.write_text("\n".join(lines) + "\n")
    else:  # JSON: YAML spellings become JSON strings, literals stay
        text = "{" + ", ".join(f'"{ln.split(": ", 1)[0]}": ' + _as_json(ln.split(": ", 1)[1])
                               for ln in lines) + "}"
        p = tmp / f"q{rng.randrange(10**9)}.json"
        p.write_text(text)
    flag = "--model" if kind == "model" else "--gpu"
    other = ("--gpu", "h100") if kind == "model" else ("--model", "llama3-8b")
    return ("check", flag, str(p), *other, "--nodes", "1", *rng.choice(((), ("--json",))))


def _as_json(value: str) -> str:
    """A YAML scalar of :data:`QUOTED_VALUES` as JSON text (a JSON literal stays itself)."""
    try:
        json.loads(value)
        return value
    except ValueError:
        return json.dumps(value.strip("'\""))


def _calibration_shape(rng: random.Random, tmp: Path, root: Path) -> tuple[str, ...]:
    """The shipped calibration file with its header (``fitted_on``) or constants of the wrong
    shape: a list, string or number for a mapping, a ceiling without ``mfu`` or with strings,
    unhashable GPU names, residuals as strings or nested lists; used by check or plan."""
    data = json.loads((root / "oracle/catalog/calibration.json").read_text())
    fo = data["fitted_on"]
    pick = rng.randrange(10)
    if pick == 0:
        data["fitted_on"] = rng.choice(([1], "x", 3, True, []))
    elif pick == 1:
        ceiling = fo["mfu_ceilings"][rng.choice(sorted(fo["mfu_ceilings"]))]
        key = rng.choice(("mfu", "row", "model", "gpu"))
        if rng.random() < 0.5:
            ceiling.pop(key)
        else:
            ceiling[key] = rng.choice(("high", None, [1], 2.0, -0.1, {"a": 1}))
    elif pick == 2:
        fo["mfu_ceilings"] = rng.choice(([1], "x", 3, {"dense/hopper/bf16": 0.5}))
    elif pick == 3:
        fo[rng.choice(("gpus_fitted", "architectures_fitted"))] = rng.choice(
            ([[1]], [{}], "h100", {"a": 1}, [1, 2], None))
    elif pick == 4:
        fo["gpus_by_architecture"] = rng.choice(({"hopper": "h100"}, [1], {"hopper": [[1]]}))
    elif pick == 5:
        fo["user_residuals"] = rng.choice((["x"] * 10, [[0.1]] * 10, "abc", [True] * 10,
                                           {"a": 1}, [0.1] * 3 + ["y"]))
    elif pick == 6:
        data[rng.choice(("defaults", "architectures", "software"))] = rng.choice(
            ([1], "x", {"hopper": "fast"}, {"gemm_efficiency_bf16": [1]}))
    elif pick == 7:
        data["_about"] = rng.choice(([1], 3, {"a": 1}))
    elif pick == 8:
        fo[rng.choice(("rows", "tokens_per_s_mape", "date"))] = rng.choice(([[1]], "x", {}))
    else:
        data["constants"] = rng.choice(([1], {"x": 3}, "x"))
    p = tmp / f"cal{rng.randrange(10**9)}.json"
    p.write_text(json.dumps(data))
    cmd = rng.choice((("check", "--nodes", "1"), ("plan", "--max-nodes", "1", "--points", "1")))
    return (*cmd, "--model", "llama3-8b", "--gpu", "h100", "--calibration", str(p))


#: TOML values of the "titan toml" cases.
TITAN_VALUES = ("0", "-1", "-2", "nan", "inf", "-inf", "1979-05-27T07:32:00Z", "07:32:00",
                "1979-05-27", '"2"', "true", "[1, 2]", "{ a = 1 }", "1.5", "9" * 25, "2",
                '"full"', '"sometimes"')


def _titan_toml(rng: random.Random, tmp: Path, root: Path) -> tuple[str, ...]:
    """``calibrate --log`` of a torchtitan log with its job TOML mutated: a value of the wrong
    type, 0, nan/inf, a date, deep nesting, a table that is a number."""
    lines = (root / "tests/data/logs/torchtitan_llama3_8b_fsdp8.toml").read_text().splitlines()
    pick = rng.random()
    if pick < 0.15:
        depth = rng.choice((60, 500, 5000))
        lines.append("deep = " + "[" * depth + "]" * depth)
    elif pick < 0.25:
        lines = [ln for ln in lines if not ln.startswith("[parallelism]")]
        lines.insert(0, f"parallelism = {rng.choice(TITAN_VALUES)}")
    else:
        slots = [i for i, ln in enumerate(lines) if " = " in ln and not ln.startswith("#")]
        for i in rng.sample(slots, k=min(len(slots), rng.randint(1, 2))):
            key = lines[i].split(" = ", 1)[0]
            if key == "mode":
                value = rng.choice(('"full"', '"none"', '"sometimes"', "1"))
            else:
                value = rng.choice(TITAN_VALUES)
            lines[i] = f"{key} = {value}"
    p = tmp / f"titan{rng.randrange(10**9)}.toml"
    p.write_text("\n".join(lines) + "\n")
    return ("calibrate", "--log", str(root / "tests/data/logs/torchtitan_issue1287.log"),
            "--gpu", "h100", "--model", "llama3-8b", "--nodes", "1", "--config", str(p))


@dataclass(frozen=True)
class Case:
    """A command line and the kind of input it attacks; ``stdout`` is where its output goes
    (``pipe``: captured; ``full``: ``/dev/full``; ``closed``: a pipe closed before the first
    line; ``fd-closed``: descriptor 1 closed at the start, ``tune-cp >&-``) and ``interrupt_s`` when Ctrl-C (SIGINT) is sent, for the kinds that attack streams
    and processes (``benchmarks/fuzz.py`` runs those in a process each)."""

    kind: str
    args: tuple[str, ...]
    stdout: str = "pipe"
    interrupt_s: float | None = None

    def line(self) -> str:
        shown = " ".join(a if len(a) < 40 else a[:37] + "..." for a in self.args)
        return shown.replace("\n", "\\n")


#: Primus experiment YAMLs the "primus mutation" cases start from (tests/data).
PRIMUS_EXAMPLES = ("tests/data/primus/examples/MI355X/mixtral_8x22B_v0.1-BF16-4node.yaml",)
#: (key, values) a "model search" case sets in a Mixtral config.json: legal-looking extremes
#: that make the search's model large, odd or beyond 64-bit arithmetic (issue 14).
MODEL_EXTREMES = (("hidden_size", (1, 3, 2**20, 2**31, 10**12)),
                  ("num_hidden_layers", (1, 3, 1000, 100_000)),
                  ("vocab_size", (1, 2**28, 2**40)),
                  ("intermediate_size", (1, 2**30)),
                  ("num_local_experts", (1, 3, 1024, 10**6)),
                  ("num_experts_per_tok", (1, 8, 1000)),
                  ("num_attention_heads", (1, 3, 4096)),
                  ("num_key_value_heads", (1, 3, 32)),
                  ("max_position_embeddings", (1, 2**40)))
#: --gpus-per-node / --nodes values of the "cluster size" cases.
CLUSTER_SIZES = ("1", "3", "7", "1000", "65536", "1048576", "1048577", "9" * 19, "9" * 30)


def _primus_mutants(tmp: Path, rng: random.Random, root: Path) -> str:
    """A copy of a Primus experiment of ``PRIMUS_EXAMPLES`` with the model YAMLs it extends
    (``tests/data/primus/models/megatron``) in a fresh folder under ``tmp``, one value of one of
    these files replaced by a hostile one (a bad number, a huge integer, a string, a deep list,
    nested environment defaults); returns the experiment's path."""
    folder = tmp / f"primus{rng.randrange(10**9)}"
    models = folder / "models" / "megatron"
    models.mkdir(parents=True, exist_ok=True)
    exp = folder / "experiment.yaml"
    exp.write_text((root / rng.choice(PRIMUS_EXAMPLES)).read_text())
    for src in sorted((root / "tests/data/primus/models/megatron").glob("*.yaml")):
        (models / src.name).write_text(src.read_text())
    target = rng.choice([exp, *sorted(models.glob("*.yaml"))])
    lines = target.read_text().splitlines()
    slots = [i for i, line in enumerate(lines) if re.match(r"^\s*\w+: \S", line)]
    if slots:
        i = rng.choice(slots)
        indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
        key = lines[i].split(":", 1)[0].strip()
        value = rng.choice((*BAD_NUMBERS[:20], "9" * 400, "[" * 200 + "1" + "]" * 200,
                            "{a: 1}", "${PRIMUS_TP:abc}", "${X:${Y:${Z:1}}}", "~", "'8k'", "-2",
                            "1e9", "1048576", "100000", "0.5", "true", "[1, 2]"))
        lines[i] = f"{indent}{key}: {value}"
    target.write_text("\n".join(lines) + "\n")
    return str(exp)


def cases(seed: int, n: int, tmp: Path, heavy: bool = False) -> list[Case]:
    """``n`` cases from ``seed``; files are written under ``tmp``. ``heavy`` adds the kinds
    whose runs do real work (searches of extreme models and clusters, mutated Primus YAMLs):
    the campaign of ``benchmarks/fuzz.py`` uses them, the bounded test in the suite does not."""
    rng = random.Random(seed)
    root = Path(__file__).resolve().parent.parent
    files = _model_files()
    paths = []
    for i, (suffix, content) in enumerate(files):
        p = tmp / f"f{i}{suffix}"
        p.write_bytes(content)
        paths.append(str(p))
    fifo = tmp / "fifo.json"
    if not fifo.exists():
        os.mkfifo(fifo)
    (tmp / "dir.png").mkdir(exist_ok=True)
    specials = ["/dev/zero", "/dev/urandom", str(fifo), str(tmp), "x" * 300, "x" * 300 + ".json",
                "/nonexistent/config.json", "", "/etc/shadow", "/proc/self/mem"]
    out_paths = ["out.txt", "p.json", "/etc/passwd/x.png", "/proc/version", "/dev/full",
                 "nodir/x.png", "x" * 300 + ".png", "", str(tmp / "dir.png"), str(fifo),
                 "/sys/x.png", ".png", "/", *IO_OUT_PATHS]
    out: list[Case] = []
    for _ in range(n):
        kind = rng.choice(LIGHT + (HEAVY if heavy else ()))
        js = ("--json",) if rng.random() < 0.5 else ()
        bad = rng.choice(BAD_NUMBERS)
        if kind == "int flag":
            args = (*CHECK, rng.choice(INT_FLAGS), bad, *js)
        elif kind == "float flag":
            args = (*CHECK, rng.choice(FLOAT_FLAGS), bad, *js)
        elif kind == "overhead":
            args = (*CHECK, "--overhead", f"{rng.choice(OVERHEADS)}={bad}", *js)
        elif kind in ("model file", "gpu file", "calibration file", "primus file"):
            target = rng.choice(paths + specials)
            flag = {"model file": "--model", "gpu file": "--gpu",
                    "calibration file": "--calibration", "primus file": "--primus-config"}[kind]
            base = dict(zip(CHECK[1::2], CHECK[2::2], strict=True))
            base[flag] = target
            args = ("check", *[x for kv in base.items() for x in kv], *js)
        elif kind in ("constraint", "prefer"):
            expr = " ".join(rng.choice(EXPR_TOKENS) for _ in range(rng.randint(1, 12)))
            if rng.random() < 0.2:
                expr = rng.choice(("-", "not ", "tp + ", "(")) * rng.randint(100, 3000) + "tp"
            if kind == "constraint":
                args = (*CHECK, "--constraint", expr, *js)
            else:  # --prefer needs a search: make it fail first on an output path
                args = (*SEARCH, "--prefer", f"{expr}:{rng.choice(BAD_NUMBERS)}", "--pareto",
                        "out.txt", *js)
        elif kind == "output path":
            args = _output_path_case(rng, rng.choice(out_paths), js)
        elif kind == "baseline":
            key = rng.choice(("tp", "pp", "vpp", "mbs", "recompute", "nosuch", ""))
            args = (*SEARCH, "--baseline", f"{key}={bad}", "--trials-out", "/dev/full", *js)
        elif kind == "price":
            args = ("plan", "--model", "llama3-8b", "--gpu", rng.choice(("h100", "x" * 300)),
                    "--price-per-gpu-hour", rng.choice((bad, f"h100={bad}")), "--plot",
                    rng.choice(out_paths), *js)
        elif kind == "model search":
            mixtral = dict(MIXTRAL)
            for _ in range(rng.randint(1, 2)):
                key, values = rng.choice(MODEL_EXTREMES)
                mixtral[key] = rng.choice(values)
            p = tmp / f"model{rng.randrange(10**9)}.json"
            p.write_text(json.dumps(mixtral))
            args = ("--model", str(p), "--gpu", rng.choice(("mi355x", "h100")), "--nodes",
                    rng.choice(("1", "4")), *js)
        elif kind == "cluster size":
            flag = rng.choice(("--gpus-per-node", "--nodes"))
            rest = ("--gpus-per-node", "8") if flag == "--nodes" else ("--nodes", "1")
            cmd = rng.choice((("--model", "llama3-8b"), ("check", "--model", "llama3-8b"),
                              ("plan", "--model", "llama3-8b", "--points", "2")))
            if cmd[0] == "plan":
                rest = ()  # plan chooses its node counts
                flag = "--gpus-per-node"
            args = (*cmd, "--gpu", "h100", flag, rng.choice(CLUSTER_SIZES), *rest, *js)
        elif kind == "primus mutation":
            args = ("check", "--primus-config", _primus_mutants(tmp, rng, root), "--gpu",
                    "mi355x", "--nodes", rng.choice(("4", "1")), *js)
        elif kind == "runs file":
            args = ("calibrate", "--runs", rng.choice(paths + specials), "--out",
                    rng.choice(out_paths + ["ok.json"]), *js)
        elif kind in ("hybrid file", "mla file", "number file"):
            if kind == "hybrid file":
                content = _hybrid_file(rng)
            elif kind == "mla file":
                content = _mutated_json(DEEPSEEK, rng, drop=0.5)
            else:
                content = _mutated_json(rng.choice((MIXTRAL, GPU)), rng)
            p = tmp / f"{kind[:3]}{rng.randrange(10**9)}.json"
            p.write_bytes(content)
            flag = "--gpu" if b'"hbm_gib"' in content or b"peak_bf16" in content else "--model"
            other = ("--model", "llama3-8b") if flag == "--gpu" else ("--gpu", "h100")
            args = ("check", flag, str(p), *other, "--nodes", rng.choice(("1", "2")), *js)
        elif kind == "megatron args":
            line = _megatron_line(rng)
            if rng.random() < 0.3:
                p = tmp / f"launch{rng.randrange(10**9)}.sh"
                p.write_text("#!/bin/bash\nARGS=(\n" + line.replace(" --", "\n  --") + "\n)\n"
                             "torchrun pretrain_gpt.py ${ARGS[@]}\n")
                line = str(p)
            args = ("check", "--megatron-args", line, "--gpu", "h100",
                    *rng.choice(((), ("--nodes", "1"), ("--nodes", "2"))),
                    *rng.choice(((), ("--model", "llama3-8b"), ("--tp", "3"))), *js)
        elif kind == "log":
            p = tmp / f"run{rng.randrange(10**9)}.log"
            p.write_bytes(_log_text(rng, root))
            extra = rng.choice(((), ("--model", "mixtral-8x7b"), ("--model", "llama3-8b"),
                                ("--config", str(root / "tests/data/logs/"
                                                 "torchtitan_llama3_8b_fsdp8.toml")),
                                ("--config", rng.choice(paths + specials)),
                                ("--nodes", rng.choice(("1", "2", "0", "nan")))))
            args = ("calibrate", "--log", str(p), "--gpu", rng.choice(("h100", "mi300x", "nan")),
                    *extra, *rng.choice(((), ("--out", rng.choice(out_paths + ["ok.json"])))),
                    *js)
        elif kind == "runs csv":
            p = tmp / f"runs{rng.randrange(10**9)}.csv"
            p.write_bytes(_runs_csv(rng, root))
            args = ("calibrate", "--runs", str(p), *js)
        elif kind == "fp8 param gather":
            base = rng.choice((CHECK, SEARCH))
            args = (*base, "--fp8-param-gather",
                    *rng.choice(((), ("--precision", "fp8"), ("--precision", "fp4"),
                                 ("--fp8-recipe", "tensorwise"), ("--fp8-recipe", "blockwise"),
                                 ("--precision", "fp8", "--fsdp"),
                                 ("--precision", "fp8", "--no-distributed-optimizer"))),
                    # a search fails on its output path before the work starts
                    *(() if base is CHECK else ("--pareto", "out.txt")), *js)
        elif kind == "subcommand":
            args = rng.choice((
                ("models", rng.choice(("--json", "--nosuch", "x", "--json=1"))),
                ("gpus", rng.choice(("--json", "extra", "--help"))),
                ("--version",), ("nosuch",), ("calibrate",), ("check",), ("plan",),
                ("sweep",), ("sweep", "/dev/zero", "--out", "x.csv"),
                ("check", "--model", "llama3-8b"), ("check", "--nodes", "1"),
                (*SEARCH, "--verify", rng.choice(("0", "21", "nan", "3")), "--verify-dir",
                 rng.choice(("/proc/x", "/dev/full", str(fifo), "/etc/passwd/d")), *js),
                (*CHECK, "--export", rng.choice(("megatron", "primus", "nemo", "nosuch")),
                 "--tp", rng.choice(("1", "3", "8", "16")), *js),
                (*SEARCH, "--top", rng.choice(BAD_NUMBERS)),
                (*SEARCH, "--workers", rng.choice(BAD_NUMBERS)),
                (*SEARCH, "--lm", rng.choice(("x", "/", "openai/", "a/b")), "--pareto", "x.txt"),
                (*SEARCH, "--lm-timeout", rng.choice(BAD_NUMBERS)),
                (*PLAN, "--gpu", rng.choice((",", "h100,,", " ", "h100,h100")), *js),
                (*PLAN, "--tokens", rng.choice(BAD_NUMBERS), *js),
                ("plan", "--model", "llama3-8b", "--points", rng.choice(BAD_NUMBERS), *js),
                ("plan", "--model", "llama3-8b", "--max-nodes", rng.choice(BAD_NUMBERS), *js),
            ))
        elif kind == "sweep grid":
            p = tmp / f"grid{rng.randrange(10**9)}.yaml"
            p.write_text(_grid_yaml(rng))
            args = ("sweep", str(p), "--out", rng.choice(("s.csv", "s.json", "/proc/s.csv",
                                                          "s.parquet", "")), "--no-progress",
                    *js)
        elif kind == "hybrid search":
            m = dict(NEMOTRON_H)
            for _ in range(rng.randint(0, 2)):
                key, values = rng.choice(HYBRID_EXTREMES)
                m[key] = rng.choice(values)
                if key == "hybrid_override_pattern":
                    m["num_hidden_layers"] = len(m[key])
            p = tmp / f"hyb{rng.randrange(10**9)}.json"
            p.write_text(json.dumps(m))
            model = rng.choice((str(p), "nemotron-3-nano", "nemotron-h-8b", "nemotron-3-super"))
            args = ("--model", model, "--gpu", rng.choice(("h100", "b200", "mi355x")),
                    "--nodes", rng.choice(("1", "2", "8")),
                    *rng.choice(((), ("--precision", "fp8", "--fp8-param-gather"),
                                 ("--constraint", "cp==1"), ("--all-recompute-levels",))), *js)
        elif kind == "extreme shape":
            args = (*_extreme_shape(rng, tmp), *js)
        elif kind == "gpu quantity":
            args = _gpu_quantity(rng, tmp)
        elif kind == "hf types":
            args = _hf_types(rng, tmp)
        elif kind == "quoted number":
            args = _quoted_number(rng, tmp)
        elif kind == "calibration shape":
            args = (*_calibration_shape(rng, tmp, root), *js)
        elif kind == "titan toml":
            args = (*_titan_toml(rng, tmp, root), *js)
        elif kind in IO_KINDS:
            return_case = _io_case(kind, rng, tmp, root, js)
            out.append(return_case)
            continue
        else:  # plan run
            args = ("plan", "--model", rng.choice(("llama3-8b", "mixtral-8x7b", "nemotron-3-nano",
                                                   "deepseek-v3")),
                    "--gpu", rng.choice(("h100", "h100,b200", "mi355x,h100", "a100")),
                    "--points", rng.choice(("1", "2", "3")),
                    "--max-nodes", rng.choice(("1", "4", "16", "64")),
                    *rng.choice(((), ("--tokens", "1e12"), ("--precision", "fp8"),
                                 ("--precision", "fp8", "--fp8-param-gather"),
                                 ("--tokens", "1e12", "--price-per-gpu-hour", "3"))), *js)
        out.append(Case(kind, args))
    return out


#: The kinds whose runs stop at input checking or a check (cheap), and those that do real work
#: (searches, plans, sweeps of hostile but legal inputs).
LIGHT = ("int flag", "float flag", "overhead", "model file", "gpu file", "calibration file",
         "primus file", "constraint", "prefer", "output path", "baseline", "price", "runs file",
         "hybrid file", "mla file", "number file", "megatron args", "fp8 param gather",
         "subcommand", "gpu quantity", "hf types", "quoted number", "calibration shape",
         # issue 29: the reader, path, stream and process classes (cheap: refused up front)
         "shell bomb", "primus tree", "name value", "escape text", "sweep size")
#: ("log": a log that reads refits the time model, tens of seconds)
HEAVY = ("model search", "cluster size", "primus mutation", "runs csv", "sweep grid",
         "hybrid search", "plan run", "log", "extreme shape", "titan toml",
         # issue 29: output to /dev/full or a closed pipe, Ctrl-C at a random moment (a process
         # each), plan over many copies of a GPU
         "stream", "plan gpus",
         # issue 29's independent campaign: sweep workers started under a console script with
         # no main guard (benchmarks/fuzz.py runs these through one)
         "sweep workers")
#: (key, values) a "hybrid search" case sets in the NemotronH config.json.
HYBRID_EXTREMES = (("hybrid_override_pattern", ("M", "E", "*", "-", "M" * 200, "ME" * 64,
                                                "*" * 3 + "M" * 3, "MEMEM*E" * 20)),
                   ("mamba_num_heads", (8, 256, 4096)), ("n_groups", (1, 2, 64)),
                   ("ssm_state_size", (1, 16, 4096)), ("n_routed_experts", (1, 2, 1024)),
                   ("num_experts_per_tok", (1, 16)), ("moe_latent_size", (0, 1, 8192)),
                   ("num_nextn_predict_layers", (0, 2, 8)), ("chunk_size", (1, 4096)))


def strict_json(text: str) -> bool:
    """Whether ``text`` is strict JSON (no NaN/Infinity)."""
    def refuse(name: str) -> None:
        raise ValueError(name)

    try:
        json.loads(text, parse_constant=refuse)
    except ValueError:
        return False
    return True


def defects(code: int, out: str, err: str, args: tuple[str, ...]) -> list[str]:
    """What is wrong with one run's result (empty: nothing)."""
    found = []
    if FUZZ_SECRET in out or FUZZ_SECRET in err:
        found.append("secret from the environment shown")
    if code == 130:  # Ctrl-C: one line, nothing else on stderr
        if err != "tune-cp: interrupted (Ctrl-C)\n":
            found.append("Ctrl-C not one line")
        return found
    if code not in (0, 1, 2):
        found.append(f"exit {code}")
    if "Traceback" in err or "internal error" in err:
        found.append("internal error")
    if code == 2 and (err.count("\n") != 1 or not err.startswith("tune-cp: error: ")):
        found.append("not one error line")
    if "--json" in args and out.strip() and not strict_json(out):
        found.append("invalid JSON")
    if "--json" not in args and any(w in out for w in (" nan ", " inf ", "nan%", "NaN")):
        found.append("nan/inf in text")
    return found


# -------------------------------------------------------- issue 29: readers, paths, streams

#: A value the fuzz campaigns put in the environment (``TUNE_CP_FUZZ_SECRET``, and
#: ``OPENAI_API_KEY`` in ``benchmarks/fuzz.py``): the generated files and scripts reference it;
#: it must never appear in any output (``defects``).
FUZZ_SECRET = "sk-fuzz-0123456789abcdef-must-not-leak"
SECRET_VARS = ("TUNE_CP_FUZZ_SECRET", "OPENAI_API_KEY")
#: Output paths of the issue-29 kinds: a trailing slash, an unknown user's home, a kernel file
#: system, a folder where a file goes.
IO_OUT_PATHS = ("x.png/", "x.jsonl/", "~nosuchuser-fuzz/x.png", "~/", "/proc/plots/x.png",
                "/proc/x.csv", ".", "..", "/tmp/", "x.csv/.")
#: The issue-29 kinds (generated by :func:`_io_case`).
IO_KINDS = ("shell bomb", "primus tree", "name value", "escape text", "sweep size", "stream",
            "plan gpus", "sweep workers")
#: Terminal escapes a name may carry (OSC title, CSI colour, C1 CSI, bidi override, BEL).
ESCAPES = ("\x1b]0;pwned\x07", "\x1b[31m", "\x9b2J", "\u202e", "\x07", "\x1b]52;c;aGk=\x07")


def _output_path_case(rng: random.Random, path: str, js: tuple[str, ...]) -> tuple[str, ...]:
    """``path`` given to one of the options that write a file or a folder."""
    grid = str(Path(__file__).resolve().parent.parent / "benchmarks/grids/example.yaml")
    return rng.choice((
        (*SEARCH, "--pareto", path, *js), (*SEARCH, "--trials-out", path, *js),
        (*SEARCH, "--verify", "1", "--verify-dir", path, *js),
        ("plan", "--model", "llama3-8b", "--gpu", "h100", "--plot", path, *js),
        ("calibrate", "--runs", "/nonexistent.csv", "--out", path, *js),
        ("sweep", grid, "--out", path, "--no-progress", *js),
        ("sweep", grid, "--out", "/proc/s.csv", "--plot", path, *js),
    ))


def _shell_bomb(rng: random.Random) -> str:
    """A launch script that attacks one bound of the shell reader (formats/shell.py)."""
    n = rng.choice((10, 40, 65, 200, 3000))
    flags = "--num-layers 4 --hidden-size 1024 --num-attention-heads 8"
    pick = rng.randrange(12)
    if pick == 0:
        return f"torchrun x.py {flags} --seq-length $((" + "**".join(["2"] * rng.randint(3, 9)) \
            + "))"
    if pick == 1:
        return f"torchrun x.py {flags} --seq-length $((" + "(" * n + "1" + ")" * n + "))"
    if pick == 2:
        return "A=xy\n" + 'A="$A$A"\n' * n + f"torchrun x.py {flags} --seq-length 8"
    if pick == 3:
        return "A=(x)\n" + "A=(${A[@]} ${A[@]})\n" * n + f"torchrun x.py {flags}"
    if pick == 4:
        return f"torchrun x.py {flags} --seq-length " + "${A:-" * n + "8" + "}" * n
    if pick == 5:
        return f'torchrun x.py {flags} --seq-length "' + '${A:-"' * n + "8" + '"}' * n + '"'
    if pick == 6:
        return "if [[ 1 ]]; then\n" * n + f"torchrun x.py {flags}\n" + "fi\n" * n
    if pick == 7:
        return f"torchrun x.py {flags} --seq-length " + rng.choice((
            '"${A:-it\'s}"', "${A:-'x}", '${A:-"x}', '"${A:-"}"}"', "${A", "$((1+", "'x",
            "$(nproc)", "`nproc`", "${A/x/y}", "$((N*2))", "${#A[@]}", "${@}"))
    if pick == 8:
        return f"torchrun x.py {flags} --seq-length $((9223372036854775807 + 1))"
    if pick == 9:
        return f"torchrun x.py {flags} --micro-batch-size ${{{rng.choice(SECRET_VARS)}}}"
    if pick == 10:
        return f"MBS=${rng.choice(SECRET_VARS)}\ntorchrun x.py {flags} --micro-batch-size $MBS"
    return "torchrun x.py " + "--num-layers 4 " * rng.choice((1000, 80_000))


def _primus_tree_case(rng: random.Random, tmp: Path, root: Path) -> Path:
    """A copy of the Primus test tree whose model or preset path leaves it (absolute, ``../``,
    a symbolic link out), whose ``extends:`` fans out or loops, or whose values reference a
    secret in the environment; returns the experiment."""
    folder = tmp / f"tree{rng.randrange(10**9)}"
    models = folder / "models" / "megatron"
    models.mkdir(parents=True)
    exp = folder / "experiment.yaml"
    exp.write_text((root / PRIMUS_EXAMPLES[0]).read_text())
    for src in sorted((root / "tests/data/primus/models/megatron").glob("*.yaml")):
        (models / src.name).write_text(src.read_text())
    outside = tmp / "outside.yaml"
    outside.write_text(f"num_layers: {FUZZ_SECRET}\n")
    model = models / "mixtral_8x22B_v0.1.yaml"
    pick = rng.randrange(8)
    if pick == 0:
        exp.write_text(exp.read_text().replace("model: mixtral_8x22B_v0.1.yaml",
                                               f"model: {rng.choice((str(outside), '/etc/shadow', '/dev/zero', '../outside.yaml', '../../outside.yaml'))}"))
    elif pick == 1:
        model.write_text(model.read_text().replace("  - mixtral_base.yaml", "  - " + rng.choice(
            (str(outside), "/etc/passwd", "../../../outside.yaml", "../../../../etc/shadow"))))
    elif pick == 2:
        (models / "link.yaml").symlink_to(outside)
        model.write_text(model.read_text().replace("  - mixtral_base.yaml", "  - link.yaml"))
    elif pick in (3, 4):
        depth, fan = (rng.randint(6, 30), rng.randint(2, 6)) if pick == 3 else (
            rng.randint(17, 60), 1)
        for k in range(depth):
            (models / f"p{k}.yaml").write_text(f"extends: {[f'p{k + 1}.yaml'] * fan}\n")
        (models / f"p{depth}.yaml").write_text("num_layers: 8\n")
        model.write_text(model.read_text().replace("  - mixtral_base.yaml",
                                                   "  - mixtral_base.yaml\n  - p0.yaml"))
    elif pick == 5:
        (models / "a.yaml").write_text("extends: [b.yaml, b.yaml]\n")
        (models / "b.yaml").write_text("extends: [a.yaml]\n")
        model.write_text(model.read_text().replace("  - mixtral_base.yaml", "  - a.yaml"))
    else:
        var = rng.choice(SECRET_VARS)
        key = rng.choice(("micro_batch_size: 1", "tensor_model_parallel_size: ${PRIMUS_TP:1}",
                          'wandb_project: "tune-cp-reference"', "train_iters: 50"))
        value = rng.choice((f"${{{var}}}", f"${{{var}:1}}", f"${{{var}:x}}", f"x${{{var}}}y"))
        exp.write_text(exp.read_text().replace(key, f"{key.split(':')[0]}: {value}"))
    return exp


def _grid_of(tmp: Path, rng: random.Random) -> Path:
    """A grid whose scenarios number past MAX_SCENARIOS (up to 1e9): refused before any is
    built."""
    lengths = rng.choice(((1000, 1000, 1000), (101, 100, 1), (10001, 1, 1), (100, 100, 100),
                          (317, 317, 1)))
    axes = [", ".join(str(i + 1) for i in range(n)) for n in lengths]
    p = tmp / f"big{rng.randrange(10**9)}.yaml"
    p.write_text(f"models: [llama3-8b]\ngpus: [h100]\nnodes: [{axes[0]}]\n"
                 f"seq_len: [{', '.join(str(1024 * (i + 1)) for i in range(lengths[1]))}]\n"
                 f"global_batch: [{axes[2]}]\n")
    return p


def _io_case(kind: str, rng: random.Random, tmp: Path, root: Path, js: tuple[str, ...]) -> Case:
    """One case of an issue-29 kind."""
    if kind == "shell bomb":
        text = _shell_bomb(rng)
        if rng.random() < 0.5 or len(text) > 100_000:
            p = tmp / f"bomb{rng.randrange(10**9)}.sh"
            p.write_text(text)
            text = str(p)
        return Case(kind, ("check", "--megatron-args", text, "--model", "llama3-8b", "--gpu",
                           "h100", "--nodes", "1",
                           *rng.choice(((), ("--export", "megatron"), ("--env", "A=1")))))
    if kind == "primus tree":
        return Case(kind, ("check", "--primus-config", str(_primus_tree_case(rng, tmp, root)),
                           "--gpu", "mi355x", "--nodes", "4",
                           *rng.choice(((), ("--export", rng.choice(("megatron", "primus",
                                                                      "nemo"))))), *js))
    if kind == "name value":
        value = rng.choice(("=1", "==1", " =1", "=", "=,=", "h100==1", "=h100", "==", ",=1,"))
        return Case(kind, rng.choice((
            ("plan", "--model", "llama3-8b", "--gpu", "h100", "--price-per-gpu-hour", value,
             *js),
            (*CHECK, "--overhead", value, *js), (*CHECK, "--env", value, *js),
            (*SEARCH, "--baseline", value, "--pareto", "x.txt", *js),
            ("check", "--model", rng.choice(("", " ", "=1")), "--nodes", "1", *js),
            ("check", "--model", "llama3-8b", "--gpu", rng.choice(("", " ", "=1")), "--nodes",
             "1", *js),
        )))
    if kind == "escape text":
        esc = rng.choice(ESCAPES)
        p = tmp / f"m{esc}{rng.randrange(10**6)}.json"
        p.write_text(json.dumps(MIXTRAL))
        return Case(kind, rng.choice((
            ("check", "--model", str(p), "--gpu", "h100", "--nodes", "1"),
            ("check", "--model", f"nosuch{esc}", "--nodes", "1"),
            ("check", "--model", "llama3-8b", "--gpu", f"g{esc}", "--nodes", "1"),
            (*CHECK, "--megatron-args", f"--num-layers {esc}"),
            (*CHECK, "--constraint", f"tp == {esc}"),
            (*SEARCH, "--pareto", f"x{esc}.txt"),
        )))
    if kind == "sweep size":
        return Case(kind, ("sweep", str(_grid_of(tmp, rng)), "--out", "s.csv", "--no-progress",
                           *js))
    if kind == "sweep workers":
        p = tmp / f"w{rng.randrange(10**9)}.yaml"
        nodes = ", ".join(str(n) for n in rng.sample((1, 2, 3, 4), rng.randint(1, 3)))
        p.write_text(f"name: w\nmodels: [{rng.choice(('llama3-8b', 'llama2-7b'))}]\n"
                     f"gpus: [{rng.choice(('h100', 'mi355x'))}]\nnodes: [{nodes}]\n"
                     "seq_len: [2048]\nglobal_batch: [64]\n")
        return Case(kind, ("sweep", str(p), "--out", f"w{rng.randrange(10**9)}.csv",
                           "--workers", str(rng.choice((2, 3))), "--no-progress", *js))
    if kind == "plan gpus":
        n = rng.choice((2, 100, 1000, 5000))
        names = ",".join(rng.choice(("h100", "H100", "b200")) for _ in range(n))
        return Case(kind, ("plan", "--model", "llama3-8b", "--gpu", names, "--max-nodes", "1",
                           "--points", "1", *js))
    # stream: output nowhere, or Ctrl-C at a random moment of a search, plan or check
    line = rng.choice((SEARCH, ("--model", "mixtral-8x7b", "--gpu", "h100", "--nodes", "4"),
                       ("--model", "deepseek-v3", "--gpu", "h100", "--nodes", "16"),
                       ("plan", "--model", "llama3-8b", "--gpu", "h100", "--max-nodes", "4"),
                       CHECK, ("models",), ("--help",),
                       # a refusal whose --json document cannot be written (issue 29 attack)
                       ("--model", "no-such-model", "--nodes", "1"), ("search", "--gpu", "h100")))
    if rng.random() < 0.5:
        # fd-closed: the process starts with descriptor 1 closed (``>&-``; sys.stdout is None)
        return Case(kind, (*line, *js), stdout=rng.choice(("full", "closed", "fd-closed")))
    return Case(kind, (*line, *js), interrupt_s=round(rng.uniform(0.2, 4.0), 2))
