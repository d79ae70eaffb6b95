"""The run's facts (:class:`dpfy.types.RunFacts`) read from its spec and its built sampler.

What a method's ``calibrate`` and σ's calibration read (q, N, the run's length, the sampling,
δ, the target ε, C, the optimizer): ``make_private``'s builder and the DP-FedAvg server both
take them from here, so a run built either way states its facts in one way.
"""

from __future__ import annotations

from typing import Any, Mapping

from dpfy.privacy.events import SamplingKind
from dpfy.spec.run import RunSpec
from dpfy.types import RunFacts

__all__ = ["run_facts"]


def run_facts(
    spec: RunSpec,
    kind: SamplingKind,
    *,
    steps: int | None,
    steps_per_epoch: int,
    normalizer: float,
    max_grad_norm: float | None,
    optimizer: str,
    hyperparameters: Mapping[str, Any],
    num_groups: int | None = None,
) -> RunFacts:
    """The facts of a run of ``spec`` whose sampler drew as ``kind`` (its resolved sampling:
    q, N and the user cap as accounted), for ``steps`` steps of ``steps_per_epoch`` per pass,
    dividing the noisy sum by ``normalizer``; C when it is one number, the wrapped optimizer's
    class name and hyperparameters, and the clipping groups (layers) when per-layer."""
    acc = spec.accounting
    return RunFacts(
        sampling=kind.sampling,
        sample_rate=kind.sample_rate,
        steps=steps,
        dataset_size=kind.dataset_size,
        steps_per_epoch=steps_per_epoch,
        normalizer=normalizer,
        delta=acc.delta,
        target_epsilon=acc.target_epsilon,
        accountant=acc.accountant,
        max_grad_norm=max_grad_norm,
        num_groups=num_groups,
        inner_optimizer=optimizer,
        inner_hyperparameters=dict(hyperparameters),
        max_examples_per_user=kind.max_examples_per_user,
    )
