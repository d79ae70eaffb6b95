"""docs/opacus.md's Python blocks run as written, in order, as one script (≤ 15 s)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "opacus.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_every_opacus_entry_point_is_mapped() -> None:
    text = DOC.read_text()
    for name in ("PrivacyEngine", "make_private_with_epsilon", "BatchMemoryManager",
                 "get_epsilon", "ModuleValidator.fix", "DPLSTM", "DPDDP", "secure_mode",
                 "accountant"):
        assert name in text, name


def test_snippets_run(tmp_path: Path, capsys) -> None:
    assert len(BLOCKS) >= 6
    script = tmp_path / "opacus_doc.py"
    script.write_text("\n\n".join(BLOCKS))
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert "refused:" in out and "swapped:" in out and "GroupNorm" in out
