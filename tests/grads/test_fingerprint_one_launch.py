"""The parameters' fingerprints in one Triton launch (``dpfy.native.word_sums``), as a GPU
computes them, run here under Triton's interpreter (``TRITON_INTERPRET=1``).

Expected values come from a numpy sum of each chunk's bytes read as little-endian int32 and
added in int64 (wrapping, as numpy's int64 sum does): an independent computation of the same
definition. The guard must see a silent write to any one word on this path too, name the
parameter, and keep the CPU's way for a guard that started on it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pytest.importorskip("triton")

import dpfy  # noqa: E402
from dpfy import _deferred  # noqa: E402
from dpfy.buffers.marks import marks_changed, param_marks  # noqa: E402
from dpfy.buffers import prints as prints_mod  # noqa: E402
from dpfy.buffers.guard import BufferGuard  # noqa: E402
from dpfy.buffers.prints import PrintCache  # noqa: E402
from dpfy.errors import PrivacyRefusal  # noqa: E402
from dpfy.native import word_sums  # noqa: E402
from dpfy.native.word_sums import WordSums, summable  # noqa: E402


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _numpy_chunk_sums(t: torch.Tensor, chunk: int) -> list[int]:
    words = np.frombuffer(t.detach().numpy().tobytes(), dtype="<i4").astype(np.int64)
    return [int(words[i : i + chunk].sum()) for i in range(0, len(words), chunk)]


def test_chunk_sums_equal_an_independent_sum(monkeypatch, device):
    """On the CPU under the interpreter, and compiled on CUDA (benchmarks/gpu.sh runs it)."""
    if device.type == "cuda":
        monkeypatch.delenv("TRITON_INTERPRET")
        monkeypatch.setattr(word_sums, "CHUNK_WORDS", 1000)
    monkeypatch.setattr(word_sums, "_CHUNK_INTERPRETED", 1000)  # several chunks a tensor
    monkeypatch.setattr(word_sums, "_BLOCK_INTERPRETED", 256)  # several blocks a chunk
    g = torch.Generator().manual_seed(0)
    ts = [
        torch.randn(2500, generator=g),  # 3 chunks, the last one short
        torch.randn(7, 3, generator=g).double(),  # 8-byte elements: 42 words
        torch.randn(10, generator=g).half(),  # 2-byte elements, even length: 5 words
        torch.full((1000,), -7.5e37),  # large words: the int64 sums wrap nowhere, int32 would
    ]
    table = WordSums([t.to(device) for t in ts])
    got = table().tolist()
    want, owners = [], []
    for i, t in enumerate(ts):
        sums = _numpy_chunk_sums(t, 1000)
        want += sums
        owners += [i] * len(sums)
    assert got == want
    assert table.owners == tuple(owners)


def test_the_interpreter_never_reads_a_gpu_tensor():
    """Under the interpreter the table's addresses are read as host memory."""
    assert not word_sums.word_sums_available(torch.device("cuda"))
    assert word_sums.word_sums_available(torch.device("cpu"))


def test_what_is_not_whole_words_is_refused_by_the_table():
    odd = torch.zeros(3, dtype=torch.float16)  # 6 bytes
    assert not summable(odd) and not summable(torch.zeros(4, 4).t()) and summable(torch.ones(1))
    with pytest.raises(ValueError, match="contiguous 32-bit words"):
        WordSums([torch.ones(2), odd])


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 5)
        self.h = nn.Parameter(torch.ones(3, dtype=torch.float16))  # not whole words: torch sum


@pytest.mark.parametrize("where", ["a.weight", "a.bias", "h"])
def test_a_silent_write_is_seen_and_named(monkeypatch, where):
    monkeypatch.setattr(prints_mod, "FORCE_ONE_LAUNCH", True)
    m = _Net()
    owners = [("", m), ("a", m.a)]
    cache = PrintCache()
    before = param_marks(owners, cache)
    assert before is not None and cache.one_launch and before[2][0] == "one launch"
    assert marks_changed(before, param_marks(owners, cache)) == []
    owner, name = where.split(".") if "." in where else ("", where)
    tensor = getattr(m.a if owner else m, name)
    tensor.data.view(-1)[-1] = -tensor.data.view(-1)[-1] if name != "bias" else 2.5
    changed = marks_changed(before, param_marks(owners, cache))
    key = (1, name) if owner else (0, name)
    assert [k for k, _ in changed] == [key]
    assert "without a version bump" in changed[0][1]


def test_a_guard_keeps_the_way_it_started_with(monkeypatch):
    m = _Net()
    owners = [("", m)]
    cache = PrintCache()
    before = param_marks(owners, cache)  # the CPU's way: one sum per parameter
    monkeypatch.setattr(prints_mod, "FORCE_ONE_LAUNCH", True)
    assert marks_changed(before, param_marks(owners, cache)) == []
    assert not cache.one_launch


