"""The baseline the agent improves on: the user's configuration, else a published reference for
this model, GPU and node count (``agent/references.json``), else a stated default."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import Field

from tune_cp.config.specs import (
    ClusterSpec,
    ModelSpec,
    ParallelConfig,
    Precision,
    Spec,
    TrainingSpec,
)

HERE = Path(__file__).parent


class Reference(Spec):
    """A published configuration with its source."""

    name: str
    model: str
    gpu: str
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    global_batch_size: int = Field(ge=1)
    precision: Precision = Precision.BF16
    config: dict[str, Any]
    source: str

    def parallel_config(self) -> ParallelConfig:
        return ParallelConfig(**self.config)


@cache
def references() -> tuple[Reference, ...]:
    data = json.loads((HERE / "references.json").read_text())
    return tuple(Reference(**r) for r in data["references"])


def find_reference(model: ModelSpec, cluster: ClusterSpec) -> Reference | None:
    """The published reference for exactly this model, GPU and node count, if one is known."""
    for ref in references():
        if (ref.model, ref.gpu, ref.nodes, ref.gpus_per_node) == (
            model.name, cluster.gpu.name, cluster.num_nodes, cluster.gpus_per_node,
        ):
            return ref
    return None


def reference_training_matches(ref: Reference, training: TrainingSpec) -> bool:
    return (ref.seq_len, ref.global_batch_size, ref.precision) == (
        training.seq_len, training.global_batch_size, training.precision,
    )
