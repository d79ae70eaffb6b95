"""Tiny Hugging Face models, dict datasets and the float64 per-example loop for dict batches.

The models are built from tiny configs (nothing is downloaded). The loop is the slow reference
(the math written for one example, the obviously-correct loop kept beside the fast path) for
models called as ``model(**batch)``: for each example i it runs a float64 copy
on that example's rows of every batch entry alone, backpropagates ``loss_of(output, batch_i)``
and reads the gradients of the trainable parameters. ``check_one_step`` is the shared end-to-end
check: norms after the user's ``backward()`` and one σ = 0 step against that loop.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Callable

import torch
import transformers
from torch import nn
from torch.utils.data import DataLoader, Dataset

import dpfy
import oracles

V, T = 100, 12  # vocabulary, sequence length

Batch = dict[str, torch.Tensor]


def tiny_bert(dropout: float = 0.0, attn: str = "sdpa", seed: int = 0
              ) -> transformers.BertForSequenceClassification:
    """The brief's tiny BERT: 2 layers, hidden 32, 2 heads, intermediate 37, 2 labels."""
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=37,
                                  max_position_embeddings=64, hidden_dropout_prob=dropout,
                                  attention_probs_dropout_prob=dropout,
                                  attn_implementation=attn)
    return transformers.BertForSequenceClassification(cfg).train()


def tiny_gpt2(dropout: float = 0.0, seed: int = 0) -> transformers.GPT2LMHeadModel:
    """A tiny GPT-2 whose lm_head weight is tied to the token embedding (HF's default)."""
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                  resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                                  loss_type="ForCausalLM")
    model = transformers.GPT2LMHeadModel(cfg).train()
    assert model.lm_head.weight is model.transformer.wte.weight  # tied
    return model


class Tokens(Dataset):
    """Synthetic token sequences as a tokenizer + datasets pipeline yields them: one dict per
    example (input_ids, attention_mask, labels); the default collate stacks them.

    ``task="classify"``: one label in {0, 1} per sequence, every third sequence padded after 8
    tokens (attention_mask 0). ``task="lm"``: labels are the input ids (causal LM, HF shifts
    them); with ``pad=True`` every third sequence's last 4 labels are −100 (ignored).
    """

    def __init__(self, n: int = 64, task: str = "classify", pad: bool = False) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, V, (n, T), generator=g)  # (n, T)
        self.mask = torch.ones(n, T, dtype=torch.long)  # (n, T)
        if task == "classify":
            self.mask[::3, 8:] = 0
            self.labels = torch.randint(0, 2, (n,), generator=g)  # (n,)
        else:
            self.labels = self.ids.clone()  # (n, T)
            if pad:
                self.labels[::3, -4:] = -100
                self.mask[::3, -4:] = 0

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> Batch:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i],
                "labels": self.labels[i]}


def hf_loss(out: Any, batch: Batch) -> torch.Tensor:
    """The model's own loss, as an HF user writes it."""
    return out.loss


def per_example_grads(model: nn.Module, batch: Batch,
                      loss_of: Callable[[Any, Batch], torch.Tensor] = hf_loss,
                      call: Callable[[nn.Module, Batch], Any] | None = None
                      ) -> dict[str, torch.Tensor]:
    """{name: (B, *θ.shape)} float64 gradients of ℓ_i = loss_of(model(**batch_i), batch_i).

    Only trainable parameters; ``model`` must carry no private engine (copy it before
    make_private). ``call(m, batch_i)`` replaces ``m(**batch_i)`` (e.g. to add keyword args).
    """
    m = copy.deepcopy(model).double()
    params = {n: p for n, p in m.named_parameters() if p.requires_grad}
    b = next(iter(batch.values())).shape[0]
    rows: dict[str, list[torch.Tensor]] = {n: [] for n in params}
    for i in range(b):
        bi = {k: v[i:i + 1] for k, v in batch.items()}
        m.zero_grad(set_to_none=False)
        loss_of(call(m, bi) if call else m(**bi), bi).backward()
        for n, p in params.items():
            rows[n].append(p.grad.detach().clone() if p.grad is not None
                           else torch.zeros_like(p))
    return {n: torch.stack(r) for n, r in rows.items()}


