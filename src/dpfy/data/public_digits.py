"""scikit-learn's bundled handwritten digits as public images for BatchNorm statistics.

The 1,797 8×8 digits (UCI optdigits) ship inside scikit-learn's wheel, so they load offline: a
dataset that is really public and disjoint from any private training set. For the public
BatchNorm statistics of a 1-channel image model (``dpfy train --batchnorm public``) they are
scaled to [0, 1], upscaled bilinearly to the private images' size and standardized with the
private dataset's *public* constants (Fashion-MNIST's mean and std), so their pixels live on the
same scale as the private inputs. Their distribution is not Fashion-MNIST's: the statistics
are a public approximation (experiments/batchnorm measures what that costs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dpfy.data.sklearn_sets import sklearn_datasets

__all__ = ["DESCRIPTION", "digits_images"]

DESCRIPTION = "scikit-learn's bundled digits (1,797 8x8 images, upscaled)"


def digits_images(height: int, width: int, *, mean: float, std: float) -> torch.Tensor:
    """(1797, 1, height, width) float32: the digits in [0, 1], upscaled, then (x − mean)/std."""
    images = torch.from_numpy(sklearn_datasets().load_digits().images / 16.0).float()[:, None]
    up = F.interpolate(images, size=(height, width), mode="bilinear", align_corners=False)
    return (up - mean) / std
