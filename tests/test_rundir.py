"""clbench.run.rundir: what a run folder must be before a run takes it, and the lock that makes it the run's own."""

from __future__ import annotations

import shutil
from collections import namedtuple

import pytest

from clbench.errors import ClbenchError
from clbench.run.rundir import RunDir, check_free_space, check_run_folder


def test_a_sweep_run_folder_is_a_run_folder():
    """A sweep worker writes its attempt file (and log) before the run takes the lock: the folder is still one
    ``--out`` accepts."""
    from clbench.run.rundir import RUN_FOLDER_MARKS
    from clbench.sweep.plan import ATTEMPT_FILE

    assert ATTEMPT_FILE in RUN_FOLDER_MARKS


def test_a_folder_of_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ClbenchError, match="is a folder of other files .1 entries., not a clbench run folder"):
        check_run_folder(tmp_path)


def test_too_little_free_space_is_refused(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(2**30, 2**30 - 2**20, 2**20))
    with pytest.raises(ClbenchError, match=r"^out .*: 1.0 MB free, but the record need about 4.0 MB"):
        check_free_space(tmp_path, 4 * 2**20, "out", "the record")


def test_a_second_process_cannot_take_the_folder(tmp_path):
    first = RunDir(tmp_path / "run", overwrite=False)
    try:
        with pytest.raises(ClbenchError, match="another clbench process is writing to"):
            RunDir(tmp_path / "run", overwrite=False)
    finally:
        first.release()
    RunDir(tmp_path / "run", overwrite=False).release()  # free again once released
