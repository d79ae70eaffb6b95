"""Label DP: randomized response and RR with a prior give exactly ε, the staged prior never
reads the labels it randomizes, the label ledger records ε (δ = 0), and the report says the
features are not protected. Every expected number is derived in this file or comes from
dp_accounting. `dpfy train --privacy-unit label`: tests/cli/test_label_dp_cli.py."""

import json
import math

import dp_accounting
import pytest
import torch
from dp_accounting import pld

from dpfy.label_dp import (
    LabelLedger,
    LabelRelease,
    best_top_k,
    keep_probability,
    randomize_labels,
    randomized_response,
    rr_with_prior,
)

EPS = [0.5, 1.0, 2.0, 4.0, 8.0]


def _binomial_bound(p: float, n: int) -> float:
    # 6 standard deviations of a Binomial(n, p) frequency: a fixed seed makes the draw
    # deterministic; the bound only has to hold for a correct sampler (P < 2e-9 per check)
    return 6 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("eps", EPS)
@pytest.mark.parametrize("k", [2, 10, 100])
def test_rr_likelihood_ratio_is_exactly_e_eps(eps, k):
    # Derivation: P(ỹ=y|y) = p = e^ε/(e^ε+k−1); every other output has (1−p)/(k−1)
    # = 1/(e^ε+k−1). The largest ratio of an output's probability under two labels y, y'
    # is p / ((1−p)/(k−1)) (output = y), which must be e^ε: log of it equals ε.
    p = keep_probability(eps, k)
    assert p == pytest.approx(math.exp(eps) / (math.exp(eps) + k - 1), rel=1e-14)
    ratio = p / ((1 - p) / (k - 1))
    assert math.log(ratio) == pytest.approx(eps, rel=1e-12)  # float64 rounding only


@pytest.mark.parametrize("eps", EPS)
def test_rr_release_epsilon_matches_dp_accounting(eps):
    # dp_accounting's PLD of its RandomizedResponseDpEvent (replace-one: a label changes)
    release = LabelRelease("rr", eps, 10, 1000)
    acc = pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(release.dp_event())
    # PLD rounds privacy losses up to its grid (value_discretization_interval = 1e-4)
    assert eps - 1e-9 <= acc.get_epsilon(0.0) <= eps + 1e-4
    ledger = LabelLedger()
    ledger.record(release)
    assert ledger.epsilon() == eps


def test_rr_empirical_keep_rate_and_uniform_others():
    k, eps, n = 10, 1.0, 200_000
    gen = torch.Generator().manual_seed(0)
    y = torch.randint(0, k, (n,), generator=gen)
    out = randomized_response(y, eps, k, generator=gen)
    p = math.exp(eps) / (math.exp(eps) + k - 1)
    kept = (out == y).double().mean().item()
    assert abs(kept - p) <= _binomial_bound(p, n)
    # among changed labels, the offset (ỹ − y) mod k is uniform on 1..k−1
    offsets = ((out - y) % k)[out != y]
    m = offsets.numel()
    for d in range(1, k):
        f = (offsets == d).double().mean().item()
        assert abs(f - 1 / (k - 1)) <= _binomial_bound(1 / (k - 1), m)


def _rr_prior_matrix(prior_row: list[float], eps: float) -> list[list[float]]:
    """P(o | y) of Ghazi et al.'s RR-with-prior for one prior row, from the definition."""
    k = len(prior_row)
    order = sorted(range(k), key=lambda c: (-prior_row[c], c))
    best, best_kp = -1.0, 1
    for kp in range(1, k + 1):
        v = math.exp(eps) / (math.exp(eps) + kp - 1) * sum(prior_row[c] for c in order[:kp])
        if v > best + 1e-15:
            best, best_kp = v, kp
    top = order[:best_kp]
    m = [[0.0] * k for _ in range(k)]
    for y in range(k):
        for o in top:
            if y in top:
                m[y][o] = (math.exp(eps) if o == y else 1.0) / (math.exp(eps) + best_kp - 1)
            else:
                m[y][o] = 1.0 / best_kp
    return m


