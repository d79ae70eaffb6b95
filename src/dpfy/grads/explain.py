"""``GradEngine.explain()``: per layer, the rule file, the route and why.

A rule layer's route depends on sizes (the rule's ``prefers_ghost``), so it is stated for the
captures present (a forward/backward on an example batch: ``dpfy explain``, the memory
estimate in ``dpfy/memory.py``), else as "ghost or per-sample, by size per batch". A training
batch's route is never stated: a batch's shape can depend on its data (a sequence batch padded
to its longest example), so a route read from it would be a release without noise. The
privacy report records the rows without captures (``GradEngine.explain_planned``): a function
of the model and the route setting alone.
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

from dpfy.grads.capture import Call
from dpfy.grads.rules import rule_for
from dpfy.grads.layers import Layer

__all__ = ["explain_rows"]


def explain_rows(
    layers: list[Layer], used: Callable[[Layer], list[Call]], route: str
) -> list[dict[str, Any]]:
    """One row per layer: module, type, parameter count, rule file, route and why.

    Args:
      layers: the engine's layers.
      used: a layer's captured calls whose outputs the loss depended on.
      route: the engine's ``route`` argument ("auto", "ghost" or "vmap").
    """
    rows = []
    for layer in layers:
        calls = used(layer)
        if layer.rule is None:
            why = (
                "whole model (route='vmap')"
                if layer.name == "" and route == "vmap"
                else "no layer rule for this type; torch.func on its subtree"
                + _own_parameters_fix(layer.module)
            )
            rows.append(layer.explain(why))
            continue
        row = layer.explain(
            "registered layer rule"
            + "".join(
                f"; {rel} tied to {q} (per-example gradients summed over its uses)"
                for rel, q in layer.tied.items()
            )
        )
        if len(calls) > 1:
            row["route"], row["why"] = "per-sample", f"called {len(calls)} times per batch"
        elif calls:
            c = calls[0]
            ghost = c.eager is None and layer.takes_ghost(c.args[0], c.grads[0])
            row["route"] = "ghost" if ghost else "per-sample"
            row["why"] = (
                "ghost norm is cheaper than per-sample gradients at this size"
                if ghost
                else "per-sample gradients are cheaper at this size"
                if layer.rule.has_ghost
                else "per-sample gradients are small"
            )
        rows.append(row)
    return rows


def _own_parameters_fix(module: nn.Module) -> str:
    """The fix when a module without a rule holds parameters itself (a ViT's class and
    position tokens, a temperature on the root) above layers that have rules: those parameters
    alone send its whole subtree to torch.func (slower than the rules)."""
    own = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
    ruled = any(rule_for(m) is not None for m in module.modules() if m is not module)
    if not own or not ruled:
        return ""
    return (
        f"; it holds the parameters {own} itself, which alone sends every layer below it "
        f"to torch.func: move them into a small module that is called in forward (e.g. "
        f"one that adds or concatenates the token and returns the result), so that only "
        f"it goes to torch.func and the layers below keep their rules"
    )
