"""How a model is split into *layers*, each handled by one route, and ``explain`` rows.

A layer is a module with trainable parameters and one way to get its per-sample gradients:

- ``rule``: a registered layer rule (``grads/rules/``): ghost norm or materialized per-sample
  gradients from the activations and output gradients of the user's own backward pass, chosen per
  call by size;
- ``vmap``: torch.func on the module's whole subtree (any module; one extra forward+backward).

With ``route="vmap"`` the whole model is one vmap layer. Otherwise the model is walked top-down:
a module with a rule becomes a rule layer; a module that owns trainable parameters directly but has
no rule becomes a vmap layer covering its subtree (``route="auto"``) or is an error
(``route="ghost"``). Every trainable parameter ends up in exactly one layer or we raise: no
parameter is ever silently left out.

A parameter used by several layers (tied weights: GPT-2's ``lm_head`` and ``wte``) is *owned* by
the layer at its canonical name (the one ``model.named_parameters()`` gives) and *shared* with the
others: their calls contribute to its per-example gradient, which the engine sums over all uses
before taking its norm.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from dpfy._require import require
from dpfy.buffers import buffer_fix
from dpfy.errors import PrivacyRefusal
from dpfy.grads.rules import LayerRule, rule_for

__all__ = ["Layer", "ROUTES", "build_layers", "check_model"]

# The routes a GradEngine may be restricted to: "auto" (each layer by its rule, vmap where it has
# none), "ghost" (rules only: ghost norm or per-sample gradients, chosen per call by size),
# "vmap" (torch.func on the whole model).
ROUTES = ("auto", "ghost", "vmap")


@dataclass
class Layer:
    """One module and the route that yields its parameters' per-sample gradients."""

    name: str  # qualified module name ("" for the root)
    module: nn.Module
    rule: LayerRule | None  # None: vmap
    params: dict[str, nn.Parameter]  # relative name -> trainable parameter it owns
    shared: dict[str, nn.Parameter] = field(default_factory=dict)  # tied, owned elsewhere
    tied: dict[str, str] = field(default_factory=dict)  # relative name -> owner's name

    @property
    def route(self) -> str:
        """How its per-sample gradients are formed: "rule" (per call, the ghost or the
        per-sample route) or "vmap"."""
        return "vmap" if self.rule is None else "rule"

    @property
    def label(self) -> str:
        """The layer as error messages name it: ``layer 'name' (Type)``."""
        return f"layer {self.name or '(root)'!r} ({type(self.module).__name__})"

    def takes_ghost(self, a: Any, g: Any) -> bool:
        """Whether a rule layer's call on input ``a`` with output gradient ``g`` takes the ghost
        route (a norm without per-sample gradients; the rule decides by size)."""
        assert self.rule is not None, "takes_ghost is asked of rule layers only"
        return self.rule.has_ghost and self.rule.prefers_ghost(self.module, a, g)

    @property
    def all_params(self) -> dict[str, nn.Parameter]:
        """The parameters its calls differentiate: its own and the tied ones it shares."""
        return {**self.params, **self.shared} if self.shared else self.params

    @property
    def param_names(self) -> tuple[str, ...]:
        """The model-level names of the parameters it owns: its per-layer clipping group."""
        return tuple(self.qualified(rel) for rel in self.params)

    def qualified(self, rel: str) -> str:
        """The model-level name of a parameter (the owner's name for a tied one)."""
        if rel in self.tied:
            return self.tied[rel]
        return f"{self.name}.{rel}" if self.name else rel

    def explain(self, why: str = "") -> dict[str, Any]:
        if self.rule is None:
            where, how = "dpfy/grads/vmap.py", "vmap"
        else:
            where = "dpfy/grads/rules/" + inspect.getfile(type(self.rule)).rsplit("/", 1)[-1]
            how = "ghost or per-sample, by size per batch" if self.rule.has_ghost else "per-sample"
        return {
            "module": self.name or "(root)",
            "type": type(self.module).__name__,
            "params": sum(p.numel() for p in self.params.values()),
            "rule": where,
            "route": how,
            "why": why,
        }


