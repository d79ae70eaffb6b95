"""The run spec's checker: a table of combinations -> refused or admitted.

Each row is a refusal ``make_private`` made before the spec existed (its hand-kept lists in
``_check_user_level``, ``_check_noise``, ``check_microbatch``, ``check_augmult``,
``individualize`` and ``_check_arguments``), or a combination those lists admitted; the
expected outcome is read from those lists, not from the checker.
"""

from __future__ import annotations

import itertools
import json

import pytest

from dpfy.errors import PrivacyRefusal
from dpfy.privacy.events import Shuffled
from dpfy.spec import (
    DECLARATIONS,
    AccountingSpec,
    BandMF,
    BatchNormStatistics,
    ClippingSpec,
    ExampleUnit,
    Gaussian,
    IndividualBudgets,
    MethodDeclaration,
    PerformanceOptions,
    RunSpec,
    SamplingSpec,
    Tree,
    UserUnit,
    check,
)

SIGMA = Gaussian(noise_multiplier=1.0)
USERS = UserUnit("uls")
BUDGETS = AccountingSpec(delta=1e-5, individual=IndividualBudgets([1.0, 2.0], "sample"))
BN = BatchNormStatistics("privatized", bound=1.0, share=0.3)
BN_SIGMA = BatchNormStatistics("privatized", bound=1.0, noise_multiplier=4.0)
PUBLIC_BN = BatchNormStatistics("public", public_data="digits")

