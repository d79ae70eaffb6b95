"""What ``make_private`` admits before it builds: the three objects, the aliases, the method,
the optimizer's parameters, and the seeds (a secret, with its warning).
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader

from dpfy._require import require
from dpfy.adaptive.base import Method, make as make_method
from dpfy.adaptive.chain import chain
from dpfy.errors import SeedWarning
from dpfy.grads import GradEngine
from dpfy.noise.seeds import derive_seeds
from dpfy.step.distributed import unwrap_model

__all__ = [
    "ATTACHED",
    "SEED_WARNING",
    "admit",
    "alias",
    "check_optimizer_params",
    "derive_seeds",
    "resolve_method",
    "warn_seed",
]

# the models make_private has hooked (a model is made private once)
ATTACHED: "weakref.WeakKeyDictionary[nn.Module, GradEngine]" = weakref.WeakKeyDictionary()


SEED_WARNING = (
    "make_private(seed={seed}): sampling and noise follow from the seed, so anyone "
    "who knows it can reproduce the noise and undo the privacy. Use a seed only "
    "for debugging or reproducing a result, never for a model you release "
    "(seed=None, the default, draws both from the operating system)"
)


def warn_seed(seed: int) -> None:
    """Warn, once per make_private call, that a seeded run's noise can be undone."""
    warnings.warn(SEED_WARNING.format(seed=seed), SeedWarning, stacklevel=3)


def alias(name: str, value: Any, opacus_name: str, opacus_value: Any) -> Any:
    """``value``, or Opacus's keyword for it; exactly one of the two."""
    require(
        (value is None) != (opacus_value is None),
        f"{name} / {opacus_name}",
        (type(value).__name__, type(opacus_value).__name__),
        "exactly one given",
        f"Pass {name}= (or Opacus's {opacus_name}=), once",
    )
    return value if value is not None else opacus_value


def admit(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, loader: DataLoader
) -> tuple[nn.Module, nn.Module]:
    """Check the three objects' types; the user's model and the one to hook (unwrapped)."""
    require(isinstance(model, nn.Module), "model", type(model).__name__, "an nn.Module")
    require(
        isinstance(optimizer, torch.optim.Optimizer),
        "optimizer",
        type(optimizer).__name__,
        "a torch.optim.Optimizer",
    )
    require(
        isinstance(loader, DataLoader),
        "loader",
        type(loader).__name__,
        "a torch.utils.data.DataLoader",
    )
    inner = unwrap_model(model)
    require(
        inner not in ATTACHED,
        "model",
        type(model).__name__,
        "a model make_private has not made private yet",
        "Call make_private once per model (build a fresh model to start over)",
    )
    return model, inner


def check_optimizer_params(optimizer: torch.optim.Optimizer, grads: GradEngine) -> None:
    """The optimizer must update exactly the model's trainable parameters.

    Frozen parameters of the model (``requires_grad=False``) may be in it too, as they are in an
    optimizer built over all of ``model.parameters()``: they never get a gradient, so the
    optimizer skips them; one unfrozen later is refused at the release
    (``DPOptimizer._refuse_uncovered_grads``).
    """
    in_opt = {id(p) for g in optimizer.param_groups for p in g["params"]}
    names = {id(p): n for n, p in grads.named_params}
    extra = len(in_opt - {id(p) for p in grads.model.parameters()})
    require(
        extra == 0,
        "optimizer parameters",
        f"{extra} not in the model",
        "a subset of the model's parameters",
        "Build the optimizer from this model's parameters (model.parameters())",
    )
    left = sorted(n for i, n in names.items() if i not in in_opt)
    require(
        not left,
        "trainable parameters",
        left,
        "all in the optimizer",
        "Add them to the optimizer or freeze them with requires_grad_(False) first",
    )


def resolve_method(method: "Method | str | Sequence[Method | str] | None") -> "Method | None":
    """A method from a registry name, a method, or a sequence of them (chained in order)."""
    if method is None:
        return None
    if isinstance(method, str):
        return make_method(method)
    if isinstance(method, (list, tuple)):
        resolved = [resolve_method(m) for m in method]
        require(
            all(m is not None for m in resolved),
            "method",
            method,
            "a list of dpfy methods or registry names, without None",
        )
        return chain(*[m for m in resolved if m is not None])
    require(
        isinstance(method, Method),
        "method",
        type(method).__name__,
        "a dpfy method, a registry name or a list of them",
        "Build one with dpfy.adaptive.make(name, ...); `dpfy methods` lists the names",
    )
    assert isinstance(method, Method)  # the require above refused others
    return method
