"""Safe reading of every user file and value: the one place the checks live.

Every reader of a user file (model and GPU files, Hugging Face ``config.json``, Primus YAML,
calibration JSON, runs CSV) goes through :func:`read_text` and, for structured data,
:func:`parse_json` / :func:`parse_yaml`; numbers read from flags and CSV cells go through
:func:`finite`. Each failure is a one-line :class:`~config.specs.ConfigError` naming the file
(or flag), the value and what would be legal, so the CLI exits 2 instead of hanging, running out
of memory or printing ``internal error``.

The checks, all made before the data reaches a spec:

* **File type and size before reading**: the path must name a regular file (not a directory,
  device such as ``/dev/zero``, FIFO or socket, which could block or never end) of at most
  :data:`MAX_INPUT_BYTES`; a name the OS refuses (``ENAMETOOLONG``, a symlink loop, a missing
  file) is reported with the OS's reason.
* **Text**: UTF-8 (a byte-order mark is allowed); anything else names the offset of the first
  bad byte.
* **Structure** (:func:`check_tree`): nesting at most :data:`MAX_NESTING` deep; no recursive
  YAML anchor (``loop: &L [*L]``); at most :data:`MAX_EXPANDED_NODES` values with every YAML
  alias counted where it is used (a 271-byte "billion laughs" alias bomb expands to 9**9
  values; PyYAML shares the aliased object, and this bound keeps every later walk of the tree
  small); integers within int64; floats finite (JSON ``NaN``/``Infinity``, YAML ``.nan``/``.inf``
  refused). Integers over 4,300 digits (Python's ``int`` limit) are refused while parsing.
* **Numbers** (:func:`finite`, :func:`positive`): NaN and infinities are refused wherever a
  number is read.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from tune_cp.config.specs import ConfigError

#: Largest user file read (16 MiB): the largest Hugging Face config.json is a few KiB, the
#: published runs CSV about 100 KiB; a bigger file is not a configuration.
MAX_INPUT_BYTES = 16 * 2**20
#: Largest training log read (``calibrate --log``, ``check --log``; the one limit of both, checked
#: by the CLI and by ``formats/logs.py::read_log``): logs of long runs reach hundreds of MiB. The
#: log is read line by line and only the lines it is read for are kept
#: (``formats/logs.py::_kept_lines``), so the limit bounds the time, not the memory held.
MAX_LOG_BYTES = 512 * 2**20
#: Deepest nesting of lists and mappings in a JSON/YAML file (real ones nest under 10 deep).
MAX_NESTING = 64
#: Most values in a JSON/YAML file once every alias is expanded where it is used.
MAX_EXPANDED_NODES = 200_000
#: Integers a file may hold: CP-SAT and numpy work in signed 64-bit integers.
INT64_MAX = 2**63 - 1
#: Longest file name shown in a message (longer ones are elided in the middle).
MAX_SHOWN_NAME = 120


def show_name(path: str | Path) -> str:
    """A path for a one-line message: quoted, elided in the middle when very long."""
    s = str(path)
    if len(s) > MAX_SHOWN_NAME:
        half = MAX_SHOWN_NAME // 2
        s = f"{s[:half]}...{s[-half:]} ({len(s)} characters)"
    return repr(s)


def one_line(text: str) -> str:
    """``text`` folded onto one line (newlines and runs of spaces become one space)."""
    return " ".join(str(text).split())


def check_regular_file(path: str | Path, what: str, max_bytes: int | None = None) -> Path:
    """``path`` as a Path once it is known to name a regular file no larger than the limit;
    else a one-line ConfigError (checked with ``stat``, before anything is opened)."""
    p = Path(path)
    if str(path) == "":
        raise ConfigError(f"{what}: the file name is empty")
    try:
        st = os.stat(p)
    except OSError as e:
        raise ConfigError(f"cannot read {what} {show_name(p)}: {e.strerror or e}") from None
    except ValueError as e:  # an embedded NUL byte
        raise ConfigError(f"cannot read {what} {show_name(p)}: {e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what} {show_name(p)} is a directory; give a file")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} {show_name(p)} is not a regular file (a device, FIFO or "
                          f"socket); give a file")
    limit = MAX_INPUT_BYTES if max_bytes is None else max_bytes
    if st.st_size > limit:
        raise ConfigError(f"{what} {show_name(p)} is {st.st_size:,} bytes; at most "
                          f"{limit:,} bytes are read")
    return p


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of a regular file of at most :data:`MAX_INPUT_BYTES` bytes."""
    p = check_regular_file(path, what)
    try:
        # O_NONBLOCK: should the file be swapped for a FIFO after the check, open() still returns
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(MAX_INPUT_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read {what} {show_name(p)}: {e.strerror or e}") from None
    return _utf8_text(raw, f"{what} {show_name(p)}", "; give a text file")


def _utf8_text(raw: bytes, where: str, hint: str) -> str:
    """``raw`` (read with one byte past :data:`MAX_INPUT_BYTES`) as UTF-8 text, else a one-line
    error naming ``where`` (``hint``: what to give instead, appended)."""
    if len(raw) > MAX_INPUT_BYTES:
        raise ConfigError(f"{where} is over {MAX_INPUT_BYTES:,} bytes")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                          f"{e.start}){hint}") from None


