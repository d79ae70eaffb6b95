"""One helper for input validation, so every error reads the same way (STYLE.md R3).

Format: ``"<name> must be <constraint>, got <name> = <value>. <fix>."``
"""

from __future__ import annotations

from typing import Any

__all__ = ["require"]


def require(ok: bool, name: str, value: Any, constraint: str, fix: str = "") -> None:
    """Raise ``ValueError`` naming the parameter, the constraint, the value and the fix."""
    if not ok:
        msg = f"{name} must be {constraint}, got {name} = {value!r}."
        if fix:
            msg += f" {fix.rstrip('.')}."
        raise ValueError(msg)
