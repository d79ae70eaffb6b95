"""Issue 15 §2: checkpoints only at logical-batch boundaries; runs survive SIGKILL.

The kill tests run ``dpfy train`` in a child process on sklearn digits, SIGKILL it at random
moments (during a step, while a checkpoint is written, during the report), ``--resume`` it,
and compare ``model.pt`` and ``ledger.json`` byte for byte with an uninterrupted run of the
same ``--seed``. Measured results: docs/fault_tolerance.md.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import random
import shutil
import signal
import sys
import traceback
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.cli import main
from dpfy.errors import PrivacyRefusal
from dpfy.train.rundir import RunDir


def _private_with_physical_batches():
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(40, 5), torch.randint(0, 3, (40,)))
    model = nn.Linear(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # expected batch 20 cut into physical batches of at most 2: a logical batch spans many
    return dpfy.make_private(model, opt, DataLoader(ds, batch_size=20), noise_multiplier=1.0,
                             seed=3, max_physical_batch_size=2)


def test_state_dict_refuses_mid_logical_batch_and_never_holds_unnoised_sums():
    model, opt, dl = _private_with_physical_batches()
    it = iter(dl)
    x, y = next(it)
    while dl.cursor.last:           # find a physical batch that does not end its logical batch
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        x, y = next(it)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()                      # summed, not released: the un-noised sum is in memory
    with pytest.raises(PrivacyRefusal, match="after optimizer.step\\(\\) completes a logical"):
        opt.state_dict()
    while not dl.cursor.last:       # finish the logical batch: now a checkpoint is allowed
        x, y = next(it)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    state = opt.state_dict()
    assert "pending" not in state


def test_load_refuses_a_checkpoint_with_a_pending_sum():
    model, opt, dl = _private_with_physical_batches()
    state = opt.state_dict()
    # what dpfy-optimizer/2 wrote mid-batch, before the boundary rule: refused by its format
    state.update(format="dpfy-optimizer/2", pending={"gradient": torch.zeros(3)})
    with pytest.raises(ValueError, match="not a dpfy optimizer checkpoint of this version"):
        opt.load_state_dict(state)


# -- kill -9 and resume ------------------------------------------------------------------------
# A short run: digits (1,438 training examples), expected batch 200 → 8 Poisson steps per epoch,
# 3 epochs.
# Fixed σ and RDP keep each run about a second; the kill points are in the children.
EPOCHS = 3
ARGS = ["--dataset", "digits", "--model", "logreg", "--epochs", str(EPOCHS), "--batch-size",
        "200", "--lr", "1", "--clip", "1", "--noise-multiplier", "1.0", "--accountant", "rdp",
        "--seed", "11", "--threads", "1", "--no-progress"]


def _no_plots() -> None:
    """Plots are not compared and cost most of a run's second: write empty PNGs instead."""
    import dpfy.train.trainer as trainer
    from dpfy.privacy.report import PrivacyReport
    trainer.plot_accuracy = lambda rows, path, **kw: Path(path).write_bytes(b"")
    PrivacyReport.plot = lambda self, path: Path(path).write_bytes(b"")


def _die_at(point: str, n: int) -> None:
    """SIGKILL this process at the n-th call of ``point``'s function, before it runs.

    "step": the private step's release (mid logical step, nothing noised yet);
    "write": any os.fsync or os.replace (a checkpoint, metrics, model or ledger being written,
    between the rename of checkpoint.pt to checkpoint.prev.pt and of the new one);
    "report": the privacy report, after its files are written, before summary.json.
    """
    import dpfy.step.private_step as private_step
    import dpfy.train.trainer as trainer
    calls = [0]

    def killing(real, after=False):
        def wrapper(*args, **kwargs):
            calls[0] += 1
            if calls[0] == n and not after:
                os.kill(os.getpid(), signal.SIGKILL)
            out = real(*args, **kwargs)
            if calls[0] == n and after:
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        return wrapper

    if point == "step":
        private_step.PrivateStep._release = killing(private_step.PrivateStep._release)
    elif point == "write":
        os.fsync, os.replace = killing(os.fsync), killing(os.replace)
    elif point == "report":
        trainer.write_report = killing(trainer.write_report, after=True)
    elif point != "none":
        raise AssertionError(point)


