"""A private model's trained parameters read ``requires_grad`` truthfully; freezing one after
``make_private`` is refused at the next step; copies (deepcopy, torch.save) are plain models."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.errors import PrivacyRefusal


def _private(seed: int = 0):
    torch.manual_seed(seed)
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model[0].bias.requires_grad_(False)  # frozen before make_private: stays frozen
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    return dpfy.make_private(model, opt, DataLoader(data, batch_size=16),
                             noise_multiplier=0.0, max_grad_norm=1.0, seed=seed)


def _one_step(model, opt, loader):
    x, y = next(iter(loader))
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


@pytest.mark.filterwarnings("ignore:noise_multiplier=0")
def test_requires_grad_reads_what_the_private_step_trains():
    model, _, _ = _private()
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    assert flags == {"0.weight": True, "0.bias": False, "2.weight": True, "2.bias": True}
    # the count peft's print_trainable_parameters prints: 4·8 + 8·2 + 2
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 50


@pytest.mark.filterwarnings("ignore:noise_multiplier=0")
def test_freezing_after_make_private_is_refused_at_the_next_step():
    model, opt, loader = _private()
    _one_step(model, opt, loader)
    model[2].requires_grad_(False)
    before = model[2].weight.detach().clone()
    with pytest.raises(PrivacyRefusal, match=r"\['2.weight', '2.bias'\].*before make_private"):
        _one_step(model, opt, loader)
    assert torch.equal(model[2].weight, before) and opt.step_count == 1
    model[2].requires_grad_(True)  # the fix named: train them again
    _one_step(model, opt, loader)
    assert opt.step_count == 2


@pytest.mark.filterwarnings("ignore:noise_multiplier=0")
def test_a_deep_copy_is_a_plain_trainable_model():
    model, opt, loader = _private()
    _one_step(model, opt, loader)
    ema = copy.deepcopy(model)
    assert [type(p) for p in ema.parameters()] == [nn.Parameter] * 4
    assert [p.requires_grad for p in ema.parameters()] == [True, False, True, True]
    assert not getattr(ema, "_ddp_params_and_buffers_to_ignore", [])  # DDP may wrap the copy
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    plain_opt = torch.optim.SGD([p for p in ema.parameters() if p.requires_grad], lr=0.5)
    before = ema[2].weight.detach().clone()
    nn.functional.cross_entropy(ema(x), y).backward()
    plain_opt.step()
    assert not torch.equal(ema[2].weight, before)   # it trains, outside the private run
    assert opt.grads._capture.calls and all(not c for c in opt.grads._capture.calls.values())
    _one_step(model, opt, loader)                   # the private model still trains privately
    assert opt.step_count == 2


@pytest.mark.filterwarnings("ignore:noise_multiplier=0")
def test_torch_save_of_a_private_model_loads_a_plain_model():
    model, opt, loader = _private()
    _one_step(model, opt, loader)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert [p.requires_grad for p in loaded.parameters()] == [True, False, True, True]
    for a, b in zip(loaded.parameters(), model.parameters()):
        assert torch.equal(a, b) and type(a) is nn.Parameter
    nn.functional.cross_entropy(loaded(torch.randn(3, 4)), torch.tensor([0, 1, 0])).backward()
    assert loaded[2].weight.grad is not None


def test_detach_gives_autograd_the_truth_back():
    model = nn.Linear(3, 2)
    eng = dpfy.grads.GradEngine(model)
    model.bias.requires_grad_(False)
    eng.detach()
    assert type(model.weight) is nn.Parameter and model.weight.requires_grad
    assert not model.bias.requires_grad
    model(torch.randn(2, 3)).sum().backward()
    assert model.weight.grad is not None and model.bias.grad is None
