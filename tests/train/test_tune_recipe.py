"""``dpfy tune --recipe guide`` (issue 28 §2): the guide's recipe, ClipSearch, fixed-noise proxies.

The recipe's choices must never read the test split: the poison test runs it twice, once with the
real test split and once with a test split of garbage, and checks every choice and every
tuning run's validation metric is bit-identical. ε values are checked with dp_accounting on the
ledger's raw numbers (tests/ledger_events.py), never with dpfy's accountants. The command's
flags and refusals: tests/cli/test_tune_recipe_cli.py.
"""

import dataclasses
import json
import math

import pytest
import torch
from torch.utils.data import TensorDataset

from dpfy.data import load_dataset
from dpfy.privacy.ledger import Ledger
from dpfy.train import TrainConfig
from dpfy.train.probe import Probe, ProbeResult
from dpfy.train.recipe import CLIPPING_OFF, clip_search, run_recipe, tan_noise_multiplier
from ledger_events import dp_accounting_epsilon

QUIET = dict(echo=lambda s: None)
# Tiny compute: 1 epoch at batch 256 on digits' 1438 training examples (6 steps per run).
BASE = dict(dataset="digits", model="logreg", epochs=1, batch_size=256, seed=5, threads=1,
            epsilon=3.0, accountant="rdp")
GRIDS = dict(lr_grid=(0.3, 3.0), clip_grid=(0.1, 10.0), lr_factors=(0.5, 2.0))


def _poisoned(data):
    """The same splits with a test split of garbage: random features, labels all one class."""
    x, y = data.test.tensors
    gen = torch.Generator().manual_seed(123)
    garbage = TensorDataset(torch.randn(x.shape, generator=gen) * 1e3, torch.zeros_like(y))
    return dataclasses.replace(data, test=garbage)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("recipe") / "final"
    data = load_dataset("digits")
    result = run_recipe(TrainConfig(**BASE), out=out, data=data, **GRIDS, **QUIET)
    return result, data


def _metrics(result):
    return [(r.probe, r.accuracy, r.loss)
            for r in (*result.nonprivate, *result.clip_sweep, *result.private_sweep)]


def test_choices_never_read_the_test_split(clean, tmp_path):
    result, data = clean
    poisoned = run_recipe(TrainConfig(**BASE), out=tmp_path / "p", data=_poisoned(data),
                          **GRIDS, **QUIET)
    assert poisoned.choices() == result.choices()            # lr at σ=0, C, σ, final lr
    assert _metrics(poisoned) == _metrics(result)            # every tuning run, bit for bit
    # Not vacuous: the final run does read the test split (to report on it), and the poison shows.
    assert poisoned.final.test_acc != result.final.test_acc
    assert poisoned.final.test_acc < 0.2 < result.final.test_acc


def test_searches_follow_the_guide(clean):
    result, data = clean
    # Search 1: σ = 0 and clipping off; search 2: σ = 0 at α_nop; search 3: σ > 0 at C̃.
    assert all(r.probe.noise_multiplier == 0 and r.probe.clip == CLIPPING_OFF
               for r in result.nonprivate)
    assert [r.probe.lr for r in result.nonprivate] == list(GRIDS["lr_grid"])
    assert all(r.probe.noise_multiplier == 0 and r.probe.lr == result.lr_nonprivate
               for r in result.clip_sweep)
    assert all(math.isinf(r.epsilon) for r in (*result.nonprivate, *result.clip_sweep))
    assert [r.probe.lr for r in result.private_sweep] == pytest.approx(
        [result.lr_nonprivate * f for f in GRIDS["lr_factors"]])
    assert all(r.probe.noise_multiplier == result.noise_multiplier > 0
               and r.probe.clip == result.clip for r in result.private_sweep)
    # α_nop and the final lr are the best validation accuracies of their searches.
    assert result.lr_nonprivate == max(result.nonprivate, key=lambda r: r.accuracy).probe.lr
    assert result.lr == max(result.private_sweep, key=lambda r: r.accuracy).probe.lr
    # Every tuning run takes the final run's S = E·⌈N/B⌉ steps (N: the whole training split).
    steps = BASE["epochs"] * math.ceil(data.num_train / BASE["batch_size"])
    assert {r.probe.steps for r in result.private_sweep} == {steps}


