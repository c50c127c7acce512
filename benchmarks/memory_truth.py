"""Memory measured against Megatron-Core itself, on CPU, under PyTorch's ``FakeTensorMode``.

For one tune-cp configuration this builds the real Megatron-Core ``GPTModel`` (local layer spec,
full model dimensions) for one pipeline stage, wraps it in Megatron's own
``DistributedDataParallel`` and ``DistributedOptimizer`` on PyTorch's fake process group (so
tp / cp / ep / dp > 1 are real groups whose collectives move nothing), and measures:

* **model state** of the whole stage (every layer Megatron places on that pipeline rank, all
  virtual chunks): bf16 parameter bytes, the DDP gradient buffer, the distributed optimizer's
  fp32 master shard and Adam moments after one ``optimizer.step()``;
* **saved activations** per layer kind (dense, MoE), for the embedding and for the output side
  (final norm, logits, loss), counted with ``torch.autograd.graph.saved_tensors_hooks`` and
  deduplicated by storage (a view keeps its whole storage alive), parameters excluded;
* **the live-tensor peak of one micro-batch** (forward, loss, backward) of a small build of the
  same stage (one layer of each kind, plus embedding / output when the stage has them), and
  where in the step it occurs; tracked by a dispatch mode that follows every storage's life.

Each figure is printed beside tune-cp's own term (``oracle.memory``, the functions behind
``tune-cp check --json``).

**Kernel set** (``KERNEL_SET``; every recorded figure stands for it): RMSNorm saving its input
and an fp32 rstd per token (what Transformer Engine's and Apex's fused RMSNorm save), flash
attention saving q, k, v, out and an fp32 log-sum-exp (flash-attn / cuDNN), Megatron-Core's own
fused SwiGLU (``fused_bias_swiglu.SwiGLUFunction``, jit disabled: the same saved tensors), the
local spec's ``ColumnParallelLinear`` / ``RowParallelLinear``, unfused RoPE and Megatron's own
MoE (``SequentialMLP`` experts, alltoall dispatcher). Stand-ins are switchable
(``--torch-norm``, ``--unfused-swiglu``, ``--sdpa``; the last is not built) and each is checked
numerically against the reference op (:func:`check_stand_ins`).

The shims change nothing the model allocates: ``torch.cuda`` device queries answer "cpu",
collectives come from the fake process group (which returns without touching data).

What it cannot see: allocator fragmentation and reserved memory, the CUDA context, NCCL
buffers, Transformer Engine's own kernels (LayerNormLinear, fused RoPE, FP8 caches), context
parallel ring buffers (the local spec has no CP attention: CP rows measure the local sequence).

    pip install '.[truth]'            # torch (CPU wheel: torch==2.13.0) and megatron-core==0.16.1
    python benchmarks/memory_truth.py --model llama3-8b --tp 2 --seq-len 8192
    python benchmarks/memory_truth.py --matrix            # regenerates benchmarks/memory_truth.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
warnings.filterwarnings("ignore")

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from benchmarks.memory_truth_cases import Case, resolved_case, tunecp_figures
from tune_cp.config.specs import (
    ModelSpec,
    ParallelConfig,
    PipelineSplit,
    Recompute,
    RecomputeMethod,
)
from tune_cp.oracle import memory as M
from tune_cp.oracle.params import padded_vocab_size

JSON_PATH = ROOT / "benchmarks" / "memory_truth.json"
KERNEL_SET = (
    "rmsnorm: fused stand-in saving input (bf16) + fp32 rstd per token; "
    "attention: flash stand-in saving q, k, v, out, fp32 lse; "
    "swiglu: Megatron-Core fused_bias_swiglu.SwiGLUFunction (bias_activation_fusion, jit off); "
    "linear: Megatron-Core local ColumnParallelLinear/RowParallelLinear; rope: unfused "
    "(megatron.core apply_rotary_pos_emb); moe: SequentialMLP experts, alltoall dispatcher"
)
BF16 = torch.bfloat16


# ====================================================================== kernel stand-ins


class _RMSNormFn(torch.autograd.Function):
    """RMSNorm that saves what the fused kernels save: the input and an fp32 rstd per row."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        if is_fake(x):  # a fused kernel allocates only its outputs
            y = torch.empty_like(x)
            rstd = x.new_empty(x.shape[:-1] + (1,), dtype=torch.float32)
        else:
            xf = x.float()
            rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            y = (xf * rstd).to(x.dtype) * weight
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, weight, rstd = ctx.saved_tensors
        if is_fake(x):
            return torch.empty_like(x), torch.empty_like(weight), None
        xf = x.float()
        xhat = xf * rstd
        g = gy.float() * weight.float()
        gw = (gy.float() * xhat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        gx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        return gx.to(x.dtype), gw, None


class FusedRMSNormStandIn(torch.nn.Module):
    """Megatron-compatible norm module (``LNImpl`` signature) around :class:`_RMSNormFn`; for
    LayerNorm models it falls back to torch's LayerNorm (none in the matrix)."""

    def __init__(self, config, hidden_size, eps=1e-5, persist_layer_norm=False,
                 zero_centered_gamma=False, normalization="RMSNorm"):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = config.sequence_parallel
        self.weight.sequence_parallel = config.sequence_parallel

    def forward(self, x):
        return _RMSNormFn.apply(x, self.weight, self.eps)


class _FlashFn(torch.autograd.Function):
    """Causal attention that saves q, k, v, out and an fp32 log-sum-exp (flash attention's
    saved set); backward recomputes the probabilities from them."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        # q [s, b, hq, d], k/v [s, b, hkv, d] (GQA: hq a multiple of hkv)
        if is_fake(q):  # flash attention allocates out and lse, nothing of size s^2
            s, b, hq, _ = q.shape
            out = q.new_empty((s, b, hq, v.shape[-1]))
            lse = q.new_empty((b, hq, s), dtype=torch.float32)
        else:
            out, lse = _attn_math(q, k, v, scale)
        ctx.scale = scale
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, gout):
        q, k, v, out, lse = ctx.saved_tensors
        if is_fake(q):
            # flash-attn 2 backward: fp32 dq accumulator and softmax_d, then dq, dk, dv
            s, b, hq, d = q.shape
            _acc = q.new_empty((s, b, hq, d), dtype=torch.float32)
            _sd = q.new_empty((b, hq, s), dtype=torch.float32)
            gq, gk, gv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            del _acc, _sd
            return gq, gk, gv, None
        with torch.enable_grad():
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            o, _ = _attn_math(qq, kk, vv, ctx.scale)
            gq, gk, gv = torch.autograd.grad(o, (qq, kk, vv), gout)
        return gq, gk, gv, None


def _attn_math(q, k, v, scale):
    s, b, hq, d = q.shape
    hkv = k.shape[2]
    rep = hq // hkv
    qh = q.permute(1, 2, 0, 3).float()  # b hq s d
    kh = k.permute(1, 2, 0, 3).float().repeat_interleave(rep, 1)
    vh = v.permute(1, 2, 0, 3).float().repeat_interleave(rep, 1)
    scores = qh @ kh.transpose(-1, -2) * scale
    sk = kh.shape[2]
    mask = torch.ones(s, sk, dtype=torch.bool, device=q.device).tril(sk - s)
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, -1)  # b hq s, fp32
    p = torch.exp(scores - lse.unsqueeze(-1))
    o = (p @ vh).to(q.dtype).permute(2, 0, 1, 3)  # s b hq dv
    return o.contiguous(), lse


class FlashAttentionStandIn(torch.nn.Module):
    """``core_attention`` with Megatron's ``DotProductAttention`` signature."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type,
                 attention_dropout=None, softmax_scale=None, cp_comm_type=None,
                 pg_collection=None, **_):
        super().__init__()
        self.config = config
        self.softmax_scale = softmax_scale

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None, **_):
        d = query.shape[-1]
        scale = self.softmax_scale or d ** -0.5
        out = _FlashFn.apply(query, key, value, scale)
        s, b = out.shape[:2]
        return out.reshape(s, b, -1)


