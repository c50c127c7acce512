"""The three-state memory verdict: fits / at the edge / out of memory.

tune-cp's peak (:func:`oracle.memory.memory_report`) counts every term it can derive, the runtime
allowances included (context, NCCL buffers, fragmentation). What it cannot see -- the caching
allocator's reserved-but-free blocks, stray workspaces, a framework build's own buffers -- shows
up as the ratio of a measured peak to the predicted one. That ratio, over the calibration set's
measured peaks (``published_runs.csv`` column ``peak_mem``; ``python benchmarks/memory.py
--write-spread`` writes ``oracle/catalog/memory_spread.json``), is the overhead spread: per framework family its smallest and largest value, ``low`` and
``high`` (the observed range: the calibration set has 5 Megatron-family and 14 torchtitan rows
with a measured peak, too few for percentiles to mean much).

With a predicted peak ``P`` and the GPU's HBM ``H``:

* **out of memory**: ``P x low > H`` -- even at the favourable end of the spread it does not fit;
* **at the edge**: ``P x low <= H < P x high`` -- within the spread: it may fit or not;
* **fits**: ``P x high <= H``.

The legality line of the solver (``--memory-margin``) is the out-of-memory line: its default is
``1 - 1/low`` (:data:`solver.defaults.DEFAULT_MEMORY_MARGIN`, pinned to this file by
``tests/test_memory_verdict.py``), so the allowance is counted once -- the named terms inside
``P``, the unexplained rest in the spread -- and a search keeps edge configurations (ranked,
marked). Documentation: ``docs/memory_verdict.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from pathlib import Path

SPREAD_FILE = Path(__file__).resolve().parent / "catalog" / "memory_spread.json"
#: The family whose spread the default margin and a check without ``--framework`` use.
DEFAULT_FAMILY = "megatron"


class MemoryState(StrEnum):
    FITS = "fits"
    EDGE = "at the edge"
    OUT_OF_MEMORY = "out of memory"


@dataclass(frozen=True)
class Spread:
    """Measured peak / predicted peak over a family's calibration rows: the smallest and largest
    (``low``, ``high``), the median and the row count."""

    family: str
    low: float
    median: float
    high: float
    rows: int

    def margin(self) -> float:
        """The legality margin this spread implies: ``1 - 1/low``, never below 0 (no
        configuration is legal above the physical HBM)."""
        return max(0.0, 1.0 - 1.0 / self.low)

    def text(self) -> str:
        return (f"measured peaks are {self.low:.2f}x-{self.high:.2f}x tune-cp's (median "
                f"{self.median:.2f}x over the {self.rows} {self.family}-family published runs "
                f"with a measured peak)")


@lru_cache(maxsize=1)
def spreads() -> dict[str, Spread]:
    data = json.loads(SPREAD_FILE.read_text())
    return {k: Spread(family=k, low=v["low"], median=v["median"], high=v["high"],
                      rows=len(v["ratios"])) for k, v in data["families"].items()}


def spread_for(family: str | None) -> Spread:
    """The spread of a framework family (``megatron``: Megatron-LM, Megatron-Bridge, Primus and
    their forks; ``torchtitan``); an unknown family reads the default one."""
    table = spreads()
    return table.get(family or DEFAULT_FAMILY, table[DEFAULT_FAMILY])


def memory_state(peak_bytes: int, hbm_bytes: int, spread: Spread) -> MemoryState:
    """Which of the three states a predicted peak is in (module docstring)."""
    if peak_bytes * spread.low > hbm_bytes:
        return MemoryState.OUT_OF_MEMORY
    if peak_bytes * spread.high > hbm_bytes:
        return MemoryState.EDGE
    return MemoryState.FITS


def legal_state(peak_bytes: int, hbm_bytes: int, spread: Spread) -> MemoryState:
    """The state of a configuration the legality line kept (a searched one): out of memory is
    the legality line's to say (``--memory-margin``, the Megatron family's ``low``), so a legal
    configuration below a family's own ``low`` (torchtitan's 1.009) is at the edge, as ``check``
    says of it (``cli.py::memory_verdict``)."""
    state = memory_state(peak_bytes, hbm_bytes, spread)
    return MemoryState.EDGE if state is MemoryState.OUT_OF_MEMORY else state


def fits_line_bytes(hbm_bytes: int, spread: Spread) -> int:
    """The largest predicted peak that fits at the pessimistic end of the spread."""
    return int(hbm_bytes / spread.high)


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default ``linear`` method) of ``values``."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    i = int(pos)
    if i + 1 >= len(xs):
        return xs[-1]
    return xs[i] + (pos - i) * (xs[i + 1] - xs[i])
