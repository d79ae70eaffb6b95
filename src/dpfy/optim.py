"""The private optimizer: the ``torch.optim.Optimizer`` facade around the private step.

It keeps the torch surface (param_groups, zero_grad, step, state_dict) and hands every
``step()`` to :class:`dpfy.step.private_step.PrivateStep`, which holds the whole step. With
SGD(lr=1), no momentum and σ = 0 a step moves θ by exactly −Σ_i clip(g_i)/b.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable

import torch

from dpfy.adaptive.base import method_name
from dpfy.buffers import guard_of
from dpfy._renamed import renamed_attribute
from dpfy._require import require
from dpfy.errors import PrivacyRefusal
from dpfy.privacy import Ledger, epsilon as ledger_epsilon
from dpfy.privacy.accountants import APPROXIMATE, accountant_label
from dpfy.privacy.gdp import ApproximateEpsilon
from dpfy.privacy.statement import ledger_statement
from dpfy.sampling.units import require_same_unit
from dpfy.step.checkpoint import check_ledger_continues, check_same_parameters, parameters_digest
from dpfy.step.guard import EpsilonGuard
from dpfy.step.private_step import PrivateStep

if TYPE_CHECKING:
    from dpfy.spec import RunSpec

__all__ = ["DPOptimizer"]

FORMAT = "dpfy-optimizer/4"
_TORCH_HOOKS = (
    "_optimizer_step_pre_hooks",
    "_optimizer_step_post_hooks",
    "_optimizer_state_dict_pre_hooks",
    "_optimizer_state_dict_post_hooks",
    "_optimizer_load_state_dict_pre_hooks",
    "_optimizer_load_state_dict_post_hooks",
)


def _step_attribute(name: str, doc: str, settable: bool = False) -> property:
    """A read (or read-write) view of the private step's attribute ``name``."""

    def get(self: "DPOptimizer") -> Any:
        return getattr(self.private_step, name)

    def put(self: "DPOptimizer", value: Any) -> None:
        setattr(self.private_step, name, value)

    return property(get, put if settable else None, doc=doc)


