"""Dynamic DP-SGD and noise decay on Fashion-MNIST: a grid of run specs, and tables + plots.

``python -m experiments dynamic-fmnist`` / ``noise-decay-fmnist`` (see :mod:`experiments.dynamic_fmnist.grids`
for every setting and what differs from the papers).
"""

from experiments.dynamic_fmnist.grids import EXPERIMENTS, build_grid
from experiments.dynamic_fmnist.spec import RunSpec

__all__ = ["EXPERIMENTS", "RunSpec", "build_grid"]
