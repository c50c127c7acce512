"""Generate ``data/megatron_flags.json``: every flag of Megatron-LM's ``arguments.py`` with its
dest, how many values it takes, its argument group, and what it does to tune-cp's model
(``effect``):

* ``read``: tune-cp reads it (:mod:`formats.keys`);
* ``none``: it does not change memory or time (paths, logging, data, tokenizer files,
  checkpointing, learning-rate schedule, initialization, loss coefficients, ...);
* ``unmodelled``: it changes memory or time and tune-cp does not model it (printed as a
  warning when a launch sets it).

and, where it is a literal, its ``default`` (what the dest holds when the flag is not given,
what a training log's argument dump then prints: ``formats/parse.py::parse_argument_dump``
lists an unmodelled argument only when the dump's value differs from it).

The flags are read statically (no import of Megatron-LM, which needs torch): every
``add_argument('--flag', ...)`` call of ``megatron/training/arguments.py``, and the flags that
``ArgumentGroupFactory(Config, exclude=[...]).build_group(parser, title)`` derives from a
dataclass (``megatron/training/argument_utils.py``: ``--field-name``; a bool defaulting to True
becomes ``--no-field-name`` / ``--disable-field-name``; ``argparse_meta`` overrides).

The classification rules are the lists below (groups, then dest patterns), not a hand-typed
list of hundreds of flags. Run::

    python -m tune_cp.formats.gen_megatron_flags /path/to/Megatron-LM/.git [COMMIT]
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "data" / "megatron_flags.json"
ARGS_FILE = "megatron/training/arguments.py"

# Argument groups whose flags never change memory or time as tune-cp models them.
NO_EFFECT_GROUPS = re.compile(
    r"(logging|checkpointing|validation|tokenizer|data and dataloader|autoresume|biencoder|"
    r"vision|one logger|ft_package|opentelemetry|straggler|workload inspector|"
    r"in-process restart|rerun engine|rng and initialization|learning rate and weight decay|"
    r"regularization|profiling|fault injector|msc|rl|sft|"
    r"logits distillation|inference)", re.I)
# Dest patterns that change memory or time even in a no-effect group (checked first).
MATTERS = re.compile(
    r"(overlap_\w+|\w*cuda_graph\w*|\w*_fusion\w*|no_\w*fusion|tp_comm_\w+|\w*offload\w*|"
    r"empty_unused_memory_level|use_te_activation_func|calculate_per_token_loss|"
    r"\w*activation_offload\w*|fine_grained_activation_offloading|inference_\w+_cuda_graphs)")
# Dest patterns that do not change memory or time wherever they are.
NO_EFFECT = re.compile(
    r"(\w*_path|\w*_dir|\w*_file|save\w*|load\w*|log_\w+|\w+_log_\w*|wandb_\w+|tensorboard\w*|"
    r"\w*seed|init_method_std|\w*init\w*_std|lr\w*|min_lr|\w*weight_decay\w*|adam_\w+|"
    r"sgd_momentum|clip_grad|\w*loss_scale\w*|hysteresis|train_iters|train_samples|eval_\w+|"
    r"exit_\w+|skip_train|\w*aux_loss_coeff|\w*z_loss_coeff|moe_router_load_balancing_type|"
    r"moe_input_jitter_eps|moe_per_layer_logging|moe_router_bias_update_rate|"
    r"mtp_loss_scaling_factor|timing_log\w*|barrier_with_\w+|\w*tokenizer\w*|vocab_extra_ids|"
    r"split|mock_data|num_workers|dataloader_type|distributed_timeout_\w+|distributed_backend|"
    r"manual_gc\w*|check_for_\w+|deterministic_mode|use_mcore_models|use_legacy_models|"
    r"yaml_cfg|spec|trust_remote_code|rotary_percent|rotary_interleaved|rotary_seq_len_\w+|"
    r"apply_layernorm_1p|init_model_with_meta_device|use_cpu_initialization|"
    r"perform_initialization|use_checkpoint_args|finetune|pretrained_checkpoint|"
    r"decoupled_lr|decoupled_min_lr|override_opt_param_scheduler|"
    r"use_checkpoint_opt_param_scheduler|fp8_margin|fp8_interval|fp8_amax_\w+|fp8_wgrad|"
    r"mmap_bin_files|no_mmap_bin_files|create_attention_mask_in_dataloader|"
    r"no_create_attention_mask_in_dataloader|reset_\w+|eod_mask_loss|"
    r"num_dataset_builder_threads|export_\w+|enable_gpt_oss|glu_linear_offset|"
    r"activation_func_clamp_value|attention_softmax_in_fp32|\w*_interval|"
    r"straggler_\w+|use_rotary_position_embeddings|add_position_embedding|"
    r"no_position_embedding|rope_type|moe_router_score_function|"
    r"moe_router_pre_softmax|moe_router_topk_scaling_factor|moe_router_num_groups|"
    r"moe_router_group_topk|moe_router_bias_update_rule|rotary_base|rotary_scaling_factor|"
    r"use_rope_scaling|rope_scaling_factor|mscale\w*|original_max_position_embeddings|"
    r"norm_epsilon|moe_shared_expert_gate|softmax_type|window_size|window_attn_skip_freq|"
    r"quick_geglu|"
    r"use_flash_attn|moe_token_drop_policy|moe_router_enable_expert_bias|flight_recorder_\w+|"
    r"local_rank|lazy_mpu_init|fake_process_group|nccl_communicator_config_path|"
    r"use_gloo_process_groups|dump_\w+|result_rejected_tracker_filename|iterations_to_skip|"
    r"gpu_sniff_test_interval|deprecated_use_mcore_models|decrease_batch_size_if_needed|"
    r"rampup_batch_size|step_batch_size_schedule|exit_signal\w*|train_sync_interval|"
    r"batch_size|model_parallel_size|suggested_communication_unit_size)")


def git_show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"],
                          check=True, capture_output=True, text=True).stdout


def find_class(git_dir: str, commit: str, name: str) -> tuple[str, ast.ClassDef] | None:
    out = subprocess.run(["git", "--git-dir", git_dir, "grep", "-l", f"^class {name}\\b",
                          commit, "--", "megatron"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        path = line.split(":", 1)[1]
        tree = ast.parse(git_show(git_dir, commit, path))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return path, node
    return None


def _literal(node: ast.AST | None) -> Any:
    try:
        return ast.literal_eval(node) if node is not None else None
    except ValueError:
        return None


_NO = object()


def _literal_ok(node: Any) -> bool:
    """Whether ``node`` is absent (a default of None) or a literal (a default the JSON keeps)."""
    if node is None:
        return True
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return False
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _arity(action: Any, nargs: Any) -> int | str:
    if action in ("store_true", "store_false", "store_const", "count"):
        return 0
    if nargs in ("*", "+") or (isinstance(nargs, int) and nargs > 1):
        return "*"
    return 1


def dataclass_flags(git_dir: str, commit: str, name: str, exclude: set[str],
                    group: str) -> dict[str, dict[str, Any]]:
    """Flags ArgumentGroupFactory derives from dataclass ``name`` (with its dataclass bases)."""
    found = find_class(git_dir, commit, name)
    if found is None:
        return {}
    _, cls = found
    flags: dict[str, dict[str, Any]] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name):
            flags |= dataclass_flags(git_dir, commit, base.id, exclude, group)
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        dest = node.target.id
        if dest in exclude or dest.startswith("_"):
            continue
        default, meta = node.value, {}
        if isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "field":
            kw = {k.arg: k.value for k in node.value.keywords}
            if _literal(kw.get("init")) is False:
                continue
            default = kw.get("default")
            metadata = kw.get("metadata")
            if isinstance(metadata, ast.Dict):
                for k, v in zip(metadata.keys, metadata.values, strict=True):
                    if _literal(k) == "argparse_meta" and isinstance(v, ast.Dict):
                        meta = {_literal(a): b for a, b in zip(v.keys, v.values, strict=True)}
        annotation = ast.unparse(node.annotation)
        is_bool = annotation in ("bool", "Optional[bool]", "bool | None")
        default_value = _literal(default)
        names = [_literal(meta["arg_names"])] if "arg_names" in meta else None
        names = names[0] if names and isinstance(names[0], list) else None
        if names is None:
            flag = "--" + dest.replace("_", "-")
            names = [flag] if not (is_bool and default_value is True) else [
                "--no-" + dest.replace("_", "-"), "--disable-" + dest.replace("_", "-")]
        action = _literal(meta.get("action")) if "action" in meta else (
            "store_true" if is_bool else None)
        nargs = _literal(meta.get("nargs")) if "nargs" in meta else (
            "+" if annotation.startswith(("list[", "List[", "Optional[list", "Optional[List"))
            else None)
        for flag in names:
            flags[flag] = {"dest": dest, "arity": _arity(action, nargs), "group": group}
            if _literal_ok(default):
                flags[flag]["default"] = default_value
    return flags


def argument_flags(git_dir: str, commit: str) -> dict[str, dict[str, Any]]:
    tree = ast.parse(git_show(git_dir, commit, ARGS_FILE))
    flags: dict[str, dict[str, Any]] = {}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        group = fn.name
        lists: dict[str, set[str]] = {}
        factories: dict[str, tuple[str, set[str]]] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                    node.targets[0], ast.Name):
                value = _literal(node.value)
                if isinstance(value, list):
                    lists[node.targets[0].id] = {str(v) for v in value}
        for node in sorted((n for n in ast.walk(fn) if hasattr(n, "lineno")),
                           key=lambda n: (n.lineno, n.col_offset)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            attr = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            kw = {k.arg: k.value for k in node.keywords}
            if attr == "add_argument_group":
                title = _literal(kw.get("title")) or _literal(node.args[0] if node.args else None)
                group = str(title or fn.name)
            elif attr == "ArgumentGroupFactory" and node.args:
                cls = ast.unparse(node.args[0])
                ex = kw.get("exclude")
                excluded = lists.get(ex.id, set()) if isinstance(ex, ast.Name) else set(
                    _literal(ex) or [])
                factories[id(node)] = (cls, excluded)
                factories[cls] = (cls, excluded)
            elif attr == "build_group":
                title = _literal(kw.get("title")) or _literal(
                    node.args[1] if len(node.args) > 1 else None)
                owner = func.value if isinstance(func, ast.Attribute) else None
                cls_name = None
                if isinstance(owner, ast.Call) and owner.args:
                    cls_name = ast.unparse(owner.args[0])
                elif isinstance(owner, ast.Name):
                    for n in ast.walk(fn):
                        if isinstance(n, ast.Assign) and any(
                                isinstance(t, ast.Name) and t.id == owner.id for t in n.targets
                        ) and isinstance(n.value, ast.Call) and n.value.args:
                            cls_name = ast.unparse(n.value.args[0])
                if cls_name:
                    excluded = factories.get(cls_name, (cls_name, set()))[1]
                    group = str(title or cls_name)
                    flags |= dataclass_flags(git_dir, commit, cls_name, excluded, group)
            elif attr == "add_argument":
                names = [a.value for a in node.args if isinstance(a, ast.Constant)
                         and isinstance(a.value, str) and a.value.startswith("--")]
                if not names:
                    continue
                dest = _literal(kw.get("dest")) or names[0][2:].replace("-", "_")
                action = _literal(kw.get("action"))
                arity = _arity(action, _literal(kw.get("nargs")))
                # the value the dest holds when the flag is not given (what an argument dump
                # prints for it): argparse's store_true / store_false defaults, else default=
                default: Any = {"store_true": False, "store_false": True}.get(str(action), _NO)
                if "default" in kw:
                    default = _literal(kw["default"]) if _literal_ok(kw["default"]) else _NO
                elif default is _NO and action is None:
                    default = None
                for flag in names:
                    flags[flag] = {"dest": dest, "arity": arity, "group": group}
                    if default is not _NO:
                        flags[flag]["default"] = default
    return flags


def classify(dest: str, group: str, read: set[str]) -> str:
    if dest in read:
        return "read"
    if MATTERS.fullmatch(dest):
        return "unmodelled"
    if NO_EFFECT.fullmatch(dest) or NO_EFFECT_GROUPS.fullmatch(group.strip()):
        return "none"
    return "unmodelled"


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m tune_cp.formats.gen_megatron_flags GIT_DIR [COMMIT]  (GIT_DIR: a "
              "Megatron-LM git directory; writes formats/data/megatron_flags.json)",
              file=sys.stderr)
        raise SystemExit(2)
    git_dir = argv[0]
    commit = argv[1] if len(argv) > 1 else "HEAD"
    sha = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", commit], check=True,
                         capture_output=True, text=True).stdout.strip()
    from tune_cp.formats.keys import READ_DESTS

    flags = argument_flags(git_dir, sha)
    for info in flags.values():
        info["effect"] = classify(info["dest"], info["group"], READ_DESTS)
    data = {
        "about": "Flags of Megatron-LM megatron/training/arguments.py (with the dataclass flags "
                 "ArgumentGroupFactory builds) and their effect on tune-cp's model: read, none "
                 "(does not change memory or time), unmodelled (changes memory or time; not "
                 "modelled, a warning). Generated by formats/gen_megatron_flags.py; "
                 "do not edit by hand.",
        "source": f"NVIDIA/Megatron-LM {sha}",
        "flags": dict(sorted(flags.items())),
    }
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    counts: dict[str, int] = {}
    for info in flags.values():
        counts[info["effect"]] = counts.get(info["effect"], 0) + 1
    print(f"{len(flags)} flags: {counts}")


if __name__ == "__main__":
    main(sys.argv[1:])
