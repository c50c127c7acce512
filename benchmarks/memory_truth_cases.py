"""tune-cp's side of the memory truth harness, without torch: the matrix configuration
(:class:`Case`), its resolved tune-cp configuration, and tune-cp's figure for every term the
harness measures (``benchmarks/memory_truth.py``). ``tests/test_memory_truth.py`` compares these
with the figures recorded in ``benchmarks/memory_truth.json``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tune_cp.config.resolve import resolve_config
from tune_cp.config.specs import (
    ClusterSpec,
    ParallelConfig,
    PipelineSplit,
    Recompute,
    RecomputeMethod,
    TrainingSpec,
)
from tune_cp.oracle import memory as M
from tune_cp.oracle.catalog import load_gpu, load_model
from tune_cp.oracle.layers import kind_index

#: Defended tolerances (tests/test_memory_truth.py, docs/memory_truth.md): model state exact;
#: a layer's saved activations within 1 % (what is left is unfused RoPE's cos/sin tables when
#: they are not split, and Megatron's small int/bool index tensors); the micro-batch peak within
#: 2 % (transient op outputs the harness sees that no term names: reduction temporaries, the
#: router's intermediate fp32 tensors, the backward of one op's inputs).
LAYER_TOL = 0.01
PEAK_TOL = 0.02


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    gpu: str = "h100"
    nodes: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    mbs: int = 1
    seq_len: int = 4096
    gbs: int = 0
    stage: int = 0
    recompute: str = "none"
    recompute_method: str = "block"
    recompute_layers: int | None = None
    split: str = "even"
    modules: tuple[str, ...] = ()
    distributed_optimizer: bool = True
    #: the uneven split's end stages (Megatron-Core ``num_layers_in_first/last_pipeline_stage``)
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    #: a hand-written split (Megatron-Core ``pipeline_model_parallel_layout``)
    layout: str | None = None
    #: token-drop MoE padded to this capacity factor (``RunOptions.moe_capacity_factor``;
    #: None: the harness's balanced routing, capacity factor 1 with padding)
    capacity_factor: float | None = None
    #: measure the model state only (the stage's layers, weights, gradients, optimizer)
    state_only: bool = False
    #: also measure what one micro-batch saves in this local model chunk, built in the
    #: pipeline as Megatron builds it (``chunk_saved``)
    chunk: int | None = None


def case_from_json(d: dict) -> Case:
    d = dict(d)
    d["modules"] = tuple(d.get("modules") or ())
    return Case(**d)


def resolved_case(c: Case):
    m = load_model(c.model)
    cluster = ClusterSpec(gpu=load_gpu(c.gpu), num_nodes=c.nodes, gpus_per_node=8)
    dp = cluster.world_size // (c.tp * c.pp * c.cp)
    gbs = c.gbs or c.mbs * dp * c.pp * 2
    training = TrainingSpec(seq_len=c.seq_len, global_batch_size=gbs)
    cfg = ParallelConfig(
        tp=c.tp, pp=c.pp, vpp=c.vpp, cp=c.cp, ep=c.ep, etp=c.etp, mbs=c.mbs,
        recompute=Recompute(c.recompute),
        recompute_method=RecomputeMethod(c.recompute_method),
        recompute_layers=c.recompute_layers,
        pipeline_split=PipelineSplit(c.split),
        distributed_optimizer=c.distributed_optimizer,
        first_stage_layers=c.first_stage_layers, last_stage_layers=c.last_stage_layers,
        pipeline_layout=c.layout,
        **({"recompute_modules": c.modules} if c.modules else {}),
    )
    return m, cluster, training, resolve_config(cfg, m, cluster, training)


def case_overheads(c: Case) -> M.MemoryOverheads:
    """The memory overheads the case runs with: the defaults, and the token-drop capacity
    factor as a run setting (``RunOptions.moe_capacity_factor``)."""
    if c.capacity_factor is None:
        return M.MemoryOverheads()
    return M.MemoryOverheads(run=M.RunOptions(moe_capacity_factor=c.capacity_factor))


def small_build(c: Case) -> dict:
    """What the harness builds for the activation measurement: one layer of each kind the stage
    holds, the embedding / output side (and MTP) when the stage has them."""
    m, _cluster, _training, cfg = resolved_case(c)
    sc = M.stage_counts(m, cfg)[c.stage]
    return dict(n_dense=int(sc.dense_layers > 0), n_moe=int(sc.moe_layers > 0),
                pre=bool(sc.has_embedding), post=bool(sc.has_output),
                mtp=int(bool(sc.has_output) and m.num_mtp_layers > 0))


def tunecp_figures(c: Case) -> dict[str, int]:
    """tune-cp's figure for every measured term: the stage's model state (``memory_report``,
    as ``tune-cp check --json`` prints it), the saved bytes of one layer of each kind, the
    embedding and the output side (``activation_units``), and the live peak of the small build
    over one micro-batch (``combine`` on that build's counts, model state and the runtime terms
    the harness cannot see left out)."""
    m, cluster, training, cfg = resolved_case(c)
    ov = case_overheads(c)
    st = M.memory_report(m, cluster, training, cfg, ov).stages[c.stage]
    au = M.activation_units(m, training, cfg, ov)
    b = small_build(c)
    out = dict(decoder_layers=st.decoder_layers, weights=st.terms["weights"],
               gradients=st.terms["gradients"], optimizer=st.terms["optimizer"])
    if c.chunk is not None:
        out["chunk_saved"] = chunk_saved(c)
    if c.state_only:
        return out
    full = cfg.recompute is Recompute.FULL  # a checkpointed layer keeps only its input
    # a checkpointed layer keeps its input and a reference to the stage's cached RoPE table,
    # which the small build's one checkpoint is the only holder of (MLA computes its rotary
    # table inside the attention, so its checkpoints pass none)
    ckpt = au.ckpt_input + (au.rope_table if m.mla is None else 0)
    if b["n_dense"]:
        out["layer_dense"] = ckpt if full else au.dense_layer
    if b["n_moe"]:
        out["layer_moe"] = ckpt if full else au.moe_layer
    if b["pre"]:
        out["embedding"] = au.embedding
    if b["post"]:
        out["output"] = au.output
    if b["mtp"]:  # the output side and the MTP module together (the harness books MTP's
        # final norm, logits and loss under output, tune-cp under mtp_extra)
        out["output_mtp"] = (au.output + au.mtp_heads + m.num_mtp_layers
                             * (au.mtp_extra + (au.moe_layer if m.is_moe else au.dense_layer)))
    out["micro_peak"] = micro_peak(c)
    return out


def chunk_saved(c: Case) -> int:
    """tune-cp's saved bytes of one micro-batch in model chunk ``c.chunk`` of the stage: the
    terms of ``combine``'s ``activations`` and ``logits_loss`` for one in-flight micro-batch
    of that chunk alone (its layers of each kind, the embedding, the MTP layers with their
    extras, the output side with the MTP heads it computes)."""
    m, _cluster, training, cfg = resolved_case(c)
    au = M.activation_units(m, training, cfg, case_overheads(c))
    first, last, layout = M.split_fields(cfg)
    ch = M.pipeline_chunks(m.num_layers, m.num_mtp_layers, cfg.pp, cfg.vpp, cfg.pipeline_split,
                           first, last, layout)[c.stage][c.chunk]
    kinds = kind_index(m)
    per_kind = (au.dense_layer, au.moe_layer, au.attention_layer, au.mamba_layer)
    mtp_layer = au.moe_layer if m.is_moe else au.dense_layer
    return (sum(per_kind[kinds[i]] for i in ch.layers) + ch.has_embedding * au.embedding
            + ch.mtp_layers * (mtp_layer + au.mtp_extra)
            + ch.has_output * (au.output + au.mtp_heads))


def tunecp_chunks(c: Case) -> list[dict]:
    """The model chunks of the case's stage as ``oracle.memory.pipeline_chunks`` splits them, in
    the harness's shape for Megatron-Core's build (``layers_per_chunk``): the 1-based global
    numbers of each chunk's decoder layers (Megatron's ``layer_number``: offset from
    ``get_transformer_layer_offset`` plus the ``get_num_layers_to_build`` layers), its MTP
    layers, whether it builds a word embedding (the embedding chunk, or an MTP chunk's own
    copy: ``GPTModel`` builds one where ``pre_process or mtp_process``) and the output layer."""
    m, _cluster, _training, cfg = resolved_case(c)
    first, last, layout = M.split_fields(cfg)
    chunks = M.pipeline_chunks(m.num_layers, m.num_mtp_layers, cfg.pp, cfg.vpp,
                               cfg.pipeline_split, first, last, layout)[c.stage]
    return [dict(layers=[i + 1 for i in ch.layers], mtp=ch.mtp_layers,
                 embedding=ch.has_embedding or ch.mtp_layers > 0, output=ch.has_output)
            for ch in chunks]


def micro_peak(c: Case) -> int:
    m, cluster, training, cfg = resolved_case(c)
    cfg1 = cfg.model_copy(update={"pp": 1, "vpp": 1})
    run = case_overheads(c).run
    au = M.activation_units(m, training, cfg1, case_overheads(c))
    pu = M.param_units(m, cfg.tp, 1, cfg.ep, cfg.etp_)
    sh = M.sharding(m, cluster, cfg)
    b = small_build(c)
    nd, nm = b["n_dense"], b["n_moe"]
    rec = cfg.recompute is Recompute.FULL
    sc = M.StageCounts(
        stage=0, dense_layers=nd, moe_layers=nm, mtp_layers=b["mtp"],
        has_embedding=int(b["pre"]), has_output=int(b["post"]),
        inflight_dense=0 if rec else nd, inflight_moe=0 if rec else nm,
        inflight_ckpt=(nd + nm) if rec else 0, inflight_embedding=int(b["pre"]),
        inflight_output=int(b["post"]), inflight_mtp=b["mtp"], inflight_microbatches=1,
        has_dense=int(nd > 0), has_moe=int(nm > 0), has_layers=1,
        recompute_groups=((1, 0), (0, 1)) if rec and nd and nm else ((nd, nm),) if rec else ())
    ov = M.MemoryOverheads(fragmentation=0.0, runtime_context_bytes=0,
                           collective_bytes_per_group=0, dispatcher_buffer_bytes=0, run=run)
    t = M.combine(sc, pu, au, sh, ov)
    # the small build runs as one pipeline stage without a context-parallel ring
    return (sum(t[k] for k in M.TRANSIENT_TERMS) - t["pipeline_buffers"] - t["cp_buffers"]
            + t["sp_gather_buffer"])


JSON_PATH = ROOT / "benchmarks" / "memory_truth.json"
ORDER = ("weights", "gradients", "optimizer", "layer_dense", "layer_moe", "embedding", "output",
         "output_mtp", "chunk_saved", "micro_peak")


def measured_terms(row: dict) -> dict[str, int]:
    """A row's measured figures, with the output side and the MTP module together
    (``output_mtp``: the harness books MTP's final norm, logits and loss under ``output``)."""
    meas = dict(row["measured"])
    if "mtp" in meas and "output" in meas:
        meas["output_mtp"] = meas["output"] + meas["mtp"]
    return meas


def rescore(doc: dict) -> dict:
    """The recorded rows with the ``tune_cp`` column recomputed by the current memory model."""
    for row in doc["rows"]:
        if "measured" in row:
            row["tune_cp"] = tunecp_figures(case_from_json(row["case"]))
    return doc


def table(doc: dict) -> list[str]:
    """Markdown table: per row and term, tune-cp minus measured in percent."""
    head = ["row", *ORDER, "peak at"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in doc["rows"]:
        c = row["case"]
        if "measured" not in row:
            lines.append(f"| {c['name']} | not built: {row.get('error', '?')} |" + " |" * len(ORDER))
            continue
        cells = [c["name"]]
        meas = measured_terms(row)
        for k in ORDER:
            v, p = meas.get(k), row["tune_cp"].get(k)
            cells.append("" if v is None or p is None else f"{(p - v) / v * 100:+.2f}%")
        cells.append(row.get("peak_at", ""))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(description="recorded truth matrix beside the current model")
    ap.add_argument("--json", default=str(JSON_PATH))
    ap.add_argument("--write", action="store_true", help="store the recomputed tune_cp column")
    args = ap.parse_args(argv)
    doc = rescore(json.loads(Path(args.json).read_text()))
    print(f"Megatron-Core {doc['megatron_core']}; kernel set: {doc['kernel_set']}\n")
    print("tune-cp minus measured (% of measured), per term:\n")
    print("\n".join(table(doc)))
    if args.write:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
