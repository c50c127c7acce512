"""A fuzz campaign against the command line, one subprocess per case (issue 16).

    python benchmarks/fuzz.py [--cases N] [--seed S] [--timeout 60] [--memory-gib 1] [--jobs 1]

Cases come from ``tests/fuzzing.py`` (malformed flags, files, expressions, output paths), plus
the runaway reproducers of issue 16 (a 100,000-layer model, ``--baseline vpp=100000``,
``--moe-layer-freq '[1]*300000000'``, slow explanations, ...). Each case runs as
``python cli.py ARGS`` in a scratch directory with a wall-clock limit (``--timeout``, default
60 s) and an address-space limit (``resource.setrlimit(RLIMIT_AS)``, default 1 GiB). Prints a
table of exit codes per kind of input, the defects (exit 3, a traceback, more than one error
line, invalid JSON under ``--json``, a time-out, running out of memory) and the slowest cases.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fuzzing import Case, cases, defects  # noqa: E402


def runaway_cases(tmp: Path) -> list[Case]:
    """The runaway-time/memory reproducers of issue 16 (each used to run past 60 s or 1 GB)."""
    ds = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
          "num_hidden_layers": 100000, "vocab_size": 129280, "intermediate_size": 18432,
          "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
          "n_shared_experts": 1, "first_k_dense_replace": 3, "kv_lora_rank": 512,
          "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
          "v_head_dim": 128}
    mx = {"model_type": "mixtral", "hidden_size": 4096, "num_attention_heads": 32,
          "num_key_value_heads": 8, "num_hidden_layers": 100000, "vocab_size": 32000,
          "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2}
    files = {"ds100k.json": ds, "mx100k.json": mx, "dsvocab.json": ds | {
        "num_hidden_layers": 61, "vocab_size": 2**28}}
    for name, data in files.items():
        (tmp / name).write_text(json.dumps(data))
    llama = ("--model", "llama3-8b")
    megatron = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --vocab-size 32000 "
                "--num-experts 8 --moe-layer-freq ")
    lines = [
        (*llama, "--gpu", "h100", "--nodes", "2", "--baseline", "vpp=100000"),
        ("--model", str(tmp / "ds100k.json"), "--gpu", "mi355x", "--nodes", "1"),
        ("--model", str(tmp / "mx100k.json"), "--gpu", "mi355x", "--nodes", "1"),
        ("--model", str(tmp / "dsvocab.json"), "--gpu", "mi355x", "--nodes", "1"),
        (*llama, "--nodes", "1", "--gpus-per-node", "1000"),
        (*llama, "--nodes", "3", "--gbs", "1073741824"),
        ("--model", "kimi-k2", "--gpu", "a100", "--nodes", "16"),
        ("--model", "deepseek-v3", "--gpu", "mi355x", "--nodes", "1"),
        (*llama, "--gpu", "a100", "--nodes", "1", "--precision", "fp4",
         "--all-recompute-levels"),
        ("check", "--nodes", "1", "--megatron-args", megatron + "'[1]*300000000'"),
        ("check", "--nodes", "1", "--megatron-args", megatron + "'[0]*100000000000'"),
        (*llama, "--nodes", "1", "--constraint", " and ".join(["tp <= 8"] * 3000)),
        ("--model", "/dev/zero", "--nodes", "1"),
        (*llama, "--gpu", "/dev/urandom", "--nodes", "1"),
    ]
    return [Case("runaway", tuple(x)) for x in lines]


def limit(memory_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    return apply


def run_case(case: Case, cwd: Path, timeout_s: float, memory_bytes: int) -> dict:
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, str(ROOT / "cli.py"), *case.args], cwd=cwd,
                           capture_output=True, text=True, timeout=timeout_s,
                           stdin=subprocess.DEVNULL, preexec_fn=limit(memory_bytes),
                           env=os.environ | {"PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        return {"case": case, "code": "timeout", "wall_s": time.monotonic() - t0,
                "defects": ["ran past the time limit"], "err": ""}
    found = defects(p.returncode, p.stdout, p.stderr, case.args)
    if "MemoryError" in p.stderr or p.returncode in (-9, 137):
        found.append("out of memory")
    return {"case": case, "code": p.returncode, "wall_s": time.monotonic() - t0,
            "defects": found, "err": p.stderr.strip()[:160]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=600)
    ap.add_argument("--seed", type=int, default=2016)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--memory-gib", type=float, default=1.0)
    ap.add_argument("--no-runaway", action="store_true", help="leave out the runaway cases")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        todo = cases(args.seed, args.cases, tmp)
        if not args.no_runaway:
            todo += runaway_cases(tmp)
        results = []
        t0 = time.monotonic()
        for i, case in enumerate(todo, 1):
            results.append(run_case(case, tmp, args.timeout, int(args.memory_gib * 2**30)))
            if i % 50 == 0:
                print(f"  {i}/{len(todo)} cases, {time.monotonic() - t0:.0f} s", file=sys.stderr)
    kinds = sorted({r["case"].kind for r in results})
    codes = ["0", "1", "2", "3", "timeout", "other"]

    def col(r: dict) -> str:
        c = str(r["code"])
        return c if c in codes else "other"

    print(f"fuzz campaign: {len(results)} cases (seed {args.seed}), limits {args.timeout:g} s and "
          f"{args.memory_gib:g} GiB per run, {time.monotonic() - t0:.0f} s in all")
    print(f"{'kind':18}" + "".join(f"{c:>9}" for c in codes) + f"{'defects':>9}")
    for k in [*kinds, "all"]:
        rows = [r for r in results if k in ("all", r["case"].kind)]
        print(f"{k:18}" + "".join(f"{sum(1 for r in rows if col(r) == c):>9}" for c in codes)
              + f"{sum(1 for r in rows if r['defects']):>9}")
    bad = [r for r in results if r["defects"]]
    print(f"\ndefects: {len(bad)}")
    for r in bad[:30]:
        print(f"  {', '.join(r['defects'])}: {r['case'].line()[:110]} -> {r['err'][:100]}")
    print("\nslowest cases (wall s, exit, command line):")
    for r in sorted(results, key=lambda r: -r["wall_s"])[:10]:
        print(f"  {r['wall_s']:6.1f} {str(r['code']):>7}  {r['case'].line()[:110]}")


if __name__ == "__main__":
    main()
