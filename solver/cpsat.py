"""OR-Tools' CP-SAT Python API, imported without loading pandas.

``ortools.sat.python.cp_model`` (OR-Tools 9.15) imports pandas at module level for its
``*_series`` helpers (``new_int_var_series`` and friends, which tune-cp never calls), and only
reads ``pandas.Index`` and ``pandas.Series`` while it is being imported (in type aliases and
annotations). pandas is most of what that import costs: on the project's 2-core machine
``import ortools.sat.python.cp_model`` took 0.9 s of CPU, 0.35 s of it without pandas
(``python benchmarks/cli.py`` prints the start-up costs). This module imports ``cp_model`` with a
placeholder pandas whose ``Index`` and ``Series`` are empty classes, then gives ``cp_model`` a
module that imports the real pandas on its first use, so the ``*_series`` helpers still work
(``tests/test_cli_startup.py`` calls one). When pandas is already loaded, nothing is replaced.

Every tune-cp module takes ``cp_model`` and ``cp_model_helper`` from here, and builds its
models as :class:`CpModel`: ``cp_model.CpModel`` whose pre-PEP8 names (``NewIntVar``,
``AddElement``, ...) are aliases defined once on the class, not wrapped anew on each instance
(OR-Tools' ``CpModel.__init__`` walks ``dir(self)`` and wraps about sixty methods every time:
a few milliseconds per model, and the enumeration builds one per slice).
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class _DeferredPandas(types.ModuleType):
    """Stands for pandas in ``cp_model``: the real module is imported on the first attribute
    read (``isinstance(x, pd.Series)`` in a ``*_series`` helper)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module("pandas"), name)


def _import_cp_model() -> types.ModuleType:
    name = "ortools.sat.python.cp_model"
    if name in sys.modules or "pandas" in sys.modules:
        return importlib.import_module(name)
    placeholder = types.ModuleType("pandas", "placeholder while cp_model is imported")
    placeholder.Index = type("Index", (), {})  # type: ignore[attr-defined]
    placeholder.Series = type("Series", (), {})  # type: ignore[attr-defined]
    sys.modules["pandas"] = placeholder
    try:
        with _lazy_binding():
            module = importlib.import_module(name)
    finally:
        if sys.modules.get("pandas") is placeholder:
            del sys.modules["pandas"]
    module.pd = _DeferredPandas("pandas", "imported on first use")  # type: ignore[attr-defined]
    return module


@contextmanager
def _lazy_binding() -> Iterator[None]:
    """Load shared libraries with lazy binding (``RTLD_LAZY``) inside the block, then restore
    the flags. Python loads extension modules with ``RTLD_NOW``, which resolves every function
    symbol of OR-Tools' 32 MB native library and its dependencies at import; tune-cp calls a
    small part of it, and lazy binding resolves only those, on first call: ``import
    cp_model_helper`` 0.13 -> 0.10 s of CPU on the project's 2-core machine (OR-Tools' wheels
    are not linked with ``-z now``, which would override this)."""
    flags = sys.getdlopenflags()
    sys.setdlopenflags((flags & ~os.RTLD_NOW) | os.RTLD_LAZY)
    try:
        yield
    finally:
        sys.setdlopenflags(flags)


cp_model = _import_cp_model()
from ortools.sat.python import cp_model_helper  # noqa: E402  (loaded by cp_model above)


class CpModel(cp_model.CpModel):
    """``cp_model.CpModel`` with its pre-PEP8 method names as class attributes (the same
    methods, without the per-instance deprecation wrappers)."""

    def _add_pre_pep8_methods(self) -> None:  # the aliases are on the class
        pass


def _pre_pep8_aliases() -> None:
    base = cp_model.CpModel
    # the names OR-Tools 9.15's CpModel._add_pre_pep8_methods wraps
    names = [n for n in dir(base) if n.startswith(("add_", "new_", "clear_"))
             and callable(getattr(base, n))]
    names += ["add", "clone", "get_bool_var_from_proto_index", "get_int_var_from_proto_index",
              "get_interval_var_from_proto_index", "minimize", "maximize", "has_objective",
              "model_stats", "validate", "export_to_file"]
    for n in names:
        alias = cp_model.snake_case_to_camel_case(n)
        if alias not in CpModel.__dict__:
            setattr(CpModel, alias, getattr(base, n))


_pre_pep8_aliases()

__all__ = ["CpModel", "cp_model", "cp_model_helper"]