class DPOptimizer(torch.optim.Optimizer):
    """A private view of ``optimizer``; build it with :func:`dpfy.make_private`.

    ``updated`` says whether the last ``step()`` was a real update (it ended a logical batch:
    noise added, ledger step recorded, inner optimizer stepped). With
    ``max_physical_batch_size`` the loader yields several physical batches per update; step a
    per-update LR scheduler only ``if optimizer.updated``. ``last_step_info`` holds the last
    step's plan and debug statistics that are NOT private (never fed back into training).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        private_step: PrivateStep,
        *,
        accountant: str,
        seed: int | None,
    ) -> None:
        # Not calling Optimizer.__init__: parameter groups and state are the inner optimizer's.
        self.original_optimizer, self.private_step = optimizer, private_step
        self.accountant, self.seed = accountant, seed
        for hooks in _TORCH_HOOKS:
            setattr(self, hooks, OrderedDict())

    # the run spec make_private built (dpfy.spec.RunSpec), σ and the sampler's facts filled in
    spec: RunSpec | None = None

    ledger = _step_attribute("ledger", "Every release so far.")
    step_count = _step_attribute("step_count", "Logical steps taken.")
    updated = _step_attribute("updated", "The last step() ended a logical batch.")
    last_step_info = _step_attribute("last_step_info", "The last step's plan (not private).")
    method = _step_attribute("method", "The adaptive method, or None.")
    method_state = _step_attribute("method_state", "The method's state.", settable=True)
    noise_multiplier = _step_attribute("noise_multiplier", "The run's σ (a method may plan σ_t).")
    guard = _step_attribute("guard", "The ε guard: horizon and ε cap.")
    sampler = _step_attribute("sampler", "The sampler: q, b, N, the unit of privacy.")
    grads = _step_attribute("grads", "The per-unit gradient engine.")
    clipping = _step_attribute("clipping", "The clipping policy.")
    mechanism = _step_attribute("mechanism", "The noise mechanism.")
    collective = _step_attribute("collective", "The data-parallel ranks, or None.")
    individual = _step_attribute("individual", "Individualized budgets, or None.")

    @property
    def privacy_groups(self) -> Any:
        """The privacy groups' ledgers of an individualized run (``GroupLedgers``), or None.

        Privacy groups share a budget (individualized budgets); they are not the optimizer's
        ``param_groups`` nor the per-layer clipping groups."""
        return self.private_step.individual.group_ledgers if self.private_step.individual else None

    groups = renamed_attribute(
        "DPOptimizer.groups",
        "privacy_groups",
        "optimizer.privacy_groups (the individualized budgets' groups)",
    )

    @property
    def max_steps(self) -> int | None:
        return self.guard.max_steps

    @max_steps.setter
    def max_steps(self, value: int | None) -> None:
        self.guard.max_steps = value

    @property
    def max_grad_norm(self) -> Any:
        """C: the clipping policy's threshold (a float for flat clipping; per layer, one per
        layer), as Opacus's ``optimizer.max_grad_norm``. A method may plan C_t per step."""
        clip = self.clipping.default_clip()
        return clip.tolist() if torch.is_tensor(clip) else clip

    @property
    def expected_batch_size(self) -> float:
        """b = qN, what the noisy sum is divided by (Opacus's ``optimizer.expected_batch_size``)."""
        return self.sampler.normalizer

    @property
    def epsilon_cap(self) -> float | None:
        return self.guard.epsilon_cap

    @epsilon_cap.setter
    def epsilon_cap(self, value: float | None) -> None:
        """An explicit re-plan of the ε cap (at the guard's δ and accountant), like
        ``max_steps``: raise it only if the privacy budget allows it."""
        g = self.guard
        self.private_step.guard = EpsilonGuard(
            max_steps=g.max_steps, epsilon_cap=value, delta=g.delta, accountant=g.accountant
        )

    @property
    def target_delta(self) -> float | None:
        return self.guard.delta

    # -- torch.optim.Optimizer surface (delegated) ------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.original_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.original_optimizer.param_groups = value

    @property
    def state(self) -> Any:
        return self.original_optimizer.state

    @state.setter
    def state(self, value: Any) -> None:  # torch.optim.Optimizer's state is writeable
        self.original_optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self.original_optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:  # as torch.optim.Optimizer's
        self.original_optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Refused: the private step covers the parameters the model had at ``make_private``.

        A parameter added later (the fine-tuning recipe: unfreeze a backbone, then
        ``add_param_group``) would be stepped with its plain autograd gradient, without
        clipping or noise, while the ledger records the private release alone."""
        params = param_group.get("params", []) if isinstance(param_group, dict) else []
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        raise PrivacyRefusal(
            f"add_param_group after make_private: "
            f"{self.private_step.names_of(params) or 'parameters'} would be trained on their "
            f"raw gradient, without clipping or noise. Set requires_grad and build the "
            f"optimizer over every parameter to train before calling make_private (a new "
            f"private run for a new set of parameters)"
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear parameter gradients and the captured activations (not the logical-batch sum)."""
        self.original_optimizer.zero_grad(set_to_none=set_to_none)
        self.grads.clear()

    # torch.amp.GradScaler.step(optimizer) then hands the step to us with its scale attached
    # (``grad_scale``, ``found_inf``) instead of unscaling gradients this optimizer never holds,
    # so that step() can refuse it by name (see _refuse_grad_scaler)
    _step_supports_amp_scaling = True

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Clip, accumulate; at the end of a logical batch add noise, record, update."""
        try:
            self._refuse_grad_scaler()
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            self.private_step.take_batch()
        except Exception:
            # a step refused before its sensitivity check read the model-state guard's
            # comparisons (dpfy._deferred): a write they found is refused now, not left behind
            state_guard = guard_of(self.private_step.model)
            if state_guard is not None:
                state_guard.pending.flush()
            raise
        return loss

    def _refuse_grad_scaler(self) -> None:
        """Refuse a step driven by ``torch.amp.GradScaler`` (fp16 loss scaling).

        A scaled loss S·ℓ scales every per-example gradient by S before dpfy clips it, so the
        clipping would act on S·g_i; and the scaler skips a step when a gradient overflows, a
        decision that depends on the private batch and would be released unaccounted. Nothing
        of the batch is taken: the loader yields it again.
        """
        if "grad_scale" not in self.__dict__ and "found_inf" not in self.__dict__:
            return
        self.private_step.cursor.discard_pending()
        self.grads.clear()
        raise PrivacyRefusal(
            "optimizer.step() must not be driven by torch.amp.GradScaler, got a step from "
            "GradScaler.step(): the scaled loss multiplies every per-example gradient by the "
            "loss scale before clipping, and the scaler's skip of an overflowing step depends "
            "on the private batch. Use bfloat16 autocast, which needs no scaler "
            "(torch.autocast('cuda', dtype=torch.bfloat16)), call loss.backward() and "
            "optimizer.step() without the scaler; nothing of this step was released"
        )

    def __repr__(self) -> str:
        return f"DPOptimizer({self.original_optimizer!r})"

    # -- privacy ----------------------------------------------------------------------------
    def epsilon(
        self, delta: float, accountant: str | None = None, *, approximate: bool = False
    ) -> float:
        """ε(δ) of everything released so far, read from the ledger: a bare float (for
        comparisons and logs). The guarantee it is part of names its unit of privacy and
        neighbouring relation: state it with :meth:`privacy_statement`, e.g.
        ``optimizer.privacy_statement(1e-5)`` → "ε = 2.998 at δ = 1e-05 for user-level
        add-or-remove adjacency (one user added or removed, with all of their examples) [PLD
        (dp_accounting, upper bound)]".

        An approximate accountant (``"gdp"``: the CLT, which can under-report ε) is read only
        with ``approximate=True``, as ``dpfy calibrate``/``report`` need ``--approximate``;
        it then returns a :class:`~dpfy.privacy.gdp.ApproximateEpsilon`: the approximate
        value, with the rigorous PLD ε beside it (``.rigorous``).
        """
        return self._read(self.ledger, delta, accountant, approximate)

    def privacy_statement(self, delta: float, accountant: str | None = None) -> str:
        """The guarantee of everything released so far as one sentence: ε at ``delta``, the
        unit of privacy (example or user) and the neighbouring relation, and the accountant
        (the run's, or ``accountant``: ``"pld"`` or ``"rdp"``)."""
        name = accountant or self.accountant
        value = float(self._read(self.ledger, delta, name, False))
        return ledger_statement(self.ledger, value, delta, accountant_label(name))

    def group_epsilons(
        self, delta: float, accountant: str | None = None, *, approximate: bool = False
    ) -> list[float]:
        """ε(δ) of each privacy group so far, read from its own ledger (individualized runs);
        an approximate accountant as in :meth:`epsilon`."""
        require(
            self.privacy_groups is not None,
            "budgets",
            None,
            "given to make_private",
            "Per-group ε exists only for runs with individualized budgets",
        )
        return [
            self._read(ledger, delta, accountant, approximate)
            for ledger in self.privacy_groups.ledgers
        ]

    def _read(
        self, ledger: Ledger, delta: float, accountant: str | None, approximate: bool
    ) -> float:
        """ε(δ) of ``ledger``; an approximate accountant's only when asked, with PLD beside."""
        name = accountant or self.accountant
        if name not in APPROXIMATE:
            return ledger_epsilon(ledger, delta=delta, accountant=name)
        require(
            approximate,
            "accountant",
            name,
            "'pld' or 'rdp' unless approximate=True",
            "The GDP CLT is an approximation that can under-report ε: read it with "
            "optimizer.epsilon(delta, approximate=True), which gives the rigorous PLD ε "
            "beside it (.rigorous), or read accountant='pld'",
        )
        return ApproximateEpsilon(
            ledger_epsilon(ledger, delta=delta, accountant=name),
            rigorous=ledger_epsilon(ledger, delta=delta, accountant="pld"),
            rigorous_accountant="pld",
        )

    def observe(self, *, val_metric: float) -> None:
        """Feed a validation result to a method that reads one (it implements ``observe``)."""
        require(
            self.method is not None and self.method.implements("observe"),
            "the method",
            None if self.method is None else method_name(self.method),
            "one that implements observe",
            "Only such methods read a validation metric",
        )
        self.method_state = self.method.observe(self.method_state, val_metric=val_metric)

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume (the model's weights are the model's).

        A seeded run resumes bit-identically: the state holds the seed and the generator
        states, and is secret. A secure run's state holds no noise key: its resume draws fresh
        noise (:meth:`dpfy.noise.NoiseSource.load_state_dict`), so two continuations of one
        checkpoint never share noise. The ledger is saved with a digest of the model's
        trainable parameters and the budget guard (horizon, ε cap), which
        :meth:`load_state_dict` checks and restores.
        Only at a logical-batch boundary: between the physical batches of a logical batch the
        step holds the un-noised sums of clipped gradients, which must never reach a file, so a
        call there raises :class:`~dpfy.errors.PrivacyRefusal`.
        """
        step = self.private_step
        if step.sums is not None:
            raise PrivacyRefusal(
                "state_dict() must be called at a logical-batch boundary, got a call while "
                "a logical batch is being summed (its un-noised sum of clipped gradients "
                "would be written). Call it after optimizer.step() completes a logical batch "
                "(the private loader's cursor.last is True)"
            )
        return {
            "format": FORMAT,
            "seed": self.seed,
            "step_count": step.step_count,
            "optimizer": self.original_optimizer.state_dict(),
            "ledger": step.ledger.to_dict(),
            "noise": step.mechanism.state_dict(),
            "sampler": step.sampler.state_dict(),
            "guard": step.guard.state_dict(),
            "parameters_sha256": parameters_digest(step.params),
            "method_state": step.method_state,
            "groups": step.individual.state_dict() if step.individual is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`'s output, after the model's own state was loaded.

        Checked before anything changes: the model's trainable parameters are the ones the
        state was saved with, and its ledger extends what this optimizer already released
        (:mod:`dpfy.step.checkpoint`); either refusal is a
        :class:`~dpfy.errors.PrivacyRefusal` naming the fix. The budget guard becomes the
        stricter of this run's and the checkpoint's (:meth:`EpsilonGuard.tightened`).
        """
        require(
            state.get("format") == FORMAT,
            "format",
            state.get("format"),
            repr(FORMAT),
            "This is not a dpfy optimizer checkpoint of this version (dpfy-optimizer/3 "
            "and older hold no parameter digest and no guard): resume it with the dpfy "
            "that wrote it, or start a new run",
        )
        step = self.private_step
        require_same_unit(step.sampler.units, state["sampler"])  # first: the neighbouring relation
        ledger = Ledger.from_dict(state["ledger"])
        check_same_parameters(state["parameters_sha256"], step.params)
        check_ledger_continues(step.ledger, ledger)
        guard = step.guard.tightened(state["guard"])
        step.sampler.load_state_dict(state["sampler"])  # these two check before they change
        if step.individual is not None:
            step.individual.load_state_dict(state.get("groups"))
        self.original_optimizer.load_state_dict(state["optimizer"])
        step.ledger.step_groups[:] = ledger.step_groups
        step.mechanism.load_state_dict(state["noise"])
        self.seed, step.step_count = state["seed"], state["step_count"]
        step.guard = guard  # fresh: it composes the new ledger afresh
        step.method_state, step.sums = state["method_state"], None
