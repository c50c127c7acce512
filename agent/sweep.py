"""Sweeps: many scenarios, one table (``tune-cp sweep GRID.yaml --out results.csv``).

A *grid file* (YAML) names models, GPUs, node counts, sequence lengths, global batches and
precisions; every combination is one *scenario*, and each scenario is one
:func:`agent.search.search` (the same solver, oracle and agent phases as ``tune-cp --model M
--nodes N``). The result is one row per scenario (:data:`COLUMNS`): the best configuration (every
axis), its projected tokens/s/GPU (and interval when the search carries one), MFU, peak memory,
and with ``tokens`` (and prices) the time to train, GPU-hours and cost, as in ``tune-cp plan``:
cluster tokens/s = tokens/s/GPU x GPUs; time = tokens / cluster tokens/s; GPU-hours = GPUs x time
/ 3600; cost = GPU-hours x price per GPU-hour. A scenario where nothing fits is a row with status
``infeasible`` and the search's explanation; one that fails is a row with status ``error`` and
the error — never a lost sweep.

Where it runs: in this process (``workers=1``), in local processes (:class:`LocalEngine`,
``concurrent.futures`` with ``forkserver``/``spawn`` workers), or as Ray tasks
(:class:`RayEngine`; Ray is imported only there). Results arrive as they complete; the output
file is rewritten atomically (a temporary file, then ``os.replace``) as they arrive, always
sorted by scenario, so an interrupted sweep leaves a valid file that ``resume`` continues.

Reuse (:class:`WorkerCache`, one per worker process): the memory tables of the CP-SAT model
that depend on the model alone (parameter units, pipeline stage counts, largest chunk) are
shared by every scenario of that model in the worker, and the activation units by every
scenario of the same model, GPU, node size, sequence, batch and precision (they do not depend
on the node count); scenarios that differ only in tokens or price share one search.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

from tune_cp.config.axes import RUN_KNOBS, SWEEP_COLUMNS
from tune_cp.config.specs import (
    GIB,
    ClusterSpec,
    ConfigError,
    GpuSpec,
    ModelSpec,
    Precision,
    TrainingSpec,
)
from tune_cp.solver.settings import MAX_MEMORY_MARGIN

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0

#: Output columns and their types (``str``, ``int``, ``float``, ``bool``); empty means "does not
#: apply" (no configuration, no tokens given, no price, no interval).
COLUMNS: tuple[tuple[str, type], ...] = (
    ("scenario_id", str), ("model", str), ("gpu", str), ("nodes", int), ("gpus_per_node", int),
    ("gpus", int), ("seq_len", int), ("global_batch", int), ("precision", str),
    ("status", str),
    # the configuration (the registry's sweep columns: config/axes.py::SWEEP_COLUMNS)
    *((c.name, c.value_type) for c in SWEEP_COLUMNS),
    ("tokens_per_s_per_gpu", float), ("tokens_per_s_per_gpu_low", float),
    ("tokens_per_s_per_gpu_high", float), ("class_bias", float), ("mfu", float), ("step_time_s", float),
    ("peak_bytes", int), ("peak_gib", float), ("hbm_limit_bytes", int),
    ("cluster_tokens_per_s", float), ("tokens", float), ("days", float), ("gpu_hours", float),
    ("price_per_gpu_hour", float), ("cost", float),
    ("feasible", int), ("candidates", int), ("best_phase", str),
    ("reason", str), ("inputs_digest", str),
)
COLUMN_NAMES = tuple(n for n, _ in COLUMNS)
COLUMN_TYPES = dict(COLUMNS)
CONFIG_COLUMNS = tuple(c.name for c in SWEEP_COLUMNS)
STATUSES = ("ok", "infeasible", "error")
FORMATS = (".csv", ".parquet")
PARQUET_EXTRA = "pip install 'tune-cp[sweep]' (pyarrow)"


class GridError(ConfigError):
    """A grid file that cannot be read: one line naming the key and the value."""


# ------------------------------------------------------------------------------ the grid


#: Grid keys: the axes (a value or a list) and the settings every scenario shares.
AXIS_KEYS = ("models", "gpus", "nodes", "seq_len", "global_batch", "precision", "tokens")
SETTING_KEYS = ("gpus_per_node", "price_per_gpu_hour", "constraints", "preferences",
                "memory_margin", "grad_reduce_in_bf16", "overheads", "calibration",
                "allow_cross_scale_up", "fsdp", "framework", "fp8_param_gather", "name",
                # the framework run settings (RunSettings fields), as config/axes.py declares them
                *(k.field for k in RUN_KNOBS))
GRID_KEYS = AXIS_KEYS + SETTING_KEYS
REQUIRED_KEYS = ("models", "gpus", "nodes")
#: Most scenarios one grid runs, counted before any is built (the product of the axes'
#: lengths): each is one search of about a second, so 10,000 are hours of CPU; a grid of 1e9
#: was built whole (RSS growing, nothing printed), 1e5 took 20 s before the first progress line.
MAX_SCENARIOS = 10_000


@dataclass(frozen=True)
class Settings:
    """What every scenario of a grid shares (besides its axes)."""

    constraints: tuple[str, ...] = ()
    preferences: tuple[str, ...] = ()
    memory_margin: float | None = None
    grad_reduce_in_bf16: bool = False
    overheads: tuple[tuple[str, float], ...] = ()
    calibration: str | None = None
    allow_cross_scale_up: bool = False
    #: the framework run settings, as ``oracle.memory.RunOptions`` fields (None: the defaults)
    run_options: tuple[tuple[str, Any], ...] = ()
    #: Megatron-FSDP searched too (``search --fsdp``)
    fsdp: bool = False
    #: the framework that runs the jobs (``search --framework``; None: Megatron-LM's defaults):
    #: its gradient dtype and fragmentation defaults are applied when the grid is read (unless
    #: ``grad_reduce_in_bf16`` / ``overheads.fragmentation`` are given), its FP8 parameters per
    #: scenario (:func:`scenario_inputs`), and the verdict reads its family's spread
    framework: str | None = None
    #: FP8 parameters for the FP8 scenarios (``search --fp8-param-gather``; a non-FP8 scenario
    #: with it is an error row, as the search refuses it)
    fp8_param_gather: bool = False


@dataclass(frozen=True)
class Scenario:
    """One search of a sweep. ``position`` orders scenarios as the grid lists them; ``scenario_id``
    names the point (model, GPU, nodes, sequence, batch, precision, tokens); ``digest`` hashes
    every input (the specs themselves, not their names), so a resumed sweep recomputes a row whose
    inputs changed."""

    scenario_id: str
    position: tuple[int, ...]
    model: ModelSpec
    gpu: GpuSpec
    gpus_per_node: int
    nodes: int
    seq_len: int
    global_batch: int
    precision: Precision
    tokens: float | None
    price_per_gpu_hour: float | None
    settings: Settings
    digest: str = ""

    @property
    def search_key(self) -> tuple[Any, ...]:
        """What the search depends on (tokens and price only scale its answer)."""
        return (self.model, self.gpu, self.gpus_per_node, self.nodes, self.seq_len,
                self.global_batch, self.precision, self.settings)


@dataclass(frozen=True)
class Grid:
    path: str
    name: str
    scenarios: tuple[Scenario, ...]


def _as_list(key: str, value: Any) -> list[Any]:
    if isinstance(value, list):
        if not value:
            raise GridError(f"grid key {key!r}: the list is empty; give at least one value")
        return value
    if isinstance(value, dict):
        raise GridError(f"grid key {key!r}: {_show(value)} is a mapping; give a value or a list")
    return [value]


def _show(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _positive_int(key: str, v: Any, upper: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= upper:
        raise GridError(f"grid key {key!r}: {_show(v)} must be a whole number from 1 to {upper}")
    return v


def _number(key: str, v: Any, *, positive: bool = False) -> float:
    if isinstance(v, str):
        try:
            v = float(v)  # YAML reads 1e12 (no dot) as a string
        except ValueError:
            pass
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0 \
            or (positive and v == 0):
        want = "a positive number" if positive else "a number >= 0"
        raise GridError(f"grid key {key!r}: {_show(v)} must be {want}")
    return float(v)


def _resolve_path(entry: str, base: Path, key: str = "models") -> str:
    """A grid entry that names a file, relative to the grid file's folder (``~`` expanded; an
    unknown ``~user`` is a one-line GridError, not Python's "Could not determine home
    directory")."""
    from tune_cp.oracle.inputs import exists
    from tune_cp.oracle.outputs import expand_home

    try:
        p = expand_home(entry, f"grid key {key!r}:")
    except ConfigError as e:
        raise GridError(str(e)) from None
    if not p.is_absolute() and exists(base / p):
        return str(base / p)
    return str(p) if entry.startswith("~") else entry


