"""Module hooks that a copy of the model leaves behind: ``copy.deepcopy`` and pickling.

dpfy hooks the private model (the gradient engine's taps, the buffer guard). A copy of that
model (an EMA, a teacher, a best-model snapshot, ``torch.save(model)``) is a plain model: it is
not private, no optimizer of this run steps it, and a hook of the original would capture its
forward into the original's engine (or, for a closure, fail to pickle). :class:`OwnHook` wraps
such a hook so that its copies, deep or pickled, are :func:`inert_hook`, which does nothing.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["CheckedCopy", "OwnHook", "inert_hook"]


def inert_hook(*args: Any, **kwargs: Any) -> None:
    """What a copied dpfy hook becomes: called like any module hook, changes nothing."""
    return None


def _inert() -> Callable[..., None]:
    return inert_hook


class OwnHook:
    """A hook that belongs to one model: it runs there; a copy of it is :func:`inert_hook`."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> Callable[..., None]:
        return inert_hook

    def __reduce__(self) -> tuple[Callable[[], Callable[..., None]], tuple[()]]:
        return (_inert, ())


class CheckedCopy(OwnHook):
    """An :class:`OwnHook` that runs (with no arguments) before a copy of it is made: a check
    that must pass before a copy of the model exists, deep or pickled (``torch.save(model)``).
    The model-state guard's comparisons still waiting on the device are read this way
    (:mod:`dpfy._deferred`), as they are before ``state_dict()``."""

    __slots__ = ()

    def __deepcopy__(self, memo: dict[int, Any]) -> Callable[..., None]:
        self.fn()
        return inert_hook

    def __reduce__(self) -> tuple[Callable[[], Callable[..., None]], tuple[()]]:
        self.fn()
        return (_inert, ())
