"""Issue 29, the reader, path, stream and process classes: one test per class of hostile input
(the shell reader's bounds, Primus presets and paths, secrets from the environment, output paths
and streams, echoed text, sweep and plan sizes)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tune_cp.config.specs import ConfigError
from tune_cp.formats import parse_primus_config
from tune_cp.formats.keys import MAX_PRESET_DEPTH, MAX_PRESET_READS
from tune_cp.formats.shell import (
    ARITH_MAX,
    MAX_EXPANDED_CHARS,
    MAX_SCRIPT_CHARS,
    MAX_SHELL_DEPTH,
    expand_launch,
)

# ------------------------------------------------------------------------ the shell reader

#: Each unbounded construct of a launch script, and the named limit its refusal must cite.
SHELL_BOMBS = {
    "arithmetic power tower": ("torchrun x.py --num-layers $((2**2**2**2**2))", "ARITH_MAX"),
    "arithmetic product overflow": ("torchrun x.py --n $((9999999999*9999999999))", "ARITH_MAX"),
    "arithmetic literal overflow": ("torchrun x.py --n $((99999999999999999999))", "ARITH_MAX"),
    "arithmetic nesting": ("torchrun x.py --n $((" + "(" * 300 + "1" + ")" * 300 + "))",
                           "MAX_SHELL_DEPTH"),
    "arithmetic length": ("A=" + "1+" * 3000 + "1\ntorchrun x.py --n $((A))", "MAX_ARITH_CHARS"),
    "scalar doubling": ("A=x\n" + 'A="$A$A"\n' * 60 + "torchrun x.py", "MAX_EXPANDED_CHARS"),
    "scalar appending": ("A+=xxxxxxx\n" * 2000 + "torchrun x.py --n $A", "MAX_EXPANDED_CHARS"),
    "array doubling": ("A=(x)\n" + "A=(${A[@]} ${A[@]})\n" * 60 + "torchrun x.py",
                       "MAX_EXPANDED_CHARS"),
    "nested defaults": ("torchrun x.py --n " + "${A:-" * 3000 + "4" + "}" * 3000,
                        "MAX_SHELL_DEPTH"),
    "nested quoted defaults": ('torchrun x.py --n ' + '"${A:-' * 300 + "4" + '}"' * 300,
                               "MAX_SHELL_DEPTH"),
    "nested if": ("if [[ 1 ]]; then\n" * 2000 + "torchrun x.py\n" + "fi\n" * 2000,
                  "MAX_SHELL_DEPTH"),
    "huge text": ("torchrun x.py " + "--num-layers 4 " * 80_000, "MAX_SCRIPT_CHARS"),
}


@pytest.mark.parametrize("name", sorted(SHELL_BOMBS))
def test_every_shell_expansion_is_bounded_in_size_depth_and_time(name):
    """Issue 29: each used to run past 90 s, take 3 GB or end in RecursionError; each is now a
    one-line ConfigError naming its limit, within a second."""
    text, limit = SHELL_BOMBS[name]
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        expand_launch(text)
    assert time.monotonic() - t0 < 5
    assert limit in str(e.value) and "\n" not in str(e.value)


def test_shell_limits_are_what_the_docstring_says():
    assert MAX_SHELL_DEPTH == 64 and ARITH_MAX == 2**63 - 1
    assert MAX_EXPANDED_CHARS == 4 * MAX_SCRIPT_CHARS == 4 * 2**20


def test_shell_arithmetic_is_bash_arithmetic():
    """Hand-worked bash results: ``**`` right-associative (2**(2**(2**2)) = 65536), C
    division and remainder (-7/2 = -3, -7%2 = -1), a bare name evaluated as its own expression
    (A=1+1: A*2 = 4) and ``$A`` substituted as text ($A*2 = 1+1*2 = 3)."""
    s = expand_launch("A=1+1\ntorchrun x.py $((2**2**2**2)) $((-7/2)) $((-7%2)) $((A*2)) "
                      "$(($A*2)) $((2**62))")
    assert s.words[2:] == ["65536", "-3", "-1", "4", "3", str(2**62)]


def test_quotes_inside_parameter_expansions_read_as_bash_reads_them():
    """A single quote inside a double-quoted default is a character (``"${A:-it's}"`` is
    ``it's``; it was ``ValueError: substring not found``), double quotes nest inside
    ``${...}``, and an unclosed quote is a one-line error."""
    s = expand_launch("""torchrun x.py "${A:-it's}" "${B:-"x y"}" ${C:-'4'} "${D:-"}"}" """)
    assert s.words[2:] == ["it's", "x y", "4", "}"]
    for text in ("torchrun x.py ${A:-'x}", "torchrun x.py ${A:-\"x}", "torchrun x.py 'x"):
        with pytest.raises(ConfigError, match="unclosed"):
            expand_launch(text)


def test_unexpanded_values_suggest_a_form_the_cli_accepts(run_cli):
    """A command substitution, an arithmetic or an expansion tune-cp does not read has no
    variable to pass: the message says to give the value (it suggested ``--env ?=VALUE``, which
    is refused); a variable names ``--env NAME=VALUE``."""
    for value in ("$(nproc)", "`nproc`", "$((N*2))", "${A/x/y}"):
        code, _, err = run_cli("check", "--nodes", "1", "--model", "llama3-8b",
                               "--megatron-args", f"--num-layers {value}")
        assert code == 2 and "--env ?" not in err and "leaves unexpanded" in err
    code, _, err = run_cli("check", "--nodes", "1", "--model", "llama3-8b", "--megatron-args",
                           "--num-layers ${NL}")
    assert code == 2 and "pass --env NL=VALUE" in err


# ------------------------------------------------------------------- Primus trees and presets

PRIMUS = Path(__file__).parent / "data" / "primus"
EXPERIMENT = "examples/MI355X/mixtral_8x22B_v0.1-BF16-4node.yaml"


def _primus_tree(tmp_path: Path) -> Path:
    """A copy of tests/data/primus under ``tmp_path/tree``; returns the tree."""
    tree = tmp_path / "tree"
    shutil.copytree(PRIMUS, tree)
    return tree


def _set(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_primus_model_and_presets_outside_the_tree_are_refused_with_the_path(tmp_path):
    """Issue 29: ``model: /etc/shadow`` was read and merged, a ``../`` preset's value echoed.
    Every way out of the tree (absolute, ``../``, a symbolic link out) is a one-line error naming
    the path as written; nothing outside is read."""
    secret = tmp_path / "outside.yaml"
    secret.write_text("num_layers: sk-outside-value\n")
    models = "models/megatron"
    ways = {
        "model absolute": ("experiment", "model: mixtral_8x22B_v0.1.yaml", f"model: {secret}"),
        "model ../": ("experiment", "model: mixtral_8x22B_v0.1.yaml",
                      "model: ../../../outside.yaml"),
        "preset absolute": ("model", "  - mixtral_base.yaml", f"  - {secret}"),
        "preset ../": ("model", "  - mixtral_base.yaml", "  - ../../../outside.yaml"),
        "preset link": ("link", "  - mixtral_base.yaml", "  - link.yaml"),
    }
    for name, (where, old, new) in ways.items():
        tree = _primus_tree(tmp_path / name.replace(" ", "_"))
        if where == "link":
            (tree / models / "link.yaml").symlink_to(secret)
            where = "model"
        target = tree / EXPERIMENT if where == "experiment" else \
            tree / models / "mixtral_8x22B_v0.1.yaml"
        _set(target, old, new)
        with pytest.raises(ConfigError) as e:
            parse_primus_config(tree / EXPERIMENT)
        text = str(e.value)
        assert "outside the experiment's Primus tree" in text, (name, text)
        assert "sk-outside-value" not in text and "\n" not in text
        assert new.split()[-1][:40] in text or "link.yaml" in text, (name, text)


def test_primus_extends_chain_is_bounded_in_reads_and_depth(tmp_path):
    """A chain that fans out (each preset extending the next one four times, ten deep: 4**10
    reads) ran past 90 s; it stops at MAX_PRESET_READS. A straight chain of 40 stops at
    MAX_PRESET_DEPTH."""
    for shape, depth, fan, limit in (("fan", 10, 4, "MAX_PRESET_READS"),
                                     ("line", 40, 1, "MAX_PRESET_DEPTH")):
        tree = _primus_tree(tmp_path / shape)
        models = tree / "models" / "megatron"
        for k in range(depth):
            bases = [f"p{k + 1}.yaml"] * fan
            (models / f"p{k}.yaml").write_text(f"extends: {bases}\nnum_layers: {k + 1}\n")
        (models / f"p{depth}.yaml").write_text("num_layers: 8\n")
        _set(models / "mixtral_8x22B_v0.1.yaml", "  - mixtral_base.yaml",
             "  - mixtral_base.yaml\n  - p0.yaml")
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match=limit):
            parse_primus_config(tree / EXPERIMENT)
        assert time.monotonic() - t0 < 5
    assert MAX_PRESET_READS == 64 and MAX_PRESET_DEPTH == 16


def test_primus_tree_as_shipped_still_reads():
    run = parse_primus_config(PRIMUS / EXPERIMENT)
    assert run.model is not None and run.model.num_layers == 56


# ------------------------------------------------------------------ secrets from the environment

SECRET = "sk-tunecp-secret-0123456789"


def test_no_secret_from_the_environment_reaches_an_error_or_an_export(tmp_path, monkeypatch,
                                                                      run_cli):
    """Issue 29: ``${OPENAI_API_KEY}`` in a Primus YAML or a launch script was expanded from the
    process environment and printed (``micro_batch_size 'sk-...': not a whole number``) or
    exported. Only ``--env`` is read: the variable is named, its value never shown."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    tree = _primus_tree(tmp_path)
    exp = tree / EXPERIMENT
    _set(exp, "micro_batch_size: 1", "micro_batch_size: ${OPENAI_API_KEY}")
    code, out, err = run_cli("check", "--primus-config", exp, "--gpu", "mi355x", "--nodes", "4")
    assert SECRET not in out + err
    _set(exp, "micro_batch_size: ${OPENAI_API_KEY}", "micro_batch_size: ${OPENAI_API_KEY:1}")
    _set(exp, "wandb_project: \"tune-cp-reference\"", "wandb_project: ${OPENAI_API_KEY:x}")
    for fmt in ("megatron", "primus", "nemo"):
        code, out, err = run_cli("check", "--primus-config", exp, "--gpu", "mi355x", "--nodes",
                                 "4", "--export", fmt)
        assert code in (0, 1) and SECRET not in out + err, (fmt, err)
    script = tmp_path / "launch.sh"
    script.write_text("MBS=$OPENAI_API_KEY\ntorchrun pretrain_gpt.py --micro-batch-size $MBS "
                      "--num-layers ${OPENAI_API_KEY}\n")
    code, out, err = run_cli("check", "--megatron-args", script, "--model", "llama3-8b",
                             "--nodes", "1")
    assert code == 2 and SECRET not in out + err and "OPENAI_API_KEY" in err


