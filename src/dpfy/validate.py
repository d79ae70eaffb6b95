"""``dpfy.validate``: find (and optionally fix) what stops a model from training privately.

Problems reported: layers that mix the examples of a batch (BatchNorm: fixable, replaced by
GroupNorm), and, for a given engine, modules without a layer rule (``engine="ghost"``) — those go
to the vmap engine under ``engine="auto"``.
"""

from __future__ import annotations

import copy
import math

from torch import nn

from dpfy.grads.rules import rule_for

__all__ = ["validate", "batchnorm_to_groupnorm"]


def batchnorm_to_groupnorm(bn: nn.modules.batchnorm._BatchNorm) -> nn.GroupNorm:
    """A GroupNorm with gcd(32, C) groups (Wu & He 2018's 32 when C allows it), affine as bn."""
    c = bn.num_features
    return nn.GroupNorm(math.gcd(32, c), c, eps=bn.eps, affine=bn.affine)


def _replace_batchnorms(model: nn.Module) -> nn.Module:
    if isinstance(model, nn.modules.batchnorm._BatchNorm):
        return batchnorm_to_groupnorm(model)
    for name, child in model.named_children():
        setattr(model, name, _replace_batchnorms(child))
    return model


def validate(model: nn.Module, *, fix: bool = False, engine: str = "auto"
             ) -> list[str] | nn.Module:
    """List the problems of ``model``, or (``fix=True``) return a fixed copy.

    Args:
      model: the model to check; not modified.
      fix: return a deep copy with every BatchNorm replaced by GroupNorm (gcd(32, C) groups),
        raising if a problem remains that cannot be fixed automatically.
      engine: the engine you intend to use; with ``"ghost"`` modules without a rule are problems.

    Returns:
      ``fix=False``: a list of human-readable problems (empty: ready). ``fix=True``: the model.
    """
    if fix:
        fixed = _replace_batchnorms(copy.deepcopy(model))
        left = validate(fixed, engine=engine)
        if left:
            raise ValueError(f"model must have no unfixable problems, got {left}. "
                             f"Change those layers by hand")
        return fixed
    problems = []
    for name, m in model.named_modules():
        label = name or "(root)"
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            problems.append(f"{label}: {type(m).__name__} mixes examples; "
                            f"dpfy.validate(model, fix=True) replaces it with GroupNorm")
        elif (engine == "ghost" and rule_for(m) is None
              and any(p.requires_grad for p in m.parameters(recurse=False))):
            problems.append(f"{label}: no layer rule for {type(m).__name__}; use engine='auto' "
                            f"or register a rule")
    return problems
