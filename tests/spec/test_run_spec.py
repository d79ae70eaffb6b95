"""make_private builds a run spec and hands back the calibrated one as ``optimizer.spec``."""

from __future__ import annotations

import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.spec import BandMF, Gaussian, RunSpec, from_keywords

N, B = 20, 5  # q = B / N = 0.25


def _private(**kw):
    model = nn.Linear(3, 2)
    ds = TensorDataset(torch.randn(N, 3), torch.randint(0, 2, (N,)))
    return dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(ds, batch_size=B), **kw
    )


def test_the_optimizer_carries_the_calibrated_spec():
    _, opt, loader = _private(target_epsilon=2.0, target_delta=1e-3, epochs=2)
    spec = opt.spec
    assert isinstance(spec, RunSpec) and isinstance(spec.noise, Gaussian)
    assert spec.noise.noise_multiplier == opt.noise_multiplier  # the σ the step uses
    assert spec.sampling.resolved.sample_rate == B / N
    assert spec.accounting.max_steps == 2 * len(loader)  # ⌈epochs × batches per epoch⌉
    assert spec.accounting.epsilon_cap == 2.0  # the target is the cap
    out = json.loads(json.dumps(spec.to_dict()))
    assert out["sampling"]["resolved"]["dataset_size"] == N


def test_bandmf_records_its_bands_on_the_sampling():
    _, opt, _ = _private(noise_multiplier=1.0, noise="bandmf", bands=2, max_steps=4)
    assert opt.spec.noise == BandMF(1.0, 2)
    assert opt.spec.sampling.resolved.bands == 2


def test_keywords_map_one_to_one():
    keywords = dict(
        noise_multiplier=1.0,
        target_epsilon=None,
        target_delta=None,
        epochs=None,
        max_grad_norm=0.5,
        clipping="flat",
        route="ghost",
        method=None,
        poisson_sampling=True,
        max_physical_batch_size=8,
        memory_limit=None,
        accountant="rdp",
        max_steps=10,
        epsilon_cap=None,
        sample_rates=None,
        budgets=None,
        individual=None,
        user_ids=None,
        user_sampling=None,
        max_examples_per_user=None,
        user_reduction="mean",
        noise="tree",
        bands=None,
        microbatch_size=None,
        augmult=1,
        augment=None,
    )
    spec, performance = from_keywords(**keywords)
    assert spec.noise.name == "tree" and spec.noise.noise_multiplier == 1.0
    assert spec.clipping.max_grad_norm == 0.5 and spec.accounting.accountant == "rdp"
    assert spec.accounting.max_steps == 10
    assert performance.route == "ghost" and performance.max_physical_batch_size == 8
