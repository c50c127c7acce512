"""Megatron-LM's own parallel-layout assertions, transcribed, to run on tune-cp's exports.

A faithful transcription (not tune-cp's rules: it reads only the flags, as Megatron-LM does) of
the checks a launch meets before its first step, from NVIDIA/Megatron-LM at commit
``d98e8a64ddf34856e74b24714e3bedb2f5a39553`` (2026-08-22); every check names its file and lines:

* ``megatron/training/arguments.py::validate_args``: world size over tp x pp x cp, the
  virtual-stage arguments, the even-split divisibility, vpp and pp, Megatron-FSDP's checkpoint
  format, selective recompute, sequence length over cp, experts over ep;
* ``megatron/core/parallel_state.py::initialize_model_parallel``: the dense and expert grids;
* ``megatron/core/num_microbatches_calculator.py``: the global batch over mbs x dp;
* ``megatron/core/model_parallel_config.py`` / ``transformer/transformer_config.py``
  ``__post_init__``: heads and query groups over tp, sequence parallelism, recompute, the
  uneven / account-for / layout split checks;
* ``transformer/transformer_block.py::get_num_layers_to_build``,
  ``transformer/multi_token_prediction.py::get_mtp_num_layers_to_build`` and
  ``transformer/pipeline_parallel_layer_layout.py``: the layers every (pp rank, virtual stage)
  builds.

:func:`validate` returns the failed assertions (Megatron-LM's own words, with the place) and the
decoder / MTP layers each virtual stage builds, in virtual-stage order (``v = vp_stage x pp +
pp_rank``), so a test can compare them with ``oracle/memory.py::chunk_spans``. Flags are read
by :func:`read_flags` from the exported text alone (argparse's ``--flag-name`` -> ``flag_name``
dests, Megatron-LM's defaults for flags not given). Hybrid (``--hybrid-layer-pattern``) models
follow ``hybrid_layer_allocation.py::select_pipeline_segment`` (pipe-free patterns).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

#: the Megatron-LM commit transcribed here
MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"

#: argparse dests whose flag is ``store_false`` (``arguments.py``): flag -> dest
_STORE_FALSE = {"no_overlap_p2p_communication": "overlap_p2p_comm"}
#: Megatron-LM's defaults of the dests read here (``arguments.py`` add_argument defaults)
_DEFAULTS: dict[str, Any] = {
    "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
    "context_parallel_size": 1, "expert_model_parallel_size": 1,
    "expert_tensor_parallel_size": None, "num_virtual_stages_per_pipeline_rank": None,
    "num_layers_per_virtual_pipeline_stage": None, "pipeline_model_parallel_layout": None,
    "decoder_first_pipeline_num_layers": None, "decoder_last_pipeline_num_layers": None,
    "account_for_embedding_in_pipeline_split": False,
    "account_for_loss_in_pipeline_split": False, "overlap_p2p_comm": True,
    "sequence_parallel": False, "num_experts": None, "num_query_groups": None,
    "group_query_attention": False, "mtp_num_layers": None, "hybrid_layer_pattern": None,
    "recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None,
    "micro_batch_size": 1, "global_batch_size": None, "seq_length": None,
    # megatron/training/config/training_config.py l.486: ckpt_format's default
    "use_megatron_fsdp": False, "ckpt_format": "torch_dist",
}
_INT = re.compile(r"-?\d+")


def read_flags(text: str) -> tuple[dict[str, Any], int | None]:
    """Megatron-LM dests of a launch's flags (comments and ``\\`` continuations dropped), and the
    world size from a ``torchrun --nnodes N --nproc-per-node G`` prefix (None without one)."""
    lines = [ln.split(" #")[0] for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    tokens = shlex.split(" ".join(ln.rstrip().removesuffix("\\") for ln in lines))
    world = None
    if tokens and tokens[0] == "torchrun":
        nnodes = int(tokens[tokens.index("--nnodes") + 1])
        nproc = int(tokens[tokens.index("--nproc-per-node") + 1])
        world = nnodes * nproc
        tokens = tokens[next(i for i, t in enumerate(tokens) if t.endswith(".py")) + 1:]
    args: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        dest = tokens[i].removeprefix("--").replace("-", "_")
        values = []
        i += 1
        while i < len(tokens) and not tokens[i].startswith("--"):
            values.append(tokens[i])
            i += 1
        if dest in _STORE_FALSE:
            args[_STORE_FALSE[dest]] = False
        elif not values:
            args[dest] = True
        else:
            vals = [int(v) if _INT.fullmatch(v) else v for v in values]
            args[dest] = vals[0] if len(vals) == 1 else vals
    return args, world


@dataclass
class Validation:
    """What Megatron-LM says of a launch."""

    #: failed assertions: "file l.N: message"
    failures: list[str] = field(default_factory=list)
    #: (decoder layers, MTP layers) each virtual stage builds, in virtual-stage order
    stages: list[tuple[int, int]] = field(default_factory=list)


class _Failed(Exception):
    pass


def validate(args: dict[str, Any], world_size: int) -> Validation:
    """Run the transcribed assertions on Megatron-LM dests (:func:`read_flags`). Assertions that
    stop Megatron-LM's start stop here too (later ones are not reached), as they would."""
    a = {**_DEFAULTS, **args}
    out = Validation()

    def need(ok: bool, where: str, message: str) -> None:
        if not ok:
            out.failures.append(f"{where}: {message}")
            raise _Failed

    try:
        _validate(a, world_size, need, out)
    except _Failed:
        pass
    return out


