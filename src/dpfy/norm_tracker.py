"""Per-example clipped-gradient norms, refreshed every K steps, for individual accounting.

:func:`dpfy.privacy.per_example_accounting.per_example_epsilons` needs, for every training
example and every refresh j, the ratio ρ = ‖clip(g_i)‖ / C of its gradient on the model of
step j·K (Yu et al.'s K). :class:`NormTracker` records them from a training loop: call
:meth:`NormTracker.before_step` before each optimizer step; it computes every example's
gradient norm (``torch.func``: one ``vmap`` of ``grad`` per chunk, on a copy of the model in
eval mode) at steps 0, K, 2K, …, and keeps its training loss at that point too (for the
correlation the report shows). The norms and losses are private data: keep them with the data
holder.

```python
tracker = NormTracker(model, loss_fn, features, labels, clip=C, refresh_every=K)
for x, y in loader:
    tracker.before_step()
    ...; opt.step()
res = tracker.epsilons(opt.ledger, delta=1e-5, rounding=0.01)
```
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dpfy._require import require
from dpfy.privacy.ledger import Ledger

if TYPE_CHECKING:  # dp_accounting (and scipy) load only when ε is computed
    from dpfy.privacy.per_example_accounting import PerExampleEpsilons

__all__ = ["NormTracker"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class NormTracker:
    """Every example's clipped-norm ratio and loss at steps 0, K, 2K, … of a run."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        features: torch.Tensor,
        labels: torch.Tensor,
        *,
        clip: float,
        refresh_every: int,
        chunk: int = 1024,
    ) -> None:
        require(clip > 0, "clip", clip, "> 0", "Pass the run's max_grad_norm C")
        require(refresh_every >= 1, "refresh_every", refresh_every, ">= 1")
        require(
            features.shape[0] == labels.shape[0],
            "labels",
            f"{labels.shape[0]} rows",
            f"one per feature row ({features.shape[0]})",
        )
        self.model, self.loss_fn = model, loss_fn
        self.features, self.labels = features, labels
        self.clip, self.refresh_every, self.chunk = float(clip), refresh_every, chunk
        self.step = 0
        self.ratios: list[np.ndarray] = []
        self.losses: list[np.ndarray] = []

    def _norms_and_losses(self) -> tuple[np.ndarray, np.ndarray]:
        # a copy: the private model's dpfy hooks (gradient taps) become inert in copies, so
        # this analysis never feeds the run's gradient engine. It keeps the model's mode: the
        # run clips training-mode gradients (dropout on), and eval-mode norms are smaller, which
        # would under-state every example's ε; dropout masks are drawn per example from a
        # forked RNG, so the run's own random stream is not advanced
        model = copy.deepcopy(self.model).train(self.model.training)
        params = {k: v.detach() for k, v in model.named_parameters()}
        buffers = {k: v.detach() for k, v in model.named_buffers()}

        def loss_one(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self._loss_one(model, (p, buffers), x, y)

        per_grad = vmap(grad(loss_one), in_dims=(None, 0, 0), randomness="different")
        per_loss = vmap(loss_one, in_dims=(None, 0, 0), randomness="different")
        cuda = sorted({v.device.index or 0 for v in params.values() if v.is_cuda})
        # the rows go where the model is, a chunk at a time (the training set may stay on the
        # host while the model is on a GPU: torch refuses host rows there)
        device = next(iter(params.values())).device if params else self.features.device
        norms, losses = [], []
        with torch.random.fork_rng(devices=cuda):
            for i in range(0, self.features.shape[0], self.chunk):
                x = self.features[i : i + self.chunk].to(device)
                y = self.labels[i : i + self.chunk].to(device)
                g = per_grad(params, x, y)
                sq = sum(v.flatten(1).square().sum(1) for v in g.values())
                norms.append(torch.as_tensor(sq).sqrt())
                with torch.no_grad():
                    losses.append(per_loss(params, x, y))
        n = torch.cat(norms).double().cpu().numpy()  # from a GPU too: numpy reads the host
        return np.minimum(n / self.clip, 1.0), torch.cat(losses).double().cpu().numpy()

    def _loss_one(
        self, model: nn.Module, state: tuple[dict, dict], x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        """The loss of one example (x, y) at parameters and buffers ``state``."""
        out = functional_call(model, state, (x.unsqueeze(0),))
        return self.loss_fn(out, y.unsqueeze(0))

    def before_step(self) -> None:
        """Call once before each optimizer step; refreshes the norms at steps 0, K, 2K, …."""
        if self.step % self.refresh_every == 0:
            ratios, losses = self._norms_and_losses()
            self.ratios.append(ratios)
            self.losses.append(losses)
        self.step += 1

    def final_losses(self) -> np.ndarray:
        """Every example's loss on the model as it is now (for the loss correlation)."""
        return self._norms_and_losses()[1]

    def save(self, path: str | Path) -> None:
        """Write ``per_example_norms.npz`` (ratios, losses per refresh, the final losses, K) for
        ``dpfy account --individual``. Private data: keep it with the data holder."""
        require(len(self.ratios) >= 1, "tracker", "empty", "refreshed at least once",
                "Call before_step() before the first optimizer step")  # fmt: skip
        np.savez(
            path,
            ratios=np.stack(self.ratios),
            losses=np.stack(self.losses),
            final_losses=self.final_losses(),
            refresh_every=np.array(self.refresh_every),
            steps=np.array(self.step),
        )

    def epsilons(
        self,
        ledger: Ledger,
        *,
        delta: float,
        rounding: float | None = None,
        orders: str = "integer",
    ) -> PerExampleEpsilons:
        """The per-example ε of the run so far (data-dependent: an analysis, not a guarantee)."""
        from dpfy.privacy.per_example_accounting import per_example_epsilons

        require(
            ledger.num_steps == self.step,
            "ledger steps",
            ledger.num_steps,
            f"the {self.step} steps the tracker saw",
            "Call before_step() exactly once before every optimizer step",
        )
        return per_example_epsilons(
            ledger,
            np.stack(self.ratios),
            refresh_every=self.refresh_every,
            delta=delta,
            rounding=rounding,
            orders=orders,
        )