def _child(argv: list[str], log: str, point: str, n: int) -> None:
    """The child process: ``dpfy train ARGV`` with its output in ``log``; exits with main's
    code (99 and a traceback on an unexpected exception)."""
    code = 99
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        _no_plots()
        _die_at(point, n)
        code = main(["train", *argv])
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# Children fork from a server that imported dpfy once and never ran torch (forking a process
# whose torch thread pool ran hangs the child; spawning re-imports torch, ~10 s a child).
_CTX = multiprocessing.get_context("forkserver")
_CTX.set_forkserver_preload(["torch._dynamo", "dpfy.cli", "dpfy.train.trainer", "dpfy.privacy.report",
                             "sklearn.datasets", Path(__file__).stem])


def _start(argv: list[str], log: Path, point: str = "none", n: int = 0):
    """Start ``dpfy train ARGV`` in a child process that dies at ``point`` (see _die_at)."""
    proc = _CTX.Process(target=_child, args=(argv, str(log), point, n))
    proc.start()
    return proc


def _wait(proc, timeout: float = 240.0, kill_after: float | None = None) -> int | None:
    """Wait for the child; SIGKILL it after ``kill_after`` s. Returns its exit code, or None
    when it died of SIGKILL. The timeout only catches a hang: a run takes seconds, but a
    loaded 2-core CI machine may stretch that several-fold."""
    proc.join(kill_after if kill_after is not None else timeout)
    if proc.exitcode is None:
        proc.kill()                                      # SIGKILL
        proc.join()
    return None if proc.exitcode == -signal.SIGKILL else proc.exitcode


def _next_argv(out: Path, args: list[str] = ARGS) -> list[str]:
    """What a user does after a crash: --resume when there is something to resume, else the
    original command again (a dead start without checkpoint must not block it)."""
    run = RunDir.of(out)
    if run.has_checkpoint() or run.is_complete():
        return ["--resume", str(out), "--no-progress"]
    return [*args, "--out", str(out)]


