"""The batch guard (issue 14 §1): every clipped gradient comes from the drawn batch's examples.

Each case below was silently wrong before the guard: norms over the time dimension, an empty batch
that trains nothing, or a loss over other data accepted. Values come from the float64
per-example loop (``oracles``): with SGD(lr=1) and σ = 0 one step moves θ by exactly
−Σ_i clip(g_i)/b, b = qN (docs/engine.md).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader, TensorDataset

import dpfy
import oracles
from dpfy.errors import PrivacyRefusal

CLIP = 0.05  # every example clipped: a wrong per-example norm changes the update


def sum_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="sum")


def private(model: nn.Module, ds: TensorDataset, batch_size: int = 8, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dpfy.make_private(model, opt, DataLoader(ds, batch_size=batch_size),
                                 noise_multiplier=0.0, max_grad_norm=CLIP, seed=1,
                                 loss_reduction="sum", **kw)


class Calling(nn.Module):
    """``call(inner, x)`` as a module, so that the float64 loop calls the model the same way."""

    def __init__(self, inner: nn.Module, call) -> None:
        super().__init__()
        self.inner, self.call = inner, call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.call(self.inner, x)


def check_one_step_matches_loop(model: nn.Module, ds: TensorDataset, call, **kw) -> None:
    """One private step equals θ − Σ_i clip(g_i)/b with g_i from the float64 loop."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    reference = type(model)()
    reference.load_state_dict(before)
    reference = Calling(reference, call)
    model, opt, dl = private(model, ds, **kw)
    for x, y in dl:
        if x.shape[0] == 0:
            continue
        opt.zero_grad()
        sum_loss(call(model, x), y).backward()
        opt.step()
        break
    grads = {n.removeprefix("inner."): g
             for n, g in oracles.per_example_grads(reference, x, y, sum_loss).items()}
    expected = oracles.clipped_sum(grads, CLIP)
    b = dl.sampler.normalizer
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach().double(), before[n].double() - expected[n] / b,
                                   rtol=1e-6, atol=1e-7)


def sequences(n: int = 64, t: int = 5, d: int = 4) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, t, d, generator=g), torch.randint(0, 3, (n,), generator=g))


class TimeFirst(nn.Module):
    """A batch-first model with one layer used time-first inside."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.head = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, T, 4)
        h = self.lin(x.transpose(0, 1)).transpose(0, 1)  # lin sees (T, B, 4)
        return self.head(torch.tanh(h).mean(1))


def test_layer_used_time_first_gets_per_example_norms():
    # before the guard the norms were taken over the 5 time steps: a wrong update, no error
    check_one_step_matches_loop(TimeFirst(), sequences(), lambda m, x: m(x))


class OneStep(nn.Module):
    """A layer fed one time step time-first: lin sees (1, B, 4), where dim 0 could be a
    batch shared by every example or the single step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, 1, 4)
        return self.lin(x.transpose(0, 1))[0]


def test_one_step_layer_used_time_first_gets_per_example_norms():
    # before the layout probe: refused as ambiguous (the (1, B, 4) input's shape cannot say)
    check_one_step_matches_loop(OneStep(), sequences(t=1), lambda m, x: m(x))


class Keywords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.head = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        h = torch.tanh(self.lin(x)).mean(1)
        return self.head(h if scale is None else h * scale)


def test_model_called_with_keyword_arguments_trains_under_vmap():
    # before: the vmap engine read the batch from positional arguments only, saw 0 rows, and
    # the step moved nothing while the ledger recorded it
    check_one_step_matches_loop(Keywords(), sequences(), lambda m, x: m(x=x), route="vmap")


def test_keyword_argument_shared_by_the_batch_is_not_split():
    check_one_step_matches_loop(Keywords(), sequences(),
                                lambda m, x: m(x=x, scale=torch.full((1, 1), 2.0,
                                                                     dtype=x.dtype)),
                                route="vmap")


def test_loss_over_other_data_than_the_drawn_batch_is_refused():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    ds = TensorDataset(torch.randn(230, 4), torch.randint(0, 3, (230,)))
    other = torch.randn(200, 4), torch.randint(0, 3, (200,))
    model, opt, dl = private(model, ds, batch_size=23)
    x, y = next(iter(dl))
    assert x.shape[0] != 200
    model(x)  # the drawn batch, unused
    sum_loss(model(other[0]), other[1]).backward()  # the loss over 200 other rows
    with pytest.raises(PrivacyRefusal, match=r"layer '0' \(Linear\).*private batch.*loss"):
        opt.step()
    assert opt.step_count == 0  # nothing released


def test_forward_on_other_data_whose_loss_is_not_used_is_fine():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    ds = TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    model, opt, dl = private(model, ds)
    for x, y in dl:
        model(torch.randn(50, 4))  # e.g. a metric on held-out data, with grad enabled
        sum_loss(model(x), y).backward()
        opt.step()
        break
    assert opt.step_count == 1


