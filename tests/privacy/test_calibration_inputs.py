"""The calibrators' shared keyword groups (issue 37): declared once, checked as named keywords.

``calibrate_noise_multiplier``, ``calibrate_sample_rate``, ``calibrate_steps``,
``calibrate_sigma``, ``calibrate_schedule_scale``, ``calibrate_grid_noise_multiplier`` and
``hyfree_noise_split`` take their target (and sampling) as ``**target: Unpack[...]`` of one
TypedDict (:mod:`dpfy.privacy.calibration_inputs`). Python does not check such a ``**target``
at run time, so a misspelt keyword would be swallowed silently (a misspelt ``accountant``
silently calibrating with the default one): these tests fail unless each calibrator raises the
TypeError Python raises for a named keyword-only parameter, before any accountant runs. The
expected texts are Python's own, read from a stub with named parameters in the test.
"""

import time
from pathlib import Path

import pytest

from dpfy.privacy.calibration import (
    calibrate_noise_multiplier,
    calibrate_sample_rate,
    calibrate_schedule_scale,
    calibrate_sigma,
    calibrate_steps,
    hyfree_noise_split,
)
from dpfy.privacy.events import Poisson
from dpfy.privacy.tuning import calibrate_grid_noise_multiplier

Q, T, D = 0.01, 100, 1e-5
# each calibrator with its own arguments, the target keywords given by the caller
CALLS = {
    "calibrate_noise_multiplier": lambda **kw: calibrate_noise_multiplier(
        sample_rate=Q, steps=T, **kw
    ),
    "calibrate_sample_rate": lambda **kw: calibrate_sample_rate(
        noise_multiplier=1.0, steps=T, **kw
    ),
    "calibrate_steps": lambda **kw: calibrate_steps(noise_multiplier=1.0, sample_rate=Q, **kw),
    "calibrate_sigma": lambda **kw: calibrate_sigma(Poisson(Q), T, **kw),
    "calibrate_schedule_scale": lambda **kw: calibrate_schedule_scale(
        shape=[1.0, 0.9], sample_rate=Q, **kw
    ),
    "calibrate_grid_noise_multiplier": lambda **kw: calibrate_grid_noise_multiplier(
        sample_rate=Q, steps=T, runs=3, **kw
    ),
    "hyfree_noise_split": lambda **kw: hyfree_noise_split(
        sample_rate=Q, steps=T, probe_every=10, **kw
    ),
}
TARGET = {"target_epsilon": 3.0, "delta": D}


def _python_says(name, **kwargs):
    """The TypeError text Python gives for a function ``name`` whose target keywords are
    named keyword-only parameters (as the calibrators' were before the keyword groups)."""

    def stub(*, target_epsilon, delta, accountant="rdp", approximate=False):
        pass

    with pytest.raises(TypeError) as raised:
        stub(**kwargs)
    return str(raised.value).replace(f"{stub.__qualname__}()", f"{name}()", 1)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_misspelt_keyword_is_refused_as_python_refuses_it(name):
    start = time.process_time()
    with pytest.raises(TypeError) as raised:
        CALLS[name](**TARGET, accountnt="pld")
    assert str(raised.value) == _python_says(name, **TARGET, accountnt="pld")
    assert str(raised.value) == f"{name}() got an unexpected keyword argument 'accountnt'"
    assert time.process_time() - start < 1.0  # refused before any accountant runs


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("given", [{"target_epsilon": 3.0}, {"delta": D}, {}])
def test_a_missing_target_keyword_is_refused_as_python_refuses_it(name, given):
    with pytest.raises(TypeError) as raised:
        CALLS[name](**given)
    assert str(raised.value) == _python_says(name, **given)
    assert "missing" in str(raised.value) and "required keyword-only argument" in str(raised.value)


@pytest.mark.parametrize(
    "name, keyword",
    [
        # a keyword of a larger group is not taken by a calibrator of a smaller one
        ("calibrate_sigma", "sampling"),  # the kind says the sampling
        ("hyfree_noise_split", "dataset_size"),  # Poisson only
        ("calibrate_schedule_scale", "max_examples_per_user"),  # no ELS schedules
        ("calibrate_grid_noise_multiplier", "max_examples_per_user"),
        ("calibrate_steps", "tol"),  # an exact integer search
    ],
)
def test_a_keyword_of_another_group_is_refused(name, keyword):
    with pytest.raises(
        TypeError, match=f"^{name}\\(\\) got an unexpected keyword argument '{keyword}'$"
    ):
        CALLS[name](**TARGET, **{keyword: None})


@pytest.mark.parametrize("name", sorted(CALLS))
def test_the_target_checks_still_come_first(name):
    # the target's refusal, unchanged, before the calibrator's own checks run
    with pytest.raises(ValueError, match="target_epsilon must be <= 100"):
        CALLS[name](target_epsilon=200.0, delta=D)
    with pytest.raises(ValueError, match="delta must be"):
        CALLS[name](target_epsilon=3.0, delta=2.0)