def assert_norms_match(engine_sq: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
                       rtol: float = 1e-4) -> None:
    """The engine's per-parameter squared norms (B,) equal the loop's, parameter by parameter,
    and they cover exactly the trainable parameters."""
    assert set(engine_sq) == set(ref)
    for n, g in ref.items():
        want = g.reshape(g.shape[0], -1).square().sum(1)  # (B,)
        torch.testing.assert_close(engine_sq[n].double(), want, rtol=rtol, atol=1e-9,
                                   msg=lambda m, n=n: f"{n}: {m}")


def first_batch(loader, min_rows: int = 2) -> Batch:
    """The first Poisson batch with at least ``min_rows`` examples."""
    return next(b for b in loader if b["input_ids"].shape[0] >= min_rows)


class DropoutReplay:
    """Make the float64 loop see the dropout masks the private batched forward drew.

    ``record(model)`` patches every active ``nn.Dropout`` of ``model`` to draw its mask
    explicitly and keep it (one (B, ...) mask per call in training mode, in call order);
    ``replay(copy)`` patches the same modules (by name) of a copy to use example i's rows of
    those masks, where i advances at each :meth:`next_example`. Example i's gradient under
    dropout is then the same function of θ in both, so the loop is still the reference.
    """

    def __init__(self) -> None:
        self.masks: dict[str, list[torch.Tensor]] = {}
        self.example = -1
        self.calls: dict[str, int] = {}  # calls of each module in this example's forward

    def record(self, model: nn.Module) -> None:
        for name, d in self._dropouts(model):
            store = self.masks.setdefault(name, [])

            def forward(x: torch.Tensor, p: float = d.p, store=store, d=d) -> torch.Tensor:
                if not d.training:  # as nn.Dropout (the row-identity probe runs in eval())
                    return x
                mask = torch.bernoulli(torch.full_like(x, 1 - p))  # same shape as x
                store.append(mask)
                return x * mask / (1 - p)
            d.forward = forward

    def replay(self, model: nn.Module) -> None:
        for name, d in self._dropouts(model):
            def forward(x: torch.Tensor, p: float = d.p, name: str = name) -> torch.Tensor:
                k = self.calls[name] = self.calls.get(name, -1) + 1  # this module's k-th call
                mask = self.masks[name][k][self.example:self.example + 1].to(x.dtype)
                return x * mask / (1 - p)
            d.forward = forward

    def next_example(self) -> None:
        """Start example i + 1's forward: its masks are rows i + 1, from each module's first."""
        self.example += 1
        self.calls = {}

    @staticmethod
    def _dropouts(model: nn.Module) -> list[tuple[str, nn.Dropout]]:
        return [(n, d) for n, d in model.named_modules() if isinstance(d, nn.Dropout) and d.p > 0]


CLIP = 0.05  # below every example's gradient norm here: each one is clipped


def private(model: nn.Module, ds, *, sigma: float = 0.0, batch_size: int = 8,
            clip: float = CLIP, **kw):
    """make_private with SGD(lr=1) over all of ``model.parameters()`` (frozen ones included, as
    HF users build it), Poisson q = batch_size/len(ds), C = ``clip``, σ = ``sigma``."""
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dpfy.make_private(model, opt, DataLoader(ds, batch_size=batch_size),
                                 noise_multiplier=sigma, max_grad_norm=clip, seed=3, **kw)


def check_one_step(model: nn.Module, ds, call=lambda m, b: m(**b), clip: float = CLIP,
                   **kw) -> dict:
    """Norms after backward equal the loop's, and one SGD(lr=1), σ = 0 step moves θ by exactly
    −Σ_i clip(g_i)/b (b = qN, docs/engine.md). Returns the loop's per-example gradients."""
    reference = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model, opt, dl = private(model, ds, clip=clip, **kw)
    batch = first_batch(dl)
    opt.zero_grad()
    call(model, batch).loss.backward()  # the user's code, unchanged
    sq = opt.grads.per_sample_sq_norms()  # (B,) per parameter, what the step clips. Sensitive
    ref = per_example_grads(reference, batch, call=call)
    assert_norms_match(sq, ref)
    assert (oracles.per_example_norms(ref) > clip).all()  # clipping is exercised
    opt.step()
    expected = oracles.clipped_sum(ref, clip)
    for n, p in model.named_parameters():
        if n in expected:
            want = before[n].double() - expected[n] / dl.sampler.normalizer
            torch.testing.assert_close(p.detach().double(), want, rtol=1e-5, atol=1e-7)
        else:  # frozen: skipped by the private step
            assert torch.equal(p, before[n]), n
    return ref
