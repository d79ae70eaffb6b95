"""Step glue: aten ops dispatched and host reads per training step, on the CPU.

    PYTHONPATH=src .venv/bin/python benchmarks/step_ops.py [--models bert,cnn] [--steps 3]
    PYTHONPATH=src .venv/bin/python benchmarks/step_ops.py --smoke   # 1-layer BERT, batch 4

What it counts: every aten op that reaches the dispatcher (a ``TorchDispatchMode``; an op a
kernel calls internally is not seen, as a fused kernel's work is one launch), and every host
read: ``aten::_local_scalar_dense`` (``.item()``, ``float(t)``, ``bool(t)``, ``is_nonzero``),
``aten::equal`` (``torch.equal``: a Python bool, computed on the device and read back on CUDA)
plus ``Tensor.tolist()`` (which reads memory without dispatching on the CPU). On a GPU each
dispatched op is about one kernel launch and each host read a device synchronization, so the
counts say how launch-bound a step is without a GPU.

dpfy's device code path is forced (``force_device_path``): what the step does differently on
CUDA is (1) noise drawn by the torch generator on the tensor's device
(``NoiseSource._on_device``) instead of the compiled host sampler, with the device generators'
batch of blocks per call at its accelerator size (``device_gaussian._blocks_per_call``: 8192,
not the CPU's 64), (2) the Linear rule's ghost norm by torch ops instead of the compiled CPU
kernel (``fused_ghost_available``), (3) no embedding-rule shortcut that reads the ids on the
host and (4) the model-state guard's value comparisons left on the device for the step's read
(``dpfy._deferred.FORCE_ON_CPU``; before it, a ``torch.equal`` each). All are set to their CUDA
choice for the dpfy rows (``dpfy.grads.rules.base.FORCE_DEVICE_PATH`` for (2) and (3); at
4ffc2ac, which lacks it, (2) is patched directly).

Rows: non-private (SGD with ``foreach=True``, torch's default on CUDA; every row uses it); dpfy
``seed=0`` (reproducible noise) and ``seed=None`` (secure ChaCha20 noise, the default), both
with today's device generators; ``dpfy fused-noise stand-in``: dpfy with each device draw
counted as the two ops a fused noise kernel launches (an allocation and one fill; the values are
torch's, so only its counts mean anything): the step's glue without the generator's own ops;
Opacus 1.6 ``hooks``. All rows: same model weights, batch, σ = 1, C = 1, SGD lr 0.01. Models:
``BertForSequenceClassification`` from a config (4 layers, hidden 256, 4 heads, intermediate
1024, vocabulary 8192, batch 8 × 32 tokens, dropout 0 so every row sees the same forward;
nothing downloaded) and Tramèr & Boneh's tanh CNN (batch 64, 1×28×28). Counts are from the last
of ``--steps`` steps (steady state: the first dpfy step checks the loss contract and builds its
caches).

Columns: ops and host reads in ``optimizer.step()`` alone, and in the whole training step
(zero_grad + forward + loss + backward + step); "launching ops" leaves out the ops that launch
no kernel on a GPU (views, ``detach``, allocations, profiler marks, the host reads
themselves). dpfy's backward does not form the parameter gradients (its step forms the clipped
sums instead), so the whole step is the fair comparison. The last two lines: the largest
whole-step ratio of launching ops over the dpfy rows and models, then
``OPS dpfy/non-private worst R``, the same for all aten ops.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import dpfy  # noqa: E402
from dpfy.models import build_model  # noqa: E402

try:  # the guard's one-launch fingerprints (absent in trees before them: A/B runs)
    from dpfy.buffers import prints as one_launch_prints_module
    from dpfy.native.word_sums import WordSums
except ImportError:
    one_launch_prints_module = WordSums = None  # type: ignore[assignment]
from _smoke import HELP, require, size  # noqa: E402
from _machine import cpu_name

SIGMA, CLIP, LR = 1.0, 1.0, 0.01
# ops that read a device value on the host (on a GPU: wait for the device). ``equal`` returns a
# Python bool (CUDA computes it on the device and reads it back); ``is_nonzero``, ``item`` and
# ``allclose`` reach the dispatcher only when not decomposed into ``_local_scalar_dense``
HOST_READS = {"_local_scalar_dense", "equal", "is_nonzero", "item", "allclose"}


# ops that launch no kernel on a GPU: views, aliases, allocations, profiler marks
NO_LAUNCH = {
    "detach",
    "alias",
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "_record_function_enter_new",
    "_record_function_exit",
    "lift_fresh",
}


class OpCounter(TorchDispatchMode):
    """Counts dispatched aten ops (by name), those that launch a kernel, and host reads."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.reads = 0
        self.launching = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        if name in HOST_READS:
            self.reads += 1
        if not (func.is_view or name in NO_LAUNCH or name in HOST_READS):
            self.launching += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def counting() -> Iterator[OpCounter]:
    """An :class:`OpCounter` that also counts ``Tensor.tolist`` (no dispatch on the CPU)."""
    counter = OpCounter()
    tolist = torch.Tensor.tolist
    launch = WordSums.__call__ if WordSums is not None else None

    def counted_tolist(self: torch.Tensor) -> Any:
        counter.reads += 1
        counter.ops["tolist"] += 1
        return tolist(self)

    def counted_launch(self: Any) -> torch.Tensor:
        """On a GPU: the output's allocation and one kernel. Triton's interpreter copies the
        arguments to and from the host in aten ops of its own; they are not counted."""
        counter.ops["empty"] += 1
        counter.ops["triton chunk_word_sums"] += 1
        counter.launching += 1
        with _disable_current_modes():
            return launch(self)

    torch.Tensor.tolist = counted_tolist  # type: ignore[method-assign]
    if WordSums is not None:
        WordSums.__call__ = counted_launch  # type: ignore[method-assign]
    try:
        with counter:
            yield counter
    finally:
        torch.Tensor.tolist = tolist  # type: ignore[method-assign]
        if WordSums is not None:
            WordSums.__call__ = launch  # type: ignore[method-assign]


