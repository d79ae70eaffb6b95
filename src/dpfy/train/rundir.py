"""The output directory of a run, written so that only a finished run looks finished.

A run writes into ``<out>.partial/`` and renames it to ``<out>/`` as its very last action
(``os.rename`` is atomic on one filesystem). A crash, Ctrl-C or ``kill -9`` leaves
``<out>.partial/`` with the last epoch's checkpoint, which ``--resume <out>`` continues;
``<out>/`` itself never holds half a run.

Every file is written by :func:`write_atomic`: to a temporary file in the same directory,
``fsync``-ed, renamed over the target, and the directory ``fsync``-ed, so after a crash (even a
power cut) a file holds its old or its new content, never a mix. A temporary file a crash left
behind (``.<name>.*.tmp``) is removed before the run continues or finishes
(:meth:`RunDir.remove_temporaries`), so none of it can reach a published directory.

While a run is alive it holds an exclusive ``flock`` on its ``.partial`` directory
(:meth:`RunDir.held`; the kernel drops it when the process dies, ``kill -9`` included). A
``.partial`` directory that nobody holds and that has no checkpoint is a start that died
before its first epoch: :meth:`RunDir.create` clears it, so it never blocks a later run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

__all__ = [
    "RunDir",
    "write_atomic",
    "fsync_dir",
    "PARTIAL_SUFFIX",
    "TEMP_SUFFIX",
    "COMPLETE_MARKER",
]

PARTIAL_SUFFIX = ".partial"
TEMP_SUFFIX = ".tmp"
# Written last by a run (atomically): a .partial directory holding it is complete and only
# waits for its rename.
COMPLETE_MARKER = "summary.json"


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (creations, renames, deletions) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | str, *, previous: Path | None = None) -> None:
    """Write ``data`` to ``path``: temporary file, fsync, rename, fsync of the directory.

    ``previous``: where the file ``path`` held until now is kept (renamed, also atomically),
    so a reader that finds ``path`` damaged can fall back to it. Between the two renames only
    ``previous`` exists; a reader must look there when ``path`` is missing.
    """
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        if previous is not None and path.exists():
            os.replace(path, previous)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _final_path(path: Path) -> Path:
    """``runs/x`` for both ``runs/x`` and ``runs/x.partial``."""
    return (
        path.with_name(path.name[: -len(PARTIAL_SUFFIX)])
        if path.name.endswith(PARTIAL_SUFFIX)
        else path
    )


def _held_by_another(directory: Path) -> bool:
    """True when a live process holds :meth:`RunDir.lock` on ``directory``."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's own lock
    return False


@dataclass(frozen=True)
class RunDir:
    """A run's final directory ``final`` and the staging directory it is built in."""

    final: Path

    @property
    def staging(self) -> Path:
        return self.final.with_name(self.final.name + PARTIAL_SUFFIX)

    @property
    def checkpoint(self) -> Path:
        return self.staging / "checkpoint.pt"

    @property
    def previous_checkpoint(self) -> Path:
        """The checkpoint before :attr:`checkpoint`: the fallback when that one is damaged."""
        return self.staging / "checkpoint.prev.pt"

    @property
    def checkpoints(self) -> tuple[Path, Path]:
        """The checkpoints to resume from, newest first (either may be missing)."""
        return self.checkpoint, self.previous_checkpoint

    def has_checkpoint(self) -> bool:
        return any(p.is_file() for p in self.checkpoints)

    def is_complete(self) -> bool:
        """True when the staging directory holds a finished run not yet renamed."""
        return (self.staging / COMPLETE_MARKER).is_file()

    @classmethod
    def of(cls, path: str | Path) -> "RunDir":
        """The run at ``path``, given by its final name or its ``.partial`` directory."""
        return cls(_final_path(Path(path)))

    def _refuse_if_running(self) -> None:
        if _held_by_another(self.staging):
            raise ValueError(
                f"out must not be in use, got '{self.staging}', which another "
                f"dpfy train is writing now. Wait for it to finish, or choose "
                f"another --out"
            )

    @classmethod
    def create(cls, out: str | Path) -> "RunDir":
        """Start a new run in ``out``; refuses to overwrite a finished or an interrupted run.

        A ``.partial`` directory with no checkpoint, which no live run holds, is a start that
        died before its first epoch (nothing to continue): it is removed and the run starts.
        """
        run = cls(_final_path(Path(out)))
        if run.final.exists():
            raise ValueError(
                f"out must be a new directory, got out = '{run.final}', which "
                f"exists. Choose another --out, or delete it"
            )
        if run.staging.exists():
            run._refuse_if_running()
            if run.has_checkpoint() or run.is_complete():
                raise ValueError(
                    f"out must not have an interrupted run, got '{run.staging}' "
                    f"from an earlier run. Continue it with --resume "
                    f"{run.final}, or delete that directory"
                )
            shutil.rmtree(run.staging)
        try:
            run.staging.mkdir(parents=True)
            probe = run.staging / ".write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise ValueError(
                f"out must be a writable directory, got out = '{run.final}' "
                f"({e.strerror}). Choose a directory you can write to"
            ) from None
        return run

    @classmethod
    def for_resume(cls, path: str | Path) -> "RunDir":
        """The interrupted run at ``path`` (its final name or its ``.partial`` directory)."""
        run = cls(_final_path(Path(path)))
        if run.staging.is_dir():
            run._refuse_if_running()
        if not run.has_checkpoint() and not run.is_complete():
            done = run.final.is_dir() and not run.staging.exists()
            hint = (
                "that run finished; start a new run with --out"
                if done
                else "no epoch finished yet, so there is nothing to continue; start again "
                "with --out"
            )
            raise ValueError(
                f"resume must name an interrupted run with a checkpoint, got "
                f"resume = '{path}' ({hint})"
            )
        if run.final.exists():
            raise ValueError(
                f"resume target must not exist yet, got '{run.final}' next to "
                f"'{run.staging}'. Move one of them away"
            )
        return run

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold an exclusive lock on the staging directory while the block runs.

        The kernel releases it when the process dies (``kill -9`` included), so a lock nobody
        holds marks a dead run. Raises ``ValueError`` when another live run holds it.
        """
        fd = os.open(self.staging, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._refuse_if_running()
                raise
            yield
        finally:
            os.close(fd)

    def remove_temporaries(self) -> None:
        """Delete temporary files a killed write left in the staging directory."""
        for tmp in self.staging.glob(f".*{TEMP_SUFFIX}"):
            tmp.unlink(missing_ok=True)

    def remove_checkpoints(self) -> None:
        """Delete the (secret) checkpoints: a finished run needs no resume state."""
        for p in self.checkpoints:
            p.unlink(missing_ok=True)

    def finalize(self) -> Path:
        """Drop checkpoints and temporaries, then rename the staging directory to the final
        name: the run now looks complete."""
        self.remove_checkpoints()
        self.remove_temporaries()
        fsync_dir(self.staging)
        os.rename(self.staging, self.final)
        fsync_dir(self.final.parent)
        return self.final
