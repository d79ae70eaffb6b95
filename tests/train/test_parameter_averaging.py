"""Parameter averaging (issue 28 §3, De et al. 2022): an EMA of the iterates, post-processing.

The expected average is computed in the test from the iterates a toy private run visits:
θ̄_t = β_t θ̄_{t−1} + (1 − β_t) θ_t with β_t = min(β, (1+t)/(10+t)), θ̄_0 = θ_0 (the warm-up
of TensorFlow's ExponentialMovingAverage with num_updates = t). `dpfy train --ema`:
tests/cli/test_parameter_averaging_cli.py."""

import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.train.averaging import ParameterAverage
from dpfy.train.epoch import run_epoch
from dpfy.train.private import PrivateRun


def test_the_average_equals_the_hand_computed_ema_of_a_toy_private_run():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, dl = dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.5),
                                           DataLoader(TensorDataset(x, y), batch_size=8),
                                           noise_multiplier=1.0, max_grad_norm=1.0, seed=2,
                                           epochs=2)
    beta = 0.9
    average = ParameterAverage(model, beta)
    iterates = [{n: p.detach().double().clone() for n, p in model.named_parameters()}]

    def on_step(o):
        if o.updated:
            average.update(model)
            iterates.append({n: p.detach().double().clone() for n, p in model.named_parameters()})

    private = PrivateRun(model=model, optimizer=opt, loader=dl, sample_rate=dl.sampler.sample_rate,
                         steps_per_epoch=len(dl), total_steps=opt.max_steps)
    for _ in range(2):
        run_epoch(private, delta=1e-5, on_step=on_step)
    assert len(iterates) == 1 + 16
    want = dict(iterates[0])
    for t, theta in enumerate(iterates[1:], start=1):
        b = min(beta, (1 + t) / (10 + t))
        want = {n: b * want[n] + (1 - b) * theta[n] for n in want}
    for n, t in average.average.items():
        torch.testing.assert_close(t, want[n], rtol=1e-12, atol=1e-12)
    saved = average.state_dict_of(model)
    raw = {n: p.detach().clone() for n, p in model.named_parameters()}
    with average.swapped_in(model):
        for n, p in model.named_parameters():
            assert torch.equal(p.detach(), saved[n])
    for n, p in model.named_parameters():   # restored after evaluation
        assert torch.equal(p.detach(), raw[n])
    assert not torch.equal(saved["weight"], raw["weight"])
