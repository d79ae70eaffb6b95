"""Memory planning: how much a private step holds, per layer, and the largest batch that fits.

The model is Monir, Fauzan & Ghinita 2023, §4 (after Yousefpour et al. 2021, Opacus), counted
in tensor elements: a batch of b examples whose features, labels, outputs and stored
activations take C elements each, and a model of L parameters, need

    M_non-DP = bC + 2L                         (activations, the model, its gradient)
    M_DP     = bC + (1 + b)L                   (flat clipping on per-sample gradients)
    M_ghost  = bC + 2L                         (ghost / per-layer clipping: as non-DP)

so L = C = 1, b = 100 gives 201 and 102 (the paper's worked example). dpfy's engine chooses
the route per layer (``GradEngine.explain()``), so the estimate is per layer: a layer of P
parameters costs P (its weights) + b·P when its per-sample gradients are materialized
(``per-sample``, ``vmap``), or P + P (the weights and the one gradient sum) on the ``ghost``
route. With every layer materialized this is the paper's M_DP, with every layer ghost its
M_ghost. The estimate leaves out what the model does not count: the ghost route's Gram
matrices for sequence inputs (b·T² per layer), the optimizer state and allocator slack.

``C`` is measured on a probe: the elements of every leaf module's output per example during one
forward (what autograd keeps for the backward, approximately; views and in-place outputs hold
no new memory and are not counted), plus the input. Nothing of the
probe is released; it runs on the model without changing its parameters or buffers.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from dpfy._require import require
from dpfy.grads import GradEngine

__all__ = [
    "paper_memory",
    "plan_physical_batch",
    "loader_call",
    "measure_private_step",
    "format_memory",
    "LayerMemory",
    "MemoryEstimate",
    "estimate_memory",
    "probe_model",
    "largest_batch",
    "default_memory_limit",
    "measured_peak_bytes",
    "MATERIALIZED",
]

PROBE_BATCH = 4  # examples in the "auto" probe (routes and C do not depend on b in this model)
MATERIALIZED = ("per-sample", "vmap")  # routes that hold b copies of the layer's gradient


def paper_memory(b: int, c: float, n_params: float, *, per_sample: bool) -> float:
    """M_DP = bC + (1+b)L with per-sample gradients, bC + 2L without, in elements, where L is
    ``n_params`` (Monir, Fauzan & Ghinita 2023, §4, after Yousefpour et al. 2021)."""
    return b * c + ((1 + b) * n_params if per_sample else 2 * n_params)


@dataclass(frozen=True)
class LayerMemory:
    """One layer of the estimate: its parameters and the route the engine takes."""

    module: str
    params: int
    route: str

    def elements(self, b: int) -> int:
        """Weights + gradient memory of this layer at batch size b (elements)."""
        return self.params * (1 + (b if self.route in MATERIALIZED else 1))


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimate at one batch size, in elements and bytes.

    Attributes:
      batch_size: b.
      activations: b·C elements.
      layers: per layer, weights + gradients (elements).
      bytes_per_element: 4 for float32.
    """

    batch_size: int
    activations: float
    layers: tuple[tuple[LayerMemory, int], ...]
    bytes_per_element: int = 4

    @property
    def elements(self) -> float:
        return self.activations + sum(e for _, e in self.layers)

    @property
    def bytes(self) -> int:
        return int(math.ceil(self.elements * self.bytes_per_element))


def estimate_memory(
    rows: Sequence[dict[str, Any]], batch_size: int, c: float, *, bytes_per_element: int = 4
) -> MemoryEstimate:
    """The per-layer estimate from ``GradEngine.explain()`` rows (module, params, route).

    A row whose route is not decided yet (no probe ran) counts as materialized (the larger).
    """
    require(batch_size >= 0, "batch_size", batch_size, ">= 0")
    layers = []
    for r in rows:
        route = r.get("route", "vmap")
        route = route if route in MATERIALIZED + ("ghost",) else "per-sample"
        layer = LayerMemory(str(r.get("module", "")), int(r["params"]), route)
        layers.append((layer, layer.elements(batch_size)))
    return MemoryEstimate(batch_size, batch_size * c, tuple(layers), bytes_per_element)


def _storage(t: torch.Tensor) -> int:
    """The address of ``t``'s storage (a view or an in-place output shares its input's)."""
    return t.untyped_storage().data_ptr()


