"""A Figure-1-style diagnostic of Galli et al. 2024: how well a clipped, noised mean gradient
points.

Galli, Palamidessi & Cucinotta 2024, Figure 1: at several training iterations t, the cosine
similarity between the sanitized mean gradient (Σ_i clip_C(g_i) + N(0, (νC)² I)) / b and the
true mean gradient (1/b) Σ_i g_i (unclipped, noise-free), as a function of C, averaged over 20
draws of the noise.

Choices the paper leaves open (Figure 1's C range and noise), made here: the model is the
task's model trained by Online (OSO-DPSGD) with ρ₁ = ``lr`` under the per-grid ν of its k-run
grid at ``epsilon`` (defaults ε = 3, ρ₁ = 0.3162); at each chosen iteration a fresh batch of
``probe_batch`` (default 512, the paper's |B|) training examples is drawn uniformly and the
"true" mean is over that batch; ν is the gradient's noise multiplier of that run (ν_g = 1.01ν);
C ∈ [10⁻³, 10²] log-spaced. Per-sample gradients by ``torch.func`` (vmap of grad) on a copy
of the model. This is a NON-PRIVATE debug statistic of raw gradients: it is computed for the
plot only and never feeds back into training.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from torch.func import functional_call, grad, vmap
from torch.utils.data import TensorDataset

from dpfy.data import load_dataset

from experiments.oso_fmnist.grid import RunSpec, Settings, grid_noise_multiplier
from experiments.oso_fmnist.train import build_task_model, private_parts, task_loss

__all__ = ["per_sample_gradients", "cosine_vs_clip", "cosine_figure", "CLIPS"]

CLIPS = np.logspace(-3, 2, 26)
REALIZATIONS = 20


def per_sample_gradients(settings: Settings, model: torch.nn.Module, x: torch.Tensor,
                         y: torch.Tensor) -> torch.Tensor:
    """(B, d) flat per-example gradients of the task loss (sensitive: a diagnostic only)."""
    plain = build_task_model(settings, tuple(x.shape[1:]))   # same weights, no engine hooks
    plain.load_state_dict(model.state_dict())
    params = {n: p.detach() for n, p in plain.named_parameters()}

    def one(p, xi, yi):
        return task_loss(settings, _Bound(plain, p), xi.unsqueeze(0), yi.unsqueeze(0))

    grads = vmap(grad(one), in_dims=(None, 0, 0))(params, x, y)       # name -> (B, *shape)
    return torch.cat([g.flatten(1) for g in grads.values()], dim=1)     # (B, d) sensitive


class _Bound(torch.nn.Module):
    """``module`` called with the parameters ``params`` (for torch.func)."""

    def __init__(self, module: torch.nn.Module, params: dict) -> None:
        super().__init__()
        self.module, self.params = module, params

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.module, self.params, (x,))


def cosine_vs_clip(grads: torch.Tensor, clips: np.ndarray, noise_multiplier: float, *,
                   realizations: int = REALIZATIONS, generator: torch.Generator | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(mean cosine over noise draws, noiseless cosine) per C, against the true mean gradient.

    ``grads`` (B, d) per-example gradients; noise N(0, (ν C)² I) on the clipped sum, then / B.
    """
    b, d = grads.shape
    true = grads.mean(0)                                               # (d,)
    norms = grads.norm(dim=1)                                          # (B,)
    noisy, clean = [], []
    for c in clips:
        w = torch.clamp(float(c) / norms.clamp_min(1e-12), max=1.0)    # (B,)
        total = (w[:, None] * grads).sum(0)                            # (d,)
        noise = torch.randn(realizations, d, generator=generator) * noise_multiplier * float(c)
        sanitized = (total[None, :] + noise) / b                       # (R, d)
        noisy.append(float(torch.nn.functional.cosine_similarity(
            sanitized, true[None, :], dim=1).mean()))
        clean.append(float(torch.nn.functional.cosine_similarity(total, true, dim=0)))
    return np.array(noisy), np.array(clean)


def cosine_figure(settings: Settings, out: Path, *, epsilon: float = 3.0, lr: float = 0.3162,
                  iterations: tuple[int, ...] | None = None, probe_batch: int = 512,
                  data_dir: str | None = None) -> list[Path]:
    """Train Online at (ε, ρ₁ = ``lr``), probe at ``iterations``; write PNG + JSON."""
    import matplotlib  # local: only the figures need matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    torch.set_num_threads(1)
    full = load_dataset("fashion_mnist", data_dir=data_dir)
    train = TensorDataset(*(t[:settings.train_size] for t in full.train.tensors))
    spec = RunSpec(method="online", epsilon=epsilon, lr=lr, settings=settings)
    nu_g = 1.01 * grid_noise_multiplier(spec)                 # the gradient's share (1 % rule)
    T = settings.steps
    its = iterations or tuple(sorted({1, T // 4, T // 2, (3 * T) // 4, T}))
    model = build_task_model(settings, tuple(train.tensors[0].shape[1:]))
    model, opt, loader, _ = private_parts(spec, model, train)
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(7), "little"))
    curves: dict[int, dict] = {}
    step = 0

    def probe(t: int) -> None:
        idx = torch.randint(len(train), (probe_batch,), generator=gen)
        x, y = train.tensors[0][idx], train.tensors[1][idx]
        g = per_sample_gradients(settings, model, x, y)               # (B, d) sensitive
        noisy, clean = cosine_vs_clip(g, CLIPS, nu_g, generator=gen)
        curves[t] = {"noisy": noisy.tolist(), "clean": clean.tolist(),
                     "median_norm_nonprivate": float(g.norm(dim=1).median())}
        del g

    for x, y in loader:
        step += 1
        if step in its:
            probe(step)
        opt.zero_grad(set_to_none=True)
        task_loss(settings, model, x, y).backward()
        opt.step()
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=90)
    for i, (t, c) in enumerate(sorted(curves.items())):
        ax.plot(CLIPS, c["noisy"], marker=".", color=f"C{i}", label=f"t = {t}")
        ax.plot(CLIPS, c["clean"], ls=":", color=f"C{i}", lw=1)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xscale("log")
    ax.set_xlabel("clipping threshold C")
    ax.set_ylabel("cosine(sanitized mean, true mean)")
    ax.set_title(f"Figure-1 style: ν_g = {nu_g:.2f}, b = {probe_batch}, {REALIZATIONS} draws "
                 f"(dotted: no noise)", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    png, js = out / "oso_fmnist_cosine.png", out / "oso_fmnist_cosine.json"
    fig.savefig(png)
    plt.close(fig)
    js.write_text(json.dumps({"clips": CLIPS.tolist(), "noise_multiplier_gradient": nu_g,
                              "epsilon": epsilon, "lr": lr, "probe_batch": probe_batch,
                              "curves": {str(t): c for t, c in curves.items()}}, indent=1))
    return [png, js]
