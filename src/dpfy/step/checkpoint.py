"""What a resumed run may take from a checkpoint: its ledger never goes backwards, and it
belongs to the model state it was saved with.

A checkpoint's ledger counts the releases that produced the model saved beside it. Two ways of
loading one would let ε be under-reported without a word:

- **An earlier state into an optimizer that trained further** (restore the best checkpoint,
  reset momentum by reloading the first state): the ledger would be replaced by a shorter
  one, while every release this optimizer made since stays in the world (and in the model,
  if its weights are not restored too). :func:`check_ledger_continues` refuses a ledger that
  does not extend the one this optimizer holds.
- **A ledger beside another model's weights** (the optimizer state of one run, the model of a
  later one): :func:`parameters_digest` is stored with the ledger and
  :func:`check_same_parameters` refuses a load whose model parameters differ from the saved
  ones, so the model must be loaded from the same checkpoint first.
"""

from __future__ import annotations

import hashlib
from typing import Mapping

import torch

from dpfy.errors import PrivacyRefusal
from dpfy.privacy import Ledger

__all__ = ["parameters_digest", "check_same_parameters", "check_ledger_continues"]


def parameters_digest(params: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of the private parameters: names, dtypes, shapes and bytes, in name order.

    Public information about the model only (the weights themselves are in the checkpoint),
    so it needs no more protection than they do.
    """
    h = hashlib.sha256()
    for name in sorted(params):
        t = params[name].detach()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_same_parameters(saved: str, params: Mapping[str, torch.Tensor]) -> None:
    """Refuse an optimizer state whose ledger was saved beside other parameter values."""
    now = parameters_digest(params)
    if now != saved:
        raise PrivacyRefusal(
            f"the model's trainable parameters must be the ones this optimizer state was "
            f"saved with (SHA-256 {saved[:12]}…), got parameters with digest {now[:12]}…: "
            f"its ledger counts the releases that produced those weights, not these. Load the "
            f"model's state from the same checkpoint first (model.load_state_dict(ckpt["
            f"'model']), then optimizer.load_state_dict(ckpt['optimizer']))"
        )


def check_ledger_continues(current: Ledger, loaded: Ledger) -> None:
    """Refuse ``loaded`` unless it extends ``current``: the ledger never goes backwards.

    A fresh optimizer (empty ledger) takes any checkpoint; one that already released steps
    takes only a state whose ledger begins with exactly those steps (reloading the state it
    is in, or a later one of the same run).
    """
    n = current.num_steps
    if n == 0:
        return
    if loaded.num_steps < n:
        raise PrivacyRefusal(
            f"the optimizer state's ledger must not be shorter than what this optimizer "
            f"already released, got a state of {loaded.num_steps} steps into an optimizer "
            f"that released {n}: the ε it reports would drop while the {n - loaded.num_steps} "
            f"later releases stay in the world. To restore earlier weights, load only the "
            f"model (model.load_state_dict(ckpt['model'])) and keep this optimizer and its "
            f"ledger; to reset the inner optimizer's momentum, clear optimizer.state; to "
            f"branch from the checkpoint, build a new run with make_private in a fresh "
            f"process and load it there (each published branch's ε composes with the others')"
        )
    if loaded.prefix(n).step_groups != current.step_groups:
        raise PrivacyRefusal(
            f"the optimizer state's ledger must begin with the {n} steps this optimizer "
            f"already released, got a ledger that records other steps: those releases would "
            f"vanish from the account. Load a checkpoint into a freshly built optimizer "
            f"(make_private) before training with it"
        )
