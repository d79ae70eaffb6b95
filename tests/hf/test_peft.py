"""LoRA adapters (peft) trained privately (issue 14 §3): only the adapters are trainable, the
frozen base is skipped by the private step, per-example norms of the adapter parameters equal
the float64 loop's, and ``save_pretrained`` afterwards reloads with peft.

``init_lora_weights=False`` for the norm checks: peft's default initializes B = 0, so every
example's gradient of A is 0 at the first step and would check nothing.
"""

from __future__ import annotations

import pytest
import torch

peft = pytest.importorskip("peft")
pytest.importorskip("transformers")

from hf_models import Tokens, check_one_step, private, tiny_bert, tiny_gpt2  # noqa: E402

TARGETS = {"bert": ["query", "value"], "gpt2": ["c_attn"]}  # GPT-2's are transformers' Conv1D


def lora(name: str, random_b: bool = True) -> torch.nn.Module:
    base = tiny_bert() if name == "bert" else tiny_gpt2()
    cfg = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS[name],
                          fan_in_fan_out=name == "gpt2", init_lora_weights=not random_b)
    return peft.get_peft_model(base, cfg)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_lora_adapters_only_match_the_loop(name):
    model = lora(name)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # frozen base parameters are in the optimizer (model.parameters()) and left unchanged
    ref = check_one_step(model, Tokens(task="classify" if name == "bert" else "lm"), clip=1e-3)
    assert sorted(ref) == sorted(trainable)


def test_private_lora_saves_and_reloads_with_peft(tmp_path):
    model = lora("bert", random_b=False)  # peft's default initialization
    adapters = [n for n, p in model.named_parameters() if p.requires_grad]
    model, opt, dl = private(model, Tokens(), sigma=1.0)
    for _, batch in zip(range(3), dl):
        opt.zero_grad()
        model(**batch).loss.backward()
        opt.step()
    assert opt.step_count == 3
    # (while private, the engine holds requires_grad itself: read the names from before)
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if n in adapters}
    assert any(p.abs().sum() > 0 for n, p in trained.items() if ".lora_B." in n)  # moved
    model.save_pretrained(tmp_path)
    assert (tmp_path / "adapter_model.safetensors").exists()

    reloaded = peft.PeftModel.from_pretrained(tiny_bert(), tmp_path)  # same base (seed 0)
    again = dict(reloaded.named_parameters())
    for n, p in trained.items():
        assert torch.equal(again[n], p), n
    batch = {k: torch.stack([Tokens()[i][k] for i in range(4)]) for k in ("input_ids",
                                                                          "attention_mask")}
    model.eval(), reloaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, model(**batch).logits)
