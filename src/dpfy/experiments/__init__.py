"""Paper reproductions: a grid of run specs, a resumable runner, and tables + plots.

``dpfy experiment dynamic-fmnist`` / ``noise-decay-fmnist`` (see :mod:`dpfy.experiments.grids`
for every setting and what differs from the papers).
"""

from dpfy.experiments.grids import EXPERIMENTS, build_grid
from dpfy.experiments.spec import RunSpec

__all__ = ["EXPERIMENTS", "RunSpec", "build_grid"]