def test_a_reshaped_parameter_under_the_same_storage_is_a_change(monkeypatch):
    monkeypatch.setattr(prints_mod, "FORCE_ONE_LAUNCH", True)
    monkeypatch.setattr(word_sums, "_CHUNK_INTERPRETED", 16)
    m = nn.Linear(8, 4)
    owners = [("", m)]
    cache = PrintCache()
    before = param_marks(owners, cache)
    m.weight.data = m.weight.data.view(-1)[:16].view(4, 4)  # same start, half the words
    changed = marks_changed(before, param_marks(owners, cache))
    assert [k for k, _ in changed] == [(0, "weight")]


def test_the_private_step_refuses_a_silent_write_on_the_one_launch_path(monkeypatch, device):
    """The CPU under the interpreter, forced; CUDA compiled, by default (gpu.sh runs it)."""
    if device.type == "cuda":
        monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(prints_mod, "FORCE_ONE_LAUNCH", True)
    monkeypatch.setattr(_deferred, "FORCE_ON_CPU", True)  # the flags read by the step, as on a GPU
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 6, generator=g), torch.randint(0, 5, (32,), generator=g)
    x, y = x.to(device), y.to(device)
    m = nn.Sequential(nn.Linear(6, 5)).to(device)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt, dl = dpfy.make_private(
        m,
        opt,
        DataLoader(TensorDataset(x, y), batch_size=8),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        seed=0,
        poisson_sampling=False,
    )
    batches = iter(dl)
    xb, yb = next(batches)
    F.cross_entropy(m(xb), yb).backward()
    opt.step()
    opt.zero_grad()
    xb, yb = next(batches)
    F.cross_entropy(m(xb), yb).backward()
    m[0].weight.data[0, 0] += 1.0  # between backward and step, without a version bump
    with pytest.raises(PrivacyRefusal, match="parameter '0.weight'.*without a version bump"):
        opt.step()


def test_a_model_moved_to_another_device_gets_that_devices_way(monkeypatch):
    """A guard that fingerprinted on a GPU in one launch, then sees the model on the CPU
    (moved between steps), sums on the CPU's way instead of asking Triton for CPU tensors."""
    monkeypatch.delenv("TRITON_INTERPRET")  # the CPU as it is: no Triton kernel runs on it
    m = nn.Linear(4, 3)
    owners = [("", m)]
    cache = PrintCache(one_launch=True, device=torch.device("cuda", 0))  # as left by the GPU
    before = param_marks(owners, cache)
    assert before is not None and before[2][0] == "each" and cache.device == torch.device("cpu")
    assert marks_changed(before, param_marks(owners, cache)) == []


def test_a_parameter_made_non_contiguous_under_the_same_storage_is_a_change(monkeypatch):
    """Transposed in place of itself (same storage, same square shape, no version bump) it is
    summed the other way, after the bias: the layouts hold the same keys as often, in another
    order. Its entry must not be taken for compared, nor the bias's write go unseen."""
    monkeypatch.setattr(prints_mod, "FORCE_ONE_LAUNCH", True)
    m = nn.Linear(4, 4)
    owners = [("", m)]
    cache = PrintCache()
    before = param_marks(owners, cache)
    m.weight.data = m.weight.data.t()
    m.bias.data[0] += 1.0  # a silent write
    changed = marks_changed(before, param_marks(owners, cache))
    assert sorted(k for k, _ in changed) == [(0, "bias"), (0, "weight")]


def test_parameters_moved_to_a_device_without_triton_are_summed_with_torch(monkeypatch):
    """The one-launch way chosen on a device where Triton runs; the model then moved where it
    does not (a GPU's model to the CPU; here the CPU's to ``meta``): fingerprinted, no crash."""
    monkeypatch.setattr(prints_mod, "FORCE_ONE_LAUNCH", True)
    m = nn.Linear(4, 4)
    owners = [("", m)]
    cache = PrintCache()
    assert param_marks(owners, cache)[2][0] == "one launch"
    m.to("meta")
    after = param_marks(owners, cache)
    assert after is not None and after[2][0] == "each"


def test_a_device_change_lets_go_of_the_table(monkeypatch):
    """The launch table holds the parameters' memory: kept after the model moved to a device
    fingerprinted the other way, it would hold a GPU's copy of the model for good."""
    monkeypatch.setattr(prints_mod, "FORCE_ONE_LAUNCH", True)
    m = nn.Linear(4, 4)
    owners = [("", m)]
    cache = PrintCache()
    param_marks(owners, cache)
    assert cache.table is not None
    m.to("meta")
    param_marks(owners, cache)
    assert cache.table is None


@pytest.mark.parametrize("deferred", [False, True])
def test_a_parameter_of_several_chunks_is_named_once(monkeypatch, deferred):
    """Each changed chunk is an entry; the refusal names the parameter, once (BERT's word
    embeddings are ~360 chunks on a GPU)."""
    monkeypatch.setattr(prints_mod, "FORCE_ONE_LAUNCH", True)
    monkeypatch.setattr(word_sums, "_CHUNK_INTERPRETED", 16)
    m = nn.Linear(8, 8)  # weight: 64 words, 4 chunks
    owners = [("", m)]
    cache = PrintCache()
    before = param_marks(owners, cache)
    m.weight.data.mul_(0.5)  # every chunk changes
    got: list = []
    defer = (lambda mismatch, explain: got.extend(explain(mismatch.tolist()))) if deferred else None
    if deferred:
        monkeypatch.setattr(_deferred, "FORCE_ON_CPU", True)
    got += marks_changed(before, param_marks(owners, cache), defer)
    assert [k for k, _ in got] == [(0, "weight")]


