"""User-level DP through the private step (issue 26 §1–2): ULS clips each user as one unit.

Expected numbers come from the float64 per-example loop (``tests/oracles.py``), grouped by
user in the test: a sampled user's contribution is the mean (or the sum) of their examples'
gradients, clipped to C as one vector; the step releases the sum over users divided by the
expected number of users q_u·U. Every layer kind takes its own route: Linear (ghost norm),
Conv2d and LayerNorm (per-sample rules), Embedding, and PReLU (no rule: vmap only).
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

N, USERS = 24, 7


def _cases() -> dict[str, tuple[nn.Module, torch.Tensor, int]]:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    return {
        "linear": (nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3)),
                   torch.randn(N, 5, generator=g), 3),
        "conv": (nn.Sequential(nn.Conv2d(1, 3, 3), nn.Tanh(), nn.Flatten(),
                               nn.Linear(3 * 4 * 4, 3)), torch.randn(N, 1, 6, 6, generator=g), 3),
        "embedding_layernorm": (nn.Sequential(nn.Embedding(7, 4), nn.LayerNorm(4), nn.Flatten(),
                                              nn.Linear(12, 3)),
                                torch.randint(0, 7, (N, 3), generator=g), 3),
        "vmap_only": (nn.Sequential(nn.Linear(5, 4), nn.PReLU(), nn.Linear(4, 3)),
                      torch.randn(N, 5, generator=g), 3),
    }


def _user_ids() -> torch.Tensor:
    """7 users of unequal sizes (1 to 7 examples), interleaved in the dataset."""
    sizes = [1, 2, 3, 4, 4, 3, 7]
    ids = torch.cat([torch.full((s,), 100 + 3 * u) for u, s in enumerate(sizes)])  # any ids
    return ids[torch.randperm(N, generator=torch.Generator().manual_seed(1))]


def _one_step(model, x, y, ids, *, reduction, clip, sigma=0.0, k=None, physical=None,
              batch_size=USERS):
    ds = TensorDataset(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # σ = 0 warns: not private (this checks the sums)
        model, opt, dl = dpfy.make_private(
            model, torch.optim.SGD(model.parameters(), lr=1.0),
            DataLoader(ds, batch_size=batch_size), noise_multiplier=sigma, max_grad_norm=clip,
            seed=3, user_ids=ids, user_sampling="uls", max_examples_per_user=k,
            user_reduction=reduction, max_physical_batch_size=physical)
    rows = []
    for xb, yb in dl:
        rows.append(dl.cursor.indices.clone())
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        if opt.updated:
            break
    return model, opt, torch.cat(rows)


def _expected_update(ref, x, y, ids, rows, *, reduction, clip, b):
    """−Σ_u clip(mean or sum of user u's sampled gradients)/b, from the float64 loop."""
    per_example = oracles.per_example_grads(ref, x[rows], y[rows], F.cross_entropy)
    users = ids[rows]
    total = {n: torch.zeros(g.shape[1:], dtype=torch.float64) for n, g in per_example.items()}
    for u in users.unique():
        mine = users == u
        g_u = {n: g[mine].sum(0) for n, g in per_example.items()}
        if reduction == "mean":
            g_u = {n: t / int(mine.sum()) for n, t in g_u.items()}
        norm = torch.sqrt(sum(t.square().sum() for t in g_u.values()))
        w = min(1.0, clip / float(norm))
        for n in total:
            total[n] += w * g_u[n]
    return {n: -t / b for n, t in total.items()}


@pytest.mark.parametrize("name, reduction", [
    ("linear", "mean"), ("conv", "mean"), ("embedding_layernorm", "mean"),
    ("vmap_only", "mean"), ("linear", "sum"), ("embedding_layernorm", "sum")])
def test_uls_clips_each_users_mean_or_sum_as_one_unit_like_the_float64_loop(name, reduction):
    model, x, classes = _cases()[name]
    y = torch.arange(N) % classes
    ids = _user_ids()
    before = {n: p.detach().clone().double() for n, p in model.named_parameters()}
    ref = _cases()[name][0].double()
    ref.load_state_dict(before)
    clip = 0.2   # most users are clipped, some not
    model, opt, rows = _one_step(model, x, y, ids, reduction=reduction, clip=clip)
    assert opt.ledger.step_groups[0].sampling.value == "uls"
    # batch_size = 7 = U: q_u = 1, every user sampled, b = q_u·U = 7
    assert sorted(rows.tolist()) == list(range(N))
    want = _expected_update(ref, x, y, ids, rows, reduction=reduction, clip=clip, b=USERS)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach().double() - before[n], want[n], rtol=1e-4,
                                   atol=1e-6)


