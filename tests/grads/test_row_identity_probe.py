"""The row-identity probe (``grads/row_identity.py``): models that mix or move rows across the
batch are refused at the first step and listed by ``dpfy.validate``; row-wise models pass.

The three refused models are the adversarial review's reproducers (batch statistics by hand:
4.45·C; rows sorted before a layer: 1.37·C; a reshape that moves the batch: 1.24·C). Controls
cover dropout (train mode), GroupNorm, an LSTM, attention with a padding mask, a time-first
layer found by the layout probe, shared position ids, several physical batches and vmap.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.errors import PrivacyRefusal
from dpfy.grads import GradEngine


class HandBatchNorm(nn.Module):
    """Batch statistics written by hand between two Linears (t3)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(10, 32), nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.l1(x)
        h = (h - h.mean(0, keepdim=True)) / (h.std(0, keepdim=True) + 1e-5)
        return self.l2(torch.tanh(h))


class SortedRows(nn.Module):
    """Rows sorted before a layer and unsorted after it (t6)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.o = nn.Linear(10, 16), nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        order = torch.argsort(x[:, 0])
        return self.o(torch.tanh(self.b(h[order]))[torch.argsort(order)])


class ReshapedRows(nn.Module):
    """A Linear on ``x.reshape(T, B, d)`` of a (B, T, d) input, reshaped back (t6b)."""

    def __init__(self) -> None:
        super().__init__()
        self.l, self.o = nn.Linear(6, 6), nn.Linear(30, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        return self.o(torch.tanh(self.l(x.reshape(t, b, d))).reshape(b, t, d).flatten(1))


class GroupNormCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(1, 8, 3)
        self.g = nn.GroupNorm(2, 8)
        self.d = nn.Dropout(0.5)
        self.o = nn.Linear(8 * 6 * 6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(self.d(torch.tanh(self.g(self.c(x)))).flatten(1))


class LSTMClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.r = nn.LSTM(6, 8, batch_first=True)
        self.o = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(self.r(x)[0][:, -1])


class TinyEncoder(nn.Module):
    """Embeddings with shared position ids, a TransformerEncoderLayer (without dropout: its
    attention dropout is refused by the engine) and a padding mask as a keyword argument."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(20, 16), nn.Embedding(5, 16)
        self.enc = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.o = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        pos = torch.arange(x.shape[1]).unsqueeze(0)  # (1, T): shared by every example
        h = self.enc(self.tok(x) + self.pos(pos), src_key_padding_mask=mask)
        return self.o(h.mean(1))


