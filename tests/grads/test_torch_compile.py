"""``torch.compile`` after ``make_private``: with ``backend="eager"`` the private model trains
exactly as uncompiled (per-example norms, released parameters, ledger); with the AOTAutograd
backends (inductor, the default, and aot_eager) the buffer guard's forward check, traced into
the graph, reads the parameters as modified in place although their version counters and values
are unchanged: the refusal says that it cannot verify the forward and names the fix, instead of
claiming the parameters now hold values of the batch (issue 31, §3)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.buffers import inside_torch_compile
from dpfy.errors import PrivacyRefusal


def train(backend: str | None, steps: int = 2, before: list | None = None):
    """``steps`` private steps of a small MLP, compiled with ``backend`` after make_private
    (None: uncompiled); the trained parameters, each step's per-example squared norms, ε."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 6), torch.randint(0, 2, (64,)))
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # the seed's warning: seeded for the comparison
        model, opt, loader = dpfy.make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data, batch_size=16),
            noise_multiplier=1.0, max_grad_norm=1.0, seed=0)
    norms: list[torch.Tensor] = []
    own = opt.grads.per_sample_sq_norms

    def recorded(*args, **kwargs):
        out = own(*args, **kwargs)
        norms.append(torch.stack([v.detach().clone() for v in out.values()]))
        return out
    opt.grads.per_sample_sq_norms = recorded
    if before is not None:   # the parameters' state before the first forward
        before += [(p._version, p.detach().clone()) for p in model.parameters()]
        before.append(list(model.parameters()))
    run = model if backend is None else torch.compile(model, backend=backend)
    for _, (x, y) in zip(range(steps), loader):
        opt.zero_grad()
        nn.functional.cross_entropy(run(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], norms, opt.epsilon(1e-5)


def test_inside_torch_compile_reads_false_outside_a_compiled_call():
    assert inside_torch_compile() is False


@pytest.mark.slow   # TorchDynamo's import and tracing: 15-50 s on a loaded 2-core machine
def test_eager_backend_after_make_private_trains_as_uncompiled():
    params, norms, eps = train(None)
    c_params, c_norms, c_eps = train("eager")
    assert len(norms) == len(c_norms) == 2
    for a, b in zip(norms, c_norms):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for a, b in zip(params, c_params):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert c_eps == eps


@pytest.mark.slow   # AOTAutograd tracing (inductor also compiles C++): minutes on 2 cores
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_aot_backends_are_refused_truthfully_with_the_fix(backend):
    before: list = []
    with pytest.raises(PrivacyRefusal) as caught:
        train(backend, steps=1, before=before)
    *state, params = before
    for (version, value), p in zip(state, params):   # nothing was written into the model
        assert p._version == version
        assert torch.equal(p.detach(), value)
    message = str(caught.value)
    assert "ran inside torch.compile" in message
    assert 'backend="eager"' in message
    assert "now hold values of this batch" not in message   # not what happened