def read_stdin(what: str) -> str:
    """Standard input as UTF-8 text of at most :data:`MAX_INPUT_BYTES` bytes (``--megatron-args
    -``); a terminal is refused rather than waited on."""
    stream = sys.stdin
    if stream is None or stream.isatty():
        raise ConfigError(f"{what} '-' reads standard input, but it is a terminal: pipe the "
                          f"text in (e.g. `... < launch.sh`) or give the text or a path")
    source = getattr(stream, "buffer", None)
    raw = source.read(MAX_INPUT_BYTES + 1) if source is not None else \
        stream.read(MAX_INPUT_BYTES + 1).encode("utf-8")
    return _utf8_text(raw, f"{what} on standard input", "")


# ------------------------------------------------------------------------------ structure


def check_tree(data: Any, where: str) -> Any:
    """``data`` (parsed JSON/YAML) once its nesting, expanded size, integers and floats are
    within the limits of the module docstring; else a one-line ConfigError naming the key."""
    sizes: dict[int, int] = {}  # id -> expanded size, for containers already checked
    active: set[int] = set()  # containers on the current path (a cycle = recursive anchor)

    def visit(x: Any, depth: int, key: str) -> int:
        if isinstance(x, bool) or x is None or isinstance(x, str):
            return 1
        if isinstance(x, int):
            if abs(x) > INT64_MAX:
                raise ConfigError(f"{where}: {key or 'a value'} is an integer of {len(str(x))} "
                                  f"digits; integers must lie within int64 (|n| < 2**63)")
            return 1
        if isinstance(x, float):
            if not math.isfinite(x):
                raise ConfigError(f"{where}: {key or 'a value'} is {x}; give a finite number")
            return 1
        if not isinstance(x, dict | list | tuple):
            return 1  # dates, bytes: the spec that reads them decides
        ident = id(x)
        if ident in active:
            raise ConfigError(f"{where}: {key or 'the document'} contains itself (a recursive "
                              f"YAML anchor); write the values out")
        if ident in sizes:  # an alias: shared, counted again where used
            n = sizes[ident]
        else:
            if depth >= MAX_NESTING:
                raise ConfigError(f"{where}: {key or 'the document'} nests lists/mappings more "
                                  f"than {MAX_NESTING} deep")
            active.add(ident)
            n = 1
            items = x.items() if isinstance(x, dict) else enumerate(x)
            for k, v in items:
                if isinstance(k, float | int) and not isinstance(k, bool):
                    visit(k, depth + 1, key)
                n += visit(v, depth + 1, f"{key}.{k}" if key else str(k))
                if n > MAX_EXPANDED_NODES:
                    break
            active.discard(ident)
            sizes[ident] = n
        if n > MAX_EXPANDED_NODES:
            raise ConfigError(f"{where}: {key or 'the document'} expands to more than "
                              f"{MAX_EXPANDED_NODES:,} values (YAML aliases counted where they "
                              f"are used); write a smaller file")
        return n

    visit(data, 0, "")
    return data


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows; give a finite number")


