"""``dpfy train``'s BatchNorm settings (docs/guide/batchnorm.md), one field per flag.

A base of :class:`~dpfy.train.config.TrainConfig`, kept here so that the configuration module
does not grow; the values are checked where they are used (:mod:`dpfy.train.batchnorm`, which
calls :func:`dpfy.layers.batchnorm_setup.setup_batchnorm`). Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["BatchNormFields", "help_field"]


def help_field(default: Any, help: str) -> Any:
    """A configuration field: its default and its ``--help`` text."""
    return field(default=default, metadata={"help": help})


_f = help_field


@dataclass(frozen=True)
class BatchNormFields:
    """The BatchNorm fields of the training configuration."""

    batchnorm: str | None = _f(
        None,
        "BatchNorm statistics of a model with BatchNorm (--model batchnorm_cnn): 'public' "
        "(from --bn-public-data, declared public, outside the guarantee) or 'privatized' (each "
        "step's batch mean and mean of squares released with Gaussian noise and recorded in "
        "the ledger); default none: BatchNorm is refused",
    )
    bn_bound: float | None = _f(
        None,
        "with --batchnorm privatized: the activation bound A each example's per-channel mean "
        "is clipped to (its mean of squares to A²); sensitivities A·√C and A²·√C; a declared "
        "bound, required (no default)",
    )
    bn_share: float | None = _f(
        None,
        "with --batchnorm privatized: the share of each step's privacy (Gaussian precision) "
        "the statistics take; a calibrated σ is split so the run still spends --epsilon "
        "(default 0.3, chosen on a validation split; unless --bn-noise-multiplier)",
    )
    bn_noise_multiplier: float | None = _f(
        None, "with --batchnorm privatized: σ_bn of every statistics release instead of a share"
    )
    bn_public_data: str | None = _f(
        None,
        "with --batchnorm public: 'digits' (scikit-learn's bundled handwritten digits, "
        "upscaled; Fashion-MNIST only) (default digits)",
    )
