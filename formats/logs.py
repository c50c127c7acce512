"""Training logs users already have -> measured runs (``tune-cp calibrate --log FILE...``).

Readers (the line formats are the frameworks' own print statements):

* **Megatron-LM** (and Primus, which prints Megatron's lines): ``megatron/training/training.py``
  ``training_log``: `` iteration N/ M | ... | elapsed time per iteration (ms): T | throughput per
  GPU (TFLOP/s/GPU): F | ... | global batch size: B | ...``; ``megatron/training/utils.py``
  ``report_memory``: ``[Rank r] (after N iterations) memory (MB) | allocated: a | max allocated:
  m | reserved: r | max reserved: x``; the argument dump ``arguments.py::_print_args``:
  ``------------------------ arguments ------------------------`` then ``  name ....... value``
  lines (every value kind it prints is read by :func:`dump_value`; the dump becomes a launch in
  :func:`formats.parse_argument_dump`); and ``initialize.py``'s ``using world size: W, data-parallel size: D, context-parallel
  size: C, tensor-model-parallel size: T, pipeline-model-parallel size: P`` line.
* **Primus** prints Megatron-LM's lines with ``elapsed time per iteration (ms): inst/avg``,
  ``tokens per GPU (tokens/s/GPU): inst/avg`` and ``hip mem usage/free/total/usage_ratio:``
  (its ``print_rank_last`` patch of ``training_log``); the instantaneous values are read, and the
  printed tokens/s/GPU is used as the measurement when present.
* **torchtitan** (``torchtitan/components/metrics.py`` ``MetricsProcessor.log``): ``step: N
  loss: L  [grad_norm: g]  memory: X GiB(p%)  tps: T  tflops: F  mfu: u%`` (``tps``: tokens per
  second per GPU, ``memory``: peak reserved GiB). torchtitan does not print its configuration; give
  its job TOML with ``--config`` (``[parallelism]``, ``[training]``, ``[activation_checkpoint]``).

The step time of a log is the median of its iteration lines after the first
:data:`WARMUP_ITERATIONS` (compilation, allocator warm-up and the first all-reduces make them
slow); tokens/s/GPU is ``global batch x sequence length / step time / world size`` (Megatron-LM)
or the median ``tps`` (torchtitan). The measured peak is the largest ``max allocated``
(Megatron-LM) or ``memory`` (torchtitan, reserved) seen.
"""

from __future__ import annotations

import re
import statistics
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from tune_cp.config.specs import MAX_GPUS, ConfigError, Spec

#: iteration lines at the start of a log left out of the median (warm-up steps).
WARMUP_ITERATIONS = 2
MIB = 2**20
GIB = 2**30

_MEGATRON_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)")
_ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*([\d.]+)")
_TFLOPS = re.compile(r"(?:throughput|compute) per GPU \(TFLOP/s/GPU\):\s*([\d.]+)")
#: Primus (and Megatron-LM 26.x): tokens/s/GPU, the first number the instantaneous one
_TOKENS = re.compile(r"(?:tokens per GPU \(tokens/s/GPU\)|tokens/s/GPU inst/harmonic mean):"
                     r"\s*([\d.]+)")
#: Primus on ROCm: ``hip mem usage/free/total/usage_ratio: 253.38GB/2.60GB/255.98GB/98.98%``
_HIP_MEM = re.compile(r"hip mem usage/free/total/usage_ratio:\s*([\d.]+)\s*G")
_GBS = re.compile(r"global batch size:\s*(\d+)")
_MEMORY = re.compile(r"memory \(MB\)\s*\|\s*allocated:\s*([\d.]+)\s*\|\s*max allocated:\s*([\d.]+)"
                     r"(?:\s*\|\s*reserved:\s*([\d.]+))?(?:\s*\|\s*max reserved:\s*([\d.]+))?")