# ------------------------------------------------------------------- output paths and streams

GRID = Path(__file__).resolve().parent.parent / "benchmarks" / "grids" / "example.yaml"
SEARCH = ("--model", "llama3-8b", "--gpu", "h100", "--nodes", "1")
#: Every option that writes a file (a command line with FILE where its path goes).
FILE_WRITERS = {
    "--pareto": (*SEARCH, "--pareto", "FILE.png"),
    "--trials-out": (*SEARCH, "--trials-out", "FILE.jsonl"),
    "plan --plot": ("plan", "--model", "llama3-8b", "--gpu", "h100", "--plot", "FILE.png"),
    "calibrate --out": ("calibrate", "--runs", "RUNS", "--out", "FILE.json"),
    "sweep --out": ("sweep", str(GRID), "--out", "FILE.csv"),
}
#: Every option that writes into a folder.
DIR_WRITERS = {
    "--verify-dir": (*SEARCH, "--verify", "1", "--verify-dir", "DIR"),
    "sweep --plot": ("sweep", str(GRID), "--out", "OK.csv", "--plot", "DIR"),
}


def _bad_paths(tmp_path: Path, suffix: str) -> dict[str, tuple[str, str]]:
    """(path, what the one-line error must say) for each kind of unwritable path."""
    (tmp_path / f"isdir{suffix}").mkdir(exist_ok=True)
    return {
        "trailing slash": (f"{tmp_path}/x{suffix}/", "names a directory"),
        "unknown user": (f"~nosuchuser-tunecp/x{suffix}", "no home directory"),
        "/proc": (f"/proc/x{suffix}", "cannot be written"),
        "/sys": (f"/sys/x{suffix}", "cannot be written"),
        "a directory": (f"{tmp_path}/isdir{suffix}", "is a directory"),
        "no parent": (f"{tmp_path}/nodir/x{suffix}", "does not exist"),
        "device": ("/dev/full", ""),
    }


