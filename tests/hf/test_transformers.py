"""Hugging Face transformers trained privately as shipped (issue 14 §3).

User code is what an HF user writes: a Dataset of dicts (input_ids, attention_mask, labels), the
default collate, ``loss = model(**batch).loss``. Per-example norms are read from the optimizer's
engine right after ``backward()`` (``opt.grads.per_sample_sq_norms()``, the values the step
clips) and compared with the float64 per-example loop (``hf_models.per_example_grads``).

Matching the loss reduction: dpfy's ``loss_reduction="mean"`` (the default) means the batch loss
is (1/B)·Σ_i ℓ_i. BERT's classification loss is the cross entropy averaged over the B examples,
so ℓ_i = ``model(**batch_i).loss``. GPT-2's LM loss is averaged over all B·(T−1) label tokens;
when every example has the same number of labels that is (1/B)·Σ_i mean_t ℓ_{i,t}, so again
ℓ_i = ``model(**batch_i).loss`` (its own token mean). With ignored (−100) labels of varying
count the token average couples the examples (each example's weight depends on the others'
label counts); there the sum over tokens is used: ``num_items_in_batch=1`` and
``loss_reduction="sum"`` (test below, docs/huggingface.md).
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import dpfy  # noqa: E402
from dpfy.errors import PrivacyRefusal  # noqa: E402
import ledger_events  # noqa: E402
from hf_models import (DropoutReplay, Tokens, assert_norms_match, check_one_step,  # noqa: E402
                       first_batch, per_example_grads, private, tiny_bert, tiny_gpt2)
from dpfy.grads import GradEngine  # noqa: E402


def test_bert_sequence_classification_matches_the_loop():
    check_one_step(tiny_bert(), Tokens())


def test_gpt2_lm_with_tied_head_matches_the_loop():
    ref = check_one_step(tiny_gpt2(), Tokens(task="lm"))
    assert "transformer.wte.weight" in ref and "lm_head.weight" not in ref  # one parameter


def test_gpt2_padded_labels_with_summed_token_loss_match_the_loop():
    # −100 labels of varying count: HF's default token mean would divide each example's loss by
    # the batch's label count (coupling examples); num_items_in_batch=1 sums the tokens instead
    ds = Tokens(task="lm", pad=True)
    check_one_step(tiny_gpt2(), ds, call=lambda m, b: m(**b, num_items_in_batch=1),
                   loss_reduction="sum")


@pytest.mark.parametrize("summed", [False, True])
def test_padded_labels_couple_the_examples_under_hfs_token_mean(summed):
    # Example 1's gradient norm in the batch {1, 2} and in {0, 1, 2}, example 0 padded (4 of
    # its 12 labels −100). HF's token mean divides by the batch's label count, so adding an
    # example rescales example 1's contribution (its sensitivity is no longer its own); the
    # summed token loss (num_items_in_batch=1, loss_reduction="sum") leaves it unchanged.
    ds = Tokens(task="lm", pad=True)
    norms = []
    for rows in (range(1, 3), range(0, 3)):  # ds[0] is padded (every third), 1 and 2 are not
        batch = {k: torch.stack([ds[i][k] for i in rows]) for k in ds[0]}
        model = tiny_gpt2()
        eng = GradEngine(model, loss_reduction="sum" if summed else "mean")
        eng.bind_batch(len(rows))
        out = model(**batch, num_items_in_batch=1) if summed else model(**batch)
        out.loss.backward()
        if not summed and len(rows) >= 3:  # probed (≥ 3 rows): the coupling is refused
            with pytest.raises(PrivacyRefusal, match="output gradient, in the backward pass"):
                eng.per_sample_sq_norms()
            eng.detach()
            return
        sq = sum(eng.per_sample_sq_norms().values())  # (B,)
        eng.detach()
        norms.append(sq[-2].sqrt().item())  # example 1
    # (the token mean's coupling, 2/22 vs 3/29 of the same token-sum gradient, is refused by
    # the perturbation probe at the first batch of ≥ 3 rows, above)
    assert norms[0] == pytest.approx(norms[1], rel=1e-5)


def test_private_steps_change_the_weights_and_are_in_the_ledger():
    model = tiny_bert(dropout=0.1)  # HF's default dropout on
    before = [p.detach().clone() for p in model.parameters()]
    model, opt, dl = private(model, Tokens(), sigma=1.0)
    steps = 0
    for batch in dl:
        opt.zero_grad()
        model(**batch).loss.backward()
        opt.step()
        steps += 1
        if steps == 3:
            break
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert opt.step_count == 3
    assert sum(g.count for g in opt.ledger.step_groups) == 3
    # ε from dp_accounting on three Poisson-sampled Gaussian steps (q = 8/64, σ = 1)
    want = ledger_events.dp_accounting_epsilon(opt.ledger, 1e-5, "rdp")
    assert opt.epsilon(1e-5, accountant="rdp") == pytest.approx(want, rel=1e-6)
    assert opt.ledger.step_groups[0].sample_rate == pytest.approx(8 / 64)


def test_dropout_on_the_default_engine_matches_the_loop_with_the_same_masks():
    # HF's default dropout (0.1 on hidden states and attention probabilities, eager attention
    # so that every dropout is an nn.Dropout): the default engine clips the gradient of the
    # forward that was run, masks included; the loop replays example i's rows of those masks
    model = tiny_bert(dropout=0.1, attn="eager")
    masks = DropoutReplay()
    reference = copy.deepcopy(model)
    masks.replay(reference)
    masks.record(model)
    model, opt, dl = private(model, Tokens())
    batch = first_batch(dl)
    model(**batch).loss.backward()
    sq = opt.grads.per_sample_sq_norms()
    # one forward, then the perturbation probe's training forwards (their masks after): two,
    # and a third where the rows' padding counts differ (grads/perturbation.py, B')
    assert masks.masks and all(len(v) in (3, 4) for v in masks.masks.values())
    ref = per_example_grads(reference, batch, call=lambda m, b: (masks.next_example(),
                                                                  m(**b))[1])
    assert_norms_match(sq, ref)


def test_dropout_is_named_by_the_preflight_under_the_vmap_engine():
    model = tiny_bert(dropout=0.1)
    ds = Tokens()
    batch = {k: torch.stack([ds[i][k] for i in range(3)]) for k in ds[0]}
    assert dpfy.validate(model, batch) == []  # the default route: every layer has a rule
    problems = dpfy.validate(model, batch, route="vmap")  # the forward is recomputed there
    assert problems and "Dropout" in problems[0] and "p = 0.1" in problems[0]


def test_empty_poisson_batch_takes_a_noise_only_step_without_a_forward():
    """HF models cannot run a forward on 0 rows; an empty Poisson batch may skip forward and
    backward and still step: the step releases noise only and is recorded."""
    # q = 1/64: about a third of the batches are empty (the seed makes one come early)
    model, opt, dl = private(tiny_bert(), Tokens(), sigma=1.0, batch_size=1)
    for batch in dl:
        opt.zero_grad()
        empty = batch["input_ids"].shape[0] == 0
        if not empty:  # HF's forward fails on 0 rows: skip it, still step (noise only)
            model(**batch).loss.backward()
        opt.step()
        if empty:
            break
    assert empty and opt.step_count == sum(g.count for g in opt.ledger.step_groups)
