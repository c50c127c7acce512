"""What the published rows' framework recipes make the projections charge (``formats/runs.py``):
the DeepSeek-V3 recipe layouts, and full recomputation for a row that cannot have run without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tune_cp.config.specs import PipelineSplit, Recompute
from tune_cp.formats.runs import read_runs

RUNS = Path(__file__).resolve().parents[1] / "benchmarks" / "published_runs.csv"


@pytest.fixture(scope="module")
def rows():
    return {r.row_id: r for r in read_runs(RUNS)}


@pytest.mark.parametrize("row_id, layout", [
    ("131", "Et*4|(t*4|)*14tmL"),   # B300 PP16
    ("2", "Et*4|(t*4|)*14tmL"),     # GB200 PP4 VPP4
    ("83", "Et*4|(t*4|)*14tmL"),    # GB300 PP2 VPP8
    ("43", "Et*8|(t*8|)*6t*5mL"),   # B300 PP8
    ("285", "Et|(tt|)*30mL"),       # H100 PP8 VPP4
])
def test_deepseek_v3_rows_carry_the_recipe_layout(rows, row_id, layout):
    cfg = rows[row_id].cfg
    assert cfg.pipeline_layout == layout and cfg.pipeline_split is PipelineSplit.LAYOUT


def test_deepseek_v3_own_run_keeps_the_automatic_split(rows):
    """Row 433 (DeepSeek's DualPipe run, not a Megatron-Bridge recipe)."""
    assert rows["433"].cfg.pipeline_layout is None


def test_unstated_recompute_that_cannot_fit_reads_as_full(rows):
    """AMD's Llama 3.1 70B FP8 FSDP64 mbs 4 on MI325X (row 436) states no recompute and needs
    3.3x the HBM without it; the BF16 mbs 1 twin (437) fits and stays without recompute."""
    r436, r437 = rows["436"], rows["437"]
    assert r436.cfg.recompute is Recompute.FULL
    assert any("recompute not stated" in n for n in r436.notes)
    assert r437.cfg.recompute is Recompute.NONE


def test_nemo1_rows_carry_the_launcher_recipe(rows):
    """NeMo 1.x (24.07) rows: the NeMo Framework Launcher's H100 launches of GPT-3 and Llama set
    ``optim.grad_sync_dtype=bf16`` (Apex DistributedFusedAdam's gradient buffer in bf16), its
    Nemotron launches do not; its Llama 2 70B SFT launch on 2 nodes also sets FP8 parameters and
    a virtual pipeline of 20. GPT-3 20B TP2 (row 290): 10,121,687,040 parameters per GPU, the
    gradient buffer 2 bytes each (as the bf16 weights), half the fp32 one."""
    from tune_cp.config.specs import OptimizerState, Schedule, StateDtype
    from tune_cp.oracle import memory as M
    from tune_cp.oracle.memory import memory_report

    remainders = OptimizerState(precision_aware=True)  # Apex fp32 state over bf16 weights
    r = rows["290"]
    assert r.recipe == {"grad_reduce_in_fp32": False, "optimizer_state": remainders}
    assert r.cfg.grad_reduce_in_fp32
    cols = memory_report(r.model, r.cluster, r.training, r.cfg).peak.terms
    rec = memory_report(r.model, r.cluster, r.training, r.recipe_cfg()).peak.terms
    assert rec["gradients"] == rec["weights"] == 2 * 10_121_687_040 == cols["gradients"] // 2
    # under the row's tensorwise FP8 recipe the state counts Megatron-Core's fp32 master (12 B;
    # OptimizerState.master_bytes); Apex would store remainders (10 B): a known gap
    assert r.cfg.fp8_recipe is not None and rec["optimizer"] == cols["optimizer"]
    bf16_row = r.recipe_cfg().model_copy(update={"fp8_recipe": None})
    assert M.sharding(r.model, r.cluster, bf16_row).master_bytes == 2  # remainders
    # Nemotron-8B: the launcher keeps fp32 gradients; the optimizer still stores remainders
    assert rows["296"].recipe == {"optimizer_state": remainders}
    sft = rows["303"]
    bf16 = StateDtype.BF16
    assert sft.recipe == {"grad_reduce_in_fp32": False, "fp8_param_gather": True, "vpp": 20,
                          "schedule": Schedule.INTERLEAVED, "optimizer_state": OptimizerState(
                              precision_aware=True, main_params=bf16, exp_avg=bf16,
                              exp_avg_sq=bf16)}
    sh = M.sharding(sft.model, sft.cluster, sft.recipe_cfg())
    assert sh.master_bytes + sh.moment_bytes == 6  # bf16 master + two bf16 moments
    assert sft.cfg.vpp == 1  # the time model reads the columns
    assert any("optimizer state in bf16, 6 B" in n for n in sft.recipe_notes)
