"""A fork server for tests/test_benchmarks_smoke.py: runs benchmark scripts as
``python SCRIPT --smoke`` would, each in its own process, without paying the interpreter's
start-up for each.

A fresh interpreter spends ~5 s of CPU importing torch, torch._dynamo (which the first
``torch.optim`` optimizer imports), dp_accounting (scipy) and dpfy before a smoke run's own
fraction of a second of work starts; twenty-odd scripts paid it twenty-odd times. This server
imports those once, runs nothing else (no tensor operation, so no thread pool exists to be
broken by ``fork``), and forks one child per request. The child is the process
``python SCRIPT --smoke`` would have been, started from the same environment and working
directory: ``sys.argv`` is ``[SCRIPT, "--smoke"]``, ``sys.path[0]`` is the script's directory,
the script runs as ``__main__`` (``runpy.run_path``), stdout and stderr go to the files the
request names, stdin is /dev/null, and the process exits through the interpreter's own
shutdown (threads joined, atexit handlers run) with ``python``'s exit status. What differs is
only that the modules above are already in ``sys.modules``: a script's ``import torch`` binds
the loaded module instead of loading it. Every child is forked from the same untouched
server, so no script sees another's state.

Protocol (one JSON object per line on stdin): ``{"script": PATH, "stdout": PATH, "stderr":
PATH}``; the server answers ``pid N`` when the child starts and ``rc N`` when it has ended.
End of input ends the server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import sys
import threading

PRELOAD = ("torch", "torch._dynamo", "dp_accounting", "dpfy")
PRELOAD_IF_INSTALLED = ("opacus", "transformers")


def _preload() -> None:
    for name in PRELOAD:
        __import__(name)
    for name in PRELOAD_IF_INSTALLED:
        if importlib.util.find_spec(name) is not None:
            __import__(name)
    # fork copies one thread; a thread started by an import would be missing in every child
    assert threading.active_count() == 1, threading.enumerate()


def _child(request: dict[str, str]) -> None:
    """Become ``python SCRIPT --smoke``; never returns (SystemExit ends the interpreter)."""
    script = request["script"]
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        target = os.open(path, flags, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = [script, "--smoke"]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    raise SystemExit(0)


def main() -> None:
    _preload()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"rc {os.waitstatus_to_exitcode(status)}", flush=True)


if __name__ == "__main__":
    main()