def _per_gpu(key: str, value: Any, gpus: Sequence[tuple[str, GpuSpec]], check: Callable[[Any], Any]
             ) -> dict[str, Any]:
    """One value for every GPU, or a mapping from GPU (as the grid names it, or its catalog
    name) to value; GPUs left out of the mapping get None."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        v = check(value)
        return {name: v for name, _ in gpus}
    known = {n: n for n, _ in gpus} | {g.name: n for n, g in gpus}
    out = {}
    for k, v in value.items():
        if str(k) not in known:
            raise GridError(f"grid key {key!r}: {_show(k)} is not one of the grid's gpus "
                            f"({', '.join(n for n, _ in gpus)})")
        out[known[str(k)]] = check(v)
    return out


def load_grid(path: str) -> Grid:
    """Read and validate a grid file; every error is one line naming the key and the value."""
    from tune_cp.oracle.catalog import load_gpu, load_model
    from tune_cp.oracle.inputs import exists, parse_yaml, read_text

    p = Path(path)

    if not exists(path):
        raise GridError(f"grid file {path!r}: no such file")
    # regular file, size, UTF-8, nesting, alias expansion, int64, finite (oracle/inputs.py)
    try:
        data = parse_yaml(read_text(path, "grid file"), f"grid file {path!r}")
    except ConfigError as e:
        raise GridError(str(e)) from None
    if not isinstance(data, dict):
        raise GridError(f"grid file {path!r}: expected a mapping of keys ({', '.join(GRID_KEYS)})")
    for k in data:
        if k not in GRID_KEYS:
            raise GridError(f"grid key {_show(k)} is unknown; choose from {', '.join(GRID_KEYS)}")
    for k in REQUIRED_KEYS:
        if data.get(k) is None:
            raise GridError(f"grid key {k!r} is missing; name at least one value")
    base = p.parent

    def load(kind: str, entry: Any, loader: Callable[[str], Any]) -> Any:
        if not isinstance(entry, str) or not entry.strip():
            raise GridError(f"grid key {kind!r}: {_show(entry)} must be a catalog name or a file "
                            f"path")
        path = _resolve_path(entry.strip(), base, kind)
        try:
            return loader(path)
        except ConfigError as e:
            raise GridError(f"grid key {kind!r}: {_show(entry)}: {e}") from None

    models = [(str(e).strip(), load("models", e, load_model))
              for e in _as_list("models", data["models"])]
    gpus = [(str(e).strip(), load("gpus", e, load_gpu)) for e in _as_list("gpus", data["gpus"])]
    for kind, items in (("models", models), ("gpus", gpus)):
        seen: dict[str, str] = {}
        for entry, spec in items:
            if spec.name in seen:
                raise GridError(f"grid key {kind!r}: {entry!r} and {seen[spec.name]!r} both name "
                                f"{spec.name}; list it once")
            seen[spec.name] = entry
    nodes = sorted({_positive_int("nodes", v, 1 << 20) for v in _as_list("nodes", data["nodes"])})
    seqs = [None] if data.get("seq_len") is None else \
        [_positive_int("seq_len", v, 1 << 24) for v in _as_list("seq_len", data["seq_len"])]
    batches = [None] if data.get("global_batch") is None else \
        [_positive_int("global_batch", v, 1 << 30)
         for v in _as_list("global_batch", data["global_batch"])]
    precisions = []
    for v in _as_list("precision", data.get("precision", "bf16")):
        try:
            precisions.append(Precision(str(v).lower()))
        except ValueError:
            raise GridError(f"grid key 'precision': {_show(v)} is not a precision; choose from "
                            f"{', '.join(x.value for x in Precision)}") from None
    tokens: list[float | None] = [None] if data.get("tokens") is None else \
        [_number("tokens", v, positive=True) for v in _as_list("tokens", data["tokens"])]
    for key, values in (("seq_len", seqs), ("global_batch", batches), ("precision", precisions),
                        ("tokens", tokens)):
        if len(set(values)) != len(values):
            raise GridError(f"grid key {key!r}: {_show([getattr(v, 'value', v) for v in values])} "
                            f"lists a value twice")
    gpn = _per_gpu("gpus_per_node", data.get("gpus_per_node"), gpus,
                   lambda v: _positive_int("gpus_per_node", v, 1024))
    prices = _per_gpu("price_per_gpu_hour", data.get("price_per_gpu_hour"), gpus,
                      lambda v: _number("price_per_gpu_hour", v))
    settings = _settings(data, base)
    name = str(data.get("name") or p.stem)
    axes = (models, gpus, nodes, seqs, batches, precisions, tokens)
    count = math.prod(len(axis) for axis in axes)
    if count > MAX_SCENARIOS:
        raise GridError(f"grid: {' x '.join(str(len(axis)) for axis in axes)} = {count:,} "
                        f"scenarios (models x gpus x nodes x seq_len x global_batch "
                        f"x precision x tokens); at most {MAX_SCENARIOS:,} run in one sweep "
                        f"(MAX_SCENARIOS); split the grid into several files")

    scenarios = []
    for (mi, (_, model)), (gi, (gname, gpu)), (ni, n), (si, seq), (bi, gbs), (qi, prec), \
            (ti, tok) in product(enumerate(models), enumerate(gpus), enumerate(nodes),
                                 enumerate(seqs), enumerate(batches), enumerate(precisions),
                                 enumerate(tokens)):
        seq_v = seq or model.default_seq_len
        gbs_v = gbs or model.default_global_batch_size
        per_node = gpn.get(gname) or gpu.gpus_per_node
        sid = f"{model.name}/{gpu.name}/n{n}/s{seq_v}/b{gbs_v}/{prec.value}"
        if len(tokens) > 1:
            sid += f"/t{tok:g}"
        sc = Scenario(sid, (mi, gi, ni, si, bi, qi, ti), model, gpu, per_node, n, seq_v, gbs_v,
                      prec, tok, prices.get(gname), settings)
        scenarios.append(_with_digest(sc))
    ids = [s.scenario_id for s in scenarios]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise GridError(f"grid: scenario {dup} appears twice (a model's default seq_len or "
                        f"global_batch equals a listed one); list the values explicitly")
    return Grid(str(p), name, tuple(scenarios))


def _settings(data: Mapping[str, Any], base: Path = Path(".")) -> Settings:
    from tune_cp.agent.search import Preference
    from tune_cp.solver.constraints import HardConstraint

    def strings(key: str) -> tuple[str, ...]:
        v = data.get(key)
        if v is None or v == []:
            return ()
        items = _as_list(key, v)
        for s in items:
            if not isinstance(s, str):
                raise GridError(f"grid key {key!r}: {_show(s)} must be an expression string")
        return tuple(items)

    def parsed(key: str, parse: Callable[[str], Any]) -> tuple[str, ...]:
        items = strings(key)
        for c in items:
            try:
                parse(c)
            except ConfigError as e:
                raise GridError(f"grid key {key!r}: {c!r}: {e}") from None
        return items

    constraints = parsed("constraints", HardConstraint.of)
    preferences = parsed("preferences", Preference.parse)
    margin = data.get("memory_margin")
    if margin is not None:
        margin = _number("memory_margin", margin)
        if margin > MAX_MEMORY_MARGIN:
            raise GridError(f"grid key 'memory_margin': {margin:g} must be at most "
                            f"{MAX_MEMORY_MARGIN:g}")
    def flag(key: str) -> bool:
        v = data.get(key, False)
        if not isinstance(v, bool):
            raise GridError(f"grid key {key!r}: {_show(v)} must be true or false")
        return v

    bf16 = flag("grad_reduce_in_bf16")
    cross = flag("allow_cross_scale_up")
    fsdp = flag("fsdp")
    fp8_params = flag("fp8_param_gather")
    ov = data.get("overheads") or {}
    if not isinstance(ov, dict):
        raise GridError(f"grid key 'overheads': {_show(ov)} must be a mapping NAME: VALUE")
    framework = data.get("framework")
    if framework is not None:
        from tune_cp.formats.frameworks import (
            Framework,
            framework_defaults,
            framework_fragmentation,
        )
        from tune_cp.solver.defaults import FRAMEWORK_NAMES

        if framework not in FRAMEWORK_NAMES:
            raise GridError(f"grid key 'framework': {_show(framework)} is not a framework; "
                            f"give one of {', '.join(FRAMEWORK_NAMES)}")
        fw = Framework(framework)
        # as search --framework (cli.py::apply_framework, framework_settings): the defaults of
        # the settings not given; the search's fixed configuration is not FSDP
        if data.get("grad_reduce_in_bf16") is None:
            bf16 = not next(d.value for d in framework_defaults(fw, None, False)
                            if d.field == "grad_reduce_in_fp32")
        frag = framework_fragmentation(fw, "", False)
        if frag is not None and "fragmentation" not in ov:
            ov = dict(ov) | {"fragmentation": frag}
    overheads = tuple(sorted((str(k), v) for k, v in ov.items()))
    _overheads(overheads)  # validates
    calib = data.get("calibration")
    if calib is not None:  # a path relative to the grid file, as models and gpus
        from tune_cp.oracle.inputs import is_file

        if not isinstance(calib, str) or not calib.strip() or \
                not is_file(calib := _resolve_path(calib.strip(), base, "calibration")):
            raise GridError(f"grid key 'calibration': {_show(data.get('calibration'))} is not a "
                            f"file (a path relative to the grid file's folder, or absolute)")
    from pydantic import ValidationError

    from tune_cp.config.specs import validation_message
    from tune_cp.oracle.memory import RunOptions

    given = {k: data[k] for k in RunOptions.model_fields if data.get(k) is not None}
    try:
        opts = RunOptions(**given)
    except ValidationError as e:
        raise GridError(f"grid run settings: {validation_message(e)}") from None
    run = tuple((k, getattr(opts, k)) for k in given)
    return Settings(constraints, preferences, margin, bf16, overheads, calib, cross, run, fsdp,
                    framework, fp8_params)


def _overheads(items: Iterable[tuple[str, Any]]):
    from pydantic import ValidationError

    from tune_cp.config.specs import validation_message
    from tune_cp.oracle.memory import MemoryOverheads

    values = dict(items)
    for k in values:
        if k not in MemoryOverheads.model_fields:
            raise GridError(f"grid key 'overheads': {k!r} is not an overhead term; choose from "
                            f"{', '.join(MemoryOverheads.model_fields)}")
    try:
        return MemoryOverheads(**values)
    except ValidationError as e:
        raise GridError(f"grid key 'overheads': {validation_message(e)}") from None


def _with_digest(sc: Scenario) -> Scenario:
    from tune_cp.agent.serialize import sweep_settings_json

    blob = json.dumps({
        "model": sc.model.model_dump(mode="json"), "gpu": sc.gpu.model_dump(mode="json"),
        "gpus_per_node": sc.gpus_per_node, "nodes": sc.nodes, "seq_len": sc.seq_len,
        "global_batch": sc.global_batch, "precision": sc.precision.value, "tokens": sc.tokens,
        "price": sc.price_per_gpu_hour, "settings": sweep_settings_json(sc.settings),
    }, sort_keys=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
    return Scenario(**{**sc.__dict__, "digest": digest})


# ------------------------------------------------------------------------ one scenario


class WorkerCache:
    """What one worker process keeps between scenarios, keyed by what each part depends on.

    * ``tables``: per model, the CP-SAT model's memory tables that depend on the model alone
      (``solver.model.OracleCache``'s parameter units ``pu``, stage counts ``stages`` and largest
      chunk ``chunk_max``), and per (model, GPU, GPUs per node, training, overheads) its
      activation units ``act`` — none of them reads the node count (the CP-SAT model keys them
      by axis values, never by dp or the world size). Each new problem's cache starts with them.
    * ``searches``: the last few search results by :attr:`Scenario.search_key` (scenarios that
      differ only in tokens or price).
    * ``hits``/``misses`` count table sharing (problems that found the tables already built).
    """

    MAX_MODELS = 16
    MAX_SEARCHES = 8

    def __init__(self) -> None:
        self.model_tables: OrderedDict[Any, dict[str, dict]] = OrderedDict()
        self.act_tables: OrderedDict[Any, dict] = OrderedDict()
        self.searches: OrderedDict[Any, Any] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.enabled = True

    @staticmethod
    def _get(store: OrderedDict, key: Any, make: Callable[[], Any], limit: int) -> tuple[Any, bool]:
        got = store.get(key)
        if got is not None:
            store.move_to_end(key)
            return got, True
        got = store[key] = make()
        while len(store) > limit:
            store.popitem(last=False)
        return got, False

    def prime(self, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
              overheads: Any) -> None:
        """Give the CP-SAT model's cache of this problem the shared node-independent tables."""
        if not self.enabled:
            return
        try:
            from tune_cp.solver import model as SM

            if hasattr(SM, "_SHARED"):
                return  # the solver shares its node-independent tables across clusters itself
            key = (model, cluster, training, overheads)
            if key in SM._CACHES:
                return
            probe = SM.OracleCache.__new__(SM.OracleCache)
            SM.OracleCache.__init__(probe, _ProblemView(model, cluster, training, overheads))
            names = ("pu", "stages", "chunk_max")
            if not all(isinstance(getattr(probe, n, None), dict) for n in (*names, "act")):
                return  # the cache changed shape: build everything per problem
        except (ImportError, AttributeError, TypeError):
            return
        tables, hit = self._get(self.model_tables, model, lambda: {n: {} for n in names},
                                self.MAX_MODELS)
        for n in names:
            setattr(probe, n, tables[n])
        act_key = (model, cluster.gpu, cluster.gpus_per_node, training, overheads)
        probe.act, hit_act = self._get(self.act_tables, act_key, dict, self.MAX_MODELS)
        self.hits += hit and hit_act
        self.misses += not (hit and hit_act)
        SM._CACHES[key] = probe
        while len(SM._CACHES) > SM.CACHE_PROBLEMS:
            SM._CACHES.popitem(last=False)