def _validate(a: dict[str, Any], world: int, need: Any, out: Validation) -> None:
    tp, pp, cp = (a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"],
                  a["context_parallel_size"])
    ep = a["expert_model_parallel_size"]
    etp = a["expert_tensor_parallel_size"] if a["expert_tensor_parallel_size"] else tp
    L = a["num_layers"]
    hybrid = a["hybrid_layer_pattern"]
    if hybrid is not None:  # arguments.py l.788-797: the pattern's layers (MTP after "/")
        L = len(str(hybrid).split("/")[0].replace("|", ""))
    # arguments.py l.424-434 (and parallel_state.py l.815-823): world size over tp x pp x cp
    need(world % (tp * pp * cp) == 0, "arguments.py l.432",
         f"world size ({world}) is not divisible by total_model_size ({tp * pp * cp})")
    dp = world // (tp * pp * cp)
    # parallel_state.py l.874-884: the expert grid
    need(world % (etp * ep * pp) == 0, "parallel_state.py l.881",
         f"world_size ({world}) is not divisible by expert_tensor_model_pipeline parallel size "
         f"({etp * ep * pp})")
    if hybrid is not None:
        # arguments.py l.814-837: no virtual-stage arguments, layout or account-for flags
        for dest in ("num_layers_per_virtual_pipeline_stage",
                     "num_virtual_stages_per_pipeline_rank", "pipeline_model_parallel_layout"):
            need(a[dest] is None, "arguments.py l.814-828",
                 f"--{dest.replace('_', '-')} should not be used with --hybrid-layer-pattern")
        need(not a["account_for_embedding_in_pipeline_split"]
             and not a["account_for_loss_in_pipeline_split"], "arguments.py l.829-837",
             "--account-for-embedding/loss-in-pipeline-split should not be used with "
             "--hybrid-layer-pattern")
    # arguments.py l.928-939: at most one of the virtual-stage arguments
    given = [d for d in ("num_layers_per_virtual_pipeline_stage",
                         "num_virtual_stages_per_pipeline_rank", "pipeline_model_parallel_layout")
             if a[d] is not None]
    need(len(given) <= 1, "arguments.py l.928-939",
         f"No more than one of the following arguments can be set at the same time: {given}")
    first, last = a["decoder_first_pipeline_num_layers"], a["decoder_last_pipeline_num_layers"]
    emb, loss = a["account_for_embedding_in_pipeline_split"], a["account_for_loss_in_pipeline_split"]
    layout = None
    vpp: int | None
    if a["pipeline_model_parallel_layout"] is not None:
        layout = _parse_layout(str(a["pipeline_model_parallel_layout"]))
        # arguments.py l.941-952
        need(len(layout) % pp == 0, "arguments.py l.945",
             f"The length of pipeline_model_parallel_layout must be divisible by "
             f"pipeline_model_parallel_size ({len(layout)=}, {pp=})")
        vpp = len(layout) // pp
        vpp = None if vpp == 1 else vpp
    elif (a["num_layers_per_virtual_pipeline_stage"] is not None
          or a["num_virtual_stages_per_pipeline_rank"] is not None):
        if a["num_virtual_stages_per_pipeline_rank"] is None:  # l.954-975
            need(first is None and last is None, "arguments.py l.955",
                 "please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline "
                 "parallel degree when enable uneven pipeline parallelism")
            n = L + int(bool(emb)) + int(bool(loss))
            need(n % pp == 0, "arguments.py l.968",
                 "number of layers of the model must be divisible pipeline model parallel size")
            need((n // pp) % a["num_layers_per_virtual_pipeline_stage"] == 0,
                 "arguments.py l.972", "number of layers per pipeline stage must be divisible "
                 "number of layers per virtual pipeline stage")
            vpp = n // pp // a["num_layers_per_virtual_pipeline_stage"]
        else:
            vpp = a["num_virtual_stages_per_pipeline_rank"]
        vpp = None if vpp == 1 else vpp
    else:
        vpp = None
        # arguments.py l.985-998: the even split without virtual stages (not for hybrids)
        if first is None and last is None and hybrid is None:
            n = L + int(bool(emb)) + int(bool(loss))
            need(n % pp == 0, "arguments.py l.997",
                 "Number of layers should be divisible by the pipeline-model-parallel size")
    if vpp is not None:  # arguments.py l.1000-1009
        if a["overlap_p2p_comm"]:
            need(pp > 1, "arguments.py l.1002", "When interleaved schedule is used, "
                 "pipeline-model-parallel size should be greater than 1")
        else:
            need(pp > 2, "arguments.py l.1006", "When interleaved schedule is used and p2p "
                 "communication overlap is disabled, pipeline-model-parallel size should be "
                 "greater than 2")
    # arguments.py l.1118-1170: Megatron-FSDP (the checks a layout's flags can fail; the
    # optimizer and environment checks are not the layout's)
    if a["use_megatron_fsdp"]:
        need(a["ckpt_format"] == "fsdp_dtensor", "arguments.py l.1169",
             "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format.")
    # arguments.py l.1335-1338
    if a["seq_length"] is not None and cp > 1:
        need(a["seq_length"] % (cp * 2) == 0, "arguments.py l.1336",
             "seq-length should be a multiple of 2 * context-parallel-size if "
             "context-parallel-size > 1.")
    # arguments.py l.1425-1428
    if a["recompute_granularity"] == "selective":
        need(a["recompute_method"] is None, "arguments.py l.1426",
             "recompute method is not yet supported for selective recomputing granularity")
    sp = bool(a["sequence_parallel"]) and tp > 1  # arguments.py l.1433-1439: off at tp 1
    # arguments.py l.1655-1658
    if ep > 1:
        need(a["num_experts"] is not None, "arguments.py l.1656",
             "num_experts must be non None to use expert model parallelism")
        need(a["num_experts"] % ep == 0, "arguments.py l.1657",
             "Number of experts should be a multiple of expert model parallel_size.")
    # num_microbatches_calculator.py l.381-386
    gbs = a["global_batch_size"] if a["global_batch_size"] is not None else (
        a["micro_batch_size"] * dp)
    need(gbs % (a["micro_batch_size"] * dp) == 0, "num_microbatches_calculator.py l.381",
         f"global batch size ({gbs}) is not divisible by micro batch size "
         f"({a['micro_batch_size']}) times data parallel size ({dp})")
    # model_parallel_config.py l.502-504
    need(not (sp and tp <= 1), "model_parallel_config.py l.503",
         "Cannot use sequence parallelism without tensor parallelism")
    # transformer_config.py l.1446-1468
    heads = a["num_attention_heads"]
    need(heads % tp == 0, "transformer_config.py l.1446",
         f"num_attention_heads ({heads}) must be a multiple of tensor_model_parallel_size ({tp}).")
    groups = a["num_query_groups"] if a["group_query_attention"] and a["num_query_groups"] \
        else heads  # arguments.py: num_query_groups only with --group-query-attention
    need(groups % tp == 0 or tp % groups == 0, "transformer_config.py l.1461",
         f"num_query_groups ({groups}) must be a multiple or divisor of "
         f"tensor_model_parallel_size ({tp}).")
    # transformer_config.py l.1900-1925
    gran = a["recompute_granularity"]
    if gran is not None:
        need(gran in ("full", "selective"), "transformer_config.py l.1901",
             f"recompute_granularity {gran} must be full or selective")
        need(a["recompute_method"] in ("block", "uniform") or gran == "selective",
             "transformer_config.py l.1907-1915", 'recompute_method must be "block" or "uniform"')
        need(gran == "selective" or a["recompute_num_layers"] is not None,
             "transformer_config.py l.1918", "recompute_num_layers must be between 1 and "
             "num_layers_per_pipeline_rank")
        need(gran != "selective" or a["recompute_num_layers"] is None,
             "transformer_config.py l.1924", "recompute_num_layers must be None with selective")
    mtp = a["mtp_num_layers"]
    if hybrid is not None:
        out.stages = _hybrid_stages(L, pp, vpp, first, last, need)
        return
    _split_post_init(L, pp, vpp, first, last, emb, loss, layout, mtp, need)
    out.stages = _layers_built(L, pp, vpp, first, last, emb, loss, layout, mtp, need)


def _split_post_init(L: int, pp: int, vpp: int | None, first: int | None, last: int | None,
                     emb: bool, loss: bool, layout: list[list[str]] | None, mtp: int | None,
                     need: Any) -> None:
    """``TransformerConfig.__post_init__``'s split checks (transformer_config.py l.2229-2414)."""
    need(not ((first is not None or last is not None) and (emb or loss)),
         "transformer_config.py l.2229-2239", "num_layers_in_first_pipeline_stage and "
         "num_layers_in_last_pipeline_stage cannot be set at the same time with "
         "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split")
    if layout is not None:
        need(first is None and last is None and not emb and not loss,
             "transformer_config.py l.2245-2259",
             "pipeline_model_parallel_layout cannot be set with other pipeline layout arguments.")
        _validate_layer_layout(layout, pp, L, mtp, need)
    elif first is not None or last is not None:  # l.2295-2368
        stages, n = pp, L
        for name, k in (("first", first), ("last", last)):
            if k is None:
                continue
            need(k > 0, "transformer_config.py l.2303/2322",
                 f"num_layers_in_{name}_pipeline_stage must be larger than 0")
            need(vpp is None or k % vpp == 0, "transformer_config.py l.2306-2317/2325-2336",
                 f"number of layers at {name} stage: {k} must be divisible by virtual pipeline "
                 f"parallel degree {vpp}")
            n -= k
            stages -= 1
        need(bool(n) == bool(stages), "transformer_config.py l.2341",
             f"Mismatch: {n} middle layers remaining but {stages} middle PP stages available.")
        need(not stages or n % stages == 0, "transformer_config.py l.2349",
             f"number of layers at middle stage: {n} must be divisible by the middle pipeline "
             f"model parallel size {stages}")
        need(not stages or vpp is None or (n // stages) % vpp == 0,
             "transformer_config.py l.2357-2368", f"number of layers on each middle pipeline "
             f"rank: {n // stages if stages else 0} must be divisible by virtual pipeline "
             f"parallel degree {vpp}")
    elif emb or loss:  # l.2370-2414
        n = L + int(emb) + int(loss)
        need(n % pp == 0, "transformer_config.py l.2382/2395",
             f"num_layers: {n} after enable account_for_embedding_in_pipeline_split or "
             f"account_for_loss_in_pipeline_split must be divisible by "
             f"pipeline_model_parallel_size {pp}")
        need(vpp is None or (n // pp) % vpp == 0, "transformer_config.py l.2405",
             f"number of layers on each pipeline rank: {n // pp} must be divisible by "
             f"virtual_pipeline_model_parallel_size {vpp}")


def _parse_layout(text: str) -> list[list[str]]:
    """``PipelineParallelLayerLayout.parse_str_to_list`` (pipeline_parallel_layer_layout.py
    l.283-321): commas dropped, ``(...)*n`` then ``x*n`` unrolled, ``|`` between stages."""
    text = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), text)
    names = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}
    out = []
    for stage in text.split("|"):
        for ch in stage:
            if ch not in names:
                raise ValueError(f"Invalid layer character: {ch}")
        out.append([names[ch] for ch in stage])
    return out


