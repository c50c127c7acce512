"""The truth matrix of ``benchmarks/memory_truth.py --matrix`` and the pipeline-schedule sweep.

Rows cover dense GQA (Llama 3 8B / 70B), MoE top-2 (Mixtral 8x7B / 8x22B, with the AMD 8-node
MI355X layout), fine-grained MoE (Qwen3-30B-A3B), DeepSeek-V3 (MLA, shared experts, dense first
layers, MTP), tp 1/2/4/8 with sequence parallelism, cp 2/4, ep and etp > 1, distributed
optimizer over dp > 1 (and one row without it), recompute none / selective / full block and
uniform, mbs 1 and 2, seq 4k and 8k, first / middle / last pipeline stages.
"""

from __future__ import annotations

from benchmarks.memory_truth_cases import Case

L8, L70, MX7, MX22, QW, DS = ("llama3-8b", "llama3-70b", "mixtral-8x7b", "mixtral-8x22b",
                              "qwen3-30b-a3b", "deepseek-v3")
L405 = "llama3.1-405b"
#: Llama 3 8B over 8 virtual stages: the embedding alone, 32 layers, the loss alone
L8_LAYOUT = "E|t*6|t*5|t*5|t*5|t*5|t*6|L"
#: DeepSeek-V3 at pp 16 vpp 2 as Megatron-Core's MoE README partitions it (61 layers + 1 MTP)
DS_LAYOUT = "Et*3|(tt|)*29,m|L"
#: DeepSeek-V3 at pp 16 with the embedding, MTP and loss as one layer each (4 per stage), as
#: the harness measured it: Megatron-Core's account-for-embedding/loss split cannot (61 + 2
#: layers do not divide over 16 stages), so this is a layout
DS_LAYOUT16 = "Ettt|(tttt|)*14ttmL"

