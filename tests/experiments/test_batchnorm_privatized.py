"""``experiments/batchnorm/privatized.py``: one tiny private run of each form (synthetic images
stand in for Fashion-MNIST), and the public set it uses is ``run.py``'s."""

from __future__ import annotations

import pytest
import torch

from dpfy.data.fashion_mnist import MEAN, STD
from dpfy.data.public_digits import digits_images
from dpfy.layers import PrivatizedBatchNorm, PublicBatchNorm
from experiments.batchnorm import privatized, run

pytest.importorskip("sklearn")  # the public set ships in scikit-learn (dpfy[datasets])


def test_public_digits_are_run_pys():
    assert torch.equal(digits_images(28, 28, mean=MEAN, std=STD), run.digits_public())


def test_each_form_trains(tiny_images, monkeypatch):
    monkeypatch.setattr(privatized, "EPOCHS", 1)
    monkeypatch.setattr(privatized, "BATCH", 16)
    train, _ = tiny_images(64)
    data = {"train": train.tensors}
    public = run.digits_public()[:64]
    hp = {"lr": 0.5, "bound": 1.0, "share": 0.2}
    kinds = {"gn": None, "priv": PrivatizedBatchNorm, "pub-digits": PublicBatchNorm}
    for form, kind in kinds.items():
        model, opt, sigma_bn = privatized.train(form, 3.0, hp, 0, data, public)
        if kind is not None:
            assert any(isinstance(m, kind) for m in model.modules())
        assert opt.step_count >= 1
        bn = [m for m in opt.ledger.mechanisms() if m.startswith("bn_")]
        assert (len(bn) == 4) == (form == "priv") and (sigma_bn is not None) == (form == "priv")
        assert opt.epsilon(1e-5) <= 3.0