class FusedStandIn:
    """What a fused noise kernel launches per draw: one allocation and one fill."""

    def normal(self, n: int) -> torch.Tensor:
        return torch.empty(n).normal_()


@contextmanager
def force_device_path(fused_noise: bool = False) -> Iterator[None]:
    """Make dpfy take its CUDA code path on the CPU (see the module docstring); with
    ``fused_noise`` the device generator is replaced by :class:`FusedStandIn` (its counts only)."""
    from dpfy.grads.rules import base, linear
    from dpfy.noise import device_gaussian
    from dpfy.noise.generator import NoiseSource

    forced = getattr(base, "FORCE_DEVICE_PATH", None)  # absent before the glue cut
    base.FORCE_DEVICE_PATH = True  # type: ignore[attr-defined]
    try:
        from dpfy import _deferred
    except ImportError:  # before the guard's comparisons were deferred
        _deferred = None  # type: ignore[assignment]
    if _deferred is not None:
        _deferred.FORCE_ON_CPU = True
    saved = (NoiseSource._on_device, NoiseSource._device_stream, linear.fused_ghost_available)
    blocks = device_gaussian._blocks_per_call
    device_gaussian._blocks_per_call = lambda device: 8192  # the accelerator's batch of blocks
    NoiseSource._on_device = lambda self, device: True  # type: ignore[method-assign]
    if fused_noise:  # one stand-in stream, as a source keeps one generator per device
        stand_in = FusedStandIn()
        NoiseSource._device_stream = lambda self, device: stand_in  # type: ignore
    linear.fused_ghost_available = lambda a, g: False  # type: ignore[assignment]
    try:
        with one_launch_prints():
            yield
    finally:
        base.FORCE_DEVICE_PATH = forced  # type: ignore[attr-defined]
        if _deferred is not None:
            _deferred.FORCE_ON_CPU = False
        device_gaussian._blocks_per_call = blocks
        (NoiseSource._on_device, NoiseSource._device_stream, linear.fused_ghost_available) = saved  # type: ignore[assignment]


@contextmanager
def one_launch_prints() -> Iterator[None]:
    """Fingerprint the parameters as on a GPU with Triton: all in one launch
    (``dpfy.buffers.prints``, run by Triton's interpreter here; the device noise rows keep the
    torch generator). Nothing in trees before the one-launch fingerprints."""
    if one_launch_prints_module is None:
        yield
        return
    from dpfy.noise import generator

    kept = (
        one_launch_prints_module.FORCE_ONE_LAUNCH,
        generator.triton_available,
        os.environ.get(INTERPRET),
    )
    one_launch_prints_module.FORCE_ONE_LAUNCH = True
    generator.triton_available = lambda device: False  # type: ignore[assignment]
    os.environ[INTERPRET] = "1"
    try:
        yield
    finally:
        one_launch_prints_module.FORCE_ONE_LAUNCH, generator.triton_available, env = kept
        if env is None:
            os.environ.pop(INTERPRET, None)
        else:
            os.environ[INTERPRET] = env


INTERPRET = "TRITON_INTERPRET"


