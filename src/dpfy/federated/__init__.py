"""Federated learning with user-level differential privacy: DP-FedAvg (McMahan et al. 2018).

The unit of privacy is one user, with all of their examples. A round samples users by dpfy's
Poisson sampler, each sampled user trains locally from the global model and clips their model
delta, the server adds Gaussian noise once to the sum and records the round in dpfy's ledger
as a user-level Poisson-subsampled Gaussian; the privacy report and ε read that ledger.

- :mod:`dpfy.federated.local`: the client's step (local SGD, the delta, its clipping);
- :mod:`dpfy.federated.server`: the server (sampling, clipping check, noise, ledger, update);
- :mod:`dpfy.federated.fedavg`: the two in one process;
- :mod:`dpfy.federated.flower`: the same on Flower (``pip install dpfy[fl]``), imported only
  when used.
"""

from dpfy.federated.fedavg import UserData, run_dp_fedavg
from dpfy.federated.local import (
    LocalTraining,
    clip_delta,
    delta_norm,
    local_delta,
    local_generator,
    local_seed,
    trainable_state,
    user_contribution,
)
from dpfy.federated.server import (
    USER_ADJACENCY,
    USER_UNIT,
    Contribution,
    DPFedAvgServer,
    RoundPlan,
    RoundResult,
)

__all__ = [
    "UserData",
    "run_dp_fedavg",
    "LocalTraining",
    "clip_delta",
    "delta_norm",
    "local_delta",
    "local_generator",
    "local_seed",
    "trainable_state",
    "user_contribution",
    "USER_ADJACENCY",
    "USER_UNIT",
    "Contribution",
    "DPFedAvgServer",
    "RoundPlan",
    "RoundResult",
]
