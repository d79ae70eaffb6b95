"""What :class:`~dpfy.hf.DPTrainer` refuses in the Trainer's settings, each with the fix.

Every refused setting would make the run train or publish something the ledger does not
describe: a Poisson batch split into a fixed number of micro-batches, several processes each
drawing batches, an accountant that is only an approximation, options that iterate the training
data outside the private steps (each iteration draws private batches), and checkpoint folders
pushed to the Hub with the seed and generator states that undo the noise.
"""

from __future__ import annotations

from typing import Any

from dpfy.errors import PrivacyRefusal

__all__ = ["refuse_pushed_seed", "refuse_settings"]


def refuse_pushed_seed(args: Any, extra: dict[str, Any]) -> None:
    """Refuse pushing checkpoint folders of a seeded run: their optimizer.pt holds the seed and
    the generator states, which undo the privacy of everything the run released."""
    strategy = getattr(getattr(args, "hub_strategy", None), "value", None)
    if (
        getattr(args, "push_to_hub", False)
        and strategy in ("checkpoint", "all_checkpoints")
        and extra.get("seed") is not None
    ):
        raise PrivacyRefusal(
            f"dpfy.hf.DPTrainer: hub_strategy must not push checkpoints of a seeded run, got "
            f"hub_strategy={strategy!r} with DPArguments.extra['seed'] set: each checkpoint's "
            f"optimizer.pt holds the seed and generator states, and anyone who reads them can "
            f"remove the noise. Use hub_strategy='every_save' or 'end' (the model only), or "
            f"drop the seed (a secure run's checkpoint holds no noise key)"
        )


def refuse_settings(args: Any, accountant: str, max_physical_batch_size: int | None) -> None:
    """Refuse the Trainer settings the private run cannot account (module docstring)."""
    if args.gradient_accumulation_steps != 1:
        raise PrivacyRefusal(
            f"dpfy.hf.DPTrainer: gradient_accumulation_steps must be 1, got "
            f"{args.gradient_accumulation_steps}: a Poisson-sampled batch has no fixed "
            f"number of micro-batches. Set DPArguments(max_physical_batch_size=...) to split "
            f"each logical batch into physical ones inside dpfy's step"
        )
    if accountant not in ("pld", "rdp"):
        raise PrivacyRefusal(
            f"dpfy.hf.DPTrainer: DPArguments.accountant must be 'pld' or 'rdp' (the ε it "
            f"logs and reports), got {accountant!r}. GDP is an approximation: read "
            f"it after training with trainer.dp_optimizer.epsilon(delta, 'gdp', "
            f"approximate=True)"
        )
    if args.world_size != 1:
        raise PrivacyRefusal(
            f"dpfy.hf.DPTrainer runs in one process, got world_size "
            f"{args.world_size}. For data-parallel training call dpfy.make_private in "
            f"a torch.distributed loop (docs: distributed training)"
        )
    if getattr(args, "include_tokens_per_second", False):
        raise PrivacyRefusal(
            "dpfy.hf.DPTrainer: include_tokens_per_second must be False, got True: the Trainer "
            "counts tokens by iterating the training dataloader before training, which would "
            "draw private batches that no step takes. Leave it off"
        )
    seen = getattr(args, "include_num_input_tokens_seen", False)
    if max_physical_batch_size is not None and seen not in ("no", False):
        raise PrivacyRefusal(
            f"dpfy.hf.DPTrainer: include_num_input_tokens_seen must be off with "
            f"DPArguments.max_physical_batch_size, got {seen!r}: a logical batch's physical "
            f"batches are drawn during its step, after the Trainer counts them. Leave it off, "
            f"or drop max_physical_batch_size"
        )
