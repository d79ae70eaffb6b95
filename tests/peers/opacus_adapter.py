"""Run Opacus 1.6's per-layer test cases (``opacus/tests/grad_samples``) through dpfy's engine.

Opacus's cases call ``self.run_test(x, module, batch_first=..., chunk_method=...)`` with the
inputs and module hypothesis drew. :class:`DpfyRunTest` replaces that method: the case is
checked against dpfy instead of Opacus. The reference is Opacus's own float64 microbatch loop
(``compute_microbatch_grad_sample``: one example at a time, its L1 loss against zeros, the loss
Opacus's cases use), on a float64 copy of the module. dpfy's side is the engine a private
optimizer uses (``GradEngine``, route="auto", bound to the case's batch size like the private
loader binds it): per-sample squared norms per parameter and one weighted sum Σ_i w_i g_i.

Every case must end one of two ways, never a third: it **matches** the loop, or it is
**refused** with a ``ValueError`` (``PrivacyRefusal`` included) whose message names a module of
the case. A mismatch (silently wrong) or any other exception fails the case.
"""

from __future__ import annotations

import collections
import copy
from typing import Any, Callable

import torch
from hypothesis import HealthCheck, settings
from opacus.utils.per_sample_gradients_utils import (ModelWithLoss, compute_microbatch_grad_sample,
                                                    is_batch_empty, unpack_packedsequences)
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from dpfy.grads import GradEngine

__all__ = ["DpfyRunTest", "adapt", "OUTCOMES", "BY_CASE", "check_case"]

OUTCOMES: collections.Counter[str] = collections.Counter()   # "match", "refused", ... per run
BY_CASE: collections.Counter[tuple[str, str]] = collections.Counter()   # (case class, outcome)


def _module_names(module: nn.Module) -> set[str]:
    return {type(m).__name__ for m in module.modules()}


def _double(x: Any) -> Any:
    if isinstance(x, PackedSequence):
        return x._replace(data=x.data.double())
    if isinstance(x, tuple):
        return tuple(_double(t) for t in x)
    return x.double() if torch.is_floating_point(x) else x


def _batch_size(x: Any, batch_first: bool, chunk_method: Callable) -> int:
    if isinstance(x, PackedSequence):
        return len(unpack_packedsequences(x))
    if chunk_method is not iter:
        return len(list(chunk_method(x)))
    return x.shape[0 if batch_first else 1]


def _reference(x: Any, module: nn.Module, batch_first: bool, reduction: str,
               chunk_method: Callable) -> dict[str, torch.Tensor]:
    """Opacus's microbatch loop in float64: {name: (B, *θ)}."""
    m64 = copy.deepcopy(module).double()
    x64 = _double(x)
    if isinstance(x64, PackedSequence):
        x64 = unpack_packedsequences(x64)
    return compute_microbatch_grad_sample(x64, m64, batch_first=batch_first,
                                          loss_reduction=reduction, chunk_method=chunk_method)


class _TimeFirst(nn.Module):
    """A batch-first model around a case's time-first module: ``inner(x.transpose(0, 1))``.

    dpfy's loader always yields batch-first batches (examples stacked on dim 0); a case with
    ``batch_first=False`` is what a model that feeds a time-first layer looks like to dpfy.
    """

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> Any:
        return self.inner(x.transpose(0, 1))


