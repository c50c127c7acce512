"""A fuzz campaign against the command line, one subprocess per case (issue 16).

    python benchmarks/fuzz.py [--cases N] [--seed S] [--timeout 60] [--memory-gib 1]
                              [--light] [--no-runaway] [--batch N] [--only KIND,...]

Cases come from ``tests/fuzzing.py`` (malformed flags, files, expressions, output paths; and,
unless ``--light``, searches of extreme models and cluster sizes and mutated Primus YAMLs),
plus the runaway reproducers of issue 16 (a 100,000-layer model, ``--baseline vpp=100000``,
``--moe-layer-freq '[1]*300000000'``, slow explanations, ...) and those of issue 29's
data-input classes (``issue29_cases``: extreme shapes, tiny GPU rates, config.json strings,
quoted numbers, calibration headers of the wrong shape, torchtitan TOMLs); every such case
must end in exit 1 or 2 (an input the issue found accepted must now be refused). Each case runs as
``python cli.py ARGS`` in a scratch directory with a wall-clock limit (``--timeout``, default
60 s) and an address-space limit (``resource.setrlimit(RLIMIT_AS)``, default 1 GiB).
``--batch N`` (N > 1) runs the cases of the light kinds N to a process instead (``cli.run``
in a fresh process per batch, each case under the same wall-clock limit by ``SIGALRM``): the
interpreter's start-up is most of what a light case costs, so a campaign of thousands fits in
minutes on a shared machine; the heavy kinds and the runaway cases still get a process each.
Prints a table of exit codes per kind of input, the defects (exit 3, a traceback, more than one
error line, invalid JSON under ``--json``, a time-out, running out of memory) and the slowest
cases.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fuzzing import FUZZ_SECRET, HEAVY, LIGHT, SECRET_VARS, Case, cases, defects  # noqa: E402


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


def issue29_cases(tmp: Path) -> list[Case]:
    """The reproducers of issue 29's data-input classes (each was exit 3 or accepted silently):
    every dimension at its documented maximum, huge MLA ranks, GPU rates of 1e-300 and 5e-324,
    config.json strings and zeros, a quoted number, a key twice, calibration headers of the
    wrong shape, a torchtitan TOML with tp 0 / nan / a datetime."""
    m = 1 << 24
    maximal = {"name": "big", "num_layers": 512, "hidden_size": m, "ffn_hidden_size": m,
               "num_attention_heads": m, "num_kv_heads": m, "head_dim": m, "vocab_size": 1 << 28}
    ds = {"model_type": "deepseek_v3", "hidden_size": 2048, "num_attention_heads": 16,
          "num_hidden_layers": 8, "vocab_size": 129280, "intermediate_size": 8192,
          "n_routed_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 512,
          "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": m,
          "q_lora_rank": m, "qk_nope_head_dim": 1 << 23, "qk_rope_head_dim": 64,
          "v_head_dim": m}
    gpu = {"name": "g", "hbm_gib": 80, "peak_bf16_tflops": 900, "hbm_tb_per_s": 3,
           "scale_up_gb_per_s": 450, "scale_up_domain_gpus": 8, "nic_gb_per_s": 50}
    llama = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
             "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
             "intermediate_size": 14336}
    files: dict[str, object] = {
        "maximal.json": maximal, "mla.json": ds,
        "tiny.json": gpu | {k: 1e-300 for k in ("peak_bf16_tflops", "hbm_tb_per_s",
                                                "scale_up_gb_per_s", "nic_gb_per_s")},
        "denormal.json": gpu | {k: 5e-324 for k in ("peak_bf16_tflops", "hbm_tb_per_s",
                                                    "scale_up_gb_per_s", "nic_gb_per_s")},
        "theta.json": llama | {"rope_theta": "big"}, "eps.json": llama | {"rms_norm_eps": "tiny"},
        "scaling.json": llama | {"rope_scaling": {"rope_type": "llama3", "factor": "x"}},
        "scaling_str.json": llama | {"rope_scaling": "llama3"},
        "kv0.json": llama | {"num_key_value_heads": 0}, "theta0.json": llama | {"rope_theta": 0},
        "relu.json": ds | {"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                           "v_head_dim": 128, "scoring_func": "relu"},
        "groups.json": ds | {"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                             "v_head_dim": 128, "n_group": 4, "topk_group": 8},
    }
    for name, data in files.items():
        (tmp / f"i29_{name}").write_text(json.dumps(data))
    (tmp / "i29_quoted.yaml").write_text("name: s\nnum_layers: '8'\nhidden_size: 1024\n"
                                         "ffn_hidden_size: 4096\nnum_attention_heads: 8\n"
                                         "num_kv_heads: 8\nhead_dim: 128\nvocab_size: 32000\n")
    (tmp / "i29_true.yaml").write_text((tmp / "i29_quoted.yaml").read_text().replace(
        "'8'", "true"))
    (tmp / "i29_twice.json").write_text('{"name": "s", "num_layers": 8, "num_layers": 4, '
                                        '"hidden_size": 1024, "ffn_hidden_size": 4096, '
                                        '"num_attention_heads": 8, "num_kv_heads": 8, '
                                        '"head_dim": 128, "vocab_size": 32000}')
    cal = json.loads((ROOT / "oracle/catalog/calibration.json").read_text())
    for name, change in (("fo_list", {"fitted_on": [1]}), ("fo_int", {"fitted_on": 3}),
                         ("res", {"fitted_on": cal["fitted_on"] | {"user_residuals": ["x"] * 9}}),
                         ("gpus", {"fitted_on": cal["fitted_on"] | {"gpus_fitted": [[1]]}})):
        (tmp / f"i29_cal_{name}.json").write_text(json.dumps(cal | change))
    toml = (ROOT / "tests/data/logs/torchtitan_llama3_8b_fsdp8.toml").read_text()
    for name, value in (("tp0", "0"), ("nan", "nan"), ("date", "1979-05-27T07:32:00Z")):
        (tmp / f"i29_{name}.toml").write_text(toml.replace("tensor_parallel_degree = 1",
                                                           f"tensor_parallel_degree = {value}"))
    t = str(tmp)
    check = ("check", "--gpu", "h100", "--nodes", "1")
    lines = [("--model", f"{t}/i29_maximal.json", "--gpu", "h100", "--nodes", "1"),
             ("plan", "--model", f"{t}/i29_maximal.json", "--max-nodes", "2", "--points", "1"),
             ("--model", f"{t}/i29_mla.json", "--gpu", "h100", "--nodes", "1"),
             ("check", "--model", "llama3-8b", "--nodes", "1", "--gpu", f"{t}/i29_tiny.json"),
             ("check", "--model", "llama3-8b", "--nodes", "1", "--gpu", f"{t}/i29_denormal.json"),
             *[(*check, "--model", f"{t}/i29_{n}") for n in (
                 "theta.json", "eps.json", "scaling.json", "scaling_str.json", "kv0.json",
                 "theta0.json", "relu.json", "groups.json", "quoted.yaml", "true.yaml",
                 "twice.json")],
             (*check, "--model", "llama3-8b", "--constraint", "tp <= 1_000"),
             *[(*check, "--model", "llama3-8b", "--calibration", f"{t}/i29_cal_{n}.json")
               for n in ("fo_list", "fo_int", "res", "gpus")],
             *[("plan", "--model", "llama3-8b", "--max-nodes", "1", "--points", "1",
                "--calibration", f"{t}/i29_cal_{n}.json") for n in ("fo_list", "gpus")],
             *[("calibrate", "--log", str(ROOT / "tests/data/logs/torchtitan_issue1287.log"),
                "--gpu", "h100", "--model", "llama3-8b", "--nodes", "1", "--config",
                f"{t}/i29_{n}.toml") for n in ("tp0", "nan", "date")]]
    return [Case("issue 29", tuple(x)) for x in lines]


#: The children's environment: the caller's PYTHONPATH (where ``tune_cp`` is importable, e.g. a
#: link to this checkout) and the checkout itself (``tests.fuzzing``), and a secret under the
#: names the generated files reference (issue 29: it must never appear in any output).
ENV = os.environ | {"PYTHONPATH": os.pathsep.join(
    x for x in (os.environ.get("PYTHONPATH"), str(ROOT)) if x)} | dict.fromkeys(SECRET_VARS,
                                                                              FUZZ_SECRET)


def limit(memory_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    return apply


def _children_cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


#: A console script as some installs write it, ``sys.exit(entry())`` with no ``__main__``
#: guard: the "sweep workers" cases run through it (issue 29's independent campaign: its
#: forkserver/spawn workers re-ran the command and died bootstrapping).
UNGUARDED = "import sys\nfrom tune_cp.cli import entry\nsys.exit(entry())\n"


def _launcher(case: Case, cwd: Path) -> list[str]:
    if case.kind != "sweep workers":
        return [sys.executable, str(ROOT / "cli.py")]
    script = cwd / "tune-cp-unguarded"
    if not script.exists():
        script.write_text(UNGUARDED)
    return [sys.executable, str(script)]


def run_case(case: Case, cwd: Path, timeout_s: float, memory_bytes: int) -> dict:
    """One case in its own process; ``cpu_s``: the process's CPU time (a niced campaign on a
    loaded machine waits far longer than it computes)."""
    if case.stdout != "pipe" or case.interrupt_s is not None:
        return run_stream_case(case, cwd, timeout_s, memory_bytes)
    t0, c0 = time.monotonic(), _children_cpu_s()
    try:
        p = subprocess.run([*_launcher(case, cwd), *case.args], cwd=cwd,
                           capture_output=True, text=True, timeout=timeout_s,
                           stdin=subprocess.DEVNULL, preexec_fn=limit(memory_bytes),
                           env=ENV)
    except subprocess.TimeoutExpired:
        return {"case": case, "code": "timeout", "wall_s": time.monotonic() - t0,
                "cpu_s": None, "defects": ["ran past the time limit"], "err": ""}
    found = defects(p.returncode, p.stdout, p.stderr, case.args)
    if case.kind == "issue 29" and p.returncode == 0:
        found.append("accepted (exit 0) though it must be refused")
    if "MemoryError" in p.stderr or p.returncode in (-9, 137):
        found.append("out of memory")
    return {"case": case, "code": p.returncode, "wall_s": time.monotonic() - t0,
            "cpu_s": _children_cpu_s() - c0, "defects": found, "err": p.stderr.strip()[:160]}


def run_stream_case(case: Case, cwd: Path, timeout_s: float, memory_bytes: int) -> dict:
    """A case whose stdout is ``/dev/full`` or a pipe closed before the first line, or that gets
    Ctrl-C (SIGINT) ``interrupt_s`` after its start (issue 29). A closed pipe must end quietly;
    an interrupted run with exit 130 and one line, or as it would have had it ended first."""
    t0, c0 = time.monotonic(), _children_cpu_s()
    out_target = (open("/dev/full", "w") if case.stdout == "full" else  # noqa: SIM115
                  subprocess.DEVNULL if case.stdout == "fd-closed" else subprocess.PIPE)
    apply = limit(memory_bytes)

    def start() -> None:
        apply()
        if case.stdout == "fd-closed":
            os.close(1)  # ``tune-cp >&-``: the child's sys.stdout is None

    p = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), *case.args], cwd=cwd,
                         stdout=out_target, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL, preexec_fn=start, env=ENV)
    if case.stdout == "closed":
        p.stdout.close()
    try:
        if case.interrupt_s is not None:
            try:
                p.wait(timeout=case.interrupt_s)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGINT)
        err = p.stderr.read()
        out = p.stdout.read() if case.stdout == "pipe" else ""
        p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return {"case": case, "code": "timeout", "wall_s": time.monotonic() - t0,
                "cpu_s": None, "defects": ["ran past the time limit"], "err": ""}
    finally:
        if case.stdout == "full":
            out_target.close()
    found = defects(p.returncode, out, err, case.args)
    if case.stdout == "closed" and ("pipe" in err.lower() or "Errno" in err):
        found.append("a closed pipe was not quiet")  # (an input error is still said)
    if p.returncode in (-signal.SIGINT, -9, 137) or "MemoryError" in err:
        found.append("killed by a signal" if p.returncode == -signal.SIGINT else "out of memory")
    return {"case": case, "code": p.returncode, "wall_s": time.monotonic() - t0,
            "cpu_s": _children_cpu_s() - c0, "defects": found, "err": err.strip()[:160]}


#: Runs the cases of a JSON list (argv[1]) with ``cli.run`` in this process, one JSON line of
#: results per case on stdout; a case past argv[2] seconds is stopped by SIGALRM.
BATCH = """
import contextlib, io, json, signal, sys, time
sys.setrecursionlimit(10000)
from tune_cp import cli
from click.testing import CliRunner
from tests.fuzzing import defects
cases, limit = json.load(open(sys.argv[1])), float(sys.argv[2])
class Late(BaseException):
    pass
