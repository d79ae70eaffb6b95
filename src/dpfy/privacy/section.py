"""An extra section of the privacy report, as a plain value.

It lives below the report (:mod:`dpfy.privacy.report` renders it) so that what writes one — the
per-group ledgers, a tuning grid, an empirical audit — need not import the report and its
accountants.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["ReportSection"]


@dataclass(frozen=True)
class ReportSection:
    """An extra section of the report, written by a feature that has more to say (a tuning
    grid's runs, per-group budgets, an empirical audit).

    Rendered after the model section as ``## {title}`` followed by ``lines`` (Markdown), and
    kept in the JSON (with ``data``, machine-readable) so ``dpfy report`` re-renders it.
    """

    title: str
    lines: tuple[str, ...]
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "lines": list(self.lines), "data": dict(self.data)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ReportSection":
        return cls(
            title=str(d["title"]), lines=tuple(d.get("lines", ())), data=dict(d.get("data", {}))
        )
