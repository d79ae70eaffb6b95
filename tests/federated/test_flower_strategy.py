"""DP-FedAvg on Flower: the dpfy strategy and client app through Flower's Strategy.start loop,
message objects and ClientApp dispatch (InProcessGrid), against the in-process DP-FedAvg.

The reference is dpfy's in-process loop with the same seed: the same users are sampled, the
same noise is drawn, so the ledgers (and the models) must be equal.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("flwr", reason="Flower is the `fl` extra: pip install 'dpfy[fl]'")

from dpfy.adaptive import make  # noqa: E402
from dpfy.errors import PrivacyRefusal  # noqa: E402
from dpfy.federated import DPFedAvgServer, LocalTraining, run_dp_fedavg  # noqa: E402
from dpfy.federated.flower import (DPFedAvgStrategy, InProcessGrid, make_client_app,  # noqa: E402
                                   run_flower)

N_USERS, ROUNDS = 5, 3
TRAINING = LocalTraining(epochs=2, lr=0.2, batch_size=3)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


def _users():
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(4 + u, 4, generator=g), torch.randint(0, 3, (4 + u,), generator=g))
            for u in range(N_USERS)]


def _server(method=None):
    return DPFedAvgServer(_model(), num_users=N_USERS, user_sample_rate=0.6,
                          clip=None if method else 0.3, noise_multiplier=0.8, rounds=ROUNDS,
                          method=method, server_momentum=0.5, seed=11)


def _client_app(users, fail_node=None):
    def data(context):
        if context.node_id == fail_node:
            raise RuntimeError("this device went offline")
        return users[context.node_config["partition-id"]]
    return make_client_app(_model, data, F.cross_entropy)


@pytest.mark.parametrize("quantile", [False, True])
def test_a_flower_run_writes_the_in_process_ledger_for_the_same_seed(quantile):
    users = _users()
    method = (lambda: make("quantile", initial_clip=0.1, count_noise_std=0.5)) if quantile \
        else (lambda: None)
    reference = run_dp_fedavg(_server(method()), users, F.cross_entropy, TRAINING, ROUNDS,
                              local_seed=4)
    start = time.process_time()  # CPU time: a hang guard, not a timing
    flower = _server(method())
    result = run_flower(DPFedAvgStrategy(flower, TRAINING, local_seed=4), _client_app(users),
                        ROUNDS)
    assert time.process_time() - start < 60
    assert flower.ledger.to_dict() == reference.ledger.to_dict()
    assert flower.ledger.num_steps == ROUNDS
    for (name, p), (_, q) in zip(flower.model.named_parameters(),
                                 reference.model.named_parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=name)
    final = result.arrays.to_torch_state_dict()
    for name, p in flower.model.state_dict().items():
        assert torch.equal(final[name], p)
    assert sorted(result.train_metrics_clientapp) == list(range(1, ROUNDS + 1))
    assert result.evaluate_metrics_clientapp == {}          # no unaccounted client metrics


def test_a_dropped_client_contributes_nothing_and_the_round_is_still_recorded():
    users = _users()
    server = DPFedAvgServer(_model(), num_users=N_USERS, user_sample_rate=1.0, clip=0.3,
                            noise_multiplier=0.8, rounds=1, seed=3)
    result = run_flower(DPFedAvgStrategy(server, TRAINING), _client_app(users, fail_node=2), 1)
    metrics = result.train_metrics_clientapp[1]
    assert (metrics["users"], metrics["dropped"]) == (N_USERS - 1, 1)
    assert server.ledger.num_steps == 1


def test_the_flower_nodes_must_be_the_servers_users():
    server = DPFedAvgServer(_model(), num_users=N_USERS, user_sample_rate=0.5, clip=0.3,
                            noise_multiplier=1.0, rounds=1, seed=0)
    grid = InProcessGrid(_client_app(_users()), N_USERS + 1)
    strategy = DPFedAvgStrategy(server, TRAINING)
    from flwr.app import ArrayRecord, ConfigRecord
    with pytest.raises(PrivacyRefusal, match="nodes must be"):
        strategy.configure_train(1, ArrayRecord(server.model.state_dict()), ConfigRecord(),
                                 grid)
    assert server.ledger.num_steps == 0
