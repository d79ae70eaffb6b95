"""``dpfy explain MODEL``: per layer, the rule, the route and why.

MODEL is a model-zoo name (``dpfy.models``) or ``package.module:factory`` (a callable returning
an ``nn.Module``). With an input shape, one forward/backward on a random batch decides the route
each layer takes at that size (ghost norm or materialized per-sample gradients), and the
pre-flight (:func:`dpfy.validate` with an example batch) lists every problem a private step on
such a batch would raise, each naming the module and the fix.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

import torch
from torch import nn

from dpfy.cli import add_command
from dpfy._require import require
from dpfy.grads import ROUTES, GradEngine
from dpfy.memory import format_memory
from dpfy.models import build_model
from dpfy.validation import validate

__all__ = ["register", "run", "explain_model", "format_table"]


def _build(spec: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The model named by ``spec``: a zoo name, or ``package.module:factory`` called with no
    arguments; a spec that names no model is a one-line error (ValueError), not a traceback."""
    if ":" in spec:
        module, _, attr = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(
                f"model {spec!r} cannot be found ({e}). Give a model-zoo name or "
                f"package.module:factory importable from here"
            ) from None
        model = factory() if callable(factory) else factory
        require(
            isinstance(model, nn.Module),
            "model",
            spec,
            "a factory returning a torch.nn.Module",
            "Name a function that builds the model, e.g. mypkg.models:build",
        )
        return model
    return build_model(spec, input_shape=input_shape, num_classes=num_classes)


def _shape(text: str) -> tuple[int, ...]:
    """``--input-shape`` as positive integers ("" or "," skips the probe)."""
    try:
        shape = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        shape = None
    require(
        shape is not None and all(d >= 1 for d in shape),
        "--input-shape",
        text,
        "positive integers separated by commas",
        "Write e.g. --input-shape 1,28,28",
    )
    assert shape is not None  # the require above refused None
    return shape


def explain_model(
    model: nn.Module, *, route: str = "auto", example: torch.Tensor | None = None
) -> list[dict[str, Any]]:
    """The engine's table for ``model``; with ``example``, routes decided at that size."""
    eng = GradEngine(model, route=route, loss_reduction="sum")
    try:
        if example is not None:
            out = model(example)
            out.float().square().sum().backward()
        return eng.explain()
    finally:
        eng.detach()


def format_table(rows: list[dict[str, Any]]) -> str:
    cols = ["module", "type", "params", "rule", "route", "why"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "explain", __doc__)
    p.add_argument("model", help="model-zoo name or package.module:factory")
    p.add_argument(
        "--input-shape",
        default="1,28,28",
        help="one example's shape, e.g. 1,28,28 (empty: skip the probe)",
    )
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument(
        "--batch-size",
        type=int,
        default=256,
        help="batch size of the probe (routes depend on sizes)",
    )
    p.add_argument(
        "--route",
        default="auto",
        choices=list(ROUTES),
        help="auto: layer rules, vmap for modules without one; ghost: rules only; "
        "vmap: torch.func on the whole model",
    )
    p.add_argument(
        "--memory",
        action="store_true",
        help="print the memory estimate per layer at --batch-size (dpfy.memory) "
        "next to the measured peak of one private step",
    )
    p.add_argument(
        "--bands",
        type=int,
        metavar="B",
        action="append",
        help="with --memory: the noise buffer of --noise bandmf --bands B "
        "(repeatable; default 4, 16 and 64)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    shape = _shape(args.input_shape)
    require(args.batch_size >= 1, "batch_size", args.batch_size, ">= 1")
    model = _build(args.model, shape, args.num_classes)
    example = torch.randn(args.batch_size, *shape) if shape else None
    print(format_table(explain_model(model, route=args.route, example=example)))
    if example is not None:  # the pre-flight: every problem of a private step, at once
        problems = validate(model, example[:4], route=args.route)
        assert isinstance(problems, list)  # without fix=True validate lists the problems
        print("\nProblems (dpfy.validate on a 4-row batch): " + ("none" if not problems else ""))
        print("\n".join(f"- {p}" for p in problems))
    if args.memory:
        require(example is not None, "--input-shape", args.input_shape, "given with --memory")
        assert example is not None  # the require above refused None
        print(format_memory(model, example, route=args.route))
        print(noise_memory(model, args.bands or [4, 16, 64]))
    return 0


def noise_memory(model: nn.Module, bands: list[int]) -> str:
    """The correlated mechanisms' noise state beyond DP-SGD (float32, kept between steps):
    BandMF (b − 1)·d floats, the tree at most ⌈log2(P + 1)⌉·d for P steps per pass."""
    d = sum(p.numel() for p in model.parameters() if p.requires_grad)
    mib = 4 / 2**20
    lines = [f"noise state kept between steps (d = {d:,} trainable parameters; DP-SGD: none):"]
    for b in bands:
        require(b >= 1, "bands", b, ">= 1")
        lines.append(
            f"- --noise bandmf --bands {b}: (b - 1) x d = {(b - 1) * d:,} floats = "
            f"{(b - 1) * d * mib:.3f} MiB"
        )
    lines.append(
        f"- --noise tree: at most ceil(log2(P + 1)) x d floats for P steps per pass "
        f"(P = 469: {9 * d * mib:.3f} MiB)"
    )
    return "\n".join(lines)
