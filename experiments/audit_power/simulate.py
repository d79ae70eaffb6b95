"""The audit's power on the exact white-box view of Dirac canaries (simulated, not trained).

A Dirac canary's coordinate is touched by no real example, so what the adversary sees of
canary j at step t is exactly 1[j in batch t] + F·σ·N(0, 1) (in units of C). This draws that
view for m canaries over T steps, scores it with dpfy's per-step score and reads dpfy's GDP
estimate; the claim is dp_accounting's PLD ε. Usage:

    python simulate.py q sigma T delta m reps
"""
import sys, math, time
import numpy as np, torch
from dp_accounting import pld, dp_event
from dpfy.audit.canaries import step_scores
from dpfy.audit.gdp_estimate import gdp_estimate
q, sigma, T, delta, m = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
reps = int(sys.argv[6])
acc = pld.PLDAccountant(); acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), T)
claim = acc.get_epsilon(delta)
print(f"q={q} sigma={sigma} T={T} delta={delta} m={m} claim={claim:.4f}")
for F in [1.0, 0.9, 0.8, 0.7, 0.5, 0.0]:
    ratios, flags = [], 0
    for r in range(reps):
        rng = np.random.default_rng(1000 + r)
        inc = rng.random(m) < 0.5
        S = torch.zeros(m, dtype=torch.float64)
        for t in range(T):
            x = (inc & (rng.random(m) < q)).astype(float) + F * sigma * rng.standard_normal(m)
            S += step_scores(torch.from_numpy(x), sample_rate=q, noise_multiplier=sigma)
        g = gdp_estimate(S.numpy(), inc, delta=delta, resamples=500)
        ratios.append(g.epsilon / claim); flags += g.epsilon_low > claim
    ratios = np.array(ratios)
    print(f"F={F}: ratio median {np.median(ratios):.3f} [5%,95%] {np.quantile(ratios,[0.05,0.95]).round(3)} min {ratios.min():.3f} max {ratios.max():.3g} in±30% {np.mean(abs(ratios-1)<=0.3):.2f} flagged {flags}/{reps}", flush=True)