@dataclass(frozen=True)
class _ProblemView:
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    overheads: Any


#: The cache of this process (a worker of a pool, a Ray worker, or the main process).
WORKER = WorkerCache()


def clear_solver_caches() -> None:
    """Forget every table the CP-SAT models memoise in this process (for measurements)."""
    from tune_cp.solver import model as SM

    SM._CACHES.clear()
    shared = getattr(SM, "_SHARED", None)
    if shared is not None:
        shared.clear()


def _init_worker(share_tables: bool = True) -> None:
    """Process-pool initializer (safe under spawn and forkserver: it only imports and sets
    module state): the heavy imports once, Ctrl-C left to the parent."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import tune_cp.agent.search  # noqa: F401  (imports the solver and oracle once per worker)

    WORKER.enabled = share_tables


def scenario_inputs(sc: Scenario):
    """The specs and search options of a scenario."""
    from tune_cp.agent.search import Preference, SearchOptions
    from tune_cp.solver.settings import RunSettings

    st = sc.settings
    cluster = ClusterSpec(gpu=sc.gpu, num_nodes=sc.nodes, gpus_per_node=sc.gpus_per_node)
    training = TrainingSpec(seq_len=sc.seq_len, global_batch_size=sc.global_batch,
                            precision=sc.precision)
    given = {"memory_margin": st.memory_margin} if st.memory_margin is not None else {}
    settings = RunSettings(constraints=st.constraints, overheads=_overheads(st.overheads),
                           calibration=st.calibration,
                           allow_cross_scale_up=st.allow_cross_scale_up, **given,
                           framework=st.framework, **dict(st.run_options))
    fp8 = sc.precision is Precision.FP8
    if st.fp8_param_gather and not fp8:  # the search's own refusal (cli.py search_cmd)
        raise ConfigError(f"--fp8-param-gather keeps only FP8 copies of the weights, so it needs "
                          f"FP8 training, but the precision is {sc.precision.value}: pass "
                          f"--precision fp8, or drop --fp8-param-gather")
    fp8_params = st.fp8_param_gather
    if st.framework is not None and not fp8_params:  # search --framework: FP8 runs' parameters
        from tune_cp.formats.frameworks import Framework, framework_defaults

        fp8_params = fp8 and any(d.field == "fp8_param_gather" and d.value
                                 for d in framework_defaults(Framework(st.framework), None, fp8))
    opts = SearchOptions(
        settings=settings, top_k=1,
        preferences=tuple(Preference.parse(p) for p in st.preferences),
        grad_reduce_in_fp32=not st.grad_reduce_in_bf16, fsdp=st.fsdp,
        fp8_param_gather=fp8_params)
    return cluster, training, opts


def run_scenario(sc: Scenario, cache: WorkerCache | None = None) -> dict[str, Any]:
    """One scenario's row; never raises for a scenario's own failure (status ``error``)."""
    cache = WORKER if cache is None else cache
    row = base_row(sc)
    try:
        from tune_cp.agent.search import NoFeasibleConfiguration, search

        cluster, training, opts = scenario_inputs(sc)
        row["gpus"] = cluster.world_size
        key = sc.search_key
        got = cache.searches.get(key)
        if got is None:
            cache.prime(sc.model, cluster, training, opts.overheads)
            try:
                got = search(sc.model, cluster, training, opts)
            except NoFeasibleConfiguration as e:
                got = e
            cache.searches[key] = got
            while len(cache.searches) > cache.MAX_SEARCHES:
                cache.searches.popitem(last=False)
        if isinstance(got, Exception):
            row.update(status="infeasible", feasible=0, reason=" ".join(str(got).split()))
            return row
        row.update(result_columns(got, sc))
    except Exception as e:  # noqa: BLE001 - a scenario's failure is its row, not the sweep's
        row.update(status="error", reason=error_text(e))
    return row


def error_text(e: BaseException) -> str:
    text = " ".join(str(e).split()) or "no message"
    return text if isinstance(e, ConfigError) else f"{type(e).__name__}: {text}"


def base_row(sc: Scenario) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLUMN_NAMES)
    row.update(scenario_id=sc.scenario_id, model=sc.model.name, gpu=sc.gpu.name, nodes=sc.nodes,
               gpus_per_node=sc.gpus_per_node, gpus=sc.nodes * sc.gpus_per_node,
               seq_len=sc.seq_len, global_batch=sc.global_batch, precision=sc.precision.value,
               tokens=sc.tokens, price_per_gpu_hour=sc.price_per_gpu_hour,
               inputs_digest=sc.digest)
    return row


def interval_of(result: Any) -> tuple[float | None, float | None]:
    """The best configuration's projected tokens/s/GPU interval when the search result carries
    one (an object with ``low``/``high``, or the JSON form), else (None, None)."""
    for holder, name in ((result, "best_interval"), (result, "interval"),
                         (getattr(result, "best", None), "interval")):
        iv = getattr(holder, name, None) if holder is not None else None
        if callable(iv):
            iv = iv()
        if iv is None:
            continue
        if isinstance(iv, Mapping):
            lo, hi = iv.get("low_tokens_per_s_per_gpu"), iv.get("high_tokens_per_s_per_gpu")
        else:
            lo, hi = getattr(iv, "low", None), getattr(iv, "high", None)
        if lo is not None and hi is not None:
            return float(lo), float(hi)
    return None, None


def result_columns(r: Any, sc: Scenario) -> dict[str, Any]:
    """The row fields of a search result (``r``: :class:`agent.search.SearchResult`)."""
    from tune_cp.agent.serialize import config_json

    best = r.best
    cfg = config_json(best.config, r.training)
    out: dict[str, Any] = {k: cfg[k] for k in CONFIG_COLUMNS}
    out["recompute_modules"] = "+".join(cfg["recompute_modules"]) or None
    proj = best.projection
    world = r.cluster.world_size
    per_gpu = float(best.throughput)
    lo, hi = interval_of(r)
    bias = r.interval.bias if getattr(r, "interval", None) is not None else None
    peak = best.outcome.memory.peak_bytes if best.outcome.memory is not None else None
    out.update(
        status="ok", tokens_per_s_per_gpu=per_gpu, tokens_per_s_per_gpu_low=lo,
        tokens_per_s_per_gpu_high=hi, class_bias=bias, mfu=float(proj.mfu), step_time_s=float(proj.step_time_s),
        peak_bytes=peak, peak_gib=peak / GIB if peak is not None else None,
        hbm_limit_bytes=int(best.outcome.limit_bytes), cluster_tokens_per_s=per_gpu * world,
        feasible=len(r.enumeration), candidates=int(r.enumeration.space_size),
        best_phase=r.best_phase,
    )
    if sc.tokens and per_gpu > 0:
        seconds = sc.tokens / (per_gpu * world)
        out["days"] = seconds / SECONDS_PER_DAY
        out["gpu_hours"] = world * seconds / SECONDS_PER_HOUR
        if sc.price_per_gpu_hour is not None:
            out["cost"] = out["gpu_hours"] * sc.price_per_gpu_hour
    return out


# ------------------------------------------------------------------------------ engines


Outcome = tuple[Scenario, dict[str, Any]]


class SerialEngine:
    """Every scenario in this process, one after another."""

    name = "this process"

    def run(self, scenarios: Sequence[Scenario]) -> Iterator[Outcome]:
        for sc in scenarios:
            yield sc, run_scenario(sc)

    def close(self, cancel: bool = False) -> None:
        pass


def _start_method() -> str:
    import multiprocessing as mp

    methods = mp.get_all_start_methods()
    return "forkserver" if "forkserver" in methods else "spawn"


class LocalEngine:
    """``workers`` local processes (``concurrent.futures.ProcessPoolExecutor`` with the
    forkserver or spawn start method and :func:`_init_worker`); one task per scenario, results
    as they complete. A worker that dies (out of memory, killed) fails its scenario's row."""

    def __init__(self, workers: int, share_tables: bool = True) -> None:
        self.workers = workers
        self.share_tables = share_tables
        self.name = f"{workers} local processes"
        self.pool = None

    def run(self, scenarios: Sequence[Scenario]) -> Iterator[Outcome]:
        import multiprocessing as mp
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
        from concurrent.futures.process import BrokenProcessPool

        ctx = mp.get_context(_start_method())
        self.pool = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_init_worker,
                                        initargs=(self.share_tables,))
        todo = list(scenarios)
        pending: dict[Any, Scenario] = {}
        # a bounded window keeps cancellation cheap and memory flat
        window = 4 * self.workers
        while todo or pending:
            while todo and len(pending) < window:
                sc = todo.pop(0)
                try:
                    pending[self.pool.submit(run_scenario, sc)] = sc
                except BrokenProcessPool:
                    self._restart(ctx)
                    pending[self.pool.submit(run_scenario, sc)] = sc
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            broken = False
            for fut in sorted(done, key=lambda f: pending[f].position):
                sc = pending.pop(fut)
                try:
                    yield sc, fut.result()
                except BrokenProcessPool as e:
                    broken = True
                    row = base_row(sc)
                    row.update(status="error",
                               reason=f"worker process died running this scenario ({e})")
                    yield sc, row
                except Exception as e:  # noqa: BLE001 - the row says why
                    row = base_row(sc)
                    row.update(status="error", reason=error_text(e))
                    yield sc, row
            if broken:
                # every scenario still pending died with the pool: run them again
                todo[:0] = sorted(pending.values(), key=lambda s: s.position)
                pending.clear()
                self._restart(ctx)

    def _restart(self, ctx) -> None:
        from concurrent.futures import ProcessPoolExecutor

        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_init_worker,
                                        initargs=(self.share_tables,))

    def close(self, cancel: bool = False) -> None:
        if self.pool is None:
            return
        if cancel:
            procs = list(getattr(self.pool, "_processes", {}).values())
            self.pool.shutdown(wait=False, cancel_futures=True)
            for p in procs:  # running scenarios are abandoned, not awaited
                p.terminate()
            for p in procs:
                p.join(5)
        else:
            self.pool.shutdown(wait=True)
        self.pool = None


