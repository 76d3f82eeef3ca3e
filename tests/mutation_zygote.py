"""A fork server for the mutation check (``tests/test_mutations.py``): import the libraries once, then run each
planted bug's pytest session in a child forked from this process.

A mutation's run spent ~16 of its ~18 s importing torch, timm, Avalanche and clbench and building timm's registry;
the tests that catch the bug take a second or two. This process imports those libraries (and ``tests/mutations.py``,
which imports the methods) but no test module and no conftest, and does no tensor work, so every child starts from
the same state a fresh interpreter would reach after those imports: the child's pytest imports the test modules after
``mutations.pytest_configure`` has planted the bug, exactly as in a fresh process.

Protocol (one JSON object per line): stdin ``{"args": [...], "env": {...}, "log": PATH, "timeout": S}``; stdout
``{"rc": CODE}`` with the child's pytest exit code, or ``{"rc": null, "timeout": true}`` when the child was killed.
The child's stdout and stderr go to ``log``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # no intra-op thread pool exists when the children fork

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

import avalanche.benchmarks  # noqa: E402,F401  (the imports each child would otherwise repeat)
import mutations  # noqa: E402,F401  (imports every method module; plants nothing without CLBENCH_MUTATION)
import timm.models  # noqa: E402,F401

import clbench.run.harness  # noqa: E402,F401


def _child(request: dict) -> None:
    os.environ.clear()
    os.environ.update(request["env"])
    fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    code = 3
    try:
        code = int(pytest.main(request["args"]))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait(pid: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"rc": os.waitstatus_to_exitcode(status)}
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"rc": None, "timeout": True}
        time.sleep(0.05)


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        reply = _wait(pid, float(request.get("timeout", 900)))
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
