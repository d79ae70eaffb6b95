"""Constant σ, PUR (Fay et al., data-independent, convex bound) and PUR-data (the data-dependent
rule, ``pur_data``) with DP-SGD on Fashion-MNIST: logistic regression and the tanh CNN.

Small on purpose (a shared 2-core CPU): 8,000 training images and 2,000 validation images carved
from the official training split (``holdout_indices``, seed 1234, the split of the other
Fashion-MNIST experiments); the official test set read once per configuration, after selection
by mean validation accuracy over the seeds. Poisson sampling, batch 256 (q = 0.032), C = 1,
δ = 1e-5, RDP. Every arm is calibrated to the same ε and sees the same effective step sizes η:
constant σ with lr = η; ``pur`` and ``pur_data`` with declared M = 1/(2η) (step_size="pur",
optimizer lr 1, so the step is η). ``pur_data``: min_ratio 0.5, 5 % of each step's budget for
the norm release, moving-average weight 0.9.

- logreg: plain SGD, 10 epochs, η ∈ {0.5, 1, 2}, ε ∈ {1, 3}, seeds 0–2.
- tanh CNN: SGD with momentum 0.9, 6 epochs, η ∈ {0.05, 0.1, 0.2}, ε = 3, seeds 0–1.

Usage: PYTHONPATH=src python -m experiments.pur.compare [logreg|cnn ...]  (writes
results_compare_<model>.json beside this file); ``compare.py --table [logreg|cnn ...]`` prints
the README's rows from them.
"""

import json
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive import make
from dpfy.models import build_model
from dpfy.privacy.accountants import epsilon
from experiments.fmnist_holdout import acc, load_holdout

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
N_TRAIN, N_VAL, BATCH, C, DELTA = 8000, 2000, 256, 1.0, 1e-5
ARMS = ("constant", "pur", "pur_data")
SETTINGS = {
    "logreg": dict(model="logreg", epochs=10, momentum=0.0, etas=(0.5, 1.0, 2.0),
                   epsilons=(1.0, 3.0), seeds=(0, 1, 2)),
    "cnn": dict(model="tanh_cnn", epochs=6, momentum=0.9, etas=(0.05, 0.1, 0.2), epsilons=(3.0,),
                seeds=(0, 1)),
}  # fmt: skip

data, (x_all, y_all), (tr, va), (xt, yt) = load_holdout(N_TRAIN, N_VAL)


def method_of(arm, eta):
    if arm == "constant":
        return None, eta
    return make(arm, smoothness=1 / (2 * eta)), 1.0


def run(s, arm, eta, eps, seed):
    torch.manual_seed(seed)
    model = build_model(s["model"], input_shape=data.input_shape, num_classes=10)
    method, lr = method_of(arm, eta)
    model, opt, loader = dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=lr, momentum=s["momentum"]),
        DataLoader(TensorDataset(x_all[tr], y_all[tr]), batch_size=BATCH), method=method,
        target_epsilon=eps, target_delta=DELTA, epochs=s["epochs"], max_grad_norm=C,
        seed=seed, accountant="rdp")  # fmt: skip
    applied = []  # σ of the gradient the optimizer stepped on, per step
    for _ in range(s["epochs"]):
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            factor = 1.0
            if arm == "pur_data":  # σ_t/σ_g from the state before the step (released values)
                factor = max(1.0, opt.method.ratio(opt.method_state) / opt.method.min_ratio)
            opt.step()
            applied.append(opt.last_step_info["noise_multiplier"] * factor)
    spent = epsilon(opt.ledger, delta=DELTA, accountant="rdp")
    row = dict(arm=arm, eta=eta, epsilon=eps, seed=seed, val=acc(model, x_all[va], y_all[va]),
               sigma_first=applied[0], sigma_last=applied[-1],
               sigma_mean=sum(applied) / len(applied), epsilon_spent=spent,
               steps=opt.ledger.num_steps)  # fmt: skip
    return row, model


def select_then_test(rows, models):
    """Per (arm, ε): the η with the best mean validation accuracy over the seeds; only its
    models are evaluated on the test set (once each)."""
    for key in {(r["arm"], r["epsilon"]) for r in rows}:
        mine = [r for r in rows if (r["arm"], r["epsilon"]) == key]
        etas = sorted({r["eta"] for r in mine})
        mean_val = {e: sum(r["val"] for r in mine if r["eta"] == e) / len(
            [r for r in mine if r["eta"] == e]) for e in etas}  # fmt: skip
        best = max(etas, key=lambda e: mean_val[e])
        for r in mine:
            r["selected"] = r["eta"] == best
            if r["selected"]:
                r["test"] = acc(models[id(r)], xt, yt)


def main(names):
    for name in names:
        s, rows, models, t0 = SETTINGS[name], [], {}, time.time()
        for eps in s["epsilons"]:
            for arm in ARMS:
                for eta in s["etas"]:
                    for seed in s["seeds"]:
                        row, models[id(row)] = run(s, arm, eta, eps, seed)
                        rows.append(row)
                        print(name, row, f"{time.time() - t0:.0f}s", flush=True)
        select_then_test(rows, models)
        out = dict(settings=dict(s, n_train=N_TRAIN, n_val=N_VAL, batch=BATCH, clip=C,
                                 delta=DELTA, accountant="rdp", seconds=time.time() - t0),
                   rows=rows)  # fmt: skip
        path = Path(__file__).with_name(f"results_compare_{name}.json")
        path.write_text(json.dumps(out, indent=1))


def table(name):
    """The README's Markdown rows from results_compare_<name>.json: per ε and arm, the selected
    η's test accuracy (mean ± sample std over seeds), its validation mean, σ first → last
    (seed 0), σ averaged over steps and seeds, the ledger's ε (seed 0)."""
    rows = json.loads(Path(__file__).with_name(f"results_compare_{name}.json").read_text())["rows"]
    out = []
    for eps in sorted({r["epsilon"] for r in rows}):
        for arm in ARMS:
            sel = [r for r in rows if r["epsilon"] == eps and r["arm"] == arm and r["selected"]]
            test = torch.tensor([100 * r["test"] for r in sel], dtype=torch.float64)
            val = sum(100 * r["val"] for r in sel) / len(sel)
            std = float(test.std()) if len(sel) > 1 else float("nan")
            mean_sigma = sum(r["sigma_mean"] for r in sel) / len(sel)
            out.append(f"| {name} | {eps:g} | {arm} | {sel[0]['eta']:g} | {val:.2f} | "
                       f"{float(test.mean()):.2f} ± {std:.2f} | {sel[0]['sigma_first']:.2f} → "
                       f"{sel[0]['sigma_last']:.2f} | {mean_sigma:.2f} | "
                       f"{sel[0]['epsilon_spent']:.3f} |")  # fmt: skip
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:
        print("\n".join(table(n) for n in sys.argv[2:] or list(SETTINGS)))
    else:
        main(sys.argv[1:] or list(SETTINGS))
