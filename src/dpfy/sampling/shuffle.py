"""Shuffled fixed-size batches, accounted without amplification (``Sampling.SHUFFLE``)."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from dpfy._require import require
from dpfy.privacy import Sampling
from dpfy.sampling.units import UnitSampler
from dpfy.sampling.draws import permutation, restore_generator, seeded_generator

__all__ = ["ShuffleSampler"]


class ShuffleSampler(UnitSampler):
    """dpfy's permutation sampler for shuffled fixed-size batches (recorded as SHUFFLE).

    Each pass draws a permutation π of the N indices and cuts it into batches of b:
    π[0:b], π[b:2b], ...; the last batch has N mod b examples when b does not divide N, or is
    dropped with ``drop_last=True`` (its examples sit that pass out). A pass therefore has
    P = ⌈N/b⌉ (or ⌊N/b⌋) logical batches, and ``len(loader)`` = P.

    The position in the pass (``offset``, examples of π already taken) moves only when
    ``optimizer.step()`` takes a yielded batch (:meth:`commit`, called through the loader's
    :class:`BatchCursor`). Iterating the loader again mid-pass continues at that position: a
    batch that was yielded but never stepped is yielded again, a batch that was stepped never
    is, and batches that DataLoader workers prefetched but did not hand out are simply drawn
    from the same π again. ``state_dict`` holds π, the position and the generator, so a resumed
    run continues the same pass exactly.

    Why the ledger's SHUFFLE charge bounds this sampler (``privacy.canonical
    .shuffle_participations``): the ledger charges an example ⌈c/L⌉ participations over c
    steps, L = ⌊N/b⌋ (its ⌊1/q⌋ with q = b/N). The batches the optimizer takes are, in order,
    the batches of pass 1, then of pass 2, ..., each pass P ≥ L batches long, whatever the
    restarts, and an example is in at most one batch of a pass. c steps starting at step 0 (a
    pass boundary) lie in at most ⌈c/P⌉ ≤ ⌈c/L⌉ passes, so no example takes part more often
    than charged. A partial last batch only lengthens a pass (P = ⌈N/b⌉ ≥ L); ``drop_last``
    gives P = ⌊N/b⌋ = L. Normalizer: b, also for the partial batch (public; its update is just
    smaller). One caveat: a batch that ``optimizer.step()`` took but refused to release (it
    raised) is consumed without a ledger step; after such an error, start a new run.

    Args:
      dataset_size: N.
      batch_size: b in [1, N].
      seed: None draws each permutation from the OS CSPRNG; an int seeds a torch generator.
      drop_last: drop the partial last batch of each pass.
    """

    sampling = Sampling.SHUFFLE
    resumed = ("permutation", "offset", "passes")

    def __init__(
        self,
        dataset_size: int,
        batch_size: int,
        *,
        seed: int | None = None,
        drop_last: bool = False,
    ) -> None:
        require(dataset_size >= 1, "dataset_size", dataset_size, ">= 1")
        require(
            1 <= batch_size <= dataset_size,
            "batch_size",
            batch_size,
            f"in [1, {dataset_size}]",
            "Use a batch size no larger than the dataset",
        )
        self.dataset_size, self.batch_size, self.drop_last = dataset_size, batch_size, drop_last
        self.generator = seeded_generator(seed)
        self.permutation: torch.Tensor | None = None  # (N,) π of the current pass; secret
        self.offset = 0  # examples of π taken by optimizer steps
        self.passes = 0  # permutations drawn so far

    @property
    def sample_rate(self) -> float:
        return self.batch_size / self.dataset_size

    @property
    def normalizer(self) -> float:
        return float(self.batch_size)

    @property
    def pass_length(self) -> int:
        """Examples of π used per pass: N, or ⌊N/b⌋·b with ``drop_last``."""
        n, b = self.dataset_size, self.batch_size
        return n - n % b if self.drop_last else n

    @property
    def steps_per_epoch(self) -> int:
        """Logical batches per pass: ⌈N/b⌉, or ⌊N/b⌋ with ``drop_last``."""
        return -(-self.pass_length // self.batch_size)

    @property
    def batch_in_pass(self) -> int:
        """The index, within its pass, of the logical batch being taken (0-based)."""
        return min(self.offset, self.pass_length - 1) // self.batch_size

    def at_batch_start(self) -> bool:
        """The next example taken starts a logical batch (not mid-way through one)."""
        return self.offset % self.batch_size == 0 or self.offset >= self.pass_length

    def _start_pass_if_done(self) -> None:
        if self.permutation is not None and self.offset < self.pass_length:
            return
        self.permutation = permutation(self.dataset_size, self.generator)
        self.offset = 0
        self.passes += 1

    def chunks(self, physical: int | None) -> Iterator[tuple[torch.Tensor, bool, int]]:
        """The rest of the pass from the current position, without moving it.

        Yields ``(indices, ends_logical_batch, end_offset)`` per physical batch of at most
        ``physical`` rows (a whole logical batch if None); :meth:`commit` moves the position.
        """
        self._start_pass_if_done()
        perm, b, m = self.permutation, self.batch_size, self.pass_length
        assert perm is not None, "_start_pass_if_done drew the pass's permutation"
        pos, size = self.offset, physical or self.batch_size
        while pos < m:
            batch_end = min((pos // b + 1) * b, m)
            end = min(pos + size, batch_end)
            yield perm[pos:end], end == batch_end, end
            pos = end

    def commit(self, end_offset: int) -> None:
        """An optimizer step took the examples of π up to ``end_offset``."""
        require(
            self.offset <= end_offset <= self.pass_length,
            "end_offset",
            end_offset,
            f"in [{self.offset}, {self.pass_length}]",
            "Only the private loader commits the positions it yielded",
        )
        self.offset = end_offset

    def load_state_dict(self, state: dict[str, Any]) -> None:
        require(
            "offset" in state,
            "the sampler checkpoint",
            sorted(state),
            "from dpfy's own ShuffleSampler (permutation, offset)",
            "Checkpoints written before dpfy owned the shuffled sampler cannot resume a "
            "pass; start a new run",
        )
        perm, offset = state["permutation"], int(state["offset"])
        require(
            perm is None or tuple(perm.shape) == (self.dataset_size,),
            "the checkpoint's permutation",
            None if perm is None else tuple(perm.shape),
            f"of this dataset's size ({self.dataset_size},)",
            "Resume with the dataset the checkpoint was written for",
        )
        require(
            0 <= offset <= self.pass_length,
            "the checkpoint's offset",
            offset,
            f"in [0, {self.pass_length}]",
            "Resume with the same batch size and drop_last",
        )
        restore_generator(self.generator, state["generator"])
        self.permutation, self.offset = perm, offset
        self.passes = int(state["passes"])
