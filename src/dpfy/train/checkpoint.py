"""Checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint holds the resolved config, the number of finished epochs, the model, the private
optimizer's state (which the engine defines to include the ledger, the sampler's and the
noise's RNG state and any schedule state), the metrics so far and torch's global RNG state.
It is secret and never published: a seeded run's checkpoint holds the seed and generator
states; a secure run's holds no noise key (a resumed secure run is re-keyed from the OS).

It is written once per epoch, which is always a logical-batch boundary (the optimizer refuses
to serialize the un-noised sums of a logical batch in progress), with
:func:`~dpfy.train.rundir.write_atomic`: temporary file, fsync, rename. The checkpoint it
replaces is kept as ``checkpoint.prev.pt``. The file starts with a header line holding the
SHA-256 of the rest, so a truncated or damaged file is detected on load (a torch zip can load
without error from damaged bytes) and :func:`load_latest` falls back to the previous one.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from dpfy.train.rundir import RunDir, write_atomic

__all__ = ["Checkpoint", "DamagedCheckpoint", "FORMAT", "load_latest"]

FORMAT = "dpfy-train-checkpoint/1"
_HEADER = b"dpfy-train-checkpoint sha256="  # + 64 hex digits + b"\n", then torch bytes


class DamagedCheckpoint(ValueError):
    """A checkpoint file that cannot be read back; ``reason`` says why in a few words."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"checkpoint must be readable, got '{path}' ({reason}). The file is "
            f"damaged and no earlier checkpoint is usable; start a new run with "
            f"--out"
        )
        self.path, self.reason = path, reason


@dataclass(frozen=True)
class Checkpoint:
    """The state at the end of epoch ``epoch`` (1-based count of finished epochs)."""

    config: dict[str, Any]
    notes: dict[str, Any]  # e.g. how δ was chosen, for the report
    epoch: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    metrics: list[dict[str, Any]]
    torch_rng: torch.Tensor
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the parameter average's state

    def to_bytes(self) -> bytes:
        """The file's content: the checksum header line, then the torch-serialized state."""
        buf = io.BytesIO()
        torch.save({"format": FORMAT, **self.__dict__}, buf)
        body = buf.getvalue()
        return _HEADER + hashlib.sha256(body).hexdigest().encode() + b"\n" + body

    def save(self, path: Path, *, previous: Path | None = None) -> None:
        """Write atomically; the checkpoint ``path`` held so far moves to ``previous``."""
        write_atomic(path, self.to_bytes(), previous=previous)

    @classmethod
    def load(cls, path: Path) -> "Checkpoint":
        """Read and verify ``path``; a damaged file raises a one-line ``ValueError``."""
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise DamagedCheckpoint(path, e.strerror or type(e).__name__) from None
        if raw.startswith(_HEADER):
            head, _, body = raw.partition(b"\n")
            if hashlib.sha256(body).hexdigest().encode() != head[len(_HEADER) :]:
                raise DamagedCheckpoint(
                    path, f"its checksum does not match: truncated or changed, {len(raw)} bytes"
                )
        else:
            body = raw  # written before the header existed: torch's own checks only
        try:
            # weights_only=False: the engine's state holds ledger records and RNG states; the
            # file is one this user's own earlier run wrote (and its checksum matched).
            state = torch.load(io.BytesIO(body), map_location="cpu", weights_only=False)
        except Exception as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise DamagedCheckpoint(path, why) from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(
                f"checkpoint must have format '{FORMAT}', got '{path}' without it. "
                f"Point --resume at a directory written by dpfy train"
            )
        state.pop("format")
        try:
            return cls(**state)
        except TypeError as e:
            raise DamagedCheckpoint(path, f"wrong fields: {e}") from None


def load_latest(run: RunDir, warn: Callable[[str], None]) -> Checkpoint:
    """The newest readable checkpoint of ``run``: ``checkpoint.pt``, else ``checkpoint.prev.pt``.

    A damaged newest checkpoint is reported through ``warn`` (one line) when the previous one
    is usable; when none is, the newest one's error is raised.
    """
    damaged: DamagedCheckpoint | None = None
    for path in run.checkpoints:
        if not path.is_file():
            continue
        try:
            ckpt = Checkpoint.load(path)
        except DamagedCheckpoint as e:
            damaged = damaged or e
            continue
        if damaged is not None:
            warn(
                f"dpfy train: warning: {damaged.path.name} is damaged ({damaged.reason}); "
                f"resuming from {path.name}, after epoch {ckpt.epoch}, which is trained "
                f"again."
            )
        return ckpt
    if damaged is not None:
        raise damaged
    raise ValueError(
        f"resume must name an interrupted run with a checkpoint, got "
        f"'{run.staging}' without one. Start again with --out"
    )
