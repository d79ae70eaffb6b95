"""Parameter averaging: an exponential moving average (EMA) of the weights a private run visits.

De et al. 2022 ("Unlocking high-accuracy differentially private image classification through
scale", §3) evaluate an EMA of the parameters, which averages out part of the DP noise the
last iterates carry. The average is computed from the released noisy updates only (each
iterate θ_t is a function of the released gradients), so it is post-processing: it costs no
privacy, and a run that publishes both the raw weights and their average has the same ε.

The update, after every private step t = 1, 2, …:

    β_t = min(β, (1 + t) / (10 + t))           (a warm-up: early averages forget the init)
    θ̄_t = β_t · θ̄_{t−1} + (1 − β_t) · θ_t,    θ̄_0 = θ_0

(the warm-up is the one of TensorFlow's ``ExponentialMovingAverage(num_updates=t)``; without it
a run of a few hundred steps at β = 0.999 would still weigh its random init by e^{−t/1000}).
Buffers are not averaged: they are copied from the model.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn

from dpfy._require import require, require_resumed
from dpfy.privacy.section import ReportSection

__all__ = ["ParameterAverage", "ema_decay", "averaging_section"]


def ema_decay(beta: float, step: int) -> float:
    """β_t = min(β, (1 + t)/(10 + t)) for the t-th update (t >= 1)."""
    return min(beta, (1.0 + step) / (10.0 + step))


class ParameterAverage:
    """An EMA of ``model``'s floating-point parameters, in float64, kept beside the model.

    Args:
      model: the model being trained (read, never written).
      beta: the decay β in (0, 1), e.g. 0.999.
    """

    def __init__(self, model: nn.Module, beta: float) -> None:
        require(0.0 < beta < 1.0, "ema", beta, "in (0, 1)", "0.999 is De et al.'s value")
        self.beta, self.steps = float(beta), 0
        self.average = {
            n: p.detach().to(torch.float64).clone()
            for n, p in model.named_parameters()
            if p.is_floating_point()
        }

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Fold the model's current parameters in: one call per private step."""
        self.steps += 1
        beta = ema_decay(self.beta, self.steps)
        for n, p in model.named_parameters():
            if n in self.average:
                self.average[n].mul_(beta).add_(p.detach().to(torch.float64), alpha=1.0 - beta)

    def state_dict_of(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """``model.state_dict()`` with the averaged parameters in place of the raw ones."""
        out = model.state_dict()
        for n, t in self.average.items():
            out[n] = t.to(out[n].dtype).clone()
        return out

    @contextlib.contextmanager
    def swapped_in(self, model: nn.Module) -> Iterator[nn.Module]:
        """``model`` holding the averaged parameters inside the block, its own after (for
        evaluation: the private model keeps its hooks, a copy would not be needed)."""
        raw = {n: p.detach().clone() for n, p in model.named_parameters() if n in self.average}
        try:
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if n in self.average:
                        p.copy_(self.average[n].to(p.dtype))
            yield model
        finally:
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if n in raw:
                        p.copy_(raw[n])

    def state_dict(self) -> dict[str, Any]:
        return {
            "beta": self.beta,
            "steps": self.steps,
            "average": {n: t.clone() for n, t in self.average.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        require_resumed("ema", state.get("beta"), self.beta, "Resume with the same --ema")
        self.steps = int(state["steps"])
        self.average = {n: t.clone() for n, t in state["average"].items()}


def averaging_section(cfg: Any, last: dict[str, Any]) -> ReportSection:
    """The report's section on parameter averaging: what was released, and the two accuracies.

    Both weight files are released and covered by the run's guarantee (the average is
    post-processing); which one a user deploys is decided by the flag, before training, not by
    the test accuracy printed here.
    """
    return ReportSection(
        title="Parameter averaging",
        lines=(
            f"Released: both model.pt (the last iterate) and model_ema.pt (an exponential "
            f"moving average of the iterates, decay β = {cfg.ema:g} with warm-up "
            f"min(β, (1+t)/(10+t)); De et al. 2022). The average is computed from the "
            f"released noisy updates only, so it is post-processing: the ε above covers "
            f"both files.",
            f"Test accuracy: last iterate {100 * last['test_acc']:.2f}%, average "
            f"{100 * last['test_acc_ema']:.2f}%. --ema chose the average as the run's "
            f"model before training; do not pick between them by test accuracy.",
        ),
        data={
            "ema": cfg.ema,
            "released": ["model.pt", "model_ema.pt"],
            "recommended": "model_ema.pt",
            "test_acc": last["test_acc"],
            "test_acc_ema": last["test_acc_ema"],
        },
    )
