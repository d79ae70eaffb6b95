"""PUR (Fay et al., data-independent, convex bound) against constant σ, DP-SGD on Fashion-MNIST
logistic regression. Small on purpose (shared CPU): 8,000 training images + 2,000 validation
images carved from the official training split (fixed permutation, seed 1234), official test
set read once per arm after selection. Poisson sampling, batch 256 (q = 0.032), 10 epochs,
C = 1, δ = 1e-5, ε ∈ {1, 3} by RDP, plain SGD. Both arms get the same three effective step
sizes η ∈ {0.5, 1, 2} (PUR: η = 1/(2M), i.e. declared M ∈ {1, 0.5, 0.25}; constant: lr = η);
per arm the η with the best mean validation accuracy over seeds 0, 1, 2 is selected and its
test accuracy reported. Writes results.json.

Usage: PYTHONPATH=src python -m experiments.pur.run
"""

import json
import time
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive import make
from dpfy.models import build_model
from experiments.fmnist_holdout import acc, load_holdout, sgd_epochs

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
N_TRAIN, N_VAL, BATCH, EPOCHS, C = 8000, 2000, 256, 10, 1.0
ETAS, SEEDS, EPSILONS = (0.5, 1.0, 2.0), (0, 1, 2), (1.0, 3.0)

data, (x_all, y_all), (tr, va), (xt, yt) = load_holdout(N_TRAIN, N_VAL)


def run(arm, eta, eps, seed):
    torch.manual_seed(seed)
    model = build_model("logreg", input_shape=data.input_shape, num_classes=10)
    loader = DataLoader(TensorDataset(x_all[tr], y_all[tr]), batch_size=BATCH)
    if arm == "pur":
        method, lr = make("pur", smoothness=1 / (2 * eta)), 1.0
    else:
        method, lr = None, eta
    model, opt, loader = dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=lr), loader, method=method,
        target_epsilon=eps, target_delta=1e-5, epochs=EPOCHS, max_grad_norm=C, seed=seed,
        accountant="rdp")
    sgd_epochs(model, opt, loader, EPOCHS)
    sig = [r.noise_multiplier for g in opt.ledger.step_groups for r in g.releases]
    return dict(arm=arm, eta=eta, epsilon=eps, seed=seed, val=acc(model, x_all[va], y_all[va]),
                test=acc(model, xt, yt), sigma_first=sig[0], sigma_last=sig[-1],
                steps=opt.ledger.num_steps)


rows, t0 = [], time.time()
for eps in EPSILONS:
    for arm in ("constant", "pur"):
        for eta in ETAS:
            for seed in SEEDS:
                rows.append(run(arm, eta, eps, seed))
                print(rows[-1], f"{time.time() - t0:.0f}s", flush=True)
settings = dict(n_train=N_TRAIN, n_val=N_VAL, batch=BATCH, epochs=EPOCHS, clip=C, etas=ETAS,
                seeds=SEEDS, epsilons=EPSILONS, delta=1e-5, accountant="rdp", seconds=time.time() - t0)
Path(__file__).with_name("results.json").write_text(json.dumps(dict(settings=settings, rows=rows), indent=1))
