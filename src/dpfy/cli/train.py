"""``dpfy train``: private training from flags and/or a TOML/YAML config file.

Every :class:`~dpfy.train.config.TrainConfig` field is one flag of the same name
(``noise_multiplier`` ↔ ``--noise-multiplier``); flags override the config file, which
overrides the defaults. ``--resume DIR`` continues an interrupted run; any setting given again
must match the run's. A run's published ``config.json`` is a valid ``--config`` (it holds no
seed, so the re-run draws fresh noise).

Ctrl-C (or SIGTERM) stops the run with one line: the ``--resume`` command when an epoch
checkpoint exists, else "nothing was saved" (the ``.partial`` directory is removed); exit 130.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from dataclasses import fields
from typing import Any

from dpfy.cli import EXIT_INTERRUPTED, add_command
from dpfy.cli.label_dp import add_flags as add_label_flags, run_label
from dpfy.train.config import TrainConfig, coerce, field_types, load_config_file
from dpfy.train.options import parse_scalar
from dpfy.train.rundir import RunDir

__all__ = ["register", "run", "explicit_settings", "parse_scalar", "train_parser"]


OPTION_EXAMPLES = {"method_options": "kind=time rate=0.5"}


def _options(items: list[str], name: str) -> dict[str, Any]:
    """``KEY=VALUE`` flag values of the setting ``name`` (a key of OPTION_EXAMPLES)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(
                f"{name} must be KEY=VALUE pairs, got {name} = {item!r}. Write "
                f"e.g. --{name.replace('_', '-')} {OPTION_EXAMPLES[name]}"
            )
        out[key] = parse_scalar(value)
    return out


def register(subparsers: argparse._SubParsersAction, *, label_dp: bool = True) -> None:
    """``dpfy train``'s parser; ``label_dp=False`` leaves out the label-DP flags (the commands
    that reuse these flags, ``dpfy tune`` and ``dpfy audit``, run example-level DP only)."""
    p = add_command(
        subparsers, "train", __doc__, "dpfy train --out runs/fmnist   (Fashion-MNIST, ε=3, δ=1e-5)"
    )
    p.add_argument("--config", metavar="FILE", help="TOML or YAML file of settings")
    p.add_argument(
        "--out", metavar="DIR", help="new output directory (default: runs/<dataset>-<time>)"
    )
    p.add_argument("--resume", metavar="DIR", help="continue the interrupted run in DIR")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    types = field_types()
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        default = "none" if f.default is None else f.default
        help_ = f.metadata["help"]
        help_ += "" if "default" in help_ else f" (default: {default})"
        if f.name == "method":
            p.add_argument(
                flag, action="append", default=argparse.SUPPRESS, help=help_, metavar="NAME"
            )
        elif types[f.name] is dict:
            p.add_argument(
                flag, nargs="+", metavar="KEY=VALUE", default=argparse.SUPPRESS, help=help_
            )
        else:
            p.add_argument(
                flag,
                type=types[f.name],
                default=argparse.SUPPRESS,
                help=help_,
                metavar=f.name.upper(),
            )
    if label_dp:
        add_label_flags(p)
    p.set_defaults(func=run)


def train_parser() -> argparse.ArgumentParser:
    """``dpfy train``'s parser (every TrainConfig flag) on its own, as the parent of the
    commands that take the same flags (``dpfy tune``, ``dpfy audit``)."""
    holder = argparse.ArgumentParser(add_help=False).add_subparsers()
    register(holder, label_dp=False)
    return holder.choices["train"]


def add_train_like_parser(
    subparsers: argparse._SubParsersAction, name: str, doc: str, example: str
) -> argparse.ArgumentParser:
    """The parser of command ``name`` that takes every ``dpfy train`` flag (its parent) and adds
    its own: ``doc`` is the command module's docstring, ``example`` the epilog's command line."""
    return add_command(
        subparsers, name, doc, example, parents=[train_parser()], conflict_handler="resolve"
    )


def explicit_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the user gave (config file, then flags on top), as field values."""
    values = load_config_file(args.config) if args.config else {}
    given = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
    for name in OPTION_EXAMPLES:
        if name in given:
            given[name] = _options(given[name], name)
    if "method" in given:
        given["method"] = ",".join(given["method"])
    values.update(coerce(given, source="flags"))
    # A fixed σ replaces the default target ε unless the user also set ε (then both are an error).
    if values.get("noise_multiplier") is not None and "epsilon" not in values:
        values["epsilon"] = None
    # Individualized budgets replace the default target ε likewise (each group has its own).
    if values.get("individual") is not None and "epsilon" not in values:
        values["epsilon"] = None
    return values


def run(args: argparse.Namespace) -> int:
    # Imported here, not at module level: the training loop imports torch, which `dpfy train
    # --help` does not need (start-up time).
    from dpfy.train import resume, train

    settings = explicit_settings(args)
    if getattr(args, "privacy_unit", "example") == "label" or getattr(args, "label_dp", None):
        return run_label(args, settings)
    progress = not args.no_progress
    if args.resume:
        if args.out:
            raise ValueError(
                f"out must be unset with --resume, got out = '{args.out}'. The "
                f"run continues in its own directory; drop --out"
            )
        out, start = args.resume, lambda: resume(args.resume, overrides=settings, progress=progress)
    else:
        cfg = TrainConfig.from_mapping(settings, source="settings")
        out = args.out or f"runs/{cfg.dataset}-{time.strftime('%Y%m%d-%H%M%S')}"

        def start():
            return train(cfg, out=out, progress=progress)

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        start()
    except KeyboardInterrupt:
        print(interrupted_message(out), file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM (``timeout``, ``kill``) stops a run like Ctrl-C, so its cleanup runs."""
    raise KeyboardInterrupt


def interrupted_message(out: str | Path) -> str:
    """One line for an interrupted run: how to resume it, or that nothing was saved."""
    run = RunDir.of(out)
    if run.has_checkpoint() or run.is_complete():
        return (
            f"dpfy train: interrupted; the last finished epoch is saved. Continue with: "
            f"dpfy train --resume {run.final} ({run.staging} holds the secret checkpoint "
            f"(with a seeded run's generator states): never publish it, delete it if you do "
            f"not resume)"
        )
    return (
        "dpfy train: interrupted before the first epoch finished; nothing was saved "
        "(start again with the same command)"
    )
