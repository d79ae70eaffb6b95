"""``experiments/batchnorm/run.py``: the public set it declares, and one tiny private run of each
form (synthetic images stand in for Fashion-MNIST)."""

from __future__ import annotations

import pytest
import torch

from dpfy.data.fashion_mnist import MEAN, STD
from dpfy.layers import PublicBatchNorm
from experiments.batchnorm import run

pytest.importorskip("sklearn")  # the public set ships in scikit-learn (dpfy[datasets])


def test_digits_public_set():
    x = run.digits_public()
    assert x.shape == (1797, 1, 28, 28)  # scikit-learn's bundled digits, upscaled
    # pixels in [0, 1] standardized with Fashion-MNIST's constants: the range maps accordingly
    assert x.min() >= (0 - MEAN) / STD - 1e-6 and x.max() <= (1 - MEAN) / STD + 1e-6


def test_each_form_trains(tiny_images, monkeypatch):
    monkeypatch.setattr(run, "EPOCHS", 1)
    monkeypatch.setattr(run, "BATCH", 16)
    train, _ = tiny_images(64)
    data = {"train": train.tensors}
    public = {"pub-digits": run.digits_public()[:64], "pub-split": torch.randn(32, 1, 28, 28)}
    for form in ("gn", "pub-digits", "pub-split"):
        model, opt = run.train(form, 3.0, 0.5, 0, data, public)
        has_public = any(isinstance(m, PublicBatchNorm) for m in model.modules())
        assert has_public == (form != "gn")
        assert opt.step_count >= 1
        acc = run.accuracy(model, *train.tensors)
        assert 0.0 <= acc <= 1.0
