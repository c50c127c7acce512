"""``--verify N``: short benchmark launches of the N best distinct candidates of a search.

For each candidate (the heads of the first N distinct groups, the answer first) a folder
``NN-<layout>/`` with the exporters' launch settings (:mod:`formats.export`) plus what a
short benchmark and the next step (``tune-cp calibrate --log``) need:

* ``megatron.args``: Megatron-LM flags with ``--train-iters`` :data:`VERIFY_ITERATIONS`,
  ``--log-interval 1`` (one ``elapsed time per iteration (ms)`` line per step),
  ``--log-throughput`` (the ``throughput per GPU (TFLOP/s/GPU)`` column) and ``--eval-iters 0``;
  Megatron-LM prints its argument dump at start-up and the memory report (``max allocated``)
  after the first logged iteration by itself (``megatron/training/training.py``);
* ``primus.yaml``: the Primus overrides with the same keys (``train_iters``, ``log_interval``,
  ``log_throughput``, ``eval_iters``);
* ``bridge.py``: the Megatron-Bridge assignments plus ``cfg.train.train_iters``,
  ``cfg.logger.log_interval``, ``cfg.logger.log_throughput``, ``cfg.train.eval_iters``.

``README.txt`` says how to run them and how to feed the logs back.
"""

from __future__ import annotations

import re
from pathlib import Path

from tune_cp.config.specs import ConfigError

#: iterations of a verification run: the first WARMUP_ITERATIONS (formats.logs) are
#: left out of the median, the rest give a stable step time within minutes.
VERIFY_ITERATIONS = 30

MEGATRON_BENCH = [("--train-iters", str(VERIFY_ITERATIONS)), ("--log-interval", "1"),
                  ("--log-throughput", None), ("--eval-iters", "0")]
PRIMUS_BENCH = [("train_iters", VERIFY_ITERATIONS), ("log_interval", 1),
                ("log_throughput", True), ("eval_iters", 0)]
BRIDGE_BENCH = [("train.train_iters", str(VERIFY_ITERATIONS)), ("logger.log_interval", "1"),
                ("logger.log_throughput", "True"), ("train.eval_iters", "0")]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def write_verify(result, n: int, out_dir: str | Path) -> list[Path]:
    """Write the launches of the ``n`` best distinct candidates of ``result`` (a SearchResult)
    under ``out_dir``; returns the folders written."""
    from tune_cp.agent.report import short_layout
    from tune_cp.formats import (
        to_megatron_args,
        to_nemo_overrides,
        to_primus_overrides,
    )
    from tune_cp.formats.export import yaml_value

    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    groups = sorted(result.groups, key=lambda g: not g.answer)[:n]
    m, cl, tr = result.model, result.cluster, result.training
    written = []
    index = []
    opts = result.options.settings.options  # the framework run settings searched with
    for k, g in enumerate(groups, 1):
        cfg = result.ranked.configs[g.head]
        name = f"{k:02d}-{_slug(short_layout(cfg))}-mbs{cfg.mbs}"
        d = root / name
        d.mkdir(exist_ok=True)
        iv = result.ranked.intervals[g.head] if result.ranked.intervals else None
        proj = float(result.ranked.tokens[g.head])
        try:
            meg = to_megatron_args(m, cl, tr, cfg, launcher=False, options=opts).rstrip("\n")
            meg += " \\\n" + " \\\n".join(f if v is None else f"{f} {v}" for f, v in MEGATRON_BENCH)
            (d / "megatron.args").write_text(meg + "\n")
            bridge = to_nemo_overrides(m, cl, tr, cfg, options=opts).rstrip("\n")
            bridge += "\n# short benchmark (tune-cp --verify)\n" + "\n".join(
                f"cfg.{k2} = {v}" for k2, v in BRIDGE_BENCH)
            (d / "bridge.py").write_text(bridge + "\n")
        except ConfigError as e:
            (d / "NOTE.txt").write_text(f"Megatron-LM / Megatron-Bridge: {e}\n")
        prim = to_primus_overrides(m, cl, tr, cfg, options=opts).rstrip("\n")
        prim += "\n" + "\n".join(f"      {k2}: {yaml_value(v)}" for k2, v in PRIMUS_BENCH)
        (d / "primus.yaml").write_text(prim + "\n")
        band = (f" (80% interval {iv.low:,.0f}-{iv.high:,.0f}"
                + (f"; {iv.bias_text()}" if iv.bias is not None else "") + ")" if iv else "")
        index.append(f"{name}: projected {proj:,.0f} tokens/s/GPU{band}"
                     + (" [the answer]" if g.answer else " [near tie]" if g.near_tie else ""))
        written.append(d)
    gpu = cl.gpu.name
    (root / "README.txt").write_text("\n".join([
        (f"tune-cp --verify {n}: {m.name} on {cl.num_nodes} x {cl.gpus_per_node} {gpu}, seq "
        f"{tr.seq_len}, gbs {tr.global_batch_size}, {tr.precision.value}"),
        "",
        *index,
        "",
        (f"Each folder: megatron.args (Megatron-LM flags; add data, tokenizer and optimizer "
        f"settings), primus.yaml (Primus overrides), bridge.py (Megatron-Bridge assignments); "
        f"each runs {VERIFY_ITERATIONS} iterations and logs every one."),
        "Keep each run's full stdout (the argument dump and the memory report are in it), then:",
        (f"  tune-cp calibrate --log run1.log --log run2.log ... --gpu {gpu} --model {m.name} "
        f"--out my-cluster.json"),
        (f"  tune-cp --model {m.name} --gpu {gpu} --nodes {cl.num_nodes} --calibration "
        f"my-cluster.json"),
        "",
    ]))
    return written
