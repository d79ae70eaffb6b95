"""The privacy report's sampling note and unit of privacy are read from the run spec
(:func:`dpfy.spec.report_context`, issue 37), so every entry point states the sampler and the
unit the run used. The expected notes are written out here, as ``dpfy train`` words them."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.privacy.events import CyclicPoisson, ExampleLevelSampling, Poisson, Shuffled
from dpfy.privacy.events import UserLevelSampling
from dpfy.privacy.ledger import Sampling
from dpfy.privacy.report_text import SAMPLER_WORDS
from dpfy.spec import RunSpec, UserUnit, report_context

USER = "one user, with all of their examples"


@pytest.mark.parametrize("spec, note, unit", [
    (RunSpec().with_sampling(Poisson(0.01, dataset_size=1000)),
     "Poisson sampling by dpfy's sampler, q = 0.01, 8 steps per epoch", "one example"),
    (RunSpec().with_sampling(Shuffled(1 / 3, dataset_size=48)),
     "Shuffled passes (one per epoch) by dpfy's sampler, q = 0.33333, 8 steps per epoch",
     "one example"),
    (RunSpec().with_sampling(CyclicPoisson(0.25, dataset_size=40, bands=2)),
     "Cyclic Poisson sampling (Poisson within each band's group) by dpfy's sampler, q = 0.25, "
     "8 steps per epoch", "one example"),
    (RunSpec(unit=UserUnit("uls")).with_sampling(UserLevelSampling(0.1, dataset_size=50)),
     "Poisson sampling by dpfy's sampler, q = 0.1 (per user), 8 steps per epoch", USER),
    (RunSpec(unit=UserUnit("els", 4)).with_sampling(
        ExampleLevelSampling(0.02, dataset_size=50, max_examples_per_user=4)),
     "Poisson sampling by dpfy's sampler, q = 0.02, 8 steps per epoch", USER),
], ids=["poisson", "shuffled", "cyclic", "uls", "els"])
def test_the_note_and_unit_are_the_specs(spec, note, unit):
    assert report_context(spec, steps_per_epoch=8) == {"unit_of_privacy": unit,
                                                       "sampling_note": note}


def test_without_the_steps_per_epoch_the_note_leaves_them_out():
    spec = RunSpec().with_sampling(Shuffled(0.5, dataset_size=10))
    assert report_context(spec, steps_per_epoch=None)["sampling_note"] == (
        "Shuffled passes (one per epoch) by dpfy's sampler, q = 0.5")


def test_a_spec_before_the_sampler_is_built_is_refused():
    with pytest.raises(ValueError, match=r"spec.sampling.resolved must be the built sampler"):
        report_context(RunSpec(), steps_per_epoch=1)


def test_every_sampling_has_its_words_and_only_poisson_kinds_say_poisson():
    assert set(SAMPLER_WORDS) == set(Sampling)
    for s in (Sampling.SHUFFLE, Sampling.FIXED_SIZE, Sampling.NONE):
        assert "Poisson" not in SAMPLER_WORDS[s]


def test_make_private_with_shuffled_passes_is_stated_as_such():
    # 20 examples, batch 5: q = 5/20 = 0.25, ⌈20/5⌉ = 4 steps per epoch
    model = nn.Linear(3, 2)
    ds = TensorDataset(torch.randn(20, 3), torch.randint(0, 2, (20,)))
    _, opt, loader = dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                       DataLoader(ds, batch_size=5), noise_multiplier=1.0,
                                       max_steps=4, poisson_sampling=False)
    assert report_context(opt.spec, steps_per_epoch=len(loader))["sampling_note"] == (
        "Shuffled passes (one per epoch) by dpfy's sampler, q = 0.25, 4 steps per epoch")
