"""Batched fetch (``sampling/fetch.py``): the private loader fetches a physical batch with one
dataset call, and its batches are bit for bit the per-example path's (``dataset[i]`` for each
index, then ``default_collate``), with workers and with pinned memory too."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset, default_collate

from dpfy.sampling import DPDataLoader, make_sampler
from dpfy.sampling.fetch import BatchedDataset, Collated


def _data(n: int = 50) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 4, 4, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    w = torch.rand(n, generator=g, dtype=torch.float64)
    return TensorDataset(x, y, w)


def _loader(ds: Dataset, poisson: bool, **kw) -> DPDataLoader:
    loader = DataLoader(ds, batch_size=8, **kw)
    return DPDataLoader(loader, make_sampler(loader, poisson_sampling=poisson, seed=0))


def _per_item(ds: Dataset, indices: torch.Tensor):
    return default_collate([ds[i] for i in indices.tolist()])


def _same(a, b) -> bool:
    return (
        type(a) is type(b)
        and len(a) == len(b)
        and all(
            x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b)
        )
    )


@pytest.mark.parametrize("poisson", [True, False], ids=["poisson", "shuffle"])
@pytest.mark.parametrize("subset", [False, True], ids=["tensors", "subset"])
def test_batches_are_the_per_example_path_bit_for_bit(poisson, subset):
    ds = _data()
    if subset:
        ds = Subset(Subset(ds, list(range(45, 0, -1))), list(range(0, 40, 2)))
    loader = _loader(ds, poisson)
    seen = 0
    for batch in loader:
        assert _same(batch, _per_item(ds, loader.cursor.indices))
        seen += 1
        loader.cursor.pending = 0  # as optimizer.step() does
    assert seen == len(loader)


def test_an_empty_poisson_batch_has_the_per_example_shapes():
    ds = _data()
    got = BatchedDataset(ds, default_collate).__getitems__([])
    assert isinstance(got, Collated)
    want = [t[:0] for t in default_collate([ds[0]])]
    assert _same(got.batch, want)


def test_a_tensor_dataset_is_fetched_without_one_call_per_example(monkeypatch):
    def per_example(self, i):
        raise AssertionError("dataset[i] called: the batch was not fetched at once")

    ds = _data()
    loader = _loader(ds, poisson=True)
    monkeypatch.setattr(TensorDataset, "__getitem__", per_example)
    assert sum(1 for _ in _drain(loader)) == len(loader)


def _drain(loader):
    for batch in loader:
        loader.cursor.pending = 0
        yield batch


class _Counted(Dataset):
    """A dataset with its own ``__getitems__``; counts its calls."""

    def __init__(self, inner: TensorDataset) -> None:
        self.inner, self.calls, self.items = inner, 0, 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i):
        self.items += 1
        return self.inner[i]

    def __getitems__(self, indices):
        self.calls += 1
        return [self.inner[i] for i in indices]


def test_a_datasets_own_getitems_is_called_once_per_batch():
    ds = _Counted(_data())
    loader = _loader(ds, poisson=False)
    batches = list(_drain(loader))
    assert ds.calls == len(batches) and ds.items == 0


def test_a_custom_collate_gets_the_examples():
    ds = _data()
    seen = []

    def collate(items):
        seen.append(len(items))
        return default_collate(items)

    loader = DataLoader(ds, batch_size=8, collate_fn=collate)
    dp = DPDataLoader(loader, make_sampler(loader, poisson_sampling=False, seed=0))
    for batch in _drain(dp):
        assert _same(batch, _per_item(ds, dp.cursor.indices))
    assert sum(seen) >= len(ds)


def test_workers_and_pinned_memory_give_the_same_batches():
    ds = _data()
    plain = [(b, c) for b, c in _with_indices(_loader(ds, poisson=False))]
    kw = {"num_workers": 2, "pin_memory": torch.cuda.is_available()}
    workers = [(b, c) for b, c in _with_indices(_loader(ds, poisson=False, **kw))]
    assert len(plain) == len(workers)
    for (a, ia), (b, ib) in zip(plain, workers):
        assert torch.equal(ia, ib) and _same(a, [t.cpu() for t in b])
        assert _same(a, _per_item(ds, ia))


def _with_indices(loader):
    for batch in loader:
        yield batch, loader.cursor.indices
        loader.cursor.pending = 0
