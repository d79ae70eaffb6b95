"""The contract every registered method keeps (one shared contract test that every method
inherits), enumerated from ``REGISTRY``.

For each key, built by ``dpfy.adaptive.make`` with its ``example_options`` and calibrated by
``make_private`` for a tiny run:
- three steps run; every step's ledger entry is the gradient plus exactly the releases the
  method declared for that step, each with noise (every release is an accounting event);
- ``update`` receives a ``StepOutcome`` and nothing else (no path to raw norms);
- the state survives a checkpoint round trip (pickled as it is) and gives the same next plan
  (state, not closures);
- its releases are described from its specs (``describe_releases``): the gradient sum, then
  every declared release with a label;
- each ``values``/``gradient`` spec's per-example values stay within the declared sensitivity,
  for any norms;
- ``implements`` says exactly which hooks the method's class overrides, and a method that
  declares post-release probes implements ``postprocess``;
- the method's file is ``adaptive/{key}.py`` or the one ``FILE_ALIASES`` names, and its test
  file exists (one method: one file, one key, one test file).
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
from dpfy.adaptive import FILE_ALIASES, HOOKS, REGISTRY, Method, describe_releases, make
from dpfy.adaptive.base import calibrate_for_run
from dpfy.adaptive.describe import EXAMPLE_FACTS
from dpfy.privacy.releases import base_plan
from dpfy.types import Norms, StepOutcome, StepPlan

N, BATCH, STEPS = 200, 20, 3
# The inner optimizer each key needs (adamwosm keeps its first moment in SGD's momentum).
OPTIMIZERS = {"adamwosm": dict(momentum=0.9)}
TESTS = Path(__file__).parent


def _losses(model, batch):
    """Per-example losses, for methods whose specs probe losses."""
    return F.cross_entropy(model(batch[0]), batch[1], reduction="none")


def _method(name: str) -> Method:
    return make(name, **REGISTRY[name].example_options)


def _private(method, seed=1, **opt_kwargs):
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(N, 6), torch.randint(0, 2, (N,)))
    model = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2))
    return (model,) + dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1, **opt_kwargs),
        DataLoader(ds, batch_size=BATCH),
        method=method, target_epsilon=4.0, target_delta=1e-5, max_steps=STEPS + 2,
        max_grad_norm=1.0, seed=seed, accountant="rdp", loss_fn=_losses)[1:]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_registered_method_keeps_the_contract(name):
    model, opt, loader = _private(_method(name), **OPTIMIZERS.get(name, {}))
    method = opt.method
    seen, declared = [], []
    update, releases = type(method).update, type(method).releases

    def spy_update(self, state, outcome):
        seen.append(outcome)
        return update(self, state, outcome)

    def spy_releases(self, state, plan):
        specs = releases(self, state, plan)
        declared.append(sorted(specs))
        return specs

    batches = iter(loader)
    per_step = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(method), "update", spy_update)
        mp.setattr(type(method), "releases", spy_releases)
        for _ in range(STEPS):
            x, y = next(batches)
            declared.clear()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            per_step.append(declared[-1])
    steps = [g for g in opt.ledger.step_groups for _ in range(g.count)]
    assert len(steps) == STEPS
    for group, names in zip(steps, per_step):
        mechanisms = [r.mechanism for r in group.releases]
        assert mechanisms[0] == "gradient" and sorted(mechanisms[1:]) == names
        assert all(r.noise_multiplier > 0 for r in group.releases)
    assert len(seen) == STEPS and all(type(r) is StepOutcome for r in seen)
    # State, not closures: the state, pickled as it is, survives a checkpoint round trip and
    # plans the same.
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    restored = torch.load(buf, weights_only=False)["method_state"]
    base = StepPlan(STEPS, opt.sampler.sample_rate, 1.0, 1.0)
    assert repr(method.plan(restored, base)) == repr(method.plan(opt.method_state, base))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_releases_are_described_from_the_specs(name):
    method = calibrate_for_run(_method(name), EXAMPLE_FACTS)
    rows = describe_releases(method)
    assert rows[0].name == "gradient" and rows[0].noise_multiplier > 0
    state = method.init()
    plan = method.plan(state, base_plan(EXAMPLE_FACTS, 0, 1.0, 1.0))
    assert [r.name for r in rows[1:]] == list(method.releases(state, plan))
    for row in rows[1:]:
        assert row.label, f"{name}: release {row.name!r} has no label"
        assert row.sensitivity > 0 and row.noise_multiplier > 0


def _norms(batch: int, groups: int, seed: int) -> Norms:
    """Per-example norms from 0 to 5 (C = 1 in the example facts), zeros included."""
    g = torch.Generator().manual_seed(seed)
    sq = {f"p{k}": (5 * torch.rand(batch, generator=g, dtype=torch.float64)) ** 2
          for k in range(groups)}
    sq["p0"][:2] = 0.0                                      # a zero gradient, and one more
    total = torch.sqrt(sum(sq.values()))
    return Norms(total=total, per_parameter_sq=sq, clip_groups=tuple((n,) for n in sq))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_spec_values_stay_within_the_declared_sensitivity(name):
    method = calibrate_for_run(_method(name), EXAMPLE_FACTS)
    state = method.init()
    plan = method.plan(state, base_plan(EXAMPLE_FACTS, 0, 1.0, EXAMPLE_FACTS.max_grad_norm))
    for seed in range(3):
        norms = _norms(32, EXAMPLE_FACTS.num_groups, seed)
        for release, spec in method.releases(state, plan).items():
            if spec.kind == "loss":
                assert spec.values is None and spec.offsets is not None
                continue
            v = spec.values(norms).double()                             # (B,) or (B, d)
            assert v.shape[0] == 32, f"{name}.{release}: one value per example"
            if spec.kind == "gradient":       # weights w_i: ‖w_i g_i‖ = |w_i|·‖g_i‖
                bound = v.abs() * norms.total
            else:
                bound = v.reshape(32, -1).norm(dim=1)
            assert float(bound.max()) <= spec.sensitivity * (1 + 1e-9), (name, release)


def _overridden(method: Method, hook: str) -> bool:
    """Whether a class between the method's and ``Method`` defines ``hook``."""
    return any(hook in vars(c) for c in type(method).__mro__
               if issubclass(c, Method) and c is not Method)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_implements_matches_the_hooks(name):
    method = calibrate_for_run(_method(name), EXAMPLE_FACTS)
    for hook in HOOKS:
        assert method.implements(hook) == _overridden(method, hook), hook
    state = method.init()
    plan = method.plan(state, base_plan(EXAMPLE_FACTS, 0, 1.0, 1.0))
    if any(s.after_release for s in method.releases(state, plan).values()):
        assert method.implements("postprocess")     # else the probes would be paid for, unused
    with pytest.raises(ValueError, match="hook must be one of"):
        method.implements("needs")


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_one_file_one_key_one_test(name):
    path = Path(inspect.getfile(REGISTRY[name]))
    assert path.stem == FILE_ALIASES.get(name, name) and path.parent.name == "adaptive"
    assert (TESTS / f"test_{name}.py").exists() or (TESTS / f"test_{path.stem}.py").exists()


def test_unknown_name_lists_the_registry():
    with pytest.raises(ValueError, match="method must be one of .*'quantile'"):
        make("no_such_method")


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(ValueError, match="options must be among .*'rate'.* for method "
                                         "'noise_decay', got options = \\['sigma0'\\]"):
        make("noise_decay", kind="time", rate=1.0, sigma0=3.0)


def test_every_file_of_the_package_is_imported_so_a_new_method_registers_itself():
    # Adding a method is one new file in adaptive/: the package imports every module in it.
    import sys

    import dpfy.adaptive as adaptive

    files = [p.stem for p in Path(adaptive.__file__).parent.glob("*.py") if p.stem != "__init__"]
    assert files and all(f"dpfy.adaptive.{f}" in sys.modules for f in files)


def test_all_names_resolve():
    import dpfy.adaptive as adaptive

    for n in adaptive.__all__:                            # __all__ is checked, not trusted
        getattr(adaptive, n)
