"""Data-parallel private training over ``torch.distributed``: one global step from W ranks.

A logical batch of the global run is spread over the W ranks of the default process group
(gloo on CPU, NCCL on GPUs: :func:`default_backend` picks it). Step t, on every rank r:

1. sampling: rank r draws the Poisson mask u_i < q over all N examples and keeps the examples it
   owns, i ≡ r (mod W) (:class:`dpfy.sampling.PoissonSampler` with ``shard=(r, W)``). Example
   i's inclusion is decided by one uniform on one rank, independently of every other example,
   so the union of the W parts is exactly a Poisson(q) sample of the N examples, whether the
   ranks share a seed or not. With ``seed=`` every rank draws the same mask, the mask a
   single-process run with that seed draws (so a run is reproducible across W); with
   ``seed=None`` each rank draws its own from the OS CSPRNG (nothing secret is shared);
2. clipping: rank r forms its clipped sum S_r = Σ_{i ∈ part r} w_i g_i (the usual engine);
3. release: rank 0 adds the Gaussian noise z ~ N(0, (σΔ)² I) to its own S_0, every rank
   divides by the public b = qN, and one all-reduce (sum) over the ranks gives every rank
   (Σ_r S_r + z)/b, the single-process release of the global batch. Extra releases of a method
   (noisy counts, parameter-shaped sums) go the same way in the same all-reduce call.

Why the noise is drawn once, by rank 0, rather than split into W shares of std σΔ/√W: the
released sum has exactly the law the ledger assumes with one draw, the draw is the same stream
a single-process run with the same seed uses (tests compare the two), and no rank's share could
be lost or doubled by a rank that restarts. The ranks are one trust domain: during the
all-reduce they see each other's un-noised partial sums (as in every data-parallel DP-SGD).

What each rank records: the ledger gets one step per global update, with the global q; every
rank writes the same ledger (the plan comes from public and released values only, and the
released values are all-reduced, so method states agree too). ``make_private`` checks at the
start that all ranks agree on the run's facts (N, q, σ, C, method, accountant) and broadcasts
rank 0's parameters and buffers, so the replicas start and stay bit-identical.

DistributedDataParallel: a model wrapped in ``DistributedDataParallel`` before
``make_private`` is handled: dpfy attaches its engine to ``model.module`` and turns DDP's own
gradient synchronization off (``require_backward_grad_sync = False``, what ``no_sync()`` does):
DDP would average un-clipped gradients, and dpfy's all-reduce of the clipped sums replaces it.
The forward still goes through DDP (buffer broadcast included). Wrapping *after*
``make_private`` is not needed and fails in torch (the private model's parameters have
``requires_grad=False``): with an initialized process group, ``make_private`` is already
data-parallel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dpfy.errors import PrivacyRefusal

__all__ = [
    "Collective",
    "current_collective",
    "unwrap_model",
    "NoNoise",
    "global_batch_notice",
    "default_backend",
    "collective_device",
]


def default_backend() -> str:
    """The process-group backend for a run on this machine: ``"nccl"`` where CUDA is
    available (GPU tensors, GPU-to-GPU reductions), ``"gloo"`` otherwise. Pass it to
    ``torch.distributed.init_process_group``."""
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def collective_device() -> torch.device | None:
    """Where the default process group's collectives need their tensors: this rank's current
    CUDA device under NCCL (which reduces GPU tensors only), None (anywhere) under gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return None


class NoNoise:
    """The noise source of ranks other than 0: divides by the normalizer, adds nothing.

    Rank 0 draws the step's one Gaussian; the all-reduce that follows adds it to every rank's
    result exactly once.
    """

    reproducible = False

    def noisy_mean(self, total: torch.Tensor, std: float, normalizer: float) -> torch.Tensor:
        return total.div_(normalizer)

    def add_gaussian_(self, t: torch.Tensor, std: float) -> torch.Tensor:
        return t


