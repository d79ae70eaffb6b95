"""``dpfy train``'s private run (``dpfy.train.private``)."""

from __future__ import annotations

import torch
from torch import nn

from dpfy.train.private import per_example_cross_entropy


def test_the_per_example_loss_moves_the_batch_to_the_models_device():
    """HyFreeDP's and NoisyMax's loss probes and the per-example norm tracker call the loss on
    the batch as the private loader yields it: on the host where the training set is not held
    on the GPU (``train.device.hold_on_device``: it does not fit), while the model is on the
    GPU. A model on ``meta`` stands in for the GPU: torch refuses a host tensor there as it
    does on CUDA ("not on the expected device")."""
    model = nn.Linear(3, 4).to("meta")
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 3, 0])
    losses = per_example_cross_entropy(model, (x, y))
    assert losses.shape == (5,) and losses.device.type == "meta"
    # on the host the loss is torch's, per example
    host = nn.Linear(3, 4)
    want = nn.functional.cross_entropy(host(x), y, reduction="none")
    assert torch.equal(per_example_cross_entropy(host, (x, y)), want)