def late(*_):
    raise Late()
signal.signal(signal.SIGALRM, late)
runner = CliRunner()
for args in cases:
    t0 = time.monotonic()
    with runner.isolation() as (out, err, _):
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            code = cli.run(list(args))
        except Late:
            code = "timeout"
        except MemoryError:
            code = "memory"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    found = [] if code in ("timeout", "memory") else defects(code, stdout, stderr, tuple(args))
    print(json.dumps({"code": code, "defects": found, "err": stderr[:160],
                      "wall_s": time.monotonic() - t0}), flush=True)
"""

LIGHT_KINDS = frozenset(LIGHT)


def run_batch(batch: list[Case], cwd: Path, timeout_s: float, memory_bytes: int) -> list[dict]:
    """The cases of ``batch`` in one process (``BATCH``); a case the process did not report
    (it died) is a defect of its own."""
    listing = cwd / "batch.json"
    listing.write_text(json.dumps([list(c.args) for c in batch]))
    p = subprocess.run([sys.executable, "-c", BATCH, str(listing), str(timeout_s)], cwd=cwd,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL,
                       preexec_fn=limit(memory_bytes),
                       env=ENV,
                       timeout=timeout_s * (len(batch) + 1))
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    out = []
    for case, got in zip(batch, lines + [None] * (len(batch) - len(lines)), strict=True):
        if got is None:
            out.append({"case": case, "code": "other", "wall_s": 0.0,
                        "defects": [f"batch process ended ({p.returncode})"],
                        "err": p.stderr.strip()[-160:]})
            continue
        code = got["code"]
        found = {"timeout": ["ran past the time limit"], "memory": ["out of memory"]}.get(
            code, got["defects"])
        out.append({"case": case, "code": code, "wall_s": got["wall_s"], "cpu_s": None,
                    "defects": found, "err": got["err"].strip()[:160]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=600)
    ap.add_argument("--seed", type=int, default=2016)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--memory-gib", type=float, default=1.0)
    ap.add_argument("--no-runaway", action="store_true",
                    help="leave out the runaway cases (issue 16) and issue 29's reproducers")
    ap.add_argument("--light", action="store_true",
                    help="only the kinds of the bounded test (no searches of extreme models, "
                    "clusters or mutated Primus YAMLs)")
    ap.add_argument("--batch", type=int, default=1,
                    help="light cases per process (1: a process per case)")
    ap.add_argument("--only", default=None, metavar="KIND,...",
                    help="keep only the cases of these kinds (e.g. 'heavy' for every kind that "
                    "does real work)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        todo = cases(args.seed, args.cases, tmp, heavy=not args.light)
        if args.only:
            keep = {k.strip() for k in args.only.split(",")}
            keep = (keep - {"heavy"}) | (set(HEAVY) if "heavy" in keep else set())
            todo = [c for c in todo if c.kind in keep]
        if not args.no_runaway:
            todo += runaway_cases(tmp) + issue29_cases(tmp)
        results = []
        t0 = time.monotonic()
        mem = int(args.memory_gib * 2**30)
        light = [c for c in todo if c.kind in LIGHT_KINDS] if args.batch > 1 else []
        for i in range(0, len(light), args.batch):
            results += run_batch(light[i:i + args.batch], tmp, args.timeout, mem)
            print(f"  {len(results)}/{len(todo)} cases, {time.monotonic() - t0:.0f} s",
                  file=sys.stderr)
        alone = [c for c in todo if not (args.batch > 1 and c.kind in LIGHT_KINDS)]
        for i, case in enumerate(alone, 1):
            results.append(run_case(case, tmp, args.timeout, mem))
            if i % 50 == 0:
                print(f"  {len(results)}/{len(todo)} cases, {time.monotonic() - t0:.0f} s",
                      file=sys.stderr)
    kinds = sorted({r["case"].kind for r in results})
    codes = ["0", "1", "2", "3", "130", "timeout", "other"]

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
    print("\nslowest cases (wall s, CPU s of a case run in its own process, exit, command line):")
    for r in sorted(results, key=lambda r: -r["wall_s"])[:10]:
        cpu = "-" if r.get("cpu_s") is None else f"{r['cpu_s']:.1f}"
        print(f"  {r['wall_s']:6.1f} {cpu:>6} {str(r['code']):>7}  {r['case'].line()[:110]}")


if __name__ == "__main__":
    main()
