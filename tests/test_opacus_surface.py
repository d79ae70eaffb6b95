"""The Opacus surface where it costs nothing: make_private's module=/data_loader= keywords,
optimizer.max_grad_norm / expected_batch_size, loader.sample_rate / batch_size, and passing
dpfy's own loader back to make_private."""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy

N, B = 64, 16


def _parts():
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    data = TensorDataset(torch.randn(N, 4), torch.randint(0, 2, (N,)))
    return model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data, batch_size=B)


def test_opacus_keywords_and_attributes():
    model, opt, loader = _parts()
    model, opt, dl = dpfy.make_private(module=model, optimizer=opt, data_loader=loader,
                                       noise_multiplier=1.0, max_grad_norm=0.7)
    assert opt.max_grad_norm == 0.7
    assert opt.expected_batch_size == pytest.approx(B)          # q·N = (16/64)·64
    assert dl.sample_rate == pytest.approx(B / N) and dl.batch_size == B


def test_an_alias_and_its_name_together_are_refused():
    model, opt, loader = _parts()
    with pytest.raises(ValueError, match="model / module must be exactly one given"):
        dpfy.make_private(model, opt, loader, module=model, noise_multiplier=1.0)


def test_dpfy_s_own_loader_can_be_privatized_again():
    model, opt, loader = _parts()
    _, _, dl = dpfy.make_private(model, opt, loader, noise_multiplier=1.0)
    model2, opt2, _ = _parts()
    model2, opt2, dl2 = dpfy.make_private(model2, opt2, dl, noise_multiplier=1.0)
    assert dl2.dataset is loader.dataset and dl2.sample_rate == pytest.approx(B / N)
    x, y = next(iter(dl2))
    nn.functional.cross_entropy(model2(x), y).backward()
    opt2.step()
    assert opt2.step_count == 1


def test_opacus_s_prv_accountant_is_refused_naming_pld():
    # Opacus's numerical accountant is "prv"; dpfy's is dp_accounting's PLD. The refusal names it.
    model, opt, loader = _parts()
    with pytest.raises(ValueError, match="accountant must be one of .* Use 'pld'"):
        dpfy.make_private(model, opt, loader, noise_multiplier=1.0, accountant="prv")


def test_opacus_s_adaptive_clipping_is_refused_naming_the_quantile_method():
    model, opt, loader = _parts()
    with pytest.raises(ValueError, match="clipping must be one of .* method='quantile'"):
        dpfy.make_private(model, opt, loader, noise_multiplier=1.0, clipping="adaptive")
