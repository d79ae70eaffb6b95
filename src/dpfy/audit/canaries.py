"""White-box gradient canaries that go through dpfy's own private step.

The one-run audit (Steinke et al. 2023, §6 "white-box") inserts m canaries; each is in the
training set independently with probability ½ (the draw is the audit's secret). Here a canary
is an extra row of the training set (:class:`CanaryDataset`): it is Poisson-sampled by dpfy's
sampler like every example, and when it is in a batch its per-example gradient is replaced by
C·u_j, with u_j a random unit direction in parameter space (:class:`CanaryGradients`, a
:class:`~dpfy.adaptive.base.Method` that implements ``transform``). From there on the
engine clips, sums and noises it exactly as a real example: the ledger, the noise and the
sensitivity are the run's own. Each canary is scored from the released updates alone:

    score_j = Σ_t b·⟨g̃_t, u_j⟩,   g̃_t the released (noisy) update of step t, b its public
                                  normalizer (so b·g̃_t is the released noisy sum).

(b is the same for every canary of one run, so it changes no ranking; it makes scores of
runs with different N comparable, which the two-run audit needs.)

Directions: when m ≤ d, the d coordinates are split at random into m disjoint supports of
⌊d/m⌋ coordinates and u_j is a normalized Gaussian vector on support j, so the canaries are
exactly orthogonal (no interference with one another) at O(d) cost; otherwise u_j are i.i.d.
normalized Gaussian vectors. Either way the directions are drawn before training and
independently of the inclusion bits, which is all the audit's validity needs.

The method needs the dataset indices of each physical batch in ``transform``, which the
method interface does not pass; :meth:`CanaryGradients.bind` reads them from the private
loader's cursor (public: which rows were sampled), once, after ``make_private``.
It is not a training method and is not registered (``dpfy train --method`` cannot name it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch.utils.data import Dataset

from dpfy._require import require
from dpfy.adaptive.base import Method
from dpfy.audit.sink import find_sink
from dpfy.types import StepOutcome, StepPlan

__all__ = ["CanarySet", "CanaryDataset", "CanaryGradients", "find_canaries", "step_scores", "KINDS"]

KINDS = ("dirac", "direction")


@dataclass(frozen=True)
class CanarySet:
    """m canaries: their secret inclusion bits and unit directions over the parameters.

    Attributes:
      included: (m,) bool, True when canary j is in the training set. Secret until scoring.
      directions: (m, d) float32, unit rows u_j over the flattened trainable parameters
        (``"direction"``); None for ``"dirac"`` (u_j is coordinate j of ``sink``).
      layout: (name, shape) of each trainable parameter, in the order the rows flatten them.
      kind: ``"dirac"`` or ``"direction"`` (module docstring).
      sink: the name of the :class:`~dpfy.audit.sink.CanarySink` weight (``"dirac"`` only).
    """

    included: torch.Tensor
    directions: torch.Tensor | None
    layout: tuple[tuple[str, tuple[int, ...]], ...]
    kind: str = "direction"
    sink: str | None = None

    @classmethod
    def draw(
        cls,
        model: torch.nn.Module,
        count: int,
        generator: torch.Generator | None = None,
        *,
        kind: str = "direction",
    ) -> "CanarySet":
        """``count`` canaries for ``model``'s trainable parameters; ``generator`` (secret)
        draws the inclusion bits and the directions (default: a fresh OS-seeded one).

        ``kind="dirac"`` needs ``model`` to contain a :class:`~dpfy.audit.sink.CanarySink`
        with at least ``count`` coordinates: canary j's gradient is C on its coordinate j.
        """
        require(
            isinstance(count, int) and count >= 2,
            "canaries",
            count,
            "an int >= 2",
            "Use 1000 or more for a useful bound",
        )
        require(kind in KINDS, "kind", kind, f"one of {list(KINDS)}")
        if generator is None:
            generator = torch.Generator().manual_seed(
                int.from_bytes(__import__("os").urandom(8), "little") >> 1
            )
        layout = tuple((n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad)
        require(bool(layout), "model", type(model).__name__, "a module with trainable parameters")
        d = sum(_numel(s) for _, s in layout)
        included = torch.rand(count, generator=generator) < 0.5
        if kind == "dirac":
            sink_name, sink = find_sink(model)
            require(
                sink.count >= count and sink_name in dict(layout),
                "the canary sink",
                f"{sink.count} coordinates",
                f"at least {count}, trainable",
                "Wrap the model as CanarySink(model, canaries)",
            )
            return cls(included=included, directions=None, layout=layout, kind=kind, sink=sink_name)
        if count <= d:  # disjoint random supports: exactly orthogonal rows
            width = d // count
            support = torch.randperm(d, generator=generator)[: count * width].reshape(count, width)
            values = torch.randn(count, width, generator=generator, dtype=torch.float64)
            directions = torch.zeros(count, d, dtype=torch.float64)
            directions.scatter_(1, support, values / values.norm(dim=1, keepdim=True))
        else:
            gauss = torch.randn(count, d, generator=generator, dtype=torch.float64)
            directions = gauss / gauss.norm(dim=1, keepdim=True)
        return cls(included=included, directions=directions.float().contiguous(), layout=layout)

    @property
    def count(self) -> int:
        return int(self.included.numel())

    def in_ids(self) -> torch.Tensor:
        """Ids of the included canaries, in the order their rows follow the real data."""
        return torch.nonzero(self.included).reshape(-1)

    def per_parameter(self, ids: torch.Tensor, scale: float) -> dict[str, torch.Tensor]:
        """{name: (len(ids), *shape)}: scale · u_j split over the parameters."""
        if self.directions is None:  # dirac: scale on coordinate j of the sink, 0 elsewhere
            out = {name: torch.zeros(len(ids), *shape) for name, shape in self.layout}
            out[str(self.sink)].reshape(len(ids), -1)[torch.arange(len(ids)), ids] = scale
            return out
        rows = self.directions[ids] * scale
        out, start = {}, 0
        for name, shape in self.layout:
            size = _numel(shape)
            out[name] = rows[:, start : start + size].reshape(len(ids), *shape)
            start += size
        return out

    def project(self, vector: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """⟨vector, u_j⟩ for every canary j, (m,) float64 on the host, where the directions and
        the scores are (a released gradient on a GPU is read there once per step)."""
        if self.directions is None:
            return vector[str(self.sink)].detach().reshape(-1)[: self.count].double().cpu()
        flat = torch.cat([vector[n].detach().reshape(-1).float() for n, _ in self.layout])
        return (self.directions @ flat.cpu()).double()


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


class CanaryDataset(Dataset):
    """The training set with the included canaries appended as extra rows.

    Rows ``len(base) + r`` are canary ``in_ids[r]``; their input and label are
    ``template`` (any valid example shape, e.g. zeros): the model's forward runs on them, and
    their gradient is replaced by the canary's in the private step.
    """

    def __init__(self, base: Dataset, canaries: CanarySet, template: tuple[Any, Any]) -> None:
        self.base, self.canaries, self.template = base, canaries, template
        self.offset = len(base)  # type: ignore[arg-type]
        self.in_ids = canaries.in_ids()

    def __len__(self) -> int:
        return self.offset + int(self.in_ids.numel())

    def __getitem__(self, index: int) -> Any:
        if index < self.offset:
            return self.base[index]
        require(index < len(self), "index", index, f"< {len(self)}")
        return self.template


class CanaryGradients(Method[torch.Tensor]):
    """Replaces an included canary's per-example gradient by C·u_j; scores every canary.

    State: (2, m) float64, built from released updates and the public plan only: row 0 the
    linear scores Σ_t ⟨S̃_t, u_j⟩, row 1 the per-step log-likelihood-ratio scores (module
    docstring) so far. Releases per step: nothing of its own (the canaries are examples of the
    run's gradient release).
    """

    registry_name = "_audit_canaries"

    def __init__(self, canaries: CanarySet, dataset: CanaryDataset) -> None:
        self.canaries = canaries
        self.offset = dataset.offset
        self.in_ids = dataset.in_ids
        self._indices: Callable[[], torch.Tensor | None] | None = None

    def bind(self, cursor: Any) -> None:
        """Read each physical batch's dataset indices from the private loader's cursor."""
        self._indices = lambda: cursor.indices

    def init(self) -> torch.Tensor:
        return torch.zeros(2, self.canaries.count, dtype=torch.float64)

    def transform(
        self, state: torch.Tensor, per_sample: Mapping[str, torch.Tensor], plan: StepPlan
    ) -> Mapping[str, torch.Tensor]:
        require(
            self._indices is not None,
            "the canary method",
            "unbound",
            "bound to the private loader",
            "Call bind(loader.cursor) after make_private",
        )
        rows = next(iter(per_sample.values())).shape[0]
        if rows == 0:  # an empty Poisson batch: nothing to replace
            return per_sample
        assert self._indices is not None  # the require above refused None
        indices = self._indices()
        require(
            indices is not None and len(indices) == rows,
            "batch indices",
            None if indices is None else len(indices),
            f"one per row ({rows})",
        )
        assert indices is not None  # the require above refused None
        is_canary = indices >= self.offset
        if not bool(is_canary.any()):
            return per_sample
        where = torch.nonzero(is_canary).reshape(-1)
        ids = self.in_ids[indices[where] - self.offset]
        require(
            self.canaries.kind != "dirac" or not torch.is_tensor(plan.clip),
            "clip",
            "one threshold per parameter group",
            "one threshold for Dirac canaries",
            "Audit per-group clipping with canary kind 'direction'",
        )
        scale = _clip_norm(plan.clip)
        replaced = self.canaries.per_parameter(ids, scale)
        out = {}
        for name, g in per_sample.items():
            g = g.clone()
            g[where] = replaced[name].to(g)  # the gradients' device and dtype
            out[name] = g
        return out

    def update(self, state: torch.Tensor, outcome: StepOutcome) -> torch.Tensor:
        # the gradient as released (before any postprocess of a chained method)
        noisy = outcome.noisy_gradient or outcome.gradient
        released = outcome.expected_batch_size * self.canaries.project(noisy)  # ⟨S̃_t, u_j⟩
        plan = outcome.plan
        per_step = step_scores(
            released / _clip_norm(plan.clip),
            sample_rate=plan.sample_rate,
            noise_multiplier=plan.noise_multiplier,
        )
        return state + torch.stack([released, per_step])


def step_scores(x: torch.Tensor, *, sample_rate: float, noise_multiplier: float) -> torch.Tensor:
    """log(1 − q + q·exp((x − ½)/σ²)) for each canary's observation x = ⟨S̃_t, u_j⟩/C_t.

    The log-likelihood ratio of one step's observation under "in" (x ~ N(1, σ²) with
    probability q, else N(0, σ²)) against "out" (x ~ N(0, σ²)). At σ = 0 the ratio is not
    finite; x itself is returned (any increasing score is a valid test statistic).
    """
    x = x.double()
    if noise_multiplier == 0:
        return x
    q = float(sample_rate)
    stay = math.log1p(-q) if q < 1 else -math.inf
    return torch.logaddexp(
        torch.full_like(x, stay), math.log(q) + (x - 0.5) / float(noise_multiplier) ** 2
    )


def _clip_norm(clip: float | torch.Tensor) -> float:
    """The total clipping norm of a plan: C, or √(Σ_k C_k²) for per-group thresholds."""
    if torch.is_tensor(clip):
        return float(clip.double().square().sum().sqrt())
    return float(clip)


def find_canaries(method: Method | None) -> CanaryGradients:
    """The :class:`CanaryGradients` inside a run's method (alone or in a chain)."""
    members = getattr(method, "members", (method,))
    found = [m for m in members if isinstance(m, CanaryGradients)]
    require(
        len(found) == 1,
        "canary methods in the run",
        len(found),
        "exactly 1",
        "Pass one CanaryGradients to make_private(method=...)",
    )
    return found[0]
