"""DPRNN / DPGRU / DPLSTM (dpfy.layers) against torch's own layers and the float64 loop.

The reference is always torch's ``nn.RNN``/``nn.GRU``/``nn.LSTM``: its outputs and gradients
(autograd through torch's kernels) for the forward/backward equivalence, and the float64
per-example loop (``oracles``) run on the *unswapped* torch model for the per-example norms and
weighted sums the engine computes on the swapped one.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence
from torch.utils.data import DataLoader, TensorDataset

import dpfy
import oracles
from dpfy.grads import GradEngine
from dpfy.layers import DPGRU, DPLSTM, DPRNN, swap_layers, swap_recurrent

TORCH = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}
OURS = {"lstm": DPLSTM, "gru": DPGRU, "rnn": DPRNN}
CONFIGS = [
    {},
    {"num_layers": 2, "bidirectional": True, "batch_first": True},
    {"bias": False, "batch_first": True},
    {"num_layers": 2, "dropout": 0.0},
]


def loss_sum(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Σ_i ℓ_i with a non-trivial gradient for every output coordinate."""
    w = torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)
    return ((out * w).sum(-1) ** 2 * (1 + y.to(out.dtype))).sum()


def state_tensors(state) -> tuple[torch.Tensor, ...]:
    return state if isinstance(state, tuple) else (state,)


class Head(nn.Module):
    """Recurrent layer -> Linear on the mean output, plus the final states (both gradients used).

    Input (B, T, d + 1), batch first; the last feature of step 0 is the example's length, used
    to pack the sequences when ``packed`` (so the float64 loop calls the model the same way).
    """

    def __init__(self, rnn: nn.Module, packed: bool = False, with_h0: bool = False) -> None:
        super().__init__()
        self.rnn, self.packed, self.with_h0 = rnn, packed, with_h0
        dirs = 2 if rnn.bidirectional else 1
        self.head = nn.Linear(rnn.hidden_size * dirs, 3)

    def forward(self, xl: torch.Tensor) -> torch.Tensor:
        x, lengths = xl[..., :-1], xl[:, 0, -1].long()
        rnn = self.rnn
        b, dirs = x.shape[0], 2 if rnn.bidirectional else 1
        hx = None
        if self.with_h0:  # initial states that depend on the example (and carry gradient)
            h0 = x[:, 0, :1].expand(b, rnn.hidden_size).expand(rnn.num_layers * dirs, b, -1)
            h0 = h0.contiguous()
            hx = (h0, 0.5 * h0) if isinstance(rnn, (nn.LSTM, DPLSTM)) else h0
        inp = x if rnn.batch_first else x.transpose(0, 1)
        if self.packed:
            inp = pack_padded_sequence(inp, lengths, batch_first=rnn.batch_first,
                                       enforce_sorted=False)
        out, state = rnn(inp, hx)
        if isinstance(out, PackedSequence):
            out = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True,
                                                         total_length=x.shape[1])[0]
        elif not rnn.batch_first:
            out = out.transpose(0, 1)
        final = sum(s.sum(0) for s in state_tensors(state))  # (B, H)
        return self.head(out.mean(1)) + final[:, :3].tanh()


