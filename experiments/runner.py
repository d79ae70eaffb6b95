"""Run a grid of :class:`RunSpec` s, resumably, with progress in a log file.

Results are appended, one JSON object per finished run, to ``results.jsonl``; a spec whose
key is already there is skipped, so an interrupted grid continues where it stopped. Workers
are separate processes with one torch thread each (the machine's cores are shared).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

from dpfy.data import load_dataset
from experiments.dynamic_fmnist.run import train_run
from experiments.dynamic_fmnist.spec import RunSpec

__all__ = ["run_grid", "load_results", "KeyedSpec", "progress_log", "run_pending", "in_workers"]

_DATA = None


def load_results(path: Path) -> list[dict]:
    """All finished runs in a results file (missing file: none)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class KeyedSpec:
    """Mixin for a dataclass of one run's settings: ``to_dict`` and a stable ``key`` (a
    finished run is skipped when a grid resumes)."""

    def key(self) -> str:
        return hashlib.sha1(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


def progress_log(log: Path) -> Callable[[str], None]:
    """A function printing a time-stamped line and appending it to ``log``."""
    def say(msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        with log.open("a") as f:
            f.write(line + "\n")
    return say


def run_pending(specs: Iterable[KeyedSpec], *, results: Path, log: Path, workers: int,
                records: Callable[[list], Iterator[dict | None]],
                describe: Callable[[dict], str]) -> list[dict]:
    """Train every spec whose key is not in ``results`` yet, appending each record as it ends
    (``records(todo)`` yields them, None for a run it did not start); returns all records."""
    results.parent.mkdir(parents=True, exist_ok=True)
    done = {r["key"] for r in load_results(results)}
    todo = [s for s in dict.fromkeys(specs) if s.key() not in done]
    say = progress_log(log)
    say(f"{len(todo)} runs to do ({len(done)} already in {results}), {workers} worker(s)")
    t0 = time.time()
    for i, rec in enumerate(records(todo) if todo else (), 1):
        if rec is None:
            say(f"[{i}/{len(todo)}] a run not started (past its deadline)")
            continue
        with results.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        say(f"[{i}/{len(todo)}] {describe(rec)} ({rec['seconds']:.0f}s; elapsed "
            f"{time.time() - t0:.0f}s)")
    return load_results(results)


def in_workers(todo: list[KeyedSpec], workers: int, init: Callable[..., None],
               work: Callable[[dict], dict | None], initargs: tuple) -> Iterator[dict | None]:
    """Each spec's record as it finishes: in this process (``workers`` = 1) or in forked
    worker processes, each set up once by ``init(*initargs)``."""
    if workers == 1:
        init(*initargs)
        yield from (work(s.to_dict()) for s in todo)
        return
    with mp.get_context("fork").Pool(workers, initializer=init, initargs=initargs) as pool:
        yield from pool.imap_unordered(work, [s.to_dict() for s in todo])


def _init_worker(data_dir: str | None) -> None:
    global _DATA
    torch.set_num_threads(1)
    _DATA = load_dataset("fashion_mnist", data_dir=data_dir)


def _work(spec_dict: dict) -> dict:
    return train_run(RunSpec.from_dict(spec_dict), _DATA)


def run_grid(specs: Iterable[RunSpec], *, results: Path, log: Path, workers: int = 1,
             data_dir: str | None = None) -> list[dict]:
    """Train every spec not yet in ``results``; returns all results (old and new)."""
    results.parent.mkdir(parents=True, exist_ok=True)
    done = {r["key"] for r in load_results(results)}
    todo = [s for s in dict.fromkeys(specs) if s.key() not in done]
    t0 = time.time()

    def say(msg: str) -> None:
        with log.open("a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {msg}\n")

    say(f"{len(todo)} runs to do ({len(done)} already in {results}), {workers} worker(s)")
    ctx = mp.get_context("fork")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(data_dir,)) as pool:
        jobs = pool.imap_unordered(_work, [s.to_dict() for s in todo])
        for i, rec in enumerate(jobs, 1):
            with results.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            sp = rec["spec"]
            say(f"[{i}/{len(todo)}] {sp['experiment']} {sp['schedule']} eps={sp['target_epsilon']}"
                f" seed={sp['seed']}: acc {rec['test_accuracy']:.2f}%  eps_pld "
                f"{rec['epsilon_pld']:.3f}  eps_gdp {rec['epsilon_gdp']:.3f}  "
                f"({rec['seconds']:.0f}s; elapsed {time.time() - t0:.0f}s)")
    say("done")
    return load_results(results)
