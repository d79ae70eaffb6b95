"""The privacy report: the guide's "Reporting Privacy Guarantees" checklist, from a ledger.

Rendered as Markdown (for people), JSON (for machines) and a PNG of ε over steps. Every number
in it comes from the accountants reading the ledger; the context (what is released, the unit of
privacy, tuning) is given explicitly by the caller. Checklist items (Ponomareva et al. 2023,
§5.3.3):

1. DP setting (central, trusted curator by default).
2. The guarantee instantiated: data accesses covered (this run; tuning if given), what the
   mechanism outputs, unit of privacy, adjacency (from the sampling the ledger recorded).
3. Accounting: accountant type and version, sampling assumption and whether it held, the bound
   without amplification when amplification is claimed, each mechanism's share of the budget,
   formal (ε, δ) statements for training and for tuning, δ convention (δ ≪ 1/N).
4. Transparency: library versions.

With adaptive methods the report names each one that ran (registry name and what it releases
per step; every release is also a row of the mechanisms table), and says which data the user
declared public and what it drove (``public_data``): such data is outside the guarantee.

Warnings (e.g. "a fixed seed makes this run reproducible") come first, before the statement.
``privacy_report.json`` keeps every piece of context the Markdown shows, so
:meth:`PrivacyReport.context_from_dict` + :meth:`PrivacyReport.from_ledger` re-render the same
report from the run directory (``dpfy report RUN_DIR``). Nothing in it is secret: no seed, no
generator state.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Sequence

from dpfy._require import require, require_extra
from dpfy.errors import PrivacyRefusal
from dpfy.privacy.accountants import (
    ACCOUNTANTS,
    accountant_label,
    check_accountant,
    epsilon,
    epsilon_curve,
    prepare,
)
from dpfy.privacy.ledger import Ledger
from dpfy.privacy.report_fields import MechanismShare, ReportFields, TuningCost
from dpfy.privacy.report_markdown import report_markdown
from dpfy.privacy.report_text import (
    DEFAULT_DP_SETTING,
    NOISE_HELD,
    NOISE_TEXT,
    tier,
    unit_text,
)
from dpfy.privacy.section import ReportSection
from dpfy.privacy.statement import inapplicable
from dpfy.privacy.tuning import group_privacy
from dpfy.privacy.user_level import USER_UNIT

__all__ = [
    "TuningCost",
    "ReportSection",
    "MechanismShare",
    "PrivacyReport",
    "DEFAULT_DP_SETTING",
    "CONTEXT",
    "tier",
]

# Keys of privacy_report.json that are the caller's context (not computed from the ledger).
CONTEXT = (
    "released",
    "not_released",
    "unit_of_privacy",
    "protects",
    "dp_setting",
    "dataset_size",
    "layer_table",
    "model_description",
    "sampling_note",
    "warnings",
    "methods",
    "public_data",
    "sections",
)


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class PrivacyReport(ReportFields):
    """A privacy statement for one run, built by :meth:`from_ledger`."""

    @classmethod
    def from_ledger(
        cls,
        ledger: Ledger,
        *,
        delta: float,
        accountant: str = "pld",
        released: str = "final model weights",
        unit_of_privacy: str | None = None,
        protects: str = "features and labels",
        dp_setting: str = DEFAULT_DP_SETTING,
        dataset_size: int | None = None,
        tuning: TuningCost | None = None,
        group_size: int | None = None,
        layer_table: Sequence[Mapping[str, Any]] | None = None,
        model_description: str | None = None,
        sampling_note: str | None = None,
        warnings: Sequence[str] = (),
        not_released: str | None = None,
        methods: Sequence[Mapping[str, str]] = (),
        public_data: str | None = None,
        sections: Sequence[ReportSection] = (),
        num_points: int = 50,
    ) -> "PrivacyReport":
        """Account ``ledger`` and gather the context of the statement.

        Args:
          ledger: the run's ledger.
          delta: δ of the statement (the guide: δ ≪ 1/N, e.g. 1/N^1.1).
          accountant: the accountant of the headline ε (``"pld"`` by default; the report also
            lists RDP and the GDP approximation).
          released: what is published, e.g. "final model weights" (the guarantee also covers
            every intermediate noisy gradient and checkpoint).
          unit_of_privacy: e.g. "one example", "one user (≤ 20 examples)", "128 tokens";
            default: the ledger's unit ("one example", or for user-level steps "one user, with
            all of their examples"). A user-level ledger refuses a text that does not name
            the user.
          protects: "features and labels", "labels only", ...
          dp_setting: central (default), local or distributed DP, in words.
          dataset_size: N; defaults to ``ledger.dataset_size``.
          tuning: the cost of the hyperparameter search, if private data was used for it.
          group_size: also state the guarantee for groups of this many examples.
          layer_table: rows (dicts) describing each layer's per-sample rule/engine.
          model_description: free text about the model.
          sampling_note: free text about the data pipeline (e.g. what the loader really did).
          warnings: sentences shown first, above the statement (e.g. a fixed seed).
          not_released: what the run kept secret (e.g. checkpoints holding the seed).
          methods: the adaptive methods that ran, in the order they ran in each step, as rows
            ``{"name": registry name, "releases": what it releases per step}``.
          public_data: data the user declared public and what it was used for (e.g. a test
            split whose accuracy drove the noise schedule): not protected by the guarantee.
          num_points: points of the ε-over-steps curve.
        """
        check_accountant(accountant)
        for row in methods:
            require(
                isinstance(row.get("name"), str) and row["name"] != "",
                "methods",
                row,
                "rows with a non-empty 'name' (and 'releases')",
                "Pass each method's registry name and what it releases per step",
            )
        require(0 < delta < 1, "delta", delta, "in (0, 1)")
        require(
            ledger.num_steps >= 1,
            "ledger",
            "empty",
            "a ledger with at least one step",
            "Record the run's steps before writing a report",
        )
        n = dataset_size if dataset_size is not None else ledger.dataset_size
        unit = ledger.unit()
        if unit_of_privacy is None:
            unit_of_privacy = unit_text(unit)
        require(
            unit != "user" or "user" in unit_of_privacy.lower(),
            "unit_of_privacy",
            unit_of_privacy,
            "a description of one user for a user-level ledger (ULS, ELS)",
            f"The ledger accounts users: leave unit_of_privacy unset ('{USER_UNIT}')",
        )
        if group_size is not None:
            require(
                isinstance(group_size, int) and group_size >= 1,
                "group_size",
                group_size,
                "an integer >= 1",
            )
        left_out = {a: why for a in ACCOUNTANTS if (why := inapplicable(ledger, a)) is not None}
        require(
            accountant not in left_out,
            "accountant",
            accountant,
            "one that applies to this ledger",
            left_out.get(accountant, ""),
        )
        eps = {
            name: _epsilon_or_none(ledger, delta, name, headline=name == accountant)
            for name in ACCOUNTANTS
            if name not in left_out
        }
        headline = eps[accountant]
        assert headline is not None, "the headline accountant raises rather than give None"
        form = prepare(ledger, accountant=accountant)
        rates = [g.sample_rate for g in ledger.step_groups]
        sigmas = [g.effective_noise_multiplier() for g in ledger.step_groups]
        mechanisms = tuple(_mechanism_shares(ledger, delta=delta, accountant=accountant))
        group = None
        if group_size is not None:
            group = group_privacy(headline, delta, group_size=group_size)
        accesses = "this training run only"
        if tuning is not None:
            accesses = (
                "this training run, and the hyperparameter search that chose its "
                "settings (see tuning)"
            )
        return cls(
            epsilon=headline,
            delta=delta,
            accountant=accountant,
            steps=ledger.num_steps,
            dataset_size=n,
            adjacency=ledger.adjacency(),
            samplings=tuple(sorted(s.value for s in ledger.samplings())),
            sample_rates=(min(rates), max(rates)),
            noise_multipliers=(min(sigmas), max(sigmas)),
            epsilons=eps,
            left_out=left_out,
            epsilon_without_amplification=epsilon(
                ledger, delta=delta, accountant=accountant, amplify=False
            ),
            coarsened=form.resolution,
            curve=tuple(
                epsilon_curve(ledger, delta=delta, accountant=accountant, num_points=num_points)
            ),
            mechanisms=mechanisms,
            released=released,
            unit_of_privacy=unit_of_privacy,
            protects=protects,
            dp_setting=dp_setting,
            data_accesses=accesses,
            tuning=tuning,
            group_size=group_size,
            group_statement=group,
            layer_table=tuple(dict(r) for r in (layer_table or ())),
            model_description=model_description,
            sampling_note=sampling_note,
            versions={"dpfy": _version("dpfy"), "dp-accounting": _version("dp-accounting")},
            warnings=tuple(warnings),
            not_released=not_released,
            methods=tuple({"name": r["name"], "releases": r.get("releases", "")} for r in methods),
            public_data=public_data,
            sections=tuple(sections),
            unit=unit,
            noise_mechanisms=_noise_mechanisms(ledger),
        )

    @staticmethod
    def context_from_dict(saved: Mapping[str, Any]) -> dict[str, Any]:
        """``from_ledger`` keyword arguments that re-create a saved report's context.

        ``saved`` is a ``privacy_report.json``; with the same ledger, δ and accountant the
        re-rendered Markdown is the same, byte for byte.
        """
        out: dict[str, Any] = {k: saved[k] for k in CONTEXT if saved.get(k) is not None}
        out["warnings"] = tuple(out.get("warnings", ()))
        out["sections"] = tuple(ReportSection.from_dict(d) for d in out.get("sections", ()))
        if saved.get("tuning"):
            out["tuning"] = TuningCost(**saved["tuning"])
        if saved.get("group"):
            out["group_size"] = int(saved["group"]["group_size"])
        return out

    # -- rendering ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (infinite values are the string ``"inf"``)."""
        d: dict[str, Any] = {
            "format": "dpfy-privacy-report/1",
            "statement": self.statement(),
            "epsilon": _finite(self.epsilon),
            "delta": self.delta,
            "accountant": self.accountant,
            "accountant_label": accountant_label(self.accountant),
            "approximate": self.approximate,
            "epsilons": {k: (None if v is None else _finite(v)) for k, v in self.epsilons.items()},
            "left_out": dict(self.left_out),
            "accountant_labels": {k: accountant_label(k) for k in self.epsilons},
            "epsilon_without_amplification": _finite(self.epsilon_without_amplification),
            "coarsened_sigma_resolution": self.coarsened,
            "steps": self.steps,
            "dataset_size": self.dataset_size,
            "adjacency": self.adjacency,
            "samplings": list(self.samplings),
            "sample_rate_range": list(self.sample_rates),
            "noise_multiplier_range": list(self.noise_multipliers),
            "mechanisms": [
                {**dataclasses.asdict(m), "epsilon_alone": _finite(m.epsilon_alone)}
                for m in self.mechanisms
            ],
            "released": self.released,
            "unit_of_privacy": self.unit_of_privacy,
            "unit": {
                "name": self.unit,
                "description": self.unit_of_privacy,
                "adjacency": self._adjacency_text(),
            },
            "protects": self.protects,
            "dp_setting": self.dp_setting,
            "data_accesses": self.data_accesses,
            "tuning": dataclasses.asdict(self.tuning) if self.tuning else None,
            "group": (
                {
                    "group_size": self.group_size,
                    "epsilon": _finite(self.group_statement[0]),
                    "delta": self.group_statement[1],
                }
                if self.group_statement
                else None
            ),
            "delta_convention": self.delta_convention(),
            "tier": self.tier,
            "curve": [[t, _finite(e)] for t, e in self.curve],
            "layer_table": [dict(r) for r in self.layer_table],
            "model_description": self.model_description,
            "sampling_note": self.sampling_note,
            "warnings": list(self.warnings),
            "not_released": self.not_released,
            "methods": [dict(r) for r in self.methods],
            "public_data": self.public_data,
            "sections": [sec.to_dict() for sec in self.sections],
            "versions": dict(self.versions),
        }
        if self.noise_mechanisms:
            d["noise_mechanisms"] = [dict(r) for r in self.noise_mechanisms]
        return d

    def to_markdown(self) -> str:
        """The report for people, following the guide's checklist (its sections:
        :mod:`dpfy.privacy.report_markdown`)."""
        return report_markdown(self)

    def plot(self, path: str | Path) -> Path:
        """Write the ε-over-steps PNG to ``path``."""
        matplotlib = require_extra("matplotlib", feature="the ε-over-steps plot")
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = Path(path)
        fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
        xs = [t for t, _ in self.curve]
        ys = [e for _, e in self.curve]
        label = accountant_label(self.accountant)
        ax.plot(xs, ys, marker="." if len(xs) < 60 else None, label=label)
        ax.set_xlabel("step")
        ax.set_ylabel(f"ε at δ = {self.delta:.2g}")
        ax.set_title("Privacy spent over training")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return path

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """Write privacy_report.md, privacy_report.json and epsilon_over_steps.png."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {
            "markdown": out / "privacy_report.md",
            "json": out / "privacy_report.json",
            "plot": out / "epsilon_over_steps.png",
        }
        paths["markdown"].write_text(self.to_markdown())
        paths["json"].write_text(json.dumps(self.to_dict(), indent=2))
        self.plot(paths["plot"])
        return paths


def _epsilon_or_none(
    ledger: Ledger, delta: float, accountant: str, *, headline: bool
) -> float | None:
    """ε by ``accountant``; None for a side column the accountant refuses (PLD's σ floor)."""
    try:
        return epsilon(ledger, delta=delta, accountant=accountant)
    except PrivacyRefusal:
        if headline:
            raise
        return None


def _mechanism_shares(ledger: Ledger, *, delta: float, accountant: str) -> list[MechanismShare]:
    inv_var: dict[str, float] = {}
    steps: dict[str, int] = {}
    for g in ledger.step_groups:
        for r in g.releases:
            w = math.inf if r.noise_multiplier == 0 else g.count * r.noise_multiplier**-2
            inv_var[r.mechanism] = inv_var.get(r.mechanism, 0.0) + w
            steps[r.mechanism] = steps.get(r.mechanism, 0) + g.count
    total = sum(inv_var.values())
    out = []
    for name in ledger.mechanisms():
        alone = epsilon(ledger.only(name), delta=delta, accountant=accountant)
        share = (
            (inv_var[name] / total)
            if math.isfinite(total)
            else (1.0 if math.isinf(inv_var[name]) else 0.0)
        )
        out.append(MechanismShare(name, steps[name], alone, share))
    return out


def _noise_mechanisms(ledger: Ledger) -> tuple[dict[str, Any], ...]:
    """One row per correlated mechanism of the ledger: its name, sampling and assumption."""
    seen: dict[tuple, dict[str, Any]] = {}
    for g in ledger.step_groups:
        for r in g.releases:
            if r.noise != "gaussian":
                seen.setdefault(
                    (r.noise, r.period, g.sampling),
                    {
                        "noise": r.noise,
                        "period": r.period,
                        "sampling": g.sampling.value,
                        "assumption": NOISE_TEXT[r.noise].format(period=r.period),
                        "held": NOISE_HELD,
                    },
                )
    return tuple(seen.values())
