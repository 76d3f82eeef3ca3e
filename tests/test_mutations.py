"""Mutation check: every planted bug of ``tests/mutations.py`` must make its method's own tests fail.

Each case runs the method's unit tests and golden checks (``mutations.SELECTIONS``) in a fresh pytest process with
one bug patched in (``-p mutations``, ``CLBENCH_MUTATION``), and requires that run to end with failed tests (exit
code 1: not a collection or usage error, which would prove nothing). The same selections run unpatched in the
ordinary suite, where they must pass, so a failure here is the planted bug's doing (a control run per method is
therefore not repeated here: it would double the cost). Which test catches which bug is listed in
``reports/gate/README.md``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mutations import ENV, MUTATIONS, SELECTIONS

from clbench.catalog import STRATEGIES

ROOT = Path(__file__).resolve().parents[1]


def run_selection(method: str, mutation: str) -> subprocess.CompletedProcess:
    files, keyword = SELECTIONS[method]
    env = {
        **os.environ,
        ENV: mutation,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "mutations", "-n", "0"]
    cmd += [
        "-x",
        "-m",
        "not slow and not veryslow and not full and not mutations",
        "-k",
        keyword,
        *files,
    ]  # -x: the first catch is enough
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def failed_tests(output: str) -> list[str]:
    return re.findall(r"^FAILED (\S+)", output, flags=re.MULTILINE)


@pytest.mark.mutations  # one pytest process per planted bug (48-120 s each under load): .ci/run's own step
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_planted_bug_is_caught_by_the_methods_tests(name):
    mutation = MUTATIONS[name]
    result = run_selection(mutation.method, name)
    output = result.stdout + result.stderr
    assert result.returncode == 1, (
        f"planted bug {name!r} ({mutation.bug}) was not caught by {mutation.method}'s tests "
        f"(pytest exit code {result.returncode}; 1 = tests failed):\n{output[-3000:]}"
    )
    assert failed_tests(result.stdout), f"no FAILED line for {name!r}:\n{output[-3000:]}"


def test_every_method_has_at_least_two_planted_bugs():
    per_method = {m: sum(1 for mut in MUTATIONS.values() if mut.method == m) for m in SELECTIONS}
    assert set(per_method) == set(STRATEGIES.names())  # every registered method, the closed-form heads included
    assert all(n >= 2 for n in per_method.values()), per_method
