"""Parameters the private step does not cover must never be stepped on a raw gradient.

An adversarial review found the fine-tuning recipe (freeze a backbone, make_private, later
unfreeze it and ``optimizer.add_param_group``) trained the backbone on its plain autograd
gradient — no clipping, no noise — while the ledger recorded only the private release.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.errors import PrivacyRefusal


def _private_head_only():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))
    model[0].requires_grad_(False)           # the backbone: frozen, not in the optimizer
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))
    return dpfy.make_private(model, opt, DataLoader(data, batch_size=8),
                             noise_multiplier=1.0, max_grad_norm=1.0)


def test_add_param_group_after_make_private_is_refused_naming_the_parameters():
    model, opt, _ = _private_head_only()
    model[0].requires_grad_(True)
    with pytest.raises(PrivacyRefusal, match=r"\['0.weight', '0.bias'\].*without clipping"):
        opt.add_param_group({"params": list(model[0].parameters())})


def test_a_parameter_added_to_the_inner_optimizer_is_refused_before_any_release():
    model, opt, loader = _private_head_only()
    model[0].requires_grad_(True)
    opt.original_optimizer.add_param_group({"params": list(model[0].parameters())})
    before = model[0].weight.detach().clone()
    x, y = next((x, y) for x, y in loader if len(x) > 0)
    F.cross_entropy(model(x), y).backward()   # the mean: what loss_reduction='mean' says
    with pytest.raises(PrivacyRefusal, match=r"\['0.weight', '0.bias'\].*not covered"):
        opt.step()
    assert torch.equal(model[0].weight, before)   # not stepped
    assert opt.ledger.num_steps == 0              # and nothing recorded as released
