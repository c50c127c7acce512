"""Independent adversarial campaign against the tune-cp CLI (issue 29's acceptance).

Run: python benchmarks/attack.py --cases N --seed S [--kinds a,b] [--verbose]

Written without reading benchmarks/fuzz.py or tests/fuzzing.py. Every case is one tune-cp
subprocess run sequentially with a 60 s timeout and a 2 GiB address-space limit
(RLIMIT_AS), with OPENAI_API_KEY / AWS_SECRET_ACCESS_KEY planted in its environment. A case is a
defect when it: exits 3 or says "internal error" (a sweep worker's); prints 'Traceback'; runs past 60 s; is killed for memory (MemoryError,
rc -9, or max RSS past 2 GiB); prints a planted secret on stdout/stderr or writes it to any file
in its scratch folder; prints --json output that json.loads(parse_constant=raise) refuses; or
exits 0 on an input the case marks as clearly invalid ("must_refuse").
The table printed at the end counts cases by kind and exit code and defects by class.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

SECRET = "sk-SECRET123"
SECRET2 = "AKIASECRETAWS456"
ROOT = Path(__file__).resolve().parents[1] if (Path(__file__).resolve().parents[1] / "cli.py").exists() else Path("/work/wt/attack29")
TIMEOUT = 60
MEM = 2 * 1024**3
MODELS = ["llama2-7b", "mixtral-8x7b", "llama3-8b", "deepseek-v3", "qwen3-30b-a3b", "no-such-model"]
GPUS = ["h100", "mi355x", "b200", "a100", "nope"]

HOSTILE_NUMS = [0, -1, -(2**63), 2**63, 2**64, 10**30, 2**24 + 1, 2**31, 1e308, -1e308, 1e-300, 5e-324,
                float("nan"), float("inf"), float("-inf"), 0.5, 1.5, True, False, None, "8", "big", "NaN",
                "1_000", "0x10", "１２", "\u202e8", "\x1b]0;pwn\x07", [], [8], {}, {"a": 1}, "${OPENAI_API_KEY}",
                "$OPENAI_API_KEY", "2024-01-01"]
CLI_NUMS = ["0", "-1", "1e9", "99999999999999999999", "nan", "inf", "-inf", "1_000", "0x10", "１", "", " ",
            "1.5", "8", "=1", "-", "--", "$OPENAI_API_KEY", "\x1b[31m", "9" * 400]


def preexec():
    resource.setrlimit(resource.RLIMIT_AS, (MEM, MEM))
    os.setsid()


def dump_yaml(obj) -> str:
    import yaml
    try:
        return yaml.safe_dump(obj, allow_unicode=True, sort_keys=False)
    except RecursionError:  # too deep for PyYAML's writer: JSON is YAML too
        return jdump(obj)


def jdump(obj) -> str:
    return json.dumps(obj, allow_nan=True)


def catalog_model(name="llama2-7b"):
    out = subprocess.run([sys.executable, "-m", "cli", "models", "--json"], cwd=ROOT, capture_output=True, text=True) \
        if False else subprocess.run(["tune-cp", "models", "--json"], capture_output=True, text=True)
    for m in json.loads(out.stdout):
        if m["name"] == name:
            return m
    return json.loads(out.stdout)[0]


_CACHE = {}


def base_model(rng):
    key = rng.choice(["llama2-7b", "mixtral-8x7b", "deepseek-v3"])
    if key not in _CACHE:
        try:
            _CACHE[key] = catalog_model(key)
        except Exception:
            _CACHE[key] = catalog_model()
    m = dict(_CACHE[key])
    m["name"] = "att-" + key
    m.pop("aliases", None)
    m.pop("total_params", None)
    m.pop("active_params", None)
    return m


def mutate(rng, d: dict, n=None):
    d = json.loads(json.dumps(d, allow_nan=True))
    keys = [k for k in d if k not in ("name",)]
    for _ in range(n or rng.randint(1, 3)):
        k = rng.choice(keys)
        d[k] = rng.choice(HOSTILE_NUMS)
    return d


def deep(n):
    x = 1
    for _ in range(n):
        x = {"a": x}
    return x


# ---------------------------------------------------------------- generators
# each returns (argv list relative to tune-cp, files dict name->text, flags)

def g_model_file(rng, tmp):
    m = base_model(rng)
    if rng.random() < 0.3:
        # every dim at a max
        for k in ("hidden_size", "ffn_hidden_size", "num_attention_heads", "head_dim", "expert_ffn_hidden_size"):
            if k in m and isinstance(m[k], int) and m[k] > 0:
                m[k] = rng.choice([2**24, 2**23, 2**20, 2**24 - 1])
        m["num_layers"] = rng.choice([512, 511, 256])
        m["vocab_size"] = rng.choice([2**28, 2**27])
    else:
        m = mutate(rng, m)
    if rng.random() < 0.1:
        m["mla"] = {"q_lora_rank": 2**40, "kv_lora_rank": 2**40, "qk_rope_head_dim": 2**30, "qk_nope_head_dim": 64, "v_head_dim": 2**31}
    if rng.random() < 0.05:
        m["extra"] = deep(rng.choice([70, 500]))
    ext = rng.choice(["yaml", "json"])
    text = dump_yaml(m) if ext == "yaml" else jdump(m)
    if rng.random() < 0.1:
        text = text + ("\nnum_layers: 4\n" if ext == "yaml" else "")
        if ext == "json":
            text = text.rstrip()[:-1] + ', "num_layers": 4}'
    name = f"model.{ext}"
    cmd = rng.choice([["search"], ["check", "--tp", "1", "--pp", "1", "--mbs", "1"], ["plan"]])
    argv = cmd + ["--model", name, "--nodes", "1", "--json"] if cmd[0] != "plan" else cmd + ["--model", name, "--json", "--max-nodes", "4"]
    return argv, {name: text}, {"json": True}


def g_hf(rng, tmp):
    base = json.loads((ROOT / "tests/data/hf/mistral-7b-v0.1.json").read_text())
    choice = rng.random()
    if choice < 0.5:
        base = mutate(rng, base)
    elif choice < 0.75:
        base.update(rng.choice([
            {"rope_scaling": rng.choice(["llama3", {"rope_type": "yarn", "factor": "x"}, {"type": 5}, [1, 2], {"rope_type": "llama3", "factor": -1}])},
            {"scoring_func": rng.choice(["relu", "sigmoid", 5, None]), "n_routed_experts": 8, "num_experts_per_tok": 2, "model_type": "deepseek_v3"},
            {"topk_group": 8, "n_group": 2, "n_routed_experts": 8, "num_experts_per_tok": 2, "model_type": "deepseek_v3"},
            {"num_key_value_heads": rng.choice([0, -4, 3, 33])},
            {"rope_theta": rng.choice([0, -1, "big", 1e400 if False else 1e308])},
            {"rms_norm_eps": rng.choice(["tiny", 0, -1e-5, 2.0])},
            {"model_type": rng.choice(["", "\x1b]0;x\x07", "unknown_arch", 5])},
            {"num_local_experts": rng.choice([0, -1, 10**9]), "num_experts_per_tok": rng.choice([0, 3, 10**9])},
        ]))
    else:
        base = {"architectures": ["X"], **deep(rng.choice([10, 80]))} if rng.random() < 0.3 else [base]
    name = "config.json"
    text = jdump(base)
    cmd = rng.choice([["search", "--nodes", "1"], ["check", "--tp", "1", "--pp", "1", "--nodes", "1"], ["plan", "--max-nodes", "2"]])
    return cmd + ["--model", name, "--json"], {name: text}, {"json": True, "must_refuse_hint": True}


GPU_BASE = None


def g_gpu(rng, tmp):
    import yaml
    g = yaml.safe_load((ROOT / "docs/examples/gpu.yaml").read_text())
    if rng.random() < 0.5:
        for k in rng.sample([k for k in g if k not in ("name", "source")], rng.randint(1, 3)):
            g[k] = rng.choice([1e-300, 5e-324, 1e-9, 1e300, 0, -1, float("nan"), float("inf"), "80", True, 2**70])
    else:
        g = mutate(rng, g)
    name = rng.choice(["gpu.yaml", "gpu.json"])
    text = dump_yaml(g) if name.endswith("yaml") else jdump(g)
    cmd = rng.choice([["search", "--nodes", "1"], ["check", "--tp", "1", "--pp", "1", "--nodes", "1"], ["plan", "--max-nodes", "2"]])
    return cmd + ["--model", "llama2-7b", "--gpu", name, "--json"], {name: text}, {"json": True}


CAL = None


def g_calibration(rng, tmp):
    global CAL
    if CAL is None:
        CAL = json.loads((ROOT / "oracle/catalog/calibration.json").read_text())
    c = json.loads(json.dumps(CAL))
    k = rng.choice(list(c))
    v = c[k]
    r = rng.random()
    if isinstance(v, dict) and v and r < 0.6:
        kk = rng.choice(list(v))
        v[kk] = rng.choice(HOSTILE_NUMS + [[[1]], {"x": []}])
        if rng.random() < 0.3:
            del v[kk]
    else:
        c[k] = rng.choice(HOSTILE_NUMS + [[["a"]], {"mfu": "x"}])
    if rng.random() < 0.1:
        c = rng.choice([[], "x", 5, None, {}])
    name = "cal.json"
    cmd = rng.choice([["search", "--nodes", "1"], ["check", "--tp", "1", "--pp", "1", "--nodes", "1"], ["plan", "--max-nodes", "2"]])
    return cmd + ["--model", "llama2-7b", "--calibration", name, "--json"], {name: jdump(c)}, {"json": True}


SHELL_BOMBS = [
    "X=$((2**2**2**2**2))\n--num-layers $X",
    "A=x\n" + "A=\"$A$A\"\n" * 40 + "--num-layers 8 --seq-length $A",
    "--num-layers " + "${A:-" * 3000 + "8" + "}" * 3000,
    "if true; then\n" * 2000 + "--num-layers 8\n" + "fi\n" * 2000,
    '--num-layers ${A:-"8}',
    '--num-layers "${A:-"8"}"',
    "--micro-batch-size $OPENAI_API_KEY",
    "--micro-batch-size ${OPENAI_API_KEY}",
    "--micro-batch-size ${OPENAI_API_KEY:-1}",
    "--data-path $OPENAI_API_KEY --micro-batch-size 1",
    "--tensor-model-parallel-size $(cat /etc/passwd)",
    "--tensor-model-parallel-size `echo 8`",
    "--num-layers $((1/0))",
    "--num-layers $((9223372036854775807+1))",
    "--num-layers $((-(-9223372036854775807-1)/-1))",
    "--num-layers $((1<<100000))",
    "--num-layers $((10**100000))",
    "A=(" + "x " * 100000 + ")\n--num-layers ${#A[@]}",
    "--num-layers 8 " * 50000,
    "--num-layers \\\n" * 5000,
    "'unterminated",
    '"unterminated',
    "${",
    "$((",
    "--num-layers ${A:?$OPENAI_API_KEY}",
    "--num-layers 8\x00",
    "--num-layers \x1b]0;pwn\x07",
    "--num-layers ８",
    "--num-layers 1_000",
    "--num-layers 0x10",
    "--tensor-model-parallel-size 3 --num-layers 8",
    "--seq-length -1",
    "--micro-batch-size 0",
    "--global-batch-size nan",
    "--lr inf",
    "eval echo hi\n--num-layers 8",
    "source /etc/passwd\n--num-layers 8",
    ". ~/.bashrc\n--num-layers 8",
    "--num-layers ${OPENAI_API_KEY:0:3}",
    "--num-layers ${OPENAI_API_KEY//s/x}",
    "--num-layers ${!OPENAI*}",
    "--num-layers ${!A}",
    "A=OPENAI_API_KEY\n--micro-batch-size ${!A}",
    "f(){ f; }; f\n--num-layers 8",
    "while true; do :; done\n--num-layers 8",
    "A=$A$A$A$A$A$A$A$A$A$A\n" * 30,
    "--num-layers {1..100000000}",
    "--num-layers " + "{a,b}" * 40,
]


def g_megatron(rng, tmp):
    s = rng.choice(SHELL_BOMBS)
    if rng.random() < 0.5:
        name = "launch.sh"
        files = {name: "#!/bin/bash\n" + s + "\n"}
        arg = name
    else:
        files = {}
        arg = s
    extra = []
    if rng.random() < 0.3:
        extra += ["--env", rng.choice(["A=1", "OPENAI_API_KEY=x", "?=1", "=", "A", "A=" + "x" * 100000])]
    if rng.random() < 0.3:
        extra += ["--export", rng.choice(["megatron", "primus", "nemo"])]
    return ["check", "--model", "llama2-7b", "--nodes", "1", "--megatron-args=" + arg, "--json"] + extra, files, {"json": True}


def g_primus(rng, tmp):
    files = {}
    r = rng.random()
    exp = {"work_group": "x", "user_name": "y", "exp_name": "z", "modules": {"pre_trainer": {
        "framework": "megatron", "config": "pre_trainer.yaml", "model": "m.yaml", "overrides": {}}}}
    ov = exp["modules"]["pre_trainer"]["overrides"]
    if r < 0.25:
        ov["micro_batch_size"] = rng.choice(["${OPENAI_API_KEY}", "${OPENAI_API_KEY:1}", "$OPENAI_API_KEY", "${AWS_SECRET_ACCESS_KEY:2}"])
    elif r < 0.45:
        exp["modules"]["pre_trainer"]["model"] = rng.choice(["/etc/passwd", "../../../../etc/hostname", "/proc/self/environ", "~/x.yaml", "m.yaml/"])
    elif r < 0.65:
        # extends fan-out bomb
        n = rng.choice([10, 16, 20])
        for i in range(n):
            files[f"b{i}.yaml"] = dump_yaml({"extends": [f"b{i+1}.yaml", f"b{i+1}.yaml"], f"k{i}": i})
        files[f"b{n}.yaml"] = "num_layers: 8\n"
        exp["modules"]["pre_trainer"]["model"] = "b0.yaml"
    elif r < 0.75:
        files["m2.yaml"] = "extends: [m2.yaml]\n"
        exp["modules"]["pre_trainer"]["model"] = "m2.yaml"
    else:
        ov.update(mutate(rng, {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "micro_batch_size": 1, "num_layers": 8}))
    files.setdefault("m.yaml", dump_yaml({"extends": ["llama_base.yaml"] if False else [], "num_layers": 8, "hidden_size": 4096,
                                        "num_attention_heads": 32, "ffn_hidden_size": 11008}))
    files["exp.yaml"] = dump_yaml(exp)
    extra = ["--export", rng.choice(["megatron", "primus", "nemo"])] if rng.random() < 0.4 else []
    return ["check", "--model", "llama2-7b", "--nodes", "1", "--primus-config", "exp.yaml", "--json"] + extra, files, {"json": True}


def g_primus_real(rng, tmp):
    src = ROOT / "tests/data/primus/examples/MI355X/mixtral_8x22B_v0.1-BF16-4node.yaml"
    txt = src.read_text()
    muts = [("micro_batch_size: ", "micro_batch_size: ${OPENAI_API_KEY} #"), ("num_layers", "num_layers"),
            ("\n", "\n" if True else "")]
    a, b = rng.choice(muts)
    txt = txt.replace(a, b, 1)
    if rng.random() < 0.5:
        txt += "\n" + rng.choice(["modules: 5", "foo: ${OPENAI_API_KEY}", "x: &a [*a]", "y: " + "[" * 100 + "]" * 100, "z: !!python/object:os.system x"])
    return ["check", "--model", "mixtral-8x22b", "--nodes", "4", "--primus-config", "exp.yaml", "--json", "--export", rng.choice(["megatron", "primus", "nemo"])], {"exp.yaml": txt}, {"json": True, "copytree": True}


def g_toml(rng, tmp):
    src = (ROOT / "tests/data/logs/torchtitan_llama3_8b_fsdp8.toml").read_text()
    extra = rng.choice([
        "[parallelism]\ntensor_parallel_degree = 0\n", "[parallelism]\ntensor_parallel_degree = nan\n",
        "[parallelism]\ndata_parallel_shard_degree = inf\n", "[x]\nwhen = 1979-05-27T07:32:00Z\n",
        "a = " + "[" * 200 + "]" * 200 + "\n", "[training]\nseq_len = -1\n", "[training]\nlocal_batch_size = 1e400\n",
        "[training]\nseq_len = \"${OPENAI_API_KEY}\"\n", "[training]\nseq_len = 99999999999999999999\n",
        "[model]\nname = \"\x1b]0;x\x07\"\n", "not toml = = =\n", "",
    ])
    if "[parallelism]" in extra and "[parallelism]" in src:
        # replace inside existing section to avoid duplicate table
        k, v = extra.split("\n")[1].split(" = ")
        import re
        if re.search(rf"^{k}\s*=", src, re.M):
            src = re.sub(rf"^{k}\s*=.*$", f"{k} = {v}", src, flags=re.M)
            extra = ""
        else:
            src = src.replace("[parallelism]\n", "[parallelism]\n" + f"{k} = {v}\n", 1)
            extra = ""
    text = src + "\n" + extra
    log = (ROOT / "tests/data/logs/torchtitan_issue1287.log").read_text()
    return ["calibrate", "--config", "job.toml", "--log", "t.log", "--gpu", "h100", "--json"], {"job.toml": text, "t.log": log}, {"json": True}


def g_log(rng, tmp):
    logs = list((ROOT / "tests/data/logs").glob("*.log"))
    txt = rng.choice(logs).read_text(errors="replace")
    r = rng.random()
    if r < 0.3:
        lines = txt.splitlines()
        i = rng.randrange(len(lines))
        lines[i] = lines[i].replace("1", rng.choice(["nan", "inf", "9" * 400, "-1", "１"]))
        txt = "\n".join(lines)
    elif r < 0.5:
        txt = "\x00\xff" * 1000
    elif r < 0.6:
        txt = "iteration 1/ 10 | elapsed time per iteration (ms): nan | " * 10000
    elif r < 0.7:
        txt = txt + "\n" + SECRET + "\n"
    cmd = rng.choice([["check", "--model", "llama2-7b", "--nodes", "1", "--tp", "1", "--pp", "1", "--log", "x.log", "--json"],
                      ["calibrate", "--log", "x.log", "--model", "llama2-7b", "--gpu", "h100", "--nodes", "1", "--json"]])
    return cmd, {"x.log": txt}, {"json": True}


def g_sweep(rng, tmp):
    g = {"name": rng.choice(["g", "\x1b]0;x\x07", "../../x", "${OPENAI_API_KEY}"]), "models": ["llama2-7b"], "gpus": ["h100"],
         "nodes": [1], "seq_len": [2048], "global_batch": [64]}
    r = rng.random()
    if r < 0.2:
        # 1e8 scenarios: must be counted and refused (or streamed), not built whole
        g["nodes"] = list(range(1, 1001))
        g["seq_len"] = list(range(1024, 1124))
        g["global_batch"] = list(range(1, 1001))
    elif r < 0.35:
        g["nodes"] = list(range(1, 50))
        g["seq_len"] = [1024, 2048, 4096]
        g["global_batch"] = list(range(8, 400, 8))
    elif r < 0.7:
        g = mutate(rng, g)
    elif r < 0.8:
        g["calibration"] = rng.choice(["cal.json", "/etc/passwd", "../nope.json"])
    else:
        g["models"] = rng.choice([["no-such"], [], "llama2-7b", ["llama2-7b"] * 1000, ["model.yaml"]])
    files = {"grid.yaml": dump_yaml(g), "cal.json": "{}"}
    argv = ["sweep", "grid.yaml", "--no-progress", "--json"]
    argv += rng.choice([["--out", "out.csv"], ["--out", "out.csv"], ["--out", "/proc/x.csv"], ["--out", "d/"], ["--out", "o.csv", "--plot", "/proc/plots"],
                        ["--out", "o.csv", "--workers", rng.choice(["0", "-1", "100000", "2"])]])
    return argv, files, {"json": "--out" not in argv or True}


EXPRS = ["tp<=8", "tp*pp<=world", "tp==3", "tp<=1_000", "tp<=0x10", "ｔｐ<=2", "tp<=1.5", "tp<=" + "9" * 400,
         "(" * 500 + "tp" + ")" * 500, "tp" + "+tp" * 20000, "__import__('os')", "tp<=8 and", "", " ", "tp<=nan",
         "tp<=inf", "tp**tp**tp**tp<=1", "tp<<100000<1", "tp/0<1", "tp%0==0", "tp<=$OPENAI_API_KEY", "\x1b]0;x\x07",
         "tp<=2**63", "tp*9223372036854775807>1", "not not not tp", "mbs<=-1", "ep==1 or cp==2", "vpp<=2",
         "tp==1 and tp==2", "unknown<=2", "tp<=8;rm -rf /", "tp <= 8 " * 1000]
PREFS = ["tp", "-tp", "min:tp", "max:pp", "tp desc", "", "nonsense", "tp<=2", "ｔｐ", "tp,pp,cp", "\x1b[31m", "tp" * 10000]


def g_expr(rng, tmp):
    cmd = rng.choice(["search", "check", "plan"])
    argv = [cmd, "--model", "llama2-7b", "--json"]
    if cmd == "check":
        argv += ["--tp", "1", "--pp", "1", "--nodes", "1"]
    elif cmd == "search":
        argv += ["--nodes", "1"]
    else:
        argv += ["--max-nodes", "2"]
    for _ in range(rng.randint(1, 3)):
        argv += ["--constraint", rng.choice(EXPRS)]
    if cmd == "search" and rng.random() < 0.5:
        argv += ["--prefer", rng.choice(PREFS)]
    if cmd == "search" and rng.random() < 0.3:
        argv += ["--baseline", rng.choice(["tp1", "x", "tp=1,pp=1", "$OPENAI_API_KEY", "", "a" * 10000])]
    return argv, {}, {"json": True}


NUM_OPTS = {"search": ["--nodes", "--gpus-per-node", "--seq-len", "--gbs", "--top", "--workers", "--memory-margin",
                       "--moe-token-drop", "--verify", "--lm-rounds", "--lm-timeout", "--lm-budget"],
            "check": ["--nodes", "--gpus-per-node", "--seq-len", "--gbs", "--tp", "--pp", "--vpp", "--cp", "--ep", "--etp",
                      "--mbs", "--recompute-layers", "--first-stage-layers", "--last-stage-layers", "--memory-margin", "--moe-token-drop"],
            "plan": ["--gpus-per-node", "--seq-len", "--gbs", "--tokens", "--price-per-gpu-hour", "--max-nodes", "--points", "--memory-margin"]}


def g_cli(rng, tmp):
    cmd = rng.choice(list(NUM_OPTS))
    argv = [cmd, "--model", rng.choice(MODELS), "--json"]
    if rng.random() < 0.3:
        argv += ["--gpu", rng.choice(GPUS + ["h100," * 1000 + "h100", "h100,h100", ",", "~nouser/g.yaml", "/dev/zero", "/proc/self/environ", "."])]
    for opt in rng.sample(NUM_OPTS[cmd], rng.randint(1, 3)):
        argv += [opt, rng.choice(CLI_NUMS)]
    if cmd == "check":
        argv += rng.choice([[], ["--pipeline-layout", rng.choice(["E|t*100|L", "", "x" * 100000, "Et|tL", "\x1b"])],
                            ["--recompute-modules", rng.choice(["core_attn", "x", ",,", ""])]])
    if cmd == "plan" and rng.random() < 0.3:
        argv += ["--gpu", ",".join(["h100"] * rng.choice([2, 50, 1000]))]
    return argv, {}, {"json": True}


def g_outputs(rng, tmp):
    os.makedirs(os.path.join(tmp, "ro"), exist_ok=True)
    os.chmod(os.path.join(tmp, "ro"), 0o500)
    os.makedirs(os.path.join(tmp, "adir"), exist_ok=True)
    bad = rng.choice(["x.png/", "adir", "ro/x", "/proc/x", "~nouserzz/x", "/dev/full", "", "a" * 5000, "nodir/x/y", "\x1b]0;x"])
    opt = rng.choice([["search", "--model", "llama2-7b", "--nodes", "1", "--pareto", bad],
                      ["search", "--model", "llama2-7b", "--nodes", "1", "--trials-out", bad],
                      ["search", "--model", "llama2-7b", "--nodes", "1", "--verify", "1", "--verify-dir", bad],
                      ["plan", "--model", "llama2-7b", "--max-nodes", "2", "--plot", bad],
                      ["sweep", "grid.yaml", "--no-progress", "--out", bad],
                      ["sweep", "grid.yaml", "--no-progress", "--out", "o.csv", "--plot", bad],
                      ["search", "--model", "llama2-7b", "--nodes", "1", "--pareto", "p.png", "--trials-out", bad],
                      ["calibrate", "--runs", str(ROOT / "benchmarks/published_runs.csv"), "--out", bad]])
    grid = dump_yaml({"name": "o", "models": ["llama2-7b"], "gpus": ["h100"], "nodes": [1], "seq_len": [2048], "global_batch": [64]})
    return opt, {"grid.yaml": grid}, {}


def g_streams(rng, tmp):
    argv = rng.choice([["search", "--model", "llama2-7b", "--nodes", "1"], ["models"], ["gpus"], ["search", "--model", "llama2-7b", "--nodes", "1", "--json"],
                       ["plan", "--model", "llama2-7b", "--max-nodes", "2"], ["check", "--model", "llama2-7b", "--nodes", "1", "--tp", "1", "--pp", "1"]])
    mode = rng.choice(["full", "closed", "head", "errfull", "sigint"])
    return argv, {}, {"stream": mode}


def g_export(rng, tmp):
    argv = ["check", "--model", "llama2-7b", "--nodes", "1", "--tp", "1", "--pp", "1", "--export", rng.choice(["megatron", "primus", "nemo"])]
    argv += ["--megatron-args=" + rng.choice(["--data-path $OPENAI_API_KEY", "--wandb-api-key ${OPENAI_API_KEY}", "--tokenizer-model $AWS_SECRET_ACCESS_KEY",
                                            "--save $HOME/$OPENAI_API_KEY", "--num-layers 32 --hf-token sk-SECRET123"])]
    if rng.random() < 0.5:
        argv += ["--env", rng.choice(["OPENAI_API_KEY", "OPENAI_API_KEY=visible", "HOME=/h"])]
    return argv, {}, {}


def g_edge_model(rng, tmp):
    """Plausible but unusual shapes: values a model file may really hold, which reach the
    solver and the oracle instead of being refused at the boundary."""
    m = base_model(rng)
    for _ in range(rng.randint(1, 4)):
        k = rng.choice(["num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads",
                        "head_dim", "vocab_size", "num_experts", "moe_top_k", "expert_ffn_hidden_size",
                        "num_shared_experts", "num_dense_layers", "sliding_window", "num_mtp_layers",
                        "num_sliding_window_layers", "default_seq_len", "default_global_batch_size",
                        "router_num_groups", "router_group_topk", "shared_expert_ffn_hidden_size"])
        m[k] = rng.choice([1, 2, 3, 7, 97, 127, 509, 4096, 65536, 2**20, 0])
    name = "edge.json"
    cmd = rng.choice([["search", "--nodes", rng.choice(["1", "2", "3", "64"])],
                      ["check", "--tp", rng.choice(["1", "2", "8"]), "--pp", rng.choice(["1", "2", "3"]), "--nodes", "1"],
                      ["plan", "--max-nodes", "3", "--points", "2"]])
    return cmd + ["--model", name, "--json", "--gpu", rng.choice(["h100", "mi355x"])], {name: jdump(m)}, {"json": True}


def g_edge_cli(rng, tmp):
    cmd = rng.choice(["search", "check", "plan"])
    argv = [cmd, "--model", rng.choice(MODELS[:5]), "--json"]
    argv += {"search": ["--nodes", rng.choice(["1", "2", "7", "128", "1024"])],
             "check": ["--nodes", "1", "--tp", rng.choice(["1", "2", "8"]), "--pp", rng.choice(["1", "2"])],
             "plan": ["--max-nodes", rng.choice(["1", "3", "100"]), "--points", rng.choice(["1", "3"])]}[cmd]
    for _ in range(rng.randint(1, 3)):
        opt = rng.choice(["--overhead", "--cuda-graph-scope", "--moe-token-drop", "--seq-len", "--gbs",
                          "--gpus-per-node", "--memory-margin", "--precision", "--framework", "--recompute",
                          "--schedule", "--dispatcher", "--fp8-recipe", "--pipeline-split", "--tokens",
                          "--price-per-gpu-hour"])
        val = rng.choice({"--overhead": ["fragmentation=0.1", "fragmentation=nan", "fragmentation=1e308",
                                         "runtime_context_bytes=2GiB", "runtime_context_bytes=99999PiB",
                                         "runtime_context_bytes=-1GiB", "moe_routing_imbalance=1e9", "x=1", "=", "a=b=c",
                                         "fragmentation=$OPENAI_API_KEY", "runtime_context_bytes=1e400GiB"],
                          "--cuda-graph-scope": ["attn", "full_iteration", "none", "attn,attn", "mlp,full_iteration", ",", "x"],
                          "--moe-token-drop": ["1.0", "0", "-1", "1e308", "nan", "0.0001", "1e-320"],
                          "--seq-len": ["1", "3", "131072", "1048576", "16777216", "7"],
                          "--gbs": ["1", "3", "1000003", "65536"],
                          "--gpus-per-node": ["1", "3", "16", "72", "1024"],
                          "--memory-margin": ["0", "0.99", "1", "0.999999", "-0.1", "1e-320"],
                          "--precision": ["bf16", "fp8", "fp4", "fp16", "fp32", "x"],
                          "--framework": ["megatron-lm", "primus", "megatron-bridge", "torchtitan", "nemo", "x"],
                          "--recompute": ["full", "selective", "none", "x"], "--schedule": ["1f1b", "interleaved", "zb", "x"],
                          "--dispatcher": ["alltoall", "allgather", "flex", "deepep", "x"],
                          "--fp8-recipe": ["delayed", "tensorwise", "blockwise", "mxfp8", "x"],
                          "--pipeline-split": ["uniform", "x"], "--tokens": ["1e12", "1e300", "0", "1", "nan", "-1"],
                          "--price-per-gpu-hour": ["2.5", "0", "1e308", "h100=2,b200=3", "h100=", "=1", "nan"]}[opt])
        argv += [opt, val]
    if cmd != "plan" and rng.random() < 0.3:
        argv += [rng.choice(["--allow-fp8", "--fsdp", "--fp8-param-gather", "--grad-reduce-in-bf16", "--allow-cross-scale-up", "--moe-a2a-overlap"])]
    return argv, {}, {"json": True}


def g_runs_csv(rng, tmp):
    src = (ROOT / "benchmarks/published_runs.csv").read_text().splitlines()
    head, rows = src[0], src[1:]
    rows = rng.sample(rows, min(len(rows), rng.randint(1, 30)))
    out = []
    for r in rows:
        cells = r.split(",")
        if rng.random() < 0.4:
            i = rng.randrange(len(cells))
            cells[i] = rng.choice(["nan", "inf", "-1", "0", "1e308", "x", "", "\"\"", "9" * 40, "１", "$OPENAI_API_KEY"])
        out.append(",".join(cells))
    text = "\n".join([head] + out) + "\n"
    if rng.random() < 0.1:
        text = head + "\n" + ("," * 10000 + "\n") * 10
    return ["calibrate", "--runs", "runs.csv", "--json"] + (["--out", "cal.json"] if rng.random() < 0.5 else []), {"runs.csv": text}, {"json": True}


def g_sweep_edge(rng, tmp):
    g = {"name": "e", "models": rng.sample(["llama2-7b", "llama3-8b", "mixtral-8x7b", "edge.json"], rng.randint(1, 2)),
         "gpus": rng.sample(["h100", "mi355x", "b200"], rng.randint(1, 2)), "nodes": rng.sample([1, 2, 3, 8], rng.randint(1, 2)),
         "seq_len": [rng.choice([1, 7, 2048, 131072])], "global_batch": [rng.choice([1, 3, 64, 65536])]}
    if rng.random() < 0.5:
        g[rng.choice(["tokens", "price_per_gpu_hour", "framework", "precision", "fp8_param_gather", "calibration", "constraints"])] = rng.choice(
            [1e12, 0, -1, "x", {"h100": -1}, [], True, "tp<=2", ["tp<=2"], "primus", "fp8", float("nan")])
    m = base_model(rng)
    files = {"grid.yaml": dump_yaml(g), "edge.json": jdump(m)}
    return ["sweep", "grid.yaml", "--no-progress", "--json", "--out", "o.csv"] + (["--table"] if rng.random() < 0.3 else []) + \
        (["--plot", "plots"] if rng.random() < 0.3 else []) + (["--resume"] if rng.random() < 0.2 else []), files, {"json": True}


GENS = {"model": g_model_file, "hf": g_hf, "gpu": g_gpu, "calibration": g_calibration, "megatron": g_megatron,
        "primus": g_primus, "primus_real": g_primus_real, "toml": g_toml, "log": g_log, "sweep": g_sweep, "expr": g_expr,
        "cli": g_cli, "outputs": g_outputs, "streams": g_streams, "export": g_export, "edge_model": g_edge_model,
        "edge_cli": g_edge_cli, "runs_csv": g_runs_csv, "sweep_edge": g_sweep_edge}
WEIGHTS = {"model": 10, "hf": 8, "gpu": 7, "calibration": 7, "megatron": 10, "primus": 7, "primus_real": 3, "toml": 4,
           "log": 4, "sweep": 5, "expr": 8, "cli": 10, "outputs": 6, "streams": 5, "export": 4,
           "edge_model": 10, "edge_cli": 10, "runs_csv": 4, "sweep_edge": 4}


def strict_json(text):
    def bad(c):
        raise ValueError(c)
    json.loads(text, parse_constant=bad)


def run_case(argv, files, flags, rng, tmp, kind):
    for name, text in files.items():
        p = Path(tmp) / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8", errors="surrogatepass")
    if flags.get("copytree"):
        src = ROOT / "tests/data/primus/models"
        shutil.copytree(src, Path(tmp) / "models", dirs_exist_ok=True)
    env = dict(os.environ, OPENAI_API_KEY=SECRET, AWS_SECRET_ACCESS_KEY=SECRET2, TUNE_CP_NO_LM="1")
    cmd = ["tune-cp"] + argv
    stream = flags.get("stream")
    t0 = time.time()
    res = {"kind": kind, "argv": argv, "rc": None, "defects": []}
    stdin = subprocess.DEVNULL
    try:
        if stream in (None, "sigint"):
            p = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=preexec)
            if stream == "sigint":
                time.sleep(rng.uniform(0.2, 2.5))
                try:
                    os.kill(p.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
            out, err = p.communicate(timeout=TIMEOUT)
            rc = p.returncode
        elif stream == "full":
            with open("/dev/full", "w") as f:
                p = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=stdin, stdout=f, stderr=subprocess.PIPE, preexec_fn=preexec)
                _, err = p.communicate(timeout=TIMEOUT)
                out = b""
            rc = p.returncode
        elif stream == "errfull":
            with open("/dev/full", "w") as f:
                p = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=f, preexec_fn=preexec)
                out, _ = p.communicate(timeout=TIMEOUT)
                err = b""
            rc = p.returncode
        elif stream == "closed":
            p = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=lambda: (preexec(), os.close(1)))
            _, err = p.communicate(timeout=TIMEOUT)
            out = b""
            rc = p.returncode
        elif stream == "head":
            sh = "set -o pipefail; " + " ".join(subprocess.list2cmdline([c]) for c in cmd) + " | head -1"
            p = subprocess.Popen(["bash", "-c", sh], cwd=tmp, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=preexec)
            out, err = p.communicate(timeout=TIMEOUT)
            rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        rc = "timeout"
        res["defects"].append("timeout")
    dt = time.time() - t0
    out_s = out.decode("utf-8", "replace")
    err_s = err.decode("utf-8", "replace")
    res.update(rc=rc, time=round(dt, 2), stderr=err_s[-600:], stdout=out_s[:300])
    if rc == 3 or "internal error" in err_s:  # (a sweep worker's, under exit 1, too)
        res["defects"].append("exit3")
    if "Traceback" in err_s or "Traceback" in out_s:
        res["defects"].append("traceback")
    if "MemoryError" in err_s or rc == -9:
        res["defects"].append("memory")
    if isinstance(rc, int) and rc < 0 and rc != -9:
        res["defects"].append(f"signal{-rc}")
    if stream == "head" and rc not in (0, 141):
        res["defects"].append("pipe-exit")
    if stream == "sigint" and rc not in (130, 0, 1, 2) and rc != "timeout":
        res["defects"].append("sigint-exit")
    if stream == "sigint" and "did not finish within" in err_s:
        res["defects"].append("sigint-message")
    leak = False
    for s in (SECRET, SECRET2):
        if s in out_s or s in err_s:
            leak = True
    for f in Path(tmp).rglob("*"):
        try:
            if f.is_file() and f.name not in files and f.stat().st_size < 50 * 2**20:
                b = f.read_bytes()
                if SECRET.encode() in b or SECRET2.encode() in b:
                    leak = True
        except OSError:
            pass
    # the export case where the secret is literally on the command line is not a leak from the environment
    if leak and not any(SECRET in a or SECRET2 in a for a in argv) and not any(SECRET in t for t in files.values()):
        res["defects"].append("secret")
    if flags.get("json") and "--json" in argv and rc in (0, 1, 2) and out_s.strip() and stream is None:
        try:
            strict_json(out_s)
        except Exception as e:  # noqa: BLE001
            res["defects"].append("json")
            res["json_err"] = str(e)[:100]
    if "\x1b]" in err_s or "\x1b]" in out_s.replace("\\u001b", ""):
        res["defects"].append("escape")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=600)
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--kinds", default="")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    kinds = [k for k in (a.kinds.split(",") if a.kinds else GENS)]
    weights = [WEIGHTS[k] for k in kinds]
    results = []
    t_start = time.time()
    for i in range(a.cases):
        kind = rng.choices(kinds, weights)[0]
        tmp = tempfile.mkdtemp(prefix="att-")
        try:
            argv, files, flags = GENS[kind](rng, tmp)
            try:
                r = run_case(argv, files, flags, rng, tmp, kind)
            except OSError as e:  # E2BIG: an argument past the kernel's 128 KiB; not tune-cp's
                r = {"kind": kind, "argv": argv, "rc": "E2BIG" if e.errno == 7 else "harness",
                     "defects": [], "time": 0, "stderr": str(e)}
        finally:
            for d in Path(tmp).rglob("*"):
                try:
                    if d.is_dir():
                        os.chmod(d, 0o700)
                except OSError:
                    pass
            shutil.rmtree(tmp, ignore_errors=True)
        r["i"] = i
        results.append(r)
        if r["defects"] and a.verbose:
            print(f"[{i}] {kind} rc={r['rc']} {r['defects']} {r['time']}s argv={[x[:80] for x in argv]}\n   {r['stderr'][-300:]!r}", flush=True)
    by_kind = defaultdict(Counter)
    defects = Counter()
    for r in results:
        by_kind[r["kind"]][str(r["rc"])] += 1
        for d in r["defects"]:
            defects[(r["kind"], d)] += 1
    print(f"\n{len(results)} cases in {time.time() - t_start:.0f} s, seed {a.seed}")
    print(f"{'kind':<12} {'cases':>5}  exit codes")
    for k in sorted(by_kind):
        c = by_kind[k]
        print(f"{k:<12} {sum(c.values()):>5}  " + "  ".join(f"{rc}:{n}" for rc, n in sorted(c.items())))
    print("\ndefects by class:" + ("" if defects else " none"))
    tot = Counter()
    for (k, d), n in sorted(defects.items()):
        print(f"  {d:<14} {k:<12} {n}")
        tot[d] += n
    print("totals: " + (", ".join(f"{d}={n}" for d, n in sorted(tot.items())) or "0 defects"))
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1, default=str))
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
