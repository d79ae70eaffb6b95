"""The contract every registered method keeps (STYLE.md R10), enumerated from ``REGISTRY``.

For each key, built by ``dpfy.adaptive.make`` and calibrated by ``make_private`` for a tiny run:
- three steps run; every step's ledger entry is the gradient plus exactly the releases the
  method declared for that step, each with noise (R2);
- ``update`` receives a ``StepOutcome`` and nothing else (no path to raw norms);
- the state survives a checkpoint round trip and gives the same next plan (R5);
- the method's file is ``adaptive/{key}.py`` or the one ``FILE_ALIASES`` names, and its test
  file exists (R1).
"""

from __future__ import annotations

import inspect
import io
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive import FILE_ALIASES, REGISTRY, make
from dpfy.types import StepOutcome

N, BATCH, STEPS = 200, 20, 3
OPTIONS = {                       # the smallest options each key needs
    "noise_decay": dict(kind="exponential", rate=0.3, per="step"),
    "plateau": dict(initial=2.0),
    "dynamic": dict(preset="dynamic", stages=2),
    "clip_schedule": dict(kind="exponential", initial=1.0, rate=0.9),
}
# The inner optimizer each key needs (adamwosm keeps its first moment in SGD's momentum).
OPTIMIZERS = {"adamwosm": dict(momentum=0.9)}
TESTS = Path(__file__).parent


def _losses(model, batch):
    """Per-example losses for methods that declare loss probes (``needs.probes``)."""
    return F.cross_entropy(model(batch[0]), batch[1], reduction="none")


def _private(method, seed=1, **opt_kwargs):
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(N, 6), torch.randint(0, 2, (N,)))
    model = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2))
    return (model,) + dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1, **opt_kwargs),
        DataLoader(ds, batch_size=BATCH),
        method=method, target_epsilon=4.0, target_delta=1e-5, max_steps=STEPS + 2,
        max_grad_norm=1.0, seed=seed, accountant="rdp",
        loss_fn=_losses if method.needs.probes else None)[1:]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_registered_method_keeps_the_contract(name):
    model, opt, loader = _private(make(name, **OPTIONS.get(name, {})),
                                  **OPTIMIZERS.get(name, {}))
    method = opt.method
    seen = []
    original = type(method).update

    def spy(self, state, released):
        seen.append(released)
        return original(self, state, released)

    declared = []
    batches = iter(loader)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(method), "update", spy)
        for _ in range(STEPS):
            plan = opt._plan_step()
            declared.append(sorted(method.releases(opt.method_state, plan)))
            x, y = next(batches)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    steps = [g for g in opt.ledger.groups for _ in range(g.count)]
    assert len(steps) == STEPS
    for group, names in zip(steps, declared):
        mechanisms = [r.mechanism for r in group.releases]
        assert mechanisms[0] == "gradient" and sorted(mechanisms[1:]) == names
        assert all(r.noise_multiplier > 0 for r in group.releases)
    assert len(seen) == STEPS and all(type(r) is StepOutcome for r in seen)
    # R5: the state survives a checkpoint round trip and plans the same next step.
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    restored = method.load_state_dict(torch.load(buf, weights_only=False)["method_state"])
    base = dpfy.types.plan.StepPlan(STEPS, opt.sampler.sample_rate, 1.0, 1.0)
    assert repr(method.plan(restored, base)) == repr(method.plan(opt.method_state, base))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_one_file_one_key_one_test(name):
    path = Path(inspect.getfile(REGISTRY[name]))
    assert path.stem == FILE_ALIASES.get(name, name) and path.parent.name == "adaptive"
    assert (TESTS / f"test_{name}.py").exists() or (TESTS / f"test_{path.stem}.py").exists()


def test_unknown_name_lists_the_registry():
    with pytest.raises(ValueError, match="method must be one of .*'quantile'"):
        make("no_such_method")


def test_every_file_of_the_package_is_imported_so_a_new_method_registers_itself():
    # Adding a method is one new file in adaptive/: the package imports every module in it.
    import sys

    import dpfy.adaptive as adaptive

    files = [p.stem for p in Path(adaptive.__file__).parent.glob("*.py") if p.stem != "__init__"]
    assert files and all(f"dpfy.adaptive.{f}" in sys.modules for f in files)
