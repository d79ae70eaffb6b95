"""Model shapes that must work as shipped (issue 14 §2): inputs broadcast over the batch, tied
weights on the default route, 0-dim parameters, EmbeddingBag, frozen parameters in the optimizer.

Every number comes from the float64 per-example loop (``oracles``): per-example squared norms,
and weighted sums Σ_i w_i g_i with random weights; end to end, one SGD(lr=1) step with σ = 0
moves θ by exactly −Σ_i clip(g_i)/b.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
import oracles
from dpfy.errors import PrivacyRefusal
from dpfy.grads import GradEngine

V, D, T, B = 13, 6, 7, 5


def sum_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="sum")


def check_against_loop(model: nn.Module, x: torch.Tensor, y: torch.Tensor, bind: bool = False,
                       **kw) -> None:
    """Engine norms and weighted sums equal the float64 loop's (``bind``: the batch guard knows
    B, as under make_private; needed to tell a shared input from the batch)."""
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    ref = {n: g for n, g in oracles.per_example_grads(model, x, y, sum_loss).items()
           if n in trainable}
    eng = GradEngine(model, loss_reduction="sum", **kw)
    if bind:
        eng.bind_batch(x.shape[0])
    try:
        sum_loss(model(x), y).backward()
        sq = eng.per_sample_sq_norms()
        w = {n: torch.rand(x.shape[0], generator=torch.Generator().manual_seed(3)) for n in sq}
        sums = eng.weighted_sums(w)
    finally:
        eng.detach()
    assert set(sq) == set(ref)
    for n, g in ref.items():
        flat = g.reshape(g.shape[0], -1)
        torch.testing.assert_close(sq[n].double(), flat.square().sum(1), rtol=1e-5, atol=1e-8)
        torch.testing.assert_close(sums[n].double(), torch.einsum("b,b...->...",
                                                                  w[n].double(), g),
                                   rtol=1e-5, atol=1e-7)


class Positions(nn.Module):
    """The Hugging Face BERT/GPT-2 pattern: position ids of shape (1, T), broadcast."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        self.pos_proj = nn.Linear(D, D)  # a layer on the shared input, too
        self.head = nn.Linear(D, 3)
        self.register_buffer("position_ids", torch.arange(T)[None], persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = self.pos_proj(self.wpe(self.position_ids[:, :ids.shape[1]]))  # (1, T, D)
        return self.head(torch.tanh(self.wte(ids) + pos).mean(1))


def ids_batch(n: int = B) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, V, (n, T), generator=g), torch.randint(0, 3, (n,), generator=g)


def test_position_ids_broadcast_over_the_batch():
    check_against_loop(Positions(), *ids_batch(), bind=True)


def test_position_ids_with_as_many_positions_as_rows_are_still_shared():
    # (1, T) with T = B could be read as a time-first call with T = 1: position ids win
    check_against_loop(Positions(), *ids_batch(T), bind=True)


def test_position_ids_broadcast_end_to_end():
    # before: "the batch dimension must be the same ... [1, 5]" with no layer named
    model = Positions()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    reference = Positions()
    ds = TensorDataset(*ids_batch(40))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, dl = dpfy.make_private(model, opt, DataLoader(ds, batch_size=5),
                                           noise_multiplier=0.0, max_grad_norm=0.1, seed=2,
                                           loss_reduction="sum")
    x, y = next((x, y) for x, y in dl if x.shape[0] > 1)
    sum_loss(model(x), y).backward()
    opt.step()
    expected = oracles.clipped_sum(oracles.per_example_grads(reference, x, y, sum_loss), 0.1)
    for n, p in model.named_parameters():
        want = before[n].double() - expected[n] / dl.sampler.normalizer
        torch.testing.assert_close(p.detach().double(), want, rtol=1e-6, atol=1e-7)


