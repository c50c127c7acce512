"""Write ``benchmarks/amd_published_runs.csv`` from ``../shared/calibration/amd_published_runs.csv``.

The shared file (14 rows of AMD's ROCm PyTorch training container v25.2 README, MI300X / MI325X,
one node, FSDP) is copied cell for cell except:

* ``row_id``: empty in the source; each row gets ``amd-N`` (N = its line in the source, 1-14),
  stable as long as the source's rows keep their order;
* ``tokens_per_sec_per_gpu`` of the six rows that publish only TFLOPS/s/GPU, derived from the
  source's own FLOPs-per-token formula (the two stacks report TFLOPS/s/GPU as
  ``flops_per_token x tokens/s/GPU / 1e12``, so tokens/s/GPU = ``TFLOPS x 1e12 /
  flops_per_token``), rounded to a whole token as the transcriber's eight rows are:

  - plain PyTorch FSDP (``train_fsdp.py`` of AMD-AIG-AIMA/pytorch-training-benchmark @c295aae):
    ``flops_per_iter = model_config.flops_per_token * batch * max_seq_len`` (train_fsdp.py
    l.140), TFLOP/s = ``flops_per_iter / iter_time`` (l.189); ``flops_per_token`` is
    ``MistralConfig.estimate_flops_per_token`` (mistral.py l.49-83): per token ``3 x (L (6 h
    f + 2 h (a + 2 k) d + 2 h a d) + 2 h V) + 3 x L x 4 W a d`` with the sliding window ``W =
    min(window_size, s)`` (mistral.py l.29-41; ``configs/mistral-7b-v0.1.json``: window_size
    1024, max_seq_len 8192); Llama's (llama.py l.20-58) is the same with ``W = s``
    (non-causal);
  - torchtitan (Llama 3.1 70B): ``get_num_flop_per_token`` (torchtitan/utils.py l.274-289 at
    ROCm/torchtitan d4c86e3, 2025-01-30): ``6 N + 12 L a d s`` with ``N`` the parameters
    without the input embedding (``get_num_params(exclude_embedding=True)``, utils.py
    l.267-271; the output projection is counted); TFLOP/s = ``num_flop_per_token x tps / 1e12``
    (train.py, upstream 4e32663 "Add tflops to metrics"; AMD's modified copy is not published,
    the row is read with the upstream definition);

* ``global_batch_size`` of the two torchtitan rows: the local batch x 8 (torchtitan of that
  date has no gradient accumulation: its global batch is ``batch_size x dp_degree``, train.py
  l.246-247 at d4c86e3), stated in ``derived_fields``.

Each derivation is appended to the row's ``derived_fields``. Nothing else is changed; no
measurement is invented. Run ``python benchmarks/amd_runs.py`` to rewrite the copy.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "calibration" / "amd_published_runs.csv"
OUT = ROOT / "benchmarks" / "amd_published_runs.csv"
#: the shared file's own location (the worktree's ``../shared`` may not exist)
SHARED_FALLBACK = Path("/work/shared/calibration/amd_published_runs.csv")

#: Mistral 7B's sliding window in the benchmark's config (configs/mistral-7b-v0.1.json @c295aae)
TRAIN_FSDP_MISTRAL_WINDOW = 1024


def train_fsdp_flops_per_token(layers: int, hidden: int, ffn: int, heads: int, kv_heads: int,
                               vocab: int, seq: int, window: int | None = None) -> int:
    """``estimate_flops_per_token`` of train_fsdp.py's model configs (llama.py l.20-58;
    mistral.py l.27-83 with ``window``): forward x 3, attention over ``min(window, s)`` keys
    (Llama: all ``s``, no causal halving)."""
    d = hidden // heads
    ffn_flops = 2 * ffn * hidden * 2 + 2 * ffn * hidden
    qkv = 2 * hidden * (heads + 2 * kv_heads) * d
    proj = 2 * hidden * heads * d
    embedding = 2 * hidden * vocab
    keys = seq if window is None else min(window, seq)
    attention = 4 * keys * heads * d
    return 3 * ((ffn_flops + qkv + proj) * layers + embedding) + 3 * attention * layers


def torchtitan_llama_params(layers: int, hidden: int, ffn: int, heads: int, kv_heads: int,
                            vocab: int) -> int:
    """torchtitan's Llama 3 parameters without the input embedding (utils.get_num_params with
    exclude_embedding=True): per layer wq, wk, wv, wo, w1, w2, w3 and two RMSNorm weights; the
    final norm and the (untied) output projection."""
    d = hidden // heads
    attn = hidden * heads * d + 2 * hidden * kv_heads * d + heads * d * hidden
    layer = attn + 3 * hidden * ffn + 2 * hidden
    return layers * layer + hidden + vocab * hidden


def torchtitan_flops_per_token(layers: int, hidden: int, ffn: int, heads: int, kv_heads: int,
                               vocab: int, seq: int) -> int:
    """torchtitan's ``get_num_flop_per_token``: ``6 N + 12 L a d s``."""
    n = torchtitan_llama_params(layers, hidden, ffn, heads, kv_heads, vocab)
    return 6 * n + 12 * layers * heads * (hidden // heads) * seq


def flops_per_token(row: dict[str, str]) -> tuple[int, str]:
    """The source's FLOPs per token for a row and how it was computed."""
    arch = [int(row[k]) for k in ("num_layers", "hidden_size", "ffn_hidden_size",
                                  "num_attention_heads", "num_kv_heads", "vocab_size")]
    seq = int(row["seq_len"])
    if "torchtitan" in row["framework"].lower():
        f = torchtitan_flops_per_token(*arch, seq)
        how = (f"torchtitan get_num_flop_per_token = 6 N + 12 L a d s with N = "
               f"{torchtitan_llama_params(*arch):,} parameters without the input embedding "
               f"(= {f:.4e} FLOP/token at seq {seq})")
    elif "mistral" in row["model"].lower():
        f = train_fsdp_flops_per_token(*arch, seq, window=TRAIN_FSDP_MISTRAL_WINDOW)
        how = (f"mistral.py estimate_flops_per_token with window_size "
               f"{TRAIN_FSDP_MISTRAL_WINDOW} (configs/mistral-7b-v0.1.json; = {f:.4e} "
               f"FLOP/token at seq {seq}; attention over min(window, s) keys)")
    else:
        f = train_fsdp_flops_per_token(*arch, seq)
        how = f"llama.py estimate_flops_per_token (= {f:.4e} FLOP/token at seq {seq})"
    return f, how


def derived_tokens_per_s(row: dict[str, str]) -> int:
    """tokens/s/GPU = TFLOPS/s/GPU x 1e12 / FLOPs per token, to a whole token."""
    f, _ = flops_per_token(row)
    return round(float(row["model_tflops_per_gpu"]) * 1e12 / f)


def derive(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    out = []
    for i, src in enumerate(rows, 1):
        r = dict(src)
        r["row_id"] = f"amd-{i}"
        added = []
        if not r["tokens_per_sec_per_gpu"].strip() and r["model_tflops_per_gpu"].strip():
            _, how = flops_per_token(r)
            r["tokens_per_sec_per_gpu"] = str(derived_tokens_per_s(r))
            added.append(f"tokens_per_sec_per_gpu = TFLOPS*1e12 / flops_per_token (derived by "
                         f"tune-cp benchmarks/amd_runs.py) from {how}")
        if "torchtitan" in r["framework"].lower() and not r["global_batch_size"].strip():
            gbs = int(r["micro_batch_size"]) * int(r["num_gpus"])
            r["global_batch_size"] = str(gbs)
            added.append(f"global_batch_size = local batch x 8 = {gbs} (torchtitan "
                         f"global batch = batch_size x dp_degree, no gradient accumulation; "
                         f"derived by tune-cp benchmarks/amd_runs.py)")
        if added:
            r["derived_fields"] = "; ".join([x for x in [r["derived_fields"].strip()] if x]
                                            + added)
        out.append(r)
    return out


def main() -> int:
    src = SHARED if SHARED.exists() else SHARED_FALLBACK
    text = src.read_text(encoding="utf-8")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    fields = list(reader.fieldnames or [])
    rows = derive(list(reader))
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\r\n")
    w.writeheader()
    w.writerows(rows)
    OUT.write_text(buf.getvalue(), encoding="utf-8", newline="")
    print(f"wrote {OUT.relative_to(ROOT)} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
