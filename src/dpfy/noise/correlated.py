"""What the correlated-noise mechanisms (tree aggregation, BandMF) share.

DP-SGD's mechanism adds fresh noise σΔ·z_t to each step's gradient sum. A correlated mechanism
adds σΔ·x_t, where x_t is a unit-scale noise vector that depends on earlier steps' draws (the
residual of a tree's noisy prefix sums, or the solution of C·x = z for a banded strategy C).
The private step does not change: it asks :meth:`CorrelatedMechanism.generator` for this step's
noise and calls ``noisy_mean(total, std, b)`` once per parameter, in the same order every step;
the step's :class:`CorrelatedStepNoise` hands each call the next x_t for that parameter (its
*slot*), so the mechanism keeps one stream per parameter.

Because the noise of one step is tied to the others, the mechanism refuses what its accounting
(:mod:`dpfy.privacy.correlated`) cannot cover: a noise multiplier that changes between steps
(σ is part of the correlated stream), extra noisy releases of an adaptive method (they would
need their own correlated analysis), and a batch the sampler did not draw at the mechanism's
position (its participation pattern is what the accounting assumes). Varying clipping
thresholds are fine: scaling step t's release by Δ_t is post-processing of the mechanism run on
G_t/Δ_t.

State (:meth:`state_dict`): the generator's, the position and the buffered noise — all SECRET
(they continue the stream). A seeded mechanism resumed from a checkpoint continues the stream
exactly; a secure one continues its ChaCha20 stream, never repeating a draw.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NotRequired, TypedDict

import torch

from dpfy._require import require
from dpfy.errors import PrivacyRefusal
from dpfy.noise.generator import NoiseSource
from dpfy.noise.mechanism import StepRecord
from dpfy.privacy.ledger import Release
from dpfy.types import ReleaseSpec, Sampling, StepPlan

__all__ = ["CorrelatedMechanism", "CorrelatedStepNoise", "CorrelatedArgs"]


class CorrelatedStepNoise:
    """One step's noise of a correlated mechanism, drawn parameter by parameter.

    ``next_unit(slot, like)`` returns the unit-scale correlated noise x_t of parameter ``slot``
    (shaped like ``like``); :meth:`noisy_mean` releases (S + std·x_t)/b in place.
    """

    def __init__(self, next_unit: Callable[[int, torch.Tensor], torch.Tensor], name: str) -> None:
        self._next_unit, self._name, self._slot = next_unit, name, 0

    def noisy_mean(self, total: torch.Tensor, std: float, normalizer: float) -> torch.Tensor:
        """(total + std·x_t) / normalizer, in place on ``total``: the released update."""
        x = self._next_unit(self._slot, total)
        self._slot += 1
        if std != 0:
            total.add_(x.to(dtype=total.dtype, device=total.device), alpha=std)
        return total.div_(normalizer)

    def add_gaussian_(self, t: torch.Tensor, std: float, chunk: int = 0) -> torch.Tensor:
        raise PrivacyRefusal(
            f"the {self._name!r} noise mechanism releases the gradient sum only, got a request "
            f"for an extra noisy release. Use noise='gaussian' with methods that release more"
        )

    gaussian = add_gaussian_


class CorrelatedArgs(TypedDict):
    """The keywords every correlated mechanism takes beside its own, passed on to
    :class:`CorrelatedMechanism` (which documents them): ``noise_multiplier``, ``sample_rate``
    and, optionally, ``sampler_position``."""

    noise_multiplier: float
    sample_rate: float
    sampler_position: NotRequired[Callable[[], int] | None]


class CorrelatedMechanism:
    """Base of the correlated mechanisms: the record, the refusals and the state.

    Subclasses set ``name`` (the release's ``noise``), ``samplings``, :attr:`period` and
    implement ``_start_step()`` and ``_next_unit(slot, like)``.

    Args:
      source: the generator of the fresh Gaussian draws (secure by default, or seeded).
      noise_multiplier: σ of every step (per tree node, or per row of C·G + σZ).
      sampling, sample_rate: the sampler's facts, recorded with every step.
      sampler_position: returns the position of the batch being released as the sampler
        counts it (the mechanism's own position must match); None only where no sampler
        exists (tests of the noise stream).
    """

    name = "correlated"
    samplings: tuple[Sampling, ...] = ()

    def __init__(
        self,
        source: NoiseSource,
        *,
        noise_multiplier: float,
        sampling: Sampling,
        sample_rate: float,
        sampler_position: Callable[[], int] | None = None,
    ) -> None:
        require(
            sampling in self.samplings,
            "sampling",
            sampling.value,
            f"one of {[s.value for s in self.samplings]} for noise={self.name!r}",
            "make_private(noise=...) builds the sampler this mechanism's accounting needs",
        )
        require(
            noise_multiplier > 0,
            "noise_multiplier",
            noise_multiplier,
            f"> 0 for noise={self.name!r}",
        )
        self.source, self.noise_multiplier = source, float(noise_multiplier)
        self.sampling, self.sample_rate = sampling, sample_rate
        self.sampler_position = sampler_position
        self.position = 0  # steps released so far
        self.buffers: list[list[torch.Tensor]] = []  # per slot: buffered noise; SECRET

    @property
    def period(self) -> int:
        raise NotImplementedError

    def expected_position(self) -> int:
        """Where the sampler must be for the next release (subclasses: within a cycle)."""
        return self.position

    # -- the seam ------------------------------------------------------------------------------
    def record_for(self, plan: StepPlan, specs: Mapping[str, ReleaseSpec]) -> StepRecord:
        """The step's record; refuses what the correlated accounting does not cover."""
        if specs:
            raise PrivacyRefusal(
                f"noise={self.name!r} releases only the gradient sum, got extra releases "
                f"{sorted(specs)} from the method: their accounting with correlated noise is "
                f"not implemented. Use noise='gaussian' with this method"
            )
        if plan.noise_multiplier != self.noise_multiplier:
            raise PrivacyRefusal(
                f"noise_multiplier must stay {self.noise_multiplier} at every step with "
                f"noise={self.name!r} (σ is part of the correlated stream), got "
                f"{plan.noise_multiplier} at step {plan.step}. Drop the method that changes σ, "
                f"or use noise='gaussian'"
            )
        if self.sampler_position is not None:
            at = self.sampler_position()
            if at != self.expected_position():
                raise PrivacyRefusal(
                    f"the batch released at step {self.position} must be the sampler's batch "
                    f"{self.expected_position()} for noise={self.name!r}, got the sampler at "
                    f"{at}: the participation pattern the accounting assumes would not hold. "
                    f"Resume the mechanism and the sampler from the same checkpoint"
                )
        release = Release("gradient", self.noise_multiplier, self.name, self.period)
        return StepRecord(self.sampling, self.sample_rate, (release,))

    def generator(self) -> CorrelatedStepNoise:
        """This step's noise (call once per release; it advances the stream)."""
        self._start_step()
        self.position += 1
        return CorrelatedStepNoise(self._next_unit, self.name)

    def _start_step(self) -> None:
        raise NotImplementedError

    def _next_unit(self, slot: int, like: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _fresh(self, like: torch.Tensor) -> torch.Tensor:
        """A fresh N(0, 1) tensor shaped like ``like``, float32 (the buffers' dtype)."""
        shape = torch.empty(like.shape, dtype=torch.float32)  # CPU, like the buffers
        return self.source.gaussian(shape, 1.0).float()

    def _slot_buffers(self, slot: int) -> list[torch.Tensor]:
        require(slot <= len(self.buffers), "noise slot", slot, f"<= {len(self.buffers)}")
        if slot == len(self.buffers):
            self.buffers.append([])
        return self.buffers[slot]

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """SECRET: the generator, the position and the buffered noise (checkpoints only)."""
        return {
            "noise": self.name,
            "source": self.source.state_dict(),
            "position": self.position,
            "noise_multiplier": self.noise_multiplier,
            "buffers": [[t.clone() for t in slot] for slot in self.buffers],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        require(
            state.get("noise") == self.name,
            "the checkpoint's noise mechanism",
            state.get("noise", "gaussian"),
            repr(self.name),
            "Resume with the noise= the checkpoint was written with",
        )
        require(
            state["noise_multiplier"] == self.noise_multiplier,
            "the checkpoint's noise_multiplier",
            state["noise_multiplier"],
            f"{self.noise_multiplier} (this run's)",
            "Resume with the same σ",
        )
        self.source.load_state_dict(state["source"])
        self.position = int(state["position"])
        self.buffers = [[t.clone() for t in slot] for slot in state["buffers"]]
