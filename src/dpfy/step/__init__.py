"""The private step: take the batch the sampler drew, form per-unit contributions, sum, guard,
noise, record, step the optimizer, update the method (see :mod:`dpfy.step.private_step`)."""