def check_stand_ins() -> dict[str, float]:
    """Largest relative difference of each stand-in (forward and gradients) against the
    reference op, in fp32 on real CPU tensors."""
    g = torch.Generator().manual_seed(0)
    res = {}
    x = torch.randn(6, 2, 32, generator=g, requires_grad=True)
    w = torch.randn(32, generator=g, requires_grad=True)
    y = _RMSNormFn.apply(x, w, 1e-5)
    gy = torch.randn_like(y)
    ga = torch.autograd.grad(y, (x, w), gy)
    yr = F.rms_norm(x, (32,), w, 1e-5)
    gr = torch.autograd.grad(yr, (x, w), gy)
    res["rmsnorm"] = max(_rel(y, yr), *(_rel(a, b) for a, b in zip(ga, gr, strict=True)))
    q = torch.randn(16, 2, 4, 8, generator=g, requires_grad=True)
    k = torch.randn(16, 2, 2, 8, generator=g, requires_grad=True)
    v = torch.randn(16, 2, 2, 8, generator=g, requires_grad=True)
    o = _FlashFn.apply(q, k, v, 8 ** -0.5)
    go = torch.randn_like(o)
    ga = torch.autograd.grad(o, (q, k, v), go)
    qr, kr, vr = (t.permute(1, 2, 0, 3) for t in (q, k, v))
    orf = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True, enable_gqa=True)
    orf = orf.permute(2, 0, 1, 3)
    gr = torch.autograd.grad(orf, (q, k, v), go)
    res["flash_attention"] = max(_rel(o, orf), *(_rel(a, b) for a, b in zip(ga, gr, strict=True)))
    from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl

    z = torch.randn(6, 2, 16, generator=g, requires_grad=True)
    s1 = bias_swiglu_impl(z, None)
    gs = torch.randn_like(s1)
    g1 = torch.autograd.grad(s1, z, gs)[0]
    a, b = z.chunk(2, -1)
    s2 = F.silu(a) * b
    g2 = torch.autograd.grad(s2, z, gs)[0]
    res["swiglu"] = max(_rel(s1, s2), _rel(g1, g2))
    return res


def _rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


