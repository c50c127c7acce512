"""The search space as data: default domains per model and cluster, fixing axes, validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.conftest import setting
from tune_cp.config.specs import (
    ConfigError,
    Dispatcher,
    Fp8Recipe,
    PipelineSplit,
    Recompute,
    Schedule,
    TrainingSpec,
)
from tune_cp.solver.space import (
    EtpPolicy,
    OptimizerChoice,
    RecomputeOption,
    SearchSpace,
    default_space,
    max_layers_per_chunk,
)


def test_mixtral_4_nodes_default_space():
    m, cl, tr = setting("mixtral-8x22b", "mi355x", 4, 8192, 512)
    sp = default_space(m, cl, tr)
    assert sp.tp == (1, 2, 4, 8)  # divisors of 32 within the 8-GPU node
    assert sp.pp == (1, 2, 4, 8, 16, 32)  # divisors of 32, at most 56 layers
    assert sp.cp == (1, 2, 4, 8, 16, 32)
    # pp x vpp divides 56 (even) or 58 (embedding_loss: pp 2 x vpp 29 gives one slot per
    # virtual stage, the first the embedding alone, the last the loss alone)
    assert sp.vpp == (1, 2, 4, 7, 14, 28, 29)
    assert sp.ep == (1, 2, 4, 8) and sp.etp_policy is EtpPolicy.ONE_OR_TP
    assert sp.etp_values(4) == (1, 4) and sp.etp_values(1) == (1,)
    assert sp.mbs == (1, 2, 4, 8)
    kinds = [r.label() for r in sp.recompute]
    assert kinds[:2] == ["none", "selective moe_act"]  # flash attention: no core_attn
    assert kinds[2:] == [f"full block {k}" for k in range(1, 57)]
    assert sp.full_layers == tuple(range(1, 57))
    assert sp.optimizer == (OptimizerChoice.DISTRIBUTED,)
    assert sp.dispatcher == (Dispatcher.ALLTOALL,) and sp.schedule == (None,)
    # the automatic split and the searched light ones (config.specs.SEARCHED_LIGHT_SPLITS)
    assert sp.fp8_recipe == (None,) and sp.pipeline_split == (
        None, PipelineSplit.LIGHT_LAST, PipelineSplit.LAST_TO_FIRST)
    assert sp.size() == sum(len(sp.etp_values(t)) for t in sp.tp) * 6 * 6 * 7 * 4 * 4 * 58 * 3


def test_dense_and_mla_models():
    m, cl, tr = setting("llama3.1-405b", "h100", 16, 8192, 2048)
    sp = default_space(m, cl, tr)
    assert sp.etp_policy is EtpPolicy.SAME and sp.ep == (1,)
    assert [r.kind for r in sp.recompute[:1]] == [Recompute.NONE]
    assert all(r.kind is not Recompute.SELECTIVE for r in sp.recompute)
    assert 126 // 2 == max_layers_per_chunk(m, sp.pp, sp.vpp) or max(sp.full_layers) == 126
    m, cl, tr = setting("deepseek-v3", "h100", 16, 4096, 4096)
    sel = [r.modules for r in default_space(m, cl, tr).recompute if r.kind is Recompute.SELECTIVE]
    assert sel == [("mla_up_proj",), ("moe_act",), ("mla_up_proj", "moe_act")]
    no_flash = TrainingSpec(seq_len=4096, global_batch_size=4096, flash_attention=False)
    sel = [r.modules for r in default_space(m, cl, no_flash).recompute
           if r.kind is Recompute.SELECTIVE]
    assert ("core_attn",) in sel


def test_options_when_asked():
    m, cl, _ = setting("llama3-8b", "b200", 2, 8192, 128)
    fp8 = TrainingSpec(seq_len=8192, global_batch_size=128, precision="fp8")
    assert default_space(m, cl, fp8).fp8_recipe == (Fp8Recipe.MXFP8,)  # Blackwell default
    assert set(default_space(m, cl, fp8, fp8_recipes=True).fp8_recipe) == set(Fp8Recipe)
    sp = default_space(m, cl, fp8, zero_bubble=True, uniform_recompute=True,
                       full_recompute_layers=(1, 2, 4), allow_cross_scale_up=True,
                       optimizers=tuple(OptimizerChoice))
    assert sp.schedule == (None, Schedule.ZERO_BUBBLE)
    assert [r.label() for r in sp.recompute if r.kind is Recompute.FULL] == [
        "full block 1", "full block 2", "full block 4", "full uniform 1", "full uniform 2",
        "full uniform 4"]
    assert sp.full_layers == (1, 2, 4) and 16 in sp.tp
    assert default_space(m, cl, fp8, mbs=(1, 2, 4, 8, 256)).mbs == (1, 2, 4, 8)  # <= gbs 128


def test_fixed_axes_become_singletons():
    m, cl, tr = setting("mixtral-8x22b", "mi355x", 4, 8192, 512)
    sp = default_space(m, cl, tr, fixed={"tp": 1, "pp": 4, "etp": 1})
    assert sp.tp == (1,) and sp.pp == (4,) and sp.etp == (1,) and sp.etp_policy is EtpPolicy.ALL
    assert sp.fix(mbs=2).mbs == (2,)
    with pytest.raises(ConfigError, match="unknown axis 'foo'"):
        sp.fix(foo=1)
    assert sp.with_domains(cp=(1, 2)).cp == (1, 2)


def test_space_validation():
    with pytest.raises(ValidationError, match="increasing order"):
        SearchSpace(tp=(2, 1), pp=(1,))
    with pytest.raises(ValidationError, match="positive"):
        SearchSpace(tp=(0, 1), pp=(1,))
    with pytest.raises(ValidationError, match="extra"):
        SearchSpace(tp=(1,), pp=(1,), bogus=1)
    with pytest.raises(ValidationError, match="needs layers"):
        RecomputeOption(kind=Recompute.FULL)
    with pytest.raises(ValidationError, match="needs modules"):
        RecomputeOption(kind=Recompute.SELECTIVE)
    small = SearchSpace(tp=(1, 2), pp=(1, 2), mbs=(1, 2))
    assert small.size() == len(list(small.candidates())) == 2 * 2 * 2 + 1 * 2 * 2
