"""Error messages in the command line's own syntax.

dpfy's checks live below the CLI and name Python keywords (``bands must be ..., got bands =
None. Pass noise='bandmf', bands=b``). A user of ``dpfy train`` never typed a keyword: at the
CLI boundary :func:`as_flags` rewrites every name that is a flag of the running subcommand
into that flag (``--bands``, ``--noise bandmf``), including ``make_private``'s keywords that
the command fills from a differently named flag (:data:`ALIASES`). Only names that open a
check (``NAME must ...``), follow ``got`` or carry ``=`` are rewritten, and names with an
underscore or a dot (identifiers, never English words) wherever they stand, so ordinary words
that happen to be flags (``model``, ``clip``) stay words.
"""

from __future__ import annotations

import argparse
import functools
import re

__all__ = ["as_flags", "flag_names", "ALIASES"]

# make_private's keyword (or the object it checks) -> the TrainConfig field / flag dest it is
# filled from (dpfy/train/private.py: run_options).
ALIASES = {
    "target_epsilon": "epsilon",
    "target_delta": "delta",
    "max_grad_norm": "clip",
    "max_physical_batch_size": "physical_batch_size",
    "loader.batch_size": "batch_size",
}


def flag_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Python name -> the parser's long flag, for every optional argument of ``parser`` (and
    the :data:`ALIASES` of those it has)."""
    names = {
        a.dest: next((s for s in a.option_strings if s.startswith("--")), a.option_strings[0])
        for a in parser._actions
        if a.option_strings and a.dest not in ("help", argparse.SUPPRESS)
    }
    names.update({k: names[v] for k, v in ALIASES.items() if v in names})
    return names


def _keyword(flag: str, match: re.Match[str]) -> str:
    value = match.group("value")
    if value in ("None", "", "True"):  # keyword=True is a switch: the bare flag turns it on
        return flag
    return f"{flag} {value.strip(chr(39) + chr(34))}"


def as_flags(message: str, names: dict[str, str]) -> str:
    """``message`` with each Python name of ``names`` written as its flag (see the module).

    A message about a config file's keys is left as it is: its names are the file's keys
    (``batch_size``), which the file must spell that way, not flags."""
    if message.startswith("config file "):
        return message
    for name in sorted(names, key=len, reverse=True):  # loader.batch_size before batch_size
        flag, n = names[name], re.escape(name)
        edge = r"(?<![\w.\-/])"  # not the tail of a longer name, a path or a flag
        message = re.sub(
            edge + n + r"=(?P<value>'[^']*'|\"[^\"]*\"|[^\s,;)]*?(?=\.?(?:[\s,;)]|$)))",
            functools.partial(_keyword, flag),
            message,
        )
        message = re.sub(edge + n + r"(?= must )", flag, message)
        message = re.sub(r"got " + n + r" = ", f"got {flag} = ", message)
        if "_" in name or "." in name:  # an identifier, never an English word: everywhere
            message = re.sub(edge + n + r"(?![\w(/]|\.\w)", flag, message)
    return re.sub(r"(--[\w-]+(?: [^\s,;)]+)?), (?=--)", r"\1 ", message)  # "--a x, --b y"