def with_lengths(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """x (B, T, d) with each example's length appended as a last feature."""
    return torch.cat((x, lengths.to(x.dtype)[:, None, None].expand(-1, x.shape[1], 1)), -1)


def check_against_loop(reference: nn.Module, x: torch.Tensor, swap=swap_layers,
                       route: str = "auto") -> None:
    """Engine norms and a weighted sum on the swapped copy equal the float64 loop on the
    reference (torch's modules)."""
    reference = reference.double()
    model = copy.deepcopy(reference)
    assert swap(model), "nothing was swapped"
    b = x.shape[0]
    y = torch.arange(b) % 2
    want = oracles.per_example_grads(reference, x, y, loss_sum)  # torch name -> (B, *θ)
    names = {id(p): n for n, p in model.named_parameters()}
    ours = {k: names[id(p)] for k, p in model.state_dict(keep_vars=True).items()
            if id(p) in names}  # torch's name -> ours (the state_dict speaks torch's names)
    eng = GradEngine(model, route=route, loss_reduction="sum")
    try:
        loss_sum(model(x), y).backward()
        sq = eng.per_sample_sq_norms()
        w = torch.linspace(0.1, 1.0, b, dtype=torch.float64)
        sums = eng.weighted_sums({n: w for n in sq})
    finally:
        eng.detach()
    assert set(ours) == set(want)
    for name, g in want.items():
        torch.testing.assert_close(sq[ours[name]], g.flatten(1).square().sum(1),
                                   rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(sums[ours[name]], torch.einsum("b,b...->...", w, g),
                                   rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", sorted(TORCH))
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items())
                         or "default")
def test_same_function_and_gradients_as_torch(kind, cfg):
    torch.manual_seed(0)
    ref = TORCH[kind](3, 4, **cfg).double()
    ours = OURS[kind].from_module(ref)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(5, 6, 3, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([6, 2, 4, 1, 6])
    for inp in (x if ref.batch_first else x.transpose(0, 1),
                pack_padded_sequence(x if ref.batch_first else x.transpose(0, 1), lengths,
                                     batch_first=ref.batch_first, enforce_sorted=False)):
        results = []
        for m in (ref, ours):
            out, state = m(inp)
            data = out.data if isinstance(out, PackedSequence) else out
            loss = (data.sin() * data).sum() + sum(s.cos().sum() for s in state_tensors(state))
            results.append((data, state_tensors(state),
                            torch.autograd.grad(loss, [x, *ref.parameters()],
                                                retain_graph=True)))
        (o1, s1, g1), (o2, s2, g2) = results
        torch.testing.assert_close(o2, o1)
        for a, b in zip((*s1, *g1), (*s2, *g2)):
            torch.testing.assert_close(b, a)


def test_unbatched_input_and_initial_states():
    torch.manual_seed(0)
    ref = nn.LSTM(3, 4, num_layers=2).double()
    ours = DPLSTM.from_module(ref)
    x = torch.randn(5, 3, dtype=torch.float64)
    hx = (torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64))
    (o1, (h1, c1)), (o2, (h2, c2)) = ref(x, hx), ours(x, hx)
    for a, b in ((o1, o2), (h1, h2), (c1, c2)):
        torch.testing.assert_close(b, a)


@pytest.mark.parametrize("kind", sorted(TORCH))
def test_per_example_norms_bidirectional_multilayer(kind):
    torch.manual_seed(0)
    rnn = TORCH[kind](3, 4, num_layers=2, bidirectional=True, batch_first=True)
    x = with_lengths(torch.randn(5, 4, 3, dtype=torch.float64), torch.full((5,), 4))
    check_against_loop(Head(rnn, with_h0=True), x)


@pytest.mark.parametrize("kind", sorted(TORCH))
def test_per_example_norms_packed_variable_lengths(kind):
    # padding must not leak into any example's gradient, and h_n is each example's last step
    torch.manual_seed(1)
    rnn = TORCH[kind](3, 4, bidirectional=True, batch_first=kind != "gru")
    x = with_lengths(torch.randn(6, 5, 3, dtype=torch.float64), torch.tensor([5, 1, 3, 2, 5, 4]))
    check_against_loop(Head(rnn, packed=True), x)


@pytest.mark.parametrize("kind", sorted(TORCH))
def test_per_example_norms_under_the_vmap_route(kind):
    # under torch.func the replacement runs step by step with plain autograd ops
    torch.manual_seed(3)
    rnn = TORCH[kind](3, 4, num_layers=2, bidirectional=True, batch_first=True)
    x = with_lengths(torch.randn(3, 4, 3, dtype=torch.float64), torch.full((3,), 4))
    check_against_loop(Head(rnn, with_h0=True), x, route="vmap")


def test_per_example_norms_time_first_no_bias():
    torch.manual_seed(2)
    rnn = nn.RNN(3, 4, bias=False, nonlinearity="relu")
    x = with_lengths(torch.randn(4, 3, 3, dtype=torch.float64), torch.full((4,), 3))
    check_against_loop(Head(rnn), x, swap=swap_recurrent)


def test_state_dict_round_trip_with_torch():
    torch.manual_seed(0)
    ref = nn.GRU(3, 4, num_layers=2, bidirectional=True)
    fresh = DPGRU(3, 4, num_layers=2, bidirectional=True)
    fresh.load_state_dict(ref.state_dict())
    back = nn.GRU(3, 4, num_layers=2, bidirectional=True)
    back.load_state_dict(fresh.state_dict())
    x = torch.randn(5, 2, 3)
    torch.testing.assert_close(fresh(x)[0], ref(x)[0])
    torch.testing.assert_close(back(x)[0], ref(x)[0])


def test_swap_keeps_parameters_so_an_earlier_optimizer_trains_the_model():
    # the optimizer is built before the swap: the replacement shares the same nn.Parameters
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm, self.head = nn.LSTM(4, 6, batch_first=True), nn.Linear(6, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.lstm(x)[0][:, -1])

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    assert swap_recurrent(model) == ["lstm"] and isinstance(model.lstm, DPLSTM)
    assert_private_epoch_moves_every_parameter(model, opt, (5, 4))


def assert_private_epoch_moves_every_parameter(model: nn.Module, opt: torch.optim.Optimizer,
                                               shape: tuple[int, ...]) -> None:
    """One private epoch (σ = 0) over 32 random examples of ``shape`` changes every entry of
    the state_dict, whose keys stay the same."""
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(32, *shape, generator=g),
                       torch.randint(0, 3, (32,), generator=g))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, dl = dpfy.make_private(model, opt, DataLoader(ds, batch_size=16),
                                           noise_multiplier=0.0, max_grad_norm=1.0, seed=0)
    for x, y in dl:
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    after = model.state_dict()
    assert set(after) == set(before)
    assert all(not torch.equal(after[k], before[k]) for k in after)