def _ray_task(sc: Scenario) -> dict[str, Any]:
    return run_scenario(sc)


def ray_address_file(env: Mapping[str, str] | None = None) -> Path:
    """The file where ``ray start --head`` records the cluster it started, as Ray finds it
    (Ray 2.60 ``ray/_common/utils.py``: ``get_default_system_temp_dir``, ``get_ray_address_file``):
    ``$RAY_TMPDIR``, else ``$TMPDIR`` on Linux, else ``/tmp``; then ``ray/ray_current_cluster``.
    ``ray stop`` removes it, but a head that ended otherwise (killed, crashed, a container
    restarted with ``/tmp`` kept) leaves it naming an address nothing answers at."""
    env = os.environ if env is None else env
    base = env.get("RAY_TMPDIR") or (env.get("TMPDIR") if sys.platform.startswith("linux")
                                     else None) or "/tmp"
    return Path(base) / "ray" / "ray_current_cluster"


def _host_port(address: str) -> tuple[str, int] | None:
    """``host:port`` of a Ray address (``ray://head:10001``, ``10.0.0.5:6379``, ``[::1]:6379``),
    or None when it has none."""
    rest = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def address_answers(address: str, timeout_s: float = 1.0) -> bool:
    """Whether something accepts a TCP connection at the address's host and port (a Ray head's
    GCS or client server); an address without a port is taken as answering (Ray decides)."""
    import socket

    hp = _host_port(address)
    if hp is None:
        return True
    try:
        with socket.create_connection(hp, timeout=timeout_s):
            return True
    except OSError:
        return False


