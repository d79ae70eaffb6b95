"""Per-device clipping across pipeline stages: each stage clips its own block, with its own C_s.

A model too large for one device is split into S consecutive stages, one process (rank) each,
and run with ``torch.distributed.pipelining`` (review digest
``shared/reference/000-review-adaptive-dpsgd.md`` §3.2.2, GPipe). Flat clipping would need each
example's *global* norm ‖g_i‖ = √(Σ_s ‖g_i^(s)‖²), so every stage would have to send its
per-example norms to the others after every backward. Per-device clipping avoids that traffic:
stage s owns the parameter block θ^(s) and clips the block of each example's gradient with
its own threshold C_s,

    w_i^(s) = min(1, C_s / ‖g_i^(s)‖),      S^(s) = Σ_i w_i^(s) g_i^(s),

which is group-wise (per-layer) clipping with one group per stage (``dpfy.clipping
.PerLayerClipping``, whose weights and sensitivity this module reuses). No per-example
quantity crosses stages: only the activations and activation gradients that any pipeline
sends, and once per step the batch's indices (to check every stage trains on the same batch).

Accounting (derivation). Example i's clipped gradient is the concatenation of the blocks
w_i^(s) g_i^(s), each of norm ≤ C_s, over disjoint coordinates, so its norm is at most
Δ = √(Σ_s C_s²): the L2 sensitivity of S = (S^(1), …, S^(S)) under add/remove-one. The
Gaussian mechanism of DP-SGD at noise multiplier σ releases S + Z, Z ~ N(0, σ²Δ² I_d). A
Gaussian with identity covariance restricted to disjoint coordinate blocks is a set of
independent Gaussians N(0, σ²Δ² I_{d_s}), one per block: stage s adds the full standard
deviation σΔ (not a share σΔ/√S, which is what data-parallel ranks adding to the *same*
coordinates would use) to its own coordinates, from its own generator. The generators must be
independent; a shared seed would give equal noise on equally shaped blocks, whose difference
would be released without noise. With ``seed=None`` each rank keys its own ChaCha20 stream from
the OS; with an int seed each stage derives its own seed from (seed, s) by SHA-256.
The released S̃ therefore has exactly the law the single-process mechanism with per-group
clipping has, and the ledger records one subsampled Gaussian event per step with noise
multiplier σ (relative to Δ) and the sampler's q: the single-process per-layer ledger. Every
stage records it (identical ledgers; any one of them is the run's).

The stages are one trust domain, as data-parallel ranks are: they see the batch's indices,
the activations and activation gradients of the batch.

Use (one rank per stage, ``world_size == S``)::

    part = StagePartition.of(model, [["0", "1"], ["2", "3", "4"]])  # module names per stage
    clip = StageClipping(stage_module, partition=part, clips=[0.5, 0.8], noise_multiplier=1.0,
                         sampler=PoissonSampler(N, sample_rate=q, seed=k),
                         input_shape=x.shape[1:] if stage == 0 else None)
    for _ in range(steps):
        idx = clip.draw()                        # the same on every stage (checked)
        if len(idx):
            sched = clip.schedule(len(idx), loss_fn)  # a GPipe schedule for this batch size
            sched.step(x[idx]) if stage == 0 else sched.step(target=y[idx], losses=[])
        clip.release()                           # p.grad = (S^(s) + N(0, σ²Δ² I)) / b
        optimizer.step()

One micro-batch per schedule step: the gradient engine pairs each layer's input row with its
output-gradient row, and a second micro-batch would be a second call on other examples; the
engine's batch guard refuses it (the batch is bound to the drawn rows). Poisson batches vary
in size and a ``PipelineStage`` fixes its buffers' shapes at its first step, so
:meth:`StageClipping.schedule` keeps one stage and schedule per batch size.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from dpfy._require import require
from dpfy.clipping import PerLayerClipping
from dpfy.errors import PrivacyRefusal
from dpfy.grads.engine import GradEngine, require_loss_reduction
from dpfy.noise.generator import NoiseSource
from dpfy.noise.mechanism import GaussianMechanism
from dpfy.privacy.ledger import Ledger
from dpfy.step.sums import release_into_grads
from dpfy.types import StepPlan

__all__ = ["StagePartition", "StageClipping", "stage_seed"]


@dataclass(frozen=True)
class StagePartition:
    """The trainable parameters of the whole model, each owned by exactly one stage.

    Attributes:
      names: per stage, the qualified names (in the whole model) of its trainable parameters.
    """

    names: tuple[tuple[str, ...], ...]

    @classmethod
    def of(cls, model: nn.Module, stages: Sequence[Sequence[str]]) -> "StagePartition":
        """Assign ``model``'s trainable parameters to stages by module name.

        ``stages[s]`` lists the names of the submodules stage s runs (``"0"``,
        ``"encoder.layer.3"``); a parameter belongs to a stage when its module is one of
        them or inside one.

        Raises:
          PrivacyRefusal: a trainable parameter in no stage (it would be trained without
            clipping, or not at all) or in two stages (a parameter tied across stages, or
            overlapping module names: its coordinates would get two clipped contributions and
            two noise draws, so Δ would be C_s + C_t on them, not √(Σ C_s²)).
        """
        require(len(stages) >= 1, "stages", list(stages), "one list of module names per stage")
        owners: dict[int, set[int]] = {}  # id(parameter) -> stages
        first_name: dict[int, str] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            if not p.requires_grad:
                continue
            first_name.setdefault(id(p), name)
            mod = name.rsplit(".", 1)[0] if "." in name else ""
            for s, prefixes in enumerate(stages):
                if any(mod == m or mod.startswith(m + ".") for m in prefixes):
                    owners.setdefault(id(p), set()).add(s)
        orphans = sorted(n for i, n in first_name.items() if i not in owners)
        if orphans:
            raise PrivacyRefusal(
                f"every trainable parameter must be in one pipeline stage, got parameters in "
                f"no stage = {orphans}. Add their modules to a stage's list, or freeze them "
                f"(requires_grad_(False)) before building the partition"
            )
        shared = sorted(
            f"{first_name[i]} (stages {sorted(s)})" for i, s in owners.items() if len(s) > 1
        )
        if shared:
            raise PrivacyRefusal(
                f"every trainable parameter must be in exactly one pipeline stage, got "
                f"parameters in two stages = {shared}. A parameter shared by stages would be "
                f"clipped and noised twice; untie it (give each stage its own copy) or put "
                f"the modules that use it in one stage"
            )
        return cls(
            tuple(
                tuple(first_name[i] for i in first_name if owners[i] == {s})
                for s in range(len(stages))
            )
        )

    @property
    def num_stages(self) -> int:
        return len(self.names)


def stage_seed(seed: int, stage: int) -> int:
    """Stage ``stage``'s noise seed from the run's ``seed``: independent streams per stage
    (SHA-256 of both, 63 bits). Secret like the seed it comes from."""
    digest = hashlib.sha256(f"dpfy-pipeline-stage:{seed}:{stage}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def group_sensitivity(partition: StagePartition, clips: Sequence[float]) -> float:
    """Δ = √(Σ_s C_s²) over the stages that own parameters (``PerLayerClipping``'s)."""
    own = [(g, c) for g, c in zip(partition.names, clips) if g]
    policy = PerLayerClipping(tuple(g for g, _ in own), tuple(c for _, c in own))
    return policy.sensitivity(policy.default_clip())


class StageClipping:
    """This rank's stage of a per-device-clipped private step (see the module docstring).

    Releases per step: stage s's block of the noisy clipped sum, (S^(s) + N(0, σ²Δ² I)) / b,
    Δ = √(Σ_s C_s²), b the sampler's public normalizer (qN). The ledger (``self.ledger``,
    the same on every stage) records one Gaussian event at σ under the sampler's q per step.

    Args:
      module: this stage's module; its trainable parameters must carry the names the
        partition gives them (slicing an ``nn.Sequential`` keeps them).
      partition: every stage's parameters (:meth:`StagePartition.of`, same on every rank).
      clips: C_s for every stage s (public; the same list on every rank).
      noise_multiplier: σ, relative to Δ.
      sampler: a dpfy sampler (``PoissonSampler``) drawing the same batches on every stage:
        construct it with the same seed everywhere.
      seed: None (each stage keys its noise from the OS) or an int (per-stage seeds,
        :func:`stage_seed`; secret).
      loss_reduction: how the last stage's loss reduces over the batch (``"mean"``/``"sum"``).
      input_shape, input_dtype: one row of the model's input (stage 0 only; public), for the
        pipeline's static shapes (:meth:`schedule`).

    The stage is this process's rank in the default process group, whose size must be S.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        partition: StagePartition,
        clips: Sequence[float] | None,
        noise_multiplier: float,
        sampler: Any,
        seed: int | None = None,
        loss_reduction: str = "mean",
        input_shape: Sequence[int] | None = None,
        input_dtype: torch.dtype = torch.float32,
    ) -> None:
        require(
            clips is not None and len(clips) == partition.num_stages,
            "clips",
            clips,
            f"one threshold C_s per stage ({partition.num_stages} values)",
            "Give every stage's threshold on every rank, e.g. clips=[1.0] * num_stages",
        )
        assert clips is not None  # the require above refused None
        require(all(c > 0 for c in clips), "clips", list(clips), "all > 0")
        require(noise_multiplier >= 0, "noise_multiplier", noise_multiplier, ">= 0")
        require_loss_reduction(loss_reduction)
        require(
            dist.is_initialized(),
            "torch.distributed",
            "not initialized",
            "initialized",
            "Call torch.distributed.init_process_group first, one rank per stage",
        )
        s, world = dist.get_rank(), dist.get_world_size()
        require(
            world == partition.num_stages,
            "world_size",
            world,
            f"the number of stages ({partition.num_stages})",
            "Run one process per stage",
        )
        require(
            s != 0 or input_shape is not None,
            "input_shape",
            input_shape,
            "the shape of one input row on stage 0",
            "Pass e.g. input_shape=x.shape[1:]",
        )
        names = tuple(n for n, p in module.named_parameters() if p.requires_grad)
        require(
            sorted(names) == sorted(partition.names[s]),
            f"stage {s}'s parameters",
            sorted(names),
            f"the partition's {sorted(partition.names[s])}",
            "Build each stage from the whole model's own submodules so that names match",
        )
        self.stage, self.module, self.partition = s, module, partition
        self.clips = tuple(float(c) for c in clips)
        self.noise_multiplier, self.sampler = float(noise_multiplier), sampler
        self.sensitivity = group_sensitivity(partition, self.clips)
        self.noise_std = self.noise_multiplier * self.sensitivity  # σΔ on each own coordinate
        self._agree(
            {
                "partition": partition.names,
                "clips": self.clips,
                "sigma": self.noise_multiplier,
                "sampling": str(sampler.sampling.value),
                "sample_rate": float(sampler.sample_rate),
                "normalizer": float(sampler.normalizer),
                "dataset_size": int(sampler.dataset_size),
                "loss_reduction": loss_reduction,
                "seeded": seed is not None,
            }
        )
        self._rows: int | None = None
        self._params = [p for n, p in module.named_parameters() if p.requires_grad]
        self.engine: GradEngine | None = None  # None: a stage without parameters clips nothing
        self._policy: PerLayerClipping | None = None
        if names:
            self._policy = PerLayerClipping((names,), (self.clips[s],))
            self.engine = GradEngine(module, loss_reduction=loss_reduction)
            self.engine.bind_batch(lambda: self._rows)
        source = NoiseSource(None if seed is None else stage_seed(seed, s))
        self.mechanism = GaussianMechanism(
            source, sampling=sampler.sampling, sample_rate=sampler.sample_rate
        )
        self.ledger = Ledger(dataset_size=int(sampler.dataset_size))
        self._schedules: dict[int, ScheduleGPipe] = {}
        self._device = self._params[0].device if self._params else torch.device("cpu")
        self._input_row = None if input_shape is None else (tuple(input_shape), input_dtype)
        self._metas: tuple[tuple[tuple[int, ...], torch.dtype], ...] | None = None

    def _agree(self, facts: dict[str, Any]) -> None:
        gathered: list[Any] = [None] * self.partition.num_stages
        dist.all_gather_object(gathered, facts)
        for r, other in enumerate(gathered):
            diff = sorted(k for k in facts if other[k] != facts[k])
            if diff:
                raise PrivacyRefusal(
                    f"the pipeline's privacy arguments and sampler must be the same on every "
                    f"stage, got {diff} = {[facts[k] for k in diff]} on stage {self.stage} and "
                    f"{[other[k] for k in diff]} on stage {r}. Pass the same clips, "
                    f"noise_multiplier, seed mode and sampler (same q, N) on every rank"
                )

    def draw(self) -> torch.Tensor:
        """The next logical batch's indices, checked equal on every stage (one small gather).

        Raises:
          PrivacyRefusal: the stages' samplers drew different batches (the last stage would
            compute losses for other examples than stage 0 fed in).
        """
        idx = self.sampler.draw()  # (B,) sensitive: the batch's membership
        gathered: list[Any] = [None] * self.partition.num_stages
        dist.all_gather_object(gathered, idx.tolist())
        if any(g != gathered[0] for g in gathered):
            raise PrivacyRefusal(
                f"the sampler must draw the same batch on every pipeline stage, got batches "
                f"of sizes {[len(g) for g in gathered]} that differ. Build each stage's "
                f"sampler with the same seed (a secret the stages share), e.g. "
                f"PoissonSampler(N, sample_rate=q, seed=k) on every rank"
            )
        self._rows = len(idx)
        return idx

    def schedule(self, batch_size: int, loss_fn: Callable[..., torch.Tensor]) -> ScheduleGPipe:
        """A one-micro-batch GPipe schedule for batches of ``batch_size`` rows (cached).

        The stage is built with static shapes (``input_args``/``output_args``): in dynamic
        mode ``PipelineStage`` runs an extra forward and backward on its first step to infer
        them, which the gradient engine would capture as a second use of every layer by the
        same rows. Collective: every stage calls it with the same ``batch_size``.
        """
        require(
            batch_size >= 1,
            "batch_size",
            batch_size,
            ">= 1",
            "Skip the schedule for an empty batch and call release() (noise only)",
        )
        if batch_size not in self._schedules:
            (in_shape, in_dtype), (out_shape, out_dtype) = self._row_metas()
            device = self._device
            # a later stage's input requires grad: its gradient is sent back to stage s-1
            inputs = torch.empty((batch_size, *in_shape), dtype=in_dtype, device=device)
            outputs = torch.empty((batch_size, *out_shape), dtype=out_dtype, device=device)
            stage = PipelineStage(
                self.module,
                self.stage,
                self.partition.num_stages,
                device,
                input_args=inputs.requires_grad_(self.stage > 0),
                output_args=outputs.requires_grad_(True),
            )
            self._schedules[batch_size] = ScheduleGPipe(stage, n_microbatches=1, loss_fn=loss_fn)
        return self._schedules[batch_size]

    def _row_metas(self) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
        """(shape, dtype) of one row of this stage's input and output, found once: stage s
        runs its module on one zero row without gradients (no capture) and tells stage s+1."""
        if self._metas is None:
            row: list[Any] = [self._input_row]
            metas: list[Any] = []
            for s in range(self.partition.num_stages):
                if s == self.stage:
                    shape, dtype = row[0]
                    with torch.no_grad():
                        out = self.module(
                            torch.zeros((1, *shape), dtype=dtype, device=self._device)
                        )
                    row = [(tuple(out.shape[1:]), out.dtype)]
                    metas = [(shape, dtype), row[0]]
                dist.broadcast_object_list(row, src=s)
            self._metas = (metas[0], metas[1])
        return self._metas

    def release(self) -> None:
        """Clip this stage's block per example with C_s, add N(0, σ²Δ²) to each of its
        coordinates, divide by b, write ``p.grad``, record the step; call after the backward."""
        require(self._rows is not None, "the batch", None, "drawn", "Call draw() first")
        eng, policy = self.engine, self._policy
        if eng is not None and policy is not None and self._rows:
            sq = eng.per_sample_sq_norms()  # {name: (B,)} sensitive
            w = policy.weights(sq, self.clips[self.stage])  # {name: (B,)} sensitive
            sums = eng.weighted_sums(w)  # ‖each example's block‖ ≤ C_s: sensitive
            del sq, w
            totals = [sums[n] for n, _ in eng.named_params]
            eng.clear()
        else:  # an empty Poisson batch (a noise-only step), or a stage without parameters
            totals = [torch.zeros_like(p) for p in self._params]
        normalizer = float(self.sampler.normalizer)  # one flat launch or grouped draws on a GPU
        release_into_grads(
            self.mechanism.generator(), totals, self._params, self.noise_std, normalizer
        )
        plan = StepPlan(
            step=self.ledger.num_steps,
            sample_rate=self.sampler.sample_rate,
            noise_multiplier=self.noise_multiplier,
            clip=torch.tensor(self.clips, dtype=torch.float64),
        )
        self.mechanism.record_for(plan, {}).record(self.ledger)
        self._rows = None
