"""Setting values written as text: one rule for ``dpfy train``'s ``KEY=VALUE`` flags and for
``dpfy tune``'s ``--grid NAME=V1,V2,...`` values, so a value means the same in both."""

from __future__ import annotations

from typing import Any

__all__ = ["parse_scalar"]


def parse_scalar(text: str) -> Any:
    """``"3"`` → 3, ``"0.5"`` → 0.5, ``"true"`` → True, anything else stays a string."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)
