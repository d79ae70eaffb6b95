"""Augmentation multiplicity (De et al. 2022, §3.1) through the private step.

Expected values are derived here, from the float64 per-example loop (``tests/oracles.py``) on
the very rows the loader yielded: each sampled example's K augmented rows' gradients are
averaged, the average is clipped to C, and the update is −(1/b) Σ_u clip_C(mean_k g_{u,k})
with b = qN the expected number of *examples* (the loss is the mean over the B·K rows). The
ledger of an augmult run is the plain run's (same q, σ, steps), and K = 1 is the plain run.
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
from dpfy.data.augment import crop_flip, random_crop_flip
from dpfy.errors import PrivacyRefusal

N, K = 12, 3
CLIP = {"linear": 1.9, "conv": 4.0}   # about the median example's gradient norm: some clipped


def _case(name: str, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(seed)
    if name == "linear":
        return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3)), torch.randn(
            N, 5, generator=g
        ) * 2
    return nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 4 * 4, 3)
    ), torch.randn(N, 1, 6, 6, generator=g) * 2


def _jitter(batch, generator):
    """A test augmentation: Gaussian jitter of the inputs, from dpfy's augmentation generator."""
    x, y = batch
    return x + 0.5 * torch.randn(x.shape, generator=generator), y


def _private(model, x, *, augmult=K, augment=_jitter, route="auto", physical=None,
             batch_size=N, sigma=0.0, **kw):
    y = torch.arange(N) % 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # σ = 0 and the seed warn (this checks the sums)
        return dpfy.make_private(
            model, torch.optim.SGD(model.parameters(), lr=1.0),
            DataLoader(TensorDataset(x, y), batch_size=batch_size), noise_multiplier=sigma,
            max_grad_norm=kw.pop("max_grad_norm", 0.2), seed=4, route=route,
            max_physical_batch_size=physical,
            augmult=augmult, augment=augment, **kw)


def _one_step(model, opt, dl):
    """One logical step; the rows (dataset index, augmented input, label) each physical batch
    fed the model."""
    idx, xs, ys = [], [], []
    for xb, yb in dl:
        idx.append(dl.cursor.indices.clone())
        xs.append(xb.clone())
        ys.append(yb.clone())
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()   # the mean over the B·K rows
        opt.step()
        if opt.updated:
            break
    return torch.cat(idx), torch.cat(xs), torch.cat(ys), len(idx)


def _expected_update(ref, idx, x, y, *, clip, b, k=K):
    """−(1/b) Σ_u clip_C((1/K) Σ_k g_{u,k}), u the examples, from the float64 loop."""
    rows = oracles.per_example_grads(ref, x, y, F.cross_entropy)
    total = {n: torch.zeros(g.shape[1:], dtype=torch.float64) for n, g in rows.items()}
    clipped = 0
    for u in idx.unique():
        mine = idx == u
        assert int(mine.sum()) == k
        g_u = {n: g[mine].mean(0) for n, g in rows.items()}
        norm = torch.sqrt(sum(t.square().sum() for t in g_u.values()))
        w = min(1.0, clip / float(norm))
        clipped += w < 1
        for n in total:
            total[n] += w * g_u[n]
    assert 0 < clipped < len(idx.unique()), "C = 0.2 clips some units, not all"
    return {n: -t / b for n, t in total.items()}


@pytest.mark.parametrize("name, route, physical", [
    ("linear", "auto", None), ("linear", "ghost", None), ("linear", "vmap", None),
    ("conv", "auto", None), ("linear", "ghost", 2 * K), ("conv", "vmap", 2 * K + 1)])