def _grid(layout: list[list[str]], pp: int) -> list[list[list[str]]]:
    """The layout by [pp_rank][vpp_rank] (pipeline_parallel_layer_layout.py l.46-55)."""
    vpp = len(layout) // pp
    return [[layout[v * pp + r] for v in range(vpp)] for r in range(pp)]


def _validate_layer_layout(layout: list[list[str]], pp: int, L: int, mtp: int | None,
                           need: Any) -> None:
    """``PipelineParallelLayerLayout.__init__`` l.41-45 and ``validate_layer_layout`` l.86-136."""
    need(len(layout) % pp == 0, "pipeline_parallel_layer_layout.py l.41",
         "pipeline_model_parallel_layout must be divisible by pipeline_model_parallel_size")
    flat = [x for stage in layout for x in stage]  # virtual-stage order (l.76-79)
    W = "pipeline_parallel_layer_layout.py"
    need(bool(flat) and flat[0] == "embedding", f"{W} l.95", "The first layer must be embedding")
    need(flat[-1] == "loss", f"{W} l.98", "The last layer must be loss")
    need(flat.count("embedding") == 1, f"{W} l.103", "Embedding must be specified exactly once")
    need(flat.count("loss") == 1, f"{W} l.106", "Loss must be specified exactly once")
    need(flat.count("decoder") == L, f"{W} l.107",
         f"Number of decoder layers {flat.count('decoder')} must match num_layers {L}")
    need(flat.count("mtp") == mtp or (mtp is None and flat.count("mtp") == 0), f"{W} l.112",
         "Number of mtp layers in layout must match mtp_num_layers")
    if "mtp" in flat:
        need("decoder" not in flat[flat.index("mtp"):], f"{W} l.115-120",
             "decoder layers must be placed before MTP layers")
    grid = _grid(layout, pp)
    vpp = len(layout) // pp
    for r in range(pp):
        for v in range(vpp - 1):
            need("mtp" not in grid[r][v], f"{W} l.121-126",
                 "Currently we restrict that the MTP should be always in the last virtual "
                 "pipeline stage of that rank.")
        if "mtp" in grid[r][-1]:
            need(grid[r][-1].count("mtp") == mtp, f"{W} l.127-131",
                 "All of the MTP layers must be in the same one virtual pipeline stage")
    for v in range(vpp - 1):
        need("mtp" not in grid[0][v], f"{W} l.132-136",
             "Currently we restrict that the MTP should not be in the first pp rank.")


