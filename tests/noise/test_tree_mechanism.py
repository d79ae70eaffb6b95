"""DP-FTRL's tree: every noisy prefix sum carries exactly the nodes of its dyadic
decomposition (variance σ²Δ² × their count), the tree restarts each pass, SGD on the released
residuals is θ_0 − η·(noisy prefix sum), and a checkpoint continues the stream."""

import pytest
import torch

from dpfy.noise import NoiseSource, TreeMechanism


def _decomposition(t: int) -> list[tuple[int, int]]:
    """The dyadic intervals [start, end] (1-based) whose union is [1, t], largest first."""
    out, start = [], 1
    while start <= t:
        size = 1 << (t - start + 1).bit_length() - 1
        out.append((start, start + size - 1))
        start += size
    return out


def _tree(seed=4, period=16):
    return TreeMechanism(NoiseSource(seed, backend="torch"), period=period,
                         noise_multiplier=1.0, sample_rate=0.1)


def _unit(mech, like):
    return mech.generator().noisy_mean(torch.zeros_like(like), 1.0, 1.0).double()


def test_prefix_noise_is_the_sum_of_its_decomposition_nodes():
    # node [s, e] is drawn at step e (when it completes), the only draw of that step
    d, T = 5, 13
    mech = _tree(period=64)
    residuals = torch.stack([_unit(mech, torch.zeros(d)) for _ in range(T)])
    src = NoiseSource(4, backend="torch")
    drawn = {e: src.gaussian(torch.zeros(d), 1.0).double() for e in range(1, T + 1)}
    prefix = residuals.cumsum(0)
    for t in range(1, T + 1):
        nodes = _decomposition(t)
        expected = sum(drawn[e] for _, e in nodes)
        assert torch.allclose(prefix[t - 1], expected, atol=1e-5), t


def test_prefix_noise_variance_is_the_node_count():
    d, T = 30_000, 12
    mech = _tree(seed=8, period=T)
    prefix = torch.stack([_unit(mech, torch.zeros(d)) for _ in range(T)]).cumsum(0)
    for t in range(1, T + 1):
        var = float(prefix[t - 1].var())
        count = len(_decomposition(t))
        assert abs(var - count) < 0.06 * count, (t, var, count)


def test_tree_restarts_every_period_and_buffers_at_most_depth_nodes():
    d, P = 3, 5
    mech = _tree(seed=2, period=P)
    residuals = torch.stack([_unit(mech, torch.zeros(d)) for _ in range(2 * P)])
    src = NoiseSource(2, backend="torch")
    drawn = [src.gaussian(torch.zeros(d), 1.0).double() for _ in range(2 * P)]
    # the second tree's first prefix is its first node alone (nothing carried over)
    assert torch.allclose(residuals[P], drawn[P], atol=1e-6)
    assert torch.allclose(residuals[P:].sum(0), drawn[P + 3] + drawn[P + 4], atol=1e-5)
    assert max(len(b) for b in mech.buffers) <= mech.memory_vectors() == 3


def test_sgd_on_residuals_is_theta0_minus_eta_noisy_prefix_sum():
    T, d, eta, sigma, b = 7, 4, 0.3, 2.0, 8.0
    G = torch.randn(T, d, generator=torch.Generator().manual_seed(1))
    mech = TreeMechanism(NoiseSource(6, backend="torch"), period=T, noise_multiplier=sigma,
                         sample_rate=0.1)
    theta0 = torch.ones(d)
    p = torch.nn.Parameter(theta0.clone())
    opt = torch.optim.SGD([p], lr=eta)
    for t in range(T):
        p.grad = mech.generator().noisy_mean(G[t].clone(), sigma, b)
        opt.step()
    src = NoiseSource(6, backend="torch")
    drawn = {e: src.gaussian(torch.zeros(d), 1.0) for e in range(1, T + 1)}
    noisy_prefix = G.sum(0) + sigma * sum(drawn[e] for _, e in _decomposition(T))
    assert torch.allclose(p.detach(), theta0 - eta * noisy_prefix / b, atol=1e-5)


def test_checkpoint_resume_continues_the_stream_exactly():
    like = torch.zeros(9)
    whole = _tree(seed=3, period=6)
    full = [_unit(whole, like) for _ in range(10)]
    first = _tree(seed=3, period=6)
    for _ in range(7):
        _unit(first, like)
    resumed = _tree(seed=99, period=6)
    resumed.load_state_dict(first.state_dict())
    for t in range(7, 10):
        assert torch.equal(_unit(resumed, like), full[t])


def test_accounted_depth_is_the_most_released_nodes_any_leaf_enters():
    # Numerical check of the multi-epoch accounting: the mechanism releases, at step e, the
    # node [e − 2^k + 1, e] with k = trailing zeros of e (the one new node of its prefix sum).
    # One participation per tree moves at most that many node values by Δ; with a restart
    # every pass the trees are independent, so E passes compose E such Gaussian releases.
    from dpfy.privacy.correlated import tree_depth
    for leaves in range(1, 70):
        released = [(e - (e & -e) + 1, e) for e in range(1, leaves + 1)]
        worst = max(sum(s <= leaf <= e for s, e in released) for leaf in range(1, leaves + 1))
        assert worst == tree_depth(leaves), leaves


def test_the_shared_keywords_reach_the_base_mechanism():
    """noise_multiplier, sample_rate and sampler_position are passed on to CorrelatedMechanism
    (sampler_position None unless given); a missing or misspelt one is a TypeError naming it."""
    mech = _tree()
    assert (mech.noise_multiplier, mech.sample_rate, mech.sampler_position) == (1.0, 0.1, None)
    with pytest.raises(TypeError, match="sample_rate"):
        TreeMechanism(NoiseSource(0, backend="torch"), period=4, noise_multiplier=1.0)
    with pytest.raises(TypeError, match="sampler_positon"):
        TreeMechanism(
            NoiseSource(0, backend="torch"),
            period=4,
            noise_multiplier=1.0,
            sample_rate=0.1,
            sampler_positon=None,
        )
