"""Readers of Megatron-LM arguments and Primus experiment YAML (see :mod:`formats`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tune_cp.config.specs import (
    DEFAULT_SELECTIVE_MODULES,
    EMBEDDING_LOSS_SLOTS,
    SELECTIVE_MODULES,
    ClusterSpec,
    ConfigError,
    Dispatcher,
    FlexBackend,
    Fp8Recipe,
    GroupedGemm,
    ModelSpec,
    ParallelConfig,
    PipelineSplit,
    Precision,
    Recompute,
    RecomputeMethod,
    Schedule,
    Spec,
    TrainingSpec,
    parse_pipeline_layout,
    validation_message,
)
from tune_cp.formats.keys import (
    ALL_KEYS,
    CONFIG_KEYS,
    FRAMEWORK_NAME,
    IGNORED,
    KNOB_DEST,
    MODEL_KEYS,
    UNMODELED,
    UNMODELED_RECOMPUTE_MODULES,
    UNMODELLED_KEYS,
    Flavor,
    Fp8Format,
    Key,
    Kind,
    RawArgs,
    dest_effects,
    find_model_file,
    fmt_value,
    load_model_chain,
    megatron_flags,
    read_yaml_mapping,
    refused_architecture,
    resolve_placeholders,
    scan_megatron,
    spell,
)
from tune_cp.formats.model import (
    ImportedArchitecture,
    build_model,
    compare_model,
)
from tune_cp.oracle.memory import FULL_ITERATION, PER_LAYER_GRAPH_SCOPES, RunOptions, split_layout
from tune_cp.oracle.params import VOCAB_DIVISIBLE_BY

# --------------------------------------------------------------------------- defaults tables

# Defaults of the settings tune-cp reads, with where they are set. Megatron-LM: arguments.py and
# TransformerConfig / ModelParallelConfig field defaults at d98e8a64dd. Primus: the module presets
# an experiment's ``config: pre_trainer.yaml`` pulls in and the model base language_model.yaml.
DEFAULTS: dict[Flavor, dict[str, tuple[Any, str]]] = {
    Flavor.MEGATRON: {
        dest: (value, "Megatron-LM default")
        for dest, value in {
            "tensor_model_parallel_size": 1,
            "pipeline_model_parallel_size": 1,
            "context_parallel_size": 1,
            "expert_model_parallel_size": 1,
            "sequence_parallel": False,
            "recompute_granularity": None,
            "use_distributed_optimizer": False,
            "grad_reduce_in_bf16": False,
            "accumulate_allreduce_grads_in_fp32": False,
            "moe_token_dispatcher_type": "allgather",
            "moe_flex_dispatcher_backend": "deepep",
            "moe_grouped_gemm": False,  # SequentialMLP (transformer_config.py l.850)
            "fp8_recipe": "delayed",
            "data_parallel_sharding_strategy": "optim_grads_params",
            "account_for_embedding_in_pipeline_split": False,
            "account_for_loss_in_pipeline_split": False,
            "attention_backend": "auto",
            "bf16": False,
            "fp16": False,
            "make_vocab_size_divisible_by": 128,
        }.items()
    },
    Flavor.PRIMUS: {
        "tensor_model_parallel_size": (1, "Primus default, language_model.yaml"),
        "pipeline_model_parallel_size": (1, "Primus default, language_model.yaml"),
        "context_parallel_size": (1, "Primus default, language_model.yaml"),
        "expert_model_parallel_size": (1, "Primus default, language_model.yaml"),
        "sequence_parallel": (True, "Primus default, language_model.yaml"),
        "micro_batch_size": (2, "Primus default, trainer_base.yaml"),
        "global_batch_size": (16, "Primus default, pre_trainer.yaml"),
        "seq_length": (1024, "Primus default, pre_trainer.yaml"),
        "recompute_granularity": (None, "Primus default, trainer_base.yaml"),
        "use_distributed_optimizer": (True, "Primus default, pre_trainer.yaml"),
        "grad_reduce_in_bf16": (False, "Primus default, trainer_base.yaml"),
        "accumulate_allreduce_grads_in_fp32": (False, "Primus default, trainer_base.yaml"),
        "moe_token_dispatcher_type": ("allgather", "Primus default, language_model.yaml"),
        "moe_flex_dispatcher_backend": ("deepep", "Megatron-LM default"),
        "moe_grouped_gemm": (False, "Primus default, language_model.yaml"),
        "fp8_recipe": ("delayed", "Primus default, trainer_base.yaml"),
        "data_parallel_sharding_strategy": ("optim_grads_params", "Megatron-LM default"),
        "account_for_embedding_in_pipeline_split": (False, "Primus default, trainer_base.yaml"),
        "account_for_loss_in_pipeline_split": (False, "Primus default, trainer_base.yaml"),
        "attention_backend": ("auto", "Primus default, language_model.yaml"),
        "bf16": (True, "Primus default, trainer_base.yaml"),
        "fp16": (False, "Primus default, trainer_base.yaml"),
        "patch_zero_bubble": (False, "Primus default, zero_bubble.yaml"),
        "enable_zero_bubble": (True, "Primus default, zero_bubble.yaml"),
        "make_vocab_size_divisible_by": (128, "Primus default, trainer_base.yaml"),
    },
}

UNFUSED_ATTENTION = frozenset({"unfused", "local"})  # attention backends that store the scores
PRIMUS_ZB_ALGORITHMS = frozenset({"zero-bubble", "zerobubble", "zero-bubble-heuristic",
                                  "zerobubble-heuristic"})
PRIMUS_PLAIN_ALGORITHMS = frozenset({"1f1b", "1f1b-interleaved", "auto"})


# -------------------------------------------------------------------------------- results




class ImportedRun(Spec):
    """A launch configuration read from a framework's arguments.

    ``config`` holds every ParallelConfig field the arguments set, the framework's defaults for
    the others (stated in ``defaults``); derived fields (dp, ga, schedule) stay None for
    :func:`config.resolve.resolve_config`. ``seq_len`` / ``global_batch_size`` are None when the
    arguments leave them to be derived (see :meth:`training_spec`).
    """

    source: str
    config: ParallelConfig
    fp8_format: Fp8Format | None = None
    seq_len: int | None = None
    global_batch_size: int | None = None
    precision: Precision = Precision.BF16
    flash_attention: bool = True
    #: the framework run settings the arguments set (CUDA graphs, MoE all-to-all overlap,
    #: token-drop; ``_run_options``)
    options: RunOptions = RunOptions()
    num_nodes: int | None = None
    gpus_per_node: int | None = None
    architecture: ImportedArchitecture = ImportedArchitecture()
    model: ModelSpec | None = None
    model_file: str | None = None
    model_missing: str = ""
    unknown: list[str] = []
    unmodelled: list[str] = []
    ignored: list[str] = []
    defaults: list[str] = []
    notes: list[str] = []

    def require_model(self) -> ModelSpec:
        """The model: given, or built from the arguments; else a ConfigError saying why."""
        if self.model is None:
            raise ConfigError(f"the {self.source} do not describe the model "
                              f"({self.model_missing}); pass --model NAME (see `tune-cp models`) "
                              "or a config.json")
        return self.model

    def training_spec(self, model: ModelSpec, cluster: ClusterSpec) -> TrainingSpec:
        """Sequence length (the model's default when not given), global batch (Megatron-LM's
        ``micro_batch_size x dp`` when not given), precision and attention kind."""
        cfg = self.config
        dp = max(1, cluster.world_size // (cfg.tp * cfg.pp * cfg.cp))
        try:
            return TrainingSpec(
                seq_len=self.seq_len or model.default_seq_len,
                global_batch_size=self.global_batch_size or cfg.mbs * dp,
                precision=self.precision,
                flash_attention=self.flash_attention,
            )
        except ValidationError as e:
            raise ConfigError(f"the {self.source}: {validation_message(e)}") from e


# ------------------------------------------------------------------------------- importers


def parse_megatron_args(text: str, *, model: ModelSpec | None = None,
                        env: Mapping[str, str] | None = None) -> ImportedRun:
    """Read the arguments of a Megatron-LM launch.

    ``text`` is shell text: line continuations, ``--flag value`` / ``--flag=value``, flags
    without value, quotes, comments and a leading ``torchrun ... pretrain_gpt.py`` (its
    ``--nnodes`` / ``--nproc-per-node`` give the cluster shape). ``model`` (the CLI's ``--model``)
    takes precedence over model-shape flags; without it, the flags build the model when they are
    complete (see :attr:`ImportedRun.model_missing`). Pass ``model`` whenever there is one: the
    virtual stages from ``--num-layers-per-virtual-pipeline-stage`` and the MoE defaults
    (dispatcher, expert-tensor size) depend on the model.
    """
    raw = scan_megatron(text, env)
    return _interpret(raw, "Megatron-LM arguments", model, model_file=None)


def parse_primus_config(
    path: str | Path, *, model: ModelSpec | None = None, env: Mapping[str, str] | None = None
) -> ImportedRun:
    """Read a Primus experiment YAML (Megatron backend): ``modules.pre_trainer.overrides`` with
    Megatron argument names, over the model YAML named by ``modules.pre_trainer.model`` when it
    can be found (:func:`formats.keys.find_model_file`; with its ``extends:`` presets),
    over Primus's module defaults (stated). ``${VAR:default}`` placeholders take ``env[VAR]`` when
    given, else their default; ``${VAR}`` without one stays unset (noted). Only ``env`` (the
    CLI's ``--env``) is read, never this process's environment, so that no secret of the shell
    (``${OPENAI_API_KEY}``) reaches a message or an export. Model files are read only
    inside the experiment's Primus tree (:func:`formats.keys.find_model_file`)."""
    path = Path(path)
    env = env if env is not None else {}
    raw = RawArgs(Flavor.PRIMUS, where=path.name)
    data = resolve_placeholders(read_yaml_mapping(path, "Primus experiment"), env, raw.notes, "")
    modules = data.get("modules")
    trainer = modules.get("pre_trainer") if isinstance(modules, dict) else None
    if not isinstance(trainer, dict):
        raise ConfigError(f"Primus experiment {str(path)!r} has no modules.pre_trainer mapping; a "
                          "Primus experiment names its trainer, model and overrides there")
    framework = trainer.get("framework", "megatron")
    if framework != "megatron":
        raise ConfigError(f"Primus experiment {str(path)!r}: framework {framework!r} is not "
                          "supported; tune-cp reads Megatron-backend experiments (framework: "
                          "megatron)")
    overrides = trainer.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"Primus experiment {str(path)!r}: modules.pre_trainer.overrides must "
                          f"be a mapping of Megatron argument names to values, got "
                          f"{type(overrides).__name__}")
    model_name = trainer.get("model")
    chain: dict[str, Any] = {}
    if model_name is not None:
        found = find_model_file(path, str(model_name))
        if found is None:
            raw.notes.append(f"model file {model_name} (modules.pre_trainer.model) was not found "
                             "next to the experiment or in a models/ folder above it")
        else:
            chain = load_model_chain(found[0], env, raw.notes, root=found[1])
    refused = refused_architecture({**chain, **overrides})
    if refused:
        raise ConfigError(f"Primus experiment {path.name} (model {model_name}): tune-cp does not "
                          f"model {refused}; it models decoder-only transformers (dense, MoE, "
                          "MLA, sliding-window attention) and hybrid Mamba models given by a "
                          "layer pattern (Megatron-LM --hybrid-layer-pattern, a nemotron_h "
                          "config.json, or --model nemotron-h-8b etc.)")
    for key, value in chain.items():  # the model chain sets keys the overrides do not
        if key in CONFIG_KEYS or key in MODEL_KEYS or key in UNMODELED:
            raw.values[key] = value
            raw.labels[key] = f"{key} (model file {model_name})"
    for key, value in overrides.items():
        key = str(key)
        if key in CONFIG_KEYS or key in MODEL_KEYS or key in UNMODELED:
            raw.values[key] = value
            raw.labels[key] = key
        elif dest_effects().get(key) == "unmodelled" or UNMODELLED_KEYS.fullmatch(key):
            if value not in (None, False):
                raw.unmodelled.append(f"{key}: {fmt_value(value)}")
        elif dest_effects().get(key) in ("none", "read") or IGNORED.fullmatch(key):
            raw.ignored.append(key)
        else:
            raw.unknown.append(f"{key}: {value}")
    run = _interpret(raw, f"Primus experiment {path.name}", model,
                     model_file=None if model_name is None else str(model_name),
                     built_name=Path(str(model_name)).stem if chain else None)
    return run


#: Arguments the dump prints that ``validate_args`` derives from others (Megatron-LM
#: ``arguments.py`` at d98e8a64dd): the virtual stages per rank come from
#: ``--pipeline-model-parallel-layout``, ``--num-layers-per-virtual-pipeline-stage`` or
#: ``--num-virtual-stages-per-pipeline-rank`` (L941-983), which the dump prints too and which are
#: read; the derived value is read only when none of them is set (a hybrid layer pattern's).
DUMP_VPP_SOURCES = ("pipeline_model_parallel_layout", "num_layers_per_virtual_pipeline_stage",
                    "num_virtual_stages_per_pipeline_rank")
#: ... and without virtual stages ``validate_args`` turns ``overlap_p2p_comm`` and
#: ``align_param_gather`` off itself (L1010-1013: "Overlap P2P communication is disabled if not
#: using the interleaved schedule"), so the dump's False then says nothing about the launch.
DUMP_INTERLEAVED_ONLY = ("overlap_p2p_comm", "align_param_gather")
#: Arguments ``validate_args`` sets from others whatever the launch said: ``encoder_num_layers``
#: is ``num_layers`` (L1307), ``bias_gelu_fusion`` is off without linear biases (L1604-1606).
DUMP_DERIVED = {"encoder_num_layers": lambda v: True,
                "bias_gelu_fusion": lambda v: v.get("add_bias_linear") is False}
#: Most names one category of the dump note lists (the rest are counted).
MAX_NOTE_NAMES = 60
_SKIP = object()


def _dump_raw(key: Key, value: Any, text: str) -> Any:
    """The raw value of one read argument of the dump (:func:`formats.logs.dump_value`'s value)
    as :func:`formats.keys.read_value` takes it; None: unset (Megatron-LM's default);
    ``_SKIP``: a value of another kind than the argument's (noted, the default taken)."""
    if value is None or (isinstance(value, str) and not value):
        return None
    kind = key.kind
    if kind is Kind.BOOL:
        return value if isinstance(value, bool) else _SKIP
    if kind is Kind.INT:
        return value if isinstance(value, int) and not isinstance(value, bool) else _SKIP
    if kind is Kind.FLOAT:
        return value if isinstance(value, int | float) and not isinstance(value, bool) else _SKIP
    if kind is Kind.CHOICE:
        return value if isinstance(value, str) and value in key.choices else _SKIP
    if kind is Kind.LIST:
        if isinstance(value, list):
            return [str(v) for v in value]
        return str(value).split() if isinstance(value, str) else _SKIP
    if kind is Kind.FREQ:
        return value if isinstance(value, int) and not isinstance(value, bool) else text.strip()
    if isinstance(value, list):  # a tuple or list setting read as text: window_size (128, 0)
        return ",".join(str(v) for v in value)
    return str(value)


def _flag_on(dest: str, value: Any, text: str) -> bool:
    """Whether a dump value of an argument tune-cp does not read differs from Megatron-LM's
    default for it (``data/megatron_flags.json``'s ``default``, read from ``arguments.py``); with
    no known default, whether it is set at all (not None, False, 0, "", [])."""
    defaults = [i["default"] for i in megatron_flags().values()
                if i["dest"] == dest and "default" in i]
    if defaults:
        return all(value != d and text.strip() != str(d) for d in defaults)
    return value not in (None, False, 0, 0.0, "", "none", "None") and value != []


def _names(items: list[str]) -> str:
    shown = items[:MAX_NOTE_NAMES]
    more = len(items) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more else "")