_ARGS_START = re.compile(r"-{8,}\s*arguments\s*-{8,}")
_ARGS_END = re.compile(r"-{8,}\s*end of arguments\s*-{8,}|^\s*-{20,}\s*$")
#: one argument line: ``'  {} {} {}'.format(arg, '.' * (48 - len(arg)), value)`` (no dots for a
#: name of 48 characters or more, so two spaces; the value may be empty and the line's trailing
#: space stripped by the tool that kept the log)
_ARG_LINE = re.compile(r"^\s{1,4}([A-Za-z_][A-Za-z0-9_]*)(?:\s\.+(?:\s(.*?))?|\s\s(.*?))\s*$")
#: where an argument line starts after a log prefix: a name then dots, or a name of 47
#: characters or more then two spaces
_ARG_START_AT = re.compile(r"\s{1,4}[A-Za-z_][A-Za-z0-9_]*\s\.")
_LONG_ARG_START_AT = re.compile(r"\s{1,4}[A-Za-z_][A-Za-z0-9_]{46,}\s\s")
_WORLD = re.compile(r"using world size:\s*(\d+)(.*)")
_SIZE = re.compile(r"([a-z-]+?)[- ]size:\s*(\d+)")
_TITAN_STEP = re.compile(
    r"step:\s*(\d+)\s+loss:\s*([\d.eE+-]+).*?memory:\s*([\d.]+)\s*GiB\s*\(\s*([\d.]+)%\)\s*"
    r"tps:\s*([\d,]+)\s+tflops:\s*([\d.,]+)\s+mfu:\s*([\d.]+)%")
#: a log prefix before the line proper (timestamps, ``[rank0]:``, ``[titan] ...  - INFO -``).
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class LogMeasurement:
    """What one training log says: framework, the measured step, memory and the launch arguments
    it printed."""

    path: str
    framework: str  # "megatron" (Megatron-LM / Primus) or "torchtitan"
    iterations: int  # iteration lines read
    used: int  # iteration lines in the median (after warm-up)
    step_time_s: float | None = None
    tflops_per_gpu: float | None = None
    tokens_per_s_per_gpu: float | None = None  # torchtitan's tps; Megatron: from the step time
    mfu: float | None = None
    global_batch_size: int | None = None
    peak_bytes: int | None = None  # max allocated (Megatron) / peak reserved (torchtitan)
    peak_kind: str = ""
    world_size: int | None = None
    sizes: dict[str, int] = field(default_factory=dict)  # from "using world size: ..."
    args: dict[str, str] = field(default_factory=dict)  # the argument dump, name -> text

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "args"} | {
            "arguments_read": len(self.args)}


def _clean(line: str) -> str:
    return _ANSI.sub("", line.rstrip("\n"))


#: Words of the lines a log is read for (iteration and step lines, the memory report, the
#: start-up lines); every other line outside the argument dump is dropped as it is read, so a
#: log of :data:`oracle.inputs.MAX_LOG_BYTES` is never held whole.
_KEPT_WORDS = ("iteration", "step:", "memory (MB)", "using world size", "using torch.bfloat16")


def _kept_lines(p: Path) -> list[str]:
    """The lines of the log :func:`read_log` reads, cleaned (:func:`_clean`), in order: the
    argument dump's block and the lines with one of :data:`_KEPT_WORDS`."""
    out: list[str] = []
    inside = False
    with p.open(errors="replace") as fh:  # universal newlines, as str.splitlines
        for raw in fh:
            x = _clean(raw)
            if _ARGS_START.search(x):
                inside = True
            elif inside and _ARGS_END.search(x) and not _ARG_LINE.match(x):
                out.append(x)
                inside = False
                continue
            if inside or any(w in x for w in _KEPT_WORDS):
                out.append(x)
    return out


def _median_after_warmup(values: list[tuple[int, float]]) -> tuple[float | None, int]:
    if not values:
        return None, 0
    kept = [v for i, v in values if i > WARMUP_ITERATIONS] or [v for _, v in values]
    return statistics.median(kept), len(kept)


