"""The samplers' checkpoints keep the keys, in the order, that dpfy has always written, so a
run resumes from a checkpoint saved by an earlier version (the keys below are the ones each
sampler's ``state_dict`` wrote out by hand before they were declared once in ``UnitSampler``).

Each saved value is the sampler's own attribute of that name (the generator's state is
SECRET: it goes into checkpoints only), and loading the state into a fresh sampler built the
same way continues the same draws.
"""

from __future__ import annotations

import pytest
import torch

from dpfy.sampling import (
    CyclicPoissonSampler,
    PoissonSampler,
    ShuffleSampler,
    UserCappedSampler,
    UserPoissonSampler,
    UserUnits,
)

IDS = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 4, 5, 5, 5])  # 6 users, 12 examples

BUILDERS = {
    "poisson": lambda: PoissonSampler(12, sample_rate=0.5, seed=3),
    "shuffle": lambda: ShuffleSampler(12, 5, seed=3),
    "cyclic": lambda: CyclicPoissonSampler(12, 2, bands=3, seed=3),
    "uls": lambda: UserPoissonSampler(UserUnits(IDS, clip_per_user=True), sample_rate=0.5, seed=3),
    "els": lambda: UserCappedSampler(
        UserUnits(IDS, clip_per_user=False), max_examples_per_user=2, batch_size=4, seed=3
    ),
}

KEYS = {
    "poisson": ["generator"],
    "shuffle": ["generator", "permutation", "offset", "passes"],
    "cyclic": ["generator", "groups", "step", "current", "offset"],
    "uls": ["generator", "unit", "user_sampling", "users"],
    "els": ["generator", "unit", "user_sampling", "users", "kept"],
}

ATTRIBUTES = {"shuffle": KEYS["shuffle"][1:], "cyclic": KEYS["cyclic"][1:], "els": ["kept"]}


def _advance(sampler) -> None:
    """Move the sampler off its starting position (a few draws and, where it has one, a
    committed position), so the saved position is not the constructor's."""
    if isinstance(sampler, (ShuffleSampler, CyclicPoissonSampler)):
        chunks = sampler.chunks(None)
        for _ in range(2):
            _, _, position = next(chunks)
            sampler.commit(position)
    else:
        for _ in range(3):
            sampler.draw()


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_state_dict_keeps_its_keys_and_resumes_the_same_draws(name):
    sampler = BUILDERS[name]()
    _advance(sampler)
    state = sampler.state_dict()
    assert list(state) == KEYS[name]
    assert torch.equal(state["generator"], sampler.generator.get_state())
    for attribute in ATTRIBUTES.get(name, []):
        assert state[attribute] is getattr(sampler, attribute)

    resumed = BUILDERS[name]()
    resumed.load_state_dict(state)
    if isinstance(sampler, (ShuffleSampler, CyclicPoissonSampler)):
        assert [c[0].tolist() for c in resumed.chunks(None)] == [
            c[0].tolist() for c in sampler.chunks(None)
        ]
    else:
        assert resumed.draw().tolist() == sampler.draw().tolist()


def test_a_secure_sampler_saves_no_generator_state():
    for sampler in (PoissonSampler(12, sample_rate=0.5), ShuffleSampler(12, 5)):
        assert sampler.state_dict()["generator"] is None
