"""dpfy.hf.DPTrainer: a transformers.Trainer run whose steps are dpfy's private steps.

A tiny BERT classifier and a tiny GPT-2 LM train with the Trainer's own loop. The checks use
numbers the user gave (the target ε) or that the Trainer itself reports (its step count), and
an independent replay of the released update for ``grad_norm``: with plain SGD (no momentum,
no weight decay, constant lr η) the step applied θ' = θ − η·ĝ, so ‖ĝ‖ = ‖θ − θ'‖/η.
"""

from __future__ import annotations

import json
import warnings
import math

import pytest
import torch
import transformers

from dpfy.errors import PrivacyRefusal
from dpfy.hf import DPArguments, DPTrainer
from hf_models import Tokens, tiny_bert, tiny_gpt2


def _args(tmp_path, **kw) -> transformers.TrainingArguments:
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=16, num_train_epochs=1,
                learning_rate=0.05, logging_steps=1, save_strategy="no", report_to="none",
                use_cpu=True, disable_tqdm=True, seed=0)
    return transformers.TrainingArguments(**{**base, **kw})


@pytest.mark.parametrize("task, build", [("classify", tiny_bert), ("lm", tiny_gpt2)],
                         ids=["bert-classifier", "gpt2-lm"])
def test_a_trainer_run_spends_the_target_epsilon_logs_it_and_writes_the_report(tmp_path, task,
                                                                               build):
    model = build()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = DPTrainer(model=model, args=_args(tmp_path), train_dataset=Tokens(48, task=task),
                        dp_args=DPArguments(target_epsilon=2.0, target_delta=1e-3,
                                            max_grad_norm=1.0, accountant="rdp"))
    trainer.train()
    steps = trainer.state.global_step
    assert steps == math.ceil(48 / 16)  # the Trainer's loop: one epoch of logical batches
    assert trainer.dp_optimizer.step_count == steps  # every step is in the ledger
    logs = [h for h in trainer.state.log_history if "loss" in h]
    eps = [h["epsilon"] for h in logs]
    assert eps == sorted(eps) and 1.9 <= eps[-1] <= 2.0 + 1e-9  # the user's target, spent
    assert all("grad_norm" not in h and h["released_grad_norm"] > 0 for h in logs)
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    report = json.loads((tmp_path / "privacy_report.json").read_text())
    assert report["epsilon"] == pytest.approx(eps[-1], rel=1e-6)
    assert "one example" in (tmp_path / "privacy_report.md").read_text()


def test_released_grad_norm_in_the_logs_is_the_released_gradients_norm(tmp_path):
    model = tiny_bert()
    args = _args(tmp_path, num_train_epochs=1, max_steps=1, optim="sgd", weight_decay=0.0,
                 lr_scheduler_type="constant", learning_rate=0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = DPTrainer(model=model, args=args, train_dataset=Tokens(64),
                        dp_args=DPArguments(noise_multiplier=1.0, target_delta=1e-3,
                                            max_grad_norm=1.0))
    trainer.train()
    moved = torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(p.detach() - before[n]) for n, p in model.named_parameters()]))
    logged = [h["released_grad_norm"] for h in trainer.state.log_history if "loss" in h]
    assert logged == [pytest.approx(float(moved) / 0.5, rel=1e-4)]


def test_gradient_accumulation_is_refused_naming_the_physical_batch_option(tmp_path):
    with pytest.raises(PrivacyRefusal, match="max_physical_batch_size"):
        DPTrainer(model=tiny_bert(), args=_args(tmp_path, gradient_accumulation_steps=2),
                  train_dataset=Tokens(64), dp_args=DPArguments(target_delta=1e-3,
                                                                noise_multiplier=1.0))


def test_a_gdp_accountant_is_refused_before_training_naming_the_rigorous_ones(tmp_path):
    with pytest.raises(PrivacyRefusal, match="must be 'pld' or 'rdp'"):
        DPTrainer(model=tiny_bert(), args=_args(tmp_path), train_dataset=Tokens(64),
                  dp_args=DPArguments(target_delta=1e-3, noise_multiplier=1.0,
                                      accountant="gdp"))


