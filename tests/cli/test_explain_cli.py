"""``dpfy explain``: the table of layers with their rule files, the pre-flight's problems
(issue 14 §2), and bad input refused in one line, not a traceback. (What it explains:
tests/grads/test_explain.py and tests/grads/test_preflight.py.)"""

from __future__ import annotations

import pytest

from dpfy.cli import main


def test_cli_explain(capsys):
    assert main(["explain", "tanh_cnn", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "| 0 | Conv2d | 1040 | dpfy/grads/rules/conv.py |" in out


@pytest.mark.parametrize("argv, match", [
    (["mlp", "--input-shape", "0,5"], "--input-shape must be positive integers"),
    (["mlp", "--input-shape", "-1"], "--input-shape must be positive integers"),
    (["mlp", "--input-shape", "abc"], "--input-shape must be positive integers"),
    (["os:getcwd"], "a factory returning a torch.nn.Module"),
    (["nonexist_pkg_dpfy:factory"], "cannot be found"),
    (["dpfy.models:nonexist"], "cannot be found"),
])
def test_explain_bad_input_is_one_line_not_a_traceback(argv, match, capsys):
    # A newcomer's trial found each of these printed a traceback (exit 1).
    assert main(["explain", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dpfy explain: error: ") and "\n" not in err and match in err, err


def test_cli_explain_prints_the_preflight(capsys):
    assert main(["explain", "tanh_cnn", "--batch-size", "2"]) == 0
    assert "Problems (dpfy.validate on a 4-row batch): none" in capsys.readouterr().out