def auto_address(env: Mapping[str, str] | None = None,
                 answers: Callable[[str], bool] = address_answers) -> tuple[str, str]:
    """What ``--ray auto`` runs on: (the address for ``ray.init``, how it was found). The
    cluster ``RAY_ADDRESS`` names (it must answer: it was asked for), else the one
    :func:`ray_address_file` records if it answers, else ``"local"``: a new local cluster
    (``ray.init(address="local")``, which never joins another). ``ray.init()`` and Ray's own
    ``auto`` take the recorded address even when that head is gone, try to join it and fail
    (with ``num_cpus`` given, at once: Ray refuses a size for a cluster it joins)."""
    env = os.environ if env is None else env
    named = env.get("RAY_ADDRESS", "").strip()
    if named:
        if not answers(named):
            raise ConfigError(f"--ray auto: RAY_ADDRESS={named} does not answer; start that "
                              f"cluster, or unset RAY_ADDRESS to start a local one")
        return named, "from RAY_ADDRESS"
    path = ray_address_file(env)
    try:
        recorded = path.read_text().strip() if path.is_file() else ""
    except OSError:
        recorded = ""
    if not recorded:
        return "local", "no Ray cluster is recorded on this machine"
    if answers(recorded):
        return recorded, f"recorded in {path}"
    return "local", (f"{path} names {recorded}, which does not answer: a head that is no "
                     f"longer running")


