"""AMD's ROCm PyTorch training container rows (benchmarks/amd_published_runs.csv): their ids,
the tokens/s/GPU derived from the sources' FLOPs-per-token formulas, and how they are read."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

from tune_cp.config.specs import ConfigError
from tune_cp.formats.runs import (
    PUBLISHED_RUNS_FILES,
    parse_row,
    read_runs,
    read_runs_files,
    runs_label,
)
from tune_cp.oracle.constants import software_stack

ROOT = Path(__file__).resolve().parents[1]
AMD = ROOT / "benchmarks" / "amd_published_runs.csv"
SHARED = Path("/work/shared/calibration/amd_published_runs.csv")


def _amd_module():
    name = "tune_cp_amd_runs"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "amd_runs.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _rows() -> list[dict[str, str]]:
    return list(csv.DictReader(open(AMD, newline="", encoding="utf-8")))


def test_flops_per_token_by_hand():
    """Llama 3.1 8B in train_fsdp.py's llama.py at seq 8192, per token: weights
    3 x (32 x (6 h f + 2 h (a + 2k) d + 2 h a d) + 2 h V) = 3 x (32 x (352,321,536 + 50,331,648 +
    33,554,432) + 1,050,673,152) = 45,027,950,592; attention 3 x 32 x 4 s a d = 12,884,901,888;
    sum 57,912,852,480 (the transcriber's 5.7913e10). Mistral 7B (window 1024, vocab 32000):
    3 x (13,958,643,712 + 262,144,000) + 3 x 32 x 4 x 1024 x 4096 = 44,272,975,872. torchtitan
    Llama 3.1 70B: N = 80 x 855,654,400 + 8,192 + 1,050,673,152 = 69,503,033,344 parameters
    without the input embedding; 6 N + 12 x 80 x 64 x 128 x 8192 = 481,442,709,504."""
    m = _amd_module()
    assert m.train_fsdp_flops_per_token(32, 4096, 14336, 32, 8, 128256, 8192) == 57_912_852_480
    assert m.train_fsdp_flops_per_token(32, 4096, 14336, 32, 8, 32000, 8192,
                                        window=1024) == 44_272_975_872
    assert m.torchtitan_llama_params(80, 8192, 28672, 64, 8, 128256) == 69_503_033_344
    assert m.torchtitan_flops_per_token(80, 8192, 28672, 64, 8, 128256, 8192) \
        == 481_442_709_504


def test_every_row_tokens_per_s_re_derived_from_its_tflops():
    """Every row's tokens/s/GPU (the transcriber's eight and the six tune-cp derived) is its
    TFLOPS/s/GPU x 1e12 / the source's FLOPs per token, to a whole token; the six derived ones
    say so in derived_fields. amd-1: 426.79e12 / 481,442,709,504 = 886.5 -> 886."""
    m = _amd_module()
    rows = _rows()
    assert [r["row_id"] for r in rows] == [f"amd-{i}" for i in range(1, 15)]
    derived = 0
    for r in rows:
        f, _ = m.flops_per_token(r)
        tokens = float(r["model_tflops_per_gpu"]) * 1e12 / f
        assert abs(float(r["tokens_per_sec_per_gpu"]) - tokens) <= 0.5 + 1e-9, r["row_id"]
        if "derived by tune-cp" in r["derived_fields"] and "tokens_per_sec" in \
                r["derived_fields"].split("derived by tune-cp")[0].rsplit(";", 1)[-1]:
            derived += 1
    assert derived == 6
    assert rows[0]["tokens_per_sec_per_gpu"] == "886"
    assert rows[7]["tokens_per_sec_per_gpu"] == "1093"  # 526.13e12 / 481,442,709,504


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/calibration not on this machine")
def test_copy_differs_from_the_shared_file_only_in_stated_cells():
    """The copy is the shared file cell for cell except row_id, the derived tokens/s/GPU, the
    torchtitan rows' global batch and the derived_fields that state them."""
    m = _amd_module()
    src = list(csv.DictReader(open(SHARED, newline="", encoding="utf-8")))
    assert m.derive(src) == _rows()
    for a, b in zip(src, _rows(), strict=True):
        changed = {k for k in a if a[k] != b[k]}
        assert changed <= {"row_id", "tokens_per_sec_per_gpu", "global_batch_size",
                           "derived_fields"}
        for k in changed - {"row_id", "derived_fields"}:
            assert a[k] == "" and k.split("_per")[0].split("_size")[0] in b["derived_fields"]


