"""Per-GPU peak memory of published runs beside tune-cp's memory model.

Every row of ``published_runs.csv`` with a ``peak_mem`` figure that :mod:`formats.runs` can
represent is evaluated with :func:`oracle.memory.memory_report` (default overheads, no margin)
and printed beside the published figure, with what that figure measures (its
``peak_mem_note``): torchtitan prints PyTorch's peak *reserved* memory, FlagPerf an
``nvidia-smi`` reading, Megatron-LM PR #482 the peak allocated memory of rank 0. None of them
is the same quantity as tune-cp's model of a Megatron-LM rank (allocated bytes plus the named
runtime terms), and the rows leave settings unstated (see the ``notes`` column), so the table
is evidence about the memory model, not a calibration target: nothing is fitted to it.

Also prints, for the rows with a measured throughput whose recompute column is blank, the ones
tune-cp calls out of memory (the published configuration ran, so it fit), twice: from the row's
columns only, and with the memory settings the framework's recipe implies
(:func:`formats.runs.recipe_settings`: Megatron-Bridge's bf16 gradient buffers, FP8 parameters,
DeepSeek-V3's selective recompute). Each remaining one gets a reason: the least recomputation
that fits, else how far over HBM it stays with full recompute and its largest term.

Also prints the overhead spread (measured peak / tune-cp's peak, per framework family:
``megatron`` for Megatron-LM, Megatron-Core, Megatron-Bridge, Primus and their forks,
``torchtitan``) that the three-state verdict reads (``oracle/memory_verdict.py``);
``--write-spread`` writes it to ``oracle/catalog/memory_spread.json``.

    python benchmarks/memory.py [--runs FILE.csv] [--write-spread]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tune_cp.config.specs import GIB, Recompute, RecomputeMethod  # noqa: E402
from tune_cp.formats.runs import read_runs  # noqa: E402
from tune_cp.oracle.memory import MemoryOverheads, memory_report  # noqa: E402
from tune_cp.oracle.memory_verdict import SPREAD_FILE, quantile  # noqa: E402

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


#: selective-recompute modules tried for a row that does not fit (Megatron-Core's module names;
#: ``core_attn`` is Megatron-LM's ``--recompute-activations``)
SELECTIVE_TRIES: tuple[tuple[str, ...], ...] = (
    ("core_attn",), ("core_attn", "layernorm", "mlp"), ("core_attn", "layernorm", "moe"),
)


def overheads(r, use_recipe: bool) -> MemoryOverheads:
    """tune-cp's default overheads, less the fragmentation allowance where the recipe says so."""
    if use_recipe and r.recipe_fragmentation is not None:
        return MemoryOverheads(fragmentation=r.recipe_fragmentation)
    return MemoryOverheads()


def peak(r, cfg, ov: MemoryOverheads) -> int:
    return memory_report(r.model, r.cluster, r.training, cfg, ov).peak_bytes


def oom_reason(r, cfg, ov: MemoryOverheads) -> str:
    """Why a run that ran is called out of memory: the least recomputation that fits (the row
    leaves recompute blank), else how far over HBM it is even with full recompute and its
    largest term."""
    hbm = r.cluster.gpu.hbm_bytes
    for mods in SELECTIVE_TRIES:
        if r.model.is_moe == ("mlp" in mods) and mods != ("core_attn",):
            continue
        sel = cfg.model_copy(update={"recompute": Recompute.SELECTIVE, "recompute_modules": mods})
        got = peak(r, sel, ov)
        if got <= hbm:
            return (f"fits with selective recompute of {', '.join(mods)} ({got / GIB:.1f} GiB; "
                    f"the row leaves recompute blank)")
    full = cfg.model_copy(update={"recompute": Recompute.FULL, "recompute_layers": None,
                                  "recompute_method": RecomputeMethod.UNIFORM})
    rep = memory_report(r.model, r.cluster, r.training, full, ov)
    if rep.peak_bytes <= hbm:
        return (f"fits with full recompute of every layer ({rep.peak_bytes / GIB:.1f} GiB; the "
                f"row leaves recompute blank)")
    terms = rep.peak.terms
    top = max(terms, key=lambda k: terms[k])
    return (f"needs {(rep.peak_bytes - hbm) / GIB:.1f} GiB over HBM even with full recompute; "
            f"largest term {top} {terms[top] / GIB:.1f} GiB")