def test_refusals_name_the_parameter_and_fix():
    with pytest.raises(ValueError, match=r"LSTM.proj_size must be 0.*nn.Linear after"):
        DPLSTM.from_module(nn.LSTM(3, 4, proj_size=2))
    with pytest.raises(ValueError, match=r"DPLSTM hx must be a tuple"):
        DPLSTM(3, 4)(torch.randn(2, 5, 3), torch.zeros(1, 5, 4))
    with pytest.raises(ValueError, match=r"initial state shape must be"):
        DPGRU(3, 4)(torch.randn(2, 5, 3), torch.zeros(2, 5, 4))


def test_validate_fix_swaps_recurrent_and_attention_layers():
    # dpfy.validate(fix=True) swaps in the dpfy.layers replacements (on a copy)
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = nn.GRU(4, 4, batch_first=True)
            self.attn = nn.MultiheadAttention(4, 2, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.gru(x)[0]
            return self.attn(h, h, h, need_weights=False)[0]

    torch.manual_seed(0)
    model = Net()
    fixed = dpfy.validate(model, fix=True)
    assert isinstance(fixed.gru, DPGRU) and type(fixed.attn).__name__ == "DPMultiheadAttention"
    assert isinstance(model.gru, nn.GRU)  # the original is left alone
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(fixed(x), model(x))
    assert fixed.state_dict().keys() == model.state_dict().keys()


def test_every_weight_takes_a_linear_rule_once_per_sequence():
    # no vmap layer, and each Linear is called once per forward (not once per time step)
    torch.manual_seed(0)
    model = Head(nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True))
    swap_recurrent(model)
    eng = GradEngine(model, loss_reduction="sum")
    try:
        x = with_lengths(torch.randn(4, 6, 3), torch.full((4,), 6))
        loss_sum(model(x), torch.zeros(4)).backward()
        rows = eng.explain()
    finally:
        eng.detach()
    assert {r["type"] for r in rows} == {"Linear", "RecurrentLinear"}
    assert all(r["route"] in ("ghost", "per-sample") for r in rows)
    assert all("called" not in r["why"] for r in rows)  # one call per batch
