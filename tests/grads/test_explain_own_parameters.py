"""A bare ``nn.Parameter`` on a module without a rule (a ViT's class token) sends every layer
below it to torch.func; ``explain`` names the fix, and the fix keeps the layers' rules."""

import torch
from torch import nn

from dpfy.grads import GradEngine


class WithToken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cls = nn.Parameter(torch.zeros(1, 1, 8))
        self.proj, self.head = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x):
        h = torch.cat([self.cls.expand(len(x), -1, -1), self.proj(x)], 1)
        return self.head(h[:, 0] + h[:, 1:].mean(1))


class ClassToken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cls = nn.Parameter(torch.zeros(1, 1, 8))

    def forward(self, h):
        return torch.cat([self.cls.expand(len(h), -1, -1), h], 1)


class Fixed(nn.Module):                       # the fix explain names
    def __init__(self) -> None:
        super().__init__()
        self.token, self.proj, self.head = ClassToken(), nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x):
        h = self.token(self.proj(x))
        return self.head(h[:, 0] + h[:, 1:].mean(1))


def _routes(model):
    eng = GradEngine(model)
    try:
        return {r["module"]: (r["rule"], r["why"]) for r in eng.explain()}
    finally:
        eng.detach()


def test_explain_names_the_fix_for_parameters_held_above_ruled_layers():
    rows = _routes(WithToken())
    assert list(rows) == ["(root)"]
    assert "holds the parameters ['cls'] itself" in rows["(root)"][1]


def test_the_fix_keeps_the_layer_rules():
    rows = _routes(Fixed())
    assert rows["token"][0].endswith("vmap.py") and "holds the parameters" not in rows["token"][1]
    assert not rows["proj"][0].endswith("vmap.py") and not rows["head"][0].endswith("vmap.py")