MATRIX: list[Case] = [
    Case("l8b-tp1", L8),
    Case("l8b-tp2-sp", L8, tp=2),
    Case("l8b-tp4-sp", L8, tp=4),
    Case("l8b-tp8-sp", L8, tp=8),
    Case("l8b-tp2-mbs2", L8, tp=2, mbs=2),
    Case("l8b-tp1-seq8k", L8, seq_len=8192),
    Case("l8b-cp2", L8, cp=2, seq_len=8192),
    Case("l8b-tp2-cp4", L8, tp=2, cp=4, seq_len=8192),
    Case("l8b-pp4-first", L8, pp=4, stage=0),
    Case("l8b-pp4-middle", L8, pp=4, stage=1),
    Case("l8b-pp4-last", L8, pp=4, stage=3),
    Case("l8b-pp2-vpp2-first", L8, pp=2, vpp=2, stage=0),
    Case("l8b-pp2-vpp2-last", L8, pp=2, vpp=2, stage=1),
    Case("l8b-selective", L8, tp=2, recompute="selective", modules=("core_attn", "mlp")),
    Case("l8b-full-block-k1", L8, pp=4, stage=0, recompute="full", recompute_layers=1),
    Case("l8b-full-uniform-k2", L8, pp=4, stage=1, recompute="full",
         recompute_method="uniform", recompute_layers=2),
    Case("l8b-no-distopt", L8, tp=2, distributed_optimizer=False),
    Case("l8b-dp16", L8, nodes=2),
    Case("l8b-tp2-pp2-last-mbs2-seq8k", L8, tp=2, pp=2, stage=1, mbs=2, seq_len=8192),
    Case("l70b-tp8-pp8-first", L70, nodes=8, tp=8, pp=8, stage=0),
    Case("l70b-tp8-pp8-middle", L70, nodes=8, tp=8, pp=8, stage=3),
    Case("l70b-tp8-pp8-last", L70, nodes=8, tp=8, pp=8, stage=7),
    Case("l70b-tp4-pp4-vpp2-first", L70, nodes=4, tp=4, pp=4, vpp=2, stage=0),
    Case("l70b-tp8-cp2-pp4-last-seq8k", L70, nodes=8, tp=8, cp=2, pp=4, stage=3, seq_len=8192),
    Case("l70b-tp8-pp4-full-uniform-k4", L70, nodes=4, tp=8, pp=4, stage=1, recompute="full",
         recompute_method="uniform", recompute_layers=4),
    Case("mx7-tp1-ep8", MX7, ep=8),
    Case("mx7-tp2-ep4", MX7, tp=2, ep=4),
    Case("mx7-tp2-ep4-etp1", MX7, tp=2, ep=4, etp=1),
    Case("mx7-pp4-ep8-first", MX7, nodes=4, pp=4, ep=8, stage=0),
    Case("mx7-pp4-ep8-last", MX7, nodes=4, pp=4, ep=8, stage=3),
    Case("mx7-tp2-ep4-mbs2-seq8k", MX7, tp=2, ep=4, mbs=2, seq_len=8192),
    Case("mx7-pp2-full-block-k1", MX7, nodes=2, pp=2, ep=8, stage=0, recompute="full",
         recompute_layers=1),
    Case("mx7-tp2-cp2-ep4", MX7, tp=2, cp=2, ep=4, seq_len=8192),
    Case("mx22-amd-first", MX22, gpu="mi355x", nodes=8, pp=4, vpp=2, ep=8, mbs=2, stage=0,
         seq_len=4096),
    Case("mx22-amd-last", MX22, gpu="mi355x", nodes=8, pp=4, vpp=2, ep=8, mbs=2, stage=3,
         seq_len=4096),
    Case("mx22-tp2-pp4-ep8-etp2-middle", MX22, nodes=4, tp=2, pp=4, ep=8, stage=1),
    Case("qwen-tp1-ep8", QW, ep=8),
    Case("qwen-tp2-ep8-etp1", QW, nodes=2, tp=2, ep=8, etp=1),
    Case("qwen-pp2-ep8-last", QW, nodes=2, pp=2, ep=8, stage=1),
    Case("qwen-selective-moe-act", QW, ep=8, recompute="selective", modules=("moe_act",)),
    Case("dsv3-pp16-ep8-first", DS, nodes=32, pp=16, ep=8, stage=0, split="layout", layout=DS_LAYOUT16),
    Case("dsv3-pp16-ep8-middle", DS, nodes=32, pp=16, ep=8, stage=7, split="layout", layout=DS_LAYOUT16),
    Case("dsv3-pp16-ep8-last", DS, nodes=32, pp=16, ep=8, stage=15, split="layout", layout=DS_LAYOUT16),
    Case("dsv3-tp2-pp16-ep8-etp1-middle", DS, nodes=32, tp=2, pp=16, ep=8, etp=1, stage=7,
         split="layout", layout=DS_LAYOUT16),
    Case("dsv3-pp16-full-k1-middle", DS, nodes=32, pp=16, ep=8, stage=7,
         split="layout", layout=DS_LAYOUT16, recompute="full", recompute_layers=1),
    # uneven end stages (Megatron-Core num_layers_in_first/last_pipeline_stage), with and
    # without virtual stages; the light split of Meta's Llama 3.1 405B (7 + 14 x 8 + 7 layers)
    # on Meta's layout (TP8 PP16 DP64, seq 8192)
    Case("l8b-pp4-uneven-first", L8, pp=4, stage=0, split="uneven", first_stage_layers=6,
         last_stage_layers=10),
    Case("l8b-pp4-uneven-middle", L8, pp=4, stage=1, split="uneven", first_stage_layers=6,
         last_stage_layers=10),
    Case("l8b-pp4-uneven-last", L8, pp=4, stage=3, split="uneven", first_stage_layers=6,
         last_stage_layers=10),
    Case("l8b-pp4-vpp2-uneven-first", L8, pp=4, vpp=2, stage=0, split="uneven",
         first_stage_layers=6, last_stage_layers=6),
    Case("l8b-pp4-vpp2-uneven-last", L8, pp=4, vpp=2, stage=3, split="uneven",
         first_stage_layers=6, last_stage_layers=6),
    Case("l405b-pp16-light-ends-first", L405, nodes=1024, tp=8, pp=16, stage=0,
         split="light_ends", seq_len=8192),
    Case("l405b-pp16-light-ends-second", L405, nodes=1024, tp=8, pp=16, stage=1,
         split="light_ends", seq_len=8192),
    Case("l405b-pp16-light-ends-last", L405, nodes=1024, tp=8, pp=16, stage=15,
         split="light_ends", seq_len=8192),
    # hand-written layouts (pipeline_model_parallel_layout): an embedding-only and a loss-only
    # virtual stage (Llama-like); DeepSeek-V3's own (MTP standalone on rank 14, the final norm
    # with the last decoder layer on rank 13, the loss alone on rank 15's second chunk)
    Case("l8b-pp4-vpp2-layout-first", L8, pp=4, vpp=2, stage=0, split="layout",
         layout=L8_LAYOUT, chunk=0),
    Case("l8b-pp4-vpp2-layout-last", L8, pp=4, vpp=2, stage=3, split="layout",
         layout=L8_LAYOUT, chunk=1),
    # (stages 14 and 15: the second chunk measured in the pipeline, the MTP alone and the
    # loss with the MTP head)
    *[Case(f"dsv3-layout-pp16-vpp2-stage{s}", DS, nodes=32, pp=16, vpp=2, ep=8, stage=s,
           split="layout", layout=DS_LAYOUT, state_only=True, chunk=1 if s >= 14 else None)
      for s in (0, 13, 14, 15)],
    # token-drop MoE padded to a capacity factor (moe_expert_capacity_factor with
    # moe_pad_expert_input_to_capacity)
    Case("mx7-tp1-ep8-drop1.25", MX7, ep=8, capacity_factor=1.25),
    Case("mx7-tp2-ep4-etp1-drop2", MX7, tp=2, ep=4, etp=1, capacity_factor=2.0),
    Case("qwen-pp2-ep8-last-drop1.5", QW, nodes=2, pp=2, ep=8, stage=1, capacity_factor=1.5),
    # a middle stage (no loss): the peak is the MoE backward, dropless-balanced and at C 1.5
    Case("mx7-pp4-ep8-middle", MX7, nodes=4, pp=4, ep=8, stage=1),
    Case("mx7-pp4-ep8-middle-drop1.5", MX7, nodes=4, pp=4, ep=8, stage=1, capacity_factor=1.5),
]