# A target or a run only below the PLD accountant's floor (σ >= 0.293 on its grid): PLD refuses
# it at once, RDP answers (test_input_bounds.py), so the two accountants are told apart in
# about a second. q = 0.5 and one step at ε = 90 need σ ≈ 0.1 (RDP); σ = 0.15 is below the floor
# (three steps of it need q < 1: unsampled steps have no floor).
BELOW_FLOOR = {
    "calibrate_noise_multiplier": lambda **kw: calibrate_noise_multiplier(
        sample_rate=0.5, steps=1, **kw
    ),
    "calibrate_sample_rate": lambda **kw: calibrate_sample_rate(
        noise_multiplier=0.15, steps=3, **kw
    ),
    "calibrate_steps": lambda **kw: calibrate_steps(
        noise_multiplier=0.15, sample_rate=0.5, max_steps=3, **kw
    ),
    "calibrate_sigma": lambda **kw: calibrate_sigma(Poisson(0.5), 1, **kw),
    "calibrate_schedule_scale": lambda **kw: calibrate_schedule_scale(
        shape=[1.0, 0.5], sample_rate=0.5, **kw
    ),
    "calibrate_grid_noise_multiplier": lambda **kw: calibrate_grid_noise_multiplier(
        sample_rate=0.5, steps=1, runs=1, **kw
    ),
    "hyfree_noise_split": lambda **kw: hyfree_noise_split(
        sample_rate=0.5, steps=1, probe_every=1, **kw
    ),
}


@pytest.mark.parametrize("name", sorted(BELOW_FLOOR))
def test_the_default_accountant_is_each_calibrators_own(name):
    # Omitted, the accountant is the one the signatures had: "rdp", but "pld" for
    # calibrate_schedule_scale.
    call = BELOW_FLOOR[name]
    with pytest.raises(ValueError, match=r"(noise multiplier|noise_multiplier must be) >= 0.293"):
        call(target_epsilon=90.0, delta=D, accountant="pld")
    if name == "calibrate_schedule_scale":
        with pytest.raises(ValueError, match=r"noise multiplier >= 0.293 \(the PLD"):
            call(target_epsilon=90.0, delta=D)
    else:
        assert call(target_epsilon=90.0, delta=D) == call(
            target_epsilon=90.0, delta=D, accountant="rdp"
        )


# Each call marked "# error" must be a mypy error on its line, and only those.
MYPY_CALLS = """\
from dpfy.privacy.calibration import calibrate_noise_multiplier as cnm, calibrate_steps as cs
from dpfy.privacy.calibration_schedule import calibrate_schedule_scale as css
from dpfy.privacy.ledger import Sampling

cnm(target_epsilon=3.0, delta=1e-5, sample_rate=0.01, steps=10, accountant="pld")
cnm(target_epsilon=3.0, delta=1e-5, sample_rate=0.01, steps=10, sampling=Sampling.ELS,
    max_examples_per_user=2, dataset_size=100)
cnm(target_epsilon=3.0, delta=1e-5, sample_rate=0.01, steps=10, accountnt="pld")  # error
cnm(target_epsilon=3.0, sample_rate=0.01, steps=10)  # error
cnm(target_epsilon="3", delta=1e-5, sample_rate=0.01, steps=10)  # error
cs(target_epsilon=3.0, delta=1e-5, noise_multiplier=1.0, sample_rate=0.1, tol=1.0)  # error
css(shape=[1.0], target_epsilon=3.0, delta=1e-5, sample_rate=0.1)
css(shape=[1.0], target_epsilon=3.0, delta=1e-5, sample_rate=0.1, max_examples_per_user=2)  # error
"""


@pytest.mark.slow
def test_mypy_checks_the_keyword_groups_at_call_sites(tmp_path, monkeypatch):
    # mypy reads the TypedDicts (PEP 692): a misspelt, missing, mistyped or foreign keyword in
    # a call is a type error at the call, as it was with named parameters; correct calls are
    # not. Slow: mypy reads dpfy.privacy and what it imports (about 20 s of CPU, no cache).
    api = pytest.importorskip("mypy.api")
    import dpfy

    (tmp_path / "calls.py").write_text(MYPY_CALLS)
    monkeypatch.setenv("MYPYPATH", str(Path(dpfy.__file__).parents[1]))  # this dpfy's source
    out, _, _ = api.run(
        [
            str(tmp_path / "calls.py"),
            "--python-version",
            "3.11",
            "--ignore-missing-imports",
            "--follow-imports",
            "silent",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-error-summary",
        ]
    )
    errors = [line for line in out.splitlines() if ": error:" in line]
    marked = [i for i, line in enumerate(MYPY_CALLS.splitlines(), 1) if line.endswith("# error")]
    assert [int(e.split(":")[1]) for e in errors] == marked, out
    assert 'Unexpected keyword argument "accountnt"' in errors[0]
    assert 'Missing named argument "delta"' in errors[1]
    assert 'Argument "target_epsilon"' in errors[2] and '"float"' in errors[2]
    assert 'Unexpected keyword argument "tol" for "calibrate_steps"' in errors[3]
    assert 'Unexpected keyword argument "max_examples_per_user"' in errors[4]


def test_help_shows_every_keyword_with_its_default():
    # **target hides the target keywords from help() and inspect.signature; each calibrator
    # spells them out again, with the defaults target_from applies
    import inspect

    from dpfy.privacy.calibration import calibrate_noise_multiplier, calibrate_schedule_scale
    from dpfy.privacy.ledger import Sampling

    params = inspect.signature(calibrate_noise_multiplier).parameters
    assert params["target_epsilon"].default is inspect.Parameter.empty
    assert params["delta"].default is inspect.Parameter.empty
    assert params["accountant"].default == "rdp" and params["approximate"].default is False
    assert params["sampling"].default is Sampling.POISSON
    assert params["max_examples_per_user"].default is None
    assert "target" not in params  # no **target left
    assert inspect.signature(calibrate_schedule_scale).parameters["accountant"].default == "pld"