def test_uls_takes_at_most_k_rows_per_user_and_splits_physical_batches_between_users():
    model, x, classes = _cases()["linear"]
    y = torch.arange(N) % classes
    ids = _user_ids()
    before = {n: p.detach().clone().double() for n, p in model.named_parameters()}
    ref = _cases()["linear"][0].double()
    ref.load_state_dict(before)
    model, opt, rows = _one_step(model, x, y, ids, reduction="mean", clip=0.2, k=2, physical=4)
    counts = torch.bincount(torch.unique(ids, return_inverse=True)[1][rows])
    assert int(counts.max()) == 2 and len(rows) == 1 + 2 * 6   # the 1-example user keeps 1
    want = _expected_update(ref, x, y, ids, rows, reduction="mean", clip=0.2, b=USERS)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach().double() - before[n], want[n], rtol=1e-4,
                                   atol=1e-6)


def test_a_physical_batch_smaller_than_a_users_rows_is_refused():
    model, x, classes = _cases()["linear"]
    with pytest.raises(ValueError, match="max_physical_batch_size"):
        _one_step(model, x, torch.arange(N) % classes, _user_ids(), reduction="mean",
                  clip=1.0, physical=3)   # the largest user brings 7 rows


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_removing_one_user_moves_the_released_sum_by_at_most_C(reduction):
    """σ = 0, every user sampled (q_u = 1): S(D) − S(D without u) = clip(g_u), ‖·‖ ≤ C."""
    torch.manual_seed(0)
    x, ids = torch.randn(N, 5) * 5, _user_ids()
    y = torch.arange(N) % 3
    clip = 0.5
    sums = []
    for drop in (None, 106):   # user 106 has 3 examples
        keep = torch.ones(N, dtype=torch.bool) if drop is None else ids != drop
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3))
        users = int(ids[keep].unique().numel())
        model, opt, _ = _one_step(model, x[keep], y[keep], ids[keep], reduction=reduction,
                                  clip=clip, batch_size=users)
        b = opt.sampler.normalizer
        assert b == users
        sums.append(torch.cat([p.grad.flatten().double() * b for p in model.parameters()]))
    moved = float((sums[0] - sums[1]).norm())
    assert 0.5 * clip < moved <= clip * (1 + 1e-5)   # the user is clipped: it moves by ~C


def test_a_method_with_per_example_loss_probes_is_refused_under_uls():
    from dpfy.adaptive.base import Method
    from dpfy.types import ReleaseSpec

    class Probe(Method):
        def releases(self, state, plan):
            return {"probe": ReleaseSpec(kind="loss", sensitivity=1.0, noise_std=1.0,
                                         offsets={})}

    model, x, classes = _cases()["linear"]
    with pytest.raises(PrivacyRefusal, match="per-user values"):
        dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=1.0),
                          DataLoader(TensorDataset(x, torch.arange(N) % classes), batch_size=3),
                          noise_multiplier=1.0, method=Probe(), user_ids=_user_ids(),
                          user_sampling="uls", loss_fn=lambda m, b: m(b[0]).sum(1))


@pytest.mark.parametrize("kwargs", [
    {"poisson_sampling": False}, {"sample_rates": torch.full((N,), 0.1)},
    {"clipping": "individual", "max_grad_norm": [1.0] * N},
])
def test_what_is_per_example_is_refused_with_user_ids(kwargs):
    model, x, classes = _cases()["linear"]
    with pytest.raises(PrivacyRefusal, match="user-level DP"):
        dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=1.0),
                          DataLoader(TensorDataset(x, torch.arange(N) % classes), batch_size=3),
                          noise_multiplier=1.0, user_ids=_user_ids(), user_sampling="uls",
                          **kwargs)


