"""``dpfy train --privacy-unit label``: label-DP training (randomized labels, plain training).

The labels are randomized once (``--label-dp rr`` or ``rr-prior``) at ``--epsilon``; the model
is then trained without gradient noise, since nothing it reads afterwards is a true label. The
run directory gets ``label_ledger.json`` (the exact ε, δ = 0, the relation), ``model.pt``,
``report.md`` (which says in words that the features are not protected) and ``metrics.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dpfy._require import require

__all__ = ["add_flags", "run_label", "LABEL_ONLY", "IGNORED"]

# Example-level settings that a label-DP run has nothing to do with: refused when given.
REFUSED = (
    "noise_multiplier", "method", "individual", "user_ids", "accountant", "clip",
    "augmult", "noise", "public_validation",
)  # fmt: skip
# Settings it reads (the rest of TrainConfig's defaults are irrelevant to it).
IGNORED = ("threads", "route", "physical_batch_size")
LABEL_ONLY = ("label_dp", "label_stages")


def add_flags(p: Any) -> None:
    """The label-DP flags of ``dpfy train`` (a separate group so the help groups them)."""
    g = p.add_argument_group("label DP (docs/label_dp.md)")
    g.add_argument(
        "--privacy-unit",
        choices=("example", "label"),
        default="example",
        help="what the guarantee protects: 'example' (DP-SGD, default) or 'label' "
        "(label DP: labels only, features public and NOT protected)",
    )
    g.add_argument(
        "--label-dp",
        choices=("rr", "rr-prior"),
        default=None,
        help="with --privacy-unit label: randomized response, or RR with a prior learned in "
        "stages (Ghazi et al. 2021)",
    )
    g.add_argument(
        "--label-stages",
        default=None,
        metavar="FRACTIONS",
        help="with --label-dp rr-prior: the stages' fractions of the training set "
        "(default: 0.5,0.5)",
    )


def _check(args: Any, settings: dict[str, Any]) -> None:
    require(
        not getattr(args, "resume", None),
        "resume",
        getattr(args, "resume", None),
        "unset with --privacy-unit label (a label-DP run keeps no checkpoint: it is short)",
        "Start the run again without --resume (it randomizes the labels afresh: publish "
        "only one of the two runs, or count their ε twice)",
    )
    require(
        args.label_dp is not None,
        "label_dp",
        None,
        "'rr' or 'rr-prior' with --privacy-unit label",
        "Add --label-dp rr or --label-dp rr-prior",
    )
    for name in REFUSED:
        require(
            settings.get(name) in (None, False),
            name,
            settings.get(name),
            "unset with --privacy-unit label (no gradient noise is added: the labels are "
            "randomized once)",
            f"Drop --{name.replace('_', '-')}, or train with --privacy-unit example",
        )
    require(
        settings.get("delta") in (None, 0, 0.0),
        "delta",
        settings.get("delta"),
        "unset with --privacy-unit label (the guarantee is pure: δ = 0)",
        "Drop --delta",
    )


def run_label(args: Any, settings: dict[str, Any]) -> int:
    """Train one label-DP run from the parsed ``dpfy train`` flags; write the run directory."""
    # Imported here, not at the top: ``dpfy train --help`` builds its parser without torch.
    import torch
    from torch.utils.data import TensorDataset

    from dpfy.data import load_dataset
    from dpfy.label_dp import LabelLedger, fit_classifier, randomize_labels
    from dpfy.models import build_model

    if args.label_dp is not None or args.privacy_unit == "label":
        require(
            args.privacy_unit == "label",
            "privacy_unit",
            args.privacy_unit,
            "'label' with --label-dp",
            "Add --privacy-unit label",
        )
    _check(args, settings)
    epsilon = float(settings.get("epsilon", 3.0))
    require(
        args.label_stages is None or args.label_dp == "rr-prior",
        "label_stages",
        args.label_stages,
        "unset with --label-dp rr (plain RR has no stages)",
        "Drop --label-stages, or use --label-dp rr-prior",
    )
    try:
        fractions = [float(f) for f in str(args.label_stages or "0.5,0.5").split(",")]
    except ValueError:
        raise ValueError(
            f"label_stages must be comma-separated fractions, got label_stages = "
            f"{args.label_stages!r}. Write e.g. --label-stages 0.4,0.6"
        ) from None
    seed = settings.get("seed")
    gen = torch.Generator()
    gen.manual_seed(int(seed) if seed is not None else int(torch.seed()) % 2**63)
    torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    data = load_dataset(settings.get("dataset", "fashion_mnist"), data_dir=settings.get("data_dir"))
    out = Path(args.out or f"runs/{data.name}-label-{args.label_dp}")
    require(not out.exists(), "out", str(out), "a new directory", "Pass another --out")
    require(
        isinstance(data.train, TensorDataset) and isinstance(data.test, TensorDataset),
        "dataset",
        data.name,
        "a dataset held in tensors",
        "Use the Python API (dpfy.label_dp) for other datasets",
    )
    assert isinstance(data.train, TensorDataset) and isinstance(data.test, TensorDataset)
    x, y = data.train.tensors
    model_name = settings.get("model", "logreg")
    epochs = int(settings.get("epochs", 5))
    batch = int(settings.get("batch_size") or 256)
    lr = float(settings.get("lr") or 1e-3)

    def new_model() -> torch.nn.Module:
        return build_model(model_name, input_shape=data.input_shape, num_classes=data.num_classes)

    def fit_predict(idx: torch.Tensor, noisy: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            m = fit_classifier(new_model(), x[idx], noisy, epochs=epochs, batch_size=batch, lr=lr,
                               generator=gen)  # fmt: skip
        return torch.softmax(m(x[query]), dim=1)

    noisy, release = randomize_labels(
        # no seed: the labels' randomness comes from the OS (secure), like the gradient noise
        y, epsilon, data.num_classes, mechanism=args.label_dp,
        generator=gen if seed is not None else None,
        fit_predict=fit_predict, stage_fractions=fractions,
    )  # fmt: skip
    ledger = LabelLedger()
    ledger.record(release)
    model = fit_classifier(new_model(), x, noisy, epochs=epochs, batch_size=batch, lr=lr,
                           generator=gen)  # fmt: skip
    xt, yt = data.test.tensors
    with torch.no_grad():
        acc = float((model(xt).argmax(1) == yt).float().mean())
    out.mkdir(parents=True)
    (out / "label_ledger.json").write_text(ledger.to_json(indent=2))
    torch.save(model.state_dict(), out / "model.pt")
    metrics = {"test_accuracy": acc, "epsilon": ledger.epsilon(), "delta": 0.0}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    header = f"# dpfy label-DP run: {data.name}, model {model_name}, {args.label_dp}\n\n"
    body = f"Test accuracy {acc:.4f} (the official test split, not protected).\n\n"
    (out / "report.md").write_text(header + body + ledger.report())
    print(f"dpfy train: label DP ({args.label_dp}) at ε = {epsilon:g} (δ = 0): test accuracy "
          f"{acc:.4f}; wrote {out}")  # fmt: skip
    assert math.isfinite(ledger.epsilon())
    return 0
