"""Issue 29, the reader, path, stream and process classes: one test per class of hostile input
(the shell reader's bounds, Primus presets and paths, secrets from the environment, output paths
and streams, echoed text, sweep and plan sizes)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tune_cp.formats import parse_primus_config
from tune_cp.formats.keys import MAX_PRESET_DEPTH, MAX_PRESET_READS
from tune_cp.formats.shell import (
    ARITH_MAX,
    MAX_EXPANDED_CHARS,
    MAX_SCRIPT_CHARS,
    MAX_SHELL_DEPTH,
    expand_launch,
)
from tune_cp.oracle.specs import ConfigError

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