def _failing_launch(self):
    raise RuntimeError("PTX assembler not found")  # as a broken Triton install would


def test_a_kernel_that_fails_at_its_first_launch_falls_back_with_a_warning(monkeypatch):
    """The guard must not stop every private forward on a GPU whose Triton cannot compile: the
    first launch failing, nothing of its way was kept, so torch's way takes over (and stays)."""
    monkeypatch.setattr(prints_mod, "FORCE_ONE_LAUNCH", True)
    monkeypatch.setattr(prints_mod, "_FAILED", set())
    monkeypatch.setattr(WordSums, "__call__", _failing_launch)
    m = nn.Linear(4, 3)
    owners = [("", m)]
    cache = PrintCache()
    with pytest.warns(RuntimeWarning, match="PTX assembler not found.*each\\s+parameter"):
        before = param_marks(owners, cache)
    assert before is not None and before[2][0] == "each" and cache.one_launch is False
    assert param_marks(owners, PrintCache())[2][0] == "each"  # the device is remembered
    m.weight.data[0, 0] += 1.0
    changed = marks_changed(before, param_marks(owners, cache))
    assert [k for k, _ in changed] == [(0, "weight")]


def test_a_kernel_that_fails_after_it_ran_is_not_papered_over(monkeypatch):
    """Fingerprints of the one-launch way exist then: switching ways would compare across them."""
    monkeypatch.setattr(prints_mod, "FORCE_ONE_LAUNCH", True)
    monkeypatch.setattr(prints_mod, "_FAILED", set())
    m = nn.Linear(4, 3)
    owners = [("", m)]
    cache = PrintCache()
    assert param_marks(owners, cache)[2][0] == "one launch"
    monkeypatch.setattr(WordSums, "__call__", _failing_launch)
    assert param_marks(owners, cache) is None  # the guard's full snapshot then, as for any


class _Writer(nn.Module):
    """A forward that writes into its weight without a version bump when told to."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.write = False

    def forward(self, x):
        if self.write:
            self.lin.weight.data[0, 0] += 1.0
        return self.lin(x)


def _guarded_after_a_launch(monkeypatch):
    """A guarded model whose fingerprints were taken in one launch, then the kernel fails."""
    monkeypatch.setattr(prints_mod, "FORCE_ONE_LAUNCH", True)
    monkeypatch.setattr(prints_mod, "_FAILED", set())
    m = _Writer()
    guard = BufferGuard(m)
    x = torch.randn(2, 4)
    m(x)
    m(x)
    assert guard._root is not None and guard._root.prints.launched
    monkeypatch.setattr(WordSums, "__call__", _failing_launch)
    return m, guard, x


def test_a_failed_launch_after_it_ran_leaves_no_forward_unchecked(monkeypatch):
    """The marks are None then (the failure is a RuntimeError, as Triton's launch errors are)
    and the guard takes its full snapshot: that snapshot must copy the parameters too, or a
    silent write in that forward goes unseen."""
    m, guard, x = _guarded_after_a_launch(monkeypatch)
    m.write = True
    with pytest.raises(PrivacyRefusal, match="parameter 'lin.weight'.*without a version bump"):
        m(x)
    guard.detach()


def test_a_failed_launch_after_it_ran_leaves_no_step_unchecked(monkeypatch):
    """The same for the state the step checks (a write between backward and step)."""
    m, guard, x = _guarded_after_a_launch(monkeypatch)
    m(x)
    m.lin.weight.data[0, 0] += 1.0
    with pytest.raises(PrivacyRefusal, match="parameter 'lin.weight'.*without a version bump"):
        guard.check_settled()
    guard.detach()


def test_a_kernel_that_fails_within_a_forward_is_refused_as_unverified(monkeypatch):
    """Fingerprints before the forward, none after it: the values were not compared, which
    the refusal says (it named every parameter 'deleted during the forward' before)."""
    monkeypatch.setattr(prints_mod, "FORCE_ONE_LAUNCH", True)
    monkeypatch.setattr(prints_mod, "_FAILED", set())
    m = nn.Linear(4, 3)
    guard = BufferGuard(m, collect=True)
    x = torch.randn(2, 4)
    m(x)  # the fingerprints of its post hook: the first launch
    launch, calls = WordSums.__call__, []

    def fails_after_one(self):
        calls.append(1)
        return launch(self) if len(calls) == 1 else _failing_launch(self)

    monkeypatch.setattr(WordSums, "__call__", fails_after_one)
    m(x)  # the pre hook's fingerprints are taken, the post hook's are not
    assert {(p.buffer, p.how.split(":")[0]) for p in guard.problems} == {
        ("weight", "unverified"),
        ("bias", "unverified"),
    }
    guard.detach()