# ============================================================================ tracking


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class LiveTracker(TorchDispatchMode):
    """Follows every storage an op creates until it is freed: current and peak live bytes, and
    the label (phase / module) current at the peak."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.cur = 0
        self.peak = 0
        self.peak_at = ""
        self.label = "start"
        self._refs: dict[int, object] = {}
        self.by_label: dict[str, int] = {}
        self.meta: dict[int, tuple] = {}
        self.at_peak: list[int] = []

    def print_peak(self, base_keys: set[int]) -> None:
        """The storages alive at the peak that were not alive before the step, largest first."""
        rows = [(self.live.get(k) or 0, self.meta.get(k)) for k in self.at_peak if k not in base_keys]
        groups: dict[tuple, list[int]] = {}
        for k in self.at_peak:
            if k in base_keys or k not in self.meta:
                continue
            groups.setdefault(self.meta[k], []).append(k)
        del rows
        out = []
        for meta, ks in groups.items():
            out.append((len(ks), meta))
        for n, (op, shape, dtype, label) in sorted(out, key=lambda r: -_numel(r[1][1]) * r[0])[:40]:
            print(f"   peak: {n} x {op:<40} {shape} {dtype} [{label}]")

    def adopt(self, t: torch.Tensor, op: str = "") -> None:
        st = t.untyped_storage()
        k = st._cdata
        if k in self.live:
            return
        n = st.nbytes()
        self.live[k] = n
        self.cur += n
        self._refs[k] = weakref.ref(st, lambda _r, k=k: self._free(k))
        if PEAK_LIST:  # TRUTH_PEAK=1: which tensors are alive at the peak (debugging aid)
            self.meta[k] = (op, tuple(t.shape), str(t.dtype).replace("torch.", ""), self.label)
        if self.cur > self.peak:
            self.peak, self.peak_at = self.cur, self.label
            if PEAK_LIST:
                self.at_peak = list(self.live)
        if self.cur > self.by_label.get(self.label, 0):
            self.by_label[self.label] = self.cur

    def _free(self, k: int) -> None:
        n = self.live.pop(k, None)
        self._refs.pop(k, None)
        if n is not None:
            self.cur -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.adopt(t, str(func))
        return out


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


PEAK_LIST = bool(os.environ.get("TRUTH_PEAK"))


@dataclass
class SavedCounter:
    """``saved_tensors_hooks`` pack hook: storage-deduplicated bytes per region label."""

    exclude: set[int]
    region: str = "other"
    active: bool = True
    seen: dict[int, str] = field(default_factory=dict)
    bytes_by: dict[str, int] = field(default_factory=dict)
    _refs: dict[int, object] = field(default_factory=dict)

    def pack(self, t):
        if isinstance(t, torch.Tensor) and self.active:
            st = t.untyped_storage()
            k = st._cdata
            if k not in self.exclude and k not in self.seen:
                if os.environ.get("TRUTH_LIST"):
                    print(f"   saved {self.region:<12} {tuple(t.shape)} {t.dtype} {st.nbytes():,}")
                self.seen[k] = self.region
                self.bytes_by[self.region] = self.bytes_by.get(self.region, 0) + st.nbytes()
                # a storage freed during the forward (a saved tensor of a graph branch that
                # dies, e.g. the router's) gives its key back to the allocator: forget it, so a
                # later storage at the same address is counted (it stays counted itself)
                self._refs[k] = weakref.ref(st, lambda _r, k=k: self._forget(k))
        return t

    def _forget(self, k: int) -> None:
        self.seen.pop(k, None)
        self._refs.pop(k, None)

    @staticmethod
    def unpack(t):
        return t


# ============================================================================== shims


def _wgrad_accum(total_input, grad_output, main_grad):
    """Stand-in for APEX's ``fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_*`` (Megatron's
    ``gradient_accumulation_fusion``): the weight gradient GEMM accumulates straight into
    ``main_grad`` and allocates nothing."""
    if is_fake(main_grad):
        return
    g = grad_output.reshape(-1, grad_output.shape[-1])
    x = total_input.reshape(-1, total_input.shape[-1])
    main_grad.add_((g.t().float() @ x.float()).to(main_grad.dtype))


def install_fused_kernels() -> None:
    """The fused GPU kernels' allocation behaviour on fake tensors: the weight-gradient GEMM
    accumulating into ``main_grad`` (module ``fused_weight_gradient_mlp_cuda``), and Megatron's
    jit-fused SwiGLU forward/backward (``fused_bias_swiglu.swiglu`` / ``swiglu_back`` and the
    weighted variants) allocating only their outputs. Real tensors take the reference math."""
    from megatron.core.fusions import fused_bias_swiglu as fs

    ref = {n: getattr(fs, n) for n in ("swiglu", "swiglu_back", "weighted_swiglu",
                                       "weighted_swiglu_back")}

    def half(y):
        return y.new_empty(y.shape[:-1] + (y.shape[-1] // 2,))

    fs.swiglu = lambda y: half(y) if is_fake(y) else ref["swiglu"](y)
    fs.swiglu_back = lambda g, y: torch.empty_like(y) if is_fake(y) else ref["swiglu_back"](g, y)
    fs.weighted_swiglu = (lambda y, w: half(y) if is_fake(y) else ref["weighted_swiglu"](y, w))
    fs.weighted_swiglu_back = (
        lambda g, y, w: (torch.empty_like(y), torch.empty_like(w)) if is_fake(y)
        else ref["weighted_swiglu_back"](g, y, w))


def install_shims(fused: bool = True) -> None:
    """CUDA device queries answer "cpu", ``Tensor.type()`` names the CUDA type, ``.cuda()``
    keeps a tensor where it is, pinned host memory is plain host memory; synchronisation, side
    streams and CUDA RNG state are no-ops; ``all_gather_object`` (used to agree on
    parameter-group names) hands every rank this rank's object. Nothing here allocates or
    changes a shape. With ``fused`` the fused kernels of :func:`install_fused_kernels` too."""
    if fused:  # before Megatron-Core looks for the extension at import
        import types

        mod = types.ModuleType("fused_weight_gradient_mlp_cuda")
        mod.wgrad_gemm_accum_fp32 = _wgrad_accum
        mod.wgrad_gemm_accum_fp16 = _wgrad_accum
        sys.modules["fused_weight_gradient_mlp_cuda"] = mod
        layers = sys.modules.get("megatron.core.tensor_parallel.layers")
        if layers is not None:  # imported before the shim (a test session): tell it too
            layers.fused_weight_gradient_mlp_cuda = mod
            layers._grad_accum_fusion_available = True
    import megatron.core.jit as mjit
    import megatron.core.transformer.multi_latent_attention as mla

    mjit.disable_jit_fuser()
    if not isinstance(mla.TELinear, type):  # TE's extension imports without TE, its classes None
        mla.HAVE_TE = False
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    torch.cuda.device_count = lambda: 1  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.is_available = lambda: False  # type: ignore[assignment]

    class _Stream:  # side streams (shared experts, the dispatcher's D2H copies) run inline
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, *a, **k):
            pass

        def synchronize(self):
            pass

        def record_event(self, *a, **k):
            return None

    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()  # type: ignore
    torch.cuda.set_rng_state = lambda *a, **k: None  # type: ignore[assignment]
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    tensor_fn = torch.tensor

    def tensor(*a, pin_memory=False, **k):  # pinned host memory needs a GPU driver
        return tensor_fn(*a, **k)

    torch.tensor = tensor  # type: ignore[assignment]
    torch.cuda.Stream = _Stream  # type: ignore[assignment,misc]
    torch.cuda.current_stream = lambda *a, **k: _Stream()  # type: ignore[assignment]
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment]
    torch.Tensor.record_stream = lambda self, *a, **k: None  # type: ignore[method-assign]
    orig_type = torch.Tensor.type

    def tensor_type(self, *args, **kwargs):
        # Megatron asks ``param.type() == 'torch.cuda.BFloat16Tensor'``: answer as on a GPU
        name = orig_type(self, *args, **kwargs)
        if args or kwargs or not isinstance(name, str) or ".cuda." in name:
            return name
        return name.replace("torch.", "torch.cuda.", 1)

    torch.Tensor.type = tensor_type  # type: ignore[method-assign]
    import torch.distributed as dist

    def all_gather_object(object_list, obj, group=None):
        # every rank of a symmetric layout holds the same object (fake group: nothing moves)
        for i in range(len(object_list)):
            object_list[i] = obj

    dist.all_gather_object = all_gather_object
    from megatron.core.tensor_parallel import random as mrandom

    # the model-parallel RNG fork only changes which random numbers dropout draws; the
    # checkpoint's CUDA RNG save/restore becomes the CPU generator's
    mrandom.CudaRNGStatesTracker.fork = lambda self, *a, **k: contextlib.nullcontext()
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda *a, **k: None
    mrandom.CudaRNGStatesTracker.get_states = lambda self: {}
    mrandom.CudaRNGStatesTracker.set_states = lambda self, states: None
    from megatron.core.transformer.moe import moe_utils

    # Megatron-Core 0.16.1 names te_general_gemm without defining it when Transformer Engine is
    # absent; None selects its own torch.mm path
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    from megatron.core.transformer.moe import experts as mexperts

    seq_forward = mexperts.SequentialMLP.forward

    def sequential_forward(self, permuted_local_hidden_states, tokens_per_expert, *a, **k):
        # capacity-padded dispatch: every local expert holds the same number of rows, so the
        # host-side count Megatron reads with .tolist() is that number (a fake tensor has none)
        if is_fake(tokens_per_expert):
            n = permuted_local_hidden_states.shape[0] // self.num_local_experts
            with torch._subclasses.fake_tensor.unset_fake_temporarily():
                tokens_per_expert = torch.full((self.num_local_experts,), n, dtype=torch.long)
        return seq_forward(self, permuted_local_hidden_states, tokens_per_expert, *a, **k)

    mexperts.SequentialMLP.forward = sequential_forward
    if fused:
        install_fused_kernels()


_PG_WORLD: int | None = None


def init_groups(world: int, rank: int, tp: int, pp: int, vpp: int, cp: int, ep: int, etp: int):
    """Fake process group of ``world`` ranks and Megatron's parallel state on it."""
    global _PG_WORLD
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        ps.destroy_model_parallel()
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    _PG_WORLD = world
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        context_parallel_size=cp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
        create_gloo_process_groups=False,
    )


