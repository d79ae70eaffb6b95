"""The privacy report's words for a run, from its run spec.

What a report says about how units entered the steps (the sampling note) and what one unit of
privacy is must be what the run did. Both are read here from the built run's spec
(``optimizer.spec``): the sampler's facts that ``make_private`` filled in
(``spec.sampling.resolved``: Poisson, user-level, shuffled passes, cyclic Poisson, with q) and
the unit (an example, or a user). Every entry point with a spec (``dpfy train``,
``dpfy.hf.DPTrainer``) passes the result to :meth:`dpfy.privacy.report.PrivacyReport.from_ledger`
instead of writing its own text; the words themselves live with the report's other sentences
(:func:`dpfy.privacy.report_text.sampling_note`, :func:`~dpfy.privacy.report_text.unit_text`).
"""

from __future__ import annotations

from typing import TypedDict

from dpfy._require import require
from dpfy.privacy.report_text import sampling_note, unit_text
from dpfy.spec.run import RunSpec

__all__ = ["ReportContext", "report_context"]


class ReportContext(TypedDict):
    """Keyword arguments of ``PrivacyReport.from_ledger``, read from the run spec."""

    unit_of_privacy: str
    sampling_note: str


def report_context(spec: RunSpec, *, steps_per_epoch: int | None) -> ReportContext:
    """``unit_of_privacy`` and ``sampling_note`` of :meth:`PrivacyReport.from_ledger
    <dpfy.privacy.report.PrivacyReport.from_ledger>` for the run ``spec`` describes.

    Args:
      spec: the built run's spec (``optimizer.spec``, with the sampler's facts).
      steps_per_epoch: the loader's logical batches per epoch (``len(loader)``), or None to
        leave them out of the note.
    """
    resolved = spec.sampling.resolved
    require(
        resolved is not None,
        "spec.sampling.resolved",
        None,
        "the built sampler's facts",
        "Pass the private optimizer's spec (optimizer.spec), which make_private fills in",
    )
    assert resolved is not None  # the require above refused None
    return {
        "unit_of_privacy": unit_text(spec.unit.name),
        "sampling_note": sampling_note(resolved.sampling, resolved.sample_rate, steps_per_epoch),
    }
