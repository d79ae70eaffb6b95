"""Individual (per-example) accounting of a DP-SGD run (Yu et al.), on a Fashion-MNIST subset.

Logistic regression, 8,000 training images (the label-DP experiment's permutation, seed
1234), DP-SGD via make_private: Poisson sampling, batch 256 (q = 0.032), 10 epochs (320
steps), C = 1, lr 1, ε = 3 at δ = 1e-5 (RDP), seed 0. The norms of all 8,000 examples are
refreshed every K = 32 steps (10 refreshes) with dpfy.norm_tracker and rounded up to the grid
r = 0.01. Writes results.json (quantiles, correlations), report.md and histogram.png.
These per-example ε values are data-dependent: an analysis, not a guarantee.
"""

import json
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.data import load_dataset
from dpfy.data.splits import holdout_indices
from dpfy.models import build_model
from dpfy.norm_tracker import NormTracker

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
N, BATCH, EPOCHS, C, EPS, DELTA, K, R = 8000, 256, 10, 1.0, 3.0, 1e-5, 32, 0.01
here = Path(__file__).parent
data = load_dataset("fashion_mnist")
x_all, y_all = data.train.tensors
tr, _ = holdout_indices(len(y_all), N, 0, seed=1234)
x, y = x_all[tr], y_all[tr]
t0 = time.time()
torch.manual_seed(0)
model = build_model("logreg", input_shape=data.input_shape, num_classes=10)
model, opt, loader = dpfy.make_private(
    model, torch.optim.SGD(model.parameters(), lr=1.0),
    DataLoader(TensorDataset(x, y), batch_size=BATCH), target_epsilon=EPS, target_delta=DELTA,
    epochs=EPOCHS, max_grad_norm=C, seed=0, accountant="rdp")
tracker = NormTracker(model, F.cross_entropy, x, y, clip=C, refresh_every=K)
for _ in range(EPOCHS):
    for xb, yb in loader:
        tracker.before_step()
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
res = tracker.epsilons(opt.ledger, delta=DELTA, rounding=R)
unrounded = tracker.epsilons(opt.ledger, delta=DELTA, rounding=None) if N <= 2000 else None
final_loss = tracker.final_losses()
mean_loss = np.mean(np.stack(tracker.losses), axis=0)
out = dict(
    settings=dict(n=N, batch=BATCH, epochs=EPOCHS, clip=C, epsilon=EPS, delta=DELTA, K=K,
                  rounding=R, steps=opt.ledger.num_steps, seconds=None),
    run_epsilon_rdp=res.run_epsilon,
    quantiles=res.quantiles(),
    fraction_below_half_run_epsilon=float(np.mean(res.epsilons < res.run_epsilon / 2)),
    corr_final_loss=res.loss_correlation(final_loss),
    corr_mean_loss_over_refreshes=res.loss_correlation(mean_loss),
    mean_ratio_per_refresh=[float(r.mean()) for r in tracker.ratios],
)
out["settings"]["seconds"] = time.time() - t0
(here / "results.json").write_text(json.dumps(out, indent=1))
(here / "report.md").write_text(res.report(final_loss))
res.plot(here / "histogram.png")
print(json.dumps(out, indent=1))
