"""DPTrainer with ``DPArguments(max_physical_batch_size=...)``: one Trainer step per logical
batch (issue 35 §2).

Before the fix the Trainer counted each physical batch as a step: an epoch ended after
``len(loader)`` physical batches (about 1/3 of the logical batches here, expected batch 8 cut
into physical batches of 3), ε stayed below the calibrated one, ``grad_norm`` 0.0 was logged on
the steps that did not update, and a second epoch raised "a logical batch must be finished
before the next one starts". The checks use the user's numbers (the target ε, the epochs) and
the Trainer's own step count; the physical split is checked against the same seeded run
without it (dpfy's claim: identical updates and ledger with and without splitting).
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from dpfy.hf import DPArguments, DPTrainer
from hf_models import Tokens, tiny_bert

N, B, EPOCHS = 24, 8, 2
STEPS = EPOCHS * math.ceil(N / B)  # the Trainer's (and dpfy's) steps for 2 epochs: 6


def _run(tmp_path, physical: int | None) -> DPTrainer:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=B, num_train_epochs=EPOCHS,
        learning_rate=0.05, optim="sgd", weight_decay=0.0, lr_scheduler_type="constant",
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
        disable_tqdm=True, seed=0)
    trainer = DPTrainer(model=tiny_bert(), args=args, train_dataset=Tokens(N),
                        dp_args=DPArguments(target_epsilon=2.0, target_delta=1e-3,
                                            max_physical_batch_size=physical,
                                            accountant="rdp", extra={"seed": 5}))
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[DPTrainer, DPTrainer]:
    """The run with physical batches of 3 rows and the same seeded run without them."""
    out = tmp_path_factory.mktemp("logical")
    return _run(out / "split", physical=3), _run(out / "whole", physical=None)


def test_two_epochs_with_physical_batches_train_the_calibrated_steps(runs):
    trainer = runs[0]
    opt = trainer.dp_optimizer
    assert trainer.state.global_step == STEPS
    assert opt.step_count == opt.ledger.num_steps == opt.max_steps == STEPS
    assert trainer.state.epoch == pytest.approx(EPOCHS)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == STEPS  # one log per update (logging_steps=1)
    assert all("grad_norm" not in h and h["released_grad_norm"] > 0 for h in logs)
    # the calibrated ε is spent: σ was calibrated for exactly these steps (RDP, the target 2.0)
    assert 1.9 <= logs[-1]["epsilon"] <= 2.0 + 1e-9
    assert trainer.epsilon() == pytest.approx(logs[-1]["epsilon"])


def test_physical_batches_give_the_run_without_them(runs):
    split, whole = runs
    assert split.dp_optimizer.step_count == whole.dp_optimizer.step_count == STEPS
    assert split.dp_optimizer.ledger.to_dict() == whole.dp_optimizer.ledger.to_dict()
    # the same seeded draws and noise; only the order of the float32 sums of clipped gradients
    # differs (partial sums of ≤ 3 rows against one), about 1e-7 relative per step over
    # 6 SGD steps of size ≤ lr·(C + noise)/b
    for (n, p), q in zip(split.model.named_parameters(), whole.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
