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

__all__ = ["main", "SUBCOMMANDS", "EXIT_BAD_INPUT", "EXIT_BUDGET_EXHAUSTED", "EXIT_INTERRUPTED"]

EXIT_BAD_INPUT = 2
EXIT_BUDGET_EXHAUSTED = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention

# Module names under dpfy.cli; a module that does not exist yet is skipped.
SUBCOMMANDS = (
    "account",
    "calibrate",
    "train",
    "report",
    "bench",
    "explain",
    "methods",
    "audit",
    "tune",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpfy", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dpfy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"dpfy.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"dpfy.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    # TypeError: a wrong type reaching the Python API
    except (ValueError, TypeError, MissingExtra) as e:
        print(f"dpfy {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BudgetExhausted as e:
        print(f"dpfy {args.command}: budget exhausted: {e}", file=sys.stderr)
        return EXIT_BUDGET_EXHAUSTED
    except KeyboardInterrupt:
        print(f"dpfy {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
