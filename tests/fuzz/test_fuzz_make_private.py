"""Fuzzed arguments of ``dpfy.make_private`` (issue 15 §3): each call either works (and one
private step then runs, or stops with BudgetExhausted) or raises ``ValueError``/``TypeError``
with one line naming the fix, within 5 CPU seconds.
"""

from __future__ import annotations

import math
import time

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from fuzz.fuzz_support import EXTREME, FUZZ, LIMIT_S, count, hang_guard, warm_up
from dpfy.errors import BudgetExhausted

odd = st.one_of(st.sampled_from(EXTREME), st.floats(), st.integers(-10**20, 10**20),
                st.sampled_from(["", "x", "1", None, [], {}, True, (1.0,), float]))
# epochs = inf (or so large that epochs × len(loader) is inf) and max_physical_batch_size=True
# (a bool is an int) were tracebacks (OverflowError; torch's multi-line TypeError) found by
# this suite; both are one-line ValueErrors now (named test below). The random suites keep
# epochs finite so that a run's planning stays fast.
finite_epochs = odd.filter(lambda v: not (isinstance(v, float) and abs(v) > 1e300))
KWARGS = {
    "noise_multiplier": odd, "target_epsilon": odd, "target_delta": odd,
    "epochs": finite_epochs,
    "max_grad_norm": odd, "seed": odd, "max_steps": odd,
    "max_physical_batch_size": odd.filter(lambda v: not isinstance(v, bool)),
    "epsilon_cap": odd,
    "clipping": st.sampled_from(["flat", "per_layer", "automatic", "individual", "x", 3]),
    "route": st.sampled_from(["auto", "ghost", "vmap", "x", None]),
    "accountant": st.sampled_from(["pld", "rdp", "gdp", "x", None]),
    "loss_reduction": st.sampled_from(["mean", "sum", "x", None]),
    "poisson_sampling": st.sampled_from([True, False, "x"]),
}
# a working base the fuzzed arguments replace
BASE = {"noise_multiplier": 1.0, "seed": 3, "accountant": "rdp"}


def _attempt(kwargs: dict) -> str:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = dpfy.make_private(model, opt, DataLoader(data, batch_size=4),
                                           **kwargs)
    for x, y in loader:                       # one logical batch (its physical batches)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if loader.cursor.last:
            break
    return "ok"


def check_make_private(kwargs: dict, suite: str) -> None:
    warm_up()
    start = time.process_time()
    with hang_guard():
        try:
            outcome = _attempt(kwargs)
        except BudgetExhausted:
            outcome = "budget exhausted"
        except (ValueError, TypeError) as e:
            msg = str(e)
            assert msg and "\n" not in msg.strip(), (kwargs, msg)
            outcome = f"refused ({type(e).__name__})"
    elapsed = time.process_time() - start
    assert elapsed <= LIMIT_S, (kwargs, f"{elapsed:.1f} CPU s")
    count(suite, outcome)


@pytest.mark.parametrize("name, value", [
    ("target_epsilon", 1e-6), ("target_epsilon", 1e9), ("noise_multiplier", 1e-6),
    ("noise_multiplier", 1e6), ("target_delta", 1e-300), ("noise_multiplier", math.nan),
    ("noise_multiplier", math.inf), ("max_grad_norm", math.nan), ("max_grad_norm", -1.0),
    ("seed", -1), ("seed", 2**64), ("max_physical_batch_size", 0), ("epsilon_cap", math.nan),
    ("max_steps", 0), ("noise_multiplier", "1"), ("max_grad_norm", "1"),
    ("epochs", math.inf), ("max_physical_batch_size", True),
])
def test_named_arguments(name, value):
    kwargs = {**BASE, name: value}
    if name in ("target_epsilon", "target_delta"):
        kwargs.pop("noise_multiplier")
        kwargs.setdefault("target_delta", 1e-5)
        kwargs.setdefault("target_epsilon", 3.0)
        kwargs["epochs"] = 1
    check_make_private(kwargs, "make_private (named extremes)")


@settings(max_examples=60, **FUZZ)
@given(changes=st.fixed_dictionaries({}, optional=KWARGS))
def test_make_private_arguments(changes):
    check_make_private({**BASE, **changes}, "make_private")


@pytest.mark.slow
@settings(max_examples=1000, **FUZZ)
@given(changes=st.fixed_dictionaries({}, optional=KWARGS))
def test_make_private_arguments_many(changes):
    check_make_private({**BASE, **changes}, "make_private (slow)")