def test_packed_sequence_is_refused_naming_the_module():
    class Packed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn, self.head = nn.RNN(4, 5, batch_first=True), nn.Linear(5, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            lengths = torch.full((x.shape[0],), x.shape[1], dtype=torch.long)
            _, h = self.rnn(pack_padded_sequence(x, lengths, batch_first=True))
            return self.head(h[0])

    model, opt, dl = private(Packed(), sequences())
    x, y = next((x, y) for x, y in dl if x.shape[0] > 0)
    sum_loss(model(x), y).backward()
    # before: the batch was read as 0 rows and the update was zero
    with pytest.raises(PrivacyRefusal, match=r"layer 'rnn' \(RNN\).*PackedSequence"):
        opt.step()


def test_layer_on_shared_inputs_whose_output_does_not_broadcast_is_refused():
    class Table(nn.Module):  # no rule: a vmap layer, called on a (1, 3) shared input
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, z: torch.Tensor) -> torch.Tensor:
            return (z * self.w)[0]  # (3,): not one row

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table, self.head = Table(), nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(x.mean(1)) + self.table(torch.ones(1, 3))

    model, opt, dl = private(Model(), sequences())
    x, y = next((x, y) for x, y in dl if x.shape[0] > 3)
    sum_loss(model(x), y).backward()
    with pytest.raises(PrivacyRefusal, match=r"layer 'table' \(Table\).*one row.*\[\(3,\)\]"):
        opt.step()


class ContiguousTimeFirst(nn.Module):
    """A layer fed a contiguous time-first tensor: with T = B its input (T, B, 4) has the
    shape and strides of a batch-first one."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.head = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, T, 4)
        h = self.lin(x.transpose(0, 1).contiguous()).transpose(0, 1)
        return self.head(torch.tanh(h).mean(1))


def test_contiguous_time_first_layer_with_as_many_steps_as_rows_gets_per_example_norms():
    # before the layout probe: norms over the 8 time steps on the very first batch (T = B = 8,
    # nothing seen before to tell), a wrong update and no error
    check_one_step_matches_loop(ContiguousTimeFirst(), sequences(t=8), lambda m, x: m(x),
                                poisson_sampling=False)


def test_transposed_view_with_as_many_steps_as_rows_gets_per_example_norms():
    # before: refused as ambiguous (B = T = 8 and lin sees a transposed view)
    check_one_step_matches_loop(TimeFirst(), sequences(t=8), lambda m, x: m(x),
                                poisson_sampling=False)


class EmbeddingOneStep(nn.Module):
    """Token ids (B, 1) fed time-first: the embedding sees (1, B), the shape of position ids
    of B positions shared by the batch."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = nn.Embedding(10, 4), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, 1) ids
        return self.head(self.emb(x.t())[0])


def test_one_step_of_ids_fed_time_first_is_not_taken_for_shared_position_ids():
    # before: the (1, B) ids were read as position ids shared by the batch and expanded: every
    # example's embedding gradient was the batch's (norms wrong, silently)
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randint(0, 10, (64, 1), generator=g),
                       torch.randint(0, 3, (64,), generator=g))
    check_one_step_matches_loop(EmbeddingOneStep(), ds, lambda m, x: m(x))


class SharedPositions(nn.Module):
    """Position ids (1, T) shared by the batch, with T equal to the batch size."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.pos, self.head = nn.Embedding(8, 4), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, T, 4), T = 8
        h = x + self.pos(torch.arange(x.shape[1])[None])
        return self.head(h.mean(1))


def test_shared_position_ids_with_as_many_positions_as_rows_are_expanded():
    check_one_step_matches_loop(SharedPositions(), sequences(t=8), lambda m, x: m(x),
                                poisson_sampling=False)


class Scale(nn.Module):
    """A module without a per-layer rule (vmap route)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


class VmapTimeFirst(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.scale, self.head = Scale(), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, T, 4)
        h = self.scale(x.transpose(0, 1).contiguous()).transpose(0, 1)
        return self.head(h.mean(1))


def test_vmap_module_fed_time_first_with_as_many_steps_as_rows_is_refused():
    # before: vmap split the (T, B, 4) input by its dim 0, the time steps, silently
    model, opt, dl = private(VmapTimeFirst(), sequences(t=8), poisson_sampling=False)
    x, y = next(iter(dl))
    sum_loss(model(x), y).backward()
    with pytest.raises(PrivacyRefusal, match=r"layer 'scale' \(Scale\).*argument 0.*\(8, 7, 4\)"):
        opt.step()


class TimeFirstInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.head = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (T, B, 4): time-first input
        return self.head(torch.tanh(self.lin(x)).mean(0))


def test_model_called_on_a_transposed_batch_with_as_many_steps_as_rows_is_refused():
    # the user transposes before the model: its input's dimension 0 is not the batch
    model, opt, dl = private(TimeFirstInput(), sequences(t=8), poisson_sampling=False)
    x, y = next(iter(dl))
    sum_loss(model(x.transpose(0, 1)), y).backward()
    with pytest.raises(PrivacyRefusal, match=r"layer 'lin' \(Linear\).*transposed view"):
        opt.step()
