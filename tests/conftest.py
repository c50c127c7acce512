"""Shared fixtures: catalog specs and a helper that runs the CLI in-process."""

from __future__ import annotations

import json

import pytest

from tune_cp import cli
from tune_cp.config.resolve import resolve_config
from tune_cp.config.specs import ClusterSpec, ParallelConfig, TrainingSpec
from tune_cp.oracle.catalog import load_gpu, load_model


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


#: The slowest tests (seconds each on the 2-core machine: whole searches, CP-SAT beside the
#: Python loop on MoE spaces, infeasibility explanations), marked ``slow``:
#: ``python -m pytest -m "not slow"`` runs the rest in under a minute; CI runs everything. An
#: entry without ``[...]`` marks every parametrisation of the test. Kept here rather than as
#: decorators so that the list is one place to review (``--durations=40`` shows the candidates).
SLOW_TESTS = frozenset({
    "test_hybrid.py::test_ultra_too_small_cluster_names_what_fits",
    "test_cli_check.py::test_calibrate_command",
    "test_cli_product.py::test_plan_minimum_nodes_table_and_monotone",
    "test_cli_product.py::test_search_export_megatron_round_trips_through_check",
    "test_cli_search.py::test_search_no_feasible_names_memory_and_nodes",
    "test_cli_search.py::test_the_explanations_fsdp_fix_is_the_fsdp_flag",
    "test_cli_search.py::test_search_with_bf16_gradients_agrees_with_check",
    "test_cli_search.py::test_check_line_reproduces_the_answer[deepseek-v3]",
    "test_logs.py::test_refit_on_a_slower_cluster_moves_its_projections_down",
    "test_megatron_validate.py::test_top_answers_pass_megatrons_assertions",
    "test_megatron_validate.py::test_more_top_answers_pass_megatrons_assertions",
    "test_logs.py::test_search_rows_are_distinct_and_the_answer_follows_its_rule",
    "test_runs_calibrate.py::test_calibrate_writes_a_loadable_file_that_beats_priors",
    "test_search.py::test_attribution_ends_at_the_best_and_names_each_change_once",
    "test_search.py::test_mixtral_4_nodes_beats_amd_reference",
    "test_solver_constraints.py::test_conflicting_constraint_gives_empty_set_and_names_it",
    "test_solver_constraints.py::test_cpsat_compilation_equals_python",
    "test_solver_equivalence.py::test_bf16_gradients_change_the_bytes_of_every_configuration",
    "test_solver_equivalence.py::test_constraints_match_too",
    "test_solver_equivalence.py::test_cpsat_equals_python_loop[mixtral-8x7b]",
    "test_solver_equivalence.py::test_cpsat_equals_python_loop[mixtral-8x7b-bf16-grads]",
    "test_solver_equivalence.py::test_cpsat_equals_python_loop[mixtral-8x7b-fsdp]",
    "test_solver_equivalence.py::test_families_switched_off_match_too",
    "test_solver_equivalence.py::test_presolve_regression",
    "test_solver_explain.py::test_batch_conflict_suggests_the_nearest_global_batch",
    "test_solver_explain.py::test_llama_405b_on_one_h100_node_needs_more_nodes",
    "test_solver_explain.py::test_unusual_node_size_suggests_the_usual_one",
    "test_solver_model.py::test_memory_never_rises_with_more_block_recompute[mixtral-8x7b]",
    "test_solver_model.py::test_mixtral_reference_layout_is_feasible_with_its_bytes",
    "test_solver_slices.py::test_mixtral_on_four_nodes_sliced",
    "test_solver_slices.py::test_oracle_tables_are_memoised_per_problem",
    "test_solver_slices.py::test_sliced_equals_one_model",
    "test_solver_slices.py::test_sliced_equals_one_model_with_families_off_and_constraints",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = f"{item.path.name}::{item.name}"
        if name in SLOW_TESTS or name.split("[")[0] in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


# --- tune_cp: which copy of the package the tests import (written by rename.py) ---


def _tune_cp_home():
    """The folder the imported tune_cp lives in (this checkout for an editable install)."""
    from pathlib import Path

    return Path(cli.__file__).resolve().parent


def _differs_from_checkout():
    """The first of this checkout's modules and data files that the imported tune_cp does not hold
    byte for byte (None when it is this checkout, or an identical copy such as CI's
    ``pip install '.[test]'``): the tests must run this checkout's code."""
    from pathlib import Path

    here = Path(__file__).resolve().parents[1]
    there = _tune_cp_home()
    if there == here:
        return None
    files = [here / "cli.py"]
    for d in "agent formats oracle solver".split():
        files += [p for p in (here / d).rglob("*") if p.suffix in (".py", ".json")
                  and "__pycache__" not in p.parts]
    for src in sorted(files):
        dst = there / src.relative_to(here)
        if not dst.is_file() or dst.read_bytes() != src.read_bytes():
            return str(src.relative_to(here))
    return None


def pytest_report_header(config):
    return f"tune_cp: {_tune_cp_home()}"


def pytest_sessionstart(session):
    stale = _differs_from_checkout()
    if stale:
        pytest.exit(f"the tune_cp these tests import ({_tune_cp_home()}) is not this checkout: "
                    f"its {stale} differs or is missing; install the checkout "
                    f"(pip install -e '.[test]') and rerun", returncode=4)
