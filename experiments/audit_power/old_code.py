"""The same digits configuration audited by the code before Dirac canaries (run with
PYTHONPATH pointing at a checkout of commit 0efc571): the noise is scaled by monkeypatching
NoiseSource.noisy_mean, since that code had no plant_noise_scale."""
import pytest, dpfy.noise
from dpfy.audit.run import audit_config
from dpfy.train.config import TrainConfig
orig = dpfy.noise.NoiseSource.noisy_mean
for scale in [1.0, 0.5, 0.0]:
    def noisy_mean(self, total, std, normalizer, **kw):
        return orig(self, total, std * scale, normalizer, **kw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dpfy.noise.NoiseSource, "noisy_mean", noisy_mean)
        r = audit_config(TrainConfig(dataset="digits", model="logreg", epochs=5, batch_size=256, seed=0, threads=1,
            epsilon=None, noise_multiplier=1.0), echo=lambda s: None)
    print("OLD code, noise x", scale, r.summary(), flush=True)
