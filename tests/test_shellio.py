"""Issue 29, the reader, path, stream and process classes: one test per class of hostile input
(the shell reader's bounds, Primus presets and paths, secrets from the environment, output paths
and streams, echoed text, sweep and plan sizes)."""

from __future__ import annotations

import time

import pytest

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
