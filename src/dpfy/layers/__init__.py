"""DP replacements for layers whose per-example gradients no layer rule can read off a single
call: recurrent layers and multi-head attention, rebuilt from ``nn.Linear`` calls (see
``docs/layers.md``), the in-place swaps that put them into a model, and BatchNorm with public or
privatized statistics (``docs/guide/batchnorm.md``)."""

from dpfy.layers.attention import DPMultiheadAttention
from dpfy.layers.privatized_batchnorm import (
    PrivatizedBatchNorm,
    PrivatizedStatistics,
    privatized_batchnorm,
)
from dpfy.layers.public_batchnorm import PublicBatchNorm, PublicStatistics, public_batchnorm
from dpfy.layers.recurrent import DPGRU, DPLSTM, DPRNN, DPRecurrent
from dpfy.layers.swap import (
    DP_REPLACEMENTS,
    dp_replacement,
    swap_attention,
    swap_layers,
    swap_recurrent,
)

__all__ = [
    "DPRNN",
    "DPGRU",
    "DPLSTM",
    "DPRecurrent",
    "DPMultiheadAttention",
    "PublicBatchNorm",
    "PublicStatistics",
    "public_batchnorm",
    "PrivatizedBatchNorm",
    "PrivatizedStatistics",
    "privatized_batchnorm",
    "DP_REPLACEMENTS",
    "dp_replacement",
    "swap_recurrent",
    "swap_attention",
    "swap_layers",
]