def test_user_arguments_without_user_ids_and_els_without_k_are_refused():
    model, x, classes = _cases()["linear"]
    loader = DataLoader(TensorDataset(x, torch.arange(N) % classes), batch_size=3)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    with pytest.raises(ValueError, match="user_ids"):
        dpfy.make_private(model, opt, loader, noise_multiplier=1.0, user_sampling="uls")
    with pytest.raises(ValueError, match="max_examples_per_user"):
        dpfy.make_private(model, opt, loader, noise_multiplier=1.0, user_ids=_user_ids(),
                          user_sampling="els")


def test_els_clips_each_kept_example_alone_and_records_k():
    """ELS: only the kept examples (≤ k per user) are sampled; each is clipped alone (the
    float64 loop's per-example clipped sum); the ledger's step is ELS with k."""
    model, x, classes = _cases()["linear"]
    y = torch.arange(N) % classes
    ids = _user_ids()
    before = {n: p.detach().clone().double() for n, p in model.named_parameters()}
    ref = _cases()["linear"][0].double()
    ref.load_state_dict(before)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, dl = dpfy.make_private(
            model, torch.optim.SGD(model.parameters(), lr=1.0),
            DataLoader(TensorDataset(x, y), batch_size=6), noise_multiplier=0.0,
            max_grad_norm=0.2, seed=4, user_ids=ids, user_sampling="els",
            max_examples_per_user=2)
    kept = opt.sampler.kept
    assert torch.bincount(torch.unique(ids, return_inverse=True)[1][kept]).max() <= 2
    for xb, yb in dl:
        rows = dl.cursor.indices.clone()
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        break
    assert set(rows.tolist()) <= set(kept.tolist())
    per_example = oracles.per_example_grads(ref, x[rows], y[rows], F.cross_entropy)
    summed = oracles.clipped_sum(per_example, 0.2)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach().double() - before[n], -summed[n] / 6.0,
                                   rtol=1e-4, atol=1e-6)
    group = opt.ledger.step_groups[0]
    assert (group.sampling.value, group.max_examples_per_user) == ("els", 2)
    assert opt.ledger.dataset_size == USERS


def test_a_user_level_run_cannot_be_resumed_as_an_example_level_one():
    model, x, classes = _cases()["linear"]
    y = torch.arange(N) % classes
    model, opt, _ = _one_step(model, x, y, _user_ids(), reduction="mean", clip=1.0, sigma=1.0)
    state = opt.state_dict()
    other = _cases()["linear"][0]
    _, example_opt, _ = dpfy.make_private(
        other, torch.optim.SGD(other.parameters(), lr=1.0),
        DataLoader(TensorDataset(x, y), batch_size=7), noise_multiplier=1.0, seed=3)
    with pytest.raises(ValueError, match="unit of privacy"):
        example_opt.load_state_dict(state)


def test_a_loader_with_its_own_sampler_is_refused_and_ids_are_read_once():
    from torch.utils.data import SubsetRandomSampler
    model, x, classes = _cases()["linear"]
    ds = TensorDataset(x, torch.arange(N) % classes)
    with pytest.raises(PrivacyRefusal, match="loader.sampler"):
        dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=1.0),
                          DataLoader(ds, batch_size=3, sampler=SubsetRandomSampler(range(10))),
                          noise_multiplier=1.0, user_ids=_user_ids(), user_sampling="uls")
    ids = _user_ids()
    _, opt, _ = dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=1.0),
                                  DataLoader(ds, batch_size=3), noise_multiplier=1.0,
                                  user_ids=ids, user_sampling="uls")
    before = opt.sampler.units.user_of.clone()
    ids.zero_()   # the caller's tensor changes later: the run's users do not
    assert torch.equal(opt.sampler.units.user_of, before) and opt.sampler.units.num_users == 7
