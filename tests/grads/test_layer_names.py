"""The engine's split of a model is into *layers* (``dpfy.grads.Layer``); "unit" is kept for the
unit of privacy. The former public names still resolve, with a DeprecationWarning (issue 37 §4)."""

import pytest
from torch import nn

import dpfy.grads as grads


def test_engine_splits_model_into_layers():
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    eng = grads.GradEngine(model)
    assert [layer.name for layer in eng.layers] == ["0", "2"]
    assert all(isinstance(layer, grads.Layer) for layer in eng.layers)
    assert not hasattr(eng, "units")  # "units" means only the sampler's units of privacy


@pytest.mark.parametrize("old,new", [("Unit", "Layer"), ("build_units", "build_layers")])
def test_old_names_warn_and_resolve(old, new):
    with pytest.warns(DeprecationWarning, match=f"dpfy.grads.{new}"):
        assert getattr(grads, old) is getattr(grads, new)


def test_unknown_name_still_raises():
    with pytest.raises(AttributeError):
        grads.no_such_name  # noqa: B018


def test_norms_clip_groups_old_name_warns():
    """``Norms.groups`` (the per-layer clipping groups) is now ``Norms.clip_groups``."""
    import torch

    from dpfy.types import Norms

    norms = Norms(total=torch.ones(2), per_parameter_sq={"w": torch.ones(2)}, clip_groups=(("w",),))
    with pytest.warns(DeprecationWarning, match="clip_groups"):
        assert norms.groups == (("w",),)
