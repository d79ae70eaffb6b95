"""The layer rule for transformers' ``Conv1D``, GPT-2's linears (``grads/rules/hf_conv1d.py``).

Conv1D is y = x W + b with W (d_in, d_out). Every number is checked against the float64
per-example loop (``oracles.per_example_grads`` for one layer, ``hf_models.per_example_grads``
for GPT-2): per-example gradients, ghost norms ‖∂ℓ_i/∂θ‖² and weighted sums Σ_i w_i ∂ℓ_i/∂θ.
The rule's two routes are called directly on the layer (whatever its size would pick), and on
GPT-2 through the engine, with a width at which some Conv1D layers take each route.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import dpfy  # noqa: E402
import oracles  # noqa: E402
from dpfy.grads import GradEngine  # noqa: E402
from dpfy.grads.rules import RULES, hf_conv1d, rule_for  # noqa: E402
from dpfy.grads.rules.hf_conv1d import Conv1DRule  # noqa: E402
from hf_models import Tokens, per_example_grads  # noqa: E402
from transformers.pytorch_utils import Conv1D  # noqa: E402

RULE_FILE = "dpfy/grads/rules/hf_conv1d.py"


def _layer_case(shape: tuple[int, ...], d_in: int = 5, d_out: int = 3):
    """A Conv1D, an input x of ``shape + (d_in,)`` and the loop's float64 gradients of
    ℓ_i = Σ (y_i ⊙ x_i W + b) for a fixed y, so that the output gradient is g = y."""
    torch.manual_seed(0)
    layer = Conv1D(d_out, d_in)  # (nf, nx): W (d_in, d_out)
    torch.nn.init.normal_(layer.bias)  # HF starts it at 0; any value will do
    x = torch.randn(*shape, d_in)  # (B, [T,] d_in)
    y = torch.randn(*shape, d_out)  # (B, [T,] d_out) = ∂ℓ_i/∂y
    ref = oracles.per_example_grads(layer, x, y, lambda out, yi: (out * yi).sum())
    return layer, x, y, ref


@pytest.mark.parametrize("shape", [(4, 6), (3,), (2, 2, 3)],
                         ids=["sequence", "2-D", "two middle dims"])  # (B = 0: the engine's)
def test_both_routes_match_the_loop_on_one_layer(shape):
    layer, x, y, ref = _layer_case(shape)
    rule = rule_for(layer)
    assert isinstance(rule, Conv1DRule)
    want_sq = {n: g.flatten(1).square().sum(1) for n, g in ref.items()}  # (B,)
    gs = rule.grad_sample(layer, x, y)  # materialized route
    assert {n: t.shape for n, t in gs.items()} == {n: g.shape for n, g in ref.items()}
    for n, g in ref.items():
        torch.testing.assert_close(gs[n].double(), g, rtol=1e-5, atol=1e-6)
    sq = rule.sq_norm(layer, x, y)  # ghost route
    for n, want in want_sq.items():
        torch.testing.assert_close(sq[n].double(), want, rtol=1e-5, atol=1e-6)
    w = torch.rand(shape[0])  # (B,)
    sums = rule.weighted_sum(layer, x, y, {"weight": w, "bias": w})
    for n, g in ref.items():
        want = torch.einsum("b,b...->...", w.double(), g)  # Σ_i w_i ∂ℓ_i/∂θ
        assert sums[n].shape == g.shape[1:]  # W's own (d_in, d_out) layout
        torch.testing.assert_close(sums[n].double(), want, rtol=1e-5, atol=1e-6)


def test_a_layer_without_bias_has_the_weight_only():
    # ∂ℓ_i/∂W = Σ_t x_t y_tᵀ does not depend on b: the loop's weight gradients with a bias
    layer, x, y, ref = _layer_case((4, 6))
    layer.register_parameter("bias", None)
    rule = rule_for(layer)
    assert set(rule.grad_sample(layer, x, y)) == set(rule.sq_norm(layer, x, y)) == {"weight"}
    w = torch.rand(4)
    out = rule.weighted_sum(layer, x, y, {"weight": w})
    assert set(out) == {"weight"}
    torch.testing.assert_close(out["weight"].double(),
                               torch.einsum("b,b...->...", w.double(), ref["weight"]),
                               rtol=1e-5, atol=1e-6)


def _gpt2(n_embd: int) -> transformers.GPT2LMHeadModel:
    """A tiny GPT-2 (tied lm_head/wte). At n_embd = 8 and T = 12 (T² = 144) the attention
    output projection (8 × 8 = 64 < 144) takes the materialized route, the other Conv1D
    layers (8·24, 8·32, 32·8 ≥ 192) the ghost route (the rule's T² < d_in·d_out)."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=100, n_positions=32, n_embd=n_embd, n_layer=2,
                                  n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  loss_type="ForCausalLM")
    model = transformers.GPT2LMHeadModel(cfg).train()
    assert model.lm_head.weight is model.transformer.wte.weight
    return model


