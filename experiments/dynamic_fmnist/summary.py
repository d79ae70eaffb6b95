"""Tables (markdown) and plots (png) from a reproduction's ``results.jsonl``.

Accuracy cells are mean ± sample std over seeds (n given). ε columns are read from each run's
own ledger after training: PLD (the guarantee) and the GDP CLT (the paper's accountant, an
approximation) side by side. The paper's numbers are printed beside ours for orientation only:
model, epochs and ρ differ (see :mod:`experiments.dynamic_fmnist.grids`).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Iterable

from dpfy.adaptive.dynamic import calibrate_dynamic
from experiments.dynamic_fmnist.grids import DECAYS, EPSILONS, PRESETS, preset_options
from experiments.runner import load_results
from dpfy.privacy import epsilon

__all__ = ["summarize", "PAPER_TABLE1_FMNIST"]

# Dynamic DP-SGD (anonymous submission, under review) Table 1, FashionMNIST columns, test
# accuracy % at ε = 0.4 / 1.2 / 2.0
PAPER_TABLE1_FMNIST = {
    "vanilla": (76.77, 80.45, 82.55),
    "growing_mu": (77.81, 80.95, 83.10),
    "sensitivity_decay": (78.11, 82.83, 83.64),
    "dynamic": (78.50, 83.22, 83.81),
}
PAPER_NONPRIVATE = 87.92


def _mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _cell(xs: list[float], digits: int = 2) -> str:
    if not xs:
        return "–"
    m, s = _mean_std(xs)
    return f"{m:.{digits}f} ± {s:.{digits}f} (n={len(xs)})"


MAIN = ("dynamic-fmnist", "noise-decay-fmnist")       # the 3-epoch grids


def _main(results: Iterable[dict]) -> list[dict]:
    return [r for r in results if r["spec"]["experiment"] in MAIN]


def _group(results: Iterable[dict]) -> dict[tuple[str, float], list[dict]]:
    out: dict[tuple[str, float], list[dict]] = defaultdict(list)
    for r in results:
        out[(r["spec"]["schedule"], r["spec"]["target_epsilon"])].append(r)
    return out


def _paired_gain(a: list[dict], b: list[dict]) -> tuple[float, float, int] | None:
    """Mean ± std of acc(a) − acc(b) over seeds present in both (same seed: same init/data)."""
    acc_b = {r["spec"]["seed"]: r["test_accuracy"] for r in b}
    diffs = [r["test_accuracy"] - acc_b[r["spec"]["seed"]] for r in a if r["spec"]["seed"] in acc_b]
    if not diffs:
        return None
    m, s = _mean_std(diffs)
    return m, s, len(diffs)


def dynamic_table(results: list[dict]) -> str:
    g = _group(r for r in results if r["spec"]["experiment"] == "dynamic-fmnist")
    head = "| method | " + " | ".join(f"ε = {e}" for e in EPSILONS) + " |"
    lines = ["### Test accuracy (%), Fashion-MNIST, δ = 1/600000, every run calibrated to ε "
             "by PLD", "", head, "|---|" + "---|" * len(EPSILONS)]
    for p in PRESETS:
        ours = [_cell([r["test_accuracy"] for r in g[(p, e)]]) for e in EPSILONS]
        lines.append(f"| {p} (dpfy) | " + " | ".join(ours) + " |")
    for p in PRESETS:
        lines.append(f"| {p} (paper, GDP-calibrated) | "
                     + " | ".join(f"{v:.2f}" for v in PAPER_TABLE1_FMNIST[p]) + " |")
    lines += ["", "### Gain over vanilla (percentage points, paired by seed)", "",
              head, "|---|" + "---|" * len(EPSILONS)]
    for p in PRESETS[1:]:
        cells = []
        for e in EPSILONS:
            gain = _paired_gain(g[(p, e)], g[("vanilla", e)])
            cells.append("–" if gain is None else f"{gain[0]:+.2f} ± {gain[1]:.2f} (n={gain[2]})")
        paper = [f"{a - b:+.2f}" for a, b in zip(PAPER_TABLE1_FMNIST[p],
                                                 PAPER_TABLE1_FMNIST["vanilla"])]
        lines.append(f"| {p} − vanilla (dpfy) | " + " | ".join(cells) + " |")
        lines.append(f"| {p} − vanilla (paper) | " + " | ".join(paper) + " |")
    lines += ["", "### ε actually spent by the same runs (mean over seeds): PLD (guarantee) / "
              "GDP CLT (paper's accountant, approximation)", "", head,
              "|---|" + "---|" * len(EPSILONS)]
    for p in PRESETS:
        cells = []
        for e in EPSILONS:
            rs = g[(p, e)]
            cells.append("–" if not rs else
                         f"{statistics.fmean(r['epsilon_pld'] for r in rs):.3f} / "
                         f"{statistics.fmean(r['epsilon_gdp'] for r in rs):.3f}")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def decay_table(results: list[dict]) -> str:
    results = _main(results)
    g = _group(results)
    eps_values = sorted({r["spec"]["target_epsilon"] for r in results
                         if r["spec"]["experiment"] == "noise-decay-fmnist"})
    lines = []
    for e in eps_values:
        lines += [f"### Noise decay at ε = {e} (PLD), δ = 1/600000, per-epoch decay to σ_0/2",
                  "", "| schedule | test accuracy (%) | σ per epoch (first run) | ε PLD | ε GDP | "
                  "gain vs constant (paired) |", "|---|---|---|---|---|---|"]
        for kind in ("vanilla",) + tuple(DECAYS):
            rs = g[(kind, e)]
            if not rs:
                continue
            sig = _sigmas_per_epoch(rs[0])
            gain = _paired_gain(rs, g[("vanilla", e)]) if kind != "vanilla" else None
            name = "constant" if kind == "vanilla" else kind
            lines.append(
                f"| {name} | {_cell([r['test_accuracy'] for r in rs])} | {sig} | "
                f"{statistics.fmean(r['epsilon_pld'] for r in rs):.3f} | "
                f"{statistics.fmean(r['epsilon_gdp'] for r in rs):.3f} | "
                + ("–" if gain is None else f"{gain[0]:+.2f} ± {gain[1]:.2f}") + " |")
        lines.append("")
    return "\n".join(lines)


def calibration_audit(*, total_steps: int, sample_rate: float, delta: float) -> str:
    """The paper's GDP calibration vs rigorous PLD: what each spends under the other.

    For each preset and ε: μ_0 solved by the paper's Alg. 1 (GDP CLT) and the PLD ε of the
    schedule it gives; and μ_0 solved against PLD with the GDP ε of that schedule. No training;
    ledgers are the ones the grids' runs write (same T, q, stages).
    """
    lines = [f"### GDP-calibrated (paper) vs PLD-calibrated (dpfy) schedules, T = {total_steps}, "
             f"q = {sample_rate:.6f}, δ = {delta:.3g}", "",
             "| method | target ε | μ_0 (GDP calib.) | its ε by PLD | μ_0 (PLD calib.) | its ε by "
             "GDP |", "|---|---|---|---|---|---|"]
    for eps in EPSILONS:
        for p in PRESETS:
            opts = preset_options(p)
            kw = dict(target_epsilon=eps, delta=delta, sample_rate=sample_rate,
                      total_steps=total_steps, **opts)
            by_gdp = calibrate_dynamic(p, calibration="gdp", **kw)
            by_pld = calibrate_dynamic(p, calibration="pld", **kw)
            e_pld = epsilon(by_gdp.ledger(sample_rate=sample_rate), delta=delta, accountant="pld")
            e_gdp = epsilon(by_pld.ledger(sample_rate=sample_rate), delta=delta, accountant="gdp")
            lines.append(f"| {p} | {eps} | {by_gdp.mu0:.4f} | {e_pld:.3f} | {by_pld.mu0:.4f} | "
                         f"{e_gdp:.3f} |")
    return "\n".join(lines) + "\n"


def long_table(results: list[dict]) -> str:
    """The 10-epoch follow-up: vanilla vs dynamic at ε = 1.2."""
    rs = [r for r in results if r["spec"]["experiment"] == "dynamic-fmnist-long"]
    if not rs:
        return ""
    g = _group(rs)
    lines = ["### Follow-up: 10 epochs (2350 steps), ε = 1.2 by PLD, δ = 1/600000", "",
             "| method | test accuracy (%) | accuracy after epoch 3 / 5 / 10 (seed 0) | "
             "ε PLD | ε GDP |", "|---|---|---|---|---|"]
    for p in ("vanilla", "dynamic"):
        runs = sorted(g[(p, 1.2)], key=lambda r: r["spec"]["seed"])
        if not runs:
            continue
        curve = " / ".join(f"{runs[0]['epochs'][i - 1]['test_accuracy']:.2f}" for i in (3, 5, 10)
                           if i <= len(runs[0]["epochs"]))
        lines.append(f"| {p} | {_cell([r['test_accuracy'] for r in runs])} | {curve} | "
                     f"{statistics.fmean(r['epsilon_pld'] for r in runs):.3f} | "
                     f"{statistics.fmean(r['epsilon_gdp'] for r in runs):.3f} |")
    gain = _paired_gain(g[("dynamic", 1.2)], g[("vanilla", 1.2)])
    if gain:
        lines += ["", f"dynamic − vanilla, paired by seed: {gain[0]:+.2f} ± {gain[1]:.2f} "
                  f"(n={gain[2]})"]
    return "\n".join(lines) + "\n"


def _sigmas_per_epoch(run: dict) -> str:
    spe = run["epochs"][0]["step"]
    seen: dict[int, float] = {}
    for t in run["trace"]:
        seen.setdefault(t["step"] // spe, t["noise_multiplier"])
    return " → ".join(f"{v:.3f}" for _, v in sorted(seen.items()))


def _plots(results: list[dict], out: Path) -> list[Path]:
    import matplotlib  # local: only the figures need matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    g = _group(_main(results))
    # 1. accuracy vs ε with error bars
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, p in enumerate(PRESETS):
        xs, ms, ss = [], [], []
        for e in EPSILONS:
            accs = [r["test_accuracy"] for r in g[(p, e)]]
            if accs:
                m, s = _mean_std(accs)
                xs.append(e * (1 + 0.015 * (i - 1.5)))
                ms.append(m)
                ss.append(s)
        ax.errorbar(xs, ms, yerr=ss, marker="o", capsize=3, label=p, color=f"C{i}")
    ax.set_xlabel("ε (PLD, δ = 1/600000)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Fashion-MNIST, tanh CNN, 3 epochs")
    ax.legend()
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "dynamic_accuracy_vs_epsilon.png"))
    # 2. ε consumption curves and schedules at the middle ε, seed 0
    e_mid = EPSILONS[1]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for i, p in enumerate(PRESETS):
        runs = sorted(g[(p, e_mid)], key=lambda r: r["spec"]["seed"])
        if not runs:
            continue
        r, c = runs[0], f"C{i}"                    # one colour per preset in every panel
        t, eps = zip(*r["epsilon_curve_pld"])
        axes[0, 0].plot(t, eps, color=c, label=f"{p} PLD")
        t, eps = zip(*r["epsilon_curve_gdp"])
        axes[0, 0].plot(t, eps, "--", color=c, label=f"{p} GDP", alpha=0.7)
        steps = [x["step"] for x in r["trace"]]
        axes[0, 1].plot(steps, [x["noise_multiplier"] * x["clip"] for x in r["trace"]],
                        color=c, label=p)
        axes[1, 0].plot(steps, [x["clip"] for x in r["trace"]], color=c, label=p)
        axes[1, 1].plot(steps, [x["mean_grad_norm_nonprivate"] for x in r["trace"]],
                        color=c, label=p, lw=0.8)
    axes[0, 0].set(title=f"ε spent over steps (target {e_mid})", xlabel="step", ylabel="ε")
    axes[0, 1].set(title="noise std on the gradient sum σ_t·C_t", xlabel="step")
    axes[1, 0].set(title="clip C_t", xlabel="step")
    axes[1, 1].set(title="mean per-sample grad norm (non-private diagnostic)",
                   xlabel="step")
    for a in axes.flat:
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    written.append(_save(fig, out / "dynamic_schedules_eps1.2.png"))
    # 3. noise decay: ε curves and σ_t
    decay = [k for k in ("vanilla",) + tuple(DECAYS) if g[(k, e_mid)]]
    if len(decay) > 1:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        for k in decay:
            r = sorted(g[(k, e_mid)], key=lambda r: r["spec"]["seed"])[0]
            name = "constant" if k == "vanilla" else k
            t, eps = zip(*r["epsilon_curve_pld"])
            axes[0].plot(t, eps, label=name)
            axes[1].plot([x["step"] for x in r["trace"]],
                         [x["noise_multiplier"] for x in r["trace"]], label=name)
        axes[0].set(title=f"ε (PLD) over steps, target {e_mid}", xlabel="step", ylabel="ε")
        axes[1].set(title="noise multiplier σ_t", xlabel="step")
        for a in axes:
            a.grid(alpha=0.3)
            a.legend()
        written.append(_save(fig, out / "noise_decay_eps1.2.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt  # local: only the figures need matplotlib

    plt.close(fig)
    return path


def summarize(results_path: Path, out: Path) -> list[Path]:
    """Write ``dynamic_fmnist*.md``, ``noise_decay_fmnist.md``, the audit and plots."""
    results = load_results(results_path)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (("dynamic_fmnist.md", dynamic_table(results)),
                       ("noise_decay_fmnist.md", decay_table(results)),
                       ("dynamic_fmnist_long.md", long_table(results))):
        if text:
            (out / name).write_text(text)
            written.append(out / name)
    main = _main(results)
    if main:
        first = main[0]
        audit = calibration_audit(total_steps=first["steps"], sample_rate=first["sample_rate"],
                                  delta=first["spec"]["delta"])
        (out / "calibration_audit.md").write_text(audit)
        written += [out / "calibration_audit.md"] + _plots(results, out)
    return written