def oom_table(rows, raw, use_recipe: bool, label: str) -> int:
    """The published runs with a measured throughput and a blank recompute column that tune-cp
    calls out of memory, each with its reason; returns how many."""
    print(f"\n== Published runs without a stated recompute that tune-cp calls out of memory "
          f"({label}) ==")
    blank = 0
    lines = []
    for r in rows:
        src = raw.get(r.row_id, {})
        if not r.representable or r.measured_tokens_per_s_per_gpu is None:
            continue
        if src.get("recompute", "").strip():
            continue
        blank += 1
        cfg = r.recipe_cfg() if use_recipe else r.cfg
        ov = overheads(r, use_recipe)
        hbm = r.cluster.gpu.hbm_bytes
        got = peak(r, cfg, ov)
        if got <= hbm:
            continue
        unmodelled = [n for n in r.recipe_notes if "not modelled" in n] if use_recipe else []
        lines.append((r.row_id, r.model.name, r.cluster.gpu.name,
                      cfg.label().replace(" ", "") + (" FSDP" if cfg.fsdp else ""),
                      f"mbs{cfg.mbs}", r.training.precision.value, f"{got / GIB:.1f}",
                      f"{hbm / GIB:.0f}", "; ".join([*unmodelled, oom_reason(r, cfg, ov)])))
    head = ("row", "model", "gpu", "layout", "mbs", "prec", "tune-cp", "HBM", "reason")
    widths = [max(len(h), *(len(t[i]) for t in lines)) if lines else len(h)
              for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip())
    for t in lines:
        print("  ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)).rstrip())
    print(f"{len(lines)} of {blank} published runs with a blank recompute column called out of "
          f"memory ({label})")
    return len(lines)


def family(framework: str) -> str:
    """The spread family of a row's ``framework`` column (module docstring)."""
    return "torchtitan" if "torchtitan" in framework.lower() else "megatron"


def peak_ratios(rows, raw) -> list[tuple[str, str, float]]:
    """``(row_id, family, measured / predicted)`` of every representable row with a measured
    peak (the row's columns, default overheads: what a user's check computes)."""
    out = []
    for r in rows:
        src = raw.get(r.row_id, {})
        if not src.get("peak_mem", "").strip() or not r.representable:
            continue
        pub = published_gib(src["peak_mem"], src.get("peak_mem_note", ""))
        if pub is None:
            continue
        ours = memory_report(r.model, r.cluster, r.training, r.cfg).peak_bytes / GIB
        out.append((r.row_id, family(src.get("framework", "")), pub / ours))
    return out


def spread_table(ratios: list[tuple[str, str, float]]) -> dict:
    """Per family: the smallest, median and largest ratio (the observed range is the stated
    spread: with 5 and 14 rows, a 10th-90th percentile band would leave a third of the rows
    outside it), and the ratios by row."""
    fams: dict = {}
    for fam in sorted({f for _, f, _ in ratios}):
        xs = [x for _, f, x in ratios if f == fam]
        fams[fam] = {"low": round(min(xs), 4), "median": round(quantile(xs, 0.5), 4),
                     "high": round(max(xs), 4),
                     "ratios": {rid: round(x, 4) for rid, f, x in ratios if f == fam}}
    return fams


def verdict_table(rows, raw) -> tuple[int, int]:
    """The three-state verdict (oracle/memory_verdict.py, with the row's family spread) of every
    published run with a measured throughput, under its framework recipe's memory settings: as
    stated when the row states its recompute, else the best of no recomputation, the selective
    modules of :data:`SELECTIVE_TRIES` and full recomputation. Prints the runs called out of
    memory; returns ``(out of memory as stated, out of memory under every setting tried)``."""
    from tune_cp.oracle.memory_verdict import MemoryState, memory_state, spread_for

    print("\n== Three-state verdict of the published runs (recipe memory settings; stated "
          "recompute, else the best setting) ==")
    counts = {s: 0 for s in MemoryState}
    stated_oom = every_oom = 0
    for r in rows:
        src = raw.get(r.row_id, {})
        if not r.representable or r.measured_tokens_per_s_per_gpu is None:
            continue
        cfg, ov = r.recipe_cfg(), overheads(r, True)
        spread = spread_for(family(src.get("framework", "")))
        hbm = r.cluster.gpu.hbm_bytes
        tries = [cfg]
        if not src.get("recompute", "").strip():
            tries = [cfg.model_copy(update={"recompute": Recompute.NONE})]
            tries += [cfg.model_copy(update={"recompute": Recompute.SELECTIVE,
                                             "recompute_modules": mods})
                      for mods in SELECTIVE_TRIES
                      if r.model.is_moe != ("mlp" in mods) or mods == ("core_attn",)]
            tries.append(cfg.model_copy(update={"recompute": Recompute.FULL,
                                                "recompute_layers": None,
                                                "recompute_method": RecomputeMethod.UNIFORM}))
        states = [memory_state(peak(r, c, ov), hbm, spread) for c in tries]
        best = min(states, key=list(MemoryState).index)
        counts[best] += 1
        if best is MemoryState.OUT_OF_MEMORY:
            how = "as stated" if len(tries) == 1 else "under every recompute setting"
            stated_oom += len(tries) == 1
            every_oom += len(tries) > 1
            print(f"row {r.row_id} {r.model.name} {r.cluster.gpu.name} "
                  f"{cfg.label().replace(' ', '')} mbs{cfg.mbs}: out of memory {how} "
                  f"({peak(r, tries[-1], ov) / GIB:.1f} GiB of {hbm / GIB:.0f})")
    print("  " + ", ".join(f"{s.value} {n}" for s, n in counts.items())
          + f"; out of memory as stated {stated_oom}, under every recompute setting {every_oom}")
    return stated_oom, every_oom


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(ROOT / "benchmarks" / "published_runs.csv"))
    ap.add_argument("--write-spread", action="store_true",
                    help=f"write the spread to {SPREAD_FILE.relative_to(ROOT)}")
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

    fams = spread_table(peak_ratios(rows, raw))
    print("\n== Overhead spread: measured peak / tune-cp's peak, per framework family ==")
    for fam, v in fams.items():
        inside = sum(v["low"] <= x <= v["high"] for x in v["ratios"].values())
        print(f"{fam:10}  {len(v['ratios'])} rows  lowest {v['low']:.3f}  median {v['median']:.3f}"
              f"  highest {v['high']:.3f}  (within: {inside} of {len(v['ratios'])}; default margin "
              f"1 - 1/low = {max(0.0, 1 - 1 / v['low']):.3f})")
    if args.write_spread:
        SPREAD_FILE.write_text(json.dumps({
            "about": "Measured peak / tune-cp's predicted peak (default overheads, no margin) of "
                     "the rows of benchmarks/published_runs.csv with a peak_mem figure, per "
                     "framework family; low / median / high: the smallest, median and largest "
                     "ratio. Written by "
                     "python benchmarks/memory.py --write-spread; read by "
                     "oracle/memory_verdict.py.",
            "families": fams}, indent=1) + "\n")
        print(f"wrote {SPREAD_FILE}")

    for label, use_recipe in (("the row's columns only", False),
                              ("with the framework recipe's memory settings", True)):
        oom_table(rows, raw, use_recipe, label)
    verdict_table(rows, raw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
