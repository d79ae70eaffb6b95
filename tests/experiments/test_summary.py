"""The reproduction's grid, spec keys and tables (no training: fake result records)."""


from experiments.dynamic_fmnist.grids import build_grid
from experiments.dynamic_fmnist.spec import RunSpec
from experiments.dynamic_fmnist.summary import decay_table, dynamic_table


def fake(schedule, eps, seed, acc, experiment="dynamic-fmnist"):
    spec = RunSpec(experiment=experiment, schedule=schedule, target_epsilon=eps, seed=seed)
    return {"spec": spec.to_dict(), "key": spec.key(), "test_accuracy": acc,
            "epsilon_pld": eps, "epsilon_gdp": eps / 2, "epochs": [{"step": 10}],
            "trace": [{"step": 0, "noise_multiplier": 2.0}, {"step": 10, "noise_multiplier": 1.0}]}


def test_grid_sizes_and_unique_keys():
    table = build_grid("dynamic-fmnist", seeds=3, epochs=3)
    decay = build_grid("noise-decay-fmnist", seeds=3, epochs=3)
    assert len(table) == 4 * 3 * 3 and len(decay) == 3 + 3 * 3       # constant σ + 3 decays
    assert len({s.key() for s in table + decay}) == len(set(table + decay)) == 45
    dyn = next(s for s in table if s.schedule == "dynamic")
    assert dict(dyn.options) == {"rho_mu": 2.0, "rho_c": 2.0, "stages": 15}
    assert RunSpec.from_dict(dyn.to_dict()) == dyn


def test_tables_report_mean_std_and_paired_gain():
    rs = [fake("vanilla", 1.2, s, a) for s, a in [(0, 80.0), (1, 82.0)]]
    rs += [fake("dynamic", 1.2, s, a) for s, a in [(0, 81.0), (1, 85.0)]]
    text = dynamic_table(rs)
    # vanilla: mean 81, sample std sqrt(2); gains paired by seed: +1, +3 -> mean 2, std sqrt(2)
    assert "| vanilla (dpfy) | – | 81.00 ± 1.41 (n=2) | – |" in text
    assert "| dynamic − vanilla (dpfy) | – | +2.00 ± 1.41 (n=2) | – |" in text
    assert "1.200 / 0.600" in text
    rs.append(fake("time", 1.2, 0, 79.0, experiment="noise-decay-fmnist"))
    decay = decay_table(rs)
    assert "| time | 79.00 ± 0.00 (n=1) | 2.000 → 1.000 |" in decay and "-1.00" in decay
