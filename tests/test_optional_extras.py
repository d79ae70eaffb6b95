"""matplotlib, scikit-learn, pyyaml and triton are optional: the core imports and trains
without them, and a feature that needs one fails at once with one line naming the extra that
installs it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpfy._require import EXTRAS, MissingExtra, require_extra

ROOT = Path(__file__).resolve().parents[1]

# Runs in a child interpreter where importing any optional package fails as if not installed.
BLOCK = textwrap.dedent("""
    import sys
    for name in ("matplotlib", "sklearn", "yaml", "triton"):
        sys.modules[name] = None     # `import name` raises ModuleNotFoundError; find_spec: None
""")

def _run_blocked(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "blocked.py"
    script.write_text(BLOCK + textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})


def test_every_optional_module_names_a_declared_extra():
    pyproject = (ROOT / "pyproject.toml").read_text()
    for module, (dist, extra) in EXTRAS.items():
        assert f'\n{extra} = ["{dist}' in pyproject, (module, extra)
    assert 'all = ["dpfy[plots,datasets,yaml]"]' in pyproject


@pytest.mark.parametrize("module, extra", [("matplotlib", "plots"), ("sklearn.datasets", "datasets"),
                                           ("yaml", "yaml")])
def test_missing_package_names_its_extra(module, extra, monkeypatch):
    for name in {module, module.split(".")[0]}:    # import fails as if not installed, even
        monkeypatch.setitem(sys.modules, name, None)   # when an earlier test imported it
    with pytest.raises(MissingExtra, match=rf'pip install "dpfy\[{extra}\]"') as e:
        require_extra(module, feature="this feature")
    assert "\n" not in str(e.value) and isinstance(e.value, ImportError)


def test_core_trains_and_the_cli_names_the_extra_without_optional_packages(tmp_path):
    # one child interpreter for both checks (importing torch dominates the time)
    done = _run_blocked("""
        import torch, torch.nn.functional as F
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        import dpfy
        from dpfy.cli import main
        torch.manual_seed(0)
        ds = TensorDataset(torch.randn(200, 5), torch.randint(0, 2, (200,)))
        model = nn.Linear(5, 2)
        model, opt, loader = dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
            DataLoader(ds, batch_size=20), noise_multiplier=1.0, epochs=1,
            max_grad_norm=1.0)
        for x, y in loader:
            opt.zero_grad(); F.cross_entropy(model(x), y).backward(); opt.step()
        print("eps", opt.epsilon(1e-5, accountant="rdp") > 0, flush=True)
        sys.exit(main(["train", "--dataset", "digits", "--model", "logreg", "--epochs", "1",
                       "--out", "run"]))
    """, tmp_path)
    assert done.stdout.strip() == "eps True", done.stderr
    assert done.returncode == 2, done.stderr          # dpfy train needs matplotlib: exit 2 ...
    lines = done.stderr.strip().splitlines()          # ... one line naming the extra ...
    assert len(lines) == 1 and 'pip install "dpfy[plots]"' in lines[0], done.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.partial").exists()  # at once
