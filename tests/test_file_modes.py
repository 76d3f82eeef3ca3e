"""Files clbench writes get the user's umask, as any program's files do: a results folder shared with a group
must be readable by it (``mkstemp``, which every atomic write goes through, creates 0600 files)."""

from __future__ import annotations

import os
import stat

import pytest

from clbench.files.atomic import atomic_write_json


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_an_atomic_write_follows_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        atomic_write_json(tmp_path / "result.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "result.json").st_mode) == mode
