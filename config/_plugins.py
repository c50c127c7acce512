"""Pydantic without its plugin scan: tune-cp uses no pydantic plugins.

pydantic builds every model's validator through ``pydantic.plugin._schema_validator``, which on
its first call imports ``pydantic.plugin._loader``; that module imports ``importlib.metadata``
(with ``email``, ``zipfile``, ``csv`` and ``socket``) and scans the entry points of every
installed distribution for the ``pydantic`` group: about 60 ms of CPU on the project's 2-core
machine, in every command that builds a spec (``python benchmarks/cli.py`` prints what each
command costs). :func:`skip_plugin_scan` registers a loader that finds no plugins before
pydantic imports its own; pydantic then builds plain ``SchemaValidator`` objects, exactly as it
does when no plugin is installed (or with ``PYDANTIC_DISABLE_PLUGINS=__all__``). Nothing is
replaced once pydantic's loader has been imported (a plugin already loaded stays in use).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable
from typing import Any

LOADER = "pydantic.plugin._loader"


def _no_plugins() -> Iterable[Any]:
    return ()


def skip_plugin_scan() -> None:
    """Register the plugin-free loader (see the module docstring)."""
    if LOADER in sys.modules:
        return
    stub = types.ModuleType(LOADER, "tune-cp: no pydantic plugins (config/_plugins.py)")
    stub.get_plugins = _no_plugins  # type: ignore[attr-defined]
    stub.PYDANTIC_ENTRY_POINT_GROUP = "pydantic"  # type: ignore[attr-defined]
    stub._plugins = {}  # type: ignore[attr-defined]
    stub._loading_plugins = False  # type: ignore[attr-defined]
    sys.modules[LOADER] = stub
