"""`dpfy account` on the truncated ledger of issue 15 §3: one line naming the file, the line and
column, and the fix. (The fuzzed files themselves: tests/fuzz/test_fuzz_files.py.)"""

from __future__ import annotations


def test_the_issue_example_names_file_line_and_fix(tmp_path, capsys):
    path = tmp_path / "ledger.json"
    path.write_text("{\n")
    from dpfy.cli import main
    assert main(["account", "--ledger", str(path), "--delta", "1e-5"]) == 2
    err = capsys.readouterr().err.strip()
    assert str(path) in err and "line 2 column 1" in err and "dpfy train" in err, err