def test_amd_rows_read_as_run():
    """FSDP from the fsdp column's strategy name; the plain PyTorch FSDP script its own stack;
    torchtitan's global batch = local batch x 8 (one step per local batch); Mistral 7B with the
    benchmark config's 1024-token sliding window on every layer."""
    rows = {r.row_id: r for r in read_runs(AMD)}
    assert len(rows) == 14 and all(r.representable and r.fitted for r in rows.values())
    assert all(r.cfg is not None and r.cfg.fsdp for r in rows.values())
    assert {r.software for r in rows.values()} == {"torchtitan", "pytorch-fsdp"}
    r1 = rows["amd-1"]
    assert r1.software == "torchtitan" and r1.training is not None
    assert r1.training.global_batch_size == 32 and r1.cfg is not None and r1.cfg.ga == 1
    r2 = rows["amd-2"]
    assert r2.cfg is not None and r2.cfg.ga == 8 and r2.cfg.mbs == 3
    mistral = rows["amd-6"].model
    assert mistral is not None and mistral.sliding_window == 1024
    assert mistral.num_sliding_window_layers == mistral.num_layers == 32
    assert rows["amd-2"].model is not None and rows["amd-2"].model.sliding_window == 0


def test_software_stack_names():
    assert software_stack("PyTorch FSDP (AMD-AIG-AIMA/pytorch-training-benchmark train_fsdp.py)") \
        == "pytorch-fsdp"
    assert software_stack("torchtitan (PyTorch FSDP2/DTensor)") == "torchtitan"
    assert software_stack("MosaicML Composer / llm-foundry (PyTorch FSDP)") == "llm-foundry"
    assert software_stack("Megatron-LM") == "megatron"


def test_fsdp_column_as_a_strategy_name():
    base = {"row_id": "x", "source": "s", "model": "llama3-8b", "gpu_type": "H100",
            "num_gpus": "8", "tp": "1", "pp": "1", "seq_len": "8192",
            "global_batch_size": "64", "micro_batch_size": "1",
            "tokens_per_sec_per_gpu": "1000"}
    for text, fsdp in (("FSDP", True), ("FSDP2", True), ("8", True), ("0", False),
                       ("", False)):
        r = parse_row({**base, "fsdp": text})
        assert r.cfg is not None and r.cfg.fsdp is fsdp, text


def test_published_files_read_together(tmp_path):
    """The shipped fit reads both files; a row id repeated across files is a one-line error."""
    rows = read_runs_files(PUBLISHED_RUNS_FILES)
    assert sum(r.row_id.startswith("amd-") for r in rows) == 14
    assert runs_label(PUBLISHED_RUNS_FILES) == "published_runs.csv + amd_published_runs.csv"
    dup = tmp_path / "dup.csv"
    dup.write_text(AMD.read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(ConfigError, match="row_id 'amd-1' of dup.csv is also in"):
        read_runs_files([AMD, dup])


def test_shipped_calibration_is_fitted_on_both_files():
    import json

    data = json.loads((ROOT / "oracle" / "catalog" / "calibration.json").read_text())
    fitted = data["fitted_on"]
    assert fitted["runs_file"] == "published_runs.csv + amd_published_runs.csv"
    assert {f"amd-{i}" for i in range(1, 15)} <= set(fitted["rows"])
    assert "pytorch-fsdp" in fitted["software_stacks_fitted"]
    assert "mi300x" in fitted["gpus_fitted"]