class RayEngine:
    """Each scenario a Ray task (``num_cpus=1``); results are taken as they finish
    (``ray.wait``). ``address``: ``auto`` joins the Ray cluster this machine runs
    (:func:`auto_address`: ``RAY_ADDRESS``, else the one ``ray start`` recorded, if it answers),
    else starts a local one; ``local`` always starts a local one; anything else is passed to
    ``ray.init(address=...)`` (``ray://head:10001`` needs Ray Client, ``ray[client]``;
    ``head:6379``). ``num_cpus`` sizes a local cluster started here (default: Ray's, every
    CPU); a running cluster keeps its size. ``say`` receives one line naming the cluster run on
    (the CLI writes it on stderr). At most ``in_flight`` tasks are submitted at once (default:
    twice the cluster's CPUs). A task that raises or whose worker dies fails its scenario's row.
    Ray is imported here and nowhere else."""

    def __init__(self, address: str = "auto", num_cpus: int | None = None,
                 in_flight: int | None = None, init_kwargs: Mapping[str, Any] | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("--ray needs Ray: pip install 'tune-cp[ray]'") from None
        self.ray = ray
        self.address = address
        self.num_cpus = num_cpus
        self.in_flight = in_flight
        self.init_kwargs = dict(init_kwargs or {})
        self.say = say
        self.started = False
        self.name = f"Ray ({address})"
        self.joined = ""
        self.refs: dict[Any, Scenario] = {}

    def _init(self) -> None:
        ray = self.ray
        if ray.is_initialized():
            return
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                  "logging_level": "ERROR"} | self.init_kwargs
        address, source = self.address, ""
        if address == "auto":
            address, source = auto_address()
        elif "://" in address:
            try:
                import grpc  # noqa: F401 - Ray Client's transport (ray[client])
            except ImportError:
                raise ConfigError(f"--ray {self.address}: Ray Client needs grpcio: pip install "
                                  f"'tune-cp[ray]' (it brings ray[client])") from None
        if address == "local":
            # workers on this machine run this interpreter, which has tune-cp installed (it does
            # not run uninstalled); a remote cluster needs tune-cp installed on its nodes
            if self.num_cpus is not None:
                kwargs["num_cpus"] = self.num_cpus
            ray.init(address="local", **kwargs)
            self.started = True
            cpus = int(ray.cluster_resources().get("CPU", 0))
            what = f"started a local Ray cluster of {cpus} CPUs"
            self.name = f"Ray (local, {cpus} CPUs)"
        else:
            # Ray refuses num_cpus when it joins a cluster: a running cluster keeps its size
            ray.init(address=address, **kwargs)
            self.started = True
            cpus = int(ray.cluster_resources().get("CPU", 0))
            what = f"joined the Ray cluster at {address} ({cpus} CPUs)"
            if self.num_cpus is not None:
                what += f"; --workers {self.num_cpus} does not resize a running cluster"
            self.name = f"Ray ({address}, {cpus} CPUs)"
        self.joined = f"--ray {self.address}: {what}" + (f" ({source})" if source else "")
        if self.say is not None:
            self.say(self.joined)

    def run(self, scenarios: Sequence[Scenario]) -> Iterator[Outcome]:
        ray = self.ray
        try:
            self._init()
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - one line for the user
            raise ConfigError(f"--ray {self.address}: cannot start or reach Ray "
                              f"({error_text(e)})") from None
        task = ray.remote(num_cpus=1, max_retries=0)(_ray_task)
        cpus = int(ray.cluster_resources().get("CPU", 1)) or 1
        window = self.in_flight or 2 * cpus
        todo = list(scenarios)
        while todo or self.refs:
            while todo and len(self.refs) < window:
                sc = todo.pop(0)
                self.refs[task.remote(sc)] = sc
            done, _ = ray.wait(list(self.refs), num_returns=1)
            for ref in done:
                sc = self.refs.pop(ref)
                try:
                    row = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - the task raised, or its worker died
                    row = base_row(sc)
                    cause = getattr(e, "cause", None)
                    row.update(status="error", reason="Ray task failed: " + error_text(cause or e))
                yield sc, row

    def close(self, cancel: bool = False) -> None:
        ray = self.ray
        if cancel:
            for ref in list(self.refs):
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001, S110 - best effort on the way out
                    pass
        self.refs.clear()
        if self.started:
            ray.shutdown()
            self.started = False