# (the spec's parts that differ from a plain σ = 1 DP-SGD run, the error it must raise or None)
TABLE = [
    ({}, None),
    (dict(unit=USERS), None),
    (dict(unit=UserUnit("els", 4)), None),
    (dict(noise=Tree(1.0)), None),
    (dict(noise=BandMF(1.0, 4)), None),
    (dict(clipping=ClippingSpec("microbatch", 1.0, 4)), None),
    (dict(unit=ExampleUnit(augmult=4)), None),
    (dict(unit=ExampleUnit(augmult=4), sampling=SamplingSpec(Shuffled)), None),
    (dict(noise=Tree(1.0), sampling=SamplingSpec(Shuffled)), None),
    (dict(noise=Gaussian(), accounting=BUDGETS), None),
    (dict(noise=Gaussian(), accounting=AccountingSpec(target_epsilon=1.0)), None),
    # _check_arguments: one source of σ
    (dict(accounting=AccountingSpec(target_epsilon=1.0)), "not both given"),
    (dict(noise=Gaussian()), "noise_multiplier must be given"),
    # _check_user_level
    (dict(unit=USERS, sampling=SamplingSpec(Shuffled)), "poisson_sampling=False"),
    (dict(unit=USERS, sampling=SamplingSpec(sample_rates=[0.1])), "user-level DP"),
    (dict(unit=USERS, sampling=SamplingSpec(world_size=2)), "data-parallel ranks"),
    (dict(unit=USERS, clipping=ClippingSpec("individual", [1.0])), "clipping='individual'"),
    (dict(unit=USERS, noise=Gaussian(), accounting=BUDGETS), "user-level DP"),
    # _check_noise
    (dict(noise=Tree(1.0), sampling=SamplingSpec(world_size=2)), "none of them with noise"),
    (dict(noise=BandMF(1.0), sampling=SamplingSpec(sample_rates=[0.1])), "sample_rates"),
    (dict(noise=Tree(1.0), unit=USERS), "user_ids"),
    (dict(noise=BandMF(1.0), clipping=ClippingSpec("microbatch", 1.0, 2)), "noise='bandmf'"),
    (dict(noise=Tree(), accounting=BUDGETS), "noise='tree'"),
    # check_microbatch
    (dict(clipping=ClippingSpec("microbatch", 1.0, 2), unit=USERS), "clipping='microbatch'"),
    (dict(clipping=ClippingSpec("microbatch", 1.0, 1), unit=USERS), "clipping='microbatch'"),
    (dict(clipping=ClippingSpec("microbatch", 1.0, 2), method="adaclip"), "'method'"),
    (
        dict(clipping=ClippingSpec("microbatch", 1.0, 2), sampling=SamplingSpec(world_size=2)),
        "data-parallel",
    ),
    # check_augmult
    (dict(unit=UserUnit("uls", augmult=2)), "augmult=2 cannot be combined with \\['user_ids'"),
    (dict(unit=ExampleUnit(augmult=2), noise=Tree(1.0)), "augmult=2 cannot"),
    (dict(unit=ExampleUnit(augmult=2), clipping=ClippingSpec("microbatch", 1.0, 2)), "augmult"),
    # check_microbatch made k = 1 'flat' before check_augmult read the clipping: admitted
    (dict(unit=ExampleUnit(augmult=2), clipping=ClippingSpec("microbatch", 1.0, 1)), None),
    (dict(unit=ExampleUnit(augmult=2), clipping=ClippingSpec("individual", [1.0])), "augmult"),
    (dict(unit=ExampleUnit(augmult=2), sampling=SamplingSpec(world_size=2)), "augmult"),
    # the accountant that decides noise
    (dict(noise=Gaussian(), accounting=AccountingSpec("gdp", 1e-5, 1.0)), "one of \\['pld'"),
    (dict(accounting=AccountingSpec("gdp", epsilon_cap=1.0)), "when it decides the noise"),
    (dict(accounting=AccountingSpec("gdp")), None),
    # individualize's others
    (dict(accounting=BUDGETS), "noise_multiplier must be None with budgets"),
    (dict(noise=Gaussian(), accounting=BUDGETS, method="quantile"), "method must be None"),
    (
        dict(noise=Gaussian(), accounting=BUDGETS, sampling=SamplingSpec(world_size=2)),
        "data-parallel ranks must be None with budgets",
    ),
    # individualize's own refusals, made after the sampler was built until the checker held
    # them: budgets sample or scale around one flat threshold c, under Poisson sampling,
    # calibrated by a rigorous accountant
    (
        dict(noise=Gaussian(), accounting=BUDGETS, clipping=ClippingSpec("per_layer")),
        "clipping must be 'flat' with budgets.*got clipping = 'per_layer'. Drop clipping=",
    ),
    (
        dict(noise=Gaussian(), accounting=BUDGETS, clipping=ClippingSpec("individual", [1.0])),
        "clipping must be 'flat' with budgets.*got clipping = 'individual'",
    ),
    (
        dict(noise=Gaussian(), accounting=BUDGETS, sampling=SamplingSpec(Shuffled)),
        "poisson_sampling must be True with budgets.*Drop poisson_sampling=False",
    ),
    (
        dict(
            noise=Gaussian(),
            accounting=AccountingSpec("gdp", 1e-5, individual=BUDGETS.individual),
        ),
        "accountant must be one of \\['pld', 'rdp'\\] with budgets.*Calibrate with 'rdp' or 'pld'",
    ),
    (
        dict(
            noise=Gaussian(), accounting=AccountingSpec("rdp", 1e-5, individual=BUDGETS.individual)
        ),
        None,
    ),
    # per-example thresholds under shuffled passes: the shuffled sampler gives the batch's
    # dataset indices as the Poisson one does (tests/step/test_individual_clipping_shuffled.py)
    (dict(clipping=ClippingSpec("individual", [1.0]), sampling=SamplingSpec(Shuffled)), None),
    (dict(clipping=ClippingSpec("individual", [1.0])), None),
    (dict(clipping=ClippingSpec("individual", [1.0]), noise=Tree(1.0)), None),
    # privatized BatchNorm statistics: attach_privatized_statistics' own list (correlated noise,
    # individualized budgets, data-parallel ranks, units other than one example per row)
    (dict(batchnorm=BN), None),
    (dict(batchnorm=PUBLIC_BN, noise=Tree(1.0), unit=ExampleUnit(augmult=2)), "augmult=2"),
    (dict(batchnorm=PUBLIC_BN, noise=Tree(1.0)), None),
    (dict(batchnorm=BN, noise=Tree(1.0)), "batchnorm='privatized' cannot.*noise='tree'"),
    (dict(batchnorm=BN, noise=BandMF(1.0)), "noise='bandmf'"),
    (dict(batchnorm=BN, noise=Gaussian(), accounting=BUDGETS), "privatized.*budgets"),
    (dict(batchnorm=BN, sampling=SamplingSpec(world_size=2)), "privatized.*data-parallel"),
    (dict(batchnorm=BN, unit=UserUnit("els", 4)), "privatized.*user_ids"),
    (dict(batchnorm=BN, unit=ExampleUnit(augmult=2)), "privatized.*augmult=2"),
    (dict(batchnorm=BN, clipping=ClippingSpec("microbatch", 1.0, 2)), "privatized.*microbatch"),
    (dict(batchnorm=BN, clipping=ClippingSpec("microbatch", 1.0, 1)), None),  # per example
    (dict(batchnorm=BN, sampling=SamplingSpec(Shuffled)), None),
    # attach_privatized_statistics: a share of σ = 0 is no σ_bn; a declared σ_bn is fine
    (dict(batchnorm=BN, noise=Gaussian(0.0)), "noise_multiplier must be > 0 to derive σ_bn"),
    (dict(batchnorm=BN_SIGMA, noise=Gaussian(0.0)), None),
]


@pytest.mark.parametrize("physical", [8, "auto"])
def test_privatized_statistics_refuse_physical_batches(physical):
    # setup_batchnorm's own refusal: one release per logical batch, from all of it
    performance = PerformanceOptions(max_physical_batch_size=physical)
    with pytest.raises(PrivacyRefusal, match="privatized.*max_physical_batch_size"):
        check(_spec(dict(batchnorm=BN)), performance)
    check(_spec(dict(batchnorm=PUBLIC_BN)), performance)


def _spec(parts: dict) -> RunSpec:
    return RunSpec(**{"noise": SIGMA, **parts})


@pytest.mark.parametrize("parts, error", TABLE)
def test_the_table_of_combinations(parts, error):
    if error is None:
        check(_spec(parts))
    else:
        with pytest.raises((ValueError, PrivacyRefusal), match=error):
            check(_spec(parts))