def parse_argument_dump(dump: Mapping[str, str], *, model: ModelSpec | None = None,
                        extra: str = "", sizes: Mapping[str, int] | None = None,
                        source: str = "log's argument dump") -> ImportedRun:
    """Read Megatron-LM's (or Primus's: its trainer runs Megatron-LM's ``validate_args``,
    ``primus/backends/megatron/patches/args/validate_args_patches.py`` at fd1eeabbad L43-47, which
    prints the dump, ``arguments.py`` L1985, with Primus's own keys in it) argument dump
    (``name ..... value`` lines, read by
    :func:`formats.logs.read_argument_dump`; values by :func:`formats.logs.dump_value`) as a
    launch. The dump holds every argument after ``validate_args``, so each argument tune-cp
    reads is taken with its kind (a bool, an integer, a choice, a list, an enum member's name);
    a value of another kind is skipped and the default taken; arguments that change nothing
    tune-cp models are ignored; those that change memory or time and are not modelled are listed
    (``unmodelled``) when set; what is not a Megatron-LM flag at all (``world_size``, ``rank``,
    ``params_dtype``: set by Megatron-LM itself; or another version's) is ignored. One note says
    what was skipped, by name and value. ``extra``: Megatron-LM arguments that complete or
    override the dump (``--config``); ``sizes``: the start-up ``using world size`` line's
    parallel sizes, used where the dump (cut short) lacks them."""
    from tune_cp.formats.export import primus_default_keys
    from tune_cp.formats.logs import dump_value

    raw = RawArgs(Flavor.MEGATRON)
    values = {str(k): dump_value(v) for k, v in dump.items()}
    refused = refused_architecture(values)
    if refused:
        raise ConfigError(f"the {source}: tune-cp does not model {refused}; it models "
                          "decoder-only transformers (dense, MoE, MLA, sliding-window attention) "
                          "and hybrid Mamba models")
    effects = dest_effects()
    skipped: list[str] = []
    derived: list[str] = []
    ignored = primus = 0
    vpp_source = any(values.get(d) is not None for d in DUMP_VPP_SOURCES)
    for dest, value in values.items():
        text = dump[dest]
        if dest == "virtual_pipeline_model_parallel_size":
            if vpp_source or value is None:
                ignored += 1
                continue
            dest = "num_virtual_stages_per_pipeline_rank"
        if (dest in DUMP_INTERLEAVED_ONLY and values.get(
                "virtual_pipeline_model_parallel_size") is None) or (
                dest in DUMP_DERIVED and DUMP_DERIVED[dest](values)):
            ignored += 1
            continue
        if dest in ALL_KEYS:
            got = _dump_raw(ALL_KEYS[dest], value, text)
            if got is _SKIP:
                skipped.append(f"{dest}={text.strip()}")
            elif got is not None:
                raw.values[dest] = got
                raw.labels[dest] = dest
            continue
        effect = effects.get(dest)
        if effect == "unmodelled":
            if _flag_on(dest, value, text):
                raw.unmodelled.append(f"{dest}: {text.strip()}")
            else:
                ignored += 1
        elif effect in ("none", "read") or IGNORED.fullmatch(dest):
            ignored += 1
        elif dest in primus_default_keys():  # Primus's own settings (a Primus log's dump)
            primus += 1
        else:
            derived.append(dest)
    if "merge_file" in values and values["merge_file"]:
        raw.has_vocab_files = True
    read = len(raw.values)
    for name, size in (sizes or {}).items():
        dest = {"tensor_parallel": "tensor_model_parallel_size",
                "pipeline_parallel": "pipeline_model_parallel_size",
                "context_parallel": "context_parallel_size"}.get(name)
        if dest and dest not in raw.values:
            raw.values[dest] = size
            raw.labels[dest] = f"{name.replace('_', '-')} size (the log's start-up line)"
    parts = [f"{read} of {len(values)} arguments read"]
    if skipped:
        parts.append(f"skipped {len(skipped)} whose value is not one tune-cp reads (the default "
                     f"is taken): {_names(skipped)}")
    if derived:
        parts.append(f"ignored {len(derived)} that are not Megatron-LM flags (set by Megatron-LM "
                     f"itself, or of another version): {_names(derived)}")
    if primus:
        parts.append(f"ignored {primus} Primus settings tune-cp does not read")
    parts.append(f"ignored {ignored} that change nothing tune-cp models")
    if dump:
        raw.note(f"{source}: " + "; ".join(parts))
    if extra.strip():
        more = scan_megatron(extra)
        for dest, value in more.values.items():
            raw.values[dest] = value
            raw.labels[dest] = more.labels.get(dest, dest)
        raw.unknown += more.unknown
        raw.ignored += more.ignored
        raw.unmodelled += more.unmodelled
        raw.notes += [n for n in more.notes if n not in raw.notes]
        raw.has_vocab_files |= more.has_vocab_files
        raw.num_nodes, raw.gpus_per_node = more.num_nodes, more.gpus_per_node
    if not raw.values:
        raise ConfigError(f"the {source} gives no argument tune-cp reads; give the launch "
                          "arguments (calibrate: --config FILE; check: --megatron-args FILE)")
    return _interpret(raw, source if not extra.strip() else f"{source} and the arguments given "
                      "with it", model, model_file=None)