# ======================================================================= model building


def transformer_config(m: ModelSpec, cfg: ParallelConfig, num_layers: int, seq_len: int,
                       stage_pp: int, vpp: int, split: PipelineSplit, unfused_swiglu: bool,
                       capacity_factor: float | None = None):
    from megatron.core.transformer.transformer_config import (
        MLATransformerConfig,
        TransformerConfig,
    )

    kw = dict(
        num_layers=num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size or m.expert_ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_kv_heads,
        kv_channels=m.head_dim,
        normalization="RMSNorm",
        gated_linear_unit=m.gated_mlp,
        activation_func=F.silu,
        bias_activation_fusion=not unfused_swiglu,
        add_bias_linear=False,
        add_qkv_bias=m.qkv_bias,
        qk_layernorm=m.qk_norm or m.mla is not None,  # MLA: its q / kv latent norms
        attention_dropout=0.0,
        hidden_dropout=0.0,
        bf16=True,
        params_dtype=BF16,
        tensor_model_parallel_size=cfg.tp,
        pipeline_model_parallel_size=stage_pp,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        context_parallel_size=cfg.cp,
        expert_model_parallel_size=cfg.ep,
        expert_tensor_parallel_size=cfg.etp_,
        sequence_parallel=cfg.sp,
        use_cpu_initialization=True,
        perform_initialization=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=not unfused_swiglu,
        persist_layer_norm=False,
        pipeline_dtype=BF16,
        variable_seq_lengths=False,
        cross_entropy_loss_fusion=False,
    )
    if cfg.recompute is Recompute.FULL:
        k = cfg.recompute_layers if cfg.recompute_layers is not None else num_layers
        kw.update(recompute_granularity="full", recompute_method=cfg.recompute_method.value,
                  recompute_num_layers=min(k, num_layers))
    elif cfg.recompute is Recompute.SELECTIVE:
        kw.update(recompute_granularity="selective", recompute_modules=list(cfg.recompute_modules))
    if split is PipelineSplit.EMBEDDING_LOSS and stage_pp > 1:
        kw.update(account_for_embedding_in_pipeline_split=True,
                  account_for_loss_in_pipeline_split=True)
    elif split is PipelineSplit.LAYOUT and stage_pp > 1:
        kw["pipeline_model_parallel_layout"] = cfg.pipeline_layout
    elif split is PipelineSplit.EMBEDDING_MTP_LOSS and stage_pp > 1:
        kw["pipeline_model_parallel_layout"] = M.split_layout(
            num_layers, m.num_mtp_layers, stage_pp, vpp, split)
    elif split not in (PipelineSplit.EVEN, PipelineSplit.EMBEDDING_LOSS) and stage_pp > 1:
        # uneven and the light splits: the end stages' counts as Megatron-LM's
        # --decoder-first/last-pipeline-num-layers (tune-cp derives the light ones)
        first, last = M.uneven_stage_layers(num_layers, stage_pp, vpp, split,
                                            cfg.first_stage_layers, cfg.last_stage_layers)
        kw.update(num_layers_in_first_pipeline_stage=first,
                  num_layers_in_last_pipeline_stage=last)
    if m.is_moe:
        kw.update(
            num_moe_experts=m.num_experts,
            moe_router_topk=m.moe_top_k,
            moe_ffn_hidden_size=m.expert_ffn_hidden_size,
            moe_token_dispatcher_type="alltoall",
            moe_grouped_gemm=False,
            moe_aux_loss_coeff=0.0,
            moe_router_load_balancing_type="none",
            moe_permute_fusion=False,
            # balanced routing with static shapes: every expert gets exactly t k / E tokens
            # (FakeTensorMode cannot follow data-dependent token counts); a token-drop case
            # pads every expert to its capacity factor instead
            moe_expert_capacity_factor=capacity_factor or 1.0,
            moe_pad_expert_input_to_capacity=True,
        )
        if m.num_dense_layers:
            kw["moe_layer_freq"] = [0] * m.num_dense_layers + [1] * (m.num_layers - m.num_dense_layers)
        if m.num_shared_experts:
            kw["moe_shared_expert_intermediate_size"] = (
                m.num_shared_experts * m.shared_expert_ffn_hidden_size)
        if m.router_expert_bias:
            kw["moe_router_enable_expert_bias"] = True
            kw["moe_router_score_function"] = "sigmoid"
    if m.num_mtp_layers:
        kw["mtp_num_layers"] = m.num_mtp_layers
    if m.mla is not None:
        a = m.mla
        kw.update(
            q_lora_rank=a.q_lora_rank or None,
            kv_lora_rank=a.kv_lora_rank,
            qk_head_dim=a.qk_nope_head_dim,
            qk_pos_emb_head_dim=a.qk_rope_head_dim,
            v_head_dim=a.v_head_dim,
            rope_type="rope",
            multi_latent_attention=True,
        )
        kw.pop("kv_channels")
        kw["num_query_groups"] = m.num_attention_heads
        return MLATransformerConfig(**kw)
    return TransformerConfig(**kw)


