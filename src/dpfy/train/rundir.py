"""The output directory of a run, written so that only a finished run looks finished.

A run writes into ``<out>.partial/`` and renames it to ``<out>/`` as its very last action
(``os.rename`` is atomic on one filesystem). A crash or Ctrl-C leaves ``<out>.partial/`` with
the last epoch's checkpoint, which ``--resume <out>`` continues; ``<out>/`` itself never holds
half a run. Single files (checkpoints, metrics) are replaced atomically too.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunDir", "write_atomic", "PARTIAL_SUFFIX"]

PARTIAL_SUFFIX = ".partial"


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same directory and a rename."""
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _final_path(path: Path) -> Path:
    """``runs/x`` for both ``runs/x`` and ``runs/x.partial``."""
    return path.with_name(path.name[:-len(PARTIAL_SUFFIX)]) \
        if path.name.endswith(PARTIAL_SUFFIX) else path


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

    @classmethod
    def of(cls, path: str | Path) -> "RunDir":
        """The run at ``path``, given by its final name or its ``.partial`` directory."""
        return cls(_final_path(Path(path)))

    @classmethod
    def create(cls, out: str | Path) -> "RunDir":
        """Start a new run in ``out``; refuses to overwrite a finished or an interrupted run."""
        run = cls(_final_path(Path(out)))
        if run.final.exists():
            raise ValueError(f"out must be a new directory, got out = '{run.final}', which "
                             f"exists. Choose another --out, or delete it")
        if run.staging.exists():
            raise ValueError(f"out must not have an interrupted run, got '{run.staging}' from "
                             f"an earlier run. Continue it with --resume {run.final}, or "
                             f"delete that directory")
        try:
            run.staging.mkdir(parents=True)
            probe = run.staging / ".write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise ValueError(f"out must be a writable directory, got out = '{run.final}' "
                             f"({e.strerror}). Choose a directory you can write to") from None
        return run

    @classmethod
    def for_resume(cls, path: str | Path) -> "RunDir":
        """The interrupted run at ``path`` (its final name or its ``.partial`` directory)."""
        run = cls(_final_path(Path(path)))
        if not run.checkpoint.is_file():
            done = run.final.is_dir() and not run.staging.exists()
            hint = ("that run finished; start a new run with --out" if done else
                    "no epoch finished yet, so there is nothing to continue; start again "
                    "with --out")
            raise ValueError(f"resume must name an interrupted run with a checkpoint, got "
                             f"resume = '{path}' ({hint})")
        if run.final.exists():
            raise ValueError(f"resume target must not exist yet, got '{run.final}' next to "
                             f"'{run.staging}'. Move one of them away")
        return run

    def finalize(self) -> Path:
        """Rename the staging directory to the final name: the run now looks complete."""
        os.rename(self.staging, self.final)
        return self.final
