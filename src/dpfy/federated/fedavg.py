"""DP-FedAvg in one process: the server, and each sampled user's local training, in a loop.

The same :class:`~dpfy.federated.server.DPFedAvgServer` and the same client step
(:func:`~dpfy.federated.local.user_contribution`) run under Flower in
:mod:`dpfy.federated.flower`; for one seed the two write the same ledger and the same model.
Use this loop when the users' data is in one datacenter (DP-FedAvg works "centralised" too:
local training is then training on one user's data), and for experiments.
"""

from __future__ import annotations

import copy
from typing import Callable, Sequence

import torch

from dpfy._require import require
from dpfy.federated.local import (
    LocalTraining,
    LossFn,
    local_generator,
    user_contribution,
    local_seed as local_seed_of,
)
from dpfy.federated.server import Contribution, DPFedAvgServer, RoundResult

__all__ = ["UserData", "run_dp_fedavg"]

UserData = Sequence[tuple[torch.Tensor, torch.Tensor]]  # user u ↦ (x_u, y_u)


def run_dp_fedavg(
    server: DPFedAvgServer,
    users: UserData,
    loss_fn: LossFn,
    training: LocalTraining,
    rounds: int,
    *,
    local_seed: int | None = None,
    on_round: Callable[[RoundResult], None] | None = None,
) -> DPFedAvgServer:
    """Run ``rounds`` rounds of DP-FedAvg on ``users`` (one (x_u, y_u) per user, indexed like
    the server's users); returns the server (its model, ledger and report).

    Args:
      server: the server (sampler, noise, ledger, global model).
      users: N_users pairs (x_u, y_u), user u's examples.
      loss_fn: the local loss, ``loss_fn(model(x), y)`` (a mean over the minibatch, as in
        Algorithm 2; a summed loss scales the delta by the batch size).
      training: the local training (epochs, local learning rate, minibatch size).
      rounds: how many rounds to run now.
      local_seed: seeds each user's local minibatch order (see ``local_generator``).
      on_round: called with each round's released result (e.g. to evaluate on public data).
    """
    require(
        len(users) == server.num_users,
        "len(users)",
        len(users),
        f"{server.num_users} (the server's num_users)",
        "The sampler draws from every user of the population",
    )
    require(isinstance(rounds, int) and rounds >= 1, "rounds", rounds, "an integer >= 1")
    work = copy.deepcopy(server.model)
    for _ in range(rounds):
        rp = server.begin_round()
        global_state = server.model.state_dict()
        contributions = []
        for u in rp.users:
            work.load_state_dict(global_state)
            x, y = users[u]
            clipped, norm = user_contribution(
                work,
                x,
                y,
                loss_fn,
                training,
                rp.clip,
                generator=local_generator(local_seed_of(local_seed, rp.round, u)),
            )
            contributions.append(Contribution(user=u, clipped=clipped, norm=norm))
        result = server.finish_round(contributions)
        if on_round is not None:
            on_round(result)
    return server
