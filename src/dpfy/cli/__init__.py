"""The ``dpfy`` command: one module per subcommand under ``dpfy/cli/``.

Each subcommand module defines ``register(subparsers)`` that adds its parser and sets
``func`` to a ``run(args) -> int``.

Exit codes (each failure is one line on stderr, no traceback):

- 0: done.
- 2: bad input, or something dpfy refuses to account (``ValueError`` or ``TypeError``, including
  :class:`dpfy.errors.PrivacyRefusal`): ``dpfy <command>: error: ...`` naming the fix; also
  argparse's usage errors; an optional package a feature needs is missing
  (:class:`dpfy._require.MissingExtra`): the line names the extra to install.
- 3: the privacy budget is spent (:class:`dpfy.errors.BudgetExhausted`): nothing of the refused
  step was released; ``dpfy <command>: budget exhausted: ...``.
- 130: interrupted (Ctrl-C); ``dpfy train`` prints the ``--resume`` command to continue.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from dpfy import __version__
from dpfy._require import MissingExtra
from dpfy.errors import BudgetExhausted

__all__ = [
    "main",
    "add_command",
    "SUBCOMMANDS",
    "EXIT_BAD_INPUT",
    "EXIT_BUDGET_EXHAUSTED",
    "EXIT_INTERRUPTED",
]

EXIT_BAD_INPUT = 2
EXIT_BUDGET_EXHAUSTED = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention

# Each subcommand (a module under dpfy.cli) with its one-line help. ``dpfy --help`` lists them from
# here without importing the modules (they import torch); the chosen one is imported to parse.
SUBCOMMANDS = {
    "account": "ε (or δ) spent by a DP-SGD run or by a recorded ledger",
    "calibrate": "noise multiplier (or sample rate, or steps) for a target (ε, δ)",
    "train": "train a model with differential privacy and write a privacy report",
    "report": "write privacy_report.md/.json and epsilon_over_steps.png for a ledger",
    "explain": "per layer: rule, route and why",
    "methods": "list the registered adaptive methods",
    "audit": "train a configuration with canaries and print its empirical ε lower bounds",
    "tune": "run a hyperparameter grid under one privacy budget and publish the winner",
}


def add_command(
    subparsers: argparse._SubParsersAction,
    name: str,
    doc: str,
    example: str | None = None,
    **options: object,
) -> argparse.ArgumentParser:
    """Subcommand ``name``'s parser: its help line from :data:`SUBCOMMANDS`, its description
    the first line of its module's docstring ``doc``, and ``example`` (a command line) as the
    epilog; ``options`` go to ``add_parser`` as they are."""
    epilog = None if example is None else f"Example: {example}"
    return subparsers.add_parser(
        name,
        help=SUBCOMMANDS[name],
        description=doc.splitlines()[0],
        epilog=epilog,
        **options,  # type: ignore[arg-type]
    )


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``dpfy`` parser, every subcommand registered by its module.

    With ``only``, just that subcommand's module is imported and registered; the others are
    listed by name and help line alone (what ``main`` does, so that ``dpfy --help`` and
    ``dpfy --version`` import no subcommand, hence no torch).
    """
    parser = argparse.ArgumentParser(
        prog="dpfy",
        description="Train PyTorch models with differential privacy, account for them and report "
        "what they spend. `dpfy COMMAND --help` for each command.",
    )
    parser.add_argument("--version", action="version", version=f"dpfy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, summary in SUBCOMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"dpfy.cli.{name}").register(sub)
        else:
            sub.add_parser(name, help=summary)
    return parser


def _command(argv: Sequence[str]) -> str:
    """The subcommand ``argv`` names (its first argument not an option; the top-level parser's
    own options take no value), or "" when there is none."""
    return next((a for a in argv if not a.startswith("-")), "")


def _in_flags(message: str, parser: argparse.ArgumentParser, command: str) -> str:
    """``message`` with Python keywords written as ``command``'s flags (:mod:`dpfy.cli.flags`)."""
    from dpfy.cli.flags import as_flags, flag_names  # local: only errors need it

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return as_flags(message, flag_names(sub.choices[command]))


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(only=_command(argv))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    # TypeError: a wrong type reaching the Python API
    except (ValueError, TypeError, MissingExtra) as e:
        print(
            f"dpfy {args.command}: error: {_in_flags(str(e), parser, args.command)}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    except BudgetExhausted as e:
        print(f"dpfy {args.command}: budget exhausted: {e}", file=sys.stderr)
        return EXIT_BUDGET_EXHAUSTED
    except KeyboardInterrupt:
        print(f"dpfy {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