def _layers_built(L: int, pp: int, vpp: int | None, first: int | None, last: int | None,
                  emb: bool, loss: bool, layout: list[list[str]] | None, mtp: int | None,
                  need: Any) -> list[tuple[int, int]]:
    """(decoder, MTP) layers of every virtual stage: ``get_num_layers_to_build``
    (transformer_block.py l.76-201) and ``get_mtp_num_layers_to_build``
    (multi_token_prediction.py l.864-883)."""
    vp = vpp or 1
    built: dict[int, tuple[int, int]] = {}
    for v in range(vp):
        for r in range(pp):
            if layout is not None:  # l.91-94; MTP l.868-877
                stage = _grid(layout, pp)[r][v]
                n_mtp = stage.count("mtp")
                need(n_mtp in (0, mtp), "multi_token_prediction.py l.873",
                     "the number of MTP layers to build must match mtp_num_layers or be 0")
                built[v * pp + r] = (stage.count("decoder"), n_mtp)
                continue
            is_first, is_last = r == 0, r == pp - 1
            if first is not None or last is not None:  # l.103-146
                need(not (emb or loss), "transformer_block.py l.108",
                     "Does not support standalone embedding stage and standalone loss stage "
                     "with uneven pp")
                n, left = L, pp
                if first is not None:
                    n, left = n - first, left - 1
                if last is not None:
                    n, left = n - last, left - 1
                if left > 0:
                    need(n % left == 0, "transformer_block.py l.131", "With uneven pipelineing "
                         "the left over layers must be divisible by left over stages")
                    per_rank = n // left
                else:
                    per_rank = 0
                if is_first and first is not None:
                    per_rank = first
                if is_last and last is not None:
                    per_rank = last
            else:  # l.147-159
                n = L + int(emb) + int(loss)
                need(n % pp == 0, "transformer_block.py l.156",
                     f"num_layers={n} should be divisible by pipeline_model_parallel_size={pp}")
                per_rank = n // pp
            if vpp is not None and pp > 1:  # l.161-181
                need(per_rank % vpp == 0, "transformer_block.py l.175",
                     f"num_layers_per_pipeline_rank {per_rank} should be divisible by vp_size "
                     f"{vpp}")
                count = per_rank // vpp
            else:
                count = per_rank
            if emb and v == 0 and is_first:  # l.191-196
                count -= 1
                need(count >= 0, "transformer_block.py l.194",
                     "Not enough layers in the first virtual pipeline stage")
            if loss and v == vp - 1 and is_last:  # l.198-201
                count -= 1
                need(count >= 0, "transformer_block.py l.201",
                     "Not enough layers in the last virtual pipeline stage")
            # multi_token_prediction.py l.878-882: every MTP layer on the last virtual stage
            n_mtp = (mtp or 0) if (v == vp - 1 and is_last) else 0
            built[v * pp + r] = (count, n_mtp)
    stages = [built[i] for i in range(vp * pp)]
    need(sum(d for d, _ in stages) == L, "transformer_block.py (sum over stages)",
         f"the stages build {sum(d for d, _ in stages)} decoder layers, not num_layers {L}")
    return stages


