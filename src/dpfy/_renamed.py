"""Old public attribute names kept readable after a rename: one property that warns.

Issue 37 named apart what "groups" and "units" meant; each renamed attribute keeps its former
name as a read-only property that returns the new attribute and emits a
``DeprecationWarning`` naming the replacement, so code written against the old name still
runs and is told what to change.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["renamed_attribute"]


def renamed_attribute(old: str, new: str, use: str) -> property:
    """A read-only property for the former name ``old`` (``"Class.attr"``, for the message)
    that returns ``self.<new>`` and warns "<old> is deprecated, got a read of the old name;
    use <use>"."""

    def read(self: Any) -> Any:
        warnings.warn(
            f"{old} is deprecated, got a read of the old name; use {use}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(self, new)

    read.__doc__ = f"Deprecated name of :attr:`{new}`."
    return property(read)
