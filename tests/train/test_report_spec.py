"""The run report's mechanism words are read from the run spec (``optimizer.spec``), the
values the run was built with, not re-derived from the command line's config."""

from types import SimpleNamespace

from dpfy.spec import BatchNormStatistics, ClippingSpec, Gaussian, RunSpec
from dpfy.train.batchnorm import public_statistics_statement
from dpfy.train.report import batchnorm_description, clip_description


def _private(spec: RunSpec):
    return SimpleNamespace(optimizer=SimpleNamespace(spec=spec, method=None))


def test_clipping_words_come_from_the_spec():
    spec = RunSpec(noise=Gaussian(1.0), clipping=ClippingSpec("microbatch", 0.5, 4))
    assert clip_description(_private(spec)).startswith(
        "clip 0.5, microbatch clipping (the mean gradient of each microbatch of 4 rows"
    )
    assert "2C = 1," in clip_description(_private(spec))  # sensitivity 2 × 0.5
    flat = RunSpec(noise=Gaussian(1.0), clipping=ClippingSpec("per_layer", 2.0))
    assert clip_description(_private(flat)) == "clip 2, per_layer clipping"


def test_batchnorm_words_come_from_the_spec():
    assert batchnorm_description(RunSpec()) == "" and public_statistics_statement(None) is None
    public = RunSpec(batchnorm=BatchNormStatistics("public", public_data="forty images"))
    assert "computed from forty images, declared public" in public_statistics_statement(public)
    privatized = RunSpec(
        batchnorm=BatchNormStatistics("privatized", 2.0, 0.3, noise_multiplier=12.5, releases=4)
    )
    words = batchnorm_description(privatized)
    assert "[−2, 2]" in words and "4 Gaussian releases per step at σ_bn = 12.5" in words
    assert public_statistics_statement(privatized) is None
