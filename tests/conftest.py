"""Shared fixtures: catalog specs and a helper that runs the CLI in-process."""

from __future__ import annotations

import json

import pytest

import cli
from oracle.catalog import load_gpu, load_model
from oracle.specs import ClusterSpec, ParallelConfig, TrainingSpec, resolve_config


@pytest.fixture
def run_cli(capsys):
    """Run ``tune-cp ARGS`` in-process: returns (exit code, stdout, stderr)."""

    def _run(*args: str) -> tuple[int, str, str]:
        code = cli.run([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return _run


@pytest.fixture
def run_json(run_cli):
    def _run(*args: str) -> tuple[int, dict]:
        code, out, err = run_cli(*args, "--json")
        assert out, f"no JSON output (exit {code}): {err}"
        return code, json.loads(out)

    return _run


def setting(model: str, gpu: str, nodes: int, seq: int, gbs: int, gpn: int = 8):
    m = load_model(model)
    cl = ClusterSpec(gpu=load_gpu(gpu), num_nodes=nodes, gpus_per_node=gpn)
    tr = TrainingSpec(seq_len=seq, global_batch_size=gbs)
    return m, cl, tr


def resolved(model, cluster, training, **kw) -> ParallelConfig:
    return resolve_config(ParallelConfig(**kw), model, cluster, training)
