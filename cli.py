"""tune-cp command line: a thin shell over the library (specs, solver, oracle, agent).

Commands: ``search`` (the default: ``tune-cp --model M --nodes N``), ``check``, ``plan``,
``models``, ``gpus``, ``calibrate``. Every command takes ``--json``. Errors are one line on
stderr with exit code 2 (bad input); ``check`` exits 1 for an illegal configuration.
"""

from __future__ import annotations

import os
import signal
import sys


def _interrupted_while_starting(_signum: int, _frame: object) -> None:
    """Ctrl-C while the ``tune-cp`` process imports its modules (before :func:`run` can report
    it): one line and exit 130, not an import traceback (issue 29)."""
    os.write(2, b"tune-cp: interrupted (Ctrl-C)\n")
    os._exit(130)


if __name__ == "__main__" or os.path.basename(sys.argv[0] if sys.argv else "") == "tune-cp":
    signal.signal(signal.SIGINT, _interrupted_while_starting)  # entry() puts Python's back

import contextlib
import errno
import functools
import gc
import io
import json
import math
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import click
from pydantic import ValidationError

from tune_cp.agent.serialize import (
    check_json,
    cluster_json,
    model_json,
    plan_json,
    run_settings_json,
    strict_json,
)
from tune_cp.config.axes import (
    BACKEND_FIELDS,
    BASELINE_KEYS,
    KNOB,
    KNOBS,
    PLOT_AXES,
    RUN_KNOB,
    FlagKind,
    Knob,
)
from tune_cp.config.specs import (
    GIB,
    MAX_MOE_CAPACITY_FACTOR,
    ClusterSpec,
    ConfigError,
    ModelSpec,
    ParallelConfig,
    Precision,
    Recompute,
    TrainingSpec,
    validation_message,
)
from tune_cp.oracle import params as P
from tune_cp.oracle.inputs import one_line, show_name
from tune_cp.oracle.outputs import check_output_dir, check_output_path, terminal_safe
from tune_cp.solver.defaults import DEFAULT_MEMORY_MARGIN, FRAMEWORK_NAMES, MAX_MEMORY_MARGIN

if TYPE_CHECKING:
    from tune_cp.oracle.memory import MemoryOverheads
    from tune_cp.oracle.projection import Projection
    from tune_cp.solver.check import CheckOutcome
    from tune_cp.solver.settings import RunSettings

# Start-up: ``--help``, ``--version``, ``models``, ``gpus`` and flag errors load only click, the
# specs (pydantic) and the catalogs; the solver (OR-Tools), the oracle's numpy, the agent (DSPy)
# and the plots (matplotlib) are imported by the commands that use them (benchmarks/cli.py).


