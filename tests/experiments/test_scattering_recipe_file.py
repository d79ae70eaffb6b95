"""The shipped one-command recipe (examples/fmnist_scattering.toml) is the configuration the
Fashion-MNIST experiment measured: experiments/fmnist_accuracy's ``pld_ema`` without the
average (the validation split kept the last iterate), so the front page's number belongs to
the file a user runs."""

from pathlib import Path

from dpfy.train.config import TrainConfig, load_config_file
from experiments.fmnist_accuracy.run import CONFIGS

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "fmnist_scattering.toml"


def test_the_recipe_file_is_the_measured_configuration():
    measured = {k: v for k, v in CONFIGS["pld_ema"].items() if k not in ("ema", "threads")}
    assert TrainConfig.from_mapping(load_config_file(RECIPE)) == TrainConfig.from_mapping(measured)


def test_the_recipe_is_tramer_and_bonehs_published_values_with_pld():
    cfg = TrainConfig.from_mapping(load_config_file(RECIPE))
    # Tramèr & Boneh's repository README, "ScatterNet models", Fashion-MNIST linear:
    # batch 8192, lr 16, GroupNorm 27 groups; its script's defaults: momentum 0.9, C = 0.1.
    assert (cfg.batch_size, cfg.lr, cfg.momentum, cfg.clip, cfg.epochs) == (8192, 16.0, 0.9, 0.1, 40)
    assert (cfg.epsilon, cfg.delta, cfg.accountant) == (3.0, 1e-5, "pld")
    assert cfg.ema is None and cfg.seed is None  # the last iterate; secure noise