def _hybrid_stages(L: int, pp: int, vpp: int | None, first: int | None, last: int | None,
                   need: Any) -> list[tuple[int, int]]:
    """A pipe-free ``--hybrid-layer-pattern`` over pp ranks
    (``hybrid_layer_allocation.py::select_pipeline_segment`` l.384-445)."""
    if pp == 1:
        return [(L, 0)]
    need(vpp is None, "hybrid_layer_allocation.py l.385",
         "Virtual pipeline parallelism is not supported when hybrid_layer_pattern has no pipe "
         "separators")
    if first is not None or last is not None:  # l.408-433
        f, la = first or 0, last or 0
        middle_stages = pp - (first is not None) - (last is not None)
        middle = L - f - la
        if middle_stages > 0:
            need(middle % middle_stages == 0, "hybrid_layer_allocation.py l.413",
                 f"Middle layers ({middle}) must be evenly divisible by middle pipeline stages "
                 f"({middle_stages}).")
        per = middle // middle_stages if middle_stages > 0 else 0
        return [(first if r == 0 and first is not None else last
                 if r == pp - 1 and last is not None else per, 0) for r in range(pp)]
    need(L % pp == 0, "hybrid_layer_allocation.py l.437",
         f"Number of layers ({L}) must be evenly divisible by pipeline-model-parallel-size ({pp})")
    return [(L // pp, 0)] * pp