# --------------------------------------------------------------------------- interpretation


class _Reader:
    """Typed access to raw arguments with the flavor's defaults; records stated defaults."""

    def __init__(self, raw: RawArgs) -> None:
        self.raw = raw
        self.flavor = raw.flavor
        self.table = DEFAULTS[raw.flavor]
        self.defaults: list[str] = []

    def given(self, dest: str) -> bool:
        return self.raw.has(dest)

    def get(self, dest: str, *, state: bool = True) -> Any:
        if self.raw.has(dest):
            return self.raw.read(dest)
        value, origin = self.table.get(dest, (None, ""))
        if state and origin:
            self.defaults.append(f"{dest}: {fmt_value(value)} ({origin})")
        return value

    def label(self, dest: str) -> str:
        return self.raw.label(dest)

    def spell(self, dest: str) -> str:
        return spell(dest, self.flavor)

    def fail(self, dest: str, problem: str) -> ConfigError:
        return self.raw.fail(dest, self.raw.values.get(dest), problem)


def _interpret(raw: RawArgs, source: str, model: ModelSpec | None, *, model_file: str | None,
               built_name: str | None = None) -> ImportedRun:
    r = _Reader(raw)
    arch = ImportedArchitecture(**{d: raw.read(d) for d in MODEL_KEYS if raw.has(d)})
    missing = ""
    if model is not None:
        compare_model(raw, arch, model)
    else:
        model, missing, stated = build_model(raw, arch, built_name or "imported", source)
        r.defaults += stated
    is_moe = model.is_moe if model is not None else bool(arch.num_experts)
    num_layers = model.num_layers if model is not None else arch.num_layers
    num_mtp = model.num_mtp_layers if model is not None else (
        getattr(arch, "mtp_num_layers", None) or 0)

    kw: dict[str, Any] = {
        axis: r.get(KNOB_DEST[axis]) for axis in ("tp", "pp", "cp")
    } | {"ep": r.get(KNOB_DEST["ep"], state=is_moe)}
    if is_moe:
        kw["etp"] = r.get(KNOB_DEST["etp"])
        if kw["etp"] is None:
            r.defaults.append("expert_tensor_parallel_size: tensor_model_parallel_size "
                              f"({FRAMEWORK_NAME[r.flavor]} default)")
    layout = _layout(r, num_layers, kw["pp"], num_mtp)
    if layout is not None:
        split, kw["vpp"], kw["pipeline_layout"] = layout
        kw["pipeline_split"] = split
    else:
        split = _pipeline_split(r)
        kw["pipeline_split"] = split
        if split is PipelineSplit.UNEVEN:
            kw["first_stage_layers"], kw["last_stage_layers"] = _uneven_stages(r)
        kw["vpp"] = _virtual_stages(r, kw["pp"], num_layers, split)
    kw["mbs"] = _batch(r)
    kw["sequence_parallel"] = r.get("sequence_parallel", state=kw["tp"] > 1)
    kw |= _recompute(r, num_layers, kw["pp"] * kw["vpp"])
    kw |= _sharding(r)
    kw["dispatcher"] = _dispatcher(r) if is_moe else Dispatcher.ALLTOALL
    if is_moe:
        kw |= _backend(r, kw["dispatcher"])
    precision, fp8_format, recipe = _precision(r)
    kw["fp8_recipe"] = recipe
    kw["grad_reduce_in_fp32"] = _grad_dtype(r)
    kw["fp8_param_gather"] = bool(r.get("fp8_param_gather", state=False)) and recipe is not None
    kw["schedule"] = _schedule(r)
    flash = (r.get("attention_backend", state=False) or "auto") not in UNFUSED_ATTENTION
    options = _run_options(r, is_moe)
    _unmodeled_notes(r)
    try:
        config = ParallelConfig(**kw)
    except ValidationError as e:
        raise ConfigError(f"the {source} give an invalid configuration: {validation_message(e)}") from e
    seq = raw.read("seq_length") if r.given("seq_length") else None
    gbs = raw.read("global_batch_size") if r.given("global_batch_size") else None
    if r.flavor is Flavor.PRIMUS:
        seq = seq or DEFAULTS[Flavor.PRIMUS]["seq_length"][0]
        gbs = gbs or DEFAULTS[Flavor.PRIMUS]["global_batch_size"][0]
    return ImportedRun(
        source=source,
        config=config,
        fp8_format=fp8_format,
        seq_len=seq,
        global_batch_size=gbs,
        precision=precision,
        flash_attention=flash,
        options=options,
        num_nodes=raw.num_nodes,
        gpus_per_node=raw.gpus_per_node,
        architecture=arch,
        model=model,
        model_file=model_file,
        model_missing=missing,
        unknown=raw.unknown,
        unmodelled=list(dict.fromkeys(raw.unmodelled)),
        ignored=list(dict.fromkeys(raw.ignored)),
        defaults=r.defaults,
        notes=raw.notes,
    )