# -- models ---------------------------------------------------------------------------------
def make(name: str, smoke: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...], Callable]:
    """(model, batch tensors, loss(model, *batch)) with the same weights for every row."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if name == "cnn":
        b = size(64, 4)
        model = build_model("tanh_cnn", input_shape=(1, 28, 28), num_classes=10)
        x, y = torch.randn(b, 1, 28, 28, generator=g), torch.randint(0, 10, (b,), generator=g)
        return model, (x, y), lambda m, x, y: F.cross_entropy(m(x), y)
    if name == "bert":
        require("transformers")
        import transformers

        layers, hidden = (1, 32) if smoke else (4, 256)
        b, t, vocab = size(8, 4), size(32, 8), 8192
        cfg = transformers.BertConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            intermediate_size=4 * hidden,
            max_position_embeddings=128,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        model = transformers.BertForSequenceClassification(cfg).train()
        ids = torch.randint(1, vocab, (b, t), generator=g)
        y = torch.randint(0, 2, (b,), generator=g)
        pos = torch.arange(t).expand(b, t).contiguous()  # (B, T): Opacus hooks need row ids
        tok = torch.zeros(b, t, dtype=torch.long)

        def loss(m: nn.Module, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = m(input_ids=ids, position_ids=pos, token_type_ids=tok)
            return F.cross_entropy(out.logits, y)

        return model, (ids, y), loss
    raise ValueError(f"model must be one of bert, cnn, got model = {name!r}")


Step = Callable[[], None]


def nonprivate(name: str, smoke: bool) -> tuple[Step, Step]:
    model, batch, loss = make(name, smoke)
    opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=True)

    def fwd_bwd() -> None:
        opt.zero_grad(set_to_none=True)
        loss(model, *batch).backward()

    return fwd_bwd, opt.step


def dpfy_row(name: str, smoke: bool, seed: int | None) -> tuple[Step, Step]:
    model, batch, loss = make(name, smoke)
    opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=True)
    loader = DataLoader(TensorDataset(*batch), batch_size=len(batch[0]))
    model, opt, dl = dpfy.make_private(
        model, opt, loader, noise_multiplier=SIGMA, max_grad_norm=CLIP, seed=seed
    )
    dl.cursor.indices = torch.arange(len(batch[0]))  # the batch the optimizer binds

    def fwd_bwd() -> None:
        dl.cursor.pending = 1  # as if the private loader had yielded the batch
        opt.zero_grad(set_to_none=True)
        loss(model, *batch).backward()

    return fwd_bwd, opt.step


def opacus_row(name: str, smoke: bool) -> tuple[Step, Step]:
    require("opacus")
    from opacus import PrivacyEngine

    model, batch, loss = make(name, smoke)
    opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=True)
    loader = DataLoader(TensorDataset(*batch), batch_size=len(batch[0]))
    model, opt, _ = PrivacyEngine().make_private(
        module=model,
        optimizer=opt,
        data_loader=loader,
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        grad_sample_mode="hooks",
        poisson_sampling=False,
    )

    def fwd_bwd() -> None:
        opt.zero_grad(set_to_none=True)
        loss(model, *batch).backward()

    return fwd_bwd, opt.step


ROWS: dict[str, Callable[[str, bool], tuple[Step, Step]]] = {
    "non-private": nonprivate,
    "dpfy seed=0": lambda n, s: dpfy_row(n, s, 0),
    "dpfy secure": lambda n, s: dpfy_row(n, s, None),
    "dpfy fused-noise stand-in": lambda n, s: dpfy_row(n, s, 0),
    "opacus hooks": opacus_row,
}


def count(row: str, name: str, steps: int, smoke: bool) -> tuple[int, int, int, int, int, Counter]:
    """(step ops, step reads, whole-step ops, whole-step reads, whole-step launching ops, step
    op names) at the last step."""
    forced = force_device_path(fused_noise="fused" in row) if row.startswith("dpfy") else _nothing()
    with forced:
        fwd_bwd, step = ROWS[row](name, smoke)
        for _ in range(steps - 1):
            fwd_bwd()
            step()
        with counting() as whole:
            fwd_bwd()
            with counting() as inner:
                step()
    # the modes stack: the outer counter sees every op (and read) the inner one passes on
    return (
        inner_total(inner),
        inner.reads,
        inner_total(whole),
        whole.reads,
        whole.launching,
        inner.ops,
    )


def inner_total(c: OpCounter) -> int:
    return sum(c.ops.values())


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert,cnn")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=0, help="print the N commonest ops of each step")
    ap.add_argument("--smoke", action="store_true", help=HELP)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    rows = args.rows.split(",")
    print(
        f"CPU: {cpu_name()}; torch {torch.__version__}; dpfy {dpfy.__version__} "
        f"({Path(dpfy.__file__).parent}); dpfy rows on the forced device path"
    )
    print(
        "| model | row | ops / optimizer.step() | host reads / step() | ops / training step "
        "| host reads / training step | ops × non-private | reads − non-private "
        "| launching ops / training step | launching × non-private |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst = worst_launch = 0.0
    for name in args.models.split(","):
        base: tuple[int, int, int] | None = None
        for row in rows:
            s_ops, s_reads, w_ops, w_reads, w_launch, top = count(row, name, args.steps, args.smoke)
            if row == "non-private":
                base = (w_ops, w_reads, w_launch)
            ratio = w_ops / base[0] if base else float("nan")
            launch = w_launch / base[2] if base else float("nan")
            extra = w_reads - base[1] if base else 0
            if row.startswith("dpfy"):
                worst, worst_launch = max(worst, ratio), max(worst_launch, launch)
            print(
                f"| {name} | {row} | {s_ops} | {s_reads} | {w_ops} | {w_reads} | "
                f"{ratio:.2f} | {extra:+d} | {w_launch} | {launch:.2f} |",
                flush=True,
            )
            if args.top:
                print("    step:", ", ".join(f"{k} {v}" for k, v in top.most_common(args.top)))
    print(f"launching ops: dpfy/non-private worst {worst_launch:.2f}")
    print(f"OPS dpfy/non-private worst {worst:.2f}")


if __name__ == "__main__":
    main()
