"""``validate(model)`` without a batch flags what the first step will refuse in the modules that
go to torch.func: ``nn.GRU`` / ``nn.RNN`` (no batching rule) and dropout inside such a module
(``TransformerEncoderLayer``'s attention dropout), as Opacus's ``ModuleValidator.validate``
flags them from the modules alone."""

from torch import nn

import dpfy


def test_recurrent_layers_without_a_rule_are_flagged_with_the_swap():
    for layer, fix in ((nn.GRU(4, 8, batch_first=True), "DPGRU"),
                       (nn.RNN(4, 8, batch_first=True), "DPRNN")):
        problems = dpfy.validate(nn.Sequential(layer, ))
        assert len(problems) == 1 and fix in problems[0] and "first step" in problems[0]
        assert dpfy.validate(dpfy.validate(nn.Sequential(layer), fix=True)) == []


def test_attention_dropout_in_a_torch_func_module_is_flagged():
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)          # dropout 0.1
    problems = dpfy.validate(layer)
    assert len(problems) == 1 and "self_attn" in problems[0] and "dropout" in problems[0]
    assert dpfy.validate(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                                    batch_first=True)) == []
    assert dpfy.validate(layer.eval()) == []          # dropout is off outside training