def read_log(path: str | Path) -> LogMeasurement:
    """Read a Megatron-LM / Primus or torchtitan training log (see module docstring). Raises a
    one-line ConfigError when the file has no iteration line of either framework."""
    from tune_cp.oracle.inputs import MAX_LOG_BYTES, check_regular_file

    p = check_regular_file(path, "--log file", max_bytes=MAX_LOG_BYTES)
    try:
        lines = _kept_lines(p)
    except OSError as e:
        raise ConfigError(f"--log {str(path)!r}: cannot read it ({e.strerror})") from None
    num, whole = _readers(path)
    megatron = [(whole(m.group(1), "iteration"), m.group(3)) for x in lines
                if (m := _MEGATRON_ITER.search(x)) and _ELAPSED.search(m.group(3))]
    titan = [m for x in lines if (m := _TITAN_STEP.search(x))]
    if megatron:
        out = LogMeasurement(str(path), "megatron", len(megatron), 0)
        elapsed = [(i, num(_ELAPSED.search(s).group(1), "elapsed time per iteration (ms)"))  # type: ignore
                   for i, s in megatron]
        step_ms, out.used = _median_after_warmup(elapsed)
        out.step_time_s = step_ms / 1000 if step_ms else None
        tf = [(i, num(m.group(1), "TFLOP/s/GPU")) for i, s in megatron if (m := _TFLOPS.search(s))]
        out.tflops_per_gpu = _median_after_warmup(tf)[0]
        tok = [(i, num(m.group(1), "tokens/s/GPU")) for i, s in megatron
               if (m := _TOKENS.search(s))]
        out.tokens_per_s_per_gpu = _median_after_warmup(tok)[0]
        gbs = [whole(m.group(1), "global batch size") for _, s in megatron
               if (m := _GBS.search(s))]
        out.global_batch_size = gbs[-1] if gbs else None
        peaks = [num(m.group(2), "max allocated (MB)") for x in lines if (m := _MEMORY.search(x))]
        hip = [num(m.group(1), "hip mem usage (GB)") for _, s in megatron
               if (m := _HIP_MEM.search(s))]
        if peaks:
            out.peak_bytes, out.peak_kind = int(max(peaks) * MIB), "max allocated"
        elif hip:  # Primus divides by 1024**3 and prints "GB"
            out.peak_bytes, out.peak_kind = int(max(hip) * GIB), "hip mem usage"
        out.args = read_argument_dump(lines)
        if "bf16" not in out.args and any("using torch.bfloat16 for parameters" in x
                                          for x in lines):
            out.args["bf16"] = "True"  # initialize.py prints it under --bf16
        for x in lines:
            if m := _WORLD.search(x):
                out.world_size = whole(m.group(1), "world size")
                out.sizes = {k.replace("-model", "").replace("-", "_"): whole(v, k + " size")
                             for k, v in _SIZE.findall(m.group(2))}
                break
        if out.world_size is None and "world_size" in out.args:
            out.world_size = _int_or_none(out.args["world_size"])
        return out
    if titan:
        # one line per rank is common; keep the first line of each step
        by_step: dict[int, re.Match[str]] = {}
        for m in titan:
            by_step.setdefault(whole(m.group(1), "step"), m)
        steps = sorted(by_step)
        out = LogMeasurement(str(path), "torchtitan", len(steps), 0)
        tps = [(s, num(by_step[s].group(5).replace(",", ""), "tps")) for s in steps]
        out.tokens_per_s_per_gpu, out.used = _median_after_warmup(tps)
        out.tflops_per_gpu = _median_after_warmup(
            [(s, num(by_step[s].group(6).replace(",", ""), "tflops")) for s in steps])[0]
        mfu = _median_after_warmup([(s, num(by_step[s].group(7), "mfu")) for s in steps])[0]
        out.mfu = mfu / 100 if mfu is not None else None
        out.peak_bytes = int(max(num(by_step[s].group(3), "memory (GiB)") for s in steps) * GIB)
        out.peak_kind = "peak reserved"
        return out
    raise ConfigError(f"--log {str(path)!r}: no training iteration line found (Megatron-LM "
                      "'elapsed time per iteration (ms)' or torchtitan 'step: N  loss: ...  tps:')")


#: Longest number a log line may spell (digits and point): a larger one is no measurement.
MAX_LOG_NUMBER_CHARS = 24
#: Most digits of a whole number in a log (int64 has 19).
MAX_LOG_INT_DIGITS = 19


def _readers(path: str | Path) -> tuple[Callable[[str, str], float], Callable[[str, str], int]]:
    """The number readers of one log: a finite decimal of at most
    :data:`MAX_LOG_NUMBER_CHARS` characters, a whole number of at most
    :data:`MAX_LOG_INT_DIGITS` digits; anything else is a one-line ConfigError naming the log,
    the field and the value."""
    import math

    def fail(text: str, what: str, legal: str) -> ConfigError:
        shown = text if len(text) <= 40 else text[:37] + "..."
        return ConfigError(f"--log {str(path)!r}: {what} {shown!r} is not {legal}")

    def num(text: str, what: str) -> float:
        try:
            value = float(text) if len(text) <= MAX_LOG_NUMBER_CHARS else math.inf
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise fail(text, what, f"a finite number of at most {MAX_LOG_NUMBER_CHARS} "
                       "characters")
        return value

    def whole(text: str, what: str) -> int:
        if len(text) > MAX_LOG_INT_DIGITS:
            raise fail(text, what, f"a whole number of at most {MAX_LOG_INT_DIGITS} digits")
        return int(text)

    return num, whole


