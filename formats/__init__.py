"""Import and export of launch configurations (package ``formats``): Megatron-LM arguments, Primus experiment YAML,
Megatron-Bridge (NeMo) recipe overrides.

Import::

    run = parse_megatron_args("torchrun --nnodes 4 ... pretrain_gpt.py --seq-length 8192 ...")
    run = parse_primus_config("exp.yaml")              # the model YAML it names, when found
    run = parse_argument_dump(read_log("x.log").args)  # a training log's argument dump
    model = run.require_model()                        # or pass model= (the CLI's --model)
    cfg, training = run.config, run.training_spec(model, cluster)

Every argument the reader did not understand is listed in ``run.unknown`` (never fatal); those it
understood but that do not affect tune-cp's model are in ``run.ignored``; every setting that took
the framework's default because it was missing is stated in ``run.defaults``; approximations and
conflicts are in ``run.notes``. Malformed values raise :class:`config.specs.ConfigError` with one
line naming the flag and the value.

Export: :func:`to_megatron_args`, :func:`to_primus_overrides`, :func:`to_nemo_overrides`.
Exported Megatron-LM arguments read back with :func:`parse_megatron_args` give the configuration
:func:`canonical_config` returns (the resolved configuration with recompute and MoE fields that
have several equivalent spellings written one way).

Flag spellings, defaults and value sets: :mod:`formats.keys` (Megatron-LM ``d98e8a64dd``,
Primus ``fd1eeabbad``); Megatron-Bridge field names: ``src/megatron/bridge/training/config.py``,
``training/mixed_precision.py`` and the recipes under ``src/megatron/bridge/recipes/`` at
NVIDIA-NeMo/Megatron-Bridge ``067f987df0`` (2026-08-22).
"""

from tune_cp.formats.export import (
    canonical_config,
    to_megatron_args,
    to_nemo_overrides,
    to_primus_overrides,
)
from tune_cp.formats.keys import Fp8Format
from tune_cp.formats.model import ImportedArchitecture
from tune_cp.formats.parse import (
    ImportedRun,
    parse_argument_dump,
    parse_megatron_args,
    parse_primus_config,
)

__all__ = [
    "Fp8Format",
    "ImportedArchitecture",
    "ImportedRun",
    "canonical_config",
    "parse_argument_dump",
    "parse_megatron_args",
    "parse_primus_config",
    "to_megatron_args",
    "to_nemo_overrides",
    "to_primus_overrides",
]