@dataclass(frozen=True)
class Collective:
    """The ranks of the default process group, as the private step uses them.

    Attributes:
      rank: this process's rank r.
      world_size: W ≥ 2.
    """

    rank: int
    world_size: int

    @property
    def shard(self) -> tuple[int, int]:
        """(r, W): this rank keeps the examples i with i mod W = r."""
        return self.rank, self.world_size

    def noise_source(self, noise: Any) -> Any:
        """The noise this rank adds: the real source on rank 0, :class:`NoNoise` elsewhere."""
        return noise if self.rank == 0 else NoNoise()

    def sum_(self, tensors: Iterable[torch.Tensor]) -> None:
        """All-reduce (sum) ``tensors`` in place, one collective call per dtype.

        The tensors are flattened into one buffer per dtype, so a step costs one all-reduce
        whatever the number of parameters. Every rank ends with the same bytes. Under NCCL the
        buffer is on this rank's GPU (a method's scalar releases, kept on the CPU, are copied
        there and back: a few numbers).
        """
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        device = collective_device()
        for dtype in sorted(by_dtype, key=str):  # the same call order on every rank
            ts = by_dtype[dtype]
            flat = torch.cat([t.reshape(-1).to(device or t.device) for t in ts])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for t in ts:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()

    def agree(self, facts: dict[str, Any]) -> None:
        """Refuse unless every rank passed the same run ``facts`` (a public summary).

        A rank with another σ, q or dataset would release under a different plan than the
        ledger every rank writes.
        """
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, facts)
        for r, other in enumerate(gathered):
            diff = sorted(k for k in facts if other.get(k) != facts[k])
            if diff:
                raise PrivacyRefusal(
                    f"make_private's arguments must be the same on every rank, got "
                    f"{ {k: facts[k] for k in diff} } on rank {self.rank} and "
                    f"{ {k: other.get(k) for k in diff} } on rank {r}. Every rank writes the "
                    f"same ledger: pass the same dataset, batch size, noise and clipping "
                    f"everywhere"
                )

    def broadcast_module(self, module: nn.Module) -> None:
        """Give every rank rank 0's parameters and buffers (the replicas start identical)."""
        device = collective_device()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                if device is None or t.device == device:
                    dist.broadcast(t.data, src=0)
                else:  # NCCL: through this rank's GPU
                    moved = t.data.to(device)
                    dist.broadcast(moved, src=0)
                    t.data.copy_(moved)


def current_collective() -> Collective | None:
    """The default process group as a :class:`Collective`, or None (one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size()
    return Collective(rank=dist.get_rank(), world_size=world) if world > 1 else None


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module dpfy's engine attaches to: ``model.module`` for a DDP model, else ``model``.

    For a ``DistributedDataParallel`` model, DDP's gradient synchronization is switched off
    for good (dpfy all-reduces the clipped sums instead; DDP would average raw gradients).
    """
    if not isinstance(model, DistributedDataParallel):
        return model
    model.require_backward_grad_sync = False  # what no_sync() sets; never turned back on
    return model.module


def global_batch_notice(
    world_size: int, per_rank: int, dataset_size: int, sample_rate: float
) -> str:
    """What a data-parallel run samples, said before training (rank 0 warns it).

    ``batch_size`` is per rank, as with DDP; Opacus's DPDDP reads it as the global batch. The
    same number therefore gives a W times larger q here, and a larger ε: the notice says the
    global expected batch and q, so that a port from Opacus cannot miss it.
    """
    return (
        f"data-parallel over {world_size} ranks: loader.batch_size = {per_rank} is per "
        f"rank (as with DDP; Opacus's DPDDP takes the global batch), so the global expected "
        f"batch is {world_size} × {per_rank} = {world_size * per_rank} of "
        f"{dataset_size} examples, q = {sample_rate:.6g}, and ε is accounted at that q. "
        f"For Opacus's global batch B, pass batch_size = B / {world_size}"
    )