def _int_or_none(text: str) -> int | None:
    if len(text) > MAX_LOG_INT_DIGITS:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def read_argument_dump(lines: list[str]) -> dict[str, str]:
    """The ``name ..... value`` lines of Megatron-LM's argument dump (empty when absent)."""
    out: dict[str, str] = {}
    inside = False
    for x in lines:
        body = x
        if inside and (m := _ARG_START_AT.search(x) or _LONG_ARG_START_AT.search(x)):
            body = x[m.start():]  # a log prefix before the line proper ("[rank0]: ...")
        if not inside:
            if _ARGS_START.search(x):
                inside = True
            continue
        if _ARGS_END.search(x) and not _ARG_LINE.match(body):
            if out:
                break
            continue
        if (m := _ARG_LINE.match(body)) and (m.group(3) is None or len(m.group(1)) >= 47):
            out[m.group(1)] = m.group(2) if m.group(3) is None else m.group(3)
            out[m.group(1)] = out[m.group(1)] or ""
    return out


# ------------------------------------------------------------------- the argument dump's values

#: How Megatron-LM prints one argument (``megatron/training/arguments.py::_print_args``,
#: d98e8a64dd L1990-2001): ``'  {} {} {}'.format(arg, '.' * (48 - len(arg)), getattr(args,
#: arg))``, i.e. ``str()`` of the parsed (and ``validate_args``-derived) value. The kinds a
#: released Megatron-LM (and Primus, which prints Megatron's dump) writes there, and how
#: :func:`dump_value` reads each:
#:
#: * ``None``, ``True`` / ``False``, integers, floats (``1e-05``, ``0.00015``): themselves;
#: * lists and tuples (``['p2p']``, ``[0]``, ``[]``, ``(128, 0)``): a list of their items;
#: * enum members, printed ``AttnBackend.auto`` (``megatron/core/transformer/enums.py``
#:   ``AttnBackend``, L51) or, inside a list, ``<CudaGraphModule.attn: 'attn'>``: the member's name;
#: * torch dtypes (``params_dtype torch.bfloat16``, ``main_grads_dtype torch.float32``): Megatron's
#:   own spelling of the dtype (``validate_args``' ``dtype_map``, L1077: ``fp32``, ``bf16``,
#:   ``fp16``, ``fp8``), else the dtype's name;
#: * anything else (paths, ``969, 30, 1``, an empty string, an object's repr): the text.
DUMP_DTYPES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16",
               "half": "fp16", "uint8": "fp8"}
_DUMP_ENUM = re.compile(r"^([A-Z][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)$")
_DUMP_ENUM_REPR = re.compile(r"<[A-Z][A-Za-z0-9_]*\.([A-Za-z_][A-Za-z0-9_]*): [^<>]*>")
_DUMP_DTYPE = re.compile(r"^torch\.([a-z0-9_]+)$")
_DUMP_INT = re.compile(r"^-?\d+$")
#: Longest list or tuple text :func:`dump_value` parses (longer ones stay text: a layer pattern
#: is read by :func:`formats.keys.layer_pattern`, which has its own bound).
MAX_DUMP_LIST_CHARS = 4096


def dump_value(text: str) -> Any:
    """One value of the argument dump as Python (see :data:`DUMP_DTYPES` above for the kinds)."""
    import ast

    t = text.strip()
    if t in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[t]
    if _DUMP_INT.match(t) and len(t.lstrip("-")) <= MAX_LOG_INT_DIGITS:
        return int(t)
    if m := _DUMP_ENUM.match(t):
        return m.group(2)
    if m := _DUMP_DTYPE.match(t):
        return DUMP_DTYPES.get(m.group(1), m.group(1))
    if t[:1] in "[(" and t[-1:] in "])" and len(t) <= MAX_DUMP_LIST_CHARS:
        try:
            value = ast.literal_eval(_DUMP_ENUM_REPR.sub(lambda m: repr(m.group(1)), t))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return t
        if isinstance(value, list | tuple):
            return [dump_value(str(v)) if isinstance(v, str) and _DUMP_DTYPE.match(v) else v
                    for v in value]
        return t
    try:
        number = float(t)
    except ValueError:
        return text.strip()
    return number if len(t) <= MAX_LOG_NUMBER_CHARS and number == number \
        and abs(number) != float("inf") else t


# ----------------------------------------------------------------------------- torchtitan

