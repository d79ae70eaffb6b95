"""``--device auto|cpu|cuda[:k]`` for ``dpfy train``, ``dpfy tune`` and ``dpfy audit``: auto is the
CPU where torch sees no GPU, a CUDA device that is not there is refused before anything runs
(one line naming the fix, exit code 2, no directory left), and the run's config.json and
privacy report name the device it ran on."""

from __future__ import annotations

import json

import pytest
import torch

from dpfy.cli import main
from dpfy.train.config import TrainConfig
from dpfy.train.device import hold_on_device, resolve_device

FAST = [
    "--dataset",
    "digits",
    "--model",
    "logreg",
    "--epochs",
    "1",
    "--batch-size",
    "256",
    "--lr",
    "1",
    "--clip",
    "1",
    "--seed",
    "3",
    "--threads",
    "1",
]


@pytest.fixture
def no_gpu(monkeypatch):
    """A machine without CUDA, whatever this one has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_is_the_cpu_without_a_gpu(no_gpu):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_gpu_is_refused_with_the_fix(no_gpu, name):
    with pytest.raises(ValueError, match="device must be one torch can use") as err:
        resolve_device(name)
    assert "--device cpu" in str(err.value) and "torch.cuda.is_available() is False" in str(
        err.value
    )


def test_a_cuda_index_that_is_not_there_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"one of cuda:0\.\.cuda:1, got device = 'cuda:2'"):
        resolve_device("cuda:2")


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "mps0", ""])
def test_a_malformed_device_is_refused_by_the_config(bad):
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:K"):
        TrainConfig(device=bad)


@pytest.mark.parametrize("command", ["train", "tune", "audit"])
def test_every_command_refuses_cuda_without_a_gpu_before_any_work(
    no_gpu, tmp_path, capsys, command
):
    extra = {"tune": ["--lr-grid", "1,2"], "audit": ["--canaries", "8"]}.get(command, [])
    argv = [command, *FAST, "--no-progress", "--device", "cuda", "--out", str(tmp_path / "r")]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dpfy {command}: error: --device must be one torch can use"), err
    assert "--device cpu" in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_run_names_its_device_in_config_and_report(no_gpu, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["train", *FAST, "--no-progress", "--device", "auto", "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["device"] == "cpu"
    assert "device: cpu" in (out / "privacy_report.md").read_text()


def test_a_dataset_is_held_on_the_cpu_unchanged():
    from dpfy.data import load_dataset

    data = load_dataset("digits")
    assert hold_on_device(data, torch.device("cpu")) is data


def test_a_training_set_is_held_on_the_gpu_when_it_fits_in_a_quarter_of_its_free_memory():
    from dpfy.data import load_dataset
    from dpfy.train.device import fits

    data = load_dataset("digits")
    size = sum(t.numel() * t.element_size() for s in (data.train, data.test) for t in s.tensors)
    assert fits(data, 4 * size)  # exactly a quarter
    assert not fits(data, 4 * size - 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_run_trains_there_with_its_training_set_held_on_the_gpu(tmp_path, monkeypatch):
    """``dpfy train --device cuda`` end to end on a GPU (benchmarks/gpu.sh runs it): the
    training set is copied to the device once, the private loader indexes it there, and the
    run names the device it ran on."""
    import dpfy.train.trainer as trainer_mod

    held = []
    hold = trainer_mod.hold_on_device

    def spy(data, device):
        out = hold(data, device)
        held.append(out.train.tensors[0].device)
        return out

    monkeypatch.setattr(trainer_mod, "hold_on_device", spy)
    out = tmp_path / "r"
    assert main(["train", *FAST, "--no-progress", "--device", "cuda", "--out", str(out)]) == 0
    index = torch.cuda.current_device()
    assert held == [torch.device("cuda", index)]  # the digits fit in a quarter of any GPU
    assert json.loads((out / "config.json").read_text())["device"] == f"cuda:{index}"
    assert f"device: cuda:{index} (" in (out / "privacy_report.md").read_text()
