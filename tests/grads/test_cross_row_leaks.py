"""Cross-row leaks the eval-mode row-identity probe accepted (issue 30 §2), now refused: mixing
only in training mode, mixing in the backward pass, attention across rows through a reshape
(a model the shortened probe batch cannot run), and MixUp in the loader's ``collate_fn``.

Where it helps, the leak is measured here without dpfy: the clipped per-row gradients that the
engine would sum (Linear layers: row i's output gradient ⊗ row i's input, formed with plain
autograd hooks) on the batch and on the batch without example 0; for a model whose rows are
each their own example's, the two sums differ by example 0's clipped gradient, ‖·‖ ≤ C.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, default_collate

import dpfy
from dpfy.errors import PrivacyRefusal
from dpfy.grads import GradEngine

C = 1.0


class TrainOnlyNorm(nn.Module):
    """Batch statistics written by hand, only in training mode (eval() hides them)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(10, 32), nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.l1(x)
        if self.training:
            h = (h - h.mean(0, keepdim=True)) / (h.std(0, keepdim=True) + 1e-5)
        return self.l2(torch.tanh(h))


class CentredGrad(torch.autograd.Function):
    """Identity forward; the backward centres the gradient over the batch."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return x.clone()

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return g - g.mean(0, keepdim=True)


class BackwardMix(nn.Module):
    """Rows mixed only in the backward pass (every forward row is its own example's)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(10, 32), nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.tanh(CentredGrad.apply(self.l1(x))))


class ReshapeAttention(nn.Module):
    """Attention across rows: the batch reshaped into 2 groups whose rows attend to each other
    (runs on an even batch only, so the shortened probe batch cannot run it)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.o = nn.Linear(10, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.q(x))
        b = h.shape[0]
        g = h.reshape(2, b // 2, 16)
        att = torch.softmax(g @ g.transpose(1, 2) / 4.0, dim=-1) @ g
        return self.o(att.reshape(b, 16))


def data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 10, generator=g), torch.randint(0, 3, (n,), generator=g))


def one_step(model: nn.Module, loader: DataLoader, **kw) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = dpfy.make_private(model, opt, loader, noise_multiplier=1.0,
                                           max_grad_norm=C, seed=0, poisson_sampling=False, **kw)
    for x, y in loader:
        opt.zero_grad()
        loss = (F.cross_entropy(model(x), y) if y.dim() == 1
                else -(y * F.log_softmax(model(x), -1)).sum(1).mean())
        loss.backward()
        opt.step()
        if opt.updated:
            break


def clipped_sum(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Σ_i clip_C(row i's gradient as the engine forms it), over every Linear (plain torch)."""
    seen: dict[nn.Module, list[torch.Tensor]] = {}

    def fwd(m: nn.Module, args: tuple, out: torch.Tensor) -> None:
        seen[m] = [args[0].detach()]
        out.register_hook(lambda g: seen[m].append(g.detach()))

    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    handles = [m.register_forward_hook(fwd) for m in linears]
    F.cross_entropy(model(x), y, reduction="sum").backward()
    for h in handles:
        h.remove()
    rows = torch.cat([torch.cat([torch.einsum("bo,bi->boi", seen[m][1], seen[m][0]).flatten(1),
                                 seen[m][1]], 1) for m in linears], 1)  # (B, |θ|)
    norms = rows.norm(dim=1, keepdim=True)
    return (rows * (C / norms).clamp(max=1.0)).sum(0)


def leaked(model: nn.Module, n: int = 32, outlier: float = 10.0) -> float:
    """‖S(D) − S(D without example 0)‖ / C for the clipped sums the engine would release,
    example 0 an outlier (its input × ``outlier``)."""
    torch.manual_seed(1)
    x, y = data(n).tensors
    x = x.clone()
    x[0] *= outlier
    full = clipped_sum(model, x, y)
    torch.manual_seed(1)
    return float((full - clipped_sum(model, x[1:], y[1:])).norm()) / C


def other_rows_gradient_moves(model: nn.Module) -> bool:
    """Whether changing example 0's label changes the output gradient of the first Linear in
    other rows (plain torch): example 0 then reaches their per-row gradients."""
    x, y = data(8).tensors
    grads = []
    for label in (0, 1):
        yy = y.clone()
        yy[0] = label
        h = model.l1(x)
        h.retain_grad()
        F.cross_entropy(model.l2(torch.tanh(CentredGrad.apply(h))), yy, reduction="sum"
                        ).backward()
        grads.append(h.grad[1:])
    return not torch.equal(*grads)


def test_the_reproduced_models_leak():
    """Without the probe's refusal: 2.3·C leaves with one example (train-only batch norm,
    outlier × 10), and the backward-only mixing moves other examples' gradients."""
    torch.manual_seed(0)
    assert leaked(TrainOnlyNorm()) > 2.0
    assert other_rows_gradient_moves(BackwardMix())


@pytest.mark.parametrize("make", [TrainOnlyNorm, BackwardMix], ids=["train_only", "backward"])
def test_a_leak_in_training_mode_or_in_the_backward_is_refused(make):
    torch.manual_seed(0)
    with pytest.raises(PrivacyRefusal, match="mixes or moves examples") as err:
        one_step(make(), DataLoader(data(), batch_size=16))
    assert "in training mode" in str(err.value)
    problems = dpfy.validate(make(), example_batch=data(8).tensors[0])
    assert any("mixes or moves examples" in p for p in problems), problems


def test_mixing_in_the_backward_is_named_as_such():
    torch.manual_seed(0)
    with pytest.raises(PrivacyRefusal, match="output gradient, in the backward pass"):
        one_step(BackwardMix(), DataLoader(data(), batch_size=16))


def test_attention_across_rows_through_a_reshape_is_refused():
    """The shortened batch cannot run (odd rows): the perturbation probe keeps the shape."""
    torch.manual_seed(0)
    with pytest.raises(PrivacyRefusal, match="the input of layer 'q' \\(Linear\\).*in "
                                             "training mode"):
        one_step(ReshapeAttention(), DataLoader(data(), batch_size=16))


def test_a_model_the_probe_cannot_run_is_refused_unless_declared_row_wise():
    class OnlyTheRealBatch(nn.Module):
        """Raises at its second training forward (a stand-in for a forward that fails on the
        probe's batch)."""

        def __init__(self) -> None:
            super().__init__()
            self.l = nn.Linear(10, 3)
            self.training_forwards = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.training_forwards += self.training
            if self.training_forwards == 2:
                raise RuntimeError("unexpected batch")
            return self.l(x)

    torch.manual_seed(0)
    with pytest.raises(PrivacyRefusal, match="declare_row_wise=True"):
        one_step(OnlyTheRealBatch(), DataLoader(data(), batch_size=16))
    with pytest.warns(UserWarning, match="declared row-wise"):
        one_step(OnlyTheRealBatch(), DataLoader(data(), batch_size=16), declare_row_wise=True)


def mixup(items: list) -> tuple[torch.Tensor, torch.Tensor]:
    """MixUp on the batch, as torchvision documents it (a partner per row by rolling)."""
    x, y = default_collate(items)
    lam = float(torch.distributions.Beta(1.0, 1.0).sample())
    y = F.one_hot(y, 3).float()
    return lam * x + (1 - lam) * x.roll(1, 0), lam * y + (1 - lam) * y.roll(1, 0)


def cutmix_permuted(items: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Partners from a random permutation (the probe replaces two rows, so a row paired with
    itself by chance does not hide it)."""
    x, y = default_collate(items)
    perm = torch.randperm(len(x))
    x = x.clone()
    x[:, 5:] = x[perm, 5:]
    y = F.one_hot(y, 3).float()
    return x, 0.5 * y + 0.5 * y[perm]


@pytest.mark.parametrize("collate", [mixup, cutmix_permuted], ids=["mixup", "cutmix"])
def test_mixup_or_cutmix_in_the_collate_fn_is_refused(collate):
    torch.manual_seed(0)
    with pytest.raises(PrivacyRefusal, match="collate_fn .* mixes examples"):
        one_step(nn.Sequential(nn.Linear(10, 8), nn.Tanh(), nn.Linear(8, 3)),
                 DataLoader(data(), batch_size=16, collate_fn=collate))


def test_a_row_wise_random_collate_passes_and_keeps_the_rng_stream():
    """Per-row randomness in collate_fn lines up in the probe (same RNG start) and the
    stream after the first batch is the one without the probe."""

    def jitter(items: list) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = default_collate(items)
        return x + 0.1 * torch.randn_like(x), y

    from dpfy.sampling.collate_probe import CollateProbe
    items = list(data(8))
    torch.manual_seed(3)
    expected, after = jitter(items), torch.get_rng_state()
    torch.manual_seed(3)
    got = CollateProbe(jitter)(items)
    assert torch.equal(got[0], expected[0]) and torch.equal(torch.get_rng_state(), after)
    one_step(nn.Sequential(nn.Linear(10, 3)), DataLoader(data(), batch_size=16,
                                                         collate_fn=jitter))


def test_row_wise_models_pass_in_training_mode_with_dropout():
    """Dropout masks line up in the perturbation probe (same RNG state, same shape)."""
    model = nn.Sequential(nn.Linear(10, 16), nn.Dropout(0.5), nn.Tanh(), nn.LayerNorm(16),
                          nn.Linear(16, 3))
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        one_step(model, DataLoader(data(), batch_size=16))
    assert not [w for w in caught if "row-wise" in str(w.message)]


def test_the_probe_leaves_the_rng_and_the_parameters_untouched():
    model = nn.Sequential(nn.Linear(10, 16), nn.Dropout(0.5), nn.Linear(16, 3))
    eng = GradEngine(model)
    eng.bind_batch(8)
    x, y = data(8).tensors
    torch.manual_seed(5)
    before = torch.get_rng_state()
    out = model(x)
    after_forward = torch.get_rng_state()
    torch.manual_seed(5)
    model(x)  # the same forward with the probe already used: the same draws
    assert eng._capture.rows_checked
    assert torch.equal(torch.get_rng_state(), after_forward)
    assert not torch.equal(before, after_forward)  # dropout drew (sanity)
    F.cross_entropy(out, y).backward()
    assert all(p.grad is None for p in model.parameters())
    eng.detach()


def test_a_padding_collate_with_random_masking_passes():
    """Padding to the longest example with a random mask per token (masked language
    modelling): replacing the longest example changes the shape and the draws; the probe then
    compares replacements that keep it."""
    from torch.nn.utils.rnn import pad_sequence

    from dpfy.sampling.collate_probe import CollateProbe

    def pad_and_mask(items: list) -> torch.Tensor:
        x = pad_sequence([s for s in items], batch_first=True)
        return x.masked_fill(torch.rand(x.shape) < 0.3, -1)

    items = [torch.arange(1, 1 + n) for n in (9, 3, 5, 4, 6, 2, 7, 5)]  # the first is the longest
    torch.manual_seed(0)
    CollateProbe(pad_and_mask)(items)