def _layout(r: _Reader, num_layers: int | None, pp: int,
            num_mtp: int = 0) -> tuple[PipelineSplit, int, str | None] | None:
    """``pipeline_model_parallel_layout`` ("Et*3|(tt|)*29,m|L": ``|`` between virtual stages, E
    embedding, t a decoder layer, m an MTP layer, L the loss; Megatron-Core's syntax,
    :func:`config.specs.parse_pipeline_layout`): ``(split, vpp, layout)``. Every stage the same
    number of layers is the even split, the embedding and the loss taking one layer's place in
    the first and last stage the embedding_loss split (layout None), the embedding, MTP and
    loss one slot each the embedding_mtp_loss split (how tune-cp writes it:
    ``oracle/memory.py::split_layout``); any other layout is the layout split, checked against
    the model by the ``pipeline_split`` rule. None when absent."""
    text = r.get("pipeline_model_parallel_layout", state=False)
    if not text:
        return None
    text = str(text)
    try:
        stages = parse_pipeline_layout(text)
    except ValueError as e:
        raise r.fail("pipeline_model_parallel_layout", str(e)) from e
    if len(stages) % pp:
        raise r.fail("pipeline_model_parallel_layout", f"has {len(stages)} virtual stages, not a "
                     f"multiple of pipeline_model_parallel_size {pp} (Megatron-Core asserts it)")
    if "".join(stages).count("L") > 1:
        raise r.fail("pipeline_model_parallel_layout", "several loss slots (L: the MTP loss "
                     "split) are not modelled; tune-cp models one L, in the last stage")
    vpp = len(stages) // pp
    counts = [st.count("t") for st in stages]
    marks = ["".join(ch for ch in st if ch != "t") for st in stages]
    split = PipelineSplit.LAYOUT
    if (num_layers is not None and sum(counts) == num_layers and len(stages) >= 2
            and marks[0] == "E" and marks[-1] == "L" and not any(marks[1:-1])
            and all(st == "E" + "t" * n or st == "t" * n + "L" or st == "t" * n
                    for st, n in zip(stages, counts, strict=True))):
        if len(set(counts)) == 1:
            split = PipelineSplit.EVEN
        elif counts[0] == counts[-1] == counts[1] - 1 and len(set(counts[1:-1])) == 1:
            split = PipelineSplit.EMBEDDING_LOSS
    if (split is PipelineSplit.LAYOUT and num_layers is not None and num_mtp
            and "|".join(stages) == split_layout(num_layers, num_mtp, pp, vpp,
                                                 PipelineSplit.EMBEDDING_MTP_LOSS)):
        split = PipelineSplit.EMBEDDING_MTP_LOSS
    r.raw.note(f"pipeline_model_parallel_layout {text} is "
               + (f"the {split.value} split" if split is not PipelineSplit.LAYOUT else "a layout")
               + f" over {len(stages)} virtual stages (pp {pp} x vpp {vpp})")
    return split, vpp, text if split is PipelineSplit.LAYOUT else None


