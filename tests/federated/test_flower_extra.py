"""Flower is optional: dpfy.federated works without it, and dpfy.federated.flower says which
extra to install when it is missing."""

from __future__ import annotations

import importlib
import sys

import pytest


def test_the_flower_module_names_the_extra_when_flwr_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "flwr", None)          # import flwr → ImportError
    for name in [m for m in sys.modules if m.startswith("flwr.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "dpfy.federated.flower", raising=False)
    with pytest.raises(ImportError, match=r"dpfy\[fl\]"):
        importlib.import_module("dpfy.federated.flower")
    import dpfy.federated                                   # the core needs no Flower
    assert hasattr(dpfy.federated, "DPFedAvgServer")