def without_cyclic_gc(command: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``command`` with Python's cyclic garbage collector off.

    For a command that solves one problem (the search): its cyclic garbage is the expression
    graphs of the CP-SAT models it builds (each :class:`solver.symbolic.Sym` refers to its
    model's bookkeeping, which keeps its expressions), ~80,000 objects and ~3 MB on the canonical
    search; the collector's passes over every object the search allocates cost ~0.1 s of CPU
    (``gc.callbacks`` timing; most of it one pass over the enumeration's objects). In the
    ``tune-cp`` process (:func:`entry`), which ends with the command, the objects left are
    frozen (``gc.freeze``: no collector pass over them, at exit either) and the OS takes the
    memory back; called in-process (:func:`run`, tests), the collector is restored. Not for
    commands that solve many problems (``plan``, ``sweep``), whose garbage would add up."""

    @functools.wraps(command)
    def run_command(*args: Any, **kwargs: Any) -> Any:
        was_on = gc.isenabled()
        gc.disable()
        try:
            return command(*args, **kwargs)
        finally:
            if _PROCESS_ENDS_WITH_COMMAND:
                gc.freeze()
            elif was_on:
                gc.enable()

    return run_command


#: Set by :func:`entry`: this process ends when its command returns (no in-process caller).
_PROCESS_ENDS_WITH_COMMAND = False


def load_model(name: str) -> ModelSpec:
    from tune_cp.oracle.catalog import load_model as load

    return load(named(name, "--model", "a model (see `tune-cp models`) or a config.json"))


def load_gpu(name: str) -> Any:
    from tune_cp.oracle.catalog import load_gpu as load

    return load(named(name, "--gpu", "a GPU (see `tune-cp gpus`) or a GPU file"))


def named(name: str, flag: str, what: str) -> str:
    """``name`` once it is not empty: an empty name (``--gpu ''``, the empty name before ``=`` in
    ``--price-per-gpu-hour =1``) is a path to the catalogs' loaders, ``Path('')`` is ``.``, and
    the user read "GPU file '.' is a directory" (issue 29)."""
    if not str(name).strip():
        fail(f"{flag} {name!r}: the name is empty; name {what}")
    return name


def model_entries() -> dict[str, Any]:
    from tune_cp.oracle.catalog import model_entries as entries

    return entries()


def gpu_entries() -> dict[str, Any]:
    from tune_cp.oracle.catalog import gpu_entries as entries

    return entries()


def check_projection(*args: Any, **kwargs: Any) -> Projection | None:
    from tune_cp.solver.check import check_projection as run

    return run(*args, **kwargs)


def check_configuration(*args: Any, **kwargs: Any) -> CheckOutcome:
    from tune_cp.solver.check import check_configuration as run

    return run(*args, **kwargs)


EXIT_ILLEGAL = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3  # a bug: one line, the traceback with TUNE_CP_DEBUG=1
#: Ctrl-C (SIGINT): the shell's convention, 128 + 2; one line on stderr.
EXIT_INTERRUPTED = 130
#: The reader of stdout went away (``tune-cp ... | head -1``) while click itself wrote (help,
#: usage): exit 0 quietly (not 141, the shell's 128 + SIGPIPE, so that ``set -o pipefail``
#: scripts do not read it as a failure; not 1, which means infeasible). A command's own output
#: (:func:`echo`) goes on to its own exit code instead: 0 found, 1 infeasible.
EXIT_BROKEN_PIPE = 0

# ----------------------------------------------------------------------------- plumbing


class AsciiIntRange(click.IntRange):
    """An integer option written in ASCII digits with an optional leading minus (no ``+``,
    underscores, spaces, or non-ASCII digits such as fullwidth or Arabic-Indic ones, which
    Python's ``int()`` would take), at most 19 digits."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and not re.fullmatch(r"-?[0-9]{1,19}", value):
            self.fail(f"{value!r} is not an integer (write ASCII digits, e.g. 8)", param, ctx)
        return super().convert(value, param, ctx)


class FiniteFloatRange(click.FloatRange):
    """A float option that also refuses NaN and infinities (which pass click's range check)."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        from tune_cp.oracle.inputs import NUMBER_SPELLING

        if isinstance(value, str) and value.strip().lower() not in ("nan", "inf", "-inf") and (
                len(value) > MAX_NUMBER_CHARS or not NUMBER_SPELLING.fullmatch(value.strip())):
            self.fail(f"{value[:40]!r} is not a number (write ASCII digits, e.g. 0.1)", param,
                      ctx)
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


#: Longest number a flag may spell (digits, sign, point, exponent).
MAX_NUMBER_CHARS = 64


class UserError(click.ClickException):
    """A one-line input error (exit 2)."""

    exit_code = EXIT_USAGE


def fail(message: str) -> NoReturn:
    raise UserError(message)


def build(kind: str, factory: Callable[..., Any], **kwargs: Any) -> Any:
    """Construct a spec; a validation error becomes a one-line user error naming the field."""
    try:
        return factory(**kwargs)
    except ValidationError as e:
        fail(f"invalid {kind}: {validation_message(e)}")


def echo(message: Any = "", err: bool = False) -> None:
    """``click.echo`` of a line of text, made safe for a terminal
    (:func:`oracle.outputs.terminal_safe`: the user's names are shown, never obeyed)."""
    _write(terminal_safe(str(message)), err)


def _write(text: str, err: bool = False) -> None:
    """``click.echo``; when the reader has gone away (``| head -1``: a broken pipe), the rest of
    the output goes to ``/dev/null`` and the command ends as it would have, with its own exit
    code (0 found, 1 infeasible), instead of click's exit 1 (issue 29)."""
    try:
        click.echo(text, err=err)
    except BrokenPipeError:
        _silence_stdout(sys.stderr if err else sys.stdout)
    except OSError:
        if not err:
            raise  # stdout: reported on stderr (run), exit 2
        _silence_stdout(sys.stderr)  # stderr itself cannot be written: nothing to say it with


terminal_echo = echo  # for a command whose local ``echo`` picks the stream


def emit_json(data: Any) -> None:
    _write(json.dumps(strict_json(data), indent=2, sort_keys=False, allow_nan=False))


def gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def enum_choice(enum: type) -> click.Choice:
    return click.Choice([e.value for e in enum], case_sensitive=False)


class Progress:
    """A progress line on stderr, drawn only when stderr is a terminal (never into a pipe or a
    file, never on stdout, so ``--json`` output is untouched); erased when done."""

    WIDTH = 24

    def __init__(self, label: str) -> None:
        self.label = label
        self.on = sys.stderr.isatty()
        self.t0 = time.monotonic()

    def _draw(self, text: str) -> None:
        if self.on:
            width = shutil.get_terminal_size((80, 24)).columns - 1
            sys.stderr.write("\r" + terminal_safe(text)[:width].ljust(width))
            sys.stderr.flush()

    def bar(self, done: int, total: int, what: str) -> None:
        """``done`` of ``total`` steps (``total`` may be an estimate), then ``what``."""
        total = max(total, done, 1)
        fill = round(self.WIDTH * done / total)
        self._draw(f"{self.label} [{'#' * fill}{'.' * (self.WIDTH - fill)}] {done}/{total} "
                   f"{what} ({time.monotonic() - self.t0:.0f} s)")

    def close(self) -> None:
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
            self._ticker = None
        if self.on:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()

    # a step whose length is not known (a search's enumeration, the explanation of an empty
    # set): its name and the seconds so far, redrawn every TICK_S by a thread
    TICK_S = 0.5
    _ticker: threading.Thread | None = None
    _what = ""

    def status(self, what: str) -> None:
        """Say ``what`` is being done now; the line keeps counting the seconds until the next
        status or :meth:`close` (nothing at all when stderr is not a terminal)."""
        if not self.on:
            return
        self._what = what
        if self._ticker is None:
            self._stop = threading.Event()
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()
        self._draw_status()

    def _draw_status(self) -> None:
        self._draw(f"{self.label}: {self._what} ({time.monotonic() - self.t0:.0f} s)")

    def _tick(self) -> None:
        while not self._stop.wait(self.TICK_S):
            self._draw_status()


# --------------------------------------------------------------------------- options


def apply_options(f: Callable, options: Sequence[Callable]) -> Callable:
    """``f`` with ``options`` (click decorators) listed in ``--help`` in their order."""
    for opt in reversed(options):
        f = opt(f)
    return f


#: The training flags every command that builds a ``TrainingSpec`` takes (search, check, plan).
TRAINING_OPTIONS: tuple[Callable, ...] = (
    click.option("--gpus-per-node", type=AsciiIntRange(1, 1024), default=None,
                 help="GPUs per node  [default: the GPU's usual node size, 8; 4 for "
                      "GB200/GB300 trays]"),
    click.option("--seq-len", type=AsciiIntRange(1, 1 << 24), default=None,
                 help="Sequence length  [default: the model's usual one]"),
    click.option("--gbs", type=AsciiIntRange(1, 1 << 30), default=None,
                 help="Global batch size in sequences  [default: the model's reference]"),
    click.option("--precision", type=enum_choice(Precision), default="bf16",
                 show_default=True, help="Training precision."),
)


def training_options(f: Callable) -> Callable:
    return apply_options(f, TRAINING_OPTIONS)


def cluster_options(f: Callable | None = None, *, required: bool = True) -> Callable:
    """The model/cluster/training flags. ``required=False`` (``check``): --model and --nodes may
    come from imported launch arguments instead."""
    if f is None:
        return lambda g: cluster_options(g, required=required)
    return apply_options(f, (
        click.option("--model", "model_name", required=required,
                     help="Catalog name (see `tune-cp models`), a Hugging Face config.json, "
                          "or a tune-cp model YAML/JSON file."),
        click.option("--gpu", "gpu_name", default="mi355x", show_default=True,
                     help="Catalog name (see `tune-cp gpus`) or a GPU YAML/JSON file."),
        click.option("--nodes", type=AsciiIntRange(1, 1 << 20), required=required,
                     help="Number of nodes."),
        *TRAINING_OPTIONS,
        click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables."),
    ))


def knob_option(k: Knob) -> Callable:
    """The click option of one registry knob (``config/axes.py::KNOBS``)."""
    if k.kind is FlagKind.INT:
        return click.option(f"--{k.flag}", type=AsciiIntRange(k.lo, k.hi), default=k.default,
                            show_default=k.default is not None, help=k.help)
    if k.kind is FlagKind.CHOICE:
        assert k.choices is not None
        return click.option(f"--{k.flag}", type=enum_choice(k.choices), default=k.default,
                            show_default=k.default is not None, help=k.help)
    if k.kind is FlagKind.FLAG:
        return click.option(f"--{k.flag}", is_flag=True, help=k.help)
    if k.kind is FlagKind.SWITCH:
        return click.option(f"--{k.flag}/--no-{k.flag}", k.param, default=None, help=k.help)
    return click.option(f"--{k.flag}", default=None, help=k.help)  # MODULES


def grad_dtype_option(f: Callable) -> Callable:
    return knob_option(KNOB["grad_reduce_in_fp32"])(f)


def fp8_params_option(f: Callable) -> Callable:
    return knob_option(KNOB["fp8_param_gather"])(f)


_STATE_CHOICES = ("fp32", "bf16", "fp16", "fp8")


def optimizer_state_options(f: Callable) -> Callable:
    """Megatron-LM's precision-aware optimizer flags (``megatron/training/arguments.py``
    L3667-3685 at d98e8a6): the optimizer state's dtypes, fixed per search
    (:class:`tune_cp.config.specs.OptimizerState`)."""
    f = click.option("--exp-avg-sq-dtype", "exp_avg_sq_dtype", default=None,
                     type=click.Choice(_STATE_CHOICES),
                     help="Adam's second moment dtype (needs --use-precision-aware-optimizer) "
                     "[default: fp32]")(f)
    f = click.option("--exp-avg-dtype", "exp_avg_dtype", default=None,
                     type=click.Choice(_STATE_CHOICES),
                     help="Adam's first moment dtype (needs --use-precision-aware-optimizer) "
                     "[default: fp32]")(f)
    f = click.option("--main-params-dtype", "main_params_dtype", default=None,
                     type=click.Choice(_STATE_CHOICES[:3]),
                     help="master weights dtype (needs --use-precision-aware-optimizer; bf16 "
                     "is NeMo 1.x optim.dtype bf16) [default: fp32]")(f)
    return click.option("--use-precision-aware-optimizer", "precision_aware_optimizer",
                        is_flag=True, default=False,
                        help="Transformer Engine FusedAdam holds the optimizer state in the "
                        "dtypes below (fp32 masters as 16-bit remainders over bf16 weights: "
                        "10 B/param instead of 12); needs the distributed optimizer")(f)


def pop_optimizer_state(flags: dict[str, Any]) -> Any:
    """The :class:`OptimizerState` of the flags of :func:`optimizer_state_options` (popped),
    or None when none was given."""
    from tune_cp.config.specs import OptimizerState

    aware = flags.pop("precision_aware_optimizer", False)
    given = {k: flags.pop(n) for k, n in (("main_params", "main_params_dtype"),
             ("exp_avg", "exp_avg_dtype"), ("exp_avg_sq", "exp_avg_sq_dtype")) if flags.get(n)}
    for n in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        flags.pop(n, None)
    if not aware and not given:
        return None
    if not aware:
        low = ", ".join(f"--{k.replace('_', '-')}-dtype {v}" for k, v in given.items())
        fail(f"{low} needs --use-precision-aware-optimizer (Megatron-Core "
             f"optimizer_config.py L466-480: without it every optimizer-state dtype is fp32)")
    return build("optimizer state", OptimizerState, precision_aware=True, **given)


def config_options(f: Callable) -> Callable:
    """Every configuration flag, generated from the axis registry in its order."""
    for k in reversed(KNOBS):
        f = knob_option(k)(f)
    return f


#: One flag per field of the run settings (``solver/settings.py::RunSettings``; a test checks
#: that every field has its flag): search, check and plan take them alike (``settings_options``)
#: and ``run_settings`` reads them back.
SETTINGS_FLAGS: dict[str, Callable] = {
    "constraints": click.option(
        "--constraint", "constraints", multiple=True, metavar="EXPR",
        help="Hard constraint, e.g. 'ep*etp<=8', 'cp==1', 'pp in {2,4}' (repeatable)."),
    "memory_margin": click.option(
        "--memory-margin", type=FiniteFloatRange(0.0, MAX_MEMORY_MARGIN),
        default=DEFAULT_MEMORY_MARGIN, show_default=True,
        help="Fraction of HBM kept free beyond the modelled terms (0 allowed)."),
    "overheads": click.option(
        "--overhead", "overheads", multiple=True, metavar="NAME=VALUE",
        help="Override a memory overhead term, e.g. fragmentation=0.1, "
             "runtime_context_bytes=2GiB, moe_routing_imbalance=0.5 (repeatable)."),
    "allow_cross_scale_up": click.option(
        "--allow-cross-scale-up", is_flag=True,
        help="Allow tp/etp larger than the scale-up domain (NVLink/xGMI)."),
    "framework": click.option(
        "--framework", "framework", type=click.Choice(FRAMEWORK_NAMES), default=None,
        help="The framework that runs the job: its recipes' defaults for the settings that "
             "change memory (FP8 parameter gather, gradient dtype; formats/frameworks.py) "
             "apply to the flags not given, and the memory verdict reads its measured-peak "
             "spread  [default: megatron-lm; an import sets it]"),
    "calibration": click.option(
        "--calibration", "calibration", default=None, metavar="FILE.json",
        help="Time-model constants from `tune-cp calibrate --out`  [default: the shipped "
             "oracle/catalog/calibration.json, fitted on published runs]"),
    # the framework run settings, from the registry (config/axes.py::RUN_KNOBS)
    "cuda_graph_scope": click.option(
        f"--{RUN_KNOB['cuda_graph_scope'].flag}", "cuda_graph_scope", default=None,
        metavar=RUN_KNOB["cuda_graph_scope"].metavar, help=RUN_KNOB["cuda_graph_scope"].help),
    "moe_a2a_overlap": click.option(
        f"--{RUN_KNOB['moe_a2a_overlap'].flag}/--no-{RUN_KNOB['moe_a2a_overlap'].flag}",
        "moe_a2a_overlap", default=False, help=RUN_KNOB["moe_a2a_overlap"].help),
    "moe_capacity_factor": click.option(
        f"--{RUN_KNOB['moe_capacity_factor'].flag}", "moe_capacity_factor",
        type=FiniteFloatRange(0.0, MAX_MOE_CAPACITY_FACTOR, min_open=True), default=None,
        metavar=RUN_KNOB["moe_capacity_factor"].metavar,
        help=RUN_KNOB["moe_capacity_factor"].help),
}


def settings_options(f: Callable) -> Callable:
    """The run-settings flags (``SETTINGS_FLAGS``)."""
    return apply_options(f, tuple(SETTINGS_FLAGS.values()))


def run_settings(flags: dict[str, Any]) -> RunSettings:
    """The run settings from the parsed flags; their parameters are taken out of ``flags``."""
    from tune_cp.solver.settings import RunSettings

    values = {name: flags.pop(name) for name in SETTINGS_FLAGS}
    values["overheads"] = parse_overheads(values["overheads"])
    from tune_cp.solver.constraints import as_constraints

    values["constraints"] = as_constraints(values["constraints"])
    values["cuda_graph_scope"] = values["cuda_graph_scope"] or ()
    return build("settings", RunSettings, **values)


def check_options(model: Any, settings: RunSettings) -> None:
    """Refuse (one line, exit 2) framework run settings Megatron-Core refuses for ``model``
    whatever the layout (``solver/rules.py::options_problem``)."""
    from tune_cp.solver.rules import options_problem

    problem = options_problem(model, settings.options)
    if problem:
        fail(problem)


def imported_options(ctx: click.Context, run: Any, settings: RunSettings) -> RunSettings:
    """The run settings of an imported launch (CUDA graphs, all-to-all overlap, token-drop),
    under the flags given explicitly."""
    from tune_cp.oracle.memory import RunOptions

    given = {f for f in RunOptions.model_fields
             if ctx.get_parameter_source(f) is not click.core.ParameterSource.DEFAULT}
    taken = {f: getattr(run.options, f) for f in RunOptions.model_fields if f not in given}
    if taken == {f: getattr(settings.options, f) for f in taken}:
        return settings
    return build("settings", settings.with_, **taken)


#: The LLM planner's flags (``search --lm ...``), read back by ``LmFlags``.
LM_OPTIONS: tuple[Callable, ...] = (
    click.option("--lm", "lm_model", default=None, metavar="PROVIDER/MODEL",
                 help="LLM for the planner phase through DSPy, e.g. openai/gpt-4o-mini; key from "
                      "TUNE_CP_LM_API_KEY or OPENAI_API_KEY  [default: no LLM phase]"),
    click.option("--lm-base-url", default=None, metavar="URL",
                 help="OpenAI-compatible server (vLLM, Ollama, ...), e.g. "
                      "http://127.0.0.1:8000/v1"),
    click.option("--lm-rounds", type=AsciiIntRange(1, 20), default=3, show_default=True,
                 help="Planner rounds (one LM call each)."),
    click.option("--lm-timeout", type=FiniteFloatRange(1, 3600), default=60.0,
                 show_default=True, help="Seconds one LM call may take."),
    click.option("--lm-budget", type=FiniteFloatRange(1, 86400), default=180.0,
                 show_default=True, help="Seconds the whole LLM phase may take."),
)


def lm_options(f: Callable) -> Callable:
    return apply_options(f, LM_OPTIONS)


class LmFlags:
    """The planner flags (``LM_OPTIONS``) taken out of the parsed flags and checked;
    ``options()`` builds the LM (DSPy is imported only then) as ``SearchOptions`` fields."""

    def __init__(self, flags: dict[str, Any]) -> None:
        self.model: str | None = flags.pop("lm_model")
        self.base_url: str | None = flags.pop("lm_base_url")
        self.rounds: int = flags.pop("lm_rounds")
        self.timeout_s: float = flags.pop("lm_timeout")
        self.budget_s: float = flags.pop("lm_budget")
        if self.model:
            provider, _, lm_id = self.model.partition("/")
            if not provider.strip() or not lm_id.strip():
                fail(f"--lm {self.model!r}: write PROVIDER/MODEL, e.g. openai/gpt-4o-mini (any "
                     f"OpenAI-compatible server: openai/<model> with --lm-base-url)")

    def options(self) -> dict[str, Any]:
        from tune_cp.agent.llm import LlmBudget, make_lm

        lm = make_lm(self.model, self.base_url, timeout_s=self.timeout_s) if self.model else None
        return {"lm": lm, "lm_name": self.model,
                "budget": LlmBudget(rounds=self.rounds, calls=self.rounds, wall_s=self.budget_s,
                                    call_timeout_s=self.timeout_s)}


SIZE_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(name: str, raw: str) -> int:
    """``512MiB``, ``2GiB``, ``1073741824`` -> bytes."""
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)", raw.strip())
    unit = match.group(2).lower() if match else None
    if match is None or unit not in SIZE_UNITS or len(raw) > MAX_NUMBER_CHARS:
        fail(f"--overhead {name}: {raw!r} is not a size (e.g. 512MiB, 2GiB, 1073741824)")
    size = float(match.group(1)) * SIZE_UNITS[unit]
    if not size < MAX_SIZE_BYTES:
        fail(f"--overhead {name}: {raw!r} is not a size below 1 EiB (2**60 bytes)")
    return round(size)


#: Largest size ``--overhead NAME_bytes=`` takes (1 EiB; keeps byte sums within int64).
MAX_SIZE_BYTES = 2**60


def finite_number(what: str, raw: str) -> float:
    """``raw`` as a finite float spelled in ASCII, else a one-line user error naming ``what``."""
    from tune_cp.oracle.inputs import parse_number

    return parse_number(raw.strip(), what)


def parse_overheads(items: Sequence[str]) -> MemoryOverheads:
    from tune_cp.oracle.memory import OVERHEAD_NAMES as fields
    from tune_cp.oracle.memory import MemoryOverheads

    values: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in fields:
            fail(f"--overhead {item!r}: expected NAME=VALUE with NAME in {', '.join(fields)}")
        if name.endswith("_bytes"):
            values[name] = parse_size(name, raw)
        elif name == "backward_working_set":
            flag = raw.strip().lower()
            if flag not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                fail(f"--overhead backward_working_set: {raw!r} must be true or false")
            values[name] = flag in ("true", "1", "yes", "on")
        else:
            values[name] = finite_number(f"--overhead {name}", raw)
    return build("--overhead", MemoryOverheads, **values)


def load_specs(
    model_name: str, gpu_name: str, nodes: int, gpus_per_node: int | None,
    seq_len: int | None, gbs: int | None, precision: str,
    defaults: list[str] | None = None,
) -> tuple[ModelSpec, ClusterSpec, TrainingSpec]:
    """Specs from the common flags; every default taken is appended to ``defaults``."""
    model = load_model(model_name)
    gpu = load_gpu(gpu_name)
    cluster = build("cluster", ClusterSpec, gpu=gpu, num_nodes=nodes,
                    gpus_per_node=gpus_per_node or gpu.gpus_per_node)
    training = build(
        "training settings", TrainingSpec,
        seq_len=seq_len or model.default_seq_len,
        global_batch_size=gbs or model.default_global_batch_size,
        precision=precision,
    )
    if defaults is not None:
        defaults.extend(alias_statements(model_name, gpu_name))
        entry = model_entries().get(model.name)
        why = f": {entry.default_source}" if entry and entry.default_source else ""
        # a model file or config.json has no published batch: say whose defaults these are
        whose = (f"{model.name} default" if entry is not None else
                 "tune-cp's default for a model file (seq: max_position_embeddings up to 8192; "
                 "gbs: 256)")
        if gpus_per_node is None:
            defaults.append(f"--gpus-per-node {cluster.gpus_per_node} (usual {gpu.name} node)")
        if seq_len is None and gbs is None:
            defaults.append(f"--seq-len {training.seq_len} --gbs {training.global_batch_size} "
                            f"({whose}s{why})" if entry is not None else
                            f"--seq-len {training.seq_len} --gbs {training.global_batch_size} "
                            f"({whose})")
        elif seq_len is None:
            defaults.append(f"--seq-len {training.seq_len} ({whose}{why})")
        elif gbs is None:
            defaults.append(f"--gbs {training.global_batch_size} ({whose}{why})")
    return model, cluster, training


def alias_statements(model_name: str | None, gpu_name: str | None) -> list[str]:
    """The catalog names an alias given to --model / --gpu stands for, as defaults-line items
    (``--model llama3-70b (the catalog's alias 'llama3.1-70b')``): no alias is taken silently
    (family names such as ``mixtral`` are refused with their members by the catalog)."""
    from tune_cp.oracle.catalog import catalog_alias

    out = []
    for flag, given in (("model", model_name), ("gpu", gpu_name)):
        canonical = catalog_alias(given, flag) if given else None
        if canonical is not None:
            out.append(f"--{flag} {canonical} (the catalog's alias {given.strip()!r}; "
                       f"`tune-cp {flag}s --json` lists every alias)")
    return out


#: Knobs that mean something only for an MoE model (not stated as defaults for a dense one).
MOE_KNOBS = frozenset({"dispatcher", *BACKEND_FIELDS})


def knob_values(opts: dict[str, Any], only: Sequence[str] | None = None) -> dict[str, Any]:
    """``ParallelConfig`` fields from the parsed configuration flags (``only``: those params)."""
    out: dict[str, Any] = {}
    for k in KNOBS:
        if only is not None and k.param not in only:
            continue
        value = opts[k.param]
        if k.negated:
            value = not value
        elif k.kind is FlagKind.MODULES:
            if not value:
                continue
            value = tuple(m.strip() for m in str(value).split(",") if m.strip())
        out[k.field] = value
    return out


def build_config(opts: dict[str, Any]) -> ParallelConfig:
    return build("configuration", ParallelConfig, **knob_values(opts))


# ------------------------------------------------------------------------------ output


def memory_verdict(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, outcome: Any,
                   settings: Any) -> dict[str, Any] | None:
    """The three-state memory verdict of a check (``oracle/memory_verdict.py``): its state, why
    (the spread and the deciding term) and, at the edge or out of memory, the cheapest single
    change that fits (``agent/memory_advice.py``). None when the layout has no memory."""
    if outcome.memory is None:
        return None
    from tune_cp.oracle.memory_verdict import MemoryState, fits_line_bytes, memory_state

    spread = settings.memory_spread  # the run's framework family (--framework, an import)
    mem, hbm = outcome.memory, cluster.gpu.hbm_bytes
    state = memory_state(mem.peak_bytes, hbm, spread)
    if any(v.rule == "hbm" for v in outcome.violations):
        state = MemoryState.OUT_OF_MEMORY  # the legality line (--memory-margin) decides
    elif state is MemoryState.OUT_OF_MEMORY:  # a --memory-margin below the default's
        state = MemoryState.EDGE
    term = mem.dominant_term
    fits_at = fits_line_bytes(hbm, spread)
    why = (f"peak {mem.peak_bytes / GIB:.1f} GiB; it fits at every measured overhead up to "
           f"{fits_at / GIB:.1f} GiB ({hbm / GIB:.1f} GiB HBM / {spread.high:.2f}): "
           f"{spread.text()}; {term} ({mem.peak.terms[term] / GIB:.1f} GiB) decides")
    room = None
    if state is not MemoryState.FITS and not any(v.rule != "hbm" for v in outcome.violations):
        from tune_cp.agent.memory_advice import cheapest_room

        best = cheapest_room(model, cluster, training, outcome.ctx.cfg, settings, spread)
        if best is not None:
            base = check_projection(outcome)
            room = best.text(base.tokens_per_s_per_gpu if base is not None else 0.0)
    return {"state": state.value, "family": spread.family, "spread_low": spread.low,
            "spread_high": spread.high, "fits_line_bytes": fits_at, "deciding_term": term,
            "why": why, "room": room}


def framework_settings(framework_name: str | None, model: ModelSpec, cfg: ParallelConfig,
                       settings: Any, defaults: list[str]) -> Any:
    """``settings`` with the framework's fragmentation allowance (``formats/frameworks.py::
    framework_fragmentation``) unless ``--overhead fragmentation=`` set one; stated on the
    defaults line."""
    from tune_cp.formats.frameworks import Framework, framework_fragmentation
    from tune_cp.oracle.memory import MemoryOverheads

    if framework_name is None:
        return settings
    frag = framework_fragmentation(Framework(framework_name), model.name, cfg.fsdp)
    if frag is None or settings.overheads.fragmentation != MemoryOverheads().fragmentation:
        return settings
    defaults.append(f"--overhead fragmentation={frag:g} (--framework {framework_name}: "
                    f"expandable_segments:True in its performance runs)")
    return settings.with_(overheads=settings.overheads.model_copy(
        update={"fragmentation": frag}))


def apply_framework(ctx: click.Context, framework_name: str | None, cfg: ParallelConfig,
                    training: TrainingSpec, defaults: list[str]) -> ParallelConfig:
    """``cfg`` with ``--framework``'s recipe defaults (``formats/frameworks.py``) for the memory
    settings whose flags were not given; each one applied, or the framework taken, is stated on
    the defaults line."""
    from tune_cp.formats.frameworks import Framework, framework_defaults

    if framework_name is None:  # Megatron-LM's defaults are the flags' own
        defaults.append("--framework megatron-lm (default)")
        return cfg
    fw = Framework(framework_name)
    fp8 = training.precision is Precision.FP8 or cfg.fp8_recipe is not None
    applied, update = [], {}
    for d in framework_defaults(fw, cfg.fp8_recipe, fp8):
        k = KNOB[d.field]
        if ctx.get_parameter_source(k.param) is not click.core.ParameterSource.DEFAULT:
            continue
        if getattr(cfg, d.field) != d.value:
            update[d.field] = d.value
        applied.append(d.text())
    defaults.append(f"--framework {fw.value}: " + "; ".join(applied) if applied
                    else f"--framework {fw.value}")
    return build("configuration", ParallelConfig, **(cfg.model_dump() | update)) if update else cfg


def describe_setting(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> str:
    return (
        f"{model.name} on {cluster.num_nodes} x {cluster.gpus_per_node} {cluster.gpu.name} "
        f"({cluster.world_size} GPUs), seq {training.seq_len}, gbs {training.global_batch_size}, "
        f"{training.precision.value}"
    )


def describe_config(cfg: ParallelConfig, model: ModelSpec | None = None) -> str:
    from tune_cp.oracle.memory import split_label

    parts = [cfg.label(), f"mbs {cfg.mbs}", f"ga {cfg.ga}"]
    if cfg.recompute is Recompute.FULL:
        n = "all layers" if cfg.recompute_layers is None else f"{cfg.recompute_layers} layer(s)"
        parts.append(f"full recompute ({cfg.recompute_method.value}, {n} per virtual stage)")
    elif cfg.recompute is Recompute.SELECTIVE:
        parts.append(f"selective recompute ({', '.join(cfg.recompute_modules)})")
    else:
        parts.append("no recompute")
    parts.append("FSDP" if cfg.fsdp else
                 ("distributed optimizer" if cfg.distributed_optimizer else "replicated optimizer"))
    if not cfg.grad_reduce_in_fp32:
        parts.append("bf16 gradients")
    parts.append(f"{cfg.schedule_.value} schedule")
    if cfg.sp:
        parts.append("sequence parallel")
    if cfg.fp8_recipe is not None:
        parts.append(f"fp8 {cfg.fp8_recipe.value}")
    if model is not None and (split := split_label(model, cfg)):
        parts.append(split)
    if model is not None and model.is_moe:
        parts.append("MoE backend: " + cfg.backend_label())
    return ", ".join(parts)


def shown_stages(n: int, peak: int) -> list[int]:
    if n <= 8:
        return list(range(n))
    return sorted({0, 1, peak, n - 2, n - 1})


def render_memory(outcome: CheckOutcome) -> list[str]:
    from tune_cp.oracle.memory import TERMS

    mem = outcome.memory
    assert mem is not None
    stages = shown_stages(len(mem.stages), mem.peak_stage)
    used = [t for t in TERMS if any(mem.stages[s].terms[t] for s in stages)]
    width = max(len(t) for t in used + ["total (GiB)"])
    head = "memory per GPU (GiB)".ljust(width) + "".join(f"{'stage ' + str(s):>11}" for s in stages)
    lines = [head]
    lines.append("decoder layers".ljust(width) + "".join(
        f"{mem.stages[s].decoder_layers:>11}" for s in stages))
    for t in used:
        lines.append(t.ljust(width) + "".join(f"{gib(mem.stages[s].terms[t]):>11}" for s in stages))
    lines.append("total".ljust(width) + "".join(f"{gib(mem.stages[s].total_bytes):>11}" for s in stages))
    if len(stages) < len(mem.stages):
        lines.append(f"({len(mem.stages)} stages; showing {', '.join(map(str, stages))}; --json has all)")
    limit = outcome.limit_bytes
    lines.append("")
    lines.append(
        f"HBM {gib(mem.hbm_bytes)} GiB ({outcome.ctx.cluster.gpu.name}), limit {gib(limit)} GiB "
        f"(margin {outcome.ctx.memory_margin:g}); most loaded: stage {mem.peak_stage} at "
        f"{gib(mem.peak_bytes)} GiB, headroom {gib(limit - mem.peak_bytes)} GiB"
    )
    return lines


def plan_mfu_note(model: Any, p: Any, precision: str, calibration: str | None) -> str:
    """One line when plan rows project an MFU above the best published MFU of their class, or
    belong to a class no published run does (oracle.projection.mfu_note gives the
    breakdown-level reason for one configuration)."""
    from tune_cp.oracle.catalog import load_gpu
    from tune_cp.oracle.constants import load_calibration, mfu_class

    arch = load_gpu(p.gpu).architecture
    key = mfu_class(model.is_moe, arch, precision)
    ceilings = (load_calibration(calibration).fitted_on or {}).get("mfu_ceilings") or {}
    ceil = ceilings.get(key)
    if ceilings and not ceil and any(q.feasible and q.mfu for q in p.points):
        from tune_cp.oracle.projection import unbounded_class

        return (f"the MFU of these rows has {unbounded_class(key, ceilings)}: it rests on the "
                f"fitted GEMM efficiency of {precision} on this architecture (`tune-cp check` "
                f"shows the breakdown); verify the GEMM throughput at these shapes before "
                f"relying on it")
    above = [q.nodes for q in p.points if q.feasible and q.mfu and ceil and q.mfu > ceil["mfu"]]
    if not above:
        return ""
    return (f"MFU above the best published {100 * ceil['mfu']:.1f}% for {key} (row "
            f"{ceil['row']}, {ceil['model']} on {ceil['gpu']}) at {', '.join(map(str, above))} "
            f"nodes: those layouts spend most of the step in large GEMMs at the fitted GEMM "
            f"efficiency with little bubble or exposed communication (`tune-cp check` shows the "
            f"breakdown); verify the GEMM throughput at these shapes before relying on it")


def render_projection(p: Projection, top: int = 6) -> list[str]:
    lines = [
        f"projection: {p.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, step {p.step_time_s:.2f} s, "
        f"{p.model_tflops_per_gpu:,.0f} model TFLOP/s/GPU, MFU {100 * p.mfu:.1f}%"
    ]
    parts = sorted(((v, k) for k, v in p.breakdown.items() if v > 0), reverse=True)
    shown = ", ".join(f"{k} {v:.2f} s ({100 * v / p.step_time_s:.0f}%)" for v, k in parts[:top])
    lines.append(f"where the step goes: {shown}")
    lines.append(f"(time model: {p.calibration})")
    if p.evidence:
        lines.append(f"note: {p.evidence}")
    if p.mfu_note:
        lines.append(f"note: {p.mfu_note}")
    return lines


# ------------------------------------------------------------------------------ group


class DefaultGroup(click.Group):
    """``tune-cp --model M --nodes N`` runs ``search``: the first argument that is not a command
    name routes to the default command."""

    default_command = "search"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = [self.default_command, *args]
        elif not args:
            args = ["--help"]
        return super().parse_args(ctx, args)

    # click turns a broken pipe into exit 1 (read as "infeasible" under ``pipefail``) and Ctrl-C
    # into a blank line and "Aborted!"; both are taken out of its hands here and reported by
    # :func:`run` (one line, or none for a broken pipe).
    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _streams_to_run():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _streams_to_run():
            return super().invoke(ctx)


class OutputFailed(Exception):
    """Writing the output failed (``OSError``: a broken pipe, a full disk or ``/dev/full``),
    taken out of click's hands (which turns a broken pipe into exit 1)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


class Interrupted(Exception):
    """Ctrl-C (SIGINT), taken out of click's hands (which prints a blank line and
    "Aborted!")."""


@contextlib.contextmanager
def _streams_to_run() -> Iterator[None]:
    try:
        yield
    except OSError as e:
        raise OutputFailed(e) from e
    except KeyboardInterrupt as e:
        raise Interrupted() from e


def package_version() -> str:
    """The installed distribution's version; from a checkout that is not installed (the package
    on PYTHONPATH), the ``version`` of the ``pyproject.toml`` beside this file."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tune-cp")
    except PackageNotFoundError:
        pyproject = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyproject.toml")
        try:
            with open(pyproject, encoding="utf-8") as fh:
                found = re.search(r'(?m)^version\s*=\s*"([^"]+)"', fh.read())
        except OSError:
            found = None
        return f"{found.group(1)} (not installed)" if found else "unknown (not installed)"


def print_version(ctx: click.Context, _param: Any, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        echo(f"tune-cp, version {package_version()}")
        ctx.exit()


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=print_version, help="Show the version and exit.")
def main() -> None:
    """Find the fastest legal configuration of a distributed LLM training run.

    \b
    tune-cp --model mixtral-8x22b --nodes 4      search (the default command)
    tune-cp check --model ... --tp 1 --pp 4 ...  check one configuration before submitting it
    tune-cp plan --model ... --gpu h100,b200     what-if capacity planning
    tune-cp models | gpus                        list the catalogs
    """


EXPORTERS = ("megatron", "primus", "nemo")
#: Extensions ``--pareto`` / ``--plot`` draw to (matplotlib's vector and raster formats).
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
#: Extensions ``--trials-out`` writes (JSON lines).
TRIALS_SUFFIXES = (".jsonl", ".json")


def export_option(f: Callable) -> Callable:
    return click.option(
        "--export", "export_fmt", type=click.Choice(EXPORTERS), default=None,
        help="Print ready-to-paste launch settings for the configuration (megatron: Megatron-LM "
             "arguments; primus: Primus experiment overrides; nemo: Megatron-Bridge recipe "
             "fields) on stdout; the report goes to stderr.",
    )(f)


def export_text(fmt: str, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                cfg: ParallelConfig, options: Any = None) -> str:
    from tune_cp.formats import (
        to_megatron_args,
        to_nemo_overrides,
        to_primus_overrides,
    )

    fn = {"megatron": to_megatron_args, "primus": to_primus_overrides,
          "nemo": to_nemo_overrides}[fmt]
    return fn(model, cluster, training, cfg, options=options)


def parse_env(items: Sequence[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` items (what a launch script reads from the environment)."""
    env: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name or not name.replace("_", "a").isalnum() or name[0].isdigit() \
                and not name.isdigit():
            fail(f"--env {item!r}: write NAME=VALUE (a shell variable name, or a script "
                 "argument number such as 1=VALUE)")
        env[name] = value
    return env


def import_run(megatron_args: str | None, primus_config: str | None, model_name: str | None,
               env_items: Sequence[str] = (), log: Any = None):
    """An imported launch (or None), read with the model when --model is given. --megatron-args
    takes the text or the path of a launch script; --env values stand for the environment the
    script (or the Primus YAML's ${VAR:default} placeholders) would read. --log: the launch a
    training log's argument dump describes (``calibration/refit.py::log_launch``, as ``calibrate
    --log`` reads it; --megatron-args then completes it, as calibrate's --config does)."""
    if megatron_args is None and primus_config is None and log is None:
        parse_env(env_items)  # a malformed --env is refused all the same
        return None

    from tune_cp.formats import parse_megatron_args, parse_primus_config
    from tune_cp.oracle.inputs import is_file, read_text

    if megatron_args is not None and primus_config is not None:
        fail("give either --megatron-args or --primus-config, not both")
    if log is not None and primus_config is not None:
        fail("give either --log or --primus-config, not both")
    model = load_model(model_name) if model_name else None
    env = parse_env(env_items)
    from tune_cp.formats.shell import ShellError

    text, source = megatron_args, "--megatron-args"
    if text == "-":
        from tune_cp.oracle.inputs import read_stdin

        text = read_stdin("--megatron-args")
        source = "--megatron-args - (standard input)"
    elif text is not None and "\n" not in text and len(text) < 4096 \
            and not text.lstrip().startswith("-") and is_file(text):
        text = read_text(text, "launch script")
        source = f"launch script {show_name(megatron_args)}"
    try:
        if log is not None:  # a formats.logs.LogMeasurement
            from tune_cp.calibration.refit import log_launch

            return log_launch(log, text or "", model)
        if text is not None:
            return parse_megatron_args(text, model=model, env=env)
    except ShellError as e:
        raise ConfigError(f"{source}: {e}") from None
    if primus_config is not None:
        # only --env: the process environment may hold secrets (issue 29)
        return parse_primus_config(primus_config, model=model, env=env)
    return None


#: The click parameters of the configuration flags (from the axis registry).
CONFIG_FLAGS = tuple(k.param for k in KNOBS)


def search_space_defaults(ctx: click.Context, model: ModelSpec, config: dict[str, Any]) -> list[str]:
    """``check``'s defaults that are the search space's rather than a flag's own: an MoE
    model's ``--etp`` not given is 1, the first value of the search's expert-TP domain
    (``solver/space.py::SearchSpace.etp_values``: 1, then tp), so that a layout the search
    printed (``TP8 ... EP8 ETP1``) and the same flags given to ``check`` are one configuration;
    Megatron-LM's own default (d98e8a64 ``arguments.py`` l.587-588:
    ``expert_tensor_parallel_size`` = tp when unset) applies to imported launches only. Every other configuration flag's default is already the
    first value of the search's domain (``tests/test_cli_check.py`` walks them). Sets the value
    in ``config`` and returns the defaults-line items."""
    if not model.is_moe or ctx.get_parameter_source("etp") is not click.core.ParameterSource.DEFAULT:
        return []
    config["etp"] = CHECK_MOE_ETP
    return [f"--etp {CHECK_MOE_ETP} (the search's first expert-TP value for an MoE model; "
            f"pass --etp {config['tp']} for Megatron-LM's default, etp = tp)"]


#: ``check``'s ``--etp`` for an MoE model when not given: the search space's first value.
CHECK_MOE_ETP = 1


@main.command("check")
@cluster_options(required=False)
@config_options
@optimizer_state_options
@settings_options
@click.option("--megatron-args", default=None, metavar="ARGS|SCRIPT",
              help="Check the configuration of a Megatron-LM launch: its arguments as one string "
                   "(a torchrun line or a script's argument block), the path of its launch "
                   "script, or - to read either from standard input (assignments, arrays and "
                   "${VAR:-default} are expanded; unknown "
                   "arguments are listed and ignored). Flags given explicitly override what it "
                   "sets.")
@click.option("--env", "env_items", multiple=True, metavar="NAME=VALUE",
              help="A value the launch script or Primus YAML reads from the environment (or "
                   "N=VALUE for the script's argument N); repeatable. Only these are read: "
                   "tune-cp never reads its own environment for them.")
@click.option("--primus-config", default=None, type=click.Path(dir_okay=False),
              help="Check a Primus experiment YAML (its overrides; the model YAML it names when "
                   "found, else --model).")
@click.option("--log", "log_path", default=None, type=click.Path(dir_okay=False),
              help="Check the run of a Megatron-LM / Primus training log: its argument dump "
                   "(and its start-up size line and global batch), read as `calibrate --log` "
                   "reads it; --megatron-args completes a cut dump.")
@export_option
@click.pass_context
def check_cmd(ctx: click.Context, model_name: str | None, gpu_name: str, nodes: int | None,
              gpus_per_node: int | None, seq_len: int | None, gbs: int | None, precision: str,
              as_json: bool, megatron_args: str | None, env_items: Sequence[str],
              primus_config: str | None, log_path: str | None, export_fmt: str | None,
              **flags: Any) -> None:
    """Check one configuration: legality, per-stage memory, projection and the verdict.

    Exit code 0 when it is legal and fits, 1 when it is not, 2 for bad input.
    """
    from tune_cp.config.specs import training_as_run

    settings = run_settings(flags)
    framework_name = settings.framework
    opt_state = pop_optimizer_state(flags)
    config = flags  # the configuration flags (config/axes.py::KNOBS)
    log = None
    if log_path is not None:
        from tune_cp.formats.logs import read_log
        from tune_cp.oracle.inputs import MAX_LOG_BYTES, check_regular_file, exists

        if not exists(log_path):
            fail(f"--log {log_path!r}: no such file")
        check_regular_file(log_path, "--log file", max_bytes=MAX_LOG_BYTES)
        log = read_log(log_path)
        if log.framework != "megatron":
            fail(f"--log {log_path!r}: a {log.framework} log prints no configuration; check "
                 "its layout with flags")
    run = import_run(megatron_args, primus_config, model_name, env_items, log)
    notes: list[str] = []
    defaults: list[str] = []  # stated like search states its defaults
    if ctx.get_parameter_source("gpu_name") is click.core.ParameterSource.DEFAULT:
        defaults.append(f"--gpu {gpu_name} (default; pass --gpu for the GPU you run on)")
    if run is None:
        if model_name is None or nodes is None:
            fail(f"--{'model' if model_name is None else 'nodes'} is required (or describe the "
                 f"run with --megatron-args / --primus-config)")
        model, cluster, training = load_specs(model_name, gpu_name, nodes, gpus_per_node,
                                              seq_len, gbs, precision, defaults)
        defaults.extend(search_space_defaults(ctx, model, config))
        cfg = build_config(config)
        cfg = apply_framework(ctx, framework_name, cfg, training, defaults)
        taken = [f"--{k.flag} {getattr(k.default, 'value', k.default)}" for k in KNOBS
                 if k.default is not None and k.kind in (FlagKind.INT, FlagKind.CHOICE)
                 and ctx.get_parameter_source(k.param) is click.core.ParameterSource.DEFAULT
                 and (k.field not in MOE_KNOBS or model.is_moe)
                 and (k.param != "recompute_method" or cfg.recompute is Recompute.FULL)]
        if taken:
            defaults.append(" ".join(taken) + " (flag defaults; what they derive is on the "
                            "config line)")
    else:
        model = run.require_model()
        n = nodes or run.num_nodes
        if log is not None and nodes is None:
            from tune_cp.calibration.refit import log_nodes

            gpn = gpus_per_node or run.gpus_per_node or load_gpu(gpu_name).gpus_per_node
            n = log_nodes(log, nodes, gpn)
        if n is None:
            fail(f"--nodes is required: the {run.source} do not give the node count "
                 f"(torchrun --nnodes)")
        gpu = load_gpu(gpu_name)
        cluster = build("cluster", ClusterSpec, gpu=gpu, num_nodes=n,
                        gpus_per_node=gpus_per_node or run.gpus_per_node or gpu.gpus_per_node)
        model_parallel = run.config.tp * run.config.pp * run.config.cp
        if nodes is None and cluster.world_size % model_parallel:
            need = -(-model_parallel // cluster.gpus_per_node)
            notes.append(f"the launch says {n} node(s) x {cluster.gpus_per_node} GPUs, but its "
                         f"tp x pp x cp needs a multiple of {model_parallel} GPUs: pass --nodes "
                         f"{need} (or a multiple) to check the layout it describes")
        training = run.training_spec(model, cluster)
        explicit = {k: v for k, v in (("seq_len", seq_len), ("global_batch_size", gbs)) if v}
        if ctx.get_parameter_source("precision") is not click.core.ParameterSource.DEFAULT:
            explicit["precision"] = precision
        if explicit:
            training = build("training settings", TrainingSpec,
                             **(training.model_dump() | explicit))
            notes.append("from the flags: " + ", ".join(f"{k}={v}" for k, v in explicit.items()))
        given = [f for f in CONFIG_FLAGS
                 if ctx.get_parameter_source(f) is not click.core.ParameterSource.DEFAULT]
        overrides = knob_values(config, given)
        cfg = run.config if not overrides else build(
            "configuration", ParallelConfig, **(run.config.model_dump() | overrides))
        if overrides:
            notes.append("from the flags: " + ", ".join(f"{k}={getattr(v, 'value', v)}"
                                                        for k, v in overrides.items()))
        settings = imported_options(ctx, run, settings)
        if framework_name is None:
            framework_name = "primus" if "primus" in run.source.lower() else "megatron-lm"
            defaults.append(f"--framework {framework_name} (the import)")
            settings = settings.with_(framework=framework_name)
    if opt_state is not None:
        cfg = cfg.model_copy(update={"optimizer_state": opt_state})
    check_options(model, settings)
    settings = framework_settings(framework_name if run is None else None, model, cfg, settings,
                                  defaults)
    from tune_cp.oracle.memory import arithmetic_problem

    if why := arithmetic_problem(model, training, cfg.mbs):  # as a search space checks it
        raise ConfigError(why)
    if ctx.get_parameter_source("memory_margin") is click.core.ParameterSource.DEFAULT:
        defaults.append(f"--memory-margin {settings.memory_margin:g} (default)")
    as_run = training_as_run(training, cfg)  # one precision: an FP8 recipe trains in FP8
    if as_run is not training:
        defaults.append(f"--precision fp8 (the FP8 recipe {cfg.fp8_recipe and cfg.fp8_recipe.value} "
                        f"trains in FP8)")
        training = as_run
    if cfg.fp8_param_gather and training.precision is not Precision.FP8:
        raise ConfigError(f"--fp8-param-gather keeps only FP8 copies of the weights, so it needs "
                          f"FP8 training, but the precision is {training.precision.value}: pass "
                          f"--precision fp8 (or an --fp8-recipe), or drop --fp8-param-gather")
    outcome = check_configuration(model, cluster, training, cfg, settings=settings)
    verdict_state = memory_verdict(model, cluster, training, outcome, settings)
    projection = interval = None
    unprojectable = any(v.rule == "precision" for v in outcome.violations)
    if outcome.memory is not None and not unprojectable:  # the layout exists (may not fit)
        projection = check_projection(outcome)  # what calibrate --log reports, too
        from tune_cp.oracle.uncertainty import residuals_for

        interval = residuals_for(settings.calibration).interval(
            model, cluster, training, outcome.ctx.cfg, projection.tokens_per_s_per_gpu)
    exported = (export_text(export_fmt, model, cluster, training, outcome.ctx.cfg,
                            settings.options) if export_fmt else None)
    imported = None if run is None else {
        "source": run.source, "unknown": run.unknown, "unmodelled": run.unmodelled,
        "ignored": run.ignored,
        "defaults": run.defaults, "notes": run.notes + notes}
    if as_json:
        emit_json({"model": model_json(model), "cluster": cluster_json(cluster),
                   "training": training.model_dump(mode="json"), "defaults": defaults,
                   "run_settings": run_settings_json(settings.options),
                   **check_json(outcome),
                   "projection": projection.model_dump() if projection else None,
                   "interval": interval.to_json() if interval else None,
                   "memory_verdict": verdict_state,
                   "imported": imported, "export": exported})
        sys.exit(0 if outcome.legal else EXIT_ILLEGAL)
    echo = functools.partial(terminal_echo, err=bool(exported))
    echo(f"check: {describe_setting(model, cluster, training)}")
    if defaults:
        echo("defaults: " + "; ".join(defaults))
    if imported is not None:
        echo(f"imported from the {run.source}")
        for what in ("unmodelled", "unknown", "defaults", "notes"):
            if imported[what]:
                label = {"unknown": "unknown arguments (ignored)", "defaults": "defaults taken",
                         "notes": "notes",
                         "unmodelled": "warning: these change memory or time and are not "
                                       "modelled"}[what]
                echo(f"  {label}: " + "; ".join(imported[what]))
    echo(f"config: {describe_config(outcome.ctx.cfg, outcome.ctx.model)}")
    if outcome.ctx.model.is_moe and outcome.ctx.cfg.sync_free_stage >= 3:
        echo("note: sync-free stage 3 preallocates the permutation's worst-case output in every "
             "MoE layer (Primus permute_max_token_num = tokens x tp x ep x top-k); "
             "dispatcher_buffers counts one layer's, a lower bound (the search does not pick "
             "stage 3)")
    if settings.options.label():
        echo(f"run settings: {settings.options.label()}")
    echo()
    if outcome.memory is not None:
        for line in render_memory(outcome):
            echo(line)
        echo()
    if projection is not None:
        for line in render_projection(projection):
            echo(line)
        if interval is not None:
            echo(f"interval: {interval.text()}")
        echo()
    if outcome.legal:
        mem = outcome.memory
        state = verdict_state["state"] if verdict_state else "fits"
        echo(f"verdict: legal, {state} (dominant: {mem.dominant_group.replace('_', ' ')}; "
             f"largest term {mem.dominant_term})")
    else:
        fits = outcome.memory is not None and outcome.memory.peak_bytes <= outcome.limit_bytes
        verdict = "out of memory" if outcome.memory is not None and not fits else "illegal"
        echo(f"verdict: {verdict}")
        for v in outcome.violations:
            echo(f"  [{v.rule}] {v.message}")
    if verdict_state and verdict_state["state"] != "fits":
        echo(f"  memory: {verdict_state['why']}")
        if verdict_state["room"]:
            echo(f"  cheapest change that gives room: {verdict_state['room']}")
    if exported:
        terminal_echo(exported)
    sys.exit(0 if outcome.legal else EXIT_ILLEGAL)


@main.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def models_cmd(as_json: bool) -> None:
    """List the model catalog with parameter counts."""
    entries = list(model_entries().values())
    specs = [e.to_spec() for e in entries]
    if as_json:
        emit_json([model_json(m) | {"source": m.source, "aliases": list(e.aliases)}
                   for m, e in zip(specs, entries, strict=True)])
        return
    echo(f"{'model':16} {'family':12} {'layers':>6} {'hidden':>6} {'experts':>8} "
               f"{'total params':>16} {'active params':>16} {'seq':>6} {'gbs':>5}")
    for m in specs:
        experts = f"{m.num_experts}/{m.moe_top_k}" if m.is_moe else "-"
        echo(f"{m.name:16} {m.family:12} {m.num_layers:>6} {m.hidden_size:>6} {experts:>8} "
                   f"{P.total_params(m):>16,} {P.active_params(m):>16,} {m.default_seq_len:>6} "
                   f"{m.default_global_batch_size:>5}")
    echo("experts: routed experts / top-k; counts follow the Hugging Face implementation "
               "(unpadded vocabulary, MTP excluded); sources: `tune-cp models --json`")


@main.command("gpus")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def gpus_cmd(as_json: bool) -> None:
    """List the GPU catalog."""
    entries = list(gpu_entries().values())
    if as_json:  # the catalog's entry format: what --gpu FILE reads (one entry per file)
        emit_json([e.model_dump(mode="json", exclude_none=True) for e in entries])
        return
    echo(f"{'gpu':8} {'vendor':6} {'HBM GiB':>8} {'BF16 TF':>8} {'FP8 TF':>8} {'HBM TB/s':>9} "
               f"{'scale-up GB/s':>13} {'domain':>6} {'NIC GB/s':>8} {'per node':>8}")
    for e in entries:
        fp8 = f"{e.peak_fp8_tflops:g}" if e.peak_fp8_tflops else "-"
        echo(f"{e.name:8} {e.vendor.value:6} {e.hbm_gib:>8g} {e.peak_bf16_tflops:>8g} "
                   f"{fp8:>8} {e.hbm_tb_per_s:>9g} {e.scale_up_gb_per_s:>13g} "
                   f"{e.scale_up_domain_gpus:>6} {e.nic_gb_per_s:>8g} {e.gpus_per_node:>8}")
    echo("dense peaks; bandwidths per GPU per direction; sources: `tune-cp gpus --json`")


def write_trials(result: Any, path: str) -> None:
    """``--trials-out``: the judged trials, then the whole exhaustive ranking (see its help)."""
    from tune_cp.agent.serialize import ranking_lines, trial_line

    with open(path, "w") as fh:
        for line in [*map(trial_line, result.trials), *ranking_lines(result)]:
            fh.write(json.dumps(strict_json(line), allow_nan=False) + "\n")


def parse_baseline(text: str, model: ModelSpec | None = None,
                   defaults: list[str] | None = None) -> ParallelConfig:
    """``tp=1,pp=4,vpp=2,ep=8,mbs=1,recompute=full,recompute_layers=1`` -> a configuration. An
    MoE ``model``'s etp not given is ``check``'s (:data:`CHECK_MOE_ETP`, the search space's
    first value), stated in ``defaults``."""
    values: dict[str, Any] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in BASELINE_KEYS:
            fail(f"--baseline {item!r}: expected KEY=VALUE with KEY in {', '.join(BASELINE_KEYS)}")
        raw = raw.strip()
        if key == "recompute_modules":
            values[key] = tuple(m for m in raw.split("+") if m)
        elif raw.lower() in ("true", "false"):
            values[key] = raw.lower() == "true"
        elif raw.lower() in ("none", "null") and KNOB[key].default is None \
                and KNOB[key].kind in (FlagKind.INT, FlagKind.CHOICE):
            values[key] = None
        else:
            values[key] = raw
    if model is not None and model.is_moe and "etp" not in values:
        values["etp"] = CHECK_MOE_ETP
        if defaults is not None:
            defaults.append(f"--baseline etp={CHECK_MOE_ETP} (as check's --etp: the search's "
                            f"first expert-TP value for an MoE model)")
    return build("--baseline", ParallelConfig, **values)


def check_baseline_layout(text: str, cfg: ParallelConfig, model: ModelSpec,
                          cluster: ClusterSpec, training: TrainingSpec) -> None:
    """A ``--baseline`` whose tp x pp x cp does not divide the cluster is no layout (its data
    parallel size would be a fraction): refused in one line naming the sizes that divide
    (``solver.rules.world_size``'s message), not reported with a rounded-down DP."""
    from tune_cp.config.resolve import resolve_config
    from tune_cp.solver.rules import RuleContext, world_size

    if cluster.world_size % (cfg.tp * cfg.pp * cfg.cp) == 0:
        return
    ctx = RuleContext(model=model, cluster=cluster, training=training,
                      cfg=resolve_config(cfg, model, cluster, training))
    for v in world_size(ctx):
        fail(f"--baseline {text!r}: {v.message}")


FSDP_HELP = ("Also search Megatron-FSDP (parameters, gradients and optimizer state sharded over "
             "the data-parallel group; Megatron-LM --use-megatron-fsdp) beside the distributed "
             "optimizer, on every layout. Off by default: it doubles the layouts enumerated "
             "(+40-55% time) and changes answers where FSDP's lighter model state buys a "
             "faster layout.")


def fsdp_option(f: Callable) -> Callable:
    """``--fsdp`` of search and plan (``solver.space.searched_optimizers``)."""
    return click.option("--fsdp", "search_fsdp", is_flag=True, help=FSDP_HELP)(f)


@main.command("search")
@cluster_options
@click.option("--top", "top_k", type=AsciiIntRange(1, 1000), default=10, show_default=True,
              help="How many configurations to list.")
@click.option("--prefer", "preferences", multiple=True, metavar="COND[:WEIGHT]",
              help="Soft objective: a condition and the share of throughput it is worth "
                   "(default 0.1, at most 0.5), e.g. 'ep*etp<=8:0.2' (repeatable).")
@click.option("--goal", default="", help="Your goal in words, for the LLM planner (--lm).")
@click.option("--baseline", "baseline_text", default=None, metavar="KEY=VALUE,...",
              help="Your configuration, e.g. 'tp=1,pp=4,vpp=2,ep=8,mbs=1,recompute=full,"
                   "recompute_layers=1'  [default: a published reference for this model, GPU "
                   "and node count, else a stated default]")
@click.option("--allow-fp8", is_flag=True, help="Let the seed phase try FP8 recipes.")
@fsdp_option
@click.option("--all-recompute-levels", is_flag=True,
              help="Keep every full-recompute depth that fits, not only the shallowest.")
@lm_options
@click.option("--trials-out", default=None, metavar="FILE.jsonl",
              help="Write the candidates as JSON lines (.jsonl): first each configuration the "
                   "baseline, seed, LLM and attribution steps judged (legal or not, with its "
                   "violations; of each set the LLM phase narrowed, the best, which it judged), "
                   "then every configuration of the exhaustive ranking, best first (phase "
                   "\"exhaustive ranking\", with its rank, projection and 80% interval).")
@click.option("--timings", is_flag=True, help="Add wall-clock seconds per phase to the report.")
@click.option("--workers", type=AsciiIntRange(1, 256), default=1, show_default=True,
              help="Processes for the CP-SAT enumeration (its slices; same result in the same "
                   "order).")
@click.option("--pareto", "pareto_path", default=None, metavar="FILE.png",
              help="Draw the feasible set (projected throughput against peak memory) to this PNG.")
@click.option("--pareto-color", type=click.Choice(list(PLOT_AXES)), default="pp",
              show_default=True, help="Axis that colours the --pareto points.")
@click.option("--verify", "verify_n", type=AsciiIntRange(1, 20), default=None, metavar="N",
              help="Write short benchmark launches (Megatron-LM, Primus, Megatron-Bridge) of the "
                   "N best distinct candidates to --verify-dir, ready to run and to feed back "
                   "with `tune-cp calibrate --log`.")
@click.option("--verify-dir", default="tune-cp-verify", show_default=True, metavar="DIR",
              help="Folder for --verify.")
@grad_dtype_option
@optimizer_state_options
@fp8_params_option
@export_option
@settings_options
@click.pass_context
@without_cyclic_gc
def search_cmd(ctx: click.Context, as_json: bool, top_k: int, preferences: Sequence[str],
               goal: str, baseline_text: str | None, allow_fp8: bool, search_fsdp: bool,
               all_recompute_levels: bool,
               trials_out: str | None, timings: bool, workers: int,
               pareto_path: str | None, pareto_color: str, export_fmt: str | None,
               grad_reduce_in_bf16: bool, fp8_param_gather: bool,
               verify_n: int | None, verify_dir: str, **flags: Any) -> None:
    """Search the fastest legal configuration (the default command).

    \b
    tune-cp --model mixtral-8x22b --nodes 4
    tune-cp --model llama3-70b --gpu h100 --nodes 8 --constraint 'cp==1' --top 5 --json
    """
    defaults: list[str] = []
    if ctx.get_parameter_source("gpu_name") is click.core.ParameterSource.DEFAULT:
        defaults.append(f"--gpu {flags['gpu_name']} (default)")
    model_arg, gpu_arg = flags["model_name"], flags["gpu_name"]
    model, cluster, training = load_specs(
        *(flags.pop(k) for k in ("model_name", "gpu_name", "nodes", "gpus_per_node", "seq_len",
                                 "gbs", "precision")), defaults)
    from tune_cp.agent.search import NoFeasibleConfiguration, Preference, SearchOptions, search

    # every flag and output path is checked before any work starts (issue 16)
    settings = run_settings(flags)
    framework_name = settings.framework
    opt_state = pop_optimizer_state(flags)
    if opt_state is not None and search_fsdp:
        fail("--search-fsdp with the precision-aware optimizer: Megatron-FSDP takes "
             "--megatron-fsdp-main-params-dtype instead, which tune-cp does not model; drop one")
    check_options(model, settings)
    prefs = tuple(Preference.parse(p) for p in preferences)
    baseline = parse_baseline(baseline_text, model, defaults) if baseline_text else None
    if baseline is not None:
        check_baseline_layout(baseline_text or "", baseline, model, cluster, training)
    planner = LmFlags(flags)
    if trials_out is not None:
        trials_out = str(check_output_path(trials_out, "--trials-out", TRIALS_SUFFIXES))
    if pareto_path is not None:
        pareto_path = str(check_output_path(pareto_path, "--pareto", PLOT_SUFFIXES))
    if verify_n:
        verify_dir = str(check_output_dir(verify_dir, "--verify-dir"))
    if fp8_param_gather and training.precision is not Precision.FP8:
        raise ConfigError(f"--fp8-param-gather keeps only FP8 copies of the weights, so it needs "
                          f"FP8 training, but the precision is {training.precision.value}: pass "
                          f"--precision fp8, or drop --fp8-param-gather")
    fixed = build("configuration", ParallelConfig, grad_reduce_in_fp32=not grad_reduce_in_bf16,
                  fp8_param_gather=fp8_param_gather)
    fixed = apply_framework(ctx, framework_name, fixed, training, defaults)
    settings = framework_settings(framework_name, model, fixed, settings, defaults)
    progress = Progress("search")  # on a terminal's stderr only
    opts = SearchOptions(
        settings=settings, top_k=top_k, progress=progress.status, preferences=prefs, baseline=baseline,
        allow_fp8=allow_fp8, fsdp=search_fsdp, goal=goal, **planner.options(),
        keep_all_recompute_levels=all_recompute_levels, workers=workers,
        grad_reduce_in_fp32=fixed.grad_reduce_in_fp32,
        fp8_param_gather=fixed.fp8_param_gather and training.precision is Precision.FP8,
        **({} if opt_state is None else {"optimizer_state": opt_state}),
    )
    try:
        result = search(model, cluster, training, opts)
    except NoFeasibleConfiguration as e:
        progress.close()
        if as_json:
            from tune_cp.agent.serialize import infeasible_search_json

            emit_json(infeasible_search_json(e.explanation, model, cluster, training, defaults,
                                             settings.options,
                                             [c.expr for c in settings.constraints]))
        else:
            echo(f"search: {describe_setting(model, cluster, training)}")
            echo(f"no feasible configuration: {e}")
        sys.exit(EXIT_ILLEGAL)
    finally:
        progress.close()
    result.defaults[:0] = defaults
    from tune_cp.agent.report import check_command, input_argument

    result.check_command = check_command(
        input_argument(model_arg, model.name, "model"), input_argument(gpu_arg, cluster.gpu.name, "gpu"),
        model, cluster, training, result.best.config, settings)
    if trials_out:
        write_trials(result, trials_out)
    from tune_cp.agent.report import render_search
    from tune_cp.agent.serialize import search_json

    if pareto_path:
        from tune_cp.agent.plots import pareto_plot

        pareto_plot(result, pareto_path, pareto_color)
    exported = (export_text(export_fmt, model, cluster, training, result.best.config,
                            settings.options) if export_fmt else None)
    verified: list[str] = []
    if verify_n:
        from tune_cp.agent.verify import write_verify

        try:
            verified = [str(p) for p in write_verify(result, verify_n, verify_dir)]
        except OSError as e:
            fail(f"--verify-dir {verify_dir!r}: cannot write there ({e.strerror})")
    if as_json:
        data = search_json(result, timings)
        if verify_n:
            data["verify"] = {"dir": verify_dir, "candidates": verified}
        if exported is not None:
            data["export"] = exported
        if pareto_path:
            data["pareto"] = pareto_path
        emit_json(data)
        return
    for line in render_search(result, timings):
        echo(line, err=exported is not None)
    if pareto_path:
        echo(f"pareto plot: {pareto_path}", err=exported is not None)
    if verified:
        echo(f"verify: {len(verified)} short benchmark launches in {verify_dir}/ "
                   f"({', '.join(os.path.basename(v) for v in verified)}); see "
                   f"{verify_dir}/README.txt", err=exported is not None)
    if exported is not None:
        echo(exported)


#: Highest price per GPU-hour taken (keeps costs finite; no GPU rents for more).
MAX_PRICE_PER_GPU_HOUR = 1e6


def parse_prices(text: str | None, gpus: Sequence[str]) -> dict[str, float]:
    """``2.5`` (every GPU) or ``h100=2.5,b200=4.1`` -> price per GPU-hour by GPU name."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, sep, raw = item.partition("=")
        if not sep:
            name, raw = "", name
        elif not name.strip() or "=" in raw:
            fail(f"--price-per-gpu-hour {item!r}: write PRICE (every GPU) or GPU=PRICE, "
                 f"e.g. h100=2.5")
        price = finite_number(f"--price-per-gpu-hour {item!r}", raw.strip())
        if not 0 <= price <= MAX_PRICE_PER_GPU_HOUR:
            fail(f"--price-per-gpu-hour {item!r}: a price is a finite number from 0 to "
                 f"{MAX_PRICE_PER_GPU_HOUR:g} per GPU-hour")
        if not sep:
            out.update(dict.fromkeys(gpus, price))
            continue
        key = load_gpu(name.strip()).name
        if key not in gpus:
            fail(f"--price-per-gpu-hour {item!r}: {key} is not among --gpu ({', '.join(gpus)})")
        out[key] = price
    return out


@main.command("plan")
@click.option("--model", "model_name", required=True,
              help="Catalog name, a Hugging Face config.json, or a tune-cp model file.")
@click.option("--gpu", "gpu_names", default="mi355x", show_default=True,
              help="One or several GPUs, comma separated (e.g. h100,b200,mi355x).")
@training_options
@click.option("--tokens", type=FiniteFloatRange(1, 1e18), default=None,
              help="Tokens to train, e.g. 15e12: adds time to train, GPU-hours and cost.")
@click.option("--price-per-gpu-hour", "prices", default=None, metavar="PRICE|GPU=PRICE,...",
              help="Cost per GPU-hour, one for all or per GPU (h100=2.5,b200=4).")
@click.option("--max-nodes", type=AsciiIntRange(1, 1 << 16), default=1024, show_default=True,
              help="Largest node count considered.")
@click.option("--points", type=AsciiIntRange(1, 16), default=6, show_default=True,
              help="Node counts in the table: the smallest that fits, then powers of two.")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png",
              help="Draw throughput and time to train against nodes to this PNG.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@fsdp_option
@grad_dtype_option
@fp8_params_option
@settings_options
@click.pass_context
def plan_cmd(ctx: click.Context, model_name: str, gpu_names: str, gpus_per_node: int | None,
             seq_len: int | None, gbs: int | None, precision: str, tokens: float | None,
             prices: str | None, max_nodes: int, points: int, plot_path: str | None,
             as_json: bool, search_fsdp: bool, grad_reduce_in_bf16: bool, fp8_param_gather: bool,
             **flags: Any) -> None:
    """What-if capacity planning: the smallest cluster that fits and, over node counts, the best
    configuration's throughput, time to train, GPU-hours and cost, for one or several GPUs
    (FP8 falls back to BF16 on GPUs without FP8).

    Exit code 0 when some GPU fits at some node count, 1 when none does (as the search), 2 for
    bad input.
    """
    from tune_cp.agent.plan import plan, training_for_precision
    from tune_cp.oracle.uncertainty import band_text, bias_notes

    settings = run_settings(flags)
    framework_name = settings.framework

    if plot_path is not None:
        plot_path = str(check_output_path(plot_path, "--plot", PLOT_SUFFIXES))
    model = load_model(model_name)
    check_options(model, settings)
    names = list(dict.fromkeys(n.strip() for n in gpu_names.split(",") if n.strip()))
    if not names:
        fail("--gpu: name at least one GPU (see `tune-cp gpus`)")
    if len(names) > MAX_PLAN_GPUS:
        fail(f"--gpu: {len(names):,} GPUs named; plan compares at most {MAX_PLAN_GPUS} "
             f"(MAX_PLAN_GPUS: each is a search over node counts); name fewer")
    gpus = list({g.name: g for g in map(load_gpu, names)}.values())  # h100 and H100 once
    aliases = alias_statements(model_name, None) + [
        a for n in names for a in alias_statements(None, n)]
    seq = seq_len or model.default_seq_len
    batch = gbs or model.default_global_batch_size
    price_map = parse_prices(prices, [g.name for g in gpus])
    fp8 = Precision(precision) is Precision.FP8
    if fp8_param_gather and not fp8:
        fail(f"--fp8-param-gather keeps only FP8 copies of the weights, so it needs FP8 "
             f"training, but the precision is {precision}: pass --precision fp8, or drop "
             f"--fp8-param-gather")
    framework_lines: list[str] = []
    fixed = apply_framework(ctx, framework_name,
                            build("configuration", ParallelConfig,
                                  grad_reduce_in_fp32=not grad_reduce_in_bf16,
                                  fp8_param_gather=fp8_param_gather),
                            build("training settings", TrainingSpec, seq_len=seq,
                                  global_batch_size=batch, precision=Precision(precision)),
                            framework_lines)
    settings = framework_settings(framework_name, model, fixed, settings, framework_lines)
    grad_reduce_in_bf16 = not fixed.grad_reduce_in_fp32
    if framework_name is not None:  # Megatron-LM's defaults are the flags' own: not stated
        aliases = aliases + framework_lines
    bar = Progress("planning")
    plans = plan(model, [(g, gpus_per_node or g.gpus_per_node) for g in gpus],
                 training_for_precision(seq, batch, Precision(precision)), tokens=tokens,
                 prices=price_map, max_nodes=max_nodes, points=points, settings=settings,
                 progress=bar.bar, fsdp=search_fsdp,
                 grad_reduce_in_fp32=not grad_reduce_in_bf16,
                 fp8_param_gather=fixed.fp8_param_gather and fp8)
    bar.close()
    if plot_path:
        from tune_cp.agent.plots import plan_plot

        plan_plot(plans, plot_path, tokens)
    if as_json:
        from tune_cp.agent.search import ANSWER_RULE

        emit_json({"model": model.name, "seq_len": seq, "global_batch_size": batch, "rule": ANSWER_RULE,
                   "precision": precision, "grad_reduce_in_fp32": not grad_reduce_in_bf16,
                   "fsdp_searched": search_fsdp,
                   "run_settings": run_settings_json(settings.options),
                   "tokens": tokens, "gpus": [plan_json(p) for p in plans], "plot": plot_path,
                   "defaults": aliases})
        sys.exit(plan_exit_code(plans))
    echo(f"plan: {model.name}, seq {seq}, gbs {batch}, {precision}"
               + (", bf16 gradients" if grad_reduce_in_bf16 else "")
               + (", FSDP searched" if search_fsdp else "")
               + (f", {tokens:.3g} tokens" if tokens else "")
               + (f"; run settings: {settings.options.label()}"
                  if settings.options.label() else ""))
    if aliases:
        echo("defaults: " + "; ".join(aliases))
    for p in plans:
        echo("")
        if p.min_nodes is None:
            echo(f"{p.gpu}: {p.note}")
            continue
        first = next((q for q in p.points if q.nodes == p.min_nodes), None)
        edge = first is not None and first.memory_state not in (None, "fits")
        echo(f"{p.gpu} ({p.gpus_per_node} per node): fits from {p.min_nodes} node"
                   f"{'s' if p.min_nodes != 1 else ''} ({p.min_nodes * p.gpus_per_node} GPUs)"
                   + (", at the edge of memory (oracle/memory_verdict.py: above HBM / the "
                      "largest measured overhead)" if edge else ""))
        head = (f"  {'nodes':>5} {'GPUs':>6} {'best layout':36} {'tok/s/GPU':>9} "
                f"{'80% interval':>14} {'MFU':>6} {'cluster tok/s':>13} {'memory':>6}")
        if tokens:
            head += f" {'days':>8} {'GPU-hours':>11}"
            if p.price_per_gpu_hour is not None:
                head += f" {'cost':>12}"
        echo(head)
        for q in p.points:
            if not q.feasible:
                echo(f"  {q.nodes:>5} {q.gpus:>6} no feasible configuration")
                continue
            c = q.config
            layout = (f"TP{c['tp']} PP{c['pp']} VPP{c['vpp']} CP{c['cp']} EP{c['ep']} "
                      f"mbs{c['mbs']}")
            if c["dispatcher"] != "alltoall" and c["ep"] > 1:  # the search may pick another
                layout += f" {c['dispatcher']}"
            if c["fsdp"]:  # --fsdp
                layout += " FSDP"
            iv = q.interval
            band = (band_text(iv["low_tokens_per_s_per_gpu"], iv["high_tokens_per_s_per_gpu"],
                              not iv["contains_projection"]) if iv else "")
            line = (f"  {q.nodes:>5} {q.gpus:>6} {layout:36} {q.tokens_per_s_per_gpu:>9,.0f} "
                    f"{band:>14} {100 * q.mfu:>5.1f}% {q.cluster_tokens_per_s:>13,.0f} "
                    f"{'fits' if q.memory_state == 'fits' else 'edge':>6}")
            if tokens:
                line += f" {q.days:>8.1f} {q.gpu_hours:>11,.0f}"
                if q.cost is not None:
                    line += f" {q.cost:>12,.0f}"
            echo(line)
        note = plan_mfu_note(model, p, precision, settings.calibration)
        if note:
            echo(f"  note: {note}")
    echo("")
    from tune_cp.agent.search import ANSWER_RULE

    echo("time to train = tokens / (tokens/s/GPU x GPUs); GPU-hours = GPUs x time; cost = "
               "GPU-hours x price. Each row is the answer of `tune-cp search` at that node count "
               f"(without --lm; a sweep's row is the same), by the search's rule: {ANSWER_RULE}; "
               "the seed phase's best replaces it when its lower bound is higher.")
    classes = sorted({q.interval["class_used"] for p in plans for q in p.points
                      if q.feasible and q.interval})
    if classes:
        echo("80% interval: 10th-90th percentile of the out-of-fold residuals of class "
                   + "; ".join(classes) + " (oracle/catalog/residuals.json)")
        for n in bias_notes([q.interval["bias_note"] for p in plans for q in p.points
                             if q.feasible and q.interval]):
            echo(n)
    if plot_path:
        echo(f"plot: {plot_path}")
    sys.exit(plan_exit_code(plans))


#: Most distinct GPUs one plan compares (the catalog holds a dozen; a list of 1,000 copies of
#: h100 ran past 90 s: names are deduplicated, then counted).
MAX_PLAN_GPUS = 16


def plan_exit_code(plans: Sequence[Any]) -> int:
    """The search's rule: 1 (:data:`EXIT_ILLEGAL`) when nothing is feasible, here when no GPU
    fits at any node count up to ``--max-nodes``; else 0."""
    return 0 if any(p.min_nodes is not None for p in plans) else EXIT_ILLEGAL


@main.command("calibrate")
@click.option("--runs", "runs_paths", multiple=True, type=click.Path(dir_okay=False),
              help="CSV of measured runs with the columns of published_runs.csv; repeatable "
                   "(the shipped constants: --runs benchmarks/published_runs.csv --runs "
                   "benchmarks/amd_published_runs.csv).")
@click.option("--log", "log_paths", multiple=True, type=click.Path(dir_okay=False),
              help="A training log of your cluster (Megatron-LM / Primus, torchtitan); "
                   "repeatable. Refits the constants with the published runs as the prior.")
@click.option("--config", "log_config", default=None, type=click.Path(dir_okay=False),
              help="The launch arguments beside the logs: Megatron-LM arguments (a file), or a "
                   "torchtitan job TOML (torchtitan logs do not print their configuration).")
@click.option("--model", "model_name", default=None,
              help="The model of the logs (catalog name or config.json) when their arguments do "
                   "not describe it.")
@click.option("--gpu", "gpu_name", default=None, help="The logs' GPU (--log: required).")
@click.option("--nodes", type=AsciiIntRange(1, 1 << 16), default=None,
              help="Nodes of the logged runs when the log does not print its world size.")
@click.option("--gpus-per-node", type=AsciiIntRange(1, 1024), default=None,
              help="GPUs per node  [default: the GPU's usual node size]")
@click.option("--out", "out_path", default=None, metavar="FILE.json",
              help="Write the fitted constants here (pass it back with --calibration).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def calibrate_cmd(runs_paths: Sequence[str], log_paths: Sequence[str], log_config: str | None,
                  model_name: str | None, gpu_name: str | None, nodes: int | None,
                  gpus_per_node: int | None, out_path: str | None, as_json: bool) -> None:
    """Fit the time model's constants on measured runs (a runs CSV) or refit them for your
    cluster from its training logs (--log)."""
    from tune_cp.calibration.calibrate import calibrate
    from tune_cp.oracle.constants import format_constants
    from tune_cp.oracle.inputs import MAX_LOG_BYTES, check_regular_file, exists

    if bool(runs_paths) == bool(log_paths):
        fail("give --runs FILE.csv or --log FILE (repeatable), one of the two")
    if out_path is not None:
        out_path = str(check_output_path(out_path, "calibrate --out", (".json",)))
    if log_paths:
        from tune_cp.calibration.refit import calibrate_from_logs, read_log_runs

        if gpu_name is None:
            fail("--log needs --gpu (the logs' GPU; see `tune-cp gpus`)")
        for p in log_paths:
            if not exists(p):
                fail(f"--log {p!r}: no such file")
            check_regular_file(p, "--log file", max_bytes=MAX_LOG_BYTES)
        if log_config is not None:
            check_regular_file(log_config, "--config file")
        gpu = load_gpu(gpu_name)
        runs = read_log_runs(list(log_paths), gpu=gpu,
                             gpus_per_node=gpus_per_node or gpu.gpus_per_node,
                             model=load_model(model_name) if model_name else None, nodes=nodes,
                             config=log_config, gpu_name=gpu_name, model_name=model_name)
        bar = Progress("calibrate")
        result = calibrate_from_logs(runs, out_path,
                                     progress=lambda d, t: bar.bar(d, t, "fit iterations"))
        bar.close()
        if as_json:
            emit_json(result.to_json())
            return
        echo(result.summary())
        return
    for runs_path in runs_paths:
        if not exists(runs_path):
            fail(f"--runs {runs_path!r}: no such file")
        check_regular_file(runs_path, "--runs file")
    shown = " ".join(runs_paths)
    bar = Progress("calibrate")
    report = calibrate(runs_paths[0] if len(runs_paths) == 1 else list(runs_paths), out_path,
                       progress=lambda d, t: bar.bar(d, t, f"fit iterations on {shown}"))
    bar.close()
    if not report.rows_used:
        fail(f"--runs {shown!r}: no row with a measured tokens_per_sec_per_gpu could be "
             f"represented ({len(report.rows_skipped)} rows skipped)")
    if as_json:
        emit_json({"rows_used": report.rows_used,
                   "rows_skipped": [{"row": r, "reason": why} for r, why in report.rows_skipped],
                   "mape": report.mape, "median_ape": report.median_ape,
                   "prior_mape": report.prior_mape, "out": report.out_path,
                   "calibration": report.table.to_json()})
        return
    echo(report.summary())
    echo(format_constants(report.table))


# ------------------------------------------------------------------------------- sweep


@main.command("sweep")
@click.argument("grid_path", metavar="GRID.yaml", type=click.Path(dir_okay=False))
@click.option("--out", "out_path", required=True, metavar="FILE.csv",
              help="Result table: FILE.csv, or FILE.parquet (needs pip install "
                   "'tune-cp[sweep]'). One row per scenario, sorted by scenario.")
@click.option("--workers", type=AsciiIntRange(1, 1024), default=1, show_default=True,
              help="Local processes (1: this process). With --ray: the CPUs of a local Ray "
                   "cluster started here.")
@click.option("--ray", "ray_address", default=None, metavar="auto|local|ADDRESS",
              help="Run each scenario as a Ray task: 'auto' joins this machine's running Ray "
                   "cluster (RAY_ADDRESS, else the one 'ray start' recorded, if it answers) or "
                   "starts a local one; 'local' always starts a local one; else a cluster "
                   "address (ray://head:10001). Says on stderr which cluster it runs on. Needs "
                   "pip install 'tune-cp[ray]'.")
@click.option("--resume", is_flag=True,
              help="Keep the rows already in --out (same scenario, same inputs) and run only the "
                   "rest; rows with status error run again.")
@click.option("--plot", "plot_dir", default=None, metavar="DIR",
              help="Draw the cost / time-to-train frontier per model and the best layout per "
                   "cell into this folder (PNG).")
@click.option("--table", "show_table", is_flag=True,
              help="Also print the rows as a compact table (scenario, layout, throughput, "
                   "MFU, peak memory, days, GPU-hours, cost).")
@click.option("--no-progress", is_flag=True, help="No progress line on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def sweep_cmd(grid_path: str, out_path: str, workers: int, ray_address: str | None,
              resume: bool, plot_dir: str | None, show_table: bool, no_progress: bool,
              as_json: bool) -> None:
    """Run a grid of scenarios (models x GPUs x nodes x sequence x batch x precision), each one
    search, into one table.

    \b
    tune-cp sweep benchmarks/grids/example.yaml --out results.csv
    tune-cp sweep grid.yaml --out results.parquet --workers 8 --resume
    tune-cp sweep grid.yaml --out results.csv --ray auto --plot plots/
    """
    from tune_cp.agent.sweep import Progress, load_grid, make_engine, output_format, run_sweep

    out_path = str(check_output_path(out_path, "--out", (".csv", ".parquet")))
    output_format(out_path)
    grid = load_grid(grid_path)
    if plot_dir:
        plot_dir = str(check_output_dir(plot_dir, "--plot"))
    engine = make_engine(workers, ray_address)
    progress = Progress(len(grid.scenarios), enabled=not no_progress)
    try:
        report = run_sweep(grid.scenarios, out_path, engine, resume=resume, progress=progress)
    except KeyboardInterrupt:
        echo(f"\ntune-cp: interrupted; {out_path} holds the rows written so far "
                   f"(run again with --resume to finish)", err=True)
        sys.exit(130)
    plots: list[str] = []
    if plot_dir:
        from tune_cp.agent.sweep_plots import sweep_plots

        plots = sweep_plots(report.rows, plot_dir, grid.name)
    summary = {"grid": grid_path, "out": out_path, "scenarios": report.total,
               "computed": report.computed, "resumed": report.resumed, "ok": report.ok,
               "infeasible": report.infeasible, "failed": report.failed,
               "engine": report.engine, "plots": plots}
    if as_json:
        emit_json(summary)
    else:
        if show_table:
            from tune_cp.agent.sweep import render_table

            for line in render_table(report.rows):
                echo(line)
            echo("")
        echo(f"sweep {grid.name}: {report.total} scenarios ({report.computed} computed, "
                   f"{report.resumed} kept from {out_path}) on {report.engine}: {report.ok} ok, "
                   f"{report.infeasible} infeasible, {report.failed} failed -> {out_path}")
        for p in plots:
            echo(f"plot: {p}")
    sys.exit(EXIT_ILLEGAL if report.failed else 0)


# ------------------------------------------------------------------------- entry point


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code; every error is one line on stderr."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            main.main(args=args, prog_name="tune-cp", standalone_mode=False)
        finally:
            sys.stdout.flush()  # a failed write shows here, not as Python's exit message
    except SystemExit as e:
        return int(e.code or 0)
    except (OutputFailed, OSError) as e:
        error = e.error if isinstance(e, OutputFailed) else e
        if error.errno == errno.EPIPE:
            # the reader went away (``| head``): stop quietly, exit 0 (EXIT_BROKEN_PIPE)
            _silence_stdout()
            return EXIT_BROKEN_PIPE
        where = f" {error.filename}" if error.filename else " to stdout"
        _silence_stdout()
        echo(f"tune-cp: error: cannot write the output{where}: "
                   f"{error.strerror or error}", err=True)
        return EXIT_USAGE
    except (Interrupted, KeyboardInterrupt, click.exceptions.Abort):
        return refuse(args, "interrupted", "Ctrl-C", EXIT_INTERRUPTED)
    except click.ClickException as e:
        return refuse(args, "error", one_line(e.format_message()), e.exit_code)
    except ConfigError as e:
        return refuse(args, "error", one_line(str(e)), EXIT_USAGE)
    except Exception as e:  # a bug: one line, the traceback only when asked for
        if _SIGINT_SEEN:  # a Ctrl-C turned into another exception (an import's initialisation)
            return refuse(args, "interrupted", "Ctrl-C", EXIT_INTERRUPTED)
        if os.environ.get("TUNE_CP_DEBUG"):
            raise
        return refuse(args, "internal error", f"{type(e).__name__}: {one_line(str(e))[:500]} "
                                              f"(set TUNE_CP_DEBUG=1 for the traceback)",
                      EXIT_INTERNAL)
    return 0


def refuse(args: Sequence[str], kind: str, message: str, code: int) -> int:
    """Say ``tune-cp: KIND: MESSAGE`` on stderr and return ``code``; a search asked for
    ``--json`` also prints its JSON document on stdout with ``status`` "error" and ``error``
    this message (an internal error's with its kind), so that every outcome of ``search --json``
    has one schema (``docs/json.md``)."""
    echo(f"tune-cp: {kind} ({message})" if kind == "interrupted" else
         f"tune-cp: {kind}: {message}", err=True)
    if is_search_json(args):
        from tune_cp.agent.serialize import error_search_json

        try:
            emit_json(error_search_json(message if kind == "error" else f"{kind}: {message}"))
        except OSError:  # stdout is what failed (closed, full): stderr already said the error
            _silence_stdout()
    return code


def is_search_json(args: Sequence[str]) -> bool:
    """Whether ``args`` run ``search`` (named, or the default command) with ``--json``."""
    if "--json" not in args or not args:
        return False
    first = args[0]
    return first == "search" or (first not in main.commands and not first.startswith("-h")
                                 and first not in ("--help", "--version"))


#: Threads of OpenBLAS, numpy's BLAS, in a tune-cp process unless the environment says
#: otherwise. tune-cp's numpy work is element-wise on arrays of a few thousand rows (and a few
#: 20 x 20 solves in ``calibrate``): OpenBLAS's pool of one thread per core, started when numpy
#: is imported, speeds none of it up and costs ~0.12 s of CPU per process on the 2-core
#: machines (``import numpy``: 0.25 -> 0.12 s; benchmarks/cli.py).
BLAS_THREADS = "1"


def _silence_stdout(stream: Any = None) -> None:
    """Point stdout (or ``stream``) at ``/dev/null`` so that what is still written, and
    Python's final flush, cannot fail."""
    stream = sys.stdout if stream is None else stream
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test's capture)
        pass


class _ClosedStdout(io.TextIOBase):
    """``sys.stdout`` when the process started with file descriptor 1 closed (``tune-cp >&-``),
    where Python sets it to None and the first write or flush was ``AttributeError`` (exit 3;
    issue 29's independent campaign, benchmarks/attack.py). Writing raises ``EBADF`` as a
    closed descriptor does, so that :func:`run` says "cannot write the output to stdout: Bad
    file descriptor", exit 2 (as ``ls >&-`` does); flushing has nothing to flush."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))

    def flush(self) -> None:
        return None


def _stand_in_for_closed_streams() -> None:
    """A process started with stdout or stderr closed gets :class:`_ClosedStdout` for stdout
    (its output fails with one line, exit 2) and ``/dev/null`` for stderr (nothing can carry a
    message; the exit code still says what happened)."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (the process's)
    if sys.stdout is None:
        sys.stdout = _ClosedStdout()


def _workers_import_this_module() -> None:
    """Make ``sweep``'s worker processes (forkserver/spawn, ``agent/sweep.py::LocalEngine``)
    import ``tune_cp.cli`` as their ``__mp_main__`` instead of re-running the script that started
    the process. A console script without an ``if __name__ == "__main__"`` guard (this
    checkout's ``.venv/bin/tune-cp`` is ``sys.exit(entry())``) ran the whole command again in
    every worker, which died bootstrapping ("An attempt has been made to start a new process
    before the current process has finished its bootstrapping phase"): every scenario of
    ``sweep --workers 2`` failed, exit 1 (issue 29's independent campaign). multiprocessing's
    ``spawn.get_preparation_data`` runs the main module by name when it has a ``__spec__``
    (``init_main_from_name``), and ``tune_cp.cli``'s own guard keeps that import inert."""
    import importlib.util

    main_module = sys.modules.get("__main__")
    if main_module is None or getattr(main_module, "__spec__", None) is not None:
        return  # ``python -m tune_cp.cli``: already by name
    try:
        spec = importlib.util.find_spec("tune_cp.cli")
    except (ImportError, ValueError):
        return
    if spec is not None:
        main_module.__spec__ = spec


#: Set by :func:`_interrupt` when the ``tune-cp`` process receives a Ctrl-C: an interrupt that
#: lands inside a lazily imported extension module's initialisation comes out of the import as
#: ``ImportError: initialization failed``, which :func:`run` then reports as an interruption.
_SIGINT_SEEN = False


def _interrupt(_signum: int, _frame: object) -> None:
    """The ``tune-cp`` process's SIGINT handler: Python's own (KeyboardInterrupt), remembered."""
    global _SIGINT_SEEN
    _SIGINT_SEEN = True
    raise KeyboardInterrupt


def entry() -> None:
    """The ``tune-cp`` process: one BLAS thread (:data:`BLAS_THREADS`; set before any command
    imports numpy), then :func:`run`; the process ends with the command
    (:func:`without_cyclic_gc`)."""
    global _PROCESS_ENDS_WITH_COMMAND
    if signal.getsignal(signal.SIGINT) in (_interrupted_while_starting,
                                           signal.default_int_handler):
        signal.signal(signal.SIGINT, _interrupt)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", BLAS_THREADS)
    _PROCESS_ENDS_WITH_COMMAND = True
    _stand_in_for_closed_streams()
    _workers_import_this_module()
    code = run()
    # the command is over: a Ctrl-C while Python shuts down (which puts SIGINT's default back)
    # would kill the process by the signal instead of ending it with its code
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":
    entry()