# ------------------------------------------------------------------------ output files


def output_format(path: str) -> str:
    """The table's format from ``--out``'s extension, once the path can be written (checked
    before any scenario runs: the rows are written atomically beside it)."""
    from tune_cp.oracle.outputs import check_output_path

    ext = Path(path).suffix.lower()
    if ext not in FORMATS:
        raise ConfigError(f"--out {path!r}: the file must end in .csv or .parquet")
    if ext == ".parquet":
        require_pyarrow()
    check_output_path(path, "--out", tuple(FORMATS))
    return ext


def require_pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ConfigError(f"--out *.parquet needs pyarrow: {PARQUET_EXTRA}; or write .csv") from None
    import pyarrow

    return pyarrow


def _csv_text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _from_csv(name: str, text: str) -> Any:
    if text == "":
        return None
    kind = COLUMN_TYPES[name]
    if kind is bool:
        return text == "true"
    if kind is int:
        return int(text)
    if kind is float:
        return float(text)
    return text


def write_rows(path: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write ``rows`` (already sorted) atomically: a temporary file beside ``path``, then
    ``os.replace`` — a reader (or an interrupted sweep) only ever sees a complete file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    if target.suffix.lower() == ".parquet":
        pa = require_pyarrow()
        import pyarrow.parquet as pq

        types = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}
        schema = pa.schema([(n, types[t]) for n, t in COLUMNS])
        table = pa.table({n: [r.get(n) for r in rows] for n in COLUMN_NAMES}, schema=schema)
        pq.write_table(table, tmp)
    else:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(COLUMN_NAMES)
        for r in rows:
            w.writerow([_csv_text(r.get(n)) for n in COLUMN_NAMES])
        tmp.write_text(buf.getvalue())
    os.replace(tmp, target)


