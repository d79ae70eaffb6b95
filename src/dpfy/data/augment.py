"""Batch augmentations for augmentation multiplicity (``make_private(augmult=K, augment=...)``).

An augmentation here is ``fn(batch, generator) -> batch``: the collated batch in, every row
transformed independently, from ``generator`` only (dpfy passes its own augmentation generator,
never the noise generator). The rows keep their order and number.

:func:`crop_flip` is the image augmentation De et al. (2022, §4) use for CIFAR-10: a random
crop of the image padded on every side (a random translation by up to ``padding`` pixels) and,
optionally, a random horizontal flip. For Fashion-MNIST a flip keeps the label (a mirrored
shirt, bag or boot is still one; the classes are not chiral), but the dataset's shoes all face
left, so flipped shoes are out of distribution: whether flips help is an empirical question,
to be answered on a validation split (experiments/augmult/).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from dpfy._require import require

__all__ = ["crop_flip", "random_crop_flip"]


def random_crop_flip(
    x: torch.Tensor, generator: torch.Generator, *, padding: int, flip: bool, fill: float = 0.0
) -> torch.Tensor:
    """(N, C, H, W) images, each shifted by an independent random offset in
    [−padding, padding]² (a crop of the image padded with ``fill``) and, with ``flip``,
    mirrored left-right with probability 1/2. The draws, in order: the N row offsets, the N
    column offsets, then (with ``flip``) N uniforms, a row mirrored where its uniform < 1/2."""
    n, _, h, w = x.shape
    if n == 0:
        return x
    p = padding
    padded = torch.nn.functional.pad(x, (p, p, p, p), value=fill)
    dy = torch.randint(0, 2 * p + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * p + 1, (n,), generator=generator)
    rows = (dy[:, None] + torch.arange(h)[None, :]).to(x.device)  # (N, H)
    cols = (dx[:, None] + torch.arange(w)[None, :]).to(x.device)  # (N, W)
    if flip:
        mirror = (torch.rand(n, generator=generator) < 0.5).to(x.device)
        cols = torch.where(mirror[:, None], cols.flip(1), cols)
    batch = torch.arange(n, device=x.device)[:, None, None, None]
    channel = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
    return padded[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]


def crop_flip(
    padding: int = 2, flip: bool = False, fill: float = 0.0
) -> Callable[[Any, torch.Generator], Any]:
    """The augmentation ``fn(batch, generator)`` of random crops (translation by up to
    ``padding`` pixels, the uncovered border set to ``fill``: the background's value in the
    images' normalization, a public constant) and, with ``flip``, horizontal flips, applied to
    the first element of an ``(images, labels, ...)`` batch (or to a batch that is the images
    tensor); the other elements pass through."""
    require(
        isinstance(padding, int) and not isinstance(padding, bool) and padding >= 0,
        "padding",
        padding,
        "an integer >= 0",
    )

    def shifted(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return random_crop_flip(images, generator, padding=padding, flip=flip, fill=fill)

    def augment(batch: Any, generator: torch.Generator) -> Any:
        if torch.is_tensor(batch):
            return shifted(batch, generator)
        images, *rest = batch
        require(
            torch.is_tensor(images) and images.dim() == 4,
            "the batch's images",
            getattr(images, "shape", type(images).__name__),
            "an (N, C, H, W) tensor, the batch's first element",
            "crop_flip augments image batches; write your own fn(batch, generator) for others",
        )
        return type(batch)([shifted(images, generator), *rest])

    augment.__name__ = f"crop_flip(padding={padding}, flip={flip})"
    augment.__qualname__ = augment.__name__
    return augment
