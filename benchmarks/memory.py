"""Per-GPU peak memory of published runs beside tune-cp's memory model.

Every row of ``published_runs.csv`` with a ``peak_mem`` figure that :mod:`formats.runs` can
represent is evaluated with :func:`oracle.memory.memory_report` (default overheads, no margin)
and printed beside the published figure, with what that figure measures (its
``peak_mem_note``): torchtitan prints PyTorch's peak *reserved* memory, FlagPerf an
``nvidia-smi`` reading, Megatron-LM PR #482 the peak allocated memory of rank 0. None of them
is the same quantity as tune-cp's model of a Megatron-LM rank (allocated bytes plus the named
runtime terms), and the rows leave settings unstated (see the ``notes`` column), so the table
is evidence about the memory model, not a calibration target: nothing is fitted to it.

Also prints, for the rows with a measured throughput whose recompute column is blank, how many
would need more than the GPU's HBM without recomputation by tune-cp's count (the published
configuration ran, so it fit).

    PYTHONPATH=. python benchmarks/memory.py [--runs FILE.csv]
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from formats.runs import read_runs  # noqa: E402
from oracle.memory import MemoryOverheads, memory_report  # noqa: E402
from oracle.specs import GIB  # noqa: E402

GB = 10**9


def published_gib(text: str, note: str) -> float | None:
    """The published peak in GiB: the first number of the column; "GB" in the note is read as
    10^9 bytes, anything else (GiB, PyTorch's and nvidia-smi's units) as GiB."""
    m = re.search(r"\d+(?:\.\d+)?", text)
    if not m:
        return None
    value = float(m.group(0))
    unit_gb = re.search(r"\bGB\b", text + " " + note) and not re.search(r"GiB", text + note)
    return value * GB / GIB if unit_gb else value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(ROOT / "benchmarks" / "published_runs.csv"))
    args = ap.parse_args(argv)
    raw = {r["row_id"]: r for r in csv.DictReader(open(args.runs, newline=""))}
    rows = read_runs(args.runs)

    print(f"runs file: {args.runs}\n")
    print("== Published peak memory per GPU beside tune-cp (GiB) ==")
    head = ("row", "source", "model", "gpu", "layout", "mbs", "recompute", "prec", "published",
            "tune-cp", "diff", "what the published figure is")
    table = []
    skipped = []
    for r in rows:
        src = raw.get(r.row_id, {})
        if not src.get("peak_mem", "").strip():
            continue
        if not r.representable:
            skipped.append((r.row_id, r.reason or ""))
            continue
        pub = published_gib(src["peak_mem"], src.get("peak_mem_note", ""))
        if pub is None:
            skipped.append((r.row_id, f"peak_mem not a number ({src['peak_mem']!r})"))
            continue
        ours = memory_report(r.model, r.cluster, r.training, r.cfg).peak_bytes / GIB
        fsdp = " FSDP" if r.cfg.fsdp else ""
        table.append((r.row_id, r.source_id, r.model.name, r.cluster.gpu.name,
                      r.cfg.label().replace(" ", "") + fsdp, str(r.cfg.mbs),
                      r.cfg.recompute.value, r.training.precision.value, f"{pub:.1f}",
                      f"{ours:.1f}", f"{ours / pub - 1:+.0%}",
                      (src.get("peak_mem_note", "") or src["peak_mem"])[:60]))
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for t in table:
        print("  ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)))
    for row_id, why in skipped:
        print(f"row {row_id}: not representable ({why})")
    if table:
        diffs = sorted(float(t[10].rstrip("%")) for t in table)
        print(f"\n{len(table)} rows; tune-cp minus published: median {diffs[len(diffs) // 2]:+.0f}%, "
              f"range {diffs[0]:+.0f}% to {diffs[-1]:+.0f}%")

    print("\n== Published configurations without a stated recompute that tune-cp says need more "
          "than HBM without it ==")
    over = []
    bf16_fits = bf16_nofrag_fits = 0
    blank = 0
    no_frag = MemoryOverheads(fragmentation=0.0)
    for r in rows:
        src = raw.get(r.row_id, {})
        if not r.representable or r.measured_tokens_per_s_per_gpu is None:
            continue
        if src.get("recompute", "").strip():
            continue
        blank += 1
        hbm = r.cluster.gpu.hbm_bytes
        ratio = memory_report(r.model, r.cluster, r.training, r.cfg).peak_bytes / hbm
        if ratio <= 1:
            continue
        over.append(ratio)
        bf16 = r.cfg.model_copy(update={"grad_reduce_in_fp32": False})
        bf16_fits += memory_report(r.model, r.cluster, r.training, bf16).peak_bytes <= hbm
        bf16_nofrag_fits += memory_report(r.model, r.cluster, r.training, bf16,
                                          no_frag).peak_bytes <= hbm
    over.sort()
    if over:
        print(f"{len(over)} of {blank} rows with a blank recompute column: peak / HBM from "
              f"{over[0]:.2f} to {over[-1]:.2f} (median {over[len(over) // 2]:.2f}); of these, "
              f"{bf16_fits} fit with bf16 gradient buffers (--grad-reduce-in-bf16) and "
              f"{bf16_nofrag_fits} with bf16 gradients and no fragmentation allowance")
    else:
        print(f"none of {blank} rows with a blank recompute column")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
