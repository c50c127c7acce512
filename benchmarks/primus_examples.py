"""How tune-cp reads Primus's own pretrain examples: for every ``*pretrain*.yaml`` under
``examples/megatron/configs/{MI355X,MI300X,MI325X}`` of a Primus checkout, whether it is read
(and then checked on the smallest whole-node cluster its layout fits, on that folder's GPU), or
refused, and why. Prints one table per folder and the counts.

    python benchmarks/primus_examples.py /path/to/Primus [FOLDER ...]

Measured on AMD-AGI/Primus fd1eeabbad (2026-08-22); the counts are in the README.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tune_cp.config.specs import ClusterSpec, ConfigError  # noqa: E402
from tune_cp.formats import parse_primus_config  # noqa: E402
from tune_cp.oracle.catalog import load_gpu  # noqa: E402
from tune_cp.solver.check import check_configuration  # noqa: E402

GPU_OF = {"MI355X": "mi355x", "MI300X": "mi300x", "MI325X": "mi325x"}
MAX_NODES = 64


def smallest_cluster(run, gpu) -> ClusterSpec | None:
    c = run.config
    for nodes in range(1, MAX_NODES + 1):
        world = nodes * gpu.gpus_per_node
        if world % (c.tp * c.pp * c.cp):
            continue
        dp = world // (c.tp * c.pp * c.cp)
        if (dp * c.tp * c.cp) % (c.ep * (c.etp or c.tp)):
            continue
        return ClusterSpec(gpu=gpu, num_nodes=nodes, gpus_per_node=gpu.gpus_per_node)
    return None


def row(path: Path, gpu) -> tuple[str, str]:
    try:
        run = parse_primus_config(path, env={})
        model = run.require_model()
    except ConfigError as e:
        return "refused", str(e).split(": ", 1)[-1][:150]
    cluster = smallest_cluster(run, gpu)
    if cluster is None:
        return "read", "no whole-node cluster up to 64 nodes fits the layout"
    training = run.training_spec(model, cluster)
    out = check_configuration(model, cluster, training, run.config)
    verdict = "legal, fits" if out.legal else (out.violations[0].rule if out.violations else "?")
    return "read", f"{cluster.num_nodes} node(s): {verdict}"


def main(argv: list[str]) -> None:
    root = Path(argv[0])
    folders = argv[1:] or list(GPU_OF)
    for folder in folders:
        gpu = load_gpu(GPU_OF[folder])
        files = sorted((root / "examples/megatron/configs" / folder).glob("*pretrain*.yaml"))
        counts: Counter[str] = Counter()
        print(f"\n{folder} ({len(files)} pretrain experiments, {gpu.name})")
        print(f"{'experiment':48} {'outcome':8} detail")
        for path in files:
            outcome, detail = row(path, gpu)
            counts[outcome] += 1
            print(f"{path.name:48} {outcome:8} {detail}")
        print(f"{folder}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


if __name__ == "__main__":
    main(sys.argv[1:])
