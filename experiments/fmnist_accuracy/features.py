"""Compute (and cache) Fashion-MNIST's scattering features once: DPFY_CACHE_DIR decides where."""
import time

import torch

from dpfy.data.scattering_features import cache_dir, load_fashion_mnist_scattering

torch.set_num_threads(2)
t0 = time.time()
data = load_fashion_mnist_scattering()
print(f"features {tuple(data.train.tensors[0].shape)} train, {tuple(data.test.tensors[0].shape)} "
      f"test in {time.time() - t0:.0f} s, cached under {cache_dir()}", flush=True)
