"""The ``dpfy`` command: one module per subcommand under ``dpfy/cli/``.

Each subcommand module defines ``register(subparsers)`` that adds its parser and sets
``func`` to a ``run(args) -> int``. A ``ValueError`` (bad input) or ``UsageError`` becomes a
one-line ``dpfy: error: ...`` on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

__all__ = ["main", "SUBCOMMANDS"]

# Module names under dpfy.cli; a module that does not exist yet is skipped.
SUBCOMMANDS = ("account", "calibrate", "train", "report", "bench", "explain", "experiment")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpfy", description=__doc__.splitlines()[0])
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
    except ValueError as e:
        print(f"dpfy {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
