"""DPTrainer's loss for token-level labels is each example's own token mean, averaged over the
batch (issue 35 §2).

Hugging Face's causal-LM (and masked-LM, token-classification) loss is one token mean over the
whole padded batch: with examples of unequal label counts, example i's gradient is divided by
the *batch's* count, so one example's presence rescales the others' contributions and clipping
no longer bounds it. The reference for ℓ_i here is transformers itself: the model's own loss on
example i alone (``model(**batch_i).loss``, the token mean of that one example, shifted as HF
shifts), so nothing is taken from the code under test.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from dpfy.hf import DPArguments, DPTrainer
import oracles
from hf_models import V, T, Tokens, per_example_grads, tiny_gpt2

BIG = 100.0  # a clipping threshold above every example's gradient norm here


def _args(tmp_path, **kw) -> transformers.TrainingArguments:
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=1,
                learning_rate=1.0, optim="sgd", weight_decay=0.0, lr_scheduler_type="constant",
                logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
                disable_tqdm=True, seed=0)
    return transformers.TrainingArguments(**{**base, **kw})


def tiny_bert_tokens(seed: int = 0) -> transformers.BertForTokenClassification:
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=37,
                                  max_position_embeddings=64, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, num_labels=3)
    return transformers.BertForTokenClassification(cfg).train()


class TokenLabels(Tokens):
    """Token classification: a label in {0, 1, 2} per token, −100 on the padded tail of every
    third example (as a tokenizer's word alignment leaves it)."""

    def __init__(self, n: int = 48) -> None:
        super().__init__(n, task="lm", pad=True)
        g = torch.Generator().manual_seed(1)
        tags = torch.randint(0, 3, (n, T), generator=g)
        self.labels = torch.where(self.labels == -100, self.labels, tags)


def tiny_t5(seed: int = 0) -> transformers.T5ForConditionalGeneration:
    torch.manual_seed(seed)
    cfg = transformers.T5Config(vocab_size=V, d_model=32, d_kv=16, d_ff=37, num_layers=1,
                                num_heads=2, dropout_rate=0.0, decoder_start_token_id=0)
    return transformers.T5ForConditionalGeneration(cfg).train()


CASES = {"gpt2-causal": (tiny_gpt2, lambda: Tokens(48, task="lm", pad=True)),
         "bert-token-classification": (tiny_bert_tokens, TokenLabels),
         # seq2seq: the labels are the decoder's targets (not shifted), −100 where ignored
         "t5-seq2seq": (tiny_t5, lambda: Tokens(48, task="lm", pad=True))}


@pytest.mark.parametrize("case", list(CASES))
def test_the_trainers_loss_is_the_mean_of_each_examples_own_loss(tmp_path, case):
    build, data = CASES[case]
    model, ds = build(), data()
    rows = [1, 2, 4, 3]  # example 3 has 4 ignored labels, the others none: it sits last
    batch = {k: torch.stack([ds[i][k] for i in rows]) for k in ds[0]}
    own = torch.stack([model(**{k: v[i:i + 1] for k, v in batch.items()}).loss
                       for i in range(len(rows))])  # transformers' loss of each example alone
    trainer = DPTrainer(model=model, args=_args(tmp_path), train_dataset=ds,
                        dp_args=DPArguments(noise_multiplier=1.0, target_delta=1e-3))
    got = trainer.compute_loss(model, dict(batch))
    # float32 logits and sums over 12 tokens of 4 examples: a few ulps of losses of order 5
    torch.testing.assert_close(got, own.mean(), rtol=1e-5, atol=1e-6)
    # the premise: the Trainer's loss before (HF's one token mean over the batch) is told apart
    # from the per-example mean by more than 5 times the tolerance above (seeded: measured
    # 6× for T5, whose padded example's loss is near the others', about 80× for GPT-2)
    hf_batch_mean = model(**batch).loss
    assert abs(float(hf_batch_mean - own.mean())) > 5 * (1e-5 * float(own.mean()) + 1e-6)


def test_one_private_step_applies_each_examples_own_gradient(tmp_path):
    """σ = 0, plain SGD with lr 1: the update is −Σ_i clip_C(g_i)/b, g_i the float64 gradient of
    example i's own HF loss (docs/engine.md). C is above every ‖g_i‖ here: clipping a gradient
    scaled by a batch-dependent factor (HF's batch token mean) to C would hide the factor, an
    unclipped one shows it."""
    model, ds = tiny_gpt2(), Tokens(48, task="lm", pad=True)
    reference = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    seen: list[dict] = []

    class Recording(DPTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            seen.append({k: v.clone() for k, v in inputs.items()})
            return super().training_step(model, inputs, num_items_in_batch)

    trainer = Recording(model=model, args=_args(tmp_path, per_device_train_batch_size=16),
                        train_dataset=ds,
                        dp_args=DPArguments(noise_multiplier=0.0, target_delta=1e-3,
                                            max_grad_norm=BIG, extra={"seed": 3}))
    trainer.train()
    (batch,) = seen
    kept = (batch["labels"] != -100).sum(1)
    assert len(set(kept.tolist())) == 2  # examples of unequal label counts in the batch
    ref = per_example_grads(reference, batch)  # ℓ_i = model(**batch_i).loss, float64
    assert (oracles.per_example_norms(ref) < BIG).all()  # nothing clipped
    expected = oracles.clipped_sum(ref, BIG)
    b = trainer.dp_optimizer.sampler.normalizer  # 16: the expected batch size qN
    for n, p in model.named_parameters():
        want = before[n].double() - expected[n] / b
        # float32 engine against the float64 loop: relative 1e-5 of a step of order C/b
        torch.testing.assert_close(p.detach().double(), want, rtol=1e-5, atol=1e-7)