def kill_and_resume(tmp_path: Path, kills: list[tuple[str, float]],
                    before_last: Callable[[Path], None] | None = None,
                    args: list[str] = ARGS) -> dict:
    """Run to the end through ``kills`` (point, n or seconds), resuming after each; return
    what happened. A kill point the run finishes before is counted as not killed.
    ``before_last`` is called on the run before the resume that completes it."""
    out, log = tmp_path / "killed", tmp_path / "killed.log"
    killed, resumed, restarted = 0, 0, 0
    argv = [*args, "--out", str(out)]
    for point, n in kills:
        timed = point == "timed"
        pid = _start(argv, log, "none" if timed else point, int(n))
        code = _wait(pid, kill_after=n if timed else None)
        if code is not None:
            assert code == 0, log.read_text()[-2000:]
            break
        killed += 1
        argv = _next_argv(out, args)
        resumed += argv[0] == "--resume"
        restarted += argv[0] != "--resume"
    else:
        if before_last is not None:
            before_last(out)
        assert _wait(_start(argv, log)) == 0, log.read_text()[-2000:]
    return {"out": out, "kills": killed, "resumes": resumed, "restarts": restarted,
            "log": log.read_text()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run (in a child too, so it runs exactly like the killed ones)."""
    out = tmp_path_factory.mktemp("ref") / "run"
    assert _wait(_start([*ARGS, "--out", str(out)], out.with_suffix(".log"))) == 0
    return out


def assert_identical(out: Path, reference: Path) -> None:
    for name in ("model.pt", "ledger.json"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    assert not RunDir.of(out).staging.exists()
    assert not list(out.glob("checkpoint*")) and not list(out.glob(".*"))
    steps = json.loads((out / "summary.json").read_text())["steps"]
    assert steps == json.loads((reference / "summary.json").read_text())["steps"]


def test_killed_three_times_and_resumed_is_bit_identical(tmp_path, reference):
    # one kill of each kind: mid step (step 12, in epoch 2); while a checkpoint is written
    # (the resumed run's 9th file-system call: after metrics.csv and metrics.json, 3 calls
    # each, the new checkpoint's fsync and the rename of checkpoint.pt to checkpoint.prev.pt,
    # before the new one is renamed into place); during the report (both checkpoints exist) ...
    kills = [("step", 12), ("write", 9), ("report", 1)]
    result = kill_and_resume(tmp_path, kills, before_last=_damage_newest)
    assert result["kills"] == 3 and result["resumes"] == 3, result["log"][-2000:]
    # ... then checkpoint.pt is found truncated: one warning line, the previous one is used
    assert "warning: checkpoint.pt is damaged" in result["log"]
    assert_identical(result["out"], reference)


def _damage_newest(out: Path) -> None:
    """Truncate checkpoint.pt; check that with checkpoint.prev.pt damaged too, --resume is
    one line naming the fix and exit code 2 (on a copy, so the run itself stays resumable)."""
    run = RunDir.of(out)
    newest = run.checkpoint.read_bytes()
    run.checkpoint.write_bytes(newest[: len(newest) // 2])
    copy = out.with_name("copy")
    shutil.copytree(run.staging, RunDir(copy).staging)
    RunDir(copy).previous_checkpoint.write_bytes(b"")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["train", "--resume", str(copy), "--no-progress"]) == 2
    line = err.getvalue().strip()
    assert "\n" not in line and "checkpoint must be readable" in line, line
    assert "start a new run with --out" in line, line


@pytest.mark.slow
def test_killed_ten_times_at_random_points_is_bit_identical(tmp_path):
    # 12 epochs (96 steps): each kill but the last lets the run progress 0-2 epochs, so all
    # ten fall inside the run
    args = [*ARGS, "--epochs", "12"]
    ref = tmp_path / "ref"
    assert _wait(_start([*args, "--out", str(ref)], tmp_path / "ref.log")) == 0
    rng = random.Random(2026)
    kinds = ["step", "write", "timed", "write", "step", "timed", "write", "timed", "step",
             "report"]
    kills = [(k, rng.uniform(0.05, 3.0) if k == "timed" else
              rng.randint(1, 20) if k == "step" else rng.randint(1, 25) if k == "write"
              else 1) for k in kinds]
    result = kill_and_resume(tmp_path, kills, args=args)
    print({k: v for k, v in result.items() if k not in ("log", "out")})
    assert result["kills"] == 10, result["log"][-2000:]
    assert_identical(result["out"], ref)


def test_a_start_killed_before_its_first_checkpoint_does_not_block_the_same_out(tmp_path):
    out, log = tmp_path / "r", tmp_path / "r.log"
    assert _wait(_start([*ARGS, "--out", str(out)], log, "step", 1)) is None   # killed
    assert RunDir.of(out).staging.is_dir() and not RunDir.of(out).has_checkpoint()
    with pytest.raises(ValueError, match="nothing to continue; start again with --out"):
        RunDir.for_resume(out)
    run = RunDir.create(out)             # the dead start is cleared; the run may begin again
    assert run.staging.is_dir() and list(run.staging.iterdir()) == []


def test_a_live_run_is_not_cleared_or_resumed_by_another(tmp_path):
    run = RunDir.create(tmp_path / "r")
    with run.held():                     # as a live dpfy train holds it
        with pytest.raises(ValueError, match="another dpfy train is writing now"):
            RunDir.create(tmp_path / "r")
    assert run.staging.is_dir()
