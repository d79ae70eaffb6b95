"""Errors a user meets first say what happened and the fix (issue 35 §3): a model on the meta
device, a number passed as a string, and a second optimizer.step() on one batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy


def _data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(40, 4, generator=g), torch.randint(0, 2, (40,), generator=g))


def _private(model=None, **kw):
    model = model if model is not None else nn.Linear(4, 2)
    kw.setdefault("noise_multiplier", 1.0)
    return dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                             DataLoader(_data(), batch_size=8), **kw)


def test_a_model_on_the_meta_device_is_refused_at_make_private():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    with pytest.raises(ValueError, match=r"model must hold real weights, got model = Sequential "
                                         r"with 4 tensors on the meta device \(0\.weight.*to_empty"):
        _private(model)
    model.to_empty(device="cpu")                      # the fix the message names
    for layer in model:
        layer.reset_parameters()
    _private(model)


@pytest.mark.parametrize("name", ["noise_multiplier", "target_epsilon", "epochs"])
def test_numbers_given_as_strings_are_refused_in_dpfys_format(name):
    kw = {"noise_multiplier": None, "target_epsilon": 3.0, "target_delta": 1e-3, "epochs": 1}
    kw[name] = "1.0"
    with pytest.raises(TypeError, match=rf"^{name} must be a number \(int or float\), got "
                                        rf"{name} = '1\.0' \(str\)\. Pass {name}=1\.0"):
        _private(**kw)


def test_a_second_step_on_one_batch_says_so():
    model, opt, dl = _private()
    x, y = next(iter(dl))
    F.cross_entropy(model(x), y).backward()
    opt.step()
    with pytest.raises(ValueError, match=r"second optimizer\.step\(\) for the same batch: its "
                                         r"logical batch was already released"):
        opt.step()
    assert opt.step_count == 1 and opt.ledger.num_steps == 1    # nothing more was released
    x, y = next(iter(dl))                                       # the fix: the next batch
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    assert opt.step_count == 2


def test_a_second_step_on_a_physical_batch_says_it_was_accumulated():
    model, opt, dl = _private(max_physical_batch_size=2)
    it = iter(dl)
    while True:                                  # a physical batch that does not end its step
        x, y = next(it)
        if not dl.cursor.last:
            break
        F.cross_entropy(model(x), y).backward()
        opt.step()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    with pytest.raises(ValueError, match="already added to the current logical batch"):
        opt.step()


def test_a_step_without_any_batch_still_names_the_loader():
    _, opt, _ = _private()
    with pytest.raises(ValueError, match="one yielded by the loader make_private returned"):
        opt.step()
