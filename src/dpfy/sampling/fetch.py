"""Batched fetch: one dataset call per physical batch instead of one per example.

torch's ``DataLoader`` with a ``batch_sampler`` asks ``dataset[i]`` for each of the B indices
and stacks the B examples in ``collate_fn``: for a batch of 2,048 Fashion-MNIST images that is
2,048 Python calls and 4,096 tensor selections, tens of milliseconds on the host, against a
private step of a few milliseconds on a GPU (issue 36). The private loader hands its inner
``DataLoader`` a :class:`BatchedDataset` instead, whose ``__getitems__`` (which torch's fetcher
calls with the whole index list when a dataset has one) fetches the batch at once:

- a tensor-backed dataset (``TensorDataset``, and a ``Subset`` of one, as dpfy's Fashion-MNIST
  and scikit-learn splits are) with torch's ``default_collate``: one ``index_select`` per
  tensor, in shared memory inside a worker as ``default_collate`` allocates there. The result
  is the collated batch itself, bit for bit what ``default_collate`` makes of the B examples
  (a list of tensors with the batch in dimension 0, the dtypes and shapes unchanged;
  ``tests/sampling/test_batched_fetch.py``), so the collate step passes it through;
- any other dataset with its own ``__getitems__``: that, once per batch (its result goes to
  the user's ``collate_fn``, as torch does);
- otherwise ``dataset[i]`` per index, as before.

The indices are the sampler's, so what is fetched, and so the privacy accounting, does not
change; only how. Workers and pinned memory work as before: the wrapper is what each worker
process indexes, and the pinning thread pins the collated batch. A dataset whose tensors live on
a CUDA device (``dpfy train`` holds a dataset that fits there) is indexed there: the index
moves to the device, the batch never crosses the bus.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import torch
from torch.utils.data import Dataset, Subset, TensorDataset, default_collate, get_worker_info

__all__ = ["BatchedDataset", "Collated", "tensor_columns", "select_rows"]


class Collated(NamedTuple):
    """A batch already collated by :meth:`BatchedDataset.__getitems__`: the collate step
    returns ``batch`` as it is."""

    batch: list[torch.Tensor]


def tensor_columns(dataset: Any) -> tuple[Sequence[torch.Tensor], torch.Tensor | None] | None:
    """The tensors a dataset's examples are rows of, and the map from its indices to their
    rows (None: the identity), for a ``TensorDataset`` or a ``Subset`` of one (nested);
    None for any other dataset."""
    if type(dataset) is TensorDataset:  # exact: a subclass may override __getitem__
        return dataset.tensors, None
    if type(dataset) is Subset:
        inner = tensor_columns(dataset.dataset)
        if inner is None:
            return None
        tensors, rows = inner
        mine = torch.as_tensor(list(dataset.indices), dtype=torch.long)
        return tensors, mine if rows is None else rows[mine]
    return None


def select_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[index]`` along dimension 0; inside a worker into shared memory (as
    ``default_collate`` does, so the batch crosses to the main process without a copy)."""
    index = index.to(t.device)
    if get_worker_info() is None or t.device.type != "cpu":
        return t.index_select(0, index)
    shape = (index.numel(), *t.shape[1:])
    out = torch.empty(shape, dtype=t.dtype).share_memory_()
    return torch.index_select(t, 0, index, out=out)


class BatchedDataset(Dataset):
    """The private loader's view of the user's dataset: ``__getitems__`` fetches a whole
    physical batch at once (module docstring); ``__getitem__`` and ``len`` are the dataset's.

    ``collate_fn`` is the user's: the one-index-operation path is taken only with torch's
    ``default_collate``, the only collate whose result it reproduces.
    """

    def __init__(self, dataset: Any, collate_fn: Any) -> None:
        self.dataset = dataset
        self.columns = tensor_columns(dataset) if collate_fn is default_collate else None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> Any:
        if self.columns is not None:
            tensors, rows = self.columns
            index = torch.as_tensor(indices, dtype=torch.long)
            if rows is not None:
                index = rows[index]
            return Collated([select_rows(t, index) for t in tensors])
        own = getattr(self.dataset, "__getitems__", None)
        if callable(own):
            return own(indices)
        return [self.dataset[i] for i in indices]