def test_each_examples_k_copies_are_averaged_then_clipped_like_the_float64_loop(
        name, route, physical):
    model, x = _case(name)
    before = {n: p.detach().clone().double() for n, p in model.named_parameters()}
    ref = _case(name)[0].double()
    ref.load_state_dict(before)
    model, opt, dl = _private(model, x, route=route, physical=physical,
                              max_grad_norm=CLIP[name])
    idx, xa, ya, batches = _one_step(model, opt, dl)
    # batch_size = N: q = 1, every example sampled once, K consecutive rows each
    assert sorted(idx.tolist()) == sorted(list(range(N)) * K)
    assert torch.equal(idx.view(-1, K), idx.view(-1, K)[:, :1].expand(-1, K))
    assert batches == (1 if physical is None else -(-N // (physical // K)))
    assert not torch.equal(xa[0::K], xa[1::K])   # the copies differ
    torch.testing.assert_close(ya, torch.arange(N)[idx] % 3)
    want = _expected_update(ref, idx, xa, ya, clip=CLIP[name], b=N)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach().double() - before[n], want[n], rtol=1e-4,
                                   atol=1e-6)
    assert opt.last_step_info["batch_size"] == N   # the step counts examples, not rows


def test_poisson_batches_clip_the_sampled_examples_copies_and_divide_by_qn():
    model, x = _case("linear")
    before = {n: p.detach().clone().double() for n, p in model.named_parameters()}
    ref = _case("linear")[0].double()
    ref.load_state_dict(before)
    model, opt, dl = _private(model, x, batch_size=6, physical=2 * K, max_grad_norm=1.9)
    idx, xa, ya, _ = _one_step(model, opt, dl)
    assert opt.ledger.step_groups[0].sample_rate == pytest.approx(6 / N)   # the examples' q
    want = _expected_update(ref, idx, xa, ya, clip=1.9, b=6)   # b = qN = 6 examples
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach().double() - before[n], want[n], rtol=1e-4,
                                   atol=1e-6)


def _trained(augmult, augment, steps=3, **kw):
    model, x = _case("conv")
    model, opt, dl = _private(model, x, augmult=augmult, augment=augment, batch_size=5,
                              **kw)
    it = iter(dl)
    while opt.step_count < steps:
        xb, yb = next(it)
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    return model, opt


def test_k1_is_the_plain_run_exactly():
    one, opt_one = _trained(1, None, sigma=1.0)   # augmult=1 named
    plain, opt_plain = _trained_without_argument()
    for (n, p), (_, q) in zip(one.named_parameters(), plain.named_parameters()):
        assert torch.equal(p, q), n
    assert opt_one.ledger.to_dict() == opt_plain.ledger.to_dict()


def _trained_without_argument(steps=3):
    """The same run as ``_trained(1, None, sigma=1.0)``, never naming augmult."""
    model, x = _case("conv")
    y = torch.arange(N) % 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, dl = dpfy.make_private(
            model, torch.optim.SGD(model.parameters(), lr=1.0),
            DataLoader(TensorDataset(x, y), batch_size=5), noise_multiplier=1.0,
            max_grad_norm=0.2, seed=4)
    it = iter(dl)
    while opt.step_count < steps:
        xb, yb = next(it)
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    return model, opt


def test_the_ledger_and_the_sampling_facts_are_the_plain_runs():
    _, opt_k = _trained(K, crop_flip(padding=1, flip=True), sigma=1.3)
    _, opt_1 = _trained(1, None, sigma=1.3)
    assert opt_k.ledger.to_dict() == opt_1.ledger.to_dict()   # same q, σ, steps
    assert opt_k.ledger.num_steps == 3 and opt_k.ledger.step_groups[0].sample_rate == 5 / N
    assert opt_k.epsilon(1e-5) == opt_1.epsilon(1e-5)
    s_k, s_1 = opt_k.private_step.sampler, opt_1.private_step.sampler
    assert (s_k.normalizer, s_k.steps_per_epoch) == (s_1.normalizer, s_1.steps_per_epoch)


def test_a_seeded_run_reproduces_its_augmentations_from_their_own_generator():
    a, opt_a = _trained(K, crop_flip(padding=1, flip=True), sigma=1.0)
    b, _ = _trained(K, crop_flip(padding=1, flip=True), sigma=1.0)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    # augmenting draws nothing from the noise stream: after the same steps, its state is the
    # plain run's
    _, opt_plain = _trained(1, None, sigma=1.0)
    noise = opt_a.private_step.mechanism.state_dict()
    assert repr(noise) == repr(opt_plain.private_step.mechanism.state_dict())


