"""Reading a ledger file (``dpfy-ledger/1``, what :meth:`~dpfy.privacy.ledger.Ledger.to_json`
writes): every field is checked before it is used.

A ledger file comes from outside the process (``dpfy account``, ``--resume``), so a wrong,
missing or inconsistent field raises a one-line ``ValueError`` naming the source (e.g. the
file) and the field, e.g. ``groups[2].sample_rate``, instead of a ``KeyError`` or a wrong ε.
"""

from __future__ import annotations

import json
import math
from typing import Any

from dpfy._require import require
from dpfy.privacy.ledger_records import NOISES, Release, StepGroup
from dpfy.types.sampling import Sampling

__all__ = ["LEDGER_FORMAT", "parse_ledger_json", "checked_ledger_fields"]

# The format tag every ledger file carries (Ledger.to_dict writes it).
LEDGER_FORMAT = "dpfy-ledger/1"


def parse_ledger_json(text: str, source: str) -> Any:
    """The JSON value of a ledger file; invalid JSON raises naming ``source``, line and column."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{source} must be valid JSON, got {e.msg.lower()} at line "
            f"{e.lineno} column {e.colno}. Pass the ledger.json written by "
            f"dpfy train (or Ledger.to_json()); an empty or cut-off file "
            f"comes from a run that did not finish"
        ) from None


def checked_ledger_fields(d: Any, source: str) -> tuple[int | None, list[StepGroup]]:
    """The dataset size and the step groups of a serialized ledger, every field checked.

    The groups must be contiguous (each starts where the previous ones end) and, when the
    file says ``num_steps``, hold exactly that many steps.
    """
    _expect(isinstance(d, dict), source, "", d, "a JSON object")
    _expect(
        d.get("format") == LEDGER_FORMAT,
        source,
        "format",
        d.get("format"),
        f"'{LEDGER_FORMAT}'",
        "This is not a dpfy ledger",
    )
    _known_keys(d, _LEDGER_KEYS, source, "")
    size = d.get("dataset_size")
    _expect(
        size is None or _is_int(size) and size >= 1,
        source,
        "dataset_size",
        size,
        "null or an integer >= 1",
    )
    groups = d.get("groups")
    _expect(isinstance(groups, list), source, "groups", groups, "a list of step groups")
    assert isinstance(groups, list), "_expect raised otherwise"
    out: list[StepGroup] = []
    num_steps = 0  # the steps of the groups read so far
    for i, g in enumerate(groups):
        sg = _group_from_dict(g, source, f"groups[{i}]")
        _expect(
            sg.first_step == num_steps,
            source,
            f"groups[{i}].first_step",
            sg.first_step,
            f"{num_steps} (groups must be contiguous)",
            "The ledger is corrupt: a step is missing or counted twice",
        )
        out.append(sg)
        num_steps += sg.count
    if "num_steps" in d:
        _expect(
            d["num_steps"] == num_steps,
            source,
            "num_steps",
            d["num_steps"],
            f"{num_steps} (the steps its groups hold)",
            "The ledger is corrupt: a step is missing or counted twice",
        )
    return size, out


_LEDGER_FIX = "Pass the ledger.json written by dpfy train (or Ledger.to_json()) unchanged"


# the fields to_dict writes: a key outside them (a misspelt max_examples_per_user, a field
# of another format) would be ignored while the ε read from the file depends on it
_LEDGER_KEYS = ("format", "dataset_size", "num_steps", "groups")
_GROUP_KEYS = (
    "first_step",
    "count",
    "sampling",
    "sample_rate",
    "releases",
    "max_examples_per_user",
)
_RELEASE_KEYS = ("mechanism", "noise_multiplier", "noise", "period")


def _known_keys(d: dict[str, Any], keys: tuple[str, ...], source: str, where: str) -> None:
    """Refuse a field this format does not define rather than account without it."""
    unknown = sorted(str(k) for k in d if k not in keys)
    _expect(
        not unknown,
        source,
        f"{where}.keys" if where else "keys",
        unknown,
        f"among {list(keys)}",
        "Remove or correct the unknown fields; dpfy cannot account what it does not read",
    )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _expect(
    ok: bool, source: str, field_name: str, value: Any, constraint: str, fix: str = _LEDGER_FIX
) -> None:
    """``require`` for one field of a serialized ledger: the name says file and field."""
    require(ok, f"{source} field {field_name}" if field_name else source, value, constraint, fix)


def _group_from_dict(g: Any, source: str, where: str) -> StepGroup:
    """One step group of a serialized ledger, each field checked before it is used."""
    _expect(isinstance(g, dict), source, where, g, "a JSON object")
    _known_keys(g, _GROUP_KEYS, source, where)
    for key in ("first_step", "count"):
        _expect(_is_int(g.get(key)), source, f"{where}.{key}", g.get(key), "an integer")
    _expect(
        g.get("sampling") in [m.value for m in Sampling],
        source,
        f"{where}.sampling",
        g.get("sampling"),
        f"one of {[m.value for m in Sampling]}",
    )
    _expect(
        _is_number(g.get("sample_rate")),
        source,
        f"{where}.sample_rate",
        g.get("sample_rate"),
        "a finite number",
    )
    releases = g.get("releases")
    _expect(
        isinstance(releases, list) and len(releases) >= 1,
        source,
        f"{where}.releases",
        releases,
        "a non-empty list of releases",
    )
    for j, r in enumerate(releases):
        at = f"{where}.releases[{j}]"
        _expect(isinstance(r, dict), source, at, r, "a JSON object")
        _known_keys(r, _RELEASE_KEYS, source, at)
        _expect(
            isinstance(r.get("mechanism"), str),
            source,
            f"{at}.mechanism",
            r.get("mechanism"),
            "a string",
        )
        _expect(
            _is_number(r.get("noise_multiplier")),
            source,
            f"{at}.noise_multiplier",
            r.get("noise_multiplier"),
            "a finite number",
        )
        _expect(
            r.get("noise", "gaussian") in NOISES,
            source,
            f"{at}.noise",
            r.get("noise"),
            f"one of {list(NOISES)}",
        )
        _expect(
            r.get("period") is None or _is_int(r.get("period")),
            source,
            f"{at}.period",
            r.get("period"),
            "null or an integer",
        )
    k = g.get("max_examples_per_user")
    _expect(
        k is None or _is_int(k),
        source,
        f"{where}.max_examples_per_user",
        k,
        "absent, null or an integer",
    )
    try:
        return StepGroup(
            first_step=g["first_step"],
            count=g["count"],
            sampling=Sampling(g["sampling"]),
            sample_rate=float(g["sample_rate"]),
            releases=tuple(Release.from_dict(r) for r in releases),
            max_examples_per_user=k,
        )
    except ValueError as e:  # the range checks of StepGroup and Release
        raise ValueError(f"{source} field {where}: {e}") from None
