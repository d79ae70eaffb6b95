"""TrainConfig: validation, TOML/YAML files, type coercion and how δ and the seed resolve."""

import json
import math

import pytest

from dpfy.train.config import TrainConfig, coerce, guide_delta, load_config_file, resolve


def test_defaults_are_the_fashion_mnist_benchmark():
    c = TrainConfig()
    assert (c.dataset, c.model, c.epsilon, c.accountant) == ("fashion_mnist", "tanh_cnn", 3.0,
                                                             "pld")


@pytest.mark.parametrize("kwargs, match", [
    (dict(epsilon=0.0), "epsilon must be > 0"),
    (dict(epsilon=-1.0), "epsilon must be > 0"),
    (dict(delta=1.0), r"delta must be in \(0, 1\)"),
    (dict(delta=0.0), r"delta must be in \(0, 1\)"),
    (dict(noise_multiplier=1.0), "Give either a target --epsilon or a fixed --noise-multiplier"),
    (dict(epsilon=None), "Give either"),
    (dict(epochs=0), "epochs must be >= 1"),
    (dict(clip=0.0), "clip must be > 0"),
    (dict(optimizer="lbfgs"), "optimizer must be one of"),
    (dict(accountant="moments"), "accountant must be one of"),
    (dict(method_options={"rate": 0.9}), "Add --method NAME"),
])
def test_bad_values_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


def test_toml_file(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('dataset = "digits"\nlr = 4\nepochs = 2\n[method_options]\nrate = 0.5\n')
    values = load_config_file(p)
    assert values == {"dataset": "digits", "lr": 4.0, "epochs": 2,
                      "method_options": {"rate": 0.5}}
    assert isinstance(values["lr"], float)            # TOML's int 4 becomes the float field


def test_yaml_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: mlp\nclip: 0.5\nnoise-multiplier: 1.1\nepsilon: null\n")
    c = TrainConfig.from_mapping(load_config_file(p))
    assert (c.model, c.clip, c.noise_multiplier, c.epsilon) == ("mlp", 0.5, 1.1, None)


def test_unknown_key_lists_the_valid_ones(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("learning_rate = 0.1\n")
    with pytest.raises(ValueError, match=r"key must be one of \[.*'lr'.*\], got .* = "
                                         r"'learning_rate'"):
        load_config_file(p)


def test_bad_file_type_and_syntax(tmp_path):
    with pytest.raises(ValueError, match="a .toml, .yaml, .yml or .json file"):
        load_config_file(tmp_path / "c.ini")
    p = tmp_path / "c.toml"
    p.write_text("lr = = 3\n")
    with pytest.raises(ValueError, match="valid TOML"):
        load_config_file(p)


def test_wrong_type_is_refused():
    with pytest.raises(ValueError, match="epochs must be a int"):
        coerce({"epochs": 2.5}, source="test")
    with pytest.raises(ValueError, match="lr must be a float"):
        coerce({"lr": "fast"}, source="test")


def test_delta_follows_the_guide_unless_given_or_referenced():
    n = 1438
    # the guide's convention δ = 1/N^1.1 (Ponomareva et al. 2023, §5.3.2, "Convention for setting
    # δ" box), computed independently here
    expected = math.exp(-1.1 * math.log(n))
    assert guide_delta(n) == pytest.approx(expected, rel=1e-12)
    c, how = resolve(TrainConfig(dataset="digits"), num_examples=n, reference_delta=None)
    assert c.delta == pytest.approx(expected) and "1/N^1.1" in how
    c, how = resolve(TrainConfig(), num_examples=60000, reference_delta=1e-5)
    assert c.delta == 1e-5 and "reference" in how
    c, how = resolve(TrainConfig(delta=1e-7), num_examples=60000, reference_delta=1e-5)
    assert c.delta == 1e-7 and how == "given"


def test_delta_at_least_one_over_n_is_refused():
    with pytest.raises(ValueError, match=r"delta must be < 1/N"):
        resolve(TrainConfig(delta=0.01), num_examples=455, reference_delta=None)


def test_no_seed_is_invented_and_none_is_published():
    # Issue 10 §1.1: a seed drawn into config.json lets anyone reproduce the noise. Without
    # --seed none exists; with one, the public config says only that the run is reproducible.
    a, _ = resolve(TrainConfig(), num_examples=10**5, reference_delta=None)
    assert a.seed is None and not a.reproducible
    seeded = TrainConfig(seed=987654321)
    public = json.loads(seeded.to_public_json())
    assert public["seed"] is None and public["reproducible"] is True
    assert "987654321" not in seeded.to_public_json()
    assert TrainConfig.from_mapping(public) == TrainConfig()      # read back: no seed
    assert TrainConfig.from_mapping(seeded.to_dict()) == seeded   # the checkpoint's full copy


_BUDGETS = dict(individual="sample", budgets="1,2", budget_fractions="0.5,0.5", epsilon=None)


@pytest.mark.parametrize(
    "flags, match",
    [
        # the pairs TrainConfig once spelled itself, now the checker's (dpfy.spec.check) words
        (dict(epsilon=3.0), "target_epsilon must be None with budgets"),
        (dict(noise_multiplier=1.0), "noise_multiplier must be None with budgets"),
        (dict(method="adaclip"), "method must be None with budgets"),
        (dict(clipping="per_layer"), "clipping must be 'flat' with budgets"),
        (dict(user_ids="ids.npy", user_sampling="uls"), "user-level DP .*budgets / individual"),
        # dpfy train --individual builds its run from the budgets alone: these were dropped
        (dict(noise="tree"), "noise='tree'.*budgets / individual"),
        (dict(augmult=2), "augmult=2 cannot be combined with \\['budgets / individual'\\]"),
        (
            dict(batchnorm="privatized", bn_bound=1.0),
            "batchnorm='privatized' cannot be combined with \\['budgets / individual'\\]",
        ),
    ],
)
def test_what_budgets_cannot_be_combined_with_is_the_checkers(flags, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**{**_BUDGETS, **flags})
    TrainConfig(**_BUDGETS)  # admitted alone
