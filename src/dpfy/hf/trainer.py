"""``DPTrainer``: Hugging Face's ``transformers.Trainer`` with dpfy's private step.

An HF user keeps their ``TrainingArguments``, dataset, collator and model, and swaps
``Trainer`` for ``DPTrainer`` with a :class:`DPArguments`. What changes, and why:

- **The train dataloader is dpfy's**: the Trainer's plain loader (its collator, its
  ``per_device_train_batch_size`` as the expected batch) goes through :func:`dpfy.make_private`,
  which replaces the shuffling sampler with Poisson sampling (the sampling the accountant
  analyses). It is not passed to ``accelerator.prepare``: Accelerate's dataloader wrapper would
  re-batch it, and the ledger would no longer describe what was trained on.
- **The optimizer is dpfy's**: the Trainer builds its optimizer (AdamW with its weight-decay
  groups) as usual, then ``make_private`` wraps it; the LR scheduler is built on it.
- **The Trainer's own clipping is off** (``max_grad_norm`` is set to 0 with a logged note): it
  would clip the *batch* gradient, before dpfy has formed it; dpfy clips each example's gradient
  at :attr:`DPArguments.max_grad_norm` instead.
- **Logs**: ``grad_norm`` is the norm of the released (noisy, averaged) gradient, read right
  after each optimizer step (post-processing of the release, so free); ``epsilon`` is the
  privacy spent so far at ``target_delta`` by the run's accountant.
- **The privacy report** (``privacy_report.md``/``.json``) is written into ``output_dir`` at
  the end of :meth:`DPTrainer.train`.

Refused, with the fix: ``gradient_accumulation_steps > 1`` (a Poisson batch has no fixed
number of micro-batches; use :attr:`DPArguments.max_physical_batch_size`, which splits each
logical batch inside dpfy's step) and more than one process (use :func:`dpfy.make_private` in
a ``torch.distributed`` loop; see the distributed guide).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from dpfy.api import make_private
from dpfy.errors import PrivacyRefusal
from dpfy.optim import DPOptimizer
from dpfy.privacy.report import PrivacyReport

try:  # transformers is an optional dependency: the `dpfy[hf]` extra
    import transformers
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("dpfy.hf needs transformers: pip install 'dpfy[hf]'") from exc

__all__ = ["DPArguments", "DPTrainer"]

logger = logging.getLogger(__name__)


@dataclass
class DPArguments:
    """The privacy settings of a :class:`DPTrainer` run (those of :func:`dpfy.make_private`).

    Give ``target_epsilon`` (σ is calibrated for the Trainer's epochs or ``max_steps``) or
    ``noise_multiplier``. ``target_delta`` is also the δ of the logged ε and of the report.
    ``extra`` passes any other :func:`dpfy.make_private` keyword (``loss_fn``, ``method``,
    ``accountant``, ``seed``, ...).
    """

    target_delta: float
    target_epsilon: float | None = None
    noise_multiplier: float | None = None
    max_grad_norm: float = 1.0
    max_physical_batch_size: int | None = None
    accountant: str = "pld"
    extra: dict[str, Any] = field(default_factory=dict)


class DPTrainer(transformers.Trainer):
    """A ``transformers.Trainer`` whose training steps are dpfy's private steps (module doc)."""

    def __init__(self, *args: Any, dp_args: DPArguments, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.args.gradient_accumulation_steps != 1:
            raise PrivacyRefusal(
                f"dpfy.hf.DPTrainer: gradient_accumulation_steps must be 1, got "
                f"{self.args.gradient_accumulation_steps}: a Poisson-sampled batch has no fixed "
                f"number of micro-batches. Set DPArguments(max_physical_batch_size=...) to split "
                f"each logical batch into physical ones inside dpfy's step"
            )
        if dp_args.accountant not in ("pld", "rdp"):
            raise PrivacyRefusal(
                f"dpfy.hf.DPTrainer: DPArguments.accountant must be 'pld' or 'rdp' (the ε it "
                f"logs and reports), got {dp_args.accountant!r}. GDP is an approximation: read "
                f"it after training with trainer.dp_optimizer.epsilon(delta, 'gdp', "
                f"approximate=True)"
            )
        if self.args.world_size != 1:
            raise PrivacyRefusal(
                f"dpfy.hf.DPTrainer runs in one process, got world_size "
                f"{self.args.world_size}. For data-parallel training call dpfy.make_private in "
                f"a torch.distributed loop (docs: distributed training)"
            )
        if self.args.max_grad_norm:
            logger.info(
                "dpfy.hf.DPTrainer: the Trainer's batch-gradient clipping "
                "(max_grad_norm=%s) is off; dpfy clips each example's gradient at "
                "DPArguments.max_grad_norm=%s",
                self.args.max_grad_norm,
                dp_args.max_grad_norm,
            )
            self.args.max_grad_norm = 0.0
        # the model's own loss, averaged over the batch's examples: never divided by a token
        # count passed from outside (num_items_in_batch), which is not a per-example mean
        self.model_accepts_loss_kwargs = False
        self.dp_args = dp_args
        self.dp_optimizer: DPOptimizer | None = None
        self.released_grad_norm: float | None = None  # the last step's, public
        self.add_callback(_ReleasedGradNorm(self))

    # -- the private loader, model and optimizer, built together ------------------------------
    def get_train_dataloader(self) -> Any:  # a DPDataLoader, which iterates like a DataLoader
        """dpfy's Poisson loader; on the first call also privatizes the model and optimizer."""
        if self.train_dataset is None:
            raise ValueError("DPTrainer: training requires a train_dataset")
        collator: Callable[..., Any] = self._get_collator_with_removed_columns(
            self.data_collator, description="training"
        )
        plain = DataLoader(
            self.train_dataset,
            batch_size=self._train_batch_size,
            collate_fn=collator,
            num_workers=self.args.dataloader_num_workers,
        )
        if self.optimizer is None:
            self.create_optimizer()  # the Trainer's optimizer, before dpfy takes the parameters
        if self.dp_optimizer is not None:
            raise PrivacyRefusal(
                "dpfy.hf.DPTrainer: the train dataloader was requested twice; a second private "
                "loader would start a second, unaccounted sampler. Build a new DPTrainer for a "
                "new run"
            )
        a = self.dp_args
        epochs = None if self.args.max_steps > 0 else float(self.args.num_train_epochs)
        steps = self.args.max_steps if self.args.max_steps > 0 else None
        if self.model is None or self.optimizer is None:
            raise ValueError("DPTrainer: training requires a model")
        model, optimizer, loader = make_private(
            self.model,
            self.optimizer,
            plain,
            target_epsilon=a.target_epsilon,
            target_delta=a.target_delta if a.target_epsilon is not None else None,
            noise_multiplier=a.noise_multiplier,
            epochs=epochs,
            max_steps=steps,
            max_grad_norm=a.max_grad_norm,
            max_physical_batch_size=a.max_physical_batch_size,
            accountant=a.accountant,
            **a.extra,
        )
        self.model = self.model_wrapped = model
        self.optimizer = self.dp_optimizer = optimizer
        return loader

    # -- what the logs and the output directory say -----------------------------------------
    def epsilon(self) -> float:
        """ε spent so far at ``DPArguments.target_delta`` (the run's accountant)."""
        if self.dp_optimizer is None:
            return 0.0
        return float(self.dp_optimizer.epsilon(self.dp_args.target_delta))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.dp_optimizer is not None and "loss" in logs:  # training logs only
            logs = {**logs, "epsilon": self.epsilon()}
            if self.released_grad_norm is not None:
                logs["grad_norm"] = self.released_grad_norm
        super().log(logs, start_time)

    def privacy_report(self) -> PrivacyReport:
        """The run's privacy report (the unit of privacy is read from dpfy's sampler)."""
        if self.dp_optimizer is None:
            raise ValueError("DPTrainer.privacy_report: call train() first")
        opt = self.dp_optimizer
        return PrivacyReport.from_ledger(
            opt.ledger,
            delta=self.dp_args.target_delta,
            accountant=self.dp_args.accountant,
            unit_of_privacy=opt.sampler.units.description,
            model_description=f"{type(self.model).__name__} trained with dpfy.hf.DPTrainer",
            sampling_note="Poisson sampling by dpfy's sampler (the Trainer's shuffling "
            "sampler is replaced)",
            layer_table=opt.grads.explain_planned(),
        )  # no training batch's route

    def train(self, *args: Any, **kwargs: Any) -> Any:
        out = super().train(*args, **kwargs)
        if self.args.should_save and self.dp_optimizer is not None and self.args.output_dir:
            paths = self.privacy_report().write(self.args.output_dir)
            logger.info("dpfy privacy report written to %s", paths["markdown"])
        return out


class _ReleasedGradNorm(transformers.TrainerCallback):
    """Reads the released gradient's norm right after each optimizer step, before the Trainer
    zeroes the gradients (it is public: the noisy averaged gradient the step applied)."""

    def __init__(self, trainer: DPTrainer) -> None:
        self.trainer = trainer

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        opt = self.trainer.dp_optimizer
        if opt is None:
            return
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        self.trainer.released_grad_norm = (
            float(
                torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in grads]))
            )
            if grads
            else 0.0
        )
