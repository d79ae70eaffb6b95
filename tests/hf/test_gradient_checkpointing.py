"""Gradient checkpointing (HF's ``gradient_checkpointing=True``) with dpfy.

Non-reentrant checkpointing recomputes the forward inside the backward; dpfy's per-example
gradients must be those of the run without it. Reentrant checkpointing (the Trainer's default
when ``gradient_checkpointing_kwargs`` does not say) cannot run dpfy's perturbation probe
(``torch.autograd.grad`` through it raises), so:

- ``DPTrainer`` uses ``use_reentrant=False`` unless the user set it (before: every
  ``gradient_checkpointing=True`` run was refused at the first step);
- in a plain loop the refusal names the fix (before it suggested ``declare_row_wise=True``,
  which skips the check instead of making it possible).
"""

from __future__ import annotations

import pytest
import torch
import transformers

import dpfy  # noqa: F401  (the Conv1D rule's import hook)
from dpfy.errors import PrivacyRefusal
from dpfy.hf import DPArguments, DPTrainer
from hf_models import Tokens, first_batch, private, tiny_gpt2


def _one_step(checkpointing: dict | None) -> dict[str, torch.Tensor]:
    model = tiny_gpt2()
    if checkpointing is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing)
    model.train()
    model, opt, loader = private(model, Tokens(24, task="lm"))  # σ = 0, SGD lr 1, seed 3
    batch = first_batch(loader, min_rows=3)
    opt.zero_grad()
    model(**batch).loss.backward()
    opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_non_reentrant_checkpointing_gives_the_same_private_step() -> None:
    plain, ckpt = _one_step(None), _one_step({"use_reentrant": False})
    for name, p in plain.items():
        # the same float32 operations recomputed in the same order: equal up to a few ulps
        torch.testing.assert_close(ckpt[name], p, rtol=1e-5, atol=1e-6, msg=name)


def test_reentrant_checkpointing_is_refused_naming_use_reentrant_false() -> None:
    with pytest.raises(PrivacyRefusal, match="use_reentrant=False"):
        _one_step({"use_reentrant": True})


def test_dp_trainer_with_gradient_checkpointing_trains(tmp_path) -> None:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_train_epochs=1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        gradient_checkpointing=True,
    )
    trainer = DPTrainer(
        model=tiny_gpt2(),
        args=args,
        train_dataset=Tokens(24, task="lm"),
        dp_args=DPArguments(noise_multiplier=1.0, target_delta=1e-5),
    )
    trainer.train()
    assert trainer.state.global_step == 3
    assert trainer.args.gradient_checkpointing_kwargs == {"use_reentrant": False}
