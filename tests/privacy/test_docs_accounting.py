"""The quick-start example in docs/accounting.md runs and prints what the doc says."""

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "accounting.md"


def test_quick_start_runs_and_matches_comments():
    text = DOC.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), {})
    lines = out.getvalue().splitlines()
    # the comments in the example state these values (RDP/PLD/GDP of the guide's example)
    assert lines[:3] == ["4.952", "4.611", "4.483"]
    assert lines[-1] == "3"
