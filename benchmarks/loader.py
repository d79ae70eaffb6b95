"""Loader benchmark: host milliseconds per physical batch of Fashion-MNIST images from dpfy's
private loader, fetched per example (``dataset[i]`` for each index, then ``default_collate``:
the path before issue 36) and batched (one index operation per tensor: ``sampling/fetch.py``).

    .venv/bin/python benchmarks/loader.py [--batch 2048] [--rounds 15] [--threads 1]
    .venv/bin/python benchmarks/loader.py --smoke     # synthetic data, tiny: runs (the tests)

Both rows draw the same Poisson batches (q = batch / N, seed 0) from the same 60,000 training
images (``dpfy.data.load_fashion_mnist``, normalized float32 1×28×28, int64 labels) through a
``DPDataLoader`` in this process (``num_workers=0``); the per-example row wraps the dataset in
a pass-through ``Dataset`` that hides its tensors, which is what the loader did for every
dataset before. Rounds alternate the two rows (three timed batches each, after the first);
we report the median wall time per batch, its minimum, and the median process CPU time (less
sensitive to waiting for a core on a shared machine), and check that both rows yield the same
tensors bit for bit. It prints the CPU and torch's threads.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
from _machine import cpu_name

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from dpfy.sampling import DPDataLoader, make_sampler  # noqa: E402


class PerExample(Dataset):
    """The dataset behind a plain ``Dataset`` interface: fetched one example at a time."""

    def __init__(self, inner: Dataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, i: int):
        return self.inner[i]


def batches(ds: Dataset, batch: int, steps: int):
    """The first ``steps`` Poisson batches of a private loader over ``ds`` (seed 0)."""
    loader = DataLoader(ds, batch_size=batch)
    dp = DPDataLoader(loader, make_sampler(loader, poisson_sampling=True, seed=0))
    it = iter(dp)
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        out = next(it)
        yield time.perf_counter() - t0, time.process_time() - c0, out
        dp.cursor.pending = 0  # taken, as optimizer.step() does


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.smoke:
        g = torch.Generator().manual_seed(0)
        ds = TensorDataset(torch.randn(512, 1, 28, 28, generator=g), torch.randint(0, 10, (512,)))
        args.batch, args.rounds, source = 64, 2, "synthetic 512 × 1×28×28"
    else:
        from dpfy.data import load_fashion_mnist

        ds, source = load_fashion_mnist().train, "Fashion-MNIST train (60,000 × 1×28×28)"
    rows = {"per example (before)": PerExample(ds), "batched (sampling/fetch.py)": ds}
    times: dict[str, list[float]] = {k: [] for k in rows}
    cpu: dict[str, list[float]] = {k: [] for k in rows}
    firsts: dict[str, list[torch.Tensor]] = {}
    for r in range(args.rounds):
        for name in list(rows)[:: 1 if r % 2 == 0 else -1]:
            for k, (dt, dc, out) in enumerate(batches(rows[name], args.batch, 4)):
                if k >= 1:  # after the first batch: the iterator is started
                    times[name].append(dt)
                    cpu[name].append(dc)
                    firsts.setdefault(name, out)
    a, b = firsts.values()
    same = all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))
    print(f"loader: {source}, Poisson batches of expected size {args.batch}, num_workers=0")
    print(f"CPU: {cpu_name()}; torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print("| fetch | wall ms per batch (median) | min | CPU ms per batch (median) | batches |")
    print("|---|---:|---:|---:|---:|")
    med = {}
    for name, ts in times.items():
        med[name] = statistics.median(cpu[name]) * 1e3
        print(
            f"| {name} | {statistics.median(ts) * 1e3:.2f} | {min(ts) * 1e3:.2f} | "
            f"{med[name]:.2f} | {len(ts)} |"
        )
    before, after = med.values()
    wall = [statistics.median(ts) for ts in times.values()]
    print(
        f"identical batches: {same}; speed-up {wall[0] / wall[1]:.1f}x wall, "
        f"{before / after:.1f}x CPU time"
    )
    if not same:
        raise SystemExit("the two paths yielded different batches")


if __name__ == "__main__":
    main()
