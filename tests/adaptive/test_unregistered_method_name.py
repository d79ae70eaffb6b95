"""A method that is not in the registry (a user's own ``Method`` subclass: its registry name
is "") is named by its class wherever dpfy names a method (``dpfy.adaptive.method_name``):
the federated server's privacy report (which refused a method row with an empty name), the
optimizer's refusal of ``observe`` and the Flower strategy's summary (which said "")."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive import Method, method_name
from dpfy.federated import DPFedAvgServer, LocalTraining, run_dp_fedavg


class Unlisted(Method):
    """Not registered, and no hook overridden: keeps the run's σ and C."""


def _server() -> DPFedAvgServer:
    torch.manual_seed(0)
    return DPFedAvgServer(
        nn.Sequential(nn.Linear(4, 3)),
        num_users=4,
        user_sample_rate=1.0,
        clip=0.05,
        noise_multiplier=1.0,
        rounds=2,
        seed=0,
        method=Unlisted(),
    )


def test_the_helper_names_an_unregistered_method_by_its_class():
    assert Unlisted.registry_name == ""
    assert method_name(Unlisted()) == "Unlisted"


def test_the_federated_report_names_an_unregistered_method():
    g = torch.Generator().manual_seed(3)
    users = [(torch.randn(3, 4, generator=g), torch.randint(0, 3, (3,), generator=g))] * 4
    server = _server()
    run_dp_fedavg(server, users, F.cross_entropy, LocalTraining(epochs=1, lr=0.1), 1)
    assert [row["name"] for row in server.privacy_report().methods] == ["Unlisted"]


def test_the_observe_refusal_names_an_unregistered_method():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 3, (8,))), batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fixed seed warns
        _, opt, _ = dpfy.make_private(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            loader,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            method=Unlisted(),
            seed=0,
        )
    with pytest.raises(ValueError, match="got the method = 'Unlisted'"):
        opt.observe(val_metric=0.5)


def test_the_flower_summary_names_an_unregistered_method(monkeypatch):
    pytest.importorskip("flwr")
    from dpfy.federated import flower

    lines: list[str] = []
    monkeypatch.setattr(flower, "log", lambda level, msg, *args: lines.append(msg % args))
    flower.DPFedAvgStrategy(_server(), LocalTraining(epochs=1, lr=0.1)).summary()
    assert "method = Unlisted" in lines[0]