class DuplicateKey(ValueError):
    """A mapping names one key twice (JSON and YAML keep the last value silently)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(f"key {k!r} is given twice ({out[k]!r} and {v!r}); give it once")
        out[k] = v
    return out


def parse_json(text: str, where: str) -> Any:
    """Strict JSON (no NaN/Infinity, no key given twice), checked with :func:`check_tree`."""
    try:
        data = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where} is not valid JSON: {e.msg} at line {e.lineno} column "
                          f"{e.colno}") from None
    except RecursionError:
        raise ConfigError(f"{where}: lists/mappings nest more than {MAX_NESTING} deep") from None
    except DuplicateKey as e:
        raise ConfigError(f"{where}: {one_line(str(e))}") from None
    except ValueError as e:  # NaN/Infinity, an integer over 4,300 digits
        raise ConfigError(f"{where} is not valid JSON: {one_line(str(e))}") from None
    return check_tree(data, where)


def parse_yaml(text: str, where: str) -> Any:
    """YAML (safe loader: aliases share the anchored object; no key given twice in one mapping,
    keys merged with ``<<`` may be overridden), checked with :func:`check_tree`."""
    import yaml

    try:
        data = yaml.load(text, Loader=_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{where} is not valid YAML: {one_line(problem)}{at}") from None
    except RecursionError:
        raise ConfigError(f"{where}: lists/mappings nest more than {MAX_NESTING} deep") from None
    except ValueError as e:  # an integer over 4,300 digits
        raise ConfigError(f"{where} is not valid YAML: {one_line(str(e))}") from None
    return check_tree(data, where)


def _loader() -> Any:
    """PyYAML's safe loader, refusing nesting beyond :data:`MAX_NESTING` while composing (so
    5,000 nested ``[`` never reach Python's recursion limit); built on first use (start-up
    imports no YAML)."""
    global _LOADER
    if _LOADER is None:
        import yaml

        class Loader(yaml.SafeLoader):
            def compose_node(self, parent: Any, index: Any) -> Any:
                self._depth = getattr(self, "_depth", 0) + 1
                try:
                    if self._depth > MAX_NESTING + 1:
                        mark = self.peek_event().start_mark
                        raise yaml.YAMLError(f"nesting deeper than {MAX_NESTING} at line "
                                             f"{mark.line + 1}")
                    return super().compose_node(parent, index)
                finally:
                    self._depth -= 1

            def construct_mapping(self, node: Any, deep: bool = False) -> Any:
                # a key written twice in one mapping (PyYAML keeps the last value silently);
                # keys brought in by a ``<<`` merge are defaults the mapping may override
                if isinstance(node, yaml.MappingNode):
                    seen: dict[Any, Any] = {}
                    for key_node, value_node in node.value:
                        if key_node.tag == "tag:yaml.org,2002:merge":
                            continue
                        key = self.construct_object(key_node, deep=True)
                        try:
                            first = seen.setdefault(key, value_node)
                        except TypeError:  # an unhashable key: PyYAML refuses it itself
                            continue
                        if first is not value_node:
                            m = key_node.start_mark
                            raise yaml.YAMLError(f"key {key!r} is given twice (again at line "
                                                 f"{m.line + 1}); give it once")
                return super().construct_mapping(node, deep=deep)

        # numbers as YAML 1.2's core schema spells them (ASCII decimal digits; a float may
        # have an exponent without a point, 1e-05): PyYAML's YAML 1.1 also reads 1_000, 0x10,
        # 0o17 and 1:30 (base 60) as integers, and reads 1e-05 as a string
        int_tag, float_tag = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
        Loader.yaml_implicit_resolvers = {
            ch: [(tag, rx) for tag, rx in rs if tag not in (int_tag, float_tag)]
            for ch, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()}
        Loader.add_implicit_resolver(int_tag, YAML_INT, list("-+0123456789"))
        Loader.add_implicit_resolver(float_tag, YAML_FLOAT, list("-+0123456789."))
        # decimal, as YAML 1.2 reads it (PyYAML's constructor reads 017 as octal 15)
        Loader.add_constructor(int_tag, lambda loader, node: int(loader.construct_scalar(node),
                                                                 10))
        _LOADER = Loader
    return _LOADER


#: YAML 1.2 core-schema integers and floats (the loader's number spellings; ``.inf`` and
#: ``.nan`` are read, then refused by :func:`check_tree`)
YAML_INT = re.compile(r"^[-+]?[0-9]+$")
YAML_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


_LOADER: Any = None


def read_mapping(path: str | Path, what: str, fmt: str | None = None) -> dict[str, Any]:
    """A JSON or YAML file (``fmt``, else from the extension: ``.yaml``/``.yml`` is YAML) that
    holds a mapping; every failure is a one-line ConfigError."""
    text = read_text(path, what)
    where = f"{what} {show_name(path)}"
    if fmt is None:
        fmt = "yaml" if Path(path).suffix.lower() in (".yaml", ".yml") else "json"
    data = parse_yaml(text, where) if fmt == "yaml" else parse_json(text, where)
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a mapping of keys to values, got "
                          f"{type(data).__name__}")
    return data


# ------------------------------------------------------------------------------- schemas

#: The value types a user file may hold where a spec reads it (what JSON has): YAML dates,
#: timestamps, binary and sets, TOML dates and times are refused by :func:`validate`.
JSON_TYPES = (dict, list, str, int, float, bool, type(None))


def json_only(data: Any, where: str, key: str = "") -> None:
    """A one-line ConfigError naming the first value of ``data`` that JSON cannot hold (a YAML
    or TOML date, a set, bytes), so that it never reaches a spec as an object it cannot read."""
    stack = [(data, key)]
    while stack:
        x, k = stack.pop()
        if not isinstance(x, JSON_TYPES):
            kind = type(x).__name__
            at = f"{where}: " if where else ""
            raise ConfigError(f"{at}{k or 'the document'} is a {kind} ({str(x)[:40]}); "
                              f"write a number, a string in quotes, true/false, a list or a "
                              f"mapping")
        if isinstance(x, dict):
            for kk, v in x.items():
                if not isinstance(kk, str | int) or isinstance(kk, bool):
                    raise ConfigError(f"{where or 'a file'}: {k or 'the document'} has the key {kk!r} "
                                      f"({type(kk).__name__}); keys are names")
                stack.append((v, f"{k}.{kk}" if k else str(kk)))
        elif isinstance(x, list):
            stack.extend((v, f"{k}[{i}]") for i, v in enumerate(x))


def strict_message(err: Any) -> str:
    """The first problem of a strict pydantic validation error on one line, saying what the
    value is when its type is wrong (a string or boolean where a number belongs)."""
    from tune_cp.config.specs import validation_message

    e = err.errors()[0]
    loc = ".".join(str(x) for x in e["loc"]) or "the document"
    value, kind = e.get("input"), e["type"]
    if kind in ("int_type", "float_type", "int_parsing", "float_parsing"):
        whole = kind.startswith("int")
        want = "a whole number" if whole else "a number"
        if isinstance(value, str):
            return (f"{loc}: {value[:MAX_NUMBER_CHARS]!r} is a string, not a number; write "
                    f"{want} without quotes (numbers in files are numbers, not strings)")
        if isinstance(value, bool):
            return f"{loc}: {str(value).lower()} is a boolean, not {want}"
        if isinstance(value, float) and whole:
            return f"{loc}: {value!r} is not a whole number; write an integer"
        if isinstance(value, dict | list):
            return f"{loc}: a {'list' if isinstance(value, list) else 'mapping'} is not {want}"
    def shown(v: Any) -> str:
        return type(v).__name__ if isinstance(v, dict | list) else repr(v)[:MAX_NUMBER_CHARS]

    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"{loc} must be a mapping of keys to values, got {shown(value)}"
    if kind in ("list_type", "tuple_type"):
        return f"{loc} must be a list, got {shown(value)}"
    if kind == "missing":
        return f"{loc} is missing"
    if kind == "extra_forbidden":
        return f"{loc} is not a known key"
    if kind == "bool_type":
        return f"{loc}: {value!r} is not a boolean; write true or false (without quotes)"
    if kind == "string_type":
        return f"{loc}: {value!r} is not a string; write it in quotes"
    return validation_message(err)


def validate(model: Any, data: Any, where: str) -> Any:
    """``data`` (read from a user file) as an instance of the pydantic ``model``, validated
    strictly, as JSON: a number is a JSON number (a string such as ``'8'`` or ``"NaN"`` is
    refused, not converted), a whole number an integer (``8.0`` is refused where an integer
    belongs), a boolean ``true``/``false`` (``1`` and ``"yes"`` are refused), and a boolean is
    never a number (``num_layers: true`` is refused). Every failure is a one-line
    ConfigError naming ``where`` (empty: the caller names the file), the key and the value."""
    from pydantic import ValidationError

    json_only(data, where)
    at = f"{where}: " if where else ""
    try:
        return model.model_validate_json(json.dumps(data, allow_nan=False), strict=True)
    except ValidationError as e:
        raise ConfigError(f"{at}{strict_message(e)}") from None
    except ValueError as e:  # a non-finite float (check_tree refuses it first)
        raise ConfigError(f"{at}{one_line(str(e))}") from None


# -------------------------------------------------------------------------------- numbers


def finite(value: Any, what: str) -> float:
    """``value`` as a finite float; NaN, infinities and non-numbers are one-line errors."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: {value!r} is not a number")
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{what}: {value!r} is not a number") from None
    if not math.isfinite(x):
        raise ConfigError(f"{what}: {value!r} is not a finite number")
    return x