def _output_sq_sum(out: Any) -> torch.Tensor:
    """Σ output² over the model's floating-point outputs: the loss the measurements backprop."""
    terms = [
        t.float().square().sum()
        for t in tree_leaves(out)
        if torch.is_tensor(t) and t.is_floating_point()
    ]
    require(
        len(terms) > 0,
        "the model's output",
        type(out).__name__,
        "holds at least one floating-point tensor",
    )
    return sum(terms[1:], start=terms[0])


def probe_model(
    model: nn.Module, call: Callable[[nn.Module], Any], batch_size: int, *, route: str = "auto"
) -> tuple[list[dict[str, Any]], float]:
    """Routes and C from one forward/backward of ``call(model)`` on ``batch_size`` examples.

    Attaches a :class:`dpfy.grads.GradEngine` (detached afterwards), counts the elements of
    every leaf module's output that is not a view of (or written into) its input, and of the
    first layer's input (C = that sum / b),
    backpropagates Σ output² (any scalar
    gives the routes) and returns ``(GradEngine.explain() rows, C)``. Parameters and buffers
    are restored (a probe learns nothing).
    """
    require(batch_size >= 1, "batch_size", batch_size, ">= 1")
    saved = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    counted = [0, 0]  # elements, leaf calls so far

    def count(module: nn.Module, args: tuple, output: Any) -> None:
        if list(module.children()):  # leaf modules: their outputs are what is stored
            return
        inputs = [t for t in tree_leaves(args) if torch.is_tensor(t)]
        if counted[1] == 0:  # the first layer called: its input is the data
            counted[0] += sum(t.numel() for t in inputs)
        shared = {_storage(t) for t in inputs}
        counted[0] += sum(
            t.numel()
            for t in tree_leaves(output)  # views/in-place: no new memory
            if torch.is_tensor(t) and _storage(t) not in shared
        )
        counted[1] += 1

    handles = [m.register_forward_hook(count) for m in model.modules()]
    grads = GradEngine(model, route=route, loss_reduction="sum")
    try:
        out = call(model)
        _output_sq_sum(out).backward()
        rows = grads.explain()
    finally:
        grads.detach()
        for h in handles:
            h.remove()
        with torch.no_grad():
            for k, v in model.state_dict(keep_vars=True).items():
                v.copy_(saved[k])
    return rows, counted[0] / batch_size


def largest_batch(
    rows: Sequence[dict[str, Any]], c: float, limit_bytes: float, *, bytes_per_element: int = 4
) -> int:
    """The largest b whose estimate fits ``limit_bytes`` (0 if not even one example does).

    The estimate is affine in b: M(b) = fixed + b·slope, so b = ⌊(limit − fixed)/slope⌋.
    """
    m0 = estimate_memory(rows, 0, c, bytes_per_element=bytes_per_element).elements
    slope = estimate_memory(rows, 1, c, bytes_per_element=bytes_per_element).elements - m0
    room = limit_bytes / bytes_per_element - m0
    if room < slope:
        return 0
    return int(room // slope) if slope > 0 else 2**31 - 1


def default_memory_limit(device: torch.device | None = None) -> int:
    """Half the memory available now (bytes) where the model lives: on a CUDA ``device``, half
    of what ``torch.cuda.mem_get_info`` reports free there; otherwise /proc/meminfo's
    MemAvailable on Linux, else half of the physical memory (os.sysconf). The other half is
    left to the rest of the step (optimizer state, the allocator) and to other processes."""
    if device is not None and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free) // 2
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def measured_peak_bytes(fn: Callable[[], Any], device: torch.device | None = None) -> int | None:
    """Peak memory ``fn()`` added (bytes), or None where unknown.

    On a CUDA ``device``: the peak of tensor memory allocated there during ``fn`` above what
    was allocated before (``torch.cuda.max_memory_allocated``, its peak reset first).
    Otherwise Linux only: resets the process's high-water mark (``/proc/self/clear_refs`` ← 5),
    runs ``fn`` and reads VmHWM − VmRSS-before. Memory the allocator reuses from earlier frees
    is not counted, so call it in a fresh process (``dpfy explain --memory`` does) for a
    faithful number.
    """
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - start)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    before = _status_kib("VmRSS")
    fn()
    peak = _status_kib("VmHWM")
    if before is None or peak is None:
        return None
    return max(0, peak - before) * 1024


