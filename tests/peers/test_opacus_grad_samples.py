"""Opacus 1.6's per-layer grad-sample cases, run against dpfy (issue 14, "Tests and evidence").

Each Opacus case class is re-used as it ships (its hypothesis strategies, modules, inputs);
only ``run_test`` is replaced (``opacus_adapter.DpfyRunTest``): every case must match Opacus's
float64 microbatch loop or be refused with a message naming the module. The default run takes
a few derandomized draws per test; ``pytest -m slow`` runs the full sweep (100 draws each).
"""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("opacus")

from opacus_adapter import BY_CASE, OUTCOMES, adapt  # noqa: E402

_CASES = {
    "conv1d_test": "Conv1d_test", "conv2d_test": "Conv2d_test", "conv3d_test": "Conv3d_test",
    "dp_multihead_attention_test": "MultiHeadAttention_test", "dp_rnn_test": "RNN_test",
    "embedding_bag_test": "Embedding_bag_test", "embedding_test": "Embedding_test",
    "group_norm_test": "GroupNorm_test", "instance_norm1d_test": "InstanceNorm1d_test",
    "instance_norm2d_test": "InstanceNorm2d_test", "instance_norm3d_test": "InstanceNorm3d_test",
    "layer_norm_test": "LayerNorm_test", "linear_test": "Linear_test",
    "rms_norm_test": "RMSNorm_test", "sequence_bias_test": "SequenceBias_test",
}
DEFAULT_EXAMPLES, FULL_EXAMPLES = 5, 100


def _case(module: str) -> type:
    return getattr(importlib.import_module(f"opacus.tests.grad_samples.{module}"), _CASES[module])


for _module in _CASES:
    _cls = adapt(_case(_module), DEFAULT_EXAMPLES)
    globals()[_cls.__name__] = _cls
    _full = adapt(_case(_module), FULL_EXAMPLES)
    _full.pytestmark = [pytest.mark.slow]
    _full.__name__ = _full.__qualname__ = _cls.__name__ + "_full"
    globals()[_full.__name__] = _full
del _cls, _full, _module


def _summary() -> str:
    lines = [f"opacus grad_samples outcomes: {dict(OUTCOMES)}"]
    lines += [f"  {case}: {outcome} x{k}" for (case, outcome), k in sorted(BY_CASE.items())]
    return "\n".join(lines)


def teardown_module() -> None:
    """Print what the cases ended as (visible with ``pytest -s``), in both sweeps."""
    print("\n" + _summary())


def test_zz_outcomes_were_checked() -> None:
    """The cases above ran and ended as a match or a named refusal."""
    assert OUTCOMES["match"] > 0, _summary()
