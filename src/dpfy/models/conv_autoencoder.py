"""The Fashion-MNIST autoencoder of Galli et al. 2024, Table 1: exactly 48,705 parameters.

Galli, Palamidessi & Cucinotta 2024 (OSO-DPSGD), Table 1: the paper gives
only the task (encode and decode clothing images, MSE) and the size (48,705 trainable
parameters), not the layers. This architecture is ours, chosen to match the count exactly with
layers dpfy clips by ghost norms (``nn.Conv2d`` only; upsampling has no parameters):

    encoder  Conv(1→12, 5×5, stride 2, pad 2) → tanh        28×28 → 14×14     312
             Conv(12→16, 5×5, stride 2, pad 2) → tanh       14×14 → 7×7     4,816
             Conv(16→48, 5×5, pad 2) → tanh                  7×7 (code)    19,248
    decoder  Conv(48→16, 5×5, pad 2) → tanh                  7×7           19,216
             Upsample ×2 (nearest) → Conv(16→12, 5×5, pad 2) → tanh  14×14  4,812
             Upsample ×2 (nearest) → Conv(12→1, 5×5, pad 2)  28×28 (linear)   301
                                                                     total 48,705

tanh, as in dpfy's other DP models: bounded activations keep per-example gradient norms small
and stable under clipping. The output is linear because the inputs are standardized pixels
(``dpfy.data.fashion_mnist``), not values in [0, 1].
"""

from __future__ import annotations

from torch import nn

from dpfy._require import require

__all__ = ["conv_autoencoder", "LAYERS"]

# (in_channels, out_channels, stride, upsample before) of the six 5×5 convolutions, in order
LAYERS = (
    (1, 12, 2, False),
    (12, 16, 2, False),
    (16, 48, 1, False),
    (48, 16, 1, False),
    (16, 12, 1, True),
    (12, 1, 1, True),
)
KERNEL = 5


def conv_autoencoder(input_shape: tuple[int, ...], num_classes: int = 0) -> nn.Sequential:
    """The 48,705-parameter autoencoder for (1, H, W) images with H, W divisible by 4.

    ``num_classes`` is ignored (the target is the input); it is accepted so the model has the
    signature of :data:`dpfy.models.MODELS`. It is not registered there: those models are
    classifiers that ``dpfy train`` fits with cross-entropy, and the zoo's tests assume so.
    """
    require(
        len(input_shape) == 3
        and input_shape[0] == 1
        and input_shape[1] % 4 == 0
        and input_shape[2] % 4 == 0,
        "input_shape",
        tuple(input_shape),
        "(1, H, W) with H and W divisible by 4 for model 'conv_autoencoder'",
        "Use Fashion-MNIST's (1, 28, 28) images",
    )
    layers: list[nn.Module] = []
    for i, (c_in, c_out, stride, up) in enumerate(LAYERS):
        if up:
            layers.append(nn.Upsample(scale_factor=2, mode="nearest"))
        layers.append(nn.Conv2d(c_in, c_out, KERNEL, stride=stride, padding=KERNEL // 2))
        if i < len(LAYERS) - 1:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)
