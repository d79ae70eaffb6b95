"""``DPTrainer``: Hugging Face's ``transformers.Trainer`` with dpfy's private step.

An HF user keeps their ``TrainingArguments``, dataset, collator and model, and swaps
``Trainer`` for ``DPTrainer`` with a :class:`DPArguments`. What changes, and why:

- **The train dataloader is dpfy's**: the Trainer's plain loader (its collator, its
  ``per_device_train_batch_size`` as the expected batch) goes through :func:`dpfy.make_private`,
  which replaces the shuffling sampler with dpfy's own (Poisson sampling by default; shuffled
  passes with ``poisson_sampling=False`` or ``noise="tree"``, cyclic Poisson with
  ``noise="bandmf"``, users with ``user_ids``: the sampling the accountant analyses). It is
  not passed to ``accelerator.prepare``: Accelerate's dataloader wrapper would re-batch it,
  and the ledger would no longer describe what was trained on.
- **The optimizer is dpfy's**: the Trainer builds its optimizer (AdamW with its weight-decay
  groups) as usual, then ``make_private`` wraps it; the LR scheduler is built on it.
- **One Trainer step is one logical batch** (:mod:`dpfy.hf.logical`): with
  :attr:`DPArguments.max_physical_batch_size` the loader's item is the whole logical batch and
  :meth:`DPTrainer.training_step` runs its physical batches, so Trainer steps, optimizer
  updates, LR-scheduler steps and ledger steps are one count, and ``num_train_epochs`` trains
  exactly the steps σ was calibrated for.
- **The loss of token-level labels is per example** (:mod:`dpfy.hf.token_loss`): for causal
  LMs, masked LMs, token classification and seq2seq models, each example's mean over its
  non-ignored labels, then the mean over the batch (Hugging Face's own loss is one token mean
  over the batch, which couples the examples). Other models keep their own loss.
- **The Trainer's own clipping is off** (``max_grad_norm`` is set to 0): it would clip the
  *batch* gradient, before dpfy has formed it, and torch's ``clip_grad_norm_`` reads 0.0 on a
  private model (dpfy holds each parameter's gradient until ``optimizer.step()``, so ``p.grad``
  is None after ``backward()``); a warning says so once. dpfy clips each example's gradient at
  :attr:`DPArguments.max_grad_norm` instead.
- **Logs**: no ``grad_norm``; ``released_grad_norm`` is the norm of the released (noisy,
  averaged) gradient the update applied, read right after each optimizer step (post-processing
  of the release, so free); ``epsilon`` is the privacy spent so far at ``target_delta`` by the
  run's accountant.
- **Resume** (``train(resume_from_checkpoint=...)``): the checkpoint's ``optimizer.pt`` is the
  private optimizer's state (ledger, sampler and noise generator states, budget guard), loaded
  after the model's weights; the Trainer does not skip batches by drawing them
  (``ignore_data_skip``), the restored sampler continues with the next draw. A checkpoint of a
  seeded run holds the seed: it is secret.
- **The privacy report** (``privacy_report.md``/``.json``) is written into ``output_dir`` at
  the end of :meth:`DPTrainer.train`; its sampling note and unit of privacy are the run spec's
  (:func:`dpfy.spec.report_context`), so they name the sampler and unit the run used.

Refused, with the fix: ``gradient_accumulation_steps > 1`` (a Poisson batch has no fixed
number of micro-batches; use :attr:`DPArguments.max_physical_batch_size`), more than one
process (use :func:`dpfy.make_private` in a ``torch.distributed`` loop; see the distributed
guide), and the options that iterate the training data outside the steps
(``include_tokens_per_second``) or read a whole logical batch before it is drawn
(``include_num_input_tokens_seen`` with physical batches).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from dpfy.api import make_private
from dpfy.errors import PrivacyRefusal
from dpfy.hf.logical import LogicalBatch, LogicalBatches
from dpfy.hf.refusals import refuse_pushed_seed, refuse_settings
from dpfy.hf.token_loss import token_loss, token_loss_kind
from dpfy.optim import DPOptimizer
from dpfy.privacy.ledger import Sampling
from dpfy.privacy.report import PrivacyReport
from dpfy.spec import report_context

try:  # transformers is an optional dependency: the `dpfy[hf]` extra
    import transformers
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("dpfy.hf needs transformers: pip install 'dpfy[hf]'") from exc

__all__ = ["DPArguments", "DPTrainer"]

logger = logging.getLogger(__name__)

GRAD_NORM_NOTE = (
    "dpfy.hf.DPTrainer logs no grad_norm: torch.nn.utils.clip_grad_norm_, which the Trainer "
    "uses to compute it, returns 0.0 on a private model, because dpfy holds each trained "
    "parameter's gradient until optimizer.step() (p.grad is None after backward()). The "
    "Trainer's batch clipping (TrainingArguments.max_grad_norm) is off; dpfy clips each "
    "example's gradient at DPArguments.max_grad_norm. The logs carry released_grad_norm, the "
    "norm of the noisy averaged gradient each update applied"
)
_warned = False  # GRAD_NORM_NOTE is shown once per process
# The sampling note of an example-level Poisson run (other samplings: dpfy.spec.report_context)
POISSON_NOTE = "Poisson sampling by dpfy's sampler (the Trainer's shuffling sampler is replaced)"


@dataclass
class DPArguments:
    """The privacy settings of a :class:`DPTrainer` run (those of :func:`dpfy.make_private`).

    Give ``target_epsilon`` (σ is calibrated for the Trainer's epochs or ``max_steps``) or
    ``noise_multiplier``. ``target_delta`` is also the δ of the logged ε and of the report.
    ``extra`` passes any other :func:`dpfy.make_private` keyword (``method``, ``seed``, ...).
    ``per_example_token_loss`` (default True): for token-level labels (causal LM, masked LM,
    token classification, seq2seq) the Trainer's loss is each example's token mean, then the
    mean over the batch (:mod:`dpfy.hf.token_loss`); False keeps the model's own loss, which
    dpfy refuses at the first step where it couples the examples.
    """

    target_delta: float
    target_epsilon: float | None = None
    noise_multiplier: float | None = None
    max_grad_norm: float = 1.0
    max_physical_batch_size: int | None = None
    accountant: str = "pld"
    per_example_token_loss: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


class DPTrainer(transformers.Trainer):
    """A ``transformers.Trainer`` whose training steps are dpfy's private steps (module doc)."""

    def __init__(self, *args: Any, dp_args: DPArguments, **kwargs: Any) -> None:
        refuse_pushed_seed(kwargs.get("args", args[1] if len(args) > 1 else None), dp_args.extra)
        super().__init__(*args, **kwargs)
        refuse_settings(self.args, dp_args.accountant, dp_args.max_physical_batch_size)
        global _warned
        if not _warned:
            warnings.warn(GRAD_NORM_NOTE, UserWarning, stacklevel=2)
            _warned = True
        self.args.max_grad_norm = 0.0
        if self.args.gradient_checkpointing:  # reentrant checkpointing cannot be probed
            given = self.args.gradient_checkpointing_kwargs  # a dict after HF's __post_init__
            kw: dict[str, Any] = dict(given) if isinstance(given, dict) else {}
            kw.setdefault("use_reentrant", False)  # an explicit True is refused, with the fix
            self.args.gradient_checkpointing_kwargs = kw
        # the model's own loss, averaged over the batch's examples: never divided by a token
        # count passed from outside (num_items_in_batch), which is not a per-example mean
        self.model_accepts_loss_kwargs = False
        self.dp_args = dp_args
        self.dp_optimizer: DPOptimizer | None = None
        self.released_grad_norm: float | None = None  # the last step's, public
        self._loader: Any = None  # dpfy's DPDataLoader
        self._token_loss: str | None | bool = False  # False: not read from the model yet
        self._rng_checkpoint: Any = None  # a mid-epoch resume's RNG state, loaded at its step
        self.add_callback(_AfterUpdate(self))

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
        self._loader = loader
        return LogicalBatches(loader, done=lambda: self.state.global_step)

    # -- one logical batch per Trainer step, the per-example loss ---------------------------
    def training_step(
        self, model: torch.nn.Module, inputs: Any, num_items_in_batch: Any = None
    ) -> torch.Tensor:
        """The forward and backward of one logical batch (all its physical batches).

        ``num_items_in_batch`` (the Trainer's token count of the whole batch) is never passed
        on: a loss divided by it is not a mean of per-example losses. Between physical batches
        the private optimizer's ``step()`` only accumulates the clipped sum; the Trainer's own
        ``optimizer.step()`` after this is the logical batch's one update.
        """
        if self._rng_checkpoint is not None:  # where the interrupted run stood when saved
            super()._load_rng_state(self._rng_checkpoint)
            self._rng_checkpoint = None
        if not isinstance(inputs, LogicalBatch):
            return super().training_step(model, inputs, None)
        assert self.dp_optimizer is not None and self._loader is not None  # built with it
        total: torch.Tensor | None = None
        rows = 0
        for physical in inputs:
            loss = super().training_step(model, physical, None)
            inputs.flos += float(super().floating_point_ops(physical))
            n = _rows(physical)
            total = loss * n if total is None else total + loss * n
            rows += n
            if not self._loader.cursor.last:  # accumulate; the last one is the Trainer's
                self.dp_optimizer.step()
        assert total is not None  # a logical batch has at least one physical batch
        return total / max(rows, 1)  # the logical batch's mean loss, for the logs

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        """The per-example token loss (:mod:`dpfy.hf.token_loss`) for token-level labels, else
        the Trainer's (the model's own loss, or ``compute_loss_func``), without a batch count."""
        kind = self._token_loss_kind()
        labels = inputs.get("labels")
        if (
            kind is None
            or getattr(self, "compute_loss_func", None) is not None
            or not torch.is_tensor(labels)
            or labels.dim() != 2
            or labels.is_floating_point()
        ):
            return super().compute_loss(model, inputs, return_outputs, None)
        loss, outputs = token_loss(
            model, self.model, inputs, kind, self.args.label_smoothing_factor
        )
        return (loss, outputs) if return_outputs else loss

    def _token_loss_kind(self) -> str | None:
        if self._token_loss is False:
            self._token_loss = (
                token_loss_kind(self.model) if self.dp_args.per_example_token_loss else None
            )
        return self._token_loss if isinstance(self._token_loss, str) else None

    def floating_point_ops(self, inputs: Any) -> int:
        if isinstance(inputs, LogicalBatch):  # summed over its physical batches in its step
            return int(inputs.flos)
        return int(super().floating_point_ops(inputs))

    # -- what the logs and the output directory say -----------------------------------------
    def epsilon(self) -> float:
        """ε spent so far at ``DPArguments.target_delta`` (the run's accountant)."""
        if self.dp_optimizer is None:
            return 0.0
        return float(self.dp_optimizer.epsilon(self.dp_args.target_delta))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        logs = {k: v for k, v in logs.items() if k != "grad_norm"}  # 0.0 here: GRAD_NORM_NOTE
        if self.dp_optimizer is not None and "loss" in logs:  # training logs only
            logs["epsilon"] = self.epsilon()
            if self.released_grad_norm is not None:
                logs["released_grad_norm"] = self.released_grad_norm
        super().log(logs, start_time)

    def privacy_report(self) -> PrivacyReport:
        """The run's privacy report; the unit of privacy and the sampling note are the run
        spec's (:func:`dpfy.spec.report_context`): Poisson, shuffled passes
        (``poisson_sampling=False``, ``noise="tree"``), cyclic Poisson (``noise="bandmf"``),
        user-level (``user_ids``), as the run drew its batches."""
        if self.dp_optimizer is None:
            raise ValueError("DPTrainer.privacy_report: call train() first")
        opt, spec = self.dp_optimizer, self.dp_optimizer.spec
        assert spec is not None and spec.sampling.resolved is not None  # make_private's, built
        context = report_context(spec, steps_per_epoch=len(self._loader))
        if spec.sampling.resolved.sampling is Sampling.POISSON:  # example-level Poisson
            context["sampling_note"] = POISSON_NOTE
        return PrivacyReport.from_ledger(
            opt.ledger,
            delta=self.dp_args.target_delta,
            accountant=self.dp_args.accountant,
            model_description=f"{type(self.model).__name__} trained with dpfy.hf.DPTrainer",
            layer_table=opt.grads.explain_planned(),
            **context,
        )  # no training batch's route

    def _load_rng_state(self, checkpoint: Any) -> None:
        """The checkpoint's RNG states (dropout masks), restored where the saved run stood.

        With ``ignore_data_skip`` the Trainer restores them at the start of the resumed epoch,
        before it builds the epoch's iterator, which draws from torch's generator. At an epoch's
        end that is where the interrupted run stood too; mid-epoch that run had its iterator
        already, so the states are restored just before the first resumed step instead (else
        every later dropout mask differs from the uninterrupted run's).
        """
        steps = len(self._loader) if self._loader is not None else 0
        if steps and self.state.global_step % steps:
            self._rng_checkpoint = checkpoint
        else:
            super()._load_rng_state(checkpoint)

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; a resume continues the private optimizer's ledger, sampler and
        noise from the checkpoint's ``optimizer.pt`` (module docstring)."""
        if resume_from_checkpoint not in (None, False):
            # the restored sampler continues with the next draw: skipping batches would draw
            # (and, with a shuffled pass, refuse) batches no step takes
            self.args.ignore_data_skip = True
        out = super().train(resume_from_checkpoint, *args, **kwargs)
        if self.args.should_save and self.dp_optimizer is not None and self.args.output_dir:
            paths = self.privacy_report().write(self.args.output_dir)
            logger.info("dpfy privacy report written to %s", paths["markdown"])
        return out


def _rows(batch: Any) -> int:
    """The row count of a physical batch (its first tensor's first dimension)."""
    leaves = batch.values() if hasattr(batch, "values") else batch
    return next((int(t.shape[0]) for t in leaves if torch.is_tensor(t) and t.dim()), 0)


class _AfterUpdate(transformers.TrainerCallback):
    """After each update: reads the released gradient's norm before the Trainer zeroes the
    gradients (it is public: the noisy averaged gradient the step applied), and sets the
    Trainer's epoch to updates / logical batches per epoch (exact after a resume too, where the
    first epoch's steps start mid-epoch)."""

    def __init__(self, trainer: DPTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loader = self.trainer._loader
        if loader is not None and len(loader):
            state.epoch = state.global_step / len(loader)

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
