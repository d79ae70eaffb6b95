"""Example-level DP-SGD beside the label-DP rows: the same data split, model and ε values.

8,000 training / 2,000 validation images (the same permutation as run.py), logistic
regression, DP-SGD (`dpfy.make_private`): Poisson sampling, batch 256, 10 epochs, C = 1,
δ = 1e-5 (label DP has δ = 0: example-level DP-SGD gets a δ on top, so the comparison
favours it slightly), RDP, plain SGD with lr ∈ {0.5, 1} chosen by the mean validation
accuracy over seeds 0, 1, 2 (true validation labels: this arm protects them). Writes
results_dpsgd.json.

Usage: PYTHONPATH=src python -m experiments.label_dp.dpsgd_baseline
"""

import json
import time
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.models import build_model
from experiments.fmnist_holdout import acc, load_holdout, sgd_epochs

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
N_TRAIN, N_VAL, BATCH, EPOCHS = 8000, 2000, 256, 10
data, (x_all, y_all), (tr, va), (xt, yt) = load_holdout(N_TRAIN, N_VAL)


rows, t0 = [], time.time()
for eps in (0.5, 1.0, 2.0, 4.0, 8.0):
    for lr in (0.5, 1.0):
        for seed in (0, 1, 2):
            torch.manual_seed(seed)
            model = build_model("logreg", input_shape=data.input_shape, num_classes=10)
            model, opt, loader = dpfy.make_private(
                model, torch.optim.SGD(model.parameters(), lr=lr),
                DataLoader(TensorDataset(x_all[tr], y_all[tr]), batch_size=BATCH),
                target_epsilon=eps, target_delta=1e-5, epochs=EPOCHS, max_grad_norm=1.0,
                seed=seed, accountant="rdp")
            sgd_epochs(model, opt, loader, EPOCHS)
            rows.append(dict(epsilon=eps, lr=lr, seed=seed, val=acc(model, x_all[va], y_all[va]),
                             test=acc(model, xt, yt)))
            print(rows[-1], f"{time.time() - t0:.0f}s", flush=True)
Path(__file__).with_name("results_dpsgd.json").write_text(
    json.dumps(dict(seconds=time.time() - t0, rows=rows), indent=1))
