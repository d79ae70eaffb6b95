"""dpfy owns every sampler it accounts (issue 10 §1.2).

A loader whose sampler dpfy cannot account is refused in both modes, naming the sampler and the
fix; the shuffled mode draws its batches from dpfy's own permutation sampler, whose pass
continues across restarts, worker prefetch and checkpoints, so that no example takes part more
often than the ledger's SHUFFLE charge ⌈c/⌊N/b⌋⌉ (derived below, not read from dpfy).
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import (BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler,
                              SequentialSampler, SubsetRandomSampler, TensorDataset,
                              WeightedRandomSampler)
from torch.utils.data.distributed import DistributedSampler

import dpfy
from dpfy.errors import PrivacyRefusal
from dpfy.privacy import Sampling
from dpfy.privacy.canonical import canonical_form
from dpfy.sampling import DPDataLoader, ShuffleSampler, make_sampler

N = 30


def _dataset(n: int = N) -> TensorDataset:
    """x = the example's own index, so a batch says which examples it holds."""
    return TensorDataset(torch.arange(n, dtype=torch.float32)[:, None], torch.zeros(n).long())


def _private(loader: DataLoader, **kw):
    torch.manual_seed(0)
    model = nn.Linear(1, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return dpfy.make_private(model, opt, loader, noise_multiplier=1.0, seed=0, **kw)


def _ids(x: torch.Tensor) -> list[int]:
    return x[:, 0].long().tolist()


class _EveryOther(Sampler[int]):
    """A custom sampler (what dpfy cannot see into)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(0, self.n, 2))

    def __len__(self) -> int:
        return (self.n + 1) // 2


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(_dataset())


DS = _dataset()
UNACCOUNTABLE = {
    # loader, words the message must name (the sampler's class and the fix)
    "subset": (DataLoader(DS, batch_size=5, sampler=SubsetRandomSampler(range(10))),
               ["SubsetRandomSampler", "torch.utils.data.Subset"]),
    "replacement": (DataLoader(DS, batch_size=5, sampler=RandomSampler(DS, replacement=True)),
                    ["RandomSampler(replacement=True", "shuffle=True"]),
    "num_samples": (DataLoader(DS, batch_size=5, sampler=RandomSampler(DS, num_samples=60)),
                    ["num_samples=60", "shuffle=True"]),
    "weighted": (DataLoader(DS, batch_size=5, sampler=WeightedRandomSampler([1.0] * N, N)),
                 ["WeightedRandomSampler", "drop the sampler"]),
    "distributed": (DataLoader(DS, batch_size=5,
                               sampler=DistributedSampler(DS, num_replicas=1, rank=0)),
                    ["DistributedSampler", "one process"]),
    "custom": (DataLoader(DS, batch_size=5, sampler=_EveryOther(N)),
               ["_EveryOther", "Drop the custom sampler"]),
    "other_data_source": (DataLoader(DS, batch_size=5, sampler=SequentialSampler(range(10))),
                          ["SequentialSampler", "torch.utils.data.Subset"]),
}


def test_an_iterable_dataset_is_refused():
    # (make_private reads len(dataset) before it builds the sampler, so ask make_sampler.)
    for poisson in (True, False):
        with pytest.raises(PrivacyRefusal,
                           match=r"loader\.dataset must be a map-style dataset.*'_Stream'"):
            make_sampler(DataLoader(_Stream(), batch_size=5), poisson_sampling=poisson, seed=0)


@pytest.mark.parametrize("case", sorted(UNACCOUNTABLE))
def test_shuffled_mode_refuses_samplers_it_cannot_account(case):
    loader, words = UNACCOUNTABLE[case]
    with pytest.raises(PrivacyRefusal) as err:
        _private(loader, poisson_sampling=False)
    subset = case in ("subset", "other_data_source")  # Poisson would not help: use a Subset
    for w in words + ["Poisson sampling"] * (not subset):
        assert w in str(err.value), (w, str(err.value))


@pytest.mark.parametrize("case", ["subset", "weighted", "custom", "replacement"])
def test_poisson_mode_refuses_a_sampler_it_would_ignore(case):
    # A held-out SubsetRandomSampler would silently become training data under Poisson.
    loader, words = UNACCOUNTABLE[case]
    with pytest.raises(PrivacyRefusal) as err:
        _private(loader)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_a_user_batch_sampler_is_refused():
    loader = DataLoader(DS, batch_sampler=BatchSampler(RandomSampler(DS), 5, drop_last=False))
    with pytest.raises(PrivacyRefusal, match=r"loader\.batch_sampler .*BatchSampler.*batch_size="):
        make_sampler(loader, poisson_sampling=False, seed=0)
    # Per-example Poisson rates do not read batch_size: the batch sampler was ignored before.
    with pytest.raises(PrivacyRefusal, match=r"BatchSampler.*batch_size="):
        _private(loader, sample_rates=[0.2] * N)


@pytest.mark.parametrize("poisson", [True, False])
@pytest.mark.parametrize("shuffle", [True, False])
def test_plain_loaders_are_accepted_in_both_modes(poisson, shuffle):
    model, opt, dl = _private(DataLoader(DS, batch_size=4, shuffle=shuffle),
                              poisson_sampling=poisson)
    seen = []
    for x, y in dl:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        seen += _ids(x)
    (group,) = list(opt.ledger)
    assert group.count == len(dl) == math.ceil(N / 4)
    if not poisson:  # one pass of dpfy's permutation: every example exactly once
        assert sorted(seen) == list(range(N))
        assert group.sampling is Sampling.SHUFFLE and group.sample_rate == 4 / N


def _step(model, opt, x, y) -> None:
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def _train(model, opt, dl, stops, *, unstepped: bool = False) -> list[list[int]]:
    """Iterate ``dl`` once per entry of ``stops``, breaking after that many steps (None: run
    the pass out); with ``unstepped`` the break comes after one more batch was yielded and not
    stepped. Returns the examples of every step taken."""
    stepped: list[list[int]] = []
    for stop in stops:
        for k, (x, y) in enumerate(dl):
            if unstepped and k == stop:
                break  # yielded, never stepped: it must come again
            _step(model, opt, x, y)
            stepped.append(_ids(x))
            if not unstepped and k + 1 == stop:
                break
    return stepped


@pytest.mark.parametrize("unstepped", [False, True])
def test_shuffled_restart_mid_pass_never_repeats_an_example_within_a_pass(unstepped):
    # Today's code re-iterated the user's loader on a restart: a fresh shuffle, so examples
    # already used in the pass came again while the ledger charged one participation per pass.
    b = 4
    model, opt, dl = _private(DataLoader(DS, batch_size=b, shuffle=True), poisson_sampling=False)
    stepped = _train(model, opt, dl, [3, 2, None, 5, None], unstepped=unstepped)
    p = math.ceil(N / b)  # batches per pass
    for one_pass in (stepped[:p], stepped[p:2 * p]):
        ids = [i for batch in one_pass for i in batch]
        assert len(ids) == len(set(ids))  # no example twice within a pass
        assert sorted(ids) == list(range(N))  # in fact each exactly once
        assert [len(batch) for batch in one_pass] == [b] * (p - 1) + [N % b]
    assert len(stepped) == 2 * p


def test_participations_stay_within_the_ledger_charge():
    # c steps over several passes with restarts and a partial last batch (N mod b = 3).
    n, b, sigma = 23, 5, 1.0
    model, opt, dl = _private(DataLoader(_dataset(n), batch_size=b, shuffle=True),
                              poisson_sampling=False)
    stepped = _train(model, opt, dl, [3, 4, None, 1, 2, 2, None, 4, 1, 1, 1])
    counts = Counter(i for batch in stepped for i in batch)
    steps = sum(g.count for g in opt.ledger)
    # The ledger's SHUFFLE charge (ledger.py): an epoch has at least L = floor(N/b) steps and an
    # example is in at most one batch per epoch, so ceil(c/L) participations over c steps.
    charge = math.ceil(steps / math.floor(n / b))
    assert steps == len(stepped) > 2 * math.ceil(n / b)  # several passes, the last unfinished
    assert max(counts.values()) <= charge
    # ... and that is what the accountant is given: ceil(c/L) Gaussians at σ/2 (replace-one),
    # merged into one Gaussian of multiplier (σ/2)/sqrt(charge).
    (atom,) = canonical_form(opt.ledger).atoms
    assert round((sigma / 2 / atom.noise_multiplier) ** 2) == charge


def test_a_restart_inside_a_logical_batch_continues_it():
    # Physical batches of 2 within logical batches of 5: breaking after 1, 3, 4 physical steps
    # resumes the same logical batch (one ledger step, one noise draw per logical batch).
    n, b = 13, 5  # logical batches 5, 5, 3 -> physical 2+2+1, 2+2+1, 2+1
    model, opt, dl = _private(DataLoader(_dataset(n), batch_size=b, shuffle=True),
                              poisson_sampling=False, max_physical_batch_size=2)
    stepped = _train(model, opt, dl, [1, 3, 4])
    assert [len(x) for x in stepped] == [2, 2, 1, 2, 2, 1, 2, 1]
    assert sorted(i for x in stepped for i in x) == list(range(n))
    assert sum(g.count for g in opt.ledger) == 3


def test_every_pass_is_at_least_as_long_as_the_ledgers_epoch():
    # The ledger's epoch length is floor(1/q) at the float q = b/N it records (canonical.py
    # adds 1e-9 against rounding); a pass must never be shorter, for any N and b.
    for n in range(1, 160):
        for b in range(1, n + 1):
            epoch = math.floor(1 / (b / n) + 1e-9)
            for drop_last in (False, True):
                s = ShuffleSampler(n, b, seed=0, drop_last=drop_last)
                assert s.steps_per_epoch >= epoch, (n, b, drop_last)
                assert s.steps_per_epoch == (n // b if drop_last else -(-n // b))


def _take(dl: DPDataLoader, k: int) -> list[list[int]]:
    """k batches, each taken by a step (the cursor reset is what optimizer.step() does)."""
    out: list[list[int]] = []
    for i, (x, _) in enumerate(dl):
        if i == k:
            break
        out.append(_ids(x))
        dl.cursor.pending = 0  # optimizer.step() took the batch
    return out


def _loader(seed: int | None = 0, n: int = N, b: int = 4, **kw) -> DPDataLoader:
    loader = DataLoader(_dataset(n), batch_size=b, shuffle=True, **kw)
    return DPDataLoader(loader, make_sampler(loader, poisson_sampling=False, seed=seed))


def test_checkpoint_resumes_the_permutation_and_position_exactly():
    whole = _take(_loader(), 20)
    first = _loader()
    head = _take(first, 6)
    state = first.sampler.state_dict()
    resumed = _loader(seed=123)  # a different seed: everything comes from the checkpoint
    resumed.sampler.load_state_dict(state)
    assert head + _take(resumed, 14) == whole


def test_asking_for_a_batch_without_stepping_is_refused_and_a_peek_is_yielded_again():
    dl = _loader()
    peek = _ids(next(iter(dl))[0])  # looked at, never stepped
    it = iter(dl)
    assert _ids(next(it)[0]) == peek  # the new iteration gives the unstepped batch again
    with pytest.raises(PrivacyRefusal, match="optimizer.step()"):
        next(it)  # a second batch before a step: it could be skipped without a ledger step
    assert _take(dl, 1) == [peek]


def test_worker_prefetch_does_not_skip_or_repeat_examples():
    dl = _loader(n=40, b=4, num_workers=2, multiprocessing_context="fork")
    got = _take(dl, 3) + _take(dl, 2) + _take(dl, 100)  # workers ran ahead at each break
    assert sorted(i for batch in got for i in batch) == list(range(40))


def test_only_the_newest_iterator_may_be_used():
    dl = _loader()
    old = iter(dl)
    next(old)
    dl.cursor.pending = 0
    _take(dl, 1)
    with pytest.raises(ValueError, match="superseded"):
        next(old)


def test_drop_last_passes_and_lengths():
    dl = _loader(n=10, b=4, drop_last=True)
    assert len(dl) == 2  # floor(10/4): the ledger's L, so its charge ceil(c/L) is exact
    one_pass = _take(dl, 100)
    assert [len(b) for b in one_pass] == [4, 4] and len(set(sum(one_pass, []))) == 8
    assert len(_loader(n=10, b=4)) == 3


def test_seeded_passes_are_reproducible_and_secure_ones_are_not():
    assert _take(_loader(seed=7), 16) == _take(_loader(seed=7), 16) != _take(_loader(seed=8), 16)
    a, b = _loader(seed=None), _loader(seed=None)
    assert a.sampler.secure and a.sampler.state_dict()["generator"] is None
    pa, pb = _take(a, 8), _take(b, 8)
    assert sorted(sum(pa, [])) == sorted(sum(pb, [])) == list(range(N))
    assert pa != pb  # two OS-CSPRNG permutations of 30 agree with probability 1/30!


def test_secure_permutations_are_uniform_on_first_position():
    # Each of n = 5 examples is first with probability 1/5: 2,000 passes, chi-square 4 dof.
    counts = torch.zeros(5)
    s = ShuffleSampler(5, 5, seed=None)
    for _ in range(2000):
        idx, _, end = next(s.chunks(None))
        counts[idx[0]] += 1
        s.commit(end)
    chi2 = float(((counts - 400) ** 2 / 400).sum())
    assert chi2 < 18.47  # the 0.999 quantile of chi-square(4)
