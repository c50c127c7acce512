"""The one check of every path tune-cp writes: ``--pareto``, ``--trials-out``,
``plan --plot``, ``calibrate --out``, ``sweep --out`` (files) and ``sweep --plot``,
``--verify-dir`` (folders), each checked before any work starts, each failure one line naming
the option, the path and what would be legal (never ``FileNotFoundError`` /
``IsADirectoryError`` / ``PermissionError`` as an internal error).

The rules:

* A name ending in ``/`` (or ``/.``, ``/..``) names a folder, not a file (``--pareto x.png/``).
* ``~`` and ``~user`` are expanded as the shell would (a quoted ``~`` reaches tune-cp
  unexpanded); an unknown user or a ``~`` without a home directory is refused. The caller
  writes to the returned path.
* A file: the extension must be one the option writes; an existing path must be a regular,
  writable file (not a folder, device such as ``/dev/full``, FIFO, dangling symbolic link, or
  anything under ``/proc`` or ``/sys``); a new one must lie in an existing folder where it can be
  created (tried, then removed: a read-only folder or file system is refused here, whoever
  runs).
* A folder: an existing one must be a folder one can create files in (tried); a new one must
  have an existing parent folder where it can be created (tried, then removed).
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path

from tune_cp.config.specs import ConfigError
from tune_cp.oracle.inputs import show_name

#: Kernel file systems: what is written there is no file (a kernel interface).
PSEUDO_ROOTS = (Path("/proc"), Path("/sys"))


def expand_home(path: str | Path, what: str) -> Path:
    """``path`` with a leading ``~`` / ``~user`` expanded; a one-line ConfigError when the user
    is unknown or there is no home directory (Python's ``Path.expanduser`` raises
    ``RuntimeError: Could not determine home directory``)."""
    s = str(path)
    if not s.startswith("~"):
        return Path(s)
    user = s[1:].split("/", 1)[0]
    try:
        expanded = os.path.expanduser(s)
    except (KeyError, RuntimeError, OSError):
        expanded = s
    if expanded.startswith("~") or (not user and os.environ.get("HOME", None) == ""):
        who = f"user {user!r}" if user else "this user ($HOME is empty)"
        raise ConfigError(f"{what} {show_name(s)}: {who} has no home directory here; write the "
                          f"path out")
    return Path(expanded)


def _names_folder(s: str) -> bool:
    return s.endswith(("/", os.sep)) or os.path.basename(s) in (".", "..", "")


def _pseudo(p: Path) -> bool:
    try:
        full = p.resolve()
    except (OSError, RuntimeError):
        full = Path(os.path.abspath(p))
    return any(full == r or r in full.parents for r in PSEUDO_ROOTS)


def _why(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e)


def _stat_or_none(p: Path, s: str, what: str) -> os.stat_result | None:
    """``os.stat(p)``, None when nothing is there, else a one-line error (``s``: the name as
    given)."""
    try:
        return os.stat(p)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what} {show_name(s)} cannot be written: {_why(e)}") from None


def _require_parent(p: Path, s: str, what: str, instead: str, hint: str) -> Path:
    """The existing directory ``p`` is to be created in (its parent), else a one-line error: a
    dangling symbolic link at ``p``, or a parent that is not a directory."""
    if os.path.lexists(p):
        raise ConfigError(f"{what} {show_name(s)} is a symbolic link to nothing; {instead}")
    parent = p.parent
    try:
        parent_ok = stat.S_ISDIR(os.stat(parent).st_mode)
    except (OSError, ValueError):
        parent_ok = False
    if not parent_ok:
        raise ConfigError(f"{what} {show_name(s)}: the directory {show_name(parent)} does not exist; "
                          f"create it first{hint}")
    return parent


def check_output_path(path: str | Path, what: str, suffixes: tuple[str, ...]) -> Path:
    """The path a file option writes (``what``: the option, e.g. ``--pareto``), once it can be
    written with one of ``suffixes`` (lower-case, with the dot); see the module docstring.
    Returns the path to write (``~`` expanded)."""
    s = str(path)
    if not s.strip():
        raise ConfigError(f"{what}: the file name is empty")
    if "\0" in s:
        raise ConfigError(f"{what} {show_name(s)}: a file name cannot hold a NUL byte")
    if _names_folder(s):
        raise ConfigError(f"{what} {show_name(s)} names a directory; give a file name ending in "
                          f"{' or '.join(suffixes)}")
    p = expand_home(s, what)
    suffix = p.suffix.lower()
    if suffix not in suffixes:
        raise ConfigError(f"{what} {show_name(s)}: {suffix or 'no extension'} is not a supported "
                          f"format; end the name with {' or '.join(suffixes)}")
    st = _stat_or_none(p, s, what)
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else \
                "not a regular file (a device, FIFO or socket)"
            raise ConfigError(f"{what} {show_name(s)} is {kind}; give a file name")
        if _pseudo(p) or not os.access(p, os.W_OK):
            raise ConfigError(f"{what} {show_name(s)} cannot be written: permission denied")
        try:  # opened for appending, nothing written: the file stays as it is
            os.close(os.open(p, os.O_WRONLY | os.O_APPEND))
        except OSError as e:
            raise ConfigError(f"{what} {show_name(s)} cannot be written: {_why(e)}") from None
        return p
    parent = _require_parent(p, s, what, "give a file name",
                             " or name a file in an existing folder")
    if _pseudo(p):
        raise ConfigError(f"{what} {show_name(s)} cannot be written: {show_name(parent)} is a "
                          f"kernel file system, not a directory for files")
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as e:
        raise ConfigError(f"{what} {show_name(s)} cannot be written: {_why(e)}") from None
    os.close(fd)
    os.unlink(p)
    return p


def check_output_dir(path: str | Path, what: str) -> Path:
    """The folder a folder option writes files into (``sweep --plot``, ``--verify-dir``), once
    files can be created in it (an existing folder) or it can be created (a new one, in an
    existing parent); see the module docstring. Returns the folder (``~`` expanded)."""
    s = str(path)
    if not s.strip():
        raise ConfigError(f"{what}: the folder name is empty")
    if "\0" in s:
        raise ConfigError(f"{what} {show_name(s)}: a folder name cannot hold a NUL byte")
    p = expand_home(s, what)
    if _pseudo(p):
        raise ConfigError(f"{what} {show_name(s)} cannot be written: it lies in a kernel file "
                          f"system (/proc, /sys), not a directory for files")
    st = _stat_or_none(p, s, what)
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{what} {show_name(s)} exists and is not a directory; name a directory")
        try:
            fd, probe = tempfile.mkstemp(dir=p, prefix=".tune-cp-probe-")
        except OSError as e:
            raise ConfigError(f"{what} {show_name(s)}: files cannot be created there: "
                              f"{_why(e)}") from None
        os.close(fd)
        os.unlink(probe)
        return p
    _require_parent(p, s, what, "name a directory", "")
    try:
        os.mkdir(p)
    except OSError as e:
        raise ConfigError(f"{what} {show_name(s)} cannot be created: {_why(e)}") from None
    os.rmdir(p)
    return p


# ------------------------------------------------------------------------- terminal text

#: Characters a terminal acts on instead of showing: C0 controls but tab and newline (ESC
#: starts the CSI/OSC sequences that set a window title, write the clipboard or hide text), DEL,
#: C1 controls (U+009B is a one-byte CSI) and the bidirectional overrides and isolates, which
#: reorder what is shown.
TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """``text`` as a terminal may show it: every character of :data:`TERMINAL_CONTROLS`
    written as its Python escape (``\\x1b``, ``\\u202e``), so that a name from a user's file
    (a model name carrying an OSC sequence) is printed, never obeyed. The one helper every line
    of text output goes through (``cli.py::echo``, the progress lines); JSON output escapes the
    same characters itself (``json.dumps``, ``ensure_ascii``)."""
    return TERMINAL_CONTROLS.sub(lambda m: repr(m.group(0))[1:-1], text)