def _method(**declared) -> MethodDeclaration:
    fields = dict(
        name="m",
        sets=frozenset(),
        transform=False,
        loss_probes=(),
        clips=False,
        post_release=False,
        releases={},
    )
    return MethodDeclaration(**{**fields, **declared})


# the second pass: a calibrated method's declarations against the spec and the performance options
METHOD_TABLE = [
    (dict(), {}, PerformanceOptions(), None),
    (
        dict(sets=frozenset({"noise_multiplier"})),
        dict(noise=Tree(1.0)),
        PerformanceOptions(),
        "does not set σ",
    ),
    (dict(sets=frozenset({"noise_multiplier"})), {}, PerformanceOptions(), None),
    (dict(transform=True), dict(unit=USERS), PerformanceOptions(), "per-user values"),
    (dict(transform=True), dict(unit=UserUnit("els", 2)), PerformanceOptions(), None),
    (
        dict(loss_probes=("loss",)),
        dict(unit=ExampleUnit(augmult=2)),
        PerformanceOptions(),
        "per-row loss probes",
    ),
    (dict(transform=True), {}, PerformanceOptions(route="ghost"), "route must be 'auto'"),
    (dict(transform=True), {}, PerformanceOptions(route="vmap"), None),
    (
        dict(clips=True),
        dict(clipping=ClippingSpec("automatic")),
        PerformanceOptions(),
        "clipping must be 'flat'",
    ),
    (
        dict(post_release=True),
        {},
        PerformanceOptions(max_physical_batch_size=8),
        "one physical batch",
    ),
    (dict(post_release=True), {}, PerformanceOptions(), None),
    # attach_privatized_statistics: a method's σ_t changes every step, a share cannot follow it
    (
        dict(sets=frozenset({"noise_multiplier"})),
        dict(batchnorm=BN),
        PerformanceOptions(),
        "bn_share must be None",
    ),
    (
        dict(sets=frozenset({"noise_multiplier"})),
        dict(batchnorm=BN_SIGMA),
        PerformanceOptions(),
        None,
    ),
    (dict(), dict(batchnorm=BN), PerformanceOptions(), None),
]


@pytest.mark.parametrize("declared, parts, performance, error", METHOD_TABLE)
def test_the_method_declarations(declared, parts, performance, error):
    spec = _spec({"method": "m", **parts})
    if error is None:
        check(spec, performance, method=_method(**declared))
    else:
        with pytest.raises((ValueError, PrivacyRefusal), match=error):
            check(spec, performance, method=_method(**declared))


def test_every_pair_is_declared_once():
    pairs = [frozenset((r.owner, other)) for r in DECLARATIONS for other in r.refuses]
    assert len(pairs) == len(set(pairs)), "a pair of features is declared in two places"


def test_the_first_refusal_names_every_offending_flag():
    spec = _spec(dict(unit=USERS, sampling=SamplingSpec(Shuffled, sample_rates=[0.1])))
    with pytest.raises(PrivacyRefusal, match="got poisson_sampling=False, sample_rates:"):
        check(spec)


def test_the_spec_is_json_readable():
    spec = _spec(
        dict(
            unit=UserUnit("els", 3),
            noise=BandMF(1.0, 4),
            method=["a", "b"],
            accounting=BUDGETS,
            clipping=ClippingSpec("per_layer", [1.0] * 20),
        )
    )
    out = json.loads(json.dumps(spec.to_dict()))
    assert out["noise"] == {"noise": "bandmf", "noise_multiplier": 1.0, "bands": 4}
    assert out["unit"]["max_examples_per_user"] == 3 and out["method"] == ["a", "b"]
    assert out["clipping"]["max_grad_norm"] == "20 values"


@pytest.mark.parametrize("a, b", list(itertools.combinations(["users", "tree", "microbatch"], 2)))
def test_pairs_of_features_refused_in_both_orders_of_construction(a, b):
    # the refusal depends on the set of features, not on which keyword came first
    parts = {
        "users": dict(unit=USERS),
        "tree": dict(noise=Tree(1.0)),
        "microbatch": dict(clipping=ClippingSpec("microbatch", 1.0, 2)),
    }
    with pytest.raises((ValueError, PrivacyRefusal)):
        check(_spec({**parts[a], **parts[b]}))
    with pytest.raises((ValueError, PrivacyRefusal)):
        check(_spec({**parts[b], **parts[a]}))


def test_budgets_refusal_shows_what_was_given():
    # it said "got method = 'given'"; the value the user passed, and a fix the CLI can
    # rewrite as a flag ("Drop method=." reads "Drop --method.")
    with pytest.raises(ValueError, match=r"got method = 'adaclip'\. Drop method=\.$"):
        check(RunSpec(accounting=BUDGETS, method="adaclip"))
    with pytest.raises(ValueError, match=r"got noise_multiplier = 1\.5\. Drop noise_multiplier="):
        check(RunSpec(accounting=BUDGETS, noise=Gaussian(1.5)))
