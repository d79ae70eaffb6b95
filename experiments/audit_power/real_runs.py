"""The audit's power through dpfy's real training path: digits, logistic regression, b = 256,
5 epochs, σ = 1, seeds 0-4, noise scaled by F behind the ledger's back (audit_config's
plant_noise_scale)."""
import time
from dpfy.audit.run import audit_config
from dpfy.train.config import TrainConfig
for scale in [None, 0.9, 0.8, 0.7, 0.5, 0.0]:
    rows = []
    t = time.time()
    for seed in range(5):
        r = audit_config(TrainConfig(dataset="digits", model="logreg", epochs=5, batch_size=256, seed=seed, threads=1,
            epsilon=None, noise_multiplier=1.0), plant_noise_scale=scale, echo=lambda s: None)
        rows.append(r)
    c = rows[0].claimed_epsilon
    print(f"F={scale}: claims {[round(r.claimed_epsilon,3) for r in rows]} est {[round(r.gdp.epsilon,3) for r in rows]} low {[round(r.gdp.epsilon_low,3) for r in rows]} ratio {[round(r.gdp.epsilon/r.claimed_epsilon,3) for r in rows]} one-run {[round(r.one_run.epsilon,3) for r in rows]} fdp {[round(r.fdp.epsilon,3) for r in rows]} flagged {sum(r.flagged for r in rows)}/5 exceeded {sum(r.exceeded for r in rows)}/5 ({time.time()-t:.0f}s)", flush=True)