#: the uneven end stages' arguments: Megatron-LM flag dest, TransformerConfig field (Primus YAML
#: and Megatron-Bridge also take it)
UNEVEN_KEYS: dict[str, tuple[str, str]] = {
    "first": ("decoder_first_pipeline_num_layers", "num_layers_in_first_pipeline_stage"),
    "last": ("decoder_last_pipeline_num_layers", "num_layers_in_last_pipeline_stage"),
}


def _uneven_given(r: _Reader) -> bool:
    return any(r.given(d) for pair in UNEVEN_KEYS.values() for d in pair)


def _uneven_stages(r: _Reader) -> tuple[int | None, int | None]:
    """``--decoder-first/last-pipeline-num-layers`` (or their TransformerConfig names)."""
    out: list[int | None] = []
    for flag, field in UNEVEN_KEYS.values():
        if r.given(flag) and r.given(field) and r.get(flag) != r.get(field):
            raise r.fail(flag, f"and {r.label(field)} ({r.get(field)}) disagree; give one")
        out.append(r.get(flag) if r.given(flag) else r.get(field) if r.given(field) else None)
    return out[0], out[1]


def _pipeline_split(r: _Reader) -> PipelineSplit:
    """``--account-for-embedding/loss-in-pipeline-split``: both -> embedding_loss, neither ->
    even (Megatron-LM never picks a split by itself); ``--decoder-first/last-pipeline-num-layers``
    -> uneven (Megatron-Core refuses them together with the account-for flags)."""
    emb = r.get("account_for_embedding_in_pipeline_split", state=False)
    loss = r.get("account_for_loss_in_pipeline_split", state=False)
    if _uneven_given(r):
        if emb or loss:
            only = "account_for_embedding" if emb else "account_for_loss"
            raise r.fail(UNEVEN_KEYS["first"][0] if r.given(UNEVEN_KEYS["first"][0])
                         else UNEVEN_KEYS["last"][0],
                         f"cannot go with {only}_in_pipeline_split (Megatron-Core "
                         f"TransformerConfig refuses uneven stages with the embedding or loss as "
                         f"layer slots); drop one")
        return PipelineSplit.UNEVEN
    if emb and loss:
        return PipelineSplit.EMBEDDING_LOSS
    if emb or loss:
        only = "account_for_embedding" if emb else "account_for_loss"
        r.raw.note(f"only {only}_in_pipeline_split is on: tune-cp models the embedding and the "
                   "loss as layer slots together or not at all; the even split is checked")
    return PipelineSplit.EVEN


def _virtual_stages(r: _Reader, pp: int, num_layers: int | None, split: PipelineSplit) -> int:
    """Virtual stages per pipeline rank from at most one of Megatron-LM's two flags
    (``arguments.py`` L927-940), or Primus / Megatron-Bridge's field."""
    given = [d for d in ("num_virtual_stages_per_pipeline_rank",
                         "num_layers_per_virtual_pipeline_stage",
                         "virtual_pipeline_model_parallel_size") if r.given(d)]
    if len(given) > 1:
        raise ConfigError(f"{r.label(given[0])} and {r.label(given[1])} are both given; "
                          f"Megatron-LM accepts only one of them: keep "
                          f"{r.spell('num_virtual_stages_per_pipeline_rank')}")
    if not given:
        return 1
    dest = given[0]
    value = r.get(dest)
    if dest == "num_virtual_stages_per_pipeline_rank":
        return value
    if dest == "virtual_pipeline_model_parallel_size":
        r.raw.note("virtual_pipeline_model_parallel_size is read as the virtual stages per rank, "
                   "but Megatron-LM resets it unless it comes from "
                   "num_virtual_stages_per_pipeline_rank; write that key instead")
        return value
    if split is PipelineSplit.UNEVEN:
        raise r.fail(dest, f"does not go with uneven first/last stages (Megatron-LM asserts it); "
                     f"give {r.spell('num_virtual_stages_per_pipeline_rank')}")
    if num_layers is None:
        raise r.fail(dest, "needs the number of layers to give the virtual stages per rank; add "
                     f"{r.spell('num_layers')} or pass --model")
    slots = num_layers + (EMBEDDING_LOSS_SLOTS if split is PipelineSplit.EMBEDDING_LOSS else 0)
    if slots % pp:
        raise r.fail(dest, f"the {slots} layers do not split over "
                     f"pipeline_model_parallel_size {pp}; Megatron-LM needs them to")
    per_rank = slots // pp
    if per_rank % value:
        choices = ", ".join(str(d) for d in range(1, per_rank + 1) if per_rank % d == 0)
        raise r.fail(dest, f"must divide the {per_rank} layers per pipeline rank ({slots} / pp "
                     f"{pp}); choose one of {choices}, or use "
                     f"{r.spell('num_virtual_stages_per_pipeline_rank')}")
    return per_rank // value


def _batch(r: _Reader) -> int:
    """Micro-batch size, and the stated defaults of the global batch and sequence length."""
    if r.flavor is Flavor.MEGATRON:
        if not r.given("micro_batch_size"):
            r.defaults.append("micro_batch_size: 1 (not given; Megatron-LM requires "
                              "--micro-batch-size, tune-cp assumes 1)")
        if not r.given("global_batch_size"):
            r.defaults.append("global_batch_size: micro_batch_size x data-parallel size "
                              "(Megatron-LM default: one micro-batch per step)")
        if not r.given("seq_length"):
            r.defaults.append("seq_length: the model's default (not given; Megatron-LM requires "
                              "--seq-length)")
        return r.get("micro_batch_size", state=False) or 1
    r.get("global_batch_size")
    r.get("seq_length")
    return r.get("micro_batch_size")


