"""``DPTrainer.train(resume_from_checkpoint=...)`` continues the run exactly (issue 35 §2).

Before the fix the resume crashed in Accelerate's ``skip_first_batches`` ('DPDataLoader' object
has no attribute 'batch_sampler'). A resumed run must continue the ledger, the sampler and the
noise as ``dpfy train --resume`` does: train k steps, stop, resume from the step-k checkpoint
to the end, and compare with the same seeded run trained without interruption. The reference
is that uninterrupted run (the same code path with no checkpoint in between), so the check is
the continuation itself, not a number from the code under test.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from dpfy.hf import DPArguments, DPTrainer
from hf_models import Tokens, tiny_bert

N, B, EPOCHS = 24, 8, 2  # 3 logical batches per epoch, 6 steps


class StopAt(transformers.TrainerCallback):
    """Interrupts the run after ``step`` updates (after that step's checkpoint is saved)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def _trainer(out, physical: int | None, stop: int | None = None, dropout: float = 0.0) -> DPTrainer:
    args = transformers.TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=B,
        num_train_epochs=EPOCHS,
        learning_rate=0.05,
        logging_steps=1,
        save_strategy="steps",
        save_steps=1,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    trainer = DPTrainer(
        model=tiny_bert(dropout),
        args=args,
        train_dataset=Tokens(N),
        dp_args=DPArguments(
            target_epsilon=2.0,
            target_delta=1e-3,
            max_physical_batch_size=physical,
            extra={"seed": 11},
        ),
        callbacks=[StopAt(stop)] if stop else None,
    )
    return trainer


# with dropout, the resumed steps must draw the masks the uninterrupted run drew: the
# Trainer's RNG state of the checkpoint is restored where that run stood when it was saved
# (mid-epoch: after the resumed run's new epoch iterator, which draws from torch's generator)
@pytest.mark.parametrize(
    "stop, physical, dropout",
    [(4, 3, 0.0), (4, None, 0.1), (4, 3, 0.1), (3, None, 0.1)],
    ids=[
        "mid-epoch-physical",
        "mid-epoch-dropout",
        "mid-epoch-physical-dropout",
        "epoch-end-dropout",
    ],
)
def test_a_resumed_run_equals_the_uninterrupted_one(tmp_path, stop, physical, dropout):
    whole = _trainer(tmp_path / "whole", physical, dropout=dropout)
    whole.train()

    first = _trainer(tmp_path / "resumed", physical, stop=stop, dropout=dropout)
    first.train()
    assert first.state.global_step == stop
    resumed = _trainer(tmp_path / "resumed", physical, dropout=dropout)
    resumed.train(resume_from_checkpoint=True)  # the newest checkpoint: checkpoint-{stop}

    ref, got = whole.dp_optimizer, resumed.dp_optimizer
    assert resumed.state.global_step == whole.state.global_step == 6
    assert got.ledger.to_dict() == ref.ledger.to_dict()  # one ledger, continued
    assert got.step_count == ref.step_count == 6
    assert got.epsilon(1e-3) == ref.epsilon(1e-3)
    assert resumed.state.epoch == pytest.approx(EPOCHS)
    # the same seeded draws, noise and arithmetic; the resumed parameters went through a
    # safetensors round trip (exact), so they agree to float32 rounding of the same ops
    for (n, p), q in zip(resumed.model.named_parameters(), whole.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=lambda m, n=n: f"{n}: {m}")
    # the resumed run logged the steps it trained, with the continued ε
    logs = [h for h in resumed.state.log_history if "loss" in h]
    assert [h["step"] for h in logs][-(6 - stop) :] == list(range(stop + 1, 7))
    assert logs[-1]["epsilon"] == pytest.approx(ref.epsilon(1e-3))