class Tied(nn.Module):
    """GPT-2's tie: the output layer's weight is the token embedding."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.wte = nn.Embedding(V, D)
        self.block = nn.Linear(D, D)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(torch.tanh(self.block(self.wte(ids)))).mean(1)  # (B, V)


@pytest.mark.parametrize("route", ["auto", "ghost"])
def test_tied_weights_sum_their_uses_before_the_norm(route):
    x, _ = ids_batch()
    y = torch.randint(0, V, (B,), generator=torch.Generator().manual_seed(2))
    # before: refused ("tied weights ... Use engine='vmap'")
    check_against_loop(Tied(), x, y, route=route)


def test_tied_weight_appears_once_in_the_layer_groups():
    eng = GradEngine(Tied())
    names = [u.qualified(r) for u in eng.layers for r in u.params]
    eng.detach()
    assert sorted(names) == ["block.bias", "block.weight", "wte.weight"]


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.5))  # 0-dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def test_zero_dim_parameter():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), Scaled())
    x = torch.randn(B, 4)
    # before: TypeError from permute() in the engine
    check_against_loop(model, x, torch.randint(0, 3, (B,)))


class Bags(nn.Module):
    """EmbeddingBag called with 1-D ids and offsets, as in the torch documentation."""

    def __init__(self, mode: str = "sum", padding_idx: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.bag = nn.EmbeddingBag(V, D, mode=mode, padding_idx=padding_idx)
        self.head = nn.Linear(D, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, L), −1: no id
        lengths = (x >= 0).sum(1)
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])
        return self.head(torch.tanh(self.bag(x[x >= 0], offsets)))


@pytest.mark.parametrize("mode,padding_idx", [("sum", None), ("mean", None), ("mean", 2)])
def test_embedding_bag_with_offsets(mode, padding_idx):
    x = torch.randint(0, V, (B, 6), generator=torch.Generator().manual_seed(4))
    x[1, 3:] = -1  # a shorter bag
    x[2] = -1      # an empty bag
    x[3, :3] = 2   # a repeated id (the padding id when padding_idx = 2)
    # before: a raw vmap error
    check_against_loop(Bags(mode, padding_idx), x, torch.randint(0, 3, (B,)))


def test_embedding_bag_max_mode_is_refused_naming_it():
    model = Bags()
    model.bag.mode = "max"
    eng = GradEngine(model)
    with pytest.raises(ValueError, match="EmbeddingBag must use mode 'sum' or 'mean'"):
        model(torch.randint(0, V, (B, 3)))
    eng.detach()


def test_optimizer_over_all_parameters_with_frozen_ones_is_accepted():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))
    model[0].requires_grad_(False)
    frozen = model[0].weight.detach().clone()
    ds = TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.1)
    # before: refused with "Build the optimizer from model.parameters()", which it was
    model, opt, dl = dpfy.make_private(model, opt, DataLoader(ds, batch_size=8),
                                       noise_multiplier=1.0, max_grad_norm=1.0,
                                       loss_reduction="sum")
    for x, y in dl:
        sum_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        break
    assert torch.equal(model[0].weight, frozen)  # skipped, weight decay included
    assert opt.step_count == 1


def test_frozen_parameter_unfrozen_later_is_refused():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))
    model[0].requires_grad_(False)
    ds = TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, dl = dpfy.make_private(model, opt, DataLoader(ds, batch_size=8),
                                       noise_multiplier=1.0, max_grad_norm=1.0,
                                       loss_reduction="sum")
    model[0].requires_grad_(True)  # its gradient would be computed without clipping or noise
    x, y = next((x, y) for x, y in dl if x.shape[0] > 0)
    sum_loss(model(x), y).backward()
    with pytest.raises(PrivacyRefusal, match=r"\['0.weight', '0.bias'\].*without clipping"):
        opt.step()


def test_gpt2_tied_head_and_shared_positions_match_the_loop():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=16, n_embd=8, n_layer=1, n_head=2,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg).train()
    ids = torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(5))

    def loss(out, y):  # each example's summed token loss: a sum over examples
        return F.cross_entropy(out.logits.reshape(-1, V), y.reshape(-1), reduction="sum")

    ref = oracles.per_example_grads(model, ids, ids, loss)
    eng = GradEngine(model, loss_reduction="sum")
    eng.bind_batch(3)
    loss(model(input_ids=ids), ids).backward()
    sq = eng.per_sample_sq_norms()
    eng.detach()
    assert "transformer.wte.weight" in sq and "lm_head.weight" not in sq  # one tied parameter
    for n, g in ref.items():
        torch.testing.assert_close(sq[n].double(), g.reshape(3, -1).square().sum(1),
                                   rtol=1e-4, atol=1e-8)


@pytest.mark.parametrize("frozen", ["bias", "weight"])
@pytest.mark.parametrize("layer", ["linear", "conv1d", "layernorm", "groupnorm"])
def test_partly_frozen_layer_with_a_rule(layer: str, frozen: str):
    # a frozen bias, or BitFit (weights frozen, biases trained). Before: weighted_sums raised
    # KeyError (the rules form every parameter of their layer and found no weight for the
    # frozen one), and the frozen parameter's norm was returned and counted in the clipping
    torch.manual_seed(0)
    first, x = {"linear": (nn.Linear(4, 5), torch.randn(6, 4)),
                "conv1d": (nn.Conv1d(4, 5, 1), torch.randn(6, 4, 3)),
                "layernorm": (nn.LayerNorm(4), torch.randn(6, 4)),
                "groupnorm": (nn.GroupNorm(2, 4), torch.randn(6, 4, 3))}[layer]
    model = nn.Sequential(first, nn.Flatten(), nn.Tanh(), nn.LazyLinear(3))
    model(x)  # materialize the lazy head
    getattr(first, frozen).requires_grad_(False)
    check_against_loop(model, x, torch.randint(0, 3, (6,)))