def _layer_ids(r: _Reader, num_layers: int | None, chunks: int) -> int:
    """Primus ``recompute_layer_ids`` (global layer ids recomputed in full) as the block method's
    count per pipeline chunk: the ids in the first chunk (pipeline rank 0, which holds the most
    micro-batches in flight and so decides the peak), with the even split of ``num_layers``
    over the chunks."""
    text = r.get("recompute_layer_ids", state=False)
    try:
        ids = sorted({int(x) for x in re.split(r"[,\s\[\]]+", str(text)) if x})
    except ValueError:
        raise r.fail("recompute_layer_ids", "must be layer numbers separated by commas, such "
                     "as \"0,3,4\"") from None
    if num_layers is None:
        raise r.fail("recompute_layer_ids", "needs the number of layers; add num_layers or "
                     "pass --model")
    per = -(-num_layers // chunks)
    counts = [sum(1 for i in ids if c * per <= i < (c + 1) * per) for c in range(chunks)]
    first = counts[0]
    r.raw.note(f"recompute_layer_ids ({len(ids)} layers) is read as full recompute with the "
               f"block method of {first} layers per pipeline chunk (the first chunk's count; "
               f"the {chunks} chunks hold {', '.join(map(str, counts))}); tune-cp recomputes "
               "the same number of layers in every chunk")
    return min(first, per)


def _recompute(r: _Reader, num_layers: int | None = None, chunks: int = 1) -> dict[str, Any]:
    """Recompute granularity, method, layers and modules, checked as Megatron-Core's
    ``TransformerConfig.__post_init__`` checks them (full needs a method and a layer count;
    selective takes neither). Primus ``recompute_layer_ids`` stands for the method and count;
    a block count above the layers a chunk holds recomputes them all (Megatron-LM
    ``_checkpointed_forward``: ``layer_number < recompute_num_layers``), so it is read as
    that many."""
    granularity = r.get("recompute_granularity")
    modules = r.get("recompute_modules", state=False)
    if r.get("recompute_activations", state=False):
        granularity = "selective"
    if r.get("moe_layer_recompute", state=False):
        granularity = "selective"
        modules = [*(modules or DEFAULT_SELECTIVE_MODULES), "moe"]
        r.raw.note("moe_layer_recompute (deprecated) is read as selective recompute with the "
                   "moe module")
    method = r.get("recompute_method", state=False)
    layers = r.get("recompute_num_layers", state=False)
    if granularity is None:
        if method is not None or layers is not None:
            r.raw.note("recompute_method / recompute_num_layers without recompute_granularity: "
                       "no recomputation")
        return {"recompute": Recompute.NONE}
    if granularity == "full":
        if r.given("recompute_layer_ids"):
            if method is not None or layers is not None:
                r.raw.note("recompute_layer_ids takes precedence over recompute_method / "
                           "recompute_num_layers (Primus)")
            method, layers = "block", _layer_ids(r, num_layers, chunks)
        if method is None or layers is None:
            what = r.spell("recompute_method") if method is None else r.spell(
                "recompute_num_layers")
            raise r.fail("recompute_granularity", f"needs {what} too; Megatron-LM rejects full "
                         f"recompute without {r.spell('recompute_method')} uniform|block and "
                         f"{r.spell('recompute_num_layers')} N")
        if method == "block" and layers == 0:
            r.raw.note("full recompute with the block method and 0 layers recomputes nothing")
        if method == "block" and num_layers is not None and num_layers % chunks == 0 \
                and layers > num_layers // chunks:
            per = num_layers // chunks
            r.raw.note(f"{r.label('recompute_num_layers')} {layers} is more than the {per} "
                       f"layers a pipeline chunk holds: Megatron-LM recomputes all {per}")
            layers = per
        return {"recompute": Recompute.FULL, "recompute_method": RecomputeMethod(method),
                "recompute_layers": layers}
    if method is not None or layers is not None:
        dest = "recompute_method" if method is not None else "recompute_num_layers"
        raise r.fail(dest, "must not be given with selective recompute (Megatron-LM rejects it); "
                     "drop it, or use full recompute")
    kept = []
    for name in dict.fromkeys(modules or DEFAULT_SELECTIVE_MODULES):
        if name in UNMODELED_RECOMPUTE_MODULES:
            r.raw.note(f"recompute module {name} is not modeled; ignored")
        elif name not in SELECTIVE_MODULES:
            raise r.fail("recompute_modules", f"{name!r} is not a recompute module; choose from "
                         f"{', '.join(sorted(SELECTIVE_MODULES))}")
        else:
            kept.append(name)
    return {"recompute": Recompute.SELECTIVE, "recompute_modules": tuple(kept)}


def _sharding(r: _Reader) -> dict[str, Any]:
    """Distributed optimizer and FSDP (``--use-megatron-fsdp`` with its sharding strategy, or
    ``--use-torch-fsdp2``)."""
    do = r.get("use_distributed_optimizer")
    megatron_fsdp = r.get("use_megatron_fsdp", state=False)
    torch_fsdp = r.get("use_torch_fsdp2", state=False)
    if megatron_fsdp and torch_fsdp:
        raise r.fail("use_torch_fsdp2", f"cannot be used together with "
                     f"{r.spell('use_megatron_fsdp')}; keep one")
    if torch_fsdp:
        return {"distributed_optimizer": bool(do), "fsdp": True}
    if not megatron_fsdp:
        return {"distributed_optimizer": bool(do), "fsdp": False}
    strategy = r.get("data_parallel_sharding_strategy", state=False) or "optim_grads_params"
    if strategy == "optim_grads_params":
        return {"distributed_optimizer": bool(do), "fsdp": True}
    if strategy == "no_shard":
        r.raw.note("Megatron-FSDP with no_shard replicates everything; modeled without sharding")
        return {"distributed_optimizer": False, "fsdp": False}
    r.raw.note(f"Megatron-FSDP with {strategy} is modeled as the distributed optimizer "
               "(optimizer states sharded; gradients counted unsharded)")
    return {"distributed_optimizer": True, "fsdp": False}


def _dispatcher(r: _Reader) -> Dispatcher:
    kind = r.get("moe_token_dispatcher_type")
    if r.get("moe_enable_deepep", state=False):
        r.raw.note("moe_enable_deepep (deprecated) is read as the flex dispatcher with DeepEP")
        kind = "flex"
    if kind == "alltoall_seq":
        r.raw.note("moe_token_dispatcher_type alltoall_seq is gone from Megatron-LM; modeled as "
                   "alltoall")
        kind = "alltoall"
    if kind == "flex":
        backend = r.get("moe_flex_dispatcher_backend", state=False) or "deepep"
        if backend not in ("deepep", "hybridep"):
            r.raw.note(f"flex dispatcher backend {backend} is modeled as DeepEP")
    return Dispatcher(kind)


def _backend(r: _Reader, dispatcher: Dispatcher) -> dict[str, Any]:
    """The MoE backend fields (``ParallelConfig``: flex library, sync-free stage, grouped GEMM,
    permute fusion, shared-expert overlap, fp32 router) from Megatron-LM's and Primus-Turbo's
    keys; noted as read. Primus's sync-free stages turn on what
    ``rocm_arg_validation.py::_get_sync_free_moe_options`` sets (stage >= 1: permute fusion;
    stage >= 2: Turbo DeepEP, Turbo grouped GEMM)."""
    out: dict[str, Any] = {}
    stage = int(r.get("turbo_sync_free_moe_stage", state=False) or 0)
    turbo_deepep = bool(r.get("use_turbo_deepep", state=False)) or stage >= 2
    if stage > 3:
        raise r.fail("turbo_sync_free_moe_stage", "Primus takes stages 0-3 "
                     "('turbo_sync_free_moe_stage only support [0-3]')")
    out["sync_free_stage"] = stage
    backend = r.get("moe_flex_dispatcher_backend", state=False)
    if turbo_deepep:
        # Primus-Turbo's DeepEP replaces the flex dispatcher's library
        out["dispatcher"], out["flex_backend"] = Dispatcher.FLEX, FlexBackend.TURBO
    elif dispatcher is Dispatcher.FLEX and backend == "hybridep":
        out["flex_backend"] = FlexBackend(backend)
    if bool(r.get("use_turbo_grouped_gemm", state=False)) or stage >= 2:
        gg = GroupedGemm.TURBO
    elif r.get("moe_use_legacy_grouped_gemm", state=False):
        gg = GroupedGemm.LEGACY  # asked for by name (Primus's launches give it alone)
    elif r.get("moe_grouped_gemm", state=False) is False:
        gg = GroupedGemm.SEQUENTIAL
    else:
        gg = GroupedGemm.TE
    out["grouped_gemm"] = gg
    out["permute_fusion"] = bool(r.get("moe_permute_fusion", state=False)) or stage >= 1
    out["shared_expert_overlap"] = bool(r.get("moe_shared_expert_overlap", state=False))
    dtype = r.get("moe_router_dtype", state=False)
    out["router_fp32"] = None if dtype is None else dtype in ("fp32", "fp64")
    if any(r.raw.has(k) for k in TURBO_KEYS):
        r.raw.note(turbo_note(out))
    return out


#: Primus-Turbo's MoE keys tune-cp reads (``primus_turbo.yaml``).
TURBO_KEYS = ("enable_primus_turbo", "use_turbo_deepep", "use_turbo_grouped_gemm",
              "turbo_sync_free_moe_stage")


def turbo_note(fields: dict[str, Any]) -> str:
    """The note a Primus experiment with Primus-Turbo keys gets: the MoE backend as read."""
    shown = [f"{k} {v.value if hasattr(v, 'value') else v}" for k, v in fields.items()
             if v not in (None, False) and k != "dispatcher"]
    turbo = fields.get("flex_backend") is FlexBackend.TURBO
    return ("Primus-Turbo MoE settings read: " + ", ".join(shown)
            + (" (Primus-Turbo DeepEP is the flex dispatcher)" if turbo else ""))


def _precision(r: _Reader) -> tuple[Precision, Fp8Format | None, Fp8Recipe | None]:
    """``--bf16`` / ``--fp16`` / ``--fp8-format`` with ``--fp8-recipe`` (default delayed)."""
    fp8 = r.get("fp8", state=False)
    fp4 = r.get("fp4", state=False)
    if fp4 is not None:
        if fp8 is not None:
            raise r.fail("fp4", f"cannot be used with {r.spell('fp8')} (Megatron-Core rejects "
                         "fp4 and fp8 together); keep one")
        recipe = r.get("fp4_recipe", state=False) or "nvfp4"
        if recipe == "custom":
            raise r.fail("fp4_recipe", "a custom FP4 quantizer is not modeled; use nvfp4")
        if recipe == "mxfp4":
            r.raw.note(f"{r.label('fp4_recipe')} mxfp4: MXFP4 GEMMs are not modeled (tune-cp's "
                       "fp4 is NVFP4); checked as bf16, so time and FP4 weight copies are off")
            return Precision.BF16, None, None
        return Precision.FP4, None, None
    bf16 = r.get("bf16", state=r.flavor is Flavor.PRIMUS)
    fp16 = r.get("fp16", state=False)
    if fp16:
        r.raw.note("fp16 is modeled as bf16 (the same 2-byte weights and activations; loss "
                   "scaling is not modeled)")
    elif not bf16:
        r.raw.note("neither bf16 nor fp16 is on: Megatron-LM would train in fp32, which tune-cp "
                   "does not model; read as bf16")
    if fp8 is None:
        if r.given("fp8_recipe"):
            r.raw.note(f"{r.label('fp8_recipe')} without {r.spell('fp8')}: FP8 stays off")
        return Precision.BF16, None, None
    recipe = r.get("fp8_recipe")
    if recipe == "custom":
        raise r.fail("fp8_recipe", "a custom quantization recipe is not modeled; choose one of "
                     f"{', '.join(x.value for x in Fp8Recipe)}")
    return Precision.FP8, Fp8Format(fp8), Fp8Recipe(recipe)


def _grad_dtype(r: _Reader) -> bool:
    """Whether the gradient buffer is fp32, as Megatron-LM ``validate_args`` decides: under bf16
    ``accumulate_allreduce_grads_in_fp32`` is forced on unless ``grad_reduce_in_bf16`` (which
    wins over an explicit ``accumulate_allreduce_grads_in_fp32``); under fp16 the buffer is fp16
    (2 bytes, modeled as bf16) unless ``accumulate_allreduce_grads_in_fp32``."""
    bf16_grads = r.get("grad_reduce_in_bf16", state=False)
    fp32_grads = r.get("accumulate_allreduce_grads_in_fp32", state=False)
    if r.get("fp16", state=False) and not r.get("bf16", state=False):
        if bf16_grads:
            r.raw.note(f"{r.label('grad_reduce_in_bf16')} only applies with bf16; under fp16 "
                       "the gradient buffer follows "
                       f"{r.spell('accumulate_allreduce_grads_in_fp32')}")
        return bool(fp32_grads)
    if bf16_grads and fp32_grads:
        r.raw.note(f"{r.label('grad_reduce_in_bf16')} overrides "
                   f"{r.label('accumulate_allreduce_grads_in_fp32')} (Megatron-LM validate_args): "
                   "bf16 gradients")
    return not bf16_grads


def _schedule(r: _Reader) -> Schedule | None:
    """Primus's zero-bubble runtime (``patch_zero_bubble`` with ``enable_zero_bubble``, or the
    Primus pipeline with a zero-bubble ``pp_algorithm``); Megatron-LM: derived from vpp."""
    if r.flavor is not Flavor.PRIMUS:
        return None
    if r.get("patch_zero_bubble", state=False) and r.get("enable_zero_bubble", state=False):
        if r.get("zero_bubble_v_schedule", state=False) or r.get("enable_1f1b_v", state=False):
            r.raw.note("zero-bubble V schedules are not modeled; the schedule follows vpp")
            return None
        return Schedule.ZERO_BUBBLE
    if r.get("patch_primus_pipeline", state=False):
        algorithm = r.get("pp_algorithm", state=False) or "1f1b-interleaved"
        if algorithm in PRIMUS_ZB_ALGORITHMS:
            return Schedule.ZERO_BUBBLE
        if algorithm not in PRIMUS_PLAIN_ALGORITHMS:
            r.raw.note(f"pp_algorithm {algorithm} is not modeled; the schedule follows vpp")
    return None


def _graph_scope(r: _Reader, is_moe: bool) -> tuple[str, ...]:
    """The CUDA-graph scope (:class:`oracle.memory.RunOptions`) of the arguments.

    Megatron-LM ``d98e8a64dd``: ``--cuda-graph-impl none|local|transformer_engine|
    full_iteration`` with ``--cuda-graph-modules`` (or its deprecated spelling
    ``--cuda-graph-scope``; Primus ``cuda_graph_scope``); the deprecated ``--enable-cuda-graph``
    (= ``local``) and ``--external-cuda-graph`` (= ``transformer_engine``); the deprecated module
    ``full_iteration`` migrates to ``--cuda-graph-impl full_iteration``. No modules (or the
    deprecated ``full``) capture the whole layer: attention and MLP of a dense model, and for a
    MoE model (whose dropless experts cannot be captured) read as attn, moe_router and
    moe_preprocess, as ``moe`` is (tune-cp has no ``moe`` graph scope)."""
    impl = r.get("cuda_graph_impl", state=False) or "none"
    if impl == "none" and r.get("external_cuda_graph", state=False):
        impl = "transformer_engine"
    if impl == "none" and r.get("enable_cuda_graph", state=False):
        impl = "local"
    if impl == "none":
        return ()
    if impl == FULL_ITERATION:
        return (FULL_ITERATION,)
    modules: list[str] = []
    for dest in ("cuda_graph_modules", "cuda_graph_scope_deprecated", "cuda_graph_scope"):
        if r.given(dest) and r.raw.read(dest):
            modules = [str(m) for m in r.raw.read(dest)]
            break
    if FULL_ITERATION in modules:
        return (FULL_ITERATION,)
    modules = [m for m in modules if m != "full_iteration_inference"]
    moe_parts = ["moe_router", "moe_preprocess"]
    if not modules or modules == ["full"]:
        modules = ["attn", *(moe_parts if is_moe else ["mlp"])]
        if is_moe:
            r.raw.note(f"CUDA graphs of whole layers ({impl}): a dropless MoE block cannot be "
                       "captured; read as attn, moe_router and moe_preprocess")
    if "moe" in modules:
        r.raw.note("CUDA-graph module moe (the whole drop-and-pad MoE block) is read as "
                   "moe_router,moe_preprocess: tune-cp does not model the experts' graph")
        modules = [m for m in modules if m != "moe"] + moe_parts
    dropped = [m for m in modules if m not in PER_LAYER_GRAPH_SCOPES]
    if dropped:
        r.raw.note(f"CUDA-graph modules {', '.join(dropped)} are not modelled (tune-cp models "
                   f"{', '.join(PER_LAYER_GRAPH_SCOPES)}); left out")
    kept = [m for m in modules if m in PER_LAYER_GRAPH_SCOPES]
    if "moe_preprocess" in kept and "moe_router" not in kept:
        kept.append("moe_router")  # the local implementation adds it (transformer_config.py)
    return tuple(dict.fromkeys(kept))


def _run_options(r: _Reader, is_moe: bool) -> RunOptions:
    """The framework run settings of the arguments: CUDA graphs (:func:`_graph_scope`), the
    MoE all-to-all overlap (``overlap_moe_expert_parallel_comm``; Megatron-Core requires
    ``delay_wgrad_compute`` to come with it) and token-drop (``moe_expert_capacity_factor``, a
    negative one meaning dropless as in ``TransformerConfig.__post_init__``, with
    ``moe_pad_expert_input_to_capacity``)."""
    overlap = bool(r.get("overlap_moe_expert_parallel_comm", state=False)) and is_moe
    if r.get("delay_wgrad_compute", state=False) and not overlap:
        r.raw.note(f"{r.label('delay_wgrad_compute')} without "
                   f"{r.spell('overlap_moe_expert_parallel_comm')} is refused by Megatron-Core "
                   "('overlap_moe_expert_parallel_comm must be enabled when enabling "
                   "delay_wgrad_compute'); ignored")
    factor = r.get("moe_expert_capacity_factor", state=False)
    if factor is not None and (float(factor) < 0 or not is_moe):
        factor = None
    if factor is not None and not r.get("moe_pad_expert_input_to_capacity", state=False):
        r.raw.note(f"{r.label('moe_expert_capacity_factor')} {factor} without "
                   f"{r.spell('moe_pad_expert_input_to_capacity')}: read as token-drop padded "
                   "to the capacity (tune-cp's token-drop; unpadded experts keep the host "
                   "synchronisation of dropless routing)")
    if factor is None and r.get("moe_pad_expert_input_to_capacity", state=False):
        r.raw.note(f"{r.label('moe_pad_expert_input_to_capacity')} without a capacity factor "
                   "is refused by Megatron-Core ('moe_expert_capacity_factor must be set to use "
                   "moe_pad_expert_input_to_capacity'); read as dropless")
    try:
        return RunOptions(cuda_graph_scope=_graph_scope(r, is_moe), moe_a2a_overlap=overlap,
                          moe_capacity_factor=None if factor is None else float(factor))
    except ValidationError as e:
        raise ConfigError(f"the CUDA-graph / MoE run settings of the arguments: "
                          f"{validation_message(e)}") from e


def _unmodeled_notes(r: _Reader) -> None:
    for dest, entry in UNMODELED.items():
        if r.given(dest):
            value = r.raw.read(dest)
            if value not in entry.neutral:
                r.raw.note(f"{r.raw.said(dest, value, quote=False)}: {entry.why}")
    divisor = r.get("make_vocab_size_divisible_by", state=False)
    if divisor is not None and divisor != VOCAB_DIVISIBLE_BY:
        r.raw.note(f"{r.label('make_vocab_size_divisible_by')} {divisor}: tune-cp pads the "
                   f"vocabulary to a multiple of {VOCAB_DIVISIBLE_BY} x tp")


