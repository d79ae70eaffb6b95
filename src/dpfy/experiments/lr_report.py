"""Tables and plots of ``dpfy experiment lr-fmnist`` (placeholder while runs go)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["summarize"]


def summarize(records: list[dict], out: Path) -> list[Path]:
    return []
