"""Layer rule for Hugging Face's ``transformers.pytorch_utils.Conv1D`` (GPT-2's linear layers).

``Conv1D(nf, nx)`` is a Linear whose weight is stored transposed: y = x W + b with W of shape
(nx, nf) = (d_in, d_out), b (d_out,), on inputs (B, d_in) or sequences (B, T..., d_in). With
W = Lᵀ for the Linear weight L (d_out, d_in) every per-example quantity is the Linear rule's
(``linear.py``), transposed where it is parameter-shaped:

- per-sample gradient of W: G_iᵀ = Σ_t a_{i,t} g_{i,t}ᵀ (d_in, d_out), the transpose of the
  Linear one (returned as a transposed view; the engine reads it without a copy);
- ghost norm: ‖G_iᵀ‖_F = ‖G_i‖_F, so the Linear's ghost norms unchanged (bias included);
- weighted sum: (Σ_i w_i G_i)ᵀ.

The rule delegates to :class:`~dpfy.grads.rules.linear.LinearRule` through :func:`_as_linear`,
a view of the layer under the Linear's attribute names, so the ghost/materialized choice (ghost
when T² < d_in·d_out) and the fused native ghost kernel are shared.

Registration is lazy: ``transformers`` is an optional dependency and importing
``transformers.pytorch_utils`` costs about a second, which ``import dpfy`` must not pay.

- if ``transformers.pytorch_utils`` is already imported, the rule is registered at once;
- else, if ``transformers`` is installed (``importlib.util.find_spec``, no import), a one-shot
  import hook (:class:`_RegisterOnImport`, on ``sys.meta_path``) registers it right after
  ``transformers.pytorch_utils`` is first imported, i.e. before any model holding a Conv1D can
  exist; the hook then removes itself;
- else nothing happens.

Lookup stays by exact type (``base.rule_for``): a subclass of Conv1D goes to vmap. Were the hook
ever bypassed, Conv1D layers would take the vmap route: exact, only slower, and shown by
``dpfy explain``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType, SimpleNamespace
from typing import Any, Sequence

from torch import nn

from dpfy.grads.rules.base import RULES, register_rule
from dpfy.grads.rules.linear import LinearRule

__all__ = ["Conv1DRule", "conv1d_rule_registered"]

_MODULE = "transformers.pytorch_utils"  # where transformers defines Conv1D


def _as_linear(layer: nn.Module) -> SimpleNamespace:
    """The Conv1D ``layer`` under ``nn.Linear``'s names: weight (d_out, d_in) is W's transpose."""
    return SimpleNamespace(
        in_features=layer.nx, out_features=layer.nf, weight=layer.weight.T, bias=layer.bias
    )


class Conv1DRule(LinearRule):
    """The Linear rule with the weight's per-sample gradients and weighted sums transposed."""

    def grad_sample(self, layer, a, g):
        gs = super().grad_sample(_as_linear(layer), a, g)  # sensitive: weight (B, d_out, d_in)
        gs["weight"] = gs["weight"].transpose(1, 2)  # (B, d_in, d_out) sensitive, a view
        return gs

    def prefers_ghost(self, layer, a, g):
        return super().prefers_ghost(_as_linear(layer), a, g)

    def sq_norm(self, layer, a, g):
        return super().sq_norm(_as_linear(layer), a, g)  # (B,) each; the transpose keeps ‖·‖_F

    def weighted_sum(self, layer, a, g, w):
        out = super().weighted_sum(_as_linear(layer), a, g, w)
        out["weight"] = out["weight"].T.contiguous()  # (d_in, d_out), W's own layout
        return out


def _register(module: ModuleType) -> None:
    """Register :class:`Conv1DRule` for ``module.Conv1D`` (once)."""
    conv1d = getattr(module, "Conv1D", None)
    if isinstance(conv1d, type) and conv1d not in RULES:
        register_rule(conv1d)(Conv1DRule)


def conv1d_rule_registered() -> bool:
    """Whether transformers' Conv1D has this rule now (False until transformers is imported)."""
    module = sys.modules.get(_MODULE)
    conv1d = getattr(module, "Conv1D", None) if module is not None else None
    return conv1d is not None and isinstance(RULES.get(conv1d), Conv1DRule)


class _RegisteringLoader(importlib.abc.Loader):
    """Runs the real loader of ``transformers.pytorch_utils``, then registers the rule and puts
    the real loader back on the module (nothing of ours stays attached to it)."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader
        _register(module)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """One-shot post-import hook for ``transformers.pytorch_utils`` (see module docstring).

    It finds nothing itself: it asks the finders after it for the module's spec and wraps that
    spec's loader in :class:`_RegisteringLoader`; every other name is left to them.
    """

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _MODULE:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot; also keeps the search below off this finder
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None


def _install() -> None:
    """Register now if transformers' Conv1D is loaded; else hook its import if installed."""
    module: Any = sys.modules.get(_MODULE)
    if module is not None:
        _register(module)
    elif importlib.util.find_spec("transformers") is not None:
        if not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _RegisterOnImport())


_install()
