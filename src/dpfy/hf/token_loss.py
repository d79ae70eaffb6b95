"""The per-example token loss :class:`~dpfy.hf.DPTrainer` computes for token-level labels.

Hugging Face's causal-LM, masked-LM, token-classification and seq2seq losses are one token mean
over the whole batch: Σ_{i,t} ℓ_{i,t} / Σ_i n_i, where n_i counts example i's labels that are
not ignored (−100, padding). Example i's gradient is then scaled by 1/Σ_j n_j, a number that
depends on the *other* examples: adding or removing one rescales everyone's contribution, so
clipping each example's gradient no longer bounds its effect on the release (measured in issue
35: removing one example moved a σ = 0 release by 1.27·C against an accounted C).

The loss computed here is each example's own token mean, then the mean over the batch:

    ℓ_i = (1/n_i) Σ_t ℓ_{i,t}   (0 when n_i = 0),     L = (1/B) Σ_i ℓ_i,

so ``loss_reduction="mean"`` holds exactly and ℓ_i is the model's own loss on example i alone.
For causal LMs the labels are shifted as Hugging Face shifts them (position t predicts label
t + 1: the labels are padded with one ignored position at the end and moved left); masked LM,
token classification and encoder–decoder models (whose labels are the decoder's targets) are
not shifted. ``label_smoothing`` is torch's (the same formula as the Trainer's label smoother:
(1 − ε)·NLL + ε·(mean over the vocabulary of −log p)), applied per token.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from dpfy.errors import PrivacyRefusal

__all__ = ["IGNORE_INDEX", "token_loss_kind", "per_example_token_loss", "token_loss"]

IGNORE_INDEX = -100  # torch's and Hugging Face's ignore index for labels

_SHIFTED = {"ForCausalLM", "ForConditionalGeneration"}  # decoder-only: HF's ForCausalLMLoss
_ALIGNED = {"ForMaskedLM", "ForTokenClassification"}


def token_loss_kind(model: Any) -> str | None:
    """``"shifted"`` (causal LM), ``"aligned"`` (masked LM, token classification, seq2seq) or
    None (not a token-level loss dpfy knows: the model's own loss is used).

    Read from the model's ``config.is_encoder_decoder``, its ``loss_type`` (transformers' loss
    registry key) and, for models without one, whether its class is one of transformers' causal
    LM classes. A peft model is read through ``get_base_model()``.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if config is None:
        return None
    if getattr(config, "is_encoder_decoder", False):
        return "aligned"
    kind = getattr(base, "loss_type", None)
    if kind in _SHIFTED:
        return "shifted"
    if kind in _ALIGNED:
        return "aligned"
    if kind is None:
        from transformers.models.auto import modeling_auto as auto

        if type(base).__name__ in set(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()):
            return "shifted"
    return None


def per_example_token_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    shift: bool,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """(B,) each example's mean token loss over its labels that are not ``IGNORE_INDEX``.

    Args:
      logits: (B, T, V) the model's scores (upcast to float32, as Hugging Face's losses do).
      labels: (B, T) integer targets, ``IGNORE_INDEX`` where ignored.
      shift: True for causal LMs (position t is scored against label t + 1).
      label_smoothing: ε of torch's ``cross_entropy``, per token.
    """
    if shift:  # HF's ForCausalLMLoss: pad one ignored label at the end, then move left
        labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[:, 1:]
    b, t = labels.shape
    logits = logits.float()
    tokens = F.cross_entropy(
        logits.reshape(b * t, -1),
        labels.reshape(b * t),
        ignore_index=IGNORE_INDEX,
        reduction="none",
        label_smoothing=label_smoothing,
    ).reshape(b, t)  # (B, T), 0 where ignored
    kept = (labels != IGNORE_INDEX).to(tokens.dtype)  # (B, T)
    # a weight per token, 1/n_i on example i's kept tokens: example i's divisor is its own
    weights = kept / kept.sum(1, keepdim=True).clamp(min=1.0)  # (B, T)
    return (tokens * weights).sum(1)  # (B,)


def token_loss(
    model: Any, owner: Any, inputs: Any, kind: str, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, Any]:
    """(the batch's mean of :func:`per_example_token_loss`, the model's outputs).

    ``model`` is called on ``inputs`` without their ``labels`` (so that the model computes no
    batch-wide token mean of its own); ``owner`` is the model whose config says whether it is
    an encoder–decoder (``model`` may be a wrapper of it), whose ``decoder_input_ids`` are then
    built from the labels as the model builds them. ``kind``: :func:`token_loss_kind`'s answer.
    """
    labels = inputs["labels"]
    inputs = {k: v for k, v in inputs.items() if k != "labels"}
    shift = kind == "shifted"
    if "shift_labels" in inputs:  # already shifted by the collator (HF's convention)
        labels, shift = inputs.pop("shift_labels"), False
    base = owner.get_base_model() if hasattr(owner, "get_base_model") else owner
    if getattr(getattr(base, "config", None), "is_encoder_decoder", False):
        if "decoder_input_ids" not in inputs and "decoder_inputs_embeds" not in inputs:
            inputs["decoder_input_ids"] = base.prepare_decoder_input_ids_from_labels(labels=labels)
    outputs = model(**inputs)
    logits = outputs["logits"]
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(labels.shape):
        raise PrivacyRefusal(
            f"dpfy.hf.DPTrainer: the model's logits must be (B, T, V) aligned with labels "
            f"(B, T) for the per-example token loss, got logits {tuple(logits.shape)} and "
            f"labels {tuple(labels.shape)}. Override compute_loss with a loss that is a "
            f"mean of per-example losses"
        )
    loss = per_example_token_loss(logits, labels, shift=shift, label_smoothing=label_smoothing)
    return loss.mean(), outputs