def layer_spec(m: ModelSpec, torch_norm: bool):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(
        # MLA's q / kv latent RMSNorms (DeepSeek-V3 has them; the local spec builds them only
        # with qk_layernorm)
        num_experts=m.num_experts or None, qk_layernorm=m.qk_norm or m.mla is not None,
        multi_latent_attention=m.mla is not None, normalization="RMSNorm")
    _swap(spec, torch_norm)
    return spec


def _swap(spec, torch_norm: bool) -> None:
    """Replace the local spec's norm and core attention with the kernel stand-ins, in place."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    sub = getattr(spec, "submodules", None)
    if sub is None:
        return
    for name in list(vars(sub)):
        v = getattr(sub, name)
        if v is DotProductAttention:
            setattr(sub, name, FlashAttentionStandIn)
        elif v is WrappedTorchNorm and not torch_norm:
            setattr(sub, name, FusedRMSNormStandIn)
        elif hasattr(v, "submodules") or hasattr(v, "module"):
            _swap(v, torch_norm)
        elif isinstance(v, list):
            for x in v:
                _swap(x, torch_norm)


def block_spec(m: ModelSpec, config, torch_norm: bool, vp_stage, pp_rank):
    """Decoder block spec: dense layers for the model's dense prefix, MoE layers after."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    if m.is_moe and m.num_dense_layers:
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                          normalization="RMSNorm", vp_stage=vp_stage,
                                          pp_rank=pp_rank)
        _swap(spec, torch_norm)
        for ls in spec.layer_specs:
            _swap(ls, torch_norm)
        if not torch_norm:
            spec.layer_norm = FusedRMSNormStandIn
        return spec
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    ls = layer_spec(m, torch_norm)
    n = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    return TransformerBlockSubmodules(
        layer_specs=[ls] * n, layer_norm=WrappedTorchNorm if torch_norm else FusedRMSNormStandIn)


def build_gpt(m: ModelSpec, config, pre: bool, post: bool, torch_norm: bool, vp_stage=None,
              pp_rank=None):
    from megatron.core.models.gpt import GPTModel

    spec = block_spec(m, config, torch_norm, vp_stage, pp_rank)
    mtp_spec = None
    # MTP where Megatron-Core builds it: the last stage, or under a layout the virtual stage
    # with the ``m`` (get_gpt_mtp_block_spec returns None elsewhere)
    if m.num_mtp_layers and (post or config.pipeline_model_parallel_layout is not None):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

        mtp_spec = get_gpt_mtp_block_spec(config, layer_spec(m, torch_norm),
                                          use_transformer_engine=False, vp_stage=vp_stage)
        # the block spec is a submodules dataclass: swap inside each MTP layer's spec (its
        # enorm, hnorm and final norm; torch's RMSNorm would make them fp32 parameters, where
        # Transformer Engine's norms and Megatron-LM's Float16Module give bf16 ones)
        for ls in getattr(mtp_spec, "layer_specs", None) or []:
            _swap(ls, torch_norm)
    return GPTModel(
        config=config, transformer_layer_spec=spec,
        # Megatron-LM pads the vocabulary to a multiple of 128 x tp before building the model
        # (megatron/training/tokenizer ``_vocab_size_with_padding``)
        vocab_size=padded_vocab_size(m.vocab_size, config.tensor_model_parallel_size),
        max_sequence_length=max(m.default_seq_len, 4096),
        pre_process=pre, post_process=post,
        share_embeddings_and_output_weights=m.tied_embeddings,
        position_embedding_type="rope" if m.mla is None else "none",
        mtp_block_spec=mtp_spec, vp_stage=vp_stage,
    )


def wrap_ddp_optimizer(config, chunks, distributed_optimizer: bool, grad_fp32: bool):
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp_cfg = DistributedDataParallelConfig(
        grad_reduce_in_fp32=grad_fp32, overlap_grad_reduce=False,
        use_distributed_optimizer=distributed_optimizer)
    wrapped = [DistributedDataParallel(config, ddp_cfg, c, disable_bucketing=i > 0)
               for i, c in enumerate(chunks)]
    opt_cfg = OptimizerConfig(optimizer="adam", lr=1e-4, bf16=True, params_dtype=BF16,
                              use_distributed_optimizer=distributed_optimizer,
                              clip_grad=0.0)
    opt = get_megatron_optimizer(opt_cfg, wrapped, use_gloo_process_groups=False)
    return wrapped, opt


# ============================================================================ measuring


def tensor_bytes(ts) -> int:
    seen, n = set(), 0
    for t in ts:
        if t is None:
            continue
        st = t.untyped_storage()
        if st._cdata not in seen:
            seen.add(st._cdata)
            n += st.nbytes()
    return n