def loader_call(
    loader: Any, batch_size: int, device: torch.device | None = None
) -> Callable[[nn.Module], Any]:
    """How the probe calls the model on ``batch_size`` examples of ``loader.dataset``.

    The batch is collated by the loader's own ``collate_fn``: a dict batch is passed as
    keyword arguments (``model(**batch)``), a tuple or list by its first element (the
    ``(x, y)`` convention), a tensor as it is. Other layouts: pass an int
    ``max_physical_batch_size`` instead of ``"auto"``. Its tensors are moved to ``device``
    (the model's; None: left where the dataset holds them).
    """
    n = min(batch_size, len(loader.dataset))
    batch = loader.collate_fn([loader.dataset[i] for i in range(n)])
    if device is not None:  # the probe runs where the model lives: the batch moved there once
        batch = tree_map(lambda t: t.to(device) if torch.is_tensor(t) else t, batch)
    if isinstance(batch, dict):
        return lambda model: model(**batch)
    if isinstance(batch, (tuple, list)) and batch and torch.is_tensor(batch[0]):
        return lambda model: model(batch[0])
    require(
        torch.is_tensor(batch),
        "the loader's batches",
        type(batch).__name__,
        "a tensor, an (x, y, ...) tuple or a dict for max_physical_batch_size='auto'",
        "Pass an int max_physical_batch_size instead",
    )
    return lambda model: model(batch)


def _device_of(model: nn.Module) -> torch.device | None:
    """The device of the model's first parameter (None: a model without parameters)."""
    return next((p.device for p in model.parameters()), None)


def plan_physical_batch(
    model: nn.Module, loader: Any, *, memory_limit: int | None, route: str = "auto"
) -> int:
    """``max_physical_batch_size="auto"``: the largest physical batch whose estimate fits.

    ``memory_limit`` in bytes (None: :func:`default_memory_limit` on the device of the
    model's parameters, the GPU's free memory on CUDA). Raises if not even one example fits.
    """
    device = _device_of(model)
    limit = default_memory_limit(device) if memory_limit is None else memory_limit
    require(limit > 0, "memory_limit", memory_limit, "> 0 bytes")
    call = loader_call(loader, PROBE_BATCH, device)
    rows, c = probe_model(model, call, PROBE_BATCH, route=route)
    b = largest_batch(rows, c, limit)
    if b < 1:
        need = estimate_memory(rows, 1, c).bytes
        require(
            False,
            "memory_limit",
            limit,
            f">= {need} bytes (one example's estimate)",
            "Raise memory_limit or use a smaller model",
        )
    return b


def measure_private_step(
    model: nn.Module, call: Callable[[nn.Module], Any], *, route: str = "auto"
) -> int | None:
    """Measured peak bytes of one private step's gradient work on ``call(model)``.

    Forward, backward of Σ output², the per-sample norms and one weighted sum (the clipped
    sum), under :func:`measured_peak_bytes`; the model's parameters and buffers are unchanged.
    """
    grads = GradEngine(model, route=route, loss_reduction="sum")

    def step() -> None:
        out = call(model)
        _output_sq_sum(out).backward()
        sq = grads.per_sample_sq_norms()
        grads.weighted_sums({n: torch.ones_like(v) for n, v in sq.items()})

    try:
        return measured_peak_bytes(step, _device_of(model))
    finally:
        grads.detach()


def format_memory(model: nn.Module, example: torch.Tensor, *, route: str = "auto") -> str:
    """``dpfy explain --memory``: the estimate per layer at ``len(example)`` and the measured
    peak of one private step on ``example`` (measured first, in this fresh process)."""

    def call(m: nn.Module) -> Any:
        return m(example)

    b = int(example.shape[0])
    peak = measure_private_step(model, call, route=route)
    rows, c = probe_model(model, call, b, route=route)
    est = estimate_memory(rows, b, c)
    mib = 4 / 2**20  # float32 elements -> MiB
    lines = [
        f"memory at batch size {b} (Monir et al. 2023's model per layer; float32):",
        "| module | params | route | weights + gradients (MiB) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {layer.module or '(root)'} | {layer.params} | {layer.route} | {e * mib:.3f} |"
        for layer, e in est.layers
    ]
    lines.append(
        f"activations b·C: {est.activations * mib:.3f} MiB (C = {c:.0f} elements per example)"
    )
    resident = example.numel() * example.element_size() + sum(
        p.numel() * p.element_size() for p in model.parameters()
    )
    measured = (
        "unavailable (Linux /proc or CUDA only)"
        if peak is None
        else f"{(peak + resident) / 2**20:.3f} MiB ({peak / 2**20:.3f} MiB allocated by "
        f"the step + {resident / 2**20:.3f} MiB input and weights already resident)"
    )
    lines.append(
        f"estimate: {est.bytes / 2**20:.3f} MiB; measured peak of one private step: {measured}"
    )
    return "\n".join(lines)
