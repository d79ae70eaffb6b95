"""The privacy report for people: :meth:`dpfy.privacy.report.PrivacyReport.to_markdown`'s
Markdown, section by section following the guide's checklist."""

from __future__ import annotations

from dpfy.privacy.accountants import accountant_label
from dpfy.privacy.ledger import Sampling
from dpfy.privacy.report_fields import ReportFields
from dpfy.privacy.report_text import SAMPLING_TEXT, TIER_TEXT
from dpfy.privacy.statement import stated_delta, stated_epsilon

__all__ = ["report_markdown"]


def report_markdown(report: ReportFields) -> str:
    """The report for people, following the guide's checklist."""
    f = stated_epsilon  # every ε rounded up: never shown smaller than computed
    lines = ["# Privacy report", ""]
    for w in report.warnings:
        lines += [f"> **WARNING:** {w}.", ""]
    lines += [f"**{report.statement()}**", ""]
    lines += ["## 1. DP setting", "", report.dp_setting, ""]
    lines += [
        "## 2. What the guarantee covers",
        "",
        f"- **Data accesses covered:** {report.data_accesses}.",
        f"- **Released:** {report.released}. Formally the mechanism's output is the whole "
        "sequence of noisy releases (every noisy gradient and every checkpoint); the "
        "guarantee covers all of it, and anything computed from it.",
        *([f"- **Not released (secret):** {report.not_released}."] if report.not_released else []),
        f"- **Unit of privacy:** {report.unit_of_privacy}; protects {report.protects}.",
        f"- **Adjacency:** {report._adjacency_text()}.",
        *report._methods_lines(),
        *(
            [f"- **Public data (not protected):** {report.public_data}."]
            if report.public_data
            else []
        ),
        "",
    ]
    lines += [
        "## 3. Accounting",
        "",
        f"- **Accountant:** {accountant_label(report.accountant)}; dp_accounting "
        f"{report.versions.get('dp-accounting', '?')}.",
        "- **Sampling:**",
    ]
    for s in report.samplings:
        lines.append(f"  - `{s}`: {SAMPLING_TEXT[Sampling(s)]}")
    if report.sampling_note:
        lines.append(f"  - Note: {report.sampling_note}")
    for row in report.noise_mechanisms:
        lines.append(
            f"- **Noise mechanism:** `{row['noise']}` on `{row['sampling']}`: "
            f"{row['assumption']}; this assumption {row['held']}."
        )
    lines.append(
        f"- **Without amplification by sampling** (if the sampling assumption did "
        f"not hold): ε = {f(report.epsilon_without_amplification)} at the same δ."
    )
    if report.coarsened:
        lines.append(
            f"- Noise multipliers were rounded down to a {report.coarsened:.0%} grid "
            "before accounting (faster; ε stays an upper bound)."
        )
    lines += ["", "| accountant | ε | note |", "|---|---|---|"]
    for name, e in report.epsilons.items():
        value = f(e) if e is not None else "not computed"
        note = (
            accountant_label(name)
            if e is not None
            else ("refused: σ below the PLD grid floor (see the RDP row)")
        )
        lines.append(f"| {name.upper()} | {value} | {note} |")
    for name, why in report.left_out.items():
        lines.append(f"| {name.upper()} | left out | {why} |")
    lines += [
        "",
        "## 4. Formal statements",
        "",
        f"- **Training:** ({f(report.epsilon)}, {stated_delta(report.delta)})-DP.",
        (
            "- **Tuning:** "
            + (
                f"({f(report.tuning.epsilon)}, {stated_delta(report.tuning.delta)})-DP "
                f"including the released run; {report.tuning.method}. "
                f"{report.tuning.details}"
                if report.tuning
                else "not covered: the hyperparameters were not chosen on "
                "private data, or that search is not accounted here."
            )
        ),
    ]
    if report.group_statement:
        ge, gd = report.group_statement
        lines.append(
            f"- **Groups of {report.group_size}:** ({f(ge)}, {stated_delta(gd)})-DP "
            "(group privacy; degrades fast)."
        )
    dc = report.delta_convention()
    lines += [f"- **δ convention:** {dc['note']}.", f"- **ε tier:** {TIER_TEXT[report.tier]}", ""]
    lines += [
        "## 5. Mechanisms",
        "",
        "| mechanism | steps released | ε alone | share of the noise budget |",
        "|---|---|---|---|",
    ]
    for m in report.mechanisms:
        lines.append(f"| {m.mechanism} | {m.steps} | {f(m.epsilon_alone)} | {m.noise_share:.1%} |")
    lines += [
        "",
        "## 6. Hyperparameters",
        "",
        f"- steps (optimizer updates): {report.steps}",
        f"- dataset size N: {report.dataset_size if report.dataset_size else 'unknown'}",
        f"- sample rate q: {_range(report.sample_rates)}",
        f"- noise multiplier σ (all releases of a step combined): "
        f"{_range(report.noise_multipliers)}",
        "",
    ]
    if report.model_description or report.layer_table:
        lines += ["## 7. Model", ""]
        if report.model_description:
            lines += [report.model_description, ""]
        if report.layer_table:
            cols = list(report.layer_table[0].keys())
            lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            for r in report.layer_table:
                lines.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
            lines.append("")
    for sec in report.sections:
        lines += [f"## {sec.title}", "", *sec.lines, ""]
    lines += [
        "## ε over steps",
        "",
        "![ε over steps](epsilon_over_steps.png)",
        "",
        "## Transparency",
        "",
        "Computed by dpfy " + report.versions.get("dpfy", "?") + " from the run's ledger "
        "(every noisy release recorded as a dp_accounting event).",
        "",
    ]
    return "\n".join(lines)


def _range(pair: tuple[float, float]) -> str:
    lo, hi = pair
    return f"{lo:.6g}" if lo == hi else f"{lo:.6g} to {hi:.6g}"