def test_final_run_is_the_reported_ledger_on_the_whole_training_split(clean):
    result, data = clean
    ledger = Ledger.from_json((result.out / "ledger.json").read_text())
    assert ledger.dataset_size == data.num_train          # not the tuning runs' smaller set
    assert {g.sample_rate for g in ledger.step_groups} == {BASE["batch_size"] / data.num_train}
    eps = dp_accounting_epsilon(ledger, result.final.delta, "rdp")
    assert result.final.epsilon == pytest.approx(eps, rel=1e-6)
    assert eps <= 3.0 * (1 + 1e-9) and eps == pytest.approx(3.0, rel=5e-3)   # σ for the target
    cfg = json.loads((result.out / "config.json").read_text())
    assert (cfg["lr"], cfg["clip"]) == (result.lr, result.clip)


def test_report_says_which_searches_are_not_covered(clean):
    result, _ = clean
    report = json.loads((result.out / "privacy_report.json").read_text())
    assert report["tuning"] is None                       # nothing claims to account the search
    (section,) = [s for s in report["sections"] if s["title"] == "Tuning recipe"]
    text = "\n".join(section["lines"])
    assert "Not covered by the guarantee" in text and "σ = 0" in text and "ε = ∞" in text
    assert section["data"]["not_covered"]["sigma_zero_runs"] == 4
    assert section["data"]["covered_by_guarantee"] == "the final run only"
    assert "held out of the training data" in report["public_data"]
    md = (result.out / "privacy_report.md").read_text()
    assert "## Tuning recipe" in md and "- **Tuning:** not covered" in md
    recipe = json.loads((result.out / "recipe.json").read_text())
    assert recipe["choices"] == result.choices()
    assert sum(row["chosen"] for row in recipe["phases"]["clip_search"]) == 1
    assert "seed" not in json.dumps(recipe)


def _result(clip: float, acc: float) -> ProbeResult:
    return ProbeResult(Probe(1.0, clip, 0.0, 8, 1), loss=1 - acc, accuracy=acc,
                       epsilon=math.inf, accountant="none")


def test_clip_search_keeps_the_smallest_c_within_tolerance():
    runs = [_result(0.01, 0.50), _result(0.1, 0.885), _result(1.0, 0.90), _result(10.0, 0.89)]
    assert clip_search(runs, reference=0.90, tolerance=0.02, select="accuracy").probe.clip == 0.1
    assert clip_search(runs, reference=0.90, tolerance=0.0, select="accuracy").probe.clip == 1.0
    # loss: lower is better, the same tolerance in loss units (loss = 1 − acc here)
    assert clip_search(runs, reference=0.10, tolerance=0.02, select="loss").probe.clip == 0.1
    # the reference may be the unclipped run, better than every C: then none qualifies
    with pytest.raises(ValueError, match="Extend --clip-grid upward"):
        clip_search(runs, reference=0.99, tolerance=0.01, select="accuracy")


def test_tan_noise_multiplier_keeps_the_average_gradients_noise():
    # Σ̄ = σC/B at (σ, B) equals σ'C/B' at (σ·B'/B, B'): derived, Sander et al. 2023 §3.
    sigma, clip, big, small = 2.5, 0.7, 4096, 256
    s = tan_noise_multiplier(sigma, big, small)
    assert s == pytest.approx(sigma / 16)
    assert s * clip / small == pytest.approx(sigma * clip / big)
    with pytest.raises(ValueError, match="tan_batch"):
        tan_noise_multiplier(sigma, 256, 512)


@pytest.mark.slow   # a whole recipe run (~10 s alone, ~50 s on the loaded 2-core machine)
def test_tan_proxies_take_the_same_steps_at_the_smaller_noise(tmp_path):
    data = load_dataset("digits")
    result = run_recipe(TrainConfig(**BASE), out=tmp_path / "t", data=data,
                        lr_grid=(1.0,), clip_grid=(1.0,), lr_factors=(1.0,), tan_batch=16,
                        tolerance=1.0, **QUIET)
    (proxy,) = result.private_sweep
    assert proxy.probe.batch_size == 16
    assert proxy.probe.noise_multiplier == pytest.approx(result.noise_multiplier * 16 / 256)
    assert proxy.probe.steps == result.clip_sweep[0].probe.steps
    # Not private at the target: its own ε (rigorous RDP) is far above the final run's.
    assert proxy.accountant == "rdp" and proxy.epsilon > 10 * result.final.epsilon
    text = (result.out / "privacy_report.md").read_text()
    assert "fixed-noise proxies" in text and "not private at the target ε" in text
