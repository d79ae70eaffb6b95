"""``dpfy train --batchnorm public|privatized``: the run's BatchNorm statistics.

:func:`batchnorm_options` turns the config's BatchNorm fields into ``make_private``'s
keywords (``batchnorm=``, ``public_data=``, ``bn_bound=``, ...): ``make_private`` converts the
model's BatchNorms, records the statistics in the run spec and attaches privatized statistics
to the run it builds. Public statistics come from scikit-learn's bundled
digits (:mod:`dpfy.data.public_digits`), the one public image set available offline here, for
Fashion-MNIST.
"""

from __future__ import annotations

from typing import Any

from dpfy._require import require
from dpfy.data import DataSplits
from dpfy.data.fashion_mnist import MEAN, STD
from dpfy.data.public_digits import DESCRIPTION, digits_images
from dpfy.spec import RunSpec
from dpfy.train.config import TrainConfig

__all__ = ["batchnorm_options", "public_statistics_statement"]


def batchnorm_options(cfg: TrainConfig, data: DataSplits) -> dict[str, Any]:
    """``make_private``'s BatchNorm keywords as ``cfg.batchnorm`` says (all None without it)."""
    require(
        cfg.bn_public_data is None or cfg.batchnorm == "public",
        "bn_public_data",
        cfg.bn_public_data,
        "unset unless --batchnorm public",
        "Drop --bn-public-data, or pass --batchnorm public",
    )
    require(
        cfg.batchnorm is not None or cfg.model != "batchnorm_cnn",
        "batchnorm",
        cfg.batchnorm,
        "'public' or 'privatized' with --model batchnorm_cnn (its BatchNorm mixes the "
        "examples of a batch)",
        "Pass --batchnorm privatized --bn-bound A, or --batchnorm public (Fashion-MNIST), or "
        "use --model groupnorm_cnn",
    )
    public = None
    if cfg.batchnorm == "public":
        which = cfg.bn_public_data or "digits"
        require(which == "digits", "bn_public_data", which, "'digits'")
        require(
            cfg.dataset == "fashion_mnist",
            "dataset",
            cfg.dataset,
            "fashion_mnist with --bn-public-data digits (1-channel images on its scale)",
            "Use --batchnorm privatized, or the Python API with your own public data",
        )
        _, height, width = data.input_shape
        public = digits_images(height, width, mean=MEAN, std=STD)
    return {
        "batchnorm": cfg.batchnorm,
        "public_data": public,
        "public_description": DESCRIPTION if public is not None else None,
        "bn_bound": cfg.bn_bound,
        "bn_noise_multiplier": cfg.bn_noise_multiplier,
        "bn_share": cfg.bn_share,
    }


def public_statistics_statement(spec: RunSpec | None) -> str | None:
    """The report's statement about the public BatchNorm data the run spec names, or None."""
    bn = spec.batchnorm if spec is not None else None
    if bn is None or bn.kind != "public":
        return None
    return (
        f"the BatchNorm statistics were computed from {bn.public_data}, declared public "
        f"(batchnorm='public'): the guarantee does not cover that data"
    )
