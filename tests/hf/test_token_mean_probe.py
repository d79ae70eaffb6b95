"""The perturbation probe refuses Hugging Face's causal-LM token mean wherever the example with
another number of label tokens sits in the batch (issue 35 §2).

HF's loss divides the batch's token sum by the batch's count of non-ignored labels, so one
example's label count rescales every other example's gradient. Before the fix the probe changed
example 0 only (its labels replaced by example 1's): when examples 0 and 1 have the same count
the divisor does not move and the mixing was accepted, e.g. with the padded example last.
The summed token loss (``num_items_in_batch=1``, ``loss_reduction="sum"``) is each example's
own, and must still pass wherever the padded example sits.
"""

from __future__ import annotations

import pytest
import torch

from dpfy.errors import PrivacyRefusal
from dpfy.grads import GradEngine
from hf_models import Tokens, tiny_gpt2

DS = Tokens(task="lm", pad=True)  # every third example (0, 3, 6, ...) has 4 labels −100

# rows of DS: the one example whose label count differs from the others' sits first, in the
# middle or last; "longest-last": padded examples with the one full-length example last
BATCHES = {"first": [3, 1, 2, 4], "middle": [1, 2, 3, 4], "last": [1, 2, 4, 3],
           "longest-last": [0, 3, 6, 1]}


def _batch(rows: list[int]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([DS[i][k] for i in rows]) for k in DS[0]}


def _norms(rows: list[int], summed: bool) -> torch.Tensor:
    model = tiny_gpt2()
    eng = GradEngine(model, loss_reduction="sum" if summed else "mean")
    eng.bind_batch(len(rows))
    batch = _batch(rows)
    out = model(**batch, num_items_in_batch=1) if summed else model(**batch)
    out.loss.backward()
    try:
        return sum(eng.per_sample_sq_norms().values())  # (B,)
    finally:
        eng.detach()


@pytest.mark.parametrize("where", list(BATCHES))
def test_hfs_token_mean_is_refused_wherever_the_unequal_example_sits(where):
    rows = BATCHES[where]
    kept = (_batch(rows)["labels"] != -100).sum(1)
    assert len(set(kept.tolist())) == 2  # the batch mixes two label counts (the premise)
    with pytest.raises(PrivacyRefusal, match="output gradient, in the backward pass"):
        _norms(rows, summed=False)


@pytest.mark.parametrize("where", list(BATCHES))
def test_the_summed_token_loss_passes_wherever_the_padded_example_sits(where):
    assert _norms(BATCHES[where], summed=True).shape == (4,)