def check_case(x: Any, module: nn.Module, *, batch_first: bool, reduction: str,
               chunk_method: Callable = iter, rtol: float = 1e-4) -> str:
    """"match" or "refused"; raises AssertionError for a silent mismatch (see module doc)."""
    b = 0 if not isinstance(x, PackedSequence) and is_batch_empty(x) else \
        _batch_size(x, batch_first, chunk_method)
    ref = _reference(x, module, batch_first, reduction, chunk_method) if b else None
    model: nn.Module = copy.deepcopy(module)
    if not batch_first and torch.is_tensor(x):
        # the batch as a loader yields it: examples stacked in dim 0, contiguous
        model, x = _TimeFirst(model), x.transpose(0, 1).contiguous()
    try:
        eng = GradEngine(model, route="auto", loss_reduction=reduction)
    except ValueError as err:
        return _refused(err, module)
    try:
        if hasattr(eng, "bind_batch"):
            eng.bind_batch(b)
        ModelWithLoss(model, reduction)(x).backward()
        sq = {n.removeprefix("inner."): t
              for n, t in eng.per_sample_sq_norms().items()}     # {name: (B,)}
        w = torch.linspace(0.5, 1.5, b) if b else torch.zeros(0)
        sums = {n.removeprefix("inner."): t for n, t in
                eng.weighted_sums({n: w for n, _ in eng.named_params}).items()}
    except ValueError as err:
        return _refused(err, module)
    finally:
        eng.detach()
    if not b:
        assert all(t.numel() == 0 for t in sq.values())
        assert all(float(s.abs().max()) == 0 for s in sums.values() if s.numel())
        return "match"
    assert set(sq) == set(ref), (sorted(sq), sorted(ref))
    flat = {n: g.reshape(b, -1) for n, g in ref.items()}            # (B, P) float64 each
    w64 = w.double()
    # Errors are relative to the case's scale (the largest per-example total norm), so that a
    # parameter whose true gradient is 0 (an L1 loss's signs cancelling) is judged fairly.
    total_sq = sum(g.square().sum(1) for g in flat.values())          # (B,)
    scale_sq = float(total_sq.max()) + 1e-30
    scale = scale_sq ** 0.5 * float(w64.abs().sum())
    for n, g in flat.items():
        err_sq = float((sq[n].double() - g.square().sum(1)).abs().max()) / scale_sq
        assert err_sq <= rtol, f"per-sample norm² of {n}: relative error {err_sq:.2e}"
        want = (w64[:, None] * g).sum(0)
        err = float((sums[n].double().reshape(-1) - want).abs().max()) / scale
        assert err <= rtol, f"weighted sum of {n}: relative error {err:.2e}"
    return "match"


def _refused(err: ValueError, module: nn.Module) -> str:
    msg = str(err)
    names = _module_names(module)
    assert any(n in msg for n in names), (
        f"a refusal must name the module (one of {sorted(names)}), got: {msg}")
    return "refused"


class DpfyRunTest:
    """Mixin: Opacus's ``run_test`` replaced by the dpfy check, for both loss reductions."""

    def run_test(self, x: Any, module: nn.Module, batch_first: bool = True,
                 atol: float = 1e-5, rtol: float = 1e-4, ew_compatible: bool = True,
                 chunk_method: Callable = iter) -> None:
        """Check one drawn case for both loss reductions: a match or a named refusal."""
        for reduction in ("sum", "mean"):
            outcome = check_case(x, module, batch_first=batch_first, reduction=reduction,
                                 chunk_method=chunk_method, rtol=max(rtol, 1e-4))
            OUTCOMES[outcome] += 1
            BY_CASE[type(self).__name__, outcome] += 1


def adapt(case: type, examples: int) -> type:
    """A subclass of an Opacus case class checked by dpfy, ``examples`` hypothesis draws per
    test (derandomized: the same draws every run), tests that do not call run_test dropped."""
    attrs: dict[str, Any] = {"__module__": __name__, "__qualname__": case.__name__}
    for name in dir(case):
        fn = getattr(case, name)
        if not name.startswith("test"):
            continue
        inner = getattr(fn, "hypothesis", None)
        if inner is None or "run_test" not in inner.inner_test.__code__.co_names:
            attrs[name] = None          # not a per-layer case (Opacus-internal checks)
            continue
        old = fn._hypothesis_internal_use_settings
        attrs[name] = _with_settings(fn, settings(
            old, max_examples=examples, derandomize=True, database=None, deadline=None,
            suppress_health_check=list(HealthCheck)))
    return type(case.__name__, (DpfyRunTest, case), attrs)


def _with_settings(fn: Callable, s: settings) -> Callable:
    """``fn`` (a hypothesis test) under settings ``s``, without touching Opacus's function."""
    import functools

    @functools.wraps(fn)
    def run(self: Any) -> None:
        old = fn._hypothesis_internal_use_settings
        fn._hypothesis_internal_use_settings = s
        try:
            fn(self)
        finally:
            fn._hypothesis_internal_use_settings = old
    return run