def schedule_sweep() -> list[dict]:
    """Micro-batches in flight per stage: Megatron-Core's ``get_pp_rank_microbatches`` (warm-up
    count; in flight at the first backward = warm-up + 1, capped at the total) and
    ``get_schedule_table`` (which chunk each forward runs) beside
    ``oracle.memory.inflight_per_chunk``."""
    from megatron.core.pipeline_parallel.schedules import (
        get_pp_rank_microbatches,
        get_schedule_table,
    )

    from tune_cp.oracle.memory import inflight_per_chunk

    class _Group:
        def __init__(self, size, rank):
            self._s, self._r = size, rank

        def size(self):
            return self._s

        def rank(self):
            return self._r

    class _P2P:
        def __init__(self, pp, rank, vpp):
            self.pp_group = _Group(pp, rank)
            self.virtual_pipeline_model_parallel_size = vpp if vpp > 1 else None

    out = []
    for pp in (2, 4, 8):
        for vpp in (1, 2, 3):
            for m in (pp, 2 * pp, 4 * pp):
                for rank in range(pp):
                    total, _, warm, _ = get_pp_rank_microbatches(
                        m, vpp, pp, p2p_communicator=_P2P(pp, rank, vpp))
                    n = min(warm + 1, total)
                    if vpp == 1:
                        mega = [n]
                    else:
                        table = get_schedule_table(m, vpp, pp)
                        mega = [sum(1 for _mb, ch in table[:n] if ch == j) for j in range(vpp)]
                    ours = list(inflight_per_chunk(pp, vpp, m, rank))
                    out.append(dict(pp=pp, vpp=vpp, microbatches=m, rank=rank,
                                    megatron=mega, tune_cp=ours, equal=mega == ours))
    return out