def read_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a sweep output file (for ``resume``)."""
    p = Path(path)
    try:
        if p.suffix.lower() == ".parquet":
            require_pyarrow()
            import pyarrow.parquet as pq

            table = pq.read_table(p)
            missing = [n for n in ("scenario_id", "status", "inputs_digest")
                       if n not in table.column_names]
            if missing:
                raise ConfigError(f"--resume: {path!r} is not a sweep output (no column "
                                  f"{missing[0]})")
            return [{n: r.get(n) for n in COLUMN_NAMES} for r in table.to_pylist()]
        with p.open(newline="") as fh:
            reader = csv.DictReader(fh)
            head = reader.fieldnames or []
            missing = [n for n in ("scenario_id", "status", "inputs_digest") if n not in head]
            if missing:
                raise ConfigError(f"--resume: {path!r} is not a sweep output (no column "
                                  f"{missing[0]})")
            return [{n: _from_csv(n, r.get(n) or "") for n in COLUMN_NAMES} for r in reader]
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged file is the user's input
        raise ConfigError(f"--resume: cannot read {path!r} ({error_text(e)}); remove it or "
                          f"choose another --out") from None


# ------------------------------------------------------------------------------- progress


class Progress:
    """``done / failed / remaining`` and an estimate of the time left, on one stderr line
    (redrawn in place on a terminal, every few seconds otherwise)."""

    def __init__(self, total: int, stream=None, enabled: bool = True) -> None:
        self.total = total
        self.done = self.failed = self.infeasible = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.monotonic()
        self.last = 0.0

    def update(self, row: Mapping[str, Any]) -> None:
        self.done += 1
        self.failed += row.get("status") == "error"
        self.infeasible += row.get("status") == "infeasible"
        if self.done < self.total:
            self.draw()  # the last one is drawn by draw(final=True)

    def line(self) -> str:
        left = self.total - self.done
        el = time.monotonic() - self.t0
        eta = el / self.done * left if self.done else None
        width = 24
        filled = round(width * self.done / self.total) if self.total else width
        bar = "#" * filled + "." * (width - filled)
        return (f"sweep [{bar}] {self.done}/{self.total} done, {self.failed} failed, "
                f"{self.infeasible} infeasible, {left} remaining, elapsed {_hms(el)}, "
                f"ETA {_hms(eta) if eta is not None else '?'}")

    def draw(self, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not final and not self.tty and now - self.last < 5 and self.done < self.total:
            return
        self.last = now
        end = "\n" if final or not self.tty else ""
        self.stream.write(("\r" if self.tty else "") + self.line() + end)
        self.stream.flush()


def _hms(s: float) -> str:
    s = round(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


# ------------------------------------------------------------------------------- the sweep


@dataclass
class SweepReport:
    out: str
    total: int
    computed: int
    resumed: int
    ok: int = 0
    infeasible: int = 0
    failed: int = 0
    interrupted: bool = False
    wall_s: float = 0.0
    engine: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def scenarios_per_s(self) -> float | None:
        return self.computed / self.wall_s if self.wall_s > 0 and self.computed else None


def sort_rows(rows: Iterable[Mapping[str, Any]], order: Mapping[str, tuple[int, ...]]
              ) -> list[dict[str, Any]]:
    """Rows in the grid's order; rows of scenarios not in this grid (a resumed file of another
    grid) after them, by id."""
    far = (1 << 30,)
    return sorted((dict(r) for r in rows),
                  key=lambda r: (order.get(r["scenario_id"], far), r["scenario_id"]))


def run_sweep(scenarios: Sequence[Scenario], out: str, engine: Any = None, *,
              resume: bool = False, progress: Progress | None = None,
              flush_every_s: float = 0.5,
              on_row: Callable[[dict[str, Any]], None] | None = None) -> SweepReport:
    """Run ``scenarios`` on ``engine`` (default: this process) into ``out`` (.csv or .parquet).

    With ``resume``, rows of ``out`` whose scenario id and input digest match a scenario are kept
    and the scenario is not run again (rows with status ``error`` are run again). The file is
    rewritten, sorted, as rows arrive (at most every ``flush_every_s``) and at the end; on
    KeyboardInterrupt it is written with what has arrived, then the interrupt propagates."""
    output_format(out)
    engine = engine or SerialEngine()
    order = {s.scenario_id: s.position for s in scenarios}
    kept: dict[str, dict[str, Any]] = {}
    stale = 0
    if resume and Path(out).exists():
        digest = {s.scenario_id: s.digest for s in scenarios}
        for r in read_rows(out):
            sid = r["scenario_id"]
            if sid in digest and (r["inputs_digest"] != digest[sid] or r["status"] == "error"):
                stale += 1
                continue
            kept[sid] = r
    elif Path(out).exists() and not resume:
        pass  # overwritten
    todo = [s for s in scenarios if s.scenario_id not in kept]
    report = SweepReport(out, len(scenarios), 0, len(scenarios) - len(todo), engine=engine.name)
    rows: dict[str, dict[str, Any]] = dict(kept)
    if progress is not None:
        progress.total = len(todo)
    t0 = time.perf_counter()
    last = 0.0
    dirty = False

    def flush() -> None:
        write_rows(out, sort_rows(rows.values(), order))

    try:
        if todo or not Path(out).exists() or stale:
            flush()  # the file exists (header and the kept rows) from the start
        for sc, row in engine.run(todo):
            rows[sc.scenario_id] = row
            report.computed += 1
            if progress is not None:
                progress.update(row)
            if on_row is not None:
                on_row(row)
            dirty = True
            now = time.perf_counter()
            if now - last >= flush_every_s:
                flush()
                last, dirty = now, False
        engine.close()
    except KeyboardInterrupt:
        report.interrupted = True
        engine.close(cancel=True)
        flush()
        raise
    except BaseException:
        engine.close(cancel=True)
        flush()
        raise
    finally:
        report.wall_s = time.perf_counter() - t0
        report.engine = engine.name  # a Ray engine names its cluster once it is on one
    if dirty or report.computed == 0:
        flush()
    report.rows = sort_rows(rows.values(), order)
    for r in report.rows:
        if r["scenario_id"] in order:
            report.ok += r["status"] == "ok"
            report.infeasible += r["status"] == "infeasible"
            report.failed += r["status"] == "error"
    if progress is not None and todo:
        progress.draw(final=True)
    return report


def layout_label(r: Mapping[str, Any]) -> str:
    """``TP2 PP1 VPP1 CP1 EP1 mbs2 rc none`` of a row with a configuration."""
    rc = r["recompute"]
    if rc == "full":
        rc = f"full{r['recompute_layers'] if r['recompute_layers'] is not None else ''}"
    disp = (f" {r['dispatcher']}" if r.get("dispatcher") not in (None, "alltoall")
            and (r.get("ep") or 1) > 1 else "")  # the search may pick another MoE dispatcher
    fsdp = " FSDP" if r.get("fsdp") else ""  # grid key fsdp: true
    return (f"TP{r['tp']} PP{r['pp']} VPP{r['vpp']} CP{r['cp']} EP{r['ep']}{disp}{fsdp} "
            f"mbs{r['mbs']} rc {rc}")


def interval_text(r: Mapping[str, Any]) -> str:
    """The row's interval, ``!`` after it when its class is biased (``class_bias`` set: the
    interval does not hold the projection; :func:`render_table` notes the figure)."""
    from tune_cp.oracle.uncertainty import band_text

    lo, hi = r.get("tokens_per_s_per_gpu_low"), r.get("tokens_per_s_per_gpu_high")
    return "-" if lo is None or hi is None else band_text(lo, hi, r.get("class_bias") is not None)


def bias_note(bias: float) -> str:
    """The table note of a row's ``class_bias`` (``oracle.uncertainty.ClassInterval.biased``)."""
    return (f"class biased: projections of the interval's class ran {abs(bias):.0%} "
            f"{'above' if bias > 0 else 'below'} measured (median out-of-fold residual; column "
            f"class_bias {bias:+.3f}), so the interval lies {'below' if bias > 0 else 'above'} "
            f"the projection")


def render_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A compact text table of sweep rows (``tune-cp sweep --table``)."""
    width = max([len("scenario")] + [len(r["scenario_id"]) for r in rows])
    lines = [f"{'scenario':{width}} {'status':10} {'best layout':36} {'tok/s/GPU':>9} "
             f"{'80% interval':>13} {'MFU':>6} {'peak GiB':>8} {'days':>8} {'GPU-hours':>10} {'cost':>10} "
             f"{'feasible':>8}"]

    def num(v: Any, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    for r in rows:
        if r["status"] != "ok":
            why = r["reason"] or ""
            if "; fix: " in why:  # the explanation's remedy says most in one line
                why = why[why.index("; fix: ") + 2:]
            lines.append(f"{r['scenario_id']:{width}} {r['status']:10} "
                         f"{why[:110] + ('...' if len(why) > 110 else '')}")
            continue
        lines.append(
            f"{r['scenario_id']:{width}} {'ok':10} {layout_label(r):36} "
            f"{r['tokens_per_s_per_gpu']:>9,.0f} {interval_text(r):>13} {100 * r['mfu']:>5.1f}% {r['peak_gib']:>8.1f} "
            f"{num(r['days'], '>8.1f')} {num(r['gpu_hours'], '>10,.0f')} "
            f"{num(r['cost'], '>10,.0f')} {r['feasible']:>8,}")
    from tune_cp.oracle.uncertainty import bias_notes

    lines.extend(bias_notes([bias_note(r["class_bias"]) for r in rows
                             if r["status"] == "ok" and r.get("class_bias") is not None]))
    return lines


def make_engine(workers: int, ray: str | None, share_tables: bool = True) -> Any:
    """The engine the CLI flags ask for: Ray when ``ray`` is given, else ``workers`` local
    processes (1: this process)."""
    if ray is not None:
        return RayEngine(ray, num_cpus=workers if workers > 1 else None,
                         say=lambda line: print(f"tune-cp: {line}", file=sys.stderr, flush=True))
    if workers > 1:
        return LocalEngine(workers, share_tables)
    return SerialEngine()


__all__ = [
    "COLUMNS",
    "Grid",
    "GridError",
    "LocalEngine",
    "RayEngine",
    "auto_address",
    "Scenario",
    "SerialEngine",
    "SweepReport",
    "WorkerCache",
    "load_grid",
    "make_engine",
    "read_rows",
    "run_scenario",
    "run_sweep",
    "write_rows",
]