def _batch(rows: int = 3) -> dict[str, torch.Tensor]:
    ds = Tokens(task="lm")
    return {k: torch.stack([ds[i][k] for i in range(rows)]) for k in ds[0]}


def test_gpt2_norms_and_weighted_sums_match_the_loop_with_the_tied_head():
    model, batch = _gpt2(8), _batch()
    ref = per_example_grads(model, batch)  # before the engine attaches (float64 copy)
    eng = GradEngine(model)
    eng.bind_batch(3)
    model(**batch).loss.backward()  # HF's token mean = (1/B)Σ_i ℓ_i here (equal lengths)
    routes = {r["route"] for r in eng.explain() if r["type"] == "Conv1D"}
    assert routes == {"ghost", "per-sample"}  # both routes of the rule are exercised
    sq = eng.per_sample_sq_norms()
    assert set(sq) == set(ref) and "lm_head.weight" not in ref  # one tied parameter
    for n, g in ref.items():
        torch.testing.assert_close(sq[n].double(), g.flatten(1).square().sum(1),
                                   rtol=1e-4, atol=1e-9, msg=lambda m, n=n: f"{n}: {m}")
    w = torch.tensor([0.3, 1.0, 0.7])  # any per-example weights (B,)
    sums = eng.weighted_sums({n: w for n in ref})
    for n, g in ref.items():
        torch.testing.assert_close(sums[n].double(), torch.einsum("b,b...->...", w.double(), g),
                                   rtol=1e-4, atol=1e-8, msg=lambda m, n=n: f"{n}: {m}")
    eng.detach()


def test_gpt2s_conv1d_layers_take_the_rule_not_vmap():
    model, batch = _gpt2(32), _batch()
    assert dpfy.validate(model, batch, route="ghost") == []  # every layer has a rule
    eng = GradEngine(model, route="ghost")  # raised for Conv1D while it had no rule
    assert all(u.route == "rule" for u in eng.layers)
    rows = [r for r in eng.explain() if r["type"] == "Conv1D"]
    assert len(rows) == 8 and all(r["rule"] == RULE_FILE for r in rows)  # 4 per block
    eng.detach()


def test_import_dpfy_leaves_transformers_alone_and_registers_on_its_import():
    # a fresh interpreter: import dpfy does not import transformers (about a second), and the
    # rule is registered as soon as transformers' Conv1D is imported, before any model exists
    code = ("import sys, dpfy\n"
            "from dpfy.grads.rules import hf_conv1d\n"
            "assert 'transformers' not in sys.modules\n"
            "assert not hf_conv1d.conv1d_rule_registered()\n"
            "import transformers.pytorch_utils\n"
            "assert hf_conv1d.conv1d_rule_registered()\n"
            "assert not any(isinstance(f, hf_conv1d._RegisterOnImport) for f in sys.meta_path)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_without_transformers_nothing_is_hooked_or_registered(monkeypatch):
    # transformers not installed (find_spec None) and its Conv1D not imported: _install, as at
    # import dpfy, leaves the import system and the registry as they were
    monkeypatch.delitem(sys.modules, "transformers.pytorch_utils")
    monkeypatch.setattr(hf_conv1d.importlib.util, "find_spec", lambda name: None)
    finders, rules = list(sys.meta_path), dict(RULES)
    hf_conv1d._install()
    assert sys.meta_path == finders and RULES == rules