#: torchtitan job TOML keys -> tune-cp names (``torchtitan/config/job_config.py``).
TITAN_KEYS = {
    ("parallelism", "tensor_parallel_degree"): "tp",
    ("parallelism", "pipeline_parallel_degree"): "pp",
    ("parallelism", "context_parallel_degree"): "cp",
    ("parallelism", "expert_parallel_degree"): "ep",
    ("parallelism", "data_parallel_shard_degree"): "dp_shard",
    ("parallelism", "data_parallel_replicate_degree"): "dp_replicate",
    ("parallelism", "pipeline_parallel_schedule"): "pp_schedule",
    ("parallelism", "enable_async_tensor_parallel"): "async_tp",
    ("training", "local_batch_size"): "local_batch_size",
    ("training", "batch_size"): "local_batch_size",
    ("training", "global_batch_size"): "global_batch_size",
    ("training", "seq_len"): "seq_len",
    ("parallelism", "pipeline_parallel_microbatch_size"): "mbs",
    ("activation_checkpoint", "mode"): "ac_mode",
    ("model", "name"): "model_name",
    ("model", "flavor"): "model_flavor",
}


#: torchtitan ``activation_checkpoint.mode`` values tune-cp models (``job_config.py``
#: ``ActivationCheckpoint.mode``: ``selective``, ``full``, ``none``).
TITAN_AC_MODES = ("none", "selective", "full")


class TitanSettings(Spec):
    """The settings of :data:`TITAN_KEYS`, validated strictly (``oracle/inputs.py::validate``)
    before use. The bounds are torchtitan's (``torchtitan/distributed/parallel_dims.py::
    ParallelDims._validate``: ``dp_replicate >= 1``, ``dp_shard == -1 or >= 1``, ``cp, tp, pp,
    ep >= 1``; ``job_config.py``: ``global_batch_size`` -1 is derived from the local batch) and
    tune-cp's cluster bound (:data:`config.specs.MAX_GPUS`)."""

    tp: int = Field(default=1, ge=1, le=MAX_GPUS)
    pp: int = Field(default=1, ge=1, le=MAX_GPUS)
    cp: int = Field(default=1, ge=1, le=MAX_GPUS)
    ep: int = Field(default=1, ge=1, le=MAX_GPUS)
    dp_shard: int = Field(default=-1, ge=-1, le=MAX_GPUS)
    dp_replicate: int = Field(default=1, ge=1, le=MAX_GPUS)
    pp_schedule: str = ""
    async_tp: bool = False
    local_batch_size: int = Field(default=1, ge=1, le=1 << 30)
    global_batch_size: int = Field(default=-1, ge=-1, le=1 << 30)
    seq_len: int | None = Field(default=None, ge=1, le=1 << 24)
    mbs: int | None = Field(default=None, ge=1, le=1 << 30)
    ac_mode: str = "none"
    model_name: str = ""
    model_flavor: str = ""


def read_torchtitan_config(path: str | Path) -> dict[str, Any]:
    """The settings of a torchtitan job TOML that tune-cp models (:data:`TITAN_KEYS`), checked
    like every user file (``oracle/inputs.py``: size, UTF-8, nesting, finite numbers) and
    against :class:`TitanSettings`; every failure is a one-line ConfigError."""
    from tune_cp.oracle.inputs import check_tree, read_text, show_name, validate

    where = f"--config file {show_name(path)}"
    try:
        data = tomllib.loads(read_text(path, "--config file"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not a readable torchtitan TOML ({e})") from None
    except RecursionError:
        raise ConfigError(f"{where}: tables/arrays nest too deeply") from None
    check_tree(data, where)
    out: dict[str, Any] = {}
    for (section, key), name in TITAN_KEYS.items():
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [{section}] must be a table, got "
                              f"{type(table).__name__}")
        if key in table:
            out.setdefault(name, table[key])
    toml_key = {name: f"{section}.{key}" for (section, key), name in TITAN_KEYS.items()}
    try:
        checked = validate(TitanSettings, out, "")
    except ConfigError as e:  # named by the TOML's key, not the field's
        name, _, rest = str(e).partition(" ")
        name = name.rstrip(":")
        raise ConfigError(f"{where}: {toml_key.get(name, name)}{str(e)[len(name):]}") from None
    if checked.ac_mode.lower() not in TITAN_AC_MODES:
        raise ConfigError(f"{where}: activation_checkpoint.mode {checked.ac_mode!r} is not "
                          f"modelled; choose {', '.join(TITAN_AC_MODES)}")
    return {k: getattr(checked, k) for k in out}