@pytest.mark.parametrize("eps", [0.5, 2.0, 8.0])
def test_rr_prior_matches_definition_and_is_eps_dp(eps):
    prior_row = [0.05, 0.4, 0.02, 0.3, 0.15, 0.08]
    k, n = len(prior_row), 60_000
    m = _rr_prior_matrix(prior_row, eps)
    # the definition's matrix is ε-DP, with equality for some pair (labels inside the top k')
    worst = max(m[y][o] / m[y2][o] for o in range(k) for y in range(k) for y2 in range(k)
                if m[y2][o] > 0)  # fmt: skip
    assert all((m[y][o] > 0) == (m[0][o] > 0) for y in range(k) for o in range(k))
    assert math.log(worst) <= eps * (1 + 1e-12)
    gen = torch.Generator().manual_seed(1)
    prior = torch.tensor([prior_row] * n, dtype=torch.float64)
    for y in range(k):
        out = rr_with_prior(torch.full((n,), y), prior, eps, generator=gen)
        for o in range(k):
            f = (out == o).double().mean().item()
            assert abs(f - m[y][o]) <= _binomial_bound(m[y][o], n) + 1e-12, (y, o)


def test_best_top_k_brute_force():
    gen = torch.Generator().manual_seed(2)
    prior = torch.softmax(3 * torch.randn(50, 7, generator=gen, dtype=torch.float64), 1)
    for eps in (0.3, 1.5, 6.0):
        kp = best_top_k(prior, eps)
        for row, got in zip(prior.tolist(), kp.tolist()):
            s = sorted(row, reverse=True)
            vals = [math.exp(eps) / (math.exp(eps) + j) * sum(s[: j + 1]) for j in range(7)]
            assert vals[got - 1] == pytest.approx(max(vals), rel=1e-12)


def test_staged_prior_reads_only_earlier_stages():
    n, k = 300, 4
    gen = torch.Generator().manual_seed(3)
    y = torch.randint(0, k, (n,), generator=gen)
    calls = []

    def fit_predict(idx, noisy, query):
        calls.append((set(idx.tolist()), set(query.tolist())))
        return torch.full((len(query), k), 1.0 / k)

    noisy, rel = randomize_labels(
        y,
        1.0,
        k,
        mechanism="rr-prior",
        generator=gen,
        fit_predict=fit_predict,
        stage_fractions=(0.2, 0.3, 0.5),
    )
    assert rel.parts == 3 and rel.num_labels == n and rel.epsilon == 1.0
    assert len(calls) == 2
    seen_queries: set = set()
    for trained_on, query in calls:
        assert not trained_on & query  # a stage's prior never sees its own labels
        assert trained_on.isdisjoint(query) and not (query & seen_queries)
        seen_queries |= query
    assert noisy.shape == y.shape and int(noisy.min()) >= 0 and int(noisy.max()) < k


def test_ledger_round_trip_sum_and_report():
    led = LabelLedger()
    led.record(LabelRelease("rr-prior", 1.5, 10, 100, 2))
    led.record(LabelRelease("rr", 0.5, 10, 100))
    assert led.epsilon() == 2.0  # sequential releases of the same labels add up (pure DP)
    back = LabelLedger.from_dict(json.loads(led.to_json()))
    assert back.epsilon() == 2.0 and back.to_dict()["delta"] == 0.0
    text = led.report()
    assert "features" in text and "NOT protected" in text and "labels" in text


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(epsilon=0.0, num_classes=10), "epsilon must be > 0"),
        (dict(epsilon=1.0, num_classes=1), "num_classes must be >= 2"),
    ],
)
def test_refusals(kwargs, message):
    with pytest.raises(ValueError, match=message):
        keep_probability(**kwargs)


def test_without_a_generator_the_labels_randomness_comes_from_the_os(monkeypatch):
    """No seed is the secure default: RR and RR-with-prior draw every uniform from the
    ChaCha20 stream keyed by the OS (secure_uniform), never from torch's global generator."""
    import dpfy.label_dp.mechanism as mech

    calls: list[int] = []
    real = mech.secure_uniform

    def spy(n: int, device=None):
        calls.append(n)
        return real(n)

    monkeypatch.setattr(mech, "secure_uniform", spy)
    y = torch.randint(0, 10, (500,))
    prior = torch.softmax(torch.randn(500, 10), dim=1)
    state = torch.get_rng_state()
    mech.randomized_response(y, 1.0, 10, generator=None)
    mech.rr_with_prior(y, prior, 1.0, generator=None)
    assert torch.equal(state, torch.get_rng_state())  # the global generator was not touched
    assert calls == [500, 500, 500, 500]  # two uniforms per label in each mechanism
