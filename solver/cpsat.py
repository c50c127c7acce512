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

Every tune-cp module takes ``cp_model`` and ``cp_model_helper`` from here.
"""

from __future__ import annotations

import importlib
import sys
import types
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
        module = importlib.import_module(name)
    finally:
        if sys.modules.get("pandas") is placeholder:
            del sys.modules["pandas"]
    module.pd = _DeferredPandas("pandas", "imported on first use")  # type: ignore[attr-defined]
    return module


cp_model = _import_cp_model()
from ortools.sat.python import cp_model_helper  # noqa: E402  (loaded by cp_model above)

__all__ = ["cp_model", "cp_model_helper"]
