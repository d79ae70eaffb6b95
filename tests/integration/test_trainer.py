"""End-to-end runs on sklearn digits: outputs, privacy spent, atomic output and exact resume."""

import json

import pytest
import torch

from dpfy.privacy import Ledger, epsilon
from dpfy.train import TrainConfig, resume, train
from dpfy.train.metrics import COLUMNS

quiet = dict(progress=False, echo=lambda s: None)



def test_run_writes_everything_and_spends_the_target(tmp_path, fast_config):
    res = train(fast_config, out=tmp_path / "run", **quiet)
    out = tmp_path / "run"
    assert res.out == out and not (tmp_path / "run.partial").exists()
    for name in ("config.json", "model.pt", "metrics.csv", "metrics.json", "ledger.json",
                 "privacy_report.md", "privacy_report.json", "epsilon_over_steps.png",
                 "accuracy.png", "summary.json"):
        assert (out / name).is_file(), name
    assert not (out / "checkpoint.pt").exists()
    rows = json.loads((out / "metrics.json").read_text())
    assert [r["epoch"] for r in rows] == [1, 2, 3] and set(rows[0]) == set(COLUMNS)
    assert (out / "metrics.csv").read_text().splitlines()[0] == ",".join(COLUMNS)
    # 1438 examples, expected batch 128: ⌈1438/128⌉ = 12 steps per epoch
    assert rows[-1]["step"] == 36
    # ε is re-derived here from the written ledger by the accountant (not the trainer's number)
    ledger = Ledger.from_json((out / "ledger.json").read_text())
    eps = epsilon(ledger, delta=res.delta, accountant="pld")
    assert eps == pytest.approx(res.epsilon) and 2.9 <= eps <= 3.0 + 1e-6
    assert res.delta == pytest.approx(1438 ** -1.1)        # the guide's δ for digits
    assert res.test_acc > 0.8                              # logistic regression on digits
    resolved = json.loads((out / "config.json").read_text())
    assert resolved["seed"] is None and resolved["reproducible"] is True   # never the seed
    assert resolved["delta"] == res.delta
    # the run spec, as make_private built it: the σ and q the ledger recorded, read back as is
    spec, first = resolved["spec"], ledger.step_groups[0]
    assert spec["noise"]["noise_multiplier"] == first.releases[0].noise_multiplier
    assert spec["sampling"]["resolved"]["sample_rate"] == first.sample_rate
    assert spec["accounting"]["max_steps"] == 36 and spec["accounting"]["delta"] == res.delta
    assert TrainConfig.from_mapping(resolved, source="config.json").delta == res.delta
    # The report names, per layer, the rule and the route that computed per-example norms.
    layers = json.loads((out / "privacy_report.json").read_text())["layer_table"]
    weights = torch.load(out / "model.pt")
    assert sum(r["params"] for r in layers) == sum(t.numel() for t in weights.values())
    assert layers and all(r["rule"] and r["route"] for r in layers)


def test_same_seed_same_model(tmp_path, fast_config):
    train(fast_config, out=tmp_path / "a", **quiet)
    train(fast_config, out=tmp_path / "b", **quiet)
    a, b = (torch.load(tmp_path / d / "model.pt") for d in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_interrupted_run_resumes_exactly(tmp_path, interrupt, fast_config):
    train(fast_config, out=tmp_path / "full", **quiet)
    interrupt(fast_config, tmp_path / "cut", after_epochs=2)
    # nothing that looks finished; the partial run has a checkpoint after epoch 2
    assert not (tmp_path / "cut").exists()
    assert (tmp_path / "cut.partial" / "checkpoint.pt").is_file()
    assert not (tmp_path / "cut.partial" / "model.pt").exists()
    res = resume(tmp_path / "cut", **quiet)
    full, cut = (torch.load(tmp_path / d / "model.pt") for d in ("full", "cut"))
    assert all(torch.equal(full[k], cut[k]) for k in full)          # bit-identical
    assert (tmp_path / "full" / "ledger.json").read_text() == \
        (tmp_path / "cut" / "ledger.json").read_text()
    rows = [json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("full", "cut")]
    drop = lambda rs: [{k: v for k, v in r.items() if k != "wall_time_s"} for r in rs]  # noqa
    assert drop(rows[0]) == drop(rows[1])
    assert res.out == tmp_path / "cut" and not (tmp_path / "cut.partial").exists()


def test_resume_refuses_different_settings_and_finished_runs(tmp_path, interrupt,
                                                             fast_config):
    interrupt(fast_config, tmp_path / "r", after_epochs=1)
    with pytest.raises(ValueError, match=r"epochs must match the interrupted run when "
                                         r"resuming, got epochs = 5 but the run used 3"):
        resume(tmp_path / "r", overrides={"epochs": 5}, **quiet)
    resume(tmp_path / "r.partial", overrides={"epochs": 3, "threads": 2}, **quiet)  # equal: ok
    with pytest.raises(ValueError, match="that run finished"):
        resume(tmp_path / "r", **quiet)


def test_new_run_refuses_an_existing_or_interrupted_out(tmp_path, interrupt, fast_config):
    interrupt(fast_config, tmp_path / "r", after_epochs=1)
    with pytest.raises(ValueError, match="Continue it with --resume"):
        train(fast_config, out=tmp_path / "r", **quiet)
    (tmp_path / "done").mkdir()
    with pytest.raises(ValueError, match="out must be a new directory"):
        train(fast_config, out=tmp_path / "done", **quiet)


def test_failure_before_the_first_epoch_leaves_nothing(tmp_path):
    cfg = TrainConfig(dataset="digits", model="logreg", epochs=1, batch_size=5000, seed=1,
                      threads=1)                           # more than the 1438 examples
    with pytest.raises(ValueError, match="batch_size must be <= the number of training"):
        train(cfg, out=tmp_path / "x", **quiet)
    assert list(tmp_path.iterdir()) == []


def test_any_torch_dataset_and_model_through_the_api(tmp_path):
    from torch.utils.data import TensorDataset

    from dpfy.data import DataSplits
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 5, generator=g)
    y = (x[:, 0] > 0).long()                                  # a linearly separable label
    data = DataSplits("blobs", TensorDataset(x[:300], y[:300]), TensorDataset(x[300:], y[300:]),
                      input_shape=(5,), num_classes=2, description="synthetic blobs")
    model = torch.nn.Linear(5, 2)
    cfg = TrainConfig(dataset="blobs", model="my_linear", epochs=2, batch_size=50, lr=1.0,
                      clip=1.0, seed=0, threads=1, epsilon=8.0)
    res = train(cfg, out=tmp_path / "r", data=data, model=model, **quiet)
    assert res.delta == pytest.approx(300 ** -1.1) and res.test_acc > 0.8


def test_a_seeded_run_warns_again_when_resumed_and_the_interrupt_names_the_secret(
        tmp_path, interrupt, fast_config):
    # A review found the seed warning printed only at the start, not after --resume, and the
    # interrupt message did not say the .partial directory holds the secret checkpoint.
    from dpfy.cli.train import interrupted_message
    assert fast_config.seed is not None
    interrupt(fast_config, tmp_path / "r", after_epochs=1)
    assert "secret checkpoint" in interrupted_message(tmp_path / "r")
    lines: list[str] = []
    resume(tmp_path / "r", progress=False, echo=lines.append)
    assert any("WARNING" in line and "seed" in line for line in lines), lines