def positive(value: Any, what: str) -> float:
    """``value`` as a finite float > 0."""
    x = finite(value, what)
    if x <= 0:
        raise ConfigError(f"{what}: {value!r} must be a positive number")
    return x


# ---------------------------------------------------------------------------------- paths


def exists(path: str | Path) -> bool:
    """Whether ``path`` names something; False (not an OSError) for names the OS refuses
    (over 255 bytes, a symlink loop, an embedded NUL)."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def is_dir(path: str | Path) -> bool:
    """Whether ``path`` is a directory; False for names the OS refuses (see :func:`exists`)."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def is_file(path: str | Path) -> bool:
    """Whether ``path`` is a regular file; False for names the OS refuses."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


#: How a number may be spelled on the command line and in text fields: ASCII digits, an optional
#: sign, point and exponent (``8``, ``-0.5``, ``1e-3``, ``.25``). Python's ``float()``/``int()``
#: also take ``1_000``, fullwidth and Arabic-Indic digits and surrounding spaces; tune-cp does
#: not, so that what it reads is what the user sees.
NUMBER_SPELLING = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: Longest number spelled (characters): 64 covers any float with its exponent.
MAX_NUMBER_CHARS = 64


def parse_number(text: str, what: str) -> float:
    """``text`` (an ASCII decimal, see :data:`NUMBER_SPELLING`) as a finite float; else a
    one-line ConfigError naming ``what``."""
    if len(text) > MAX_NUMBER_CHARS or not NUMBER_SPELLING.fullmatch(text):
        raise ConfigError(f"{what}: {text[:MAX_NUMBER_CHARS]!r} is not a number (write ASCII "
                          f"digits, e.g. 0.1 or 2e-3)")
    x = float(text)
    if not math.isfinite(x):
        raise ConfigError(f"{what}: {text!r} is not a finite number")
    return x
