"""The digits MLP (b = 128, 10 epochs, σ = 1, seed 0) audited at F = 1, 0.7, 0.5, 0."""
from dpfy.audit.run import audit_config
from dpfy.train.config import TrainConfig
for scale in [None, 0.7, 0.5, 0.0]:
    r = audit_config(TrainConfig(dataset="digits", model="mlp", epochs=10, batch_size=128, seed=0, threads=1,
        epsilon=None, noise_multiplier=1.0), plant_noise_scale=scale, echo=lambda s: None)
    print(f"mlp F={scale}: claim {r.claimed_epsilon:.3f} est {r.gdp.epsilon:.4g} low {r.gdp.epsilon_low:.4g} one-run {r.one_run.epsilon:.3f} fdp {r.fdp.epsilon:.3f} flagged {r.flagged}", flush=True)