def check_model(model: nn.Module) -> None:
    """Refuse, before any forward, modules whose training forward dpfy cannot account.

    - BatchNorm mixes the examples of a batch: per-sample gradients (and DP) are undefined.
    - Any module with ``track_running_stats=True`` (InstanceNorm with tracking, a user's own
      norm layer) updates running statistics of the raw training data in every training
      forward; they are saved in ``model.pt`` without noise or a ledger entry. The
      :class:`~dpfy.buffers.BufferGuard` would refuse them at the first training forward;
      refusing here, when the engine attaches, names the module before anything runs.

    Raises:
      PrivacyRefusal: naming the module's qualified name, its class and the fix.
    """
    for name, m in model.named_modules():
        label = name or "(root)"
        kind = type(m).__name__
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            raise PrivacyRefusal(
                f"module {label!r} must not be a {kind}, got a layer that mixes the examples "
                f"of a batch, so per-sample gradients (and DP) are undefined. Call "
                f"model = dpfy.validate(model, fix=True) to replace it with GroupNorm."
            )
        if getattr(m, "track_running_stats", False) is True:
            raise PrivacyRefusal(
                f"module {label!r} must not track running statistics, got module {label!r} = "
                f"{kind}(track_running_stats=True): every training forward would write "
                f"statistics of the raw training data into its buffers, saved with the model "
                f"without noise or a ledger entry. {buffer_fix(m)}."
            )


def build_layers(model: nn.Module, route: str, trainable: set[int]) -> list[Layer]:
    """Split ``model`` into layers (see module docstring); raise for uncovered parameters."""
    require(route in ROUTES, "route", route, f"one of {list(ROUTES)}")
    check_model(model)
    if route == "vmap":
        params = {n: p for n, p in model.named_parameters() if id(p) in trainable}
        return [Layer("", model, None, params)] if params else []
    layers: list[Layer] = []

    def visit(m: nn.Module, name: str) -> None:
        own = {n: p for n, p in m.named_parameters(recurse=False) if id(p) in trainable}
        rule = rule_for(m)
        if rule is not None:
            if own:
                layers.append(Layer(name, m, rule, own))
            return
        if own:
            if route == "ghost":
                raise ValueError(
                    f"route must be 'auto' or 'vmap' for this model, got route = 'ghost' with "
                    f"module {name or '(root)'!r} of type {type(m).__name__}, which has no layer "
                    f"rule. Use route='auto' (vmap for that module only) or register a rule "
                    f"with dpfy.grads.register_rule"
                )
            layers.append(
                Layer(name, m, None, {n: p for n, p in m.named_parameters() if id(p) in trainable})
            )
            return
        for child_name, child in m.named_children():
            visit(child, f"{name}.{child_name}" if name else child_name)

    visit(model, "")
    _tie(model, layers)
    covered = {id(p) for layer in layers for p in layer.params.values()}
    missing = [
        n for n, p in model.named_parameters() if id(p) in trainable and id(p) not in covered
    ]
    require(
        not missing,
        "every trainable parameter",
        missing,
        "covered by a layer",
        "This is a bug in dpfy's layer builder; please report it",
    )
    return layers


def _tie(model: nn.Module, layers: list[Layer]) -> None:
    """Give each parameter used by several layers one owner; the others share it (see above).

    The owner is the layer at the parameter's canonical name (the first ``named_parameters``
    path), else the first layer that uses it.
    """
    canonical = {id(p): n for n, p in model.named_parameters()}
    users: dict[int, list[tuple[Layer, str]]] = {}
    for layer in layers:
        for rel, p in layer.params.items():
            users.setdefault(id(p), []).append((layer, rel))
    for pid, uses in users.items():
        if len(uses) < 2:
            continue
        name = canonical[pid]
        owner = next((k for k, (layer, rel) in enumerate(uses) if layer.qualified(rel) == name), 0)
        for k, (layer, rel) in enumerate(uses):
            if k != owner:
                layer.shared[rel] = layer.params.pop(rel)
                layer.tied[rel] = uses[owner][0].qualified(uses[owner][1])
