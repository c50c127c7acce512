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


@dataclass(frozen=True)
class Case:
    kind: str
    args: tuple[str, ...]

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
                 "/sys/x.png", ".png", "/"]
    out: list[Case] = []
    for _ in range(n):
        kind = rng.choice(("int flag", "float flag", "overhead", "model file", "gpu file",
                           "calibration file", "primus file", "constraint", "prefer",
                           "output path", "baseline", "price", "runs file")
                          + (("model search", "cluster size", "primus mutation") if heavy
                             else ()))
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
            flag = rng.choice(("--pareto", "--trials-out"))
            args = (*SEARCH, flag, rng.choice(out_paths), *js)
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
        else:  # runs file
            args = ("calibrate", "--runs", rng.choice(paths + specials), "--out",
                    rng.choice(out_paths + ["ok.json"]), *js)
        out.append(Case(kind, args))
    return out


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
