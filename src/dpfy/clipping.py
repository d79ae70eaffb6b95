"""Clipping policies: per-sample gradient norms -> per-sample weights, and the sensitivity.

Step 2 of the private step (docs/architecture.md): clipping is just a weight per example (and per
parameter group),
``Σ_i w_i g_i``. Each policy states the L2 sensitivity Δ of that sum under add/remove-one, and
the engine adds noise N(0, (σ·Δ)²) to it.

=============  ==========================================  ==========================
policy         weight of example i                          sensitivity Δ
=============  ==========================================  ==========================
flat           w_i = min(1, C/‖g_i‖)                        C
per_layer      w_ik = min(1, C_k/‖g_ik‖) for layer k        √(Σ_k C_k²)
automatic      w_i = C/(‖g_i‖ + γ)   (Bu et al. 2023)        C   (‖w_i g_i‖ < C)
individual     w_i = min(1, C_i/‖g_i‖), C_i per example     max_i C_i
microbatch     w_m = min(1, C/‖ḡ_m‖), ḡ_m a microbatch's mean  2C  (dpfy.sampling.microbatch)
=============  ==========================================  ==========================

References: Monir, Fauzan & Ghinita 2023, §3.2 and §4 (clipping variants, automatic
clipping); Abadi et al. 2016 (flat); McMahan et al. 2018 (per-layer).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Sequence, cast

import torch

from dpfy._require import require

__all__ = [
    "total_norm",
    "ClippingPolicy",
    "FlatClipping",
    "PerLayerClipping",
    "AutomaticClipping",
    "IndividualClipping",
    "MicrobatchClipping",
    "CLIPPINGS",
    "make_clipping",
    "group_weights",
]

CLIPPINGS = ("flat", "per_layer", "automatic", "individual", "microbatch")

SqNorms = dict[str, torch.Tensor]  # parameter name -> ‖∂ℓ_i/∂θ‖² (B,), sensitive
Weights = dict[str, torch.Tensor]  # parameter name -> w_i (B,), sensitive


def _total_norm(sq: SqNorms, names: Sequence[str]) -> torch.Tensor:
    # names is never empty, so sum() returns a tensor and never its start value 0
    return torch.sqrt(cast(torch.Tensor, sum(sq[n] for n in names)))  # (B,) sensitive


def total_norm(sq: SqNorms) -> torch.Tensor:
    """‖∂ℓ_i/∂θ‖ over all parameters, (B,). Sensitive."""
    return _total_norm(sq, list(sq))


def _min1(clip: torch.Tensor | float, norm: torch.Tensor) -> torch.Tensor:
    # C/0 = inf -> 1: a zero gradient is kept as is (exact, no epsilon in the denominator)
    return torch.clamp(clip / norm, max=1.0)


def group_weights(clip: torch.Tensor, per_group: torch.Tensor) -> torch.Tensor:
    """(B, K) min(1, C_k/‖g_{i,k}‖): the weights of per-group clipping for one planned clip per
    group ``clip`` (K,) and the per-group norms ``per_group`` (B, K), refused when the norms
    come in another number of groups than was planned."""
    require(
        per_group.shape[1] == clip.numel(),
        "the number of clipping groups",
        per_group.shape[1],
        f"{clip.numel()} (as planned)",
    )
    return _min1(clip.to(per_group), per_group)  # (B, K) sensitive


class ClippingPolicy:
    """norms -> weights; and Δ(clip), the L2 sensitivity of the weighted sum."""

    name = ""

    def default_clip(self) -> float | torch.Tensor:
        raise NotImplementedError

    def sensitivity(self, clip: float | torch.Tensor) -> float:
        return float(clip)

    def weights(
        self,
        sq: SqNorms,
        clip: float | torch.Tensor,
        index: torch.Tensor | None = None,
        norm: torch.Tensor | None = None,
    ) -> Weights:
        """Per-example weights; ``norm`` is ``total_norm(sq)`` when the caller already has it."""
        raise NotImplementedError


@dataclass(frozen=True)
class FlatClipping(ClippingPolicy):
    """One threshold C on the norm over all parameters."""

    clip: float
    name = "flat"

    def __post_init__(self) -> None:
        require(self.clip > 0, "max_grad_norm", self.clip, "> 0")

    def default_clip(self) -> float:
        return self.clip

    def weights(self, sq, clip, index=None, norm=None):
        w = _min1(float(clip), total_norm(sq) if norm is None else norm)  # (B,) sensitive
        return {n: w for n in sq}


@dataclass(frozen=True)
class AutomaticClipping(ClippingPolicy):
    """Automatic clipping (Bu et al. 2023): w_i = C/(‖g_i‖ + γ); every example contributes a
    vector of norm < C, so no threshold needs tuning beyond the scale C (which can be folded
    into the learning rate)."""

    clip: float
    gamma: float = 0.01
    name = "automatic"

    def __post_init__(self) -> None:
        require(self.clip > 0, "max_grad_norm", self.clip, "> 0")
        require(self.gamma > 0, "gamma", self.gamma, "> 0", "γ = 0.01 is the paper's default")

    def default_clip(self) -> float:
        return self.clip

    def weights(self, sq, clip, index=None, norm=None):
        w = float(clip) / ((total_norm(sq) if norm is None else norm) + self.gamma)  # sensitive
        return {n: w for n in sq}


@dataclass(frozen=True)
class PerLayerClipping(ClippingPolicy):
    """Threshold C_k per layer (group of parameters, e.g. a Linear's weight and bias)."""

    groups: tuple[tuple[str, ...], ...]
    clips: tuple[float, ...]
    name = "per_layer"

    def __post_init__(self) -> None:
        require(
            len(self.clips) == len(self.groups),
            "len(max_grad_norm)",
            len(self.clips),
            f"{len(self.groups)} (one threshold per layer: "
            f"{[g[0].rsplit('.', 1)[0] for g in self.groups]})",
            "Pass a float (split equally) or one value per layer",
        )
        require(all(c > 0 for c in self.clips), "max_grad_norm", self.clips, "all > 0")

    def default_clip(self) -> torch.Tensor:
        return torch.tensor(self.clips, dtype=torch.float64, device="cpu")  # public, host

    def _per_layer(self, clip: float | torch.Tensor) -> torch.Tensor:
        """(K,) thresholds; a scalar C (e.g. from a schedule) is split equally, C/√K each."""
        clip = torch.as_tensor(clip, dtype=torch.float64, device="cpu")  # public: read on the host
        if clip.ndim == 0:
            return clip.expand(len(self.groups)) / math.sqrt(len(self.groups))
        require(
            clip.shape == (len(self.groups),),
            "plan.clip",
            tuple(clip.shape),
            f"a scalar or {len(self.groups)} per-layer thresholds",
        )
        return clip

    def sensitivity(self, clip):
        return float(self._per_layer(clip).square().sum().sqrt())

    def weights(self, sq, clip, index=None, norm=None):
        clip = self._per_layer(clip)
        out: Weights = {}
        for k, names in enumerate(self.groups):
            w = _min1(float(clip[k]), _total_norm(sq, names))  # (B,) sensitive
            out.update({n: w for n in names})
        return out


@dataclass(frozen=True)
class IndividualClipping(ClippingPolicy):
    """Per-example thresholds C_i (individualized privacy); noise follows max_i C_i."""

    clips: torch.Tensor  # (N,) one threshold per dataset example, public
    _max: float = field(init=False, repr=False, compare=False)  # Δ = max_i C_i, set below
    name = "individual"

    def __post_init__(self) -> None:
        require(
            self.clips.ndim == 1 and bool((self.clips > 0).all()),
            "max_grad_norm",
            "a tensor" if self.clips.ndim else self.clips,
            "one positive value per example",
        )
        object.__setattr__(self, "_max", float(self.clips.max()))  # Δ; read every step

    def default_clip(self) -> float:
        return self._max

    def weights(self, sq, clip, index=None, norm=None):
        require(
            index is not None,
            "the batch's dataset indices",
            None,
            "known",
            "Individual clipping needs the private loader returned by make_private",
        )
        ref = next(iter(sq.values()))
        c = self.clips[index.cpu()].to(dtype=ref.dtype, device=ref.device)  # (B,) public
        c = c * (float(clip) / self._max)  # a schedule may rescale C
        w = _min1(c, total_norm(sq) if norm is None else norm)  # (B,) sensitive
        return {n: w for n in sq}


@dataclass(frozen=True)
class MicrobatchClipping(FlatClipping):
    """Flat clipping of each microbatch's mean gradient (the step's unit), sensitivity 2C.

    Under add-or-remove one example, the example can turn its microbatch's clipped mean from
    one vector of norm <= C into another (Ponomareva et al. 2023, §5.6): Δ = 2C. The units are
    the sampler's (:class:`dpfy.sampling.microbatch.MicrobatchSampler`).
    """

    name = "microbatch"

    def sensitivity(self, clip):
        return 2.0 * float(clip)


def _one_number(value: object) -> bool:
    """A real number: a Python or NumPy scalar, or a tensor or array of one element."""
    if isinstance(value, bool):
        return False
    if isinstance(value, numbers.Real):
        return True
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_complex()
    size = getattr(value, "size", None)  # a NumPy array's element count
    return isinstance(size, int) and size == 1 and hasattr(value, "dtype")


def make_clipping(
    kind: str,
    max_grad_norm: float | Sequence[float] | torch.Tensor,
    layers: Sequence[Sequence[str]],
    *,
    dataset_size: int | None = None,
    gamma: float = 0.01,
) -> ClippingPolicy:
    """Build the policy named ``kind`` from the user's ``max_grad_norm``.

    ``layers`` lists the parameter names of each layer (engine order), for ``per_layer``; a
    scalar C is then split equally, C_k = C/√K, so that the total sensitivity is C.
    """
    require(
        kind in CLIPPINGS,
        "clipping",
        kind,
        f"one of {list(CLIPPINGS)}",
        "Opacus's clipping='adaptive' (quantile-tracked C, Andrew et al.) is method='quantile' "
        "here, with clipping='flat'"
        if kind == "adaptive"
        else "",
    )
    scalar = isinstance(max_grad_norm, (int, float))
    if kind == "per_layer":
        k = len(layers)
        if _one_number(max_grad_norm):  # C, split as C/√K
            clips = [float(cast(float, max_grad_norm)) / math.sqrt(k)] * k
        else:
            items = list(cast(Sequence[float], max_grad_norm))  # read once: a generator is fine
            require(
                all(_one_number(c) for c in items),
                "max_grad_norm",
                max_grad_norm if isinstance(max_grad_norm, (list, tuple)) else items,
                "one number per layer (a float, or K numbers) with clipping='per_layer'",
                "Give each layer's threshold as a number",
            )
            clips = [float(c) for c in items]
        return PerLayerClipping(tuple(tuple(g) for g in layers), tuple(clips))
    if kind == "individual":
        per_example = torch.as_tensor(max_grad_norm, dtype=torch.float64)
        require(
            per_example.ndim == 1 and dataset_size is not None and len(per_example) == dataset_size,
            "max_grad_norm",
            f"shape {tuple(per_example.shape)}",
            f"one threshold per example ({dataset_size})",
            "Pass a sequence of length N",
        )
        return IndividualClipping(per_example)
    require(
        scalar,
        "max_grad_norm",
        max_grad_norm,
        f"a float for clipping={kind!r}",
        "Use clipping='per_layer' for one threshold per layer",
    )
    assert isinstance(max_grad_norm, (int, float))  # the require above refused a sequence
    if kind == "automatic":
        return AutomaticClipping(float(max_grad_norm), gamma)
    if kind == "microbatch":
        return MicrobatchClipping(float(max_grad_norm))
    return FlatClipping(float(max_grad_norm))
