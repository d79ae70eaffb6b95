"""Private training runs: configuration, the training loop, outputs and resume.

``train(TrainConfig(...), out="runs/x")`` or ``dpfy train --out runs/x``.
"""

from dpfy.train.config import TrainConfig, load_config_file
from dpfy.train.trainer import TrainResult, resume, train

__all__ = ["TrainConfig", "TrainResult", "load_config_file", "train", "resume"]
