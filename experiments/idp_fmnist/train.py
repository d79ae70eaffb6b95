"""Train, evaluate and account one run of the individualized-privacy reproduction.

Every variant goes through the same private run as ``dpfy train``
(:func:`dpfy.train.private.private_run`: ``make_private`` with Poisson sampling at q = b/N,
planned for ``epochs`` passes), the same loop (:func:`dpfy.train.epoch.run_epoch`) and evaluator.
The uniform variants calibrate σ to their ε with the spec's accountant; the IDP variants pass
the per-example budgets (``make_private(budgets=..., individual=...)``), which calibrates σ and
the per-group rates or thresholds with the same accountant and guards every group's budget.

Per group the record gives:

- ε at δ by PLD and by RDP, read from the group's own ledger (IDP) or from the run's ledger
  (uniform: every example is accounted alike);
- the training-set accuracy of the group's own examples after training. Test images have no
  budget; a random assignment of them to groups would only measure the overall test accuracy
  three times, so per-group accuracy is measured where the groups differ: on the examples
  each group contributed (a fit measure, not a generalization measure; non-private diagnostic).

No seed: the model's initialization, Poisson sampling and noise come from the OS CSPRNG.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dpfy._require import require
from experiments.idp_fmnist.spec import IdpSpec
from dpfy.models import build_model
from dpfy.privacy import epsilon
from dpfy.privacy.individual import assign_groups, random_budgets
from dpfy.train.epoch import run_epoch
from dpfy.train.evaluate import EVAL_BATCH, evaluate
from dpfy.train.private import private_run

__all__ = ["train_idp", "group_accuracies"]


@torch.no_grad()
def group_accuracies(model: torch.nn.Module, data: TensorDataset,
                     group_of: np.ndarray, groups: int) -> list[float]:
    """Accuracy in % of ``model`` on the examples of each group (``group_of``: (N,) index)."""
    was = model.training
    model.eval()
    correct = np.zeros(groups)
    counts = np.bincount(group_of, minlength=groups)
    for start in range(0, len(data), EVAL_BATCH):
        x, y = data[start:start + EVAL_BATCH]
        hit = (model(x).argmax(1) == y).numpy()                          # (B,)
        correct += np.bincount(group_of[start:start + EVAL_BATCH], weights=hit,
                               minlength=groups)
    model.train(was)
    return [100.0 * c / max(n, 1) for c, n in zip(correct, counts)]


def train_idp(spec: IdpSpec, train: TensorDataset, test: TensorDataset, *,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train one :class:`IdpSpec` on ``train``; returns its JSON-able record (no seed in it)."""
    t0 = time.time()
    budgets = random_budgets(spec.budgets, spec.fractions, len(train), spec.budget_seed)
    assignment = assign_groups(budgets, len(train))
    torch.manual_seed(secrets.randbits(63))                              # model init only
    model = build_model("tanh_cnn", input_shape=tuple(train.tensors[0].shape[1:]),
                        num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=spec.momentum)
    engine: dict[str, Any] = dict(target_delta=spec.delta, max_grad_norm=spec.clip,
                                  accountant=spec.accountant)
    if spec.individual is None:
        engine["target_epsilon"] = spec.uniform_epsilon
    else:
        engine.update(budgets=budgets, individual=spec.individual)
    private = private_run(model, opt, train, batch_size=spec.batch_size, epochs=spec.epochs,
                          **engine)
    optimizer = private.optimizer
    epochs = []
    for e in range(spec.epochs):
        run_epoch(private, delta=spec.delta)
        epochs.append({"epoch": e + 1, "step": optimizer.step_count,
                       "test_accuracy": 100.0 * evaluate(private.model, test)[1]})
        if progress:
            progress(f"  {spec.case} {spec.variant} rep {spec.replicate}: epoch {e + 1}/"
                     f"{spec.epochs} acc {epochs[-1]['test_accuracy']:.2f}% "
                     f"({time.time() - t0:.0f}s)")
    accs = group_accuracies(private.model, train, assignment.group_of, len(assignment.budgets))
    record: dict[str, Any] = {
        "key": spec.key(), "spec": spec.to_dict(), "steps": optimizer.ledger.num_steps,
        "sample_rate": spec.batch_size / len(train), "sampler_rate": private.sample_rate,
        "test_accuracy": epochs[-1]["test_accuracy"],
        "epochs": epochs, "groups": _group_rows(spec, optimizer, assignment, accs),
        "group_ledgers": None if optimizer.privacy_groups is None else optimizer.privacy_groups.to_dict(),
        "seconds": time.time() - t0,
    }
    return record


def _group_rows(spec: IdpSpec, optimizer: Any, assignment: Any,
                accs: list[float]) -> list[dict[str, Any]]:
    """One row per group: budget, share, ε (PLD, RDP) from its ledger, q_p, σ_p, accuracy."""
    if optimizer.privacy_groups is not None:
        ledgers = optimizer.privacy_groups.ledgers
        facts = [(g.sample_rate, optimizer.noise_multiplier / g.clip_fraction)
                 for g in optimizer.privacy_groups.groups]
    else:                                      # uniform: every example has the run's ledger
        ledgers = [optimizer.ledger] * len(assignment.budgets)
        facts = [(optimizer.sampler.sample_rate, optimizer.noise_multiplier)] * len(ledgers)
    rows = []
    for p, (budget, size, ledger, (q, sigma), acc) in enumerate(zip(
            assignment.budgets, assignment.sizes, ledgers, facts, accs, strict=True)):
        eps = {acc_name: epsilon(ledger, delta=spec.delta, accountant=acc_name)
               for acc_name in ("pld", "rdp")}
        if spec.individual is not None:        # the guard held every group to its budget
            require(eps[spec.accountant] <= budget * (1 + 1e-9), f"group {p}'s ε",
                    eps[spec.accountant], f"<= its budget {budget:g}",
                    "This is a dpfy bug: the per-group guard let a group overspend")
        rows.append({"group": p, "budget": budget, "examples": size,
                     "fraction": size / len(assignment.group_of), "epsilon_pld": eps["pld"],
                     "epsilon_rdp": eps["rdp"], "sample_rate": q, "noise_multiplier": sigma,
                     "train_accuracy": acc})
    return rows
