"""Mutation check: every planted bug of ``tests/mutations.py`` must make its method's own tests fail.

Each case runs the method's unit tests and golden checks (``mutations.SELECTIONS``) in a pytest session of its own
with one bug patched in (``-p mutations``, ``CLBENCH_MUTATION``), in a process forked from a server that imported the
libraries but no test module (``tests/mutation_zygote.py``; the bug is planted before any test module is imported,
as in a fresh interpreter), and requires that run to end with failed tests (exit
code 1: not a collection or usage error, which would prove nothing). The same selections run unpatched in the
ordinary suite, where they must pass, so a failure here is the planted bug's doing (a control run per method is
therefore not repeated here: it would double the cost; one control through the fork server shows a forked session
passes unpatched). Which test catches which bug is listed in
``reports/gate/README.md``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mutations import ENV, MUTATIONS, SELECTIONS

from clbench.core.catalog import STRATEGIES

ROOT = Path(__file__).resolve().parents[1]


class Zygote:
    """``tests/mutation_zygote.py`` in a subprocess: it imports the libraries once and forks one pytest session per
    planted bug (a fresh interpreter per bug spent ~16 of its ~18 s on imports)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        env = {**os.environ, "PYTHONPATH": pythonpath(), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        env.pop(ENV, None)
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "mutation_zygote.py")],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, args: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, str]:
        log = self.tmp / f"run-{len(list(self.tmp.iterdir()))}.log"
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"args": args, "env": env, "log": str(log), "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the mutation fork server died (exit code {self.proc.poll()})"
        return json.loads(line)["rc"], log.read_text() if log.exists() else ""

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def pythonpath() -> str:
    return os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    server = Zygote(tmp_path_factory.mktemp("mutation-logs"))
    yield server
    server.close()


def selection_args(method: str) -> list[str]:
    files, keyword = SELECTIONS[method]
    args = ["-q", "-p", "no:cacheprovider", "-p", "mutations", "-n", "0", "-x"]  # -x: the first catch is enough
    return [*args, "-m", "not slow and not veryslow and not full and not mutations", "-k", keyword, *files]


def failed_tests(output: str) -> list[str]:
    return re.findall(r"^FAILED (\S+)", output, flags=re.MULTILINE)


@pytest.mark.mutations  # one pytest process per planted bug (48-120 s each under load): .ci/run's own step
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_planted_bug_is_caught_by_the_methods_tests(name, zygote):
    mutation = MUTATIONS[name]
    env = {**os.environ, ENV: name, "PYTHONPATH": pythonpath(), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    returncode, output = zygote.run(selection_args(mutation.method), env, timeout=900)
    assert returncode == 1, (
        f"planted bug {name!r} ({mutation.bug}) was not caught by {mutation.method}'s tests "
        f"(pytest exit code {returncode}; 1 = tests failed, None = killed after 900 s):\n{output[-3000:]}"
    )
    assert failed_tests(output), f"no FAILED line for {name!r}:\n{output[-3000:]}"


@pytest.mark.mutations
def test_the_fork_server_runs_an_unpatched_selection_green(zygote):
    """The control for the fork server: a session forked without a planted bug passes, so the failures above are the
    bugs' doing, not the forking's."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env.update(PYTHONPATH=pythonpath(), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    returncode, output = zygote.run(selection_args("simplecil"), env, timeout=900)
    assert returncode == 0 and re.search(r"\d+ passed", output), output[-3000:]


def test_every_method_has_at_least_two_planted_bugs():
    per_method = {m: sum(1 for mut in MUTATIONS.values() if mut.method == m) for m in SELECTIONS}
    assert set(per_method) == set(STRATEGIES.names())  # every registered method, the closed-form heads included
    assert all(n >= 2 for n in per_method.values()), per_method