def test_every_output_option_refuses_every_unwritable_path_in_one_line(run_cli, tmp_path,
                                                                        monkeypatch):
    """Issue 29: ``--pareto x.png/``, ``--trials-out DIR``, ``sweep --plot /proc/plots``,
    ``~user`` that does not exist ended in FileNotFoundError / IsADirectoryError /
    PermissionError / "Could not determine home directory" (exit 3). One validator
    (oracle/outputs.py) checks every option before any work: exit 2, one line naming the
    option."""
    monkeypatch.chdir(tmp_path)
    runs = Path(__file__).resolve().parent.parent / "benchmarks" / "published_runs.csv"
    checked = 0
    for option, line in FILE_WRITERS.items():
        file_arg = next(a for a in line if a.startswith("FILE"))
        for kind, (path, says) in _bad_paths(tmp_path, Path(file_arg).suffix).items():
            args = [path if a == file_arg else str(runs) if a == "RUNS" else a for a in line]
            code, out, err = run_cli(*args)
            assert code == 2 and err.count("\n") == 1 and err.startswith("tune-cp: error: "), \
                (option, kind, code, err)
            assert option.split()[-1] in err and says in err, (option, kind, err)
            checked += 1
    for option, line in DIR_WRITERS.items():
        for kind, path, says in (("/proc", "/proc/plots", "kernel file system"),
                                 ("unknown user", "~nosuchuser-tunecp/d", "no home directory"),
                                 ("a file", str(GRID), "not a directory"),
                                 ("no parent", f"{tmp_path}/a/b", "does not exist")):
            args = [path if a == "DIR" else a for a in line]
            code, out, err = run_cli(*args)
            assert code == 2 and err.count("\n") == 1 and says in err, (option, kind, err)
            checked += 1
    assert checked == 5 * 7 + 2 * 4


