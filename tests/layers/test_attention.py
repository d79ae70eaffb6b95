"""DPMultiheadAttention (dpfy.layers) against torch's nn.MultiheadAttention and the float64 loop.

References: torch's ``nn.MultiheadAttention`` (outputs, attention weights, gradients) and the
float64 per-example loop on the unswapped torch model (``oracles``). With dropout, examples'
gradients are read from autograd on the same batch under the same random seed (the masks are
then the same draws): ∇θ ℓ_i of one term of the loss, computed by torch's own modules.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpfy.grads import GradEngine
from dpfy.layers import DPMultiheadAttention, swap_attention
from test_recurrent import assert_private_epoch_moves_every_parameter, check_against_loop

E, HEADS = 8, 2


def masks(b: int, t: int, s: int, kind: str):
    """(key_padding_mask, attn_mask) of the given kind, fixed (not drawn)."""
    kp = torch.zeros(b, s, dtype=torch.bool)
    kp[0, -1] = kp[-1, 1:3] = True  # no query loses every key
    causal = torch.ones(t, s, dtype=torch.bool).triu(1)
    if kind == "none":
        return None, None
    if kind == "bool":
        return kp, causal
    if kind == "float":
        return (kp.double() * -1e9, torch.randn(t, s, dtype=torch.float64))
    if kind == "3d":
        return None, torch.randn(b * HEADS, t, s, dtype=torch.float64)
    raise ValueError(kind)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("kind", ["none", "bool", "float", "3d"])
def test_same_function_and_gradients_as_torch(batch_first, cross, kind):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, HEADS, batch_first=batch_first).double()
    ours = DPMultiheadAttention.from_module(ref)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    b, t, s = 3, 4, 5 if cross else 4
    q = torch.randn(b, t, E, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(b, s, E, dtype=torch.float64, requires_grad=True) if cross else q
    kp, am = masks(b, t, s, kind)
    if not batch_first:
        q_in, kv_in = q.transpose(0, 1), kv.transpose(0, 1)
    else:
        q_in, kv_in = q, kv
    results = []
    for m in (ref, ours):
        out, w = m(q_in, kv_in, kv_in, key_padding_mask=kp, attn_mask=am,
                   average_attn_weights=kind != "3d")
        loss = (out.sin() * out).sum() + (w * w).sum()
        results.append((out, w, torch.autograd.grad(loss, [q, kv, *ref.parameters()],
                                                    allow_unused=True)))
    (o1, w1, g1), (o2, w2, g2) = results
    torch.testing.assert_close(o2, o1)
    torch.testing.assert_close(w2, w1)
    for a, c in zip(g1, g2):
        if a is not None:
            torch.testing.assert_close(c, a)


def test_unbatched_causal_no_bias_and_fused_path():
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, HEADS, bias=False).double()
    ours = DPMultiheadAttention.from_module(ref)
    x = torch.randn(4, E, dtype=torch.float64)
    causal = torch.ones(4, 4, dtype=torch.bool).triu(1)
    o1, w1 = ref(x, x, x, attn_mask=causal)
    o2, w2 = ours(x, x, x, is_causal=True)
    torch.testing.assert_close(o2, o1)
    torch.testing.assert_close(w2, w1)
    # need_weights=False: torch's fused kernel, where a query with every key masked gives 0
    kp = torch.tensor([[True, True, False, False]])
    xb = x.unsqueeze(1)
    o1, _ = ref(xb, xb, xb, key_padding_mask=kp, attn_mask=causal, need_weights=False)
    o2, w2 = ours(xb, xb, xb, key_padding_mask=kp, attn_mask=causal, need_weights=False)
    assert w2 is None
    torch.testing.assert_close(o2, o1)


class Attend(nn.Module):
    """Self- or cross-attention with a per-example padding mask read from the input.

    Input (B, T, E); positions whose first feature is > 1 are padding keys (never all of them:
    position 0 is always kept), plus a causal mask for self-attention.
    """

    def __init__(self, batch_first: bool, cross: bool) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(E, HEADS, batch_first=batch_first)
        self.kv = nn.Linear(E, E) if cross else None
        self.head = nn.Linear(E, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = x[:, :, 0] > 1.0
        pad[:, 0] = False
        kv = x if self.kv is None else self.kv(x[:, :-1])
        t = x.shape[1]
        causal = None if self.kv is not None else torch.ones(t, t, dtype=torch.bool).triu(1)
        if self.kv is not None:
            pad = pad[:, :-1]
        bf = self.attn.batch_first
        q, kv = (x, kv) if bf else (x.transpose(0, 1), kv.transpose(0, 1))
        out, _ = self.attn(q, kv, kv, key_padding_mask=pad, attn_mask=causal)
        out = out if bf else out.transpose(0, 1)
        return self.head(out.mean(1))


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("cross", [False, True])
def test_per_example_norms_with_masks(batch_first, cross):
    torch.manual_seed(0)
    x = torch.randn(5, 4, E, dtype=torch.float64)
    check_against_loop(Attend(batch_first, cross), x, swap=swap_attention)


def test_encoder_layer_with_default_dropout_per_example_gradients():
    # TransformerEncoderLayer's default dropout (0.1) inside attention and after it. The
    # reference is autograd's ∇θ ℓ_i on a plain copy (no engine) under the same seed, i.e. the
    # same dropout masks (torch's own MHA lays its output out time-major, so its dropout1 masks
    # fall on other elements; the forward itself is checked against torch's above).
    torch.manual_seed(0)
    model = nn.Sequential(nn.TransformerEncoderLayer(E, HEADS, 16, batch_first=True),
                          nn.Flatten(), nn.Linear(4 * E, 3)).double().train()
    assert swap_attention(model) == ["0.self_attn"]
    ref = copy.deepcopy(model)
    x = torch.randn(5, 4, E, dtype=torch.float64)
    y = torch.arange(5) % 3
    eng = GradEngine(model, loss_reduction="sum")
    try:
        torch.manual_seed(7)
        F.cross_entropy(model(x), y, reduction="sum").backward()
        got = eng.per_sample_grads()
    finally:
        eng.detach()
    params = dict(ref.named_parameters())
    for i in range(5):
        torch.manual_seed(7)
        loss_i = F.cross_entropy(ref(x)[i:i + 1], y[i:i + 1], reduction="sum")
        grads = torch.autograd.grad(loss_i, list(params.values()))
        for (name, _), g in zip(params.items(), grads):
            torch.testing.assert_close(got[name][i], g, rtol=1e-9, atol=1e-12)


def test_encoder_layer_with_dropout_trains_privately_after_swap():
    torch.manual_seed(0)
    model = nn.Sequential(nn.TransformerEncoderLayer(E, HEADS, 16, batch_first=True),
                          nn.Flatten(), nn.Linear(4 * E, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)  # built before the swap: shared params
    swap_attention(model)
    assert_private_epoch_moves_every_parameter(model, opt, (4, E))


@pytest.mark.parametrize("kwargs, match", [
    ({"add_bias_kv": True}, r"add_bias_kv must be False"),
    ({"add_zero_attn": True}, r"add_zero_attn must be False"),
    ({"kdim": 4}, r"kdim/vdim must be equal to embed_dim"),
])
def test_refusals_name_the_module_option_and_fix(kwargs, match):
    with pytest.raises(ValueError, match=match + r".*Replace the module by hand"):
        DPMultiheadAttention.from_module(nn.MultiheadAttention(E, HEADS, **kwargs))
