"""Label DP on a Fashion-MNIST subset: RR and RR-with-prior at ε ∈ {0.5, 1, 2, 4, 8}, logistic
regression, 3 seeds. Small on purpose (the CPU is shared): 10,000 training images
(8,000 train + 2,000 validation carved from the official training split), the official
10,000 test images read once per (mechanism, ε, seed) after the learning rate is chosen on
the validation split (validation labels are *randomized* too: the selection reads no true
label, so it is post-processing). Example-level DP-SGD at the same ε is dpsgd_baseline.py;
see README. Writes results.json.

Usage: PYTHONPATH=src python experiments/label_dp/run.py
"""

import json
import time
from pathlib import Path

import torch

from dpfy.data import load_dataset
from dpfy.data.splits import holdout_indices
from dpfy.label_dp import fit_classifier, randomize_labels
from dpfy.models import build_model

N_TRAIN, N_VAL, EPOCHS, BATCH = 8000, 2000, 5, 128
LRS = (1e-3, 3e-3)
EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
SEEDS = (0, 1, 2)
torch.set_num_threads(1)

data = load_dataset("fashion_mnist")
x_all, y_all = data.train.tensors
kept = torch.cat(holdout_indices(len(y_all), N_TRAIN, N_VAL, seed=1234))
x, y = x_all[kept], y_all[kept]
xt, yt = data.test.tensors
tr, va = torch.arange(N_TRAIN), torch.arange(N_TRAIN, N_TRAIN + N_VAL)


def acc(model, xs, ys):
    with torch.no_grad():
        return float((model(xs).argmax(1) == ys).float().mean())


def new():
    return build_model("logreg", input_shape=data.input_shape, num_classes=10)


rows, t0 = [], time.time()
for mech in ("rr", "rr-prior"):
    for eps in EPSILONS:
        for seed in SEEDS:
            gen = torch.Generator().manual_seed(seed)
            torch.manual_seed(seed)

            def fit_predict(idx, noisy, query, gen=gen):
                with torch.enable_grad():
                    m = fit_classifier(new(), x[idx], noisy, epochs=EPOCHS, batch_size=BATCH,
                                       lr=1e-3, generator=gen)
                return torch.softmax(m(x[query]), 1)

            # the train and validation labels are randomized in one release (all 10,000)
            noisy, rel = randomize_labels(y, eps, 10, mechanism=mech, generator=gen,
                                          fit_predict=fit_predict, stage_fractions=(0.4, 0.6))
            best = None
            for lr in LRS:
                m = fit_classifier(new(), x[tr], noisy[tr], epochs=EPOCHS, batch_size=BATCH,
                                   lr=lr, generator=gen)
                v = acc(m, x[va], noisy[va])  # validation on randomized labels only
                if best is None or v > best[0]:
                    best = (v, lr, m)
            v, lr, m = best
            rows.append(dict(mechanism=mech, epsilon=eps, seed=seed, lr=lr, noisy_val_acc=v,
                             test_acc=acc(m, xt, yt), label_agreement=float((noisy == y).float().mean())))
            print(rows[-1], f"{time.time() - t0:.0f}s", flush=True)
# non-private reference: true labels
for seed in SEEDS:
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    best = None
    for lr in LRS:
        m = fit_classifier(new(), x[tr], y[tr], epochs=EPOCHS, batch_size=BATCH, lr=lr, generator=gen)
        v = acc(m, x[va], y[va])
        if best is None or v > best[0]:
            best = (v, lr, m)
    rows.append(dict(mechanism="non-private", epsilon=None, seed=seed, lr=best[1],
                     noisy_val_acc=best[0], test_acc=acc(best[2], xt, yt)))
settings = dict(n_train=N_TRAIN, n_val=N_VAL, epochs=EPOCHS, batch=BATCH, lrs=LRS, model="logreg",
                optimizer="adam", stages=(0.4, 0.6), seconds=time.time() - t0)
Path(__file__).with_name("results.json").write_text(json.dumps(dict(settings=settings, rows=rows), indent=1))