def test_home_is_expanded_for_outputs(tmp_path, monkeypatch):
    from tune_cp.oracle.outputs import check_output_dir, check_output_path

    monkeypatch.setenv("HOME", str(tmp_path))
    assert check_output_path("~/p.png", "--pareto", (".png",)) == tmp_path / "p.png"
    assert check_output_dir("~/plots", "--plot") == tmp_path / "plots"
    assert not (tmp_path / "p.png").exists() and not (tmp_path / "plots").exists()


def _console() -> str:
    script = Path(sys.executable).parent / "tune-cp"
    if not script.exists():
        pytest.skip("the tune-cp console script is not installed beside this Python")
    return str(script)


def test_stdout_that_cannot_be_written_is_one_line_and_a_broken_pipe_is_quiet():
    """Issue 29: stdout to /dev/full was OSError (exit 3); ``| head -1`` exited 1 (click's
    broken-pipe exit, read as "infeasible" under pipefail). Now /dev/full: one line, exit 2;
    a reader that went away: nothing on stderr, exit 0 (cli.py::EXIT_BROKEN_PIPE)."""
    with open("/dev/full", "w") as full:
        p = subprocess.run([_console(), "models", "--json"], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "cannot write the output to stdout: No space left on device" in p.stderr
    p = subprocess.Popen([_console(), "models"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the first line
    err = p.stderr.read()
    assert p.wait(timeout=60) == 0 and err == b""


def test_stdout_closed_or_failing_on_the_error_path_is_one_line_not_a_traceback():
    """Issue 29's independent campaign (benchmarks/attack.py, class "streams"): stdout closed
    (``tune-cp ... >&-``, where Python's ``sys.stdout`` is None) was exit 3 (AttributeError on
    the flush); a ``search --json`` refusal whose JSON document could not be written (stdout to
    /dev/full or closed) printed a traceback with exit 1. Now each is one line on stderr and the
    exit code of what went wrong (2: the output, or the usage error it was reporting)."""
    cases = [(["models"], "Bad file descriptor"),
             (["search", "--model", "llama2-7b", "--json"], "Missing option '--nodes'"),
             (["check", "--model", "llama2-7b", "--nodes", "1", "--tp", "1", "--pp", "1"],
              "Bad file descriptor")]
    for argv, said in cases:
        p = subprocess.run([_console(), *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, timeout=60, preexec_fn=lambda: os.close(1))
        assert p.returncode == 2 and "Traceback" not in p.stderr, (argv, p.stderr)
        assert p.stderr.count("\n") == 1 and said in p.stderr, (argv, p.stderr)
    with open("/dev/full", "w") as full:
        p = subprocess.run([_console(), "search", "--model", "no-such-model", "--nodes", "1",
                            "--json"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1
    assert "no-such-model" in p.stderr
    # both streams closed: nothing can be said, the exit code still tells
    p = subprocess.run([_console(), "models"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60,
                       preexec_fn=lambda: (os.close(1), os.close(2)))
    assert p.returncode == 2


def test_ctrl_c_is_one_line_and_exit_130_at_any_moment():
    """Issue 29: Ctrl-C during a search printed a traceback; one second into the enumeration it
    was reported as "did not finish within 60 s" (CP-SAT caught SIGINT and stopped as if out of
    time). Ctrl-C while importing, enumerating or explaining is one line, exit 130."""
    for at in (0.3, 1.5, 3.0):
        p = subprocess.Popen([_console(), "--model", "deepseek-v3", "--gpu", "h100", "--nodes",
                              "16"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(at)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 130 and err == "tune-cp: interrupted (Ctrl-C)\n", (at, err)
        assert "did not finish" not in out + err and "no feasible" not in out
    p = subprocess.Popen([_console(), "--model", "deepseek-v3", "--gpu", "h100", "--nodes", "16",
                          "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err == "tune-cp: interrupted (Ctrl-C)\n"
    assert json.loads(out)["status"] == "error" and json.loads(out)["error"] == "interrupted: Ctrl-C"


def test_cp_sat_leaves_ctrl_c_to_python():
    from tune_cp.solver.cpsat import cp_model
    from tune_cp.solver.feasible import single_solve_solver

    assert single_solve_solver().parameters.catch_sigint_signal is False
    assert cp_model.CpSolver().parameters.catch_sigint_signal is True  # CP-SAT's default


# ------------------------------------------------------------------------------ messages

def test_empty_names_are_refused_as_names_not_read_as_the_current_folder(run_cli):
    """Issue 29: ``--price-per-gpu-hour '=1'`` said "GPU file '.' is a directory": the empty
    name before ``=`` reached the GPU loader as a path (``Path('')`` is ``.``). Every empty name
    (``--gpu ''``, ``--model ''``, ``=PRICE``, ``GPU==PRICE``) is a one-line error about the
    name."""
    cases = {
        ("plan", "--model", "llama3-8b", "--gpu", "h100", "--price-per-gpu-hour", "=1"):
            "write PRICE (every GPU) or GPU=PRICE",
        ("plan", "--model", "llama3-8b", "--gpu", "h100", "--price-per-gpu-hour", "h100==1"):
            "write PRICE (every GPU) or GPU=PRICE",
        ("plan", "--model", "llama3-8b", "--gpu", "h100", "--price-per-gpu-hour", " =1"):
            "write PRICE (every GPU) or GPU=PRICE",
        ("check", "--model", "llama3-8b", "--gpu", "", "--nodes", "1"): "--gpu '': the name is "
                                                                         "empty",
        ("check", "--model", " ", "--nodes", "1"): "--model ' ': the name is empty",
    }
    for args, says in cases.items():
        code, _, err = run_cli(*args)
        assert code == 2 and says in err and "'.'" not in err and err.count("\n") == 1, err


def test_text_output_shows_terminal_escapes_never_sends_them(run_cli, tmp_path):
    """Issue 29: a model name carrying an OSC sequence was printed raw (a terminal sets its
    title, or worse). Every text line goes through one helper (oracle/outputs.py::
    terminal_safe): the escape is shown as ``\\x1b``; JSON escapes it itself."""
    from tune_cp.oracle.outputs import terminal_safe

    assert terminal_safe("a\x1b]0;t\x07b\u202ec\x9b\td\n") == "a\\x1b]0;t\\x07b\\u202ec\\x9b\td\n"
    evil = tmp_path / "m\x1b]2;pwned\x07.json"
    evil.write_text(json.dumps({"model_type": "llama", "hidden_size": 1024,
                                "num_attention_heads": 8, "num_hidden_layers": 4,
                                "vocab_size": 32000, "intermediate_size": 4096}))
    for args in (("check", "--model", str(evil), "--gpu", "h100", "--nodes", "1"),
                 ("check", "--model", "nosuch\x1b]2;x\x07", "--nodes", "1"),
                 ("check", "--model", "llama3-8b", "--nodes", "1", "--megatron-args",
                  "--num-layers \x1b[31m")):
        code, out, err = run_cli(*args)
        assert "\x1b" not in out + err and "\x07" not in out + err, (args, out, err)
        assert "\\x1b" in out + err


def test_grid_calibration_is_relative_to_the_grid_file(tmp_path, monkeypatch):
    """Issue 29: a grid's ``calibration:`` was resolved against the working directory, where
    ``models:`` and ``gpus:`` are resolved against the grid file's folder."""
    from tune_cp.agent.sweep import GridError, load_grid

    sub = tmp_path / "grids"
    sub.mkdir()
    shutil.copy(Path(__file__).resolve().parent.parent / "oracle" / "catalog" /
                "calibration.json", sub / "cal.json")
    (sub / "g.yaml").write_text("models: [llama3-8b]\ngpus: [h100]\nnodes: [1]\n"
                                "calibration: cal.json\n")
    monkeypatch.chdir(tmp_path)
    grid = load_grid(str(sub / "g.yaml"))
    assert grid.scenarios[0].settings.calibration == str(sub / "cal.json")
    (sub / "g.yaml").write_text("models: [llama3-8b]\ngpus: [h100]\nnodes: [1]\n"
                                "calibration: nosuch.json\n")
    with pytest.raises(GridError, match="relative to the grid file"):
        load_grid(str(sub / "g.yaml"))
    (sub / "g.yaml").write_text("models: ['~nosuchuser-tunecp/m.json']\ngpus: [h100]\n"
                                "nodes: [1]\n")
    with pytest.raises(GridError, match="no home directory"):
        load_grid(str(sub / "g.yaml"))


# -------------------------------------------------------------------------- sizes of work

def test_a_grid_is_counted_before_it_is_built_and_refused_past_the_cap(tmp_path):
    """Issue 29: a grid of 1e9 scenarios was built whole (no output in 90 s, RSS growing); one
    of 1e5 ran 20 s before its first progress line. The product of the axes' lengths is
    counted first and refused above MAX_SCENARIOS, naming the count and the cap."""
    from tune_cp.agent.sweep import MAX_SCENARIOS, GridError, load_grid

    many = ", ".join(str(i) for i in range(1, 1001))
    (tmp_path / "g.yaml").write_text(f"models: [llama3-8b]\ngpus: [h100]\nnodes: [{many}]\n"
                                     f"seq_len: [{many}]\nglobal_batch: [{many}]\n")
    t0 = time.monotonic()
    with pytest.raises(GridError, match=r"1,000,000,000 scenarios.*at most 10,000.*MAX_SCEN"):
        load_grid(str(tmp_path / "g.yaml"))
    assert time.monotonic() - t0 < 10 and MAX_SCENARIOS == 10_000
    (tmp_path / "g.yaml").write_text(f"models: [llama3-8b]\ngpus: [h100]\nnodes: [{many}]\n"
                                     "seq_len: [4096, 8192]\n")
    assert len(load_grid(str(tmp_path / "g.yaml")).scenarios) == 2000


def test_plan_deduplicates_and_caps_its_gpus_and_exits_1_when_nothing_fits(run_cli):
    """Issue 29: ``plan --gpu`` with 1,000 copies of h100 ran past 90 s (a plan each); plan
    exited 0 when nothing was feasible, where search exits 1."""
    from tune_cp.cli import MAX_PLAN_GPUS

    t0 = time.monotonic()
    code, out, _ = run_cli("plan", "--model", "llama3-8b", "--gpu", ",".join(["h100"] * 1000),
                           "--max-nodes", "1", "--points", "1")
    assert code == 0 and out.count("h100 (8 per node)") == 1 and time.monotonic() - t0 < 30
    code, _, err = run_cli("plan", "--model", "llama3-8b", "--gpu",
                           ",".join(f"g{i}" for i in range(MAX_PLAN_GPUS + 1)))
    assert code == 2 and "MAX_PLAN_GPUS" in err
    for extra in ((), ("--json",)):
        code, out, _ = run_cli("plan", "--model", "llama3.1-405b", "--gpu", "h100",
                               "--max-nodes", "1", "--points", "1", *extra)
        assert code == 1 and "no feasible configuration" in out


def test_ctrl_c_that_surfaces_as_another_exception_is_an_interruption(run_cli, monkeypatch):
    """A Ctrl-C that lands while a command lazily imports an extension module comes out of the
    import as ``ImportError: initialization failed`` (seen in CI 0.3 s into a search): once the
    process's SIGINT handler (``cli._interrupt``) has seen the signal, any exception is reported
    as the interruption (one line, exit 130), not as an internal error."""
    from tune_cp import cli

    def interrupted_import():
        raise ImportError("initialization failed")

    monkeypatch.setattr(cli, "model_entries", interrupted_import)
    code, _, err = run_cli("models")
    assert code == cli.EXIT_INTERNAL and "internal error: ImportError" in err  # no Ctrl-C seen
    monkeypatch.setattr(cli, "_SIGINT_SEEN", True)
    code, out, err = run_cli("models")
    assert code == cli.EXIT_INTERRUPTED and err == "tune-cp: interrupted (Ctrl-C)\n"
    with pytest.raises(KeyboardInterrupt):
        cli._interrupt(signal.SIGINT, None)
