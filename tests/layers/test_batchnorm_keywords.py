"""``make_private(batchnorm=...)``: the keyword form of BatchNorm statistics (docs/guide/
batchnorm.md, docs/spec.md).

What must hold:
- the keyword form is the two-call form (``privatized_batchnorm`` before ``make_private``,
  ``attach_privatized_statistics`` after it): with the same seed, the same ledger (gradient and
  statistics releases at the same σ) and the same trained model, bit for bit on one machine;
- the run spec holds the statistics (kind, bound, share, σ_bn, k = 2L releases) and the σ
  the gradient got after the split, the ones the ledger records;
- the combinations the statistics' accounting does not cover are refused by the checker before
  anything is built (the model keeps its BatchNorm layers);
- public statistics by keyword name their data in the spec.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from dpfy.errors import PrivacyRefusal
from dpfy.layers.batchnorm_setup import attach_privatized_statistics
from dpfy.layers.privatized_batchnorm import PrivatizedBatchNorm, privatized_batchnorm
from dpfy.layers.public_batchnorm import PublicBatchNorm
from layers.bn_cases import bn_cnn, make_private_quiet, train

A = 2.0  # the declared activation bound
X = torch.randn(60, 1, 6, 6)
Y = torch.arange(60) % 3


def _private(model: nn.Module, **kw):
    return make_private_quiet(model, X, Y, seed=0, **kw)


RUNS = [
    dict(target_epsilon=1.0, target_delta=1e-5, epochs=2),  # σ calibrated, then split
    dict(noise_multiplier=1.0, epochs=2),  # σ the gradient's; the statistics add to ε
]


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("bn", [dict(share=0.2), dict(noise_multiplier=12.0)])
def test_the_keyword_form_is_the_two_call_form(run, bn):
    torch.manual_seed(0)
    by_hand = bn_cnn()
    stats = privatized_batchnorm(by_hand, bound=A, **bn)
    model_h, opt_h, loader_h = _private(by_hand, **run)
    attach_privatized_statistics(stats, opt_h, calibrated="target_epsilon" in run)
    train(model_h, opt_h, loader_h, epochs=2)

    torch.manual_seed(0)
    keywords = {f"bn_{k}": v for k, v in bn.items()}
    model_k, opt_k, loader_k = _private(
        bn_cnn(), batchnorm="privatized", bn_bound=A, **keywords, **run
    )
    assert any(isinstance(m, PrivatizedBatchNorm) for m in model_k.modules())
    train(model_k, opt_k, loader_k, epochs=2)

    assert len(opt_k.ledger) == len(opt_h.ledger) == 2 * len(loader_k)
    assert opt_k.ledger.step_groups == opt_h.ledger.step_groups  # the same releases at the same σ
    for name, value in model_h.state_dict().items():  # one machine, the same operations
        assert torch.equal(model_k.state_dict()[name], value), name
    # the spec says what the ledger records: the gradient's σ and each release's σ_bn
    releases = opt_k.ledger.step_groups[0].releases
    spec = opt_k.spec
    assert [r.mechanism for r in releases][1:] == [
        "bn_mean:1",
        "bn_square:1",
        "bn_mean:5",
        "bn_square:5",
    ]
    assert spec.noise.noise_multiplier == releases[0].noise_multiplier == opt_k.noise_multiplier
    assert spec.batchnorm.noise_multiplier == releases[1].noise_multiplier
    assert spec.batchnorm.releases == 4 and spec.batchnorm.bound == A
    out = json.loads(json.dumps(spec.to_dict()))
    assert out["batchnorm"]["kind"] == "privatized"
    assert out["batchnorm"]["share"] == bn.get("share")


def test_the_share_defaults_to_the_documented_one():
    _, opt, _ = _private(bn_cnn(), batchnorm="privatized", bn_bound=A, noise_multiplier=1.0)
    bn = opt.spec.batchnorm
    assert bn.share == 0.3  # docs/guide/batchnorm.md: f = 0.3 without bn_share or σ_bn
    # σ_bn = σ_g·√(k(1−f)/f) with k = 4 releases (the docs' derivation)
    assert bn.noise_multiplier == pytest.approx((4 * 0.7 / 0.3) ** 0.5, rel=1e-12)


# the combinations setup_batchnorm / attach_privatized_statistics refuse (their own lists:
# physical batches, correlated noise, data-parallel ranks and budgets, units other than one
# example per row), now refused by the checker before the model is converted
REFUSED = [
    (dict(noise_multiplier=1.0, max_physical_batch_size=4), "max_physical_batch_size"),
    (dict(noise_multiplier=1.0, max_physical_batch_size="auto"), "max_physical_batch_size"),
    (dict(noise_multiplier=1.0, noise="tree", epochs=1), "noise='tree'"),
    (dict(noise_multiplier=1.0, augmult=2, augment="dataset"), "augmult=2"),
    (
        dict(noise_multiplier=1.0, user_ids=torch.arange(60) % 7, user_sampling="uls"),
        "user_ids",
    ),
    (
        dict(noise_multiplier=1.0, clipping="microbatch", microbatch_size=2),
        "clipping='microbatch'",
    ),
    (
        dict(budgets=[1.0] * 30 + [2.0] * 30, individual="sample", target_delta=1e-5, epochs=1),
        "budgets",
    ),
]


@pytest.mark.parametrize("run, flag", REFUSED)
def test_the_checker_refuses_before_anything_is_converted(run, flag):
    model = bn_cnn()
    with pytest.raises(PrivacyRefusal, match=f"batchnorm='privatized' cannot be combined.*{flag}"):
        _private(model, batchnorm="privatized", bn_bound=A, **run)
    assert isinstance(model[1], nn.BatchNorm2d) and isinstance(model[5], nn.BatchNorm1d)


def test_microbatches_of_one_are_per_example_clipping_and_admitted():
    _, opt, loader = _private(
        bn_cnn(),
        batchnorm="privatized",
        bn_bound=A,
        noise_multiplier=1.0,
        clipping="microbatch",
        microbatch_size=1,
    )
    train(opt.private_step.model, opt, loader)
    assert len(opt.ledger.step_groups[0].releases) == 5


def test_arguments_without_their_mode_are_refused():
    with pytest.raises(ValueError, match="none of them with batchnorm=None"):
        _private(bn_cnn(), bn_bound=A, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="bn_bound"):
        _private(bn_cnn(), batchnorm="privatized", noise_multiplier=1.0)
    with pytest.raises(ValueError, match="batchnorm must be None or one of"):
        _private(bn_cnn(), batchnorm="private", noise_multiplier=1.0)


def test_public_statistics_by_keyword_name_their_data():
    public = torch.randn(40, 1, 6, 6)
    model, opt, loader = _private(
        bn_cnn(),
        batchnorm="public",
        public_data=public,
        public_description="forty random images",
        noise_multiplier=1.0,
    )
    assert isinstance(model[1], PublicBatchNorm)
    train(model, opt, loader)
    assert opt.spec.batchnorm.public_data == "forty random images"
    assert [r.mechanism for r in opt.ledger.step_groups[0].releases] == ["gradient"]