def test_pushing_the_checkpoints_of_a_seeded_run_is_refused(tmp_path):
    # each checkpoint's optimizer.pt holds the seed and generator states (they undo the noise)
    args = _args(tmp_path, push_to_hub=True, hub_strategy="checkpoint", hub_model_id="x/y")
    with pytest.raises(PrivacyRefusal, match="hub_strategy"):
        DPTrainer(model=tiny_bert(), args=args, train_dataset=Tokens(64),
                  dp_args=DPArguments(target_delta=1e-3, noise_multiplier=1.0,
                                      extra={"seed": 0}))


def test_the_models_own_token_mean_is_refused_when_asked_for(tmp_path):
    # per_example_token_loss=False: the model's own loss, HF's token mean over the padded batch
    # (examples 0, 3, 6, ... have 4 ignored labels): the probe refuses it at the first step
    trainer = DPTrainer(model=tiny_gpt2(), args=_args(tmp_path, max_steps=1),
                        train_dataset=Tokens(48, task="lm", pad=True),
                        dp_args=DPArguments(target_delta=1e-3, noise_multiplier=1.0,
                                            per_example_token_loss=False, extra={"seed": 1}))
    with pytest.raises(PrivacyRefusal, match="output gradient, in the backward pass"):
        trainer.train()


def test_a_warning_says_once_why_no_grad_norm_is_logged(tmp_path, monkeypatch):
    import dpfy.hf.trainer as module

    monkeypatch.setattr(module, "_warned", False)
    with pytest.warns(UserWarning, match=r"clip_grad_norm_.*returns 0\.0"):
        DPTrainer(model=tiny_bert(), args=_args(tmp_path), train_dataset=Tokens(64),
                  dp_args=DPArguments(target_delta=1e-3, noise_multiplier=1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second trainer does not repeat it
        DPTrainer(model=tiny_bert(), args=_args(tmp_path), train_dataset=Tokens(64),
                  dp_args=DPArguments(target_delta=1e-3, noise_multiplier=1.0))


# The report's sampling note and unit of privacy are the run's (issue 37): DPTrainer used to say
# "Poisson sampling" whatever dpfy's sampler did. 48 examples, expected batch 16: q = 16/48 for
# examples; 24 users of 2 examples each: q_u = 16/24 (ULS reads the batch size as users per step).
# Each expected note is the one `dpfy train` writes for that sampler, with q to 5 digits.
@pytest.mark.parametrize("extra, note, unit", [
    ({}, "Poisson sampling by dpfy's sampler (the Trainer's shuffling sampler is replaced)",
     "one example"),
    ({"poisson_sampling": False},
     f"Shuffled passes (one per epoch) by dpfy's sampler, q = {16 / 48:.5g}, 3 steps per epoch",
     "one example"),
    ({"noise": "tree"},  # DP-FTRL's tree assumes one participation per pass: shuffled passes
     f"Shuffled passes (one per epoch) by dpfy's sampler, q = {16 / 48:.5g}, 3 steps per epoch",
     "one example"),
    ({"noise": "bandmf", "bands": 2},  # 2 groups of 24, each example's rate 16/24 in its own
     f"Cyclic Poisson sampling (Poisson within each band's group) by dpfy's sampler, "
     f"q = {16 / 24:.5g}, 3 steps per epoch", "one example"),
    ({"user_ids": torch.arange(48) // 2, "user_sampling": "uls"},
     f"Poisson sampling by dpfy's sampler, q = {16 / 24:.5g} (per user), ",
     "one user, with all of their examples"),
], ids=["poisson", "shuffled", "tree", "bandmf", "user-level"])
def test_the_report_states_the_sampling_and_unit_the_run_used(tmp_path, extra, note, unit):
    trainer = DPTrainer(model=tiny_bert(), args=_args(tmp_path, max_steps=1),
                        train_dataset=Tokens(48),
                        dp_args=DPArguments(target_delta=1e-3, noise_multiplier=1.0,
                                            extra={"seed": 0, **extra}))
    trainer.train()
    report = trainer.privacy_report()
    assert report.sampling_note.startswith(note)
    assert extra == {} or "Poisson sampling by dpfy's sampler (the Trainer" not in \
        report.sampling_note
    assert report.unit_of_privacy == unit
    assert unit in (tmp_path / "privacy_report.md").read_text()