def optimizer_bytes(opt) -> tuple[int, int]:
    """(fp32 master-shard bytes, Adam state bytes) of a Megatron (chained) optimizer."""
    opts = getattr(opt, "chained_optimizers", [opt])
    master, state = [], []
    for o in opts:
        for grp in getattr(o, "shard_fp32_from_float16_groups", []) or []:
            master += list(grp)
        for grp in getattr(o, "shard_fp32_groups", []) or []:
            master += list(grp)
        for grp in getattr(o, "fp32_from_float16_groups", []) or []:  # without sharding
            master += list(grp)
        inner = o.optimizer
        for st in inner.state.values():
            state += [v for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    return tensor_bytes(master), tensor_bytes(state)


def rank_of(cfg: ParallelConfig, world: int, stage: int) -> int:
    """Global rank of (tp 0, cp 0, dp 0, stage) in Megatron's default order tp-cp-ep-dp-pp."""
    return stage * (world // cfg.pp)


def stage_setup(c: Case, opts):
    """The case resolved, Megatron-Core's process groups set up as the case's stage rank sees
    them, and the TransformerConfig of the case: what every whole-stage measurement starts with."""
    m, cluster, training, cfg = resolved_case(c)
    world = cluster.world_size
    init_groups(world, rank_of(cfg, world, c.stage), cfg.tp, cfg.pp, cfg.vpp, cfg.cp, cfg.ep,
                cfg.etp_)
    config = transformer_config(m, cfg, m.num_layers, training.seq_len, cfg.pp, cfg.vpp,
                                cfg.pipeline_split, opts.unfused_swiglu, c.capacity_factor)
    return m, cluster, training, cfg, config


def measure_model_state(c: Case, opts) -> dict:
    """Parameters, gradient buffer and optimizer of the whole stage, as Megatron places it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    m, cluster, training, cfg, config = stage_setup(c, opts)
    from megatron.core import parallel_state as ps

    with FakeTensorMode(allow_non_fake_inputs=True):
        chunks = []
        for j in range(cfg.vpp):
            vp = j if cfg.vpp > 1 else None
            pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp)
            post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp)
            chunks.append(build_gpt(m, config, pre, post, opts.torch_norm, vp_stage=vp))
        layers = sum(len(ch.decoder.layers) for ch in chunks)
        # per local chunk: the global numbers of its decoder layers (Megatron's
        # get_transformer_layer_offset + 1 ...), MTP layers, embedding, output layer
        per_chunk = [dict(layers=[int(ly.layer_number) for ly in ch.decoder.layers],
                          mtp=len(ch.mtp.layers) if getattr(ch, "mtp", None) is not None else 0,
                          embedding=hasattr(ch, "embedding"),
                          output=hasattr(ch, "output_layer")) for ch in chunks]
        wrapped, opt = wrap_ddp_optimizer(config, chunks, cfg.distributed_optimizer,
                                          cfg.grad_reduce_in_fp32)
        params = [p for ch in chunks for p in ch.parameters()]
        weights = tensor_bytes(params) if not cfg.distributed_optimizer else sum(
            tensor_bytes([b.param_data for b in w.buffers + w.expert_parallel_buffers])
            for w in wrapped)
        grads = sum(tensor_bytes([b.grad_data for b in w.buffers + w.expert_parallel_buffers])
                    for w in wrapped)
        for p in params:
            p.main_grad.zero_()
        # Megatron's own grad copy into the fp32 main shards, then the inner Adam step that
        # creates exp_avg / exp_avg_sq (the grad-norm and clipping of opt.step() read values)
        for o in getattr(opt, "chained_optimizers", [opt]):
            o._copy_model_grads_to_main_grads()
            o.optimizer.step()
        master, state = optimizer_bytes(opt)
    return dict(decoder_layers=layers, weights=weights, gradients=grads,
                optimizer=master + state, params=sum(p.numel() for p in params),
                per_chunk=per_chunk)


def measure_activations(c: Case, opts) -> dict:
    """One micro-batch through a small build of the stage: one layer of each kind (plus the
    embedding / output side / MTP when the stage holds them)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    m, cluster, training, cfg = resolved_case(c)
    stages = M.stage_counts(m, cfg)
    sc = stages[c.stage]
    world = cluster.world_size
    # a single pipeline stage of Megatron's own (pp 1 in the build; pre/post as the stage)
    init_groups(world // cfg.pp, 0, cfg.tp, 1, 1, cfg.cp, cfg.ep, cfg.etp_)
    kinds = []
    if sc.dense_layers:
        kinds.append("dense")
    if sc.moe_layers:
        kinds.append("moe")
    mm = m
    if m.is_moe and "dense" in kinds:
        mm = m.model_copy(update={"num_dense_layers": 1, "num_layers": len(kinds)})
    elif m.is_moe:
        mm = m.model_copy(update={"num_dense_layers": 0, "num_layers": 1})
    else:
        mm = m.model_copy(update={"num_layers": 1})
    if not sc.has_output:
        mm = mm.model_copy(update={"num_mtp_layers": 0})
    cfg1 = cfg.model_copy(update={"pp": 1, "vpp": 1})
    if cfg.recompute is Recompute.FULL:  # the small build checkpoints each of its layers
        cfg1 = cfg1.model_copy(update={"recompute_method": RecomputeMethod.UNIFORM,
                                       "recompute_layers": 1})
    config = transformer_config(mm, cfg1, mm.num_layers, training.seq_len, 1, 1,
                                PipelineSplit.EVEN, opts.unfused_swiglu, c.capacity_factor)
    pre, post = bool(sc.has_embedding), bool(sc.has_output)
    s_loc = c.mbs * training.seq_len // cfg.cp
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = build_gpt(mm, config, pre, post, opts.torch_norm)
        wrapped, _ = wrap_ddp_optimizer(config, [model], cfg.distributed_optimizer,
                                        cfg.grad_reduce_in_fp32)
        exclude = set()
        for p in model.parameters():
            exclude.add(_key(p))
        for w in wrapped:
            for b in w.buffers + w.expert_parallel_buffers:
                exclude.add(_key(b.grad_data))
                if b.param_data is not None:
                    exclude.add(_key(b.param_data))
        counter = SavedCounter(exclude)
        tracker = LiveTracker()
        hooks = []
        for layer in model.decoder.layers:
            kind = "moe" if type(layer.mlp).__name__ == "MoELayer" else "dense"
            hooks.append(_region_hooks(layer, f"layer_{kind}", counter, tracker))
        if post:
            inner_loss = model.compute_language_model_loss

            def labelled_loss(*a, **k):
                prev, tracker.label = tracker.label, "forward:loss"
                try:
                    return inner_loss(*a, **k)
                finally:
                    tracker.label = prev

            model.compute_language_model_loss = labelled_loss
        # full recompute: Megatron's checkpoint saves each group's input in the block,
        # outside the layers' own forward
        hooks.append(_region_hooks(model.decoder, "checkpoint", counter, tracker))
        if pre:
            hooks.append(_region_hooks(model.embedding, "embedding", counter, tracker))
        if post:
            hooks.append(_region_hooks(model.decoder.final_layernorm, "output", counter, tracker))
            hooks.append(_region_hooks(model.output_layer, "output", counter, tracker))
            if getattr(model, "mtp", None) is not None:
                hooks.append(_region_hooks(model.mtp, "mtp", counter, tracker))
        seq = training.seq_len // cfg.cp
        b = c.mbs
        tokens = torch.zeros(b, seq, dtype=torch.long)
        pos = torch.arange(seq).unsqueeze(0).expand(b, -1)
        labels = torch.zeros(b, seq, dtype=torch.long)
        hidden = None
        if not pre:
            s_in = seq // cfg.tp if cfg.sp else seq
            hidden = torch.zeros(s_in, b, m.hidden_size, dtype=BF16, requires_grad=True)
            model.set_input_tensor(hidden)
        # everything alive before the step: model state (parameters, grads, DDP buffers)
        tracker.live = {}
        tracker.cur = 0
        for p in model.parameters():
            tracker.adopt(p)
        for w in wrapped:
            for bb in w.buffers + w.expert_parallel_buffers:
                tracker.adopt(bb.grad_data)
                if bb.param_data is not None:
                    tracker.adopt(bb.param_data)
        if hidden is not None:
            tracker.adopt(hidden)
        base = tracker.cur
        base_keys = set(tracker.live)
        tracker.peak = base
        tracker.by_label = {}
        with tracker, torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
            tracker.label = "forward"
            out = model(tokens, pos, None, labels=labels if post else None)
            tracker.label = "after forward"
            if post:
                loss = out.float().sum()
            else:
                loss = out.float().sum()
            fwd_peak, fwd_at = tracker.peak, tracker.peak_at
            tracker.label = "backward"
            counter.active = False  # what backward saves (recomputation) is not a stored activation
            loss.backward()
            tracker.label = "after backward"
        for h in hooks:
            for x in h:
                x.remove()
        if PEAK_LIST:
            tracker.print_peak(base_keys)
        del loss, out
    n_dense = 1 if "dense" in kinds else 0
    return dict(
        kinds=kinds, saved=counter.bytes_by, peak=tracker.peak - base,
        peak_at=tracker.peak_at, forward_peak=fwd_peak - base, forward_peak_at=fwd_at,
        model_state=base, tokens_local=s_loc,
        peak_by_phase={k: v - base for k, v in tracker.by_label.items()}, n_dense=n_dense,
        n_moe=1 if "moe" in kinds else 0, built=dict(pre=pre, post=post,
        mtp=int(bool(getattr(model, "mtp", None)))))


def measure_chunk(c: Case, opts) -> dict:
    """The bytes saved for backward by one micro-batch through one model chunk of the stage
    (``c.chunk``), built as Megatron builds it in the pipeline (the case's own split, layout
    included), with the tensor it receives from the previous virtual stage: the hidden states,
    or after a standalone MTP stage the main and MTP hidden states concatenated (Megatron-Core
    ``GPTModel._postprocess`` returns ``cat`` there, and the loss chunk splits it again)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    m, cluster, training, cfg, config = stage_setup(c, opts)
    from megatron.core import parallel_state as ps

    vp = c.chunk if cfg.vpp > 1 else None
    first, last, layout = M.split_fields(cfg)
    flat = sorted((ch for st in M.pipeline_chunks(m.num_layers, m.num_mtp_layers, cfg.pp, cfg.vpp,
                                                  cfg.pipeline_split, first, last, layout)
                   for ch in st), key=lambda ch: ch.virtual_stage)
    v = c.chunk * cfg.pp + c.stage
    after_mtp = v > 0 and flat[v - 1].mtp_layers > 0 and not flat[v - 1].has_output
    with FakeTensorMode(allow_non_fake_inputs=True):
        pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp)
        post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp)
        model = build_gpt(m, config, pre, post, opts.torch_norm, vp_stage=vp)
        wrapped, _ = wrap_ddp_optimizer(config, [model], cfg.distributed_optimizer,
                                        cfg.grad_reduce_in_fp32)
        exclude = {_key(p) for p in model.parameters()}
        for w in wrapped:
            for b in w.buffers + w.expert_parallel_buffers:
                exclude.add(_key(b.grad_data))
                if b.param_data is not None:
                    exclude.add(_key(b.param_data))
        counter = SavedCounter(exclude)
        tracker = LiveTracker()
        hooks = [_region_hooks(ly, "layers", counter, tracker) for ly in model.decoder.layers]
        if getattr(model, "mtp", None) is not None:
            hooks.append(_region_hooks(model.mtp, "mtp", counter, tracker))
        seq, b = training.seq_len // cfg.cp, c.mbs
        tokens = torch.zeros(b, seq, dtype=torch.long)
        pos = torch.arange(seq).unsqueeze(0).expand(b, -1)
        labels = torch.zeros(b, seq, dtype=torch.long)
        if not pre:
            s_in = (seq // cfg.tp if cfg.sp else seq) * (1 + m.num_mtp_layers if after_mtp else 1)
            hidden = torch.zeros(s_in, b, m.hidden_size, dtype=BF16, requires_grad=True)
            model.set_input_tensor(hidden)
        # under the tracker as in measure_activations (a dispatch mode: the torch.compile'd
        # router helpers run eagerly on the fake tensors)
        with tracker, torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
            out = model(tokens, pos, None, labels=labels if post else None)
            loss = out.float().sum()
            counter.active = False
            loss.backward()
        for h in hooks:
            for x in h:
                x.remove()
        del loss, out
    return dict(saved=counter.bytes_by, received_concat=after_mtp, pre=pre, post=post)


def _region_hooks(mod, name, counter: SavedCounter, tracker: LiveTracker):
    state = {}

    def pre(_m, _a, _k=None):
        state["prev"] = counter.region
        counter.region = name
        tracker.label = f"forward:{name}"

    def post(_m, _a, _o, _k=None):
        counter.region = state.get("prev", "other")
        tracker.label = "forward"

    def bpre(_m, _g):
        tracker.label = f"backward:{name}"

    hs = [mod.register_forward_pre_hook(pre, with_kwargs=True),
          mod.register_forward_hook(post, with_kwargs=True)]
    with contextlib.suppress(Exception):
        hs.append(mod.register_full_backward_pre_hook(bpre))
    return hs


# ================================================================================ main


def run_case(c: Case, opts) -> dict:
    t0 = time.time()
    row = dict(case=vars(c) if not hasattr(c, "__dataclass_fields__") else
               {k: getattr(c, k) for k in c.__dataclass_fields__})
    try:
        ms = measure_model_state(c, opts)
        act = None if c.state_only else measure_activations(c, opts)
        chunk = None if c.chunk is None else measure_chunk(c, opts)
    except ImportError:
        raise
    except Exception as e:  # a configuration class that cannot be built: record why
        if os.environ.get("TRUTH_DEBUG"):
            raise
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        return row
    meas = dict(weights=ms["weights"], gradients=ms["gradients"], optimizer=ms["optimizer"],
                decoder_layers=ms["decoder_layers"])
    if chunk is not None:  # one model chunk's saved bytes, all regions
        meas["chunk_saved"] = sum(chunk["saved"].values())
        row["chunk_saved_by"] = chunk["saved"]
    if act is None:  # model state only
        row.update(measured=meas, tune_cp=tunecp_figures(c), layers_per_chunk=ms["per_chunk"],
                   seconds=round(time.time() - t0, 1))
        return row
    saved = act["saved"]
    for k in ("layer_dense", "layer_moe", "embedding", "mtp"):
        if k in saved:
            meas[k] = saved[k]
    if c.recompute == "full" and "checkpoint" in saved:
        for k in act["kinds"]:
            meas[f"layer_{k}"] = saved["checkpoint"] // len(act["kinds"])
    if "output" in saved:  # final norm, output layer and the loss (outside any module hook)
        meas["output"] = saved["output"] + saved.get("other", 0)
    meas["micro_peak"] = act["peak"]
    pred = tunecp_figures(c)
    row.update(measured=meas, tune_cp=pred, peak_at=act["peak_at"],
               peak_by_phase=act["peak_by_phase"],
               forward_peak=act["forward_peak"], forward_peak_at=act["forward_peak_at"],
               built_kinds=act["kinds"], layers_per_chunk=ms["per_chunk"],
               seconds=round(time.time() - t0, 1))
    return row


def print_row(row: dict, flush: bool = False) -> None:
    c = row["case"]
    print(f"-- {c['name']}: {c['model']} tp{c['tp']} pp{c['pp']} vpp{c['vpp']} cp{c['cp']} "
          f"ep{c['ep']} mbs{c['mbs']} seq{c['seq_len']} stage {c['stage']} "
          f"recompute {c['recompute']}")
    if "error" in row:
        print(f"   not built: {row['error']}")
        return
    print(f"   {'term':<16}{'measured':>16}{'tune-cp':>16}{'diff':>9}")
    for k, v in row["measured"].items():
        p = row["tune_cp"].get(k)
        d = "" if not p else f"{(p - v) / v * 100 if v else 0:+.2f}%"
        print(f"   {k:<16}{v:>16,}{p if p is not None else '-':>16,}{d:>9}" if p is not None
              else f"   {k:<16}{v:>16,}{'-':>16}")
    for j, ch in enumerate(row.get("layers_per_chunk", [])):
        ly = ch["layers"]
        span = f"layers {ly[0]}-{ly[-1]}" if ly else "no layers"
        print(f"   chunk {j}: {span}{' +emb' if ch['embedding'] else ''}"
              f"{' +mtp' * ch['mtp']}{' +output' if ch['output'] else ''}")
    print(f"   peak at: {row.get('peak_at', '-')}   ({row['seconds']} s)", flush=flush)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", action="store_true", help="run the truth matrix, write JSON")
    ap.add_argument("--only", default=None, help="rerun only matrix rows whose name contains one of these (comma separated); "
                    "the others are kept from --out")
    ap.add_argument("--out", default=str(JSON_PATH))
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--nodes", type=int, default=1)
    for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "stage", "recompute-layers"):
        ap.add_argument(f"--{k}", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--recompute", default="none")
    ap.add_argument("--recompute-method", default="block")
    ap.add_argument("--split", default="even")
    ap.add_argument("--first-stage-layers", type=int, default=None)
    ap.add_argument("--last-stage-layers", type=int, default=None)
    ap.add_argument("--layout", default=None, help="pipeline_model_parallel_layout")
    ap.add_argument("--capacity-factor", type=float, default=None, help="token-drop MoE")
    ap.add_argument("--state-only", action="store_true", help="model state only")
    ap.add_argument("--chunk", type=int, default=None, help="also one local chunk's saved bytes")
    ap.add_argument("--torch-norm", action="store_true", help="torch's composite RMSNorm")
    ap.add_argument("--unfused-swiglu", action="store_true", help="Megatron's unfused SwiGLU")
    ap.add_argument("--check-kernels", action="store_true")
    opts = ap.parse_args(argv)
    install_shims(fused=not opts.unfused_swiglu)
    checks = check_stand_ins()
    print("kernel stand-ins vs reference ops (max relative difference): "
          + ", ".join(f"{k} {v:.1e}" for k, v in checks.items()))
    if opts.check_kernels:
        return 0
    if opts.matrix:
        import megatron.core

        from benchmarks.memory_truth_matrix import MATRIX, schedule_sweep

        rows: list[dict] = []
        old = {}
        if opts.only and Path(opts.out).exists():  # rerun some rows, keep the others
            old = {r["case"]["name"]: r for r in json.loads(Path(opts.out).read_text())["rows"]}
        doc = dict(
            megatron_core=megatron.core.__version__, torch=torch.__version__,
            kernel_set=KERNEL_SET, stand_in_check=checks,
            command="python benchmarks/memory_truth.py --matrix",
            zero_bubble=("Megatron-Core 0.16.1 has no zero-bubble schedule to call; tune-cp "
                         "gives ZB-H1 the 1F1B counts (Qi et al. 2023: ZB-H1 keeps 1F1B's "
                         "activation memory)"),
            schedules=schedule_sweep(), rows=rows,
        )
        for c in MATRIX:
            if opts.only and not any(o in c.name for o in opts.only.split(",")):
                if c.name in old:
                    rows.append(old[c.name])
                continue
            row = run_case(c, opts)
            print_row(row, flush=True)
            rows.append(row)
            Path(opts.out).write_text(json.dumps(doc, indent=1) + "\n")
        # the rows kept after the last rerun one are written too
        Path(opts.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {opts.out}: {len(rows)} rows")
        return 0
    c = Case(name="cli", model=opts.model, gpu=opts.gpu, nodes=opts.nodes,
             **{k: getattr(opts, k) for k in ("tp", "pp", "vpp", "cp", "ep", "mbs", "stage")
                if getattr(opts, k) is not None},
             etp=opts.etp, seq_len=opts.seq_len, recompute=opts.recompute,
             recompute_method=opts.recompute_method, recompute_layers=opts.recompute_layers,
             split=opts.split, first_stage_layers=opts.first_stage_layers,
             last_stage_layers=opts.last_stage_layers, layout=opts.layout,
             capacity_factor=opts.capacity_factor, state_only=opts.state_only, chunk=opts.chunk)
    row = run_case(c, opts)
    print_row(row)
    return 0 if "error" not in row else 1


if __name__ == "__main__":
    raise SystemExit(main())