@pytest.mark.parametrize("kw, fix", [
    (dict(user_ids=torch.arange(N) % 4, user_sampling="uls"), "user_ids"),
    (dict(clipping="microbatch", microbatch_size=2), "microbatch"),
    (dict(noise="tree"), "noise"),
    (dict(method="adaclip"), "per-sample transform"),
    (dict(clipping="individual", max_grad_norm=[0.2] * N), "individual"),
])
def test_combinations_it_cannot_account_are_refused(kw, fix):
    model, x = _case("linear")
    with pytest.raises(PrivacyRefusal, match=fix):
        _private(model, x, sigma=1.0, **kw)


def test_a_method_with_per_row_loss_probes_is_refused():
    model, x = _case("linear")
    with pytest.raises(PrivacyRefusal, match="per-row loss probes"):
        _private(model, x, sigma=None, target_epsilon=3.0, target_delta=1e-3, epochs=2,
                 method="hyfree",
                 loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1], reduction="none"))


def test_augment_is_required_with_k_above_1_and_refused_with_k_1():
    model, x = _case("linear")
    with pytest.raises(ValueError, match="augment"):
        _private(model, x, augment=None)
    with pytest.raises(ValueError, match="augment"):
        _private(_case("linear")[0], x, augmult=1, augment=_jitter)
    with pytest.raises(ValueError, match="augmult"):
        _private(_case("linear")[0], x, augmult=0)


def test_physical_batches_count_rows_and_must_hold_one_example():
    model, x = _case("linear")
    with pytest.raises(ValueError, match="max_physical_batch_size"):
        _private(model, x, physical=K - 1)


def test_crop_flip_is_a_shifted_window_of_the_padded_image_then_a_mirror():
    x = torch.arange(2 * 2 * 5 * 4, dtype=torch.float32).view(2, 2, 5, 4) + 1
    out = random_crop_flip(x, torch.Generator().manual_seed(7), padding=2, flip=True, fill=-0.5)
    g = torch.Generator().manual_seed(7)   # the same draws, in the documented order
    dy = torch.randint(0, 5, (2,), generator=g)
    dx = torch.randint(0, 5, (2,), generator=g)
    mirror = torch.rand(2, generator=g) < 0.5
    for i in range(2):
        padded = torch.full((2, 9, 8), -0.5)
        padded[:, 2:7, 2:6] = x[i]
        want = padded[:, dy[i]:dy[i] + 5, dx[i]:dx[i] + 4]
        if mirror[i]:
            want = want.flip(-1)
        assert torch.equal(out[i], want)
    same = crop_flip(padding=0)((x, torch.zeros(2)), torch.Generator())
    assert torch.equal(same[0], x)


def test_microbatch_clipping_of_one_row_is_per_example_clipping_with_augmult():
    # clipping='microbatch' with microbatch_size=1 clips each example alone (Δ = C, flat
    # clipping: dpfy.sampling.microbatch); make_private at 1fc6db0 turned it into 'flat'
    # before check_augmult read it, so augmult admitted it. The run is the flat one: the same
    # ledger and, from the same seed, the same update (the same ops on the same machine: the
    # default float32 tolerances of assert_close are far above any difference they could have).
    runs = []
    for kw in ({}, dict(clipping="microbatch", microbatch_size=1)):
        model, x = _case("linear")
        model, opt, dl = _private(model, x, sigma=1.0, **kw)
        _one_step(model, opt, dl)
        runs.append((model, opt))
    (flat, opt_flat), (micro, opt_micro) = runs
    assert opt_micro.private_step.ledger.num_steps == opt_flat.private_step.ledger.num_steps == 1
    assert opt_micro.epsilon(1e-5) == opt_flat.epsilon(1e-5)
    for p, q in zip(micro.parameters(), flat.parameters()):
        torch.testing.assert_close(p, q)