def data(name: str, n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = {"mix": lambda: torch.randn(n, 10, generator=g),
         "reshape": lambda: torch.randn(n, 5, 6, generator=g),
         "cnn": lambda: torch.randn(n, 1, 8, 8, generator=g),
         "lstm": lambda: torch.randn(n, 7, 6, generator=g),
         "tokens": lambda: torch.randint(0, 20, (n, 5), generator=g)}[name]()
    return TensorDataset(x, torch.randint(0, 3, (n,), generator=g))


def one_step(model: nn.Module, ds: TensorDataset, batch_size: int = 16, **kw) -> None:
    """One private step (q = 1 batch of ``batch_size`` rows, shuffled pass)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = dpfy.make_private(model, opt, DataLoader(ds, batch_size=batch_size),
                                           noise_multiplier=1.0, max_grad_norm=1.0, seed=0,
                                           poisson_sampling=False, **kw)
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if opt.updated:
            break


REFUSED = [(HandBatchNorm, "mix", "'l2' (Linear)"), (SortedRows, "mix", "'b' (Linear)"),
           (ReshapedRows, "reshape", "'l' (Linear)")]


@pytest.mark.parametrize("make,kind,name", REFUSED, ids=["batchnorm_by_hand", "sorted",
                                                          "reshaped"])
def test_a_model_mixing_rows_is_refused_at_the_first_step_naming_the_layer(make, kind, name):
    torch.manual_seed(0)
    with pytest.raises(PrivacyRefusal, match="mixes or moves examples") as err:
        one_step(make(), data(kind, 64))
    assert f"the input of layer {name}" in str(err.value)
    assert "LayerNorm or GroupNorm" in str(err.value)


@pytest.mark.parametrize("make,kind,name", REFUSED, ids=["batchnorm_by_hand", "sorted",
                                                          "reshaped"])
def test_validate_lists_a_model_mixing_rows(make, kind, name):
    torch.manual_seed(0)
    problems = dpfy.validate(make(), example_batch=data(kind, 8).tensors[0])
    assert any(f"layer {name}" in p and "mixes or moves examples" in p for p in problems), \
        problems


def test_mixing_after_the_last_layer_is_refused_naming_the_output():
    class MixedOutput(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l = nn.Linear(10, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.l(x)
            return y - y.mean(0)

    problems = dpfy.validate(MixedOutput(), example_batch=data("mix", 6).tensors[0])
    assert any("the model's output" in p and "mixes or moves" in p for p in problems), problems


def test_a_batch_of_two_rows_is_probed():
    """Two rows cannot be reordered after removing one, but the removal still shows batch
    statistics (each row of the pair depends on the other): refused. Before, a batch of two
    rows was not probed at all and a run of 2-row batches trained unaccounted. A row-wise
    model passes on two rows."""
    problems = dpfy.validate(HandBatchNorm(), example_batch=data("mix", 2).tensors[0])
    assert any("mixes or moves" in p for p in problems), problems
    mlp = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))
    assert dpfy.validate(mlp, example_batch=data("mix", 2).tensors[0]) == []


CONTROLS = [(lambda: nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3)), "mix"),
            (GroupNormCNN, "cnn"), (LSTMClassifier, "lstm"), (TinyEncoder, "tokens")]


@pytest.mark.parametrize("make,kind", CONTROLS, ids=["mlp", "groupnorm_cnn", "lstm", "encoder"])
def test_row_wise_models_pass(make, kind):
    torch.manual_seed(0)
    ds = data(kind, 64)
    assert dpfy.validate(make(), example_batch=ds.tensors[0][:8]) == []
    model = make()
    one_step(model, ds)
    assert all(p.isfinite().all() for p in model.parameters())


def test_row_wise_models_pass_with_physical_batches_and_vmap():
    torch.manual_seed(0)
    one_step(GroupNormCNN(), data("cnn", 64), batch_size=32, max_physical_batch_size=8)
    one_step(LSTMClassifier(), data("lstm", 64), route="vmap")


def test_a_padding_mask_keyword_and_a_time_first_layer_pass():
    """A keyword batch tensor is cut with the rows; a Linear used time-first (found by the
    batch guard) is compared along its batch dimension."""

    class TimeFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = TinyEncoder()
            self.t = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            y = self.enc(x, mask=mask)               # (B, 3)
            return self.t(y.unsqueeze(0)).squeeze(0)  # (1, B, 3): batch in dimension 1

    torch.manual_seed(0)
    x = data("tokens", 8).tensors[0]
    mask = torch.zeros(8, 5, dtype=torch.bool)
    mask[:, 4] = True
    assert dpfy.validate(TimeFirst(), example_batch={"x": x, "mask": mask}) == []


def test_the_probe_leaves_the_global_rng_and_the_modules_modes_unchanged():
    """The probe's forwards draw from a forked global RNG and run in eval() mode: the
    training run's RNG stream and each module's own mode are as before."""
    model = GroupNormCNN()
    model.d.eval()  # dropout off, and a module in its own mode must stay in it
    eng = GradEngine(model)
    eng.bind_batch(8)
    x = data("cnn", 8).tensors[0]
    torch.manual_seed(123)
    before = torch.get_rng_state()
    model(x).sum().backward()
    assert eng._capture.rows_checked
    assert torch.equal(torch.get_rng_state(), before)
    assert model.training and model.c.training and not model.d.training
    eng.detach()


def test_dropout_does_not_hide_mixing_and_randomness_left_on_in_eval_is_not_mixing():
    """The probe runs in eval(): dropout in train mode does not hide batch statistics. A
    forward that draws randomness eval() does not switch off is told from mixing by a third
    forward from another seed, and passes."""

    class DropoutThenMix(HandBatchNorm):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(F.dropout(x, 0.5, training=self.training))

    class AlwaysRandom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(10, 8), nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(F.dropout(torch.tanh(self.a(x)), 0.5, training=True))

    x = data("mix", 8).tensors[0]
    problems = dpfy.validate(DropoutThenMix(), example_batch=x)
    assert any("layer 'l2' (Linear)" in p and "mixes or moves" in p for p in problems), problems
    assert dpfy.validate(AlwaysRandom(), example_batch=x) == []


def test_a_forward_on_other_data_does_not_use_up_the_probe():
    """A forward with autograd on over rows that are not the bound batch (held-out data) is
    not probed; the next forward on the batch is, and a mixing model is refused there."""
    model = HandBatchNorm()
    eng = GradEngine(model)
    eng.bind_batch(8)
    model(data("mix", 5).tensors[0])
    assert not eng._capture.rows_checked
    eng.clear()
    x, y = data("mix", 8).tensors
    F.cross_entropy(model(x), y).backward()
    assert eng._capture.rows_checked
    with pytest.raises(PrivacyRefusal, match="layer 'l2' \\(Linear\\)"):
        eng.per_sample_sq_norms()
    eng.detach()
