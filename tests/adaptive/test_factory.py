"""make_schedule: names, options and presets map to the right schedules; bad input is clear."""

import pytest

import dpfy.adaptive as adaptive
from dpfy.adaptive import DynamicDPSGD, NoiseDecay, make_schedule

BUDGET = dict(target_epsilon=2.0, delta=1e-5, sample_rate=0.01, total_steps=300,
              steps_per_epoch=100, max_grad_norm=1.5)


def test_all_names_resolve():
    for n in adaptive.__all__:                            # STYLE: __all__ is checked, not trusted
        getattr(adaptive, n)


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="schedule must be one of .*'dynamic'.*'time'"):
        make_schedule("cosine", **BUDGET)


def test_unknown_option_is_refused():
    with pytest.raises(ValueError, match="options must be among"):
        make_schedule("time", rate=1.0, sigma0=3.0, **BUDGET)
    with pytest.raises(ValueError, match="options must be among"):
        make_schedule("dynamic", rho=2.0, accountant="gdp", approximate=True, **BUDGET)


@pytest.mark.parametrize("preset, rho_mu, rho_c", [("vanilla", 1, 1), ("growing_mu", 3, 1),
                                                   ("sensitivity_decay", 1, 5), ("dynamic", 3, 5)])
def test_presets_set_only_their_ratios(preset, rho_mu, rho_c):
    s = make_schedule(preset, rho_mu=3, rho_c=5, accountant="gdp", approximate=True,
                      **BUDGET)
    assert isinstance(s, DynamicDPSGD)
    assert (s.rho_mu, s.rho_c, s.clip0, s.total_steps) == (rho_mu, rho_c, 1.5, 300)


def test_dynamic_refuses_unknown_calibration():
    with pytest.raises(ValueError, match="calibration must be one of \\['gdp', 'pld', 'rdp'\\]"):
        make_schedule("dynamic", accountant="moments", **BUDGET)


def test_polynomial_final_ratio_above_one_is_refused():
    with pytest.raises(ValueError, match="final_ratio must be in \\(0, 1\\]"):
        make_schedule("polynomial", rate=1.0, final_ratio=1.5, **BUDGET)


def test_plateau_with_explicit_sigma_is_built():
    s = make_schedule("plateau", initial=3.0, factor=0.8, **BUDGET)
    assert (s.initial, s.factor, s.total_steps) == (3.0, 0.8, 300)


def test_noise_decay_per_epoch_default_and_polynomial_period():
    s = make_schedule("polynomial", rate=1.0, final_ratio=0.5, initial=50.0, **BUDGET)
    assert isinstance(s, NoiseDecay) and s.per == "epoch" and s.period == 2   # 3 epochs -> 0..2
    assert s.noise_multiplier(299) == pytest.approx(25.0)                      # σ_end at the end


def test_r1_file_and_test_file_for_each_schedule_key():
    # STYLE R1: key -> adaptive/<key or FILE_ALIASES[key]>.py and tests/adaptive/test_<key>.py
    import inspect
    from pathlib import Path

    here = Path(__file__).parent
    for key in ("noise_decay", "plateau", "dynamic", "clip_schedule"):
        file = adaptive.FILE_ALIASES.get(key, key)
        assert inspect.getfile(adaptive.REGISTRY[key]).endswith(f"adaptive/{file}.py")
        assert (here / f"test_{key}.py").exists()
