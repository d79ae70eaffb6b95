"""Two run specs are equal only when every value in them is: per-example rates, per-layer or
per-example thresholds, budgets and methods included (they were left out of the comparison, so
specs with rates 0.01 and 0.9 compared equal)."""

from __future__ import annotations

import numpy as np
import torch

from dpfy.adaptive.plateau import PlateauNoiseDecay
from dpfy.spec.run import ClippingSpec, IndividualBudgets, RunSpec, SamplingSpec


def test_sample_rates_are_compared():
    low = RunSpec(sampling=SamplingSpec(sample_rates=[0.01] * 3))
    high = RunSpec(sampling=SamplingSpec(sample_rates=[0.9] * 3))
    assert low != high
    assert low == RunSpec(sampling=SamplingSpec(sample_rates=np.full(3, 0.01)))
    rates = torch.full((3,), 0.01, dtype=torch.float64)  # float32's 0.01 is another rate
    assert low == RunSpec(sampling=SamplingSpec(sample_rates=rates))
    assert hash(low) == hash(RunSpec(sampling=SamplingSpec(sample_rates=(0.01, 0.01, 0.01))))


def test_thresholds_budgets_and_methods_are_compared():
    assert RunSpec(clipping=ClippingSpec("per_layer", [1.0, 2.0])) != RunSpec(
        clipping=ClippingSpec("per_layer", [1.0, 3.0])
    )
    one = RunSpec(accounting=RunSpec().accounting.__class__(individual=IndividualBudgets([1, 2])))
    two = RunSpec(accounting=RunSpec().accounting.__class__(individual=IndividualBudgets([1, 3])))
    assert one != two

    def plateau(factor: float) -> RunSpec:
        return RunSpec(method=PlateauNoiseDecay(initial=2.0, factor=factor))

    assert plateau(0.5) != plateau(0.9) and plateau(0.5) == plateau(0.5)
    assert RunSpec(method="plateau") != RunSpec(method="dynamic")


def test_a_filled_in_spec_is_another_value():
    spec = RunSpec(sampling=SamplingSpec(sample_rates=[0.1, 0.2]))
    assert spec.with_noise_multiplier(1.0) != spec
    assert spec.with_noise_multiplier(1.0) == spec.with_noise_multiplier(1.0)


def test_values_the_spec_cannot_read_as_numbers_still_reach_their_refusal():
    # an object that is not a method, a dict or a lambda is compared by identity, so
    # make_private refuses it by name as before, not with numpy's conversion error
    import pytest
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import dpfy

    model = nn.Linear(3, 2)
    data = DataLoader(TensorDataset(torch.randn(8, 3), torch.randint(0, 2, (8,))), batch_size=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="method must be a dpfy method"):
        dpfy.make_private(model, opt, data, noise_multiplier=1.0, method=object())
    thing = object()
    assert RunSpec(method=thing) == RunSpec(method=thing) != RunSpec(method=object())


def test_thresholds_given_as_tensors_are_read_once():
    # per-layer C as 0-d tensors, one of them a leaf that requires grad (a schedule's knob)
    clips = (torch.tensor(1.0, requires_grad=True), torch.tensor(2.0))
    assert ClippingSpec("per_layer", clips) == ClippingSpec("per_layer", [1.0, 2.0])
    assert hash(ClippingSpec("per_layer", clips)) == hash(ClippingSpec("per_layer", (1.0, 2.0)))


def test_thresholds_the_spec_cannot_read_still_reach_their_refusal():
    # per-layer thresholds as 2-element tensors: the clipping's own check says what is wrong,
    # not torch's "only one element tensors can be converted"
    import pytest
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import dpfy

    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
    data = DataLoader(TensorDataset(torch.randn(8, 3), torch.randint(0, 2, (8,))), batch_size=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    bad = [torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0])]
    with pytest.raises((ValueError, TypeError)) as err:
        dpfy.make_private(
            model, opt, data, noise_multiplier=1.0, max_grad_norm=bad, clipping="per_layer"
        )
    assert "one number per layer" in str(err.value)


def test_per_layer_thresholds_as_any_numbers():
    # a generator, NumPy scalars and 0-d tensors are numbers per layer; a nested list is not
    import numpy as np
    import pytest

    from dpfy.clipping import make_clipping

    layers = [["a.weight"], ["b.weight"]]
    assert make_clipping("per_layer", (c for c in [1.0, 2.0]), layers).clips == (1.0, 2.0)
    assert make_clipping("per_layer", [torch.tensor(1.0), np.float32(2.0)], layers).clips == (
        1.0,
        2.0,
    )
    assert make_clipping("per_layer", torch.tensor(2.0), layers).clips == pytest.approx(
        (2.0 / 2**0.5, 2.0 / 2**0.5)
    )
    with pytest.raises(ValueError, match="one number per layer"):
        make_clipping("per_layer", [[1.0], [2.0]], layers)
