"""Files and settings others wrote never choose where clbench writes (issue 34, items 1-5), an export to a tracker
that cannot be reached costs one deadline, not one per record (item 13), and no test depends on the wall-clock or on
a folder another xdist worker writes (item 15).

Each table case builds its files under ``tmp_path`` and returns a :class:`Case`: the command, its exit code, a
needle its output must hold, and the folders whose every file must be byte-identical afterwards (sha256; none added,
none removed), less the folders the command was given to write in. Exit 2 is one ``clbench: error:`` line (plus its
hint), never a traceback. Everything runs on the micro ViT with random weights and a four-class image folder made
here, with this module's own feature cache.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import socket
import threading
from pathlib import Path
from typing import NamedTuple

import pytest
from cli_checks import assert_outcome, run_cli
from datatrees import make_tree

from clbench.cli import main
from clbench.files.safety import FOLDER_MARK, mark_folder

REPO = Path(__file__).resolve().parents[1]
MICRO = ["--backbone", "vit_micro", "--weights", "random", "--init-cls", "2", "--increment", "2"]
CONTROL = "\x1b[2J\x1b]0;owned\x07"  # clear the screen, retitle the window


def run_argv(data: Path, out: Path) -> list[str]:
    return ["run", "--strategy", "simplecil", "--bench", "folder", "--data-root", str(data), *MICRO, "--out", str(out)]


def sweep_argv(data: Path, out: Path | None, *extra: str) -> list[str]:
    argv = ["sweep", "--strategies", "simplecil", "--benches", "folder", "--data-root", str(data), "--seeds", "1993"]
    return [*argv, *MICRO, *(["--out", str(out)] if out is not None else []), "--no-tsne", *extra]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A complete run in a folder clbench made, with this module's own feature cache (no other worker writes it)."""
    base = tmp_path_factory.mktemp("writes")
    cache, data, run = base / "cache", make_tree(base / "data"), base / "run"
    with pytest.MonkeyPatch.context() as m:
        m.setenv("CLBENCH_CACHE", str(cache))
        assert main(run_argv(data, run)) == 0
    assert (run / FOLDER_MARK).is_file() and json.loads((run / "result.json").read_text())["complete"] is True
    return {"cache": cache, "data": data, "run": run}


def tree(folders, owned=()) -> dict[str, str]:
    """sha256 of every file (and the target of every link) below ``folders``, less those below ``owned``."""
    owned = [Path(o) for o in owned]
    out = {}
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            for name in dirs + files:
                p = Path(root) / name
                if any(p == o or o in p.parents for o in owned):
                    continue
                if p.is_symlink():
                    out[str(p)] = "link:" + os.readlink(p)
                elif p.is_file():
                    out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def victim_folder(t: Path, *names: str) -> Path:
    """A folder of someone else's files (outside every folder clbench is given)."""
    folder = t / "elsewhere"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names or ("README.md",):
        (folder / name).write_text(f"{name}: not clbench's\n")
    return folder


def copy_run(made, t: Path, name: str = "copy", edit=None) -> Path:
    """A copy of the complete run (its record edited by ``edit``), without its lock."""
    folder = t / "runs" / name
    shutil.copytree(made["run"], folder, ignore=shutil.ignore_patterns(".lock"))
    if edit is not None:
        rec = json.loads((folder / "result.json").read_text())
        edit(rec)
        (folder / "result.json").write_text(json.dumps(rec))
    return folder


class Case(NamedTuple):
    argv: list[str]
    needle: str
    code: int = 2
    owned: tuple[Path, ...] = ()  # the folders the command may write in; everything else under tmp_path is guarded
    stream: str = "err"  # where the needle is: the error line (err) or the output (out)


# ----------------------------------------------------------------------------------------------- item 1: groups
def _groups(*names, with_summary: bool = True):
    """A sweep config whose groups carry ``names``; ``--out PARENT/sweeps``, and a summary.md of the user's in
    PARENT (what a group named ``..`` replaced)."""

    def case(t, made, m, needle):
        parent = t / "project"
        parent.mkdir()
        if with_summary:
            (parent / "summary.md").write_text("# my notes\n")
        groups = "".join(f"  - name: {json.dumps(n)}\n" for n in names)  # JSON strings are YAML strings
        (t / "sweep.yaml").write_text(f"groups:\n{groups}")
        argv = sweep_argv(made["data"], parent / "sweeps", "--config", str(t / "sweep.yaml"))
        return Case(argv, needle)

    return case


GROUP_CASES = {
    "group-dotdot": (_groups(".."), "groups[0]: expected a name (one folder name) for the group; '..' is not one"),
    "group-dot": (_groups("."), "'.' is not one ('.' names no folder of its own"),
    "group-dotdot-second": (_groups("quick", ".."), "groups[1]: expected a name"),
    "group-slash": (_groups("a/b"), "it holds a path separator"),
    "group-absolute": (_groups("/tmp/clbench-hostile-group"), "it holds a path separator"),
    "group-backslash": (_groups("a\\b"), "it holds a path separator"),
    "group-control-characters": (_groups("q" + CONTROL), "'q\\x1b[2J\\x1b]0;owned\\x07' is not one"),
    "group-newline": (_groups("q\n# x"), "it holds a control character"),
    "group-empty": (_groups(""), "'' is not one (it is empty)"),
    "group-blank": (_groups("   "), "it is empty"),
    "group-too-long": (_groups("g" * 300), "it is longer than 255 bytes"),
    "group-not-a-string": (
        lambda t, made, m, needle: _groups_raw(t, made, "groups:\n  - name: [a]\n"),
        "['a'] is not one (it is list, not a name)",
    ),
    "group-repeated": (_groups("quick", "quick"), "groups[1]: name 'quick' is the name of an earlier group"),
}


def _groups_raw(t, made, text):
    (t / "sweep.yaml").write_text(text)
    return Case(sweep_argv(made["data"], t / "sweeps", "--config", str(t / "sweep.yaml")), "")


# ----------------------------------------------------------------------------------------------- item 2: export
def _export_run_id(run_id, needle_extra=""):
    def case(t, made, m, needle):
        folder = copy_run(made, t, edit=lambda rec: rec.update(run_id=run_id))
        return Case(["export", str(folder), "--to", "tensorboard", "--log-dir", str(t / "logs")], needle)

    return case


def _export_plain(t, made, m, needle):
    folder = copy_run(made, t)
    logs = t / "logs"
    return Case(["export", str(folder), "--to", "tensorboard", "--log-dir", str(logs)], needle, 0, (logs,), "out")


EXPORT_CASES = {
    "export-run-id-dotdot-path": (_export_run_id("../../x"), "run_id '../../x' is not a plain name (it holds a path"),
    "export-run-id-absolute": (_export_run_id("/tmp/clbench-hostile-export"), "is not a plain name (it holds a path"),
    "export-run-id-dotdot": (_export_run_id(".."), "run_id '..' is not a plain name ('..' names no folder"),
    "export-run-id-dot": (_export_run_id("."), "run_id '.' is not a plain name"),
    "export-run-id-control": (_export_run_id("r" + CONTROL), "'r\\x1b[2J\\x1b]0;owned\\x07' is not a plain name"),
    "export-run-id-newline": (_export_run_id("r\n# x"), "is not a plain name (it holds a control character)"),
    "export-run-id-empty": (_export_run_id(""), "field run_id is str '', expected a name"),
    "export-run-id-long": (_export_run_id("r" * 256), "is not a plain name (it is longer than 255 bytes)"),
    "export-plain-run-id": (_export_plain, "exported "),
}


# ----------------------------------------------------------------------------------------------- item 3: sweep folder
def _sweep_folder(plant):
    """``clbench sweep --out OUT`` where OUT is a sweep folder clbench made (its mark) with ``plant(OUT, t)``."""

    def case(t, made, m, needle):
        out = t / "sweep"
        out.mkdir()
        mark_folder(out, "sweep")
        plant(out, t)
        return Case(sweep_argv(made["data"], out), needle)

    return case


def _link(name, target="folder"):
    def plant(out, t):
        v = victim_folder(t, "README.md", "index.html")
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).symlink_to(v if target == "folder" else v / "README.md")

    return plant


def _foreign_report(out, t):
    (out / "report").mkdir()
    (out / "report" / "README.md").write_text("# the team's report\n")


def _report_is_file(out, t):
    (out / "report").write_text("a file\n")


def _foreign_run_folder(out, t):
    run = out / "runs" / "simplecil-folder-s1993"
    run.mkdir(parents=True)
    for name in (".lock", "predictions.npz", "features.npz"):
        (run / name).write_bytes(b"someone else's\n")


SWEEP_FOLDER_CASES = {
    "sweep-report-link": (_sweep_folder(_link("report")), "report/ is a symbolic link"),
    "sweep-runs-link": (_sweep_folder(_link("runs")), "runs/ is a symbolic link"),
    "sweep-report-link-unmarked": (
        lambda t, made, m, needle: _unmarked_with_link(t, made, "report"),
        "report/ is a symbolic link",
    ),
    "sweep-report-foreign-readme": (
        _sweep_folder(_foreign_report),
        "report is a folder of other files (1 entries), not a clbench report folder",
    ),
    "sweep-report-is-a-file": (_sweep_folder(_report_is_file), "report is a file, not a folder"),
    "sweep-run-folder-link": (
        _sweep_folder(_link("runs/simplecil-folder-s1993")),
        "runs/simplecil-folder-s1993: it is a symbolic link; a sweep writes only into run folders inside its own",
    ),
    "sweep-run-folder-foreign": (
        _sweep_folder(_foreign_run_folder),
        "runs/simplecil-folder-s1993: it is a folder of other files, not a clbench run folder",
    ),
}


def _unmarked_with_link(t, made, name):
    out = t / "sweep"
    out.mkdir()
    _link(name)(out, t)
    return Case(sweep_argv(made["data"], out), "")


# ----------------------------------------------------------------------------------------------- item 4: run folders
def _run_out(*files: tuple[str, bytes], overwrite: bool = False):
    """``run --out F`` where F holds ``files`` (name, content) someone else wrote."""

    def case(t, made, m, needle):
        folder = t / "theirs"
        folder.mkdir()
        for name, content in files:
            (folder / name).write_bytes(content)
        return Case(run_argv(made["data"], folder) + (["--overwrite"] if overwrite else []), needle)

    return case


THEIRS = (("predictions.npz", b"their predictions\n"), ("features.npz", b"their features\n"))
GRADER_ATTEMPT = json.dumps({"attempt": 3, "student": "x"}).encode()
NOT_A_RECORD = json.dumps({"complete": True, "score": 0.93}).encode()
FOREIGN = "is a folder of other files ({n} entries), not a clbench run folder"


def _mark_link(t, made, m, needle):
    folder = t / "theirs"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    genuine = t / "genuine"
    genuine.mkdir()
    mark_folder(genuine, "run")
    (folder / FOLDER_MARK).symlink_to(genuine / FOLDER_MARK)  # a link to a real mark elsewhere says nothing here
    return Case(run_argv(made["data"], folder), needle)


def _mark_forged_content(t, made, m, needle):
    folder = t / "theirs"
    folder.mkdir()
    (folder / FOLDER_MARK).write_text('{"format": "clbench-folder", "kind": "everything"}')
    (folder / "notes.txt").write_text("mine\n")
    return Case(run_argv(made["data"], folder), needle)


def _run_out_report_folder(t, made, m, needle):
    folder = t / "rep"
    assert main(["report", str(made["run"]), "--out", str(folder), "--no-tsne"]) == 0
    return Case(run_argv(made["data"], folder), needle)


def _run_out_clbench_copy(t, made, m, needle):
    folder = copy_run(made, t)  # its lock is made again: the folder is the run's own
    return Case(run_argv(made["data"], folder), needle, owned=(folder,))


def _run_out_committed(t, made, m, needle):
    """A committed run folder (no mark: told by its record), copied: recognised, refused only as finished."""
    folder = t / "committed"
    shutil.copytree(REPO / "reports/emoji/runs/fp32/tosca-l1-0", folder)
    return Case(run_argv(made["data"], folder), needle, owned=(folder,))  # its lock is made: the run's own folder


def _run_out_overwrite_own(t, made, m, needle):
    folder = copy_run(made, t)
    return Case(run_argv(made["data"], folder) + ["--overwrite"], needle, 0, (folder,), "out")


RUN_FOLDER_CASES = {
    "run-out-foreign-lock": (_run_out((".lock", b""), *THEIRS), FOREIGN.format(n=3)),
    "run-out-foreign-lock-overwrite": (
        _run_out(
            (".lock", b"pid 12\n"),
            ("result.json", NOT_A_RECORD),
            ("checkpoint.safetensors", b"x"),
            *THEIRS,
            overwrite=True,
        ),
        FOREIGN.format(n=5),
    ),
    "run-out-foreign-attempt": (_run_out(("attempt.json", GRADER_ATTEMPT), *THEIRS), FOREIGN.format(n=3)),
    "run-out-attempt-not-json": (_run_out(("attempt.json", b"started\n"), *THEIRS), FOREIGN.format(n=3)),
    "run-out-result-not-a-record": (_run_out(("result.json", NOT_A_RECORD), *THEIRS), FOREIGN.format(n=3)),
    "run-out-result-torn": (_run_out(("result.json", b'{"schema_version": 4, "comp'), *THEIRS), FOREIGN.format(n=3)),
    "run-out-result-bool-version": (
        _run_out(("result.json", b'{"schema_version": true, "complete": true}'), *THEIRS, overwrite=True),
        FOREIGN.format(n=3),
    ),
    "run-out-mark-is-a-link": (_mark_link, FOREIGN.format(n=2)),
    "run-out-mark-forged-kind": (_mark_forged_content, FOREIGN.format(n=2)),
    "run-out-report-folder": (_run_out_report_folder, "is a clbench report folder, not a run folder"),
    "run-out-clbench-run-folder": (_run_out_clbench_copy, "already holds a finished run"),
    "run-out-committed-run-folder": (_run_out_committed, "already holds a finished run"),
    "run-out-own-folder-overwrite": (_run_out_overwrite_own, "final"),
}


# ----------------------------------------------------------------------------------------------- item 5: --out rule
def _foreign_out(command):
    """``clbench COMMAND ... --out F`` where F is a folder of the user's (a README.md, a summary.csv)."""

    def case(t, made, m, needle):
        folder = t / "mine"
        folder.mkdir()
        (folder / "README.md").write_text("# my project\n")
        (folder / "summary.csv").write_text("a,b\n1,2\n")
        argv = {
            "report": ["report", str(made["run"]), "--out", str(folder), "--no-tsne"],
            "compare": ["compare", str(made["run"]), "--bench", "folder", "--out", str(folder)],
            "sweep": sweep_argv(made["data"], folder),
            "sweep-dry-run": sweep_argv(made["data"], folder, "--dry-run"),
            "routing-study": ["routing-study", str(REPO / "reports/routing/emoji/tosca-l1-0"), "--out", str(folder)],
        }[command]
        return Case(argv, needle)

    return case


def _report_into_run_folder(t, made, m, needle):
    folder = copy_run(made, t)
    return Case(["report", str(folder), "--out", str(folder), "--no-tsne"], needle)


def _report_committed(t, made, m, needle):
    """A committed report folder (no mark: told by its report.json), copied: a report is written into it again."""
    out = t / "emoji"
    shutil.copytree(REPO / "reports/emoji", out, ignore=shutil.ignore_patterns("runs", "figures"))
    return Case(["report", str(made["run"]), "--out", str(out), "--no-tsne"], needle, 0, (out,), "out")


def _tracker_link(command, tracker, folder_name):
    """``--log TRACKER --log-dir L`` (or ``export --to``) where ``L/FOLDER`` is a link to someone else's folder."""

    def case(t, made, m, needle):
        m.delenv("MLFLOW_TRACKING_URI", raising=False)
        logs = t / "logs"
        logs.mkdir()
        (logs / folder_name).symlink_to(victim_folder(t, "events.out", "meta.yaml"))
        if command == "export":
            argv = ["export", str(copy_run(made, t)), "--to", tracker, "--log-dir", str(logs)]
        else:
            argv = run_argv(made["data"], t / "run") + ["--log", tracker, "--log-dir", str(logs)]
        return Case(argv, needle)

    return case


def _mlruns_link_in_cwd(t, made, m, needle):
    """An mlruns/ link in the working folder: MLflow's store is the run folder's, never the working folder's, so the
    run neither follows the link nor writes beside it."""
    m.delenv("MLFLOW_TRACKING_URI", raising=False)
    cwd = t / "cwd"
    cwd.mkdir()
    (cwd / "mlruns").symlink_to(victim_folder(t, "meta.yaml"))
    m.chdir(cwd)
    return Case(run_argv(made["data"], t / "run") + ["--log", "mlflow"], needle, 0, (t / "run",), "out")


def _run_folder_tensorboard_link(t, made, m, needle):
    """A run folder whose tensorboard/ is a link: the tracker is dropped (a tracker never fails a run) and writes
    nothing through it."""
    run = t / "run"
    run.mkdir()
    mark_folder(run, "run")
    (run / "tensorboard").symlink_to(victim_folder(t, "events.out"))
    return Case(run_argv(made["data"], run) + ["--log", "tensorboard"], needle, 0, (run,), "err")


OUT_CASES = {
    "report-out-foreign": (_foreign_out("report"), "is a folder of other files (2 entries), not a clbench report"),
    "compare-out-foreign": (_foreign_out("compare"), "is a folder of other files (2 entries), not a clbench report"),
    "sweep-out-foreign": (_foreign_out("sweep"), "is a folder of other files (2 entries), not a clbench sweep folder"),
    "sweep-dry-run-out-foreign": (_foreign_out("sweep-dry-run"), "not a clbench sweep folder"),
    "routing-study-out-foreign": (_foreign_out("routing-study"), "(2 entries), not a clbench report folder"),
    "report-out-is-a-run-folder": (_report_into_run_folder, "is a clbench run folder, not a report folder"),
    "report-out-committed-report": (_report_committed, "report: 1 runs"),
    "run-log-dir-tensorboard-link": (_tracker_link("run", "tensorboard", "tensorboard"), "tensorboard/ is a symbolic"),
    "run-log-dir-mlruns-link": (_tracker_link("run", "mlflow", "mlruns"), "mlruns/ is a symbolic link"),
    "run-log-dir-wandb-link": (_tracker_link("run", "wandb", "wandb"), "wandb/ is a symbolic link"),
    "export-tensorboard-link": (_tracker_link("export", "tensorboard", "tensorboard"), "tensorboard/ is a symbolic"),
    "export-mlruns-link": (_tracker_link("export", "mlflow", "mlruns"), "mlruns/ is a symbolic link"),
    "run-mlruns-link-in-cwd": (_mlruns_link_in_cwd, "/run/mlruns.db"),
    "run-log-dir-mlflow-database-link": (
        _tracker_link("run", "mlflow", "mlruns.db"),
        "is not a file clbench can use as MLflow's database",
    ),
    "run-folder-tensorboard-link": (_run_folder_tensorboard_link, "warning: tracker tensorboard failed at start"),
}

CASES = {**GROUP_CASES, **EXPORT_CASES, **SWEEP_FOLDER_CASES, **RUN_FOLDER_CASES, **OUT_CASES}


@pytest.mark.parametrize("name", list(CASES))
def test_no_write_outside_what_the_user_gave(name, made, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLBENCH_CACHE", str(made["cache"]))
    make, needle = CASES[name]
    case = make(tmp_path, made, monkeypatch, needle)
    needle = case.needle or needle
    capsys.readouterr()  # what building the case printed
    guarded = [tmp_path, made["run"], made["cache"]]
    before = tree(guarded, case.owned)
    code, out, err = run_cli(case.argv, capsys)
    assert_outcome(code, out, err, case.code, needle, case.stream, flat=True)
    assert tree(guarded, case.owned) == before, name  # every file outside the owned folders byte-identical


def test_the_tables_cover_every_item():
    assert len(GROUP_CASES) >= 8 and len(EXPORT_CASES) >= 6 and len(SWEEP_FOLDER_CASES) >= 6
    assert len(RUN_FOLDER_CASES) >= 10 and len(OUT_CASES) >= 10


# ----------------------------------------------------------------------------------------------- recognition
COMMITTED_RUNS = sorted({p.parent for p in REPO.glob("reports/**/runs/**/result.json")})


def test_every_committed_run_folder_is_a_run_folder():
    """The committed run folders carry no mark (made before it): their records say they are clbench's. Checking them
    writes nothing."""
    from clbench.run.rundir import check_run_folder, is_run_folder

    assert len(COMMITTED_RUNS) >= 80
    before = tree([REPO / "reports"])
    for folder in COMMITTED_RUNS:
        assert is_run_folder(folder), folder
        check_run_folder(folder)
    assert tree([REPO / "reports"]) == before


def test_committed_sweep_and_report_folders_are_recognised():
    from clbench.report.build import is_report_folder
    from clbench.sweep.runner import check_sweep_folder, is_sweep_folder

    before = tree([REPO / "reports"])
    assert is_sweep_folder(REPO / "reports/sweep-emoji")
    check_sweep_folder(REPO / "reports/sweep-emoji")  # its report/ too
    for folder in ("emoji", "routing", "sweep-emoji/report"):
        assert is_report_folder(REPO / "reports" / folder), folder
    assert not is_report_folder(REPO / "reports/gate") and not is_sweep_folder(REPO / "reports/emoji")
    assert tree([REPO / "reports"]) == before


def test_a_sweep_workers_folder_is_checked_before_it_writes(made, tmp_path):
    """A run folder planted after the plan was checked: the worker refuses it (a user error, not retried) before it
    writes its attempt file or its log there."""
    import dataclasses

    from clbench.sweep import SweepSpec, execute, make_plan

    spec = SweepSpec(("simplecil",), ("folder",), (1993,), tmp_path / "sweep", data_roots={None: str(made["data"])})
    (run,) = make_plan(spec)
    run.path.mkdir(parents=True)
    (run.path / "predictions.npz").write_bytes(b"theirs")
    before = tree([tmp_path])
    payload = {
        "run_id": run.run_id,
        "config": json.loads(json.dumps(dataclasses.asdict(run.cfg))),
        "fingerprint": run.fingerprint.to_json(),
        "env": {"CLBENCH_CACHE": str(made["cache"])},
        "threads": 1,
        "sweep_id": "test",
        "log": None,
    }
    outcome = execute(payload)
    assert outcome["status"] == "failed" and "is a folder of other files (1 entries)" in outcome["error"], outcome
    assert tree([tmp_path]) == before


def test_a_report_link_planted_during_the_sweep_is_refused_at_its_end(tmp_path):
    """The summary's last check: a report/ link planted while the sweep ran is refused before summary.md is
    rewritten, and nothing is written through it."""
    from clbench.errors import ClbenchError
    from clbench.sweep.manifest import load_manifest
    from clbench.sweep.summary import write_summary

    out = tmp_path / "sweep-emoji"
    shutil.copytree(REPO / "reports/sweep-emoji", out, ignore=shutil.ignore_patterns("report"))
    (out / "report").symlink_to(victim_folder(tmp_path, "README.md"))
    before = tree([tmp_path])
    with pytest.raises(ClbenchError, match="report/ is a symbolic link"):
        write_summary(out, load_manifest(out / "sweep.json"), True, False, None)
    assert tree([tmp_path]) == before


@pytest.mark.parametrize(
    "name, problem",
    [
        ("quick", None),
        ("tosca-emoji-s1993", None),
        ("ünïcode name", None),
        ("..", "names no folder"),
        (".", "names no folder"),
        ("a/..", "path separator"),
        ("C:\\x", "path separator"),
        ("", "empty"),
        ("x\x00y", "control character"),
        ("x\u202ey", "control character"),  # a bidi override hides what the name says
        ("é" * 128, "longer than 255 bytes"),
        (7, "int, not a name"),
    ],
)
def test_folder_names(name, problem):
    from clbench.files.safety import folder_name_problem

    got = folder_name_problem(name)
    assert (got is None) if problem is None else (problem in (got or "")), got


# ----------------------------------------------------------------------------------------------- item 13: export
def _records(made, t: Path, n: int) -> Path:
    for i in range(n):
        copy_run(made, t, f"r{i}", edit=lambda rec, i=i: rec.update(run_id=f"r{i}"))
    return t / "runs"


def test_an_export_to_a_hung_tracker_waits_one_deadline_not_one_per_record(made, tmp_path, monkeypatch, capsys):
    """A tracker whose first call never returns: the export waits for it once (its deadline), drops it, and sends
    the other records to no tracker, without making it (or connecting) again. Counted, not timed."""
    from clbench.run import trackers

    made_adapters, started = [], []
    release = threading.Event()

    class Hung:
        def __init__(self, spec):
            made_adapters.append(spec)

        def start(self, run):
            started.append(run.run_id)
            release.wait()

    monkeypatch.setitem(trackers.ADAPTERS, "tensorboard", Hung)
    monkeypatch.setattr(trackers, "FINISH_TIMEOUT_S", 0.2)
    runs = _records(made, tmp_path, 4)
    try:
        code = main(["export", str(runs), "--to", "tensorboard", "--log-dir", str(tmp_path / "logs")])
    finally:
        release.set()
    cap = capsys.readouterr()
    assert code == 1, cap.err
    assert len(made_adapters) == 1 and started == ["r0"], (made_adapters, started)
    warnings = [line for line in cap.err.splitlines() if "warning:" in line]
    assert warnings == [
        "clbench: warning: r0: tensorboard: did not finish within 0.2 s (its data may be incomplete); the run went on "
        "without it"
    ], cap.err
    assert cap.out.count("exported ") == 4 and cap.out.count("to no tracker") == 4, cap.out


def test_an_export_to_an_mlflow_server_that_refuses_connects_once(made, tmp_path, monkeypatch, capsys):
    """MLflow at a port nothing listens on (its own retries off): one client, one failed start, the tracker dropped;
    the other records are not tried. Connections counted, not timed."""
    port = _free_port()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    attempts = []
    connect = socket.socket.connect

    def counted(self, address):
        if isinstance(address, tuple) and address[1:2] == (port,):
            attempts.append(address)
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", counted)
    runs = _records(made, tmp_path, 2)
    monkeypatch.chdir(tmp_path)
    code = main(["export", str(runs), "--to", "mlflow", "--log-dir", str(tmp_path / "logs")])
    cap = capsys.readouterr()
    assert code == 1, cap.err
    warnings = [line for line in cap.err.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "r0: mlflow: failed at start" in warnings[0], cap.err
    assert 1 <= len(attempts) <= 2, attempts  # the first record's first request (urllib3 may try IPv4 twice), no more
    assert cap.out.count("to no tracker") == 2, cap.out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------- item 15: the tests
CLOCKS = {"monotonic", "perf_counter", "time"}  # time.monotonic(), time.perf_counter(), time.time(): the wall-clock
SHARED = {"cache_root"}  # the fixture naming the test cache every xdist worker writes


def _clock_calls(node: ast.AST) -> list[str]:
    return [
        n.func.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in CLOCKS
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "time"
    ]


def _findings(path: Path) -> list[str]:
    """Asserts that read the wall-clock (directly, or through a name assigned from it in the same function), and
    whole-folder snapshots (``digests``, ``snapshot``, ``tree``, ``rglob``) of the shared test cache."""
    found = []
    mod = ast.parse(path.read_text())
    for fn in [n for n in ast.walk(mod) if isinstance(n, ast.FunctionDef)]:
        timed = {
            t.id
            for n in ast.walk(fn)
            if isinstance(n, ast.Assign) and _clock_calls(n.value)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for n in ast.walk(fn):
            if isinstance(n, ast.Assert):
                names = {m.id for m in ast.walk(n.test) if isinstance(m, ast.Name)}
                if "deadline" in names:  # a hang guard: gives up after a generous time, measures nothing
                    continue
                if _clock_calls(n.test) or names & timed:
                    found.append(f"{path.name}:{n.lineno}: {fn.name} asserts on the wall-clock")
            if isinstance(n, ast.Call):
                callee = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                args = [a for a in n.args if isinstance(a, ast.Name)]
                target = n.func.value if isinstance(n.func, ast.Attribute) else None
                if callee in {"digests", "snapshot", "tree"} and any(a.id in SHARED for a in args):
                    found.append(f"{path.name}:{n.lineno}: {fn.name} snapshots the shared test cache")
                if callee == "rglob" and isinstance(target, ast.Name) and target.id in SHARED:
                    found.append(f"{path.name}:{n.lineno}: {fn.name} snapshots the shared test cache")
    return found


def test_the_finder_finds_what_it_looks_for(tmp_path):
    bad = tmp_path / "test_bad.py"
    bad.write_text(
        "import time\n"
        "def test_a(cache_root):\n"
        "    t0 = time.monotonic()\n"
        "    before = digests(cache_root)\n"
        "    assert time.monotonic() - t0 < 10\n"
        "def test_b():\n"
        "    t0 = time.perf_counter()\n"
        "    elapsed = time.perf_counter() - t0\n"
        "    assert elapsed < 5\n"
        "def test_c():\n"
        "    deadline = time.monotonic() + 60\n"
        "    while time.monotonic() < deadline:\n"
        "        assert time.monotonic() < deadline, 'hung'\n"
        "    t0 = time.process_time()\n"
        "    assert time.process_time() - t0 < 5\n"
    )
    assert [f.split(": ", 1)[1] for f in _findings(bad)] == [
        "test_a asserts on the wall-clock",
        "test_a snapshots the shared test cache",
        "test_b asserts on the wall-clock",
    ]


def test_no_test_asserts_on_the_wall_clock_or_snapshots_the_shared_cache():
    """Item 15: a busy machine (other work beside the tests) stretches every wall-clock measure, and the other xdist
    worker writes the shared test cache (temporaries, new entries) at any moment: no assert may read either. Hang
    guards (a ``deadline`` a loop gives up at) are not asserts on a measured time; CPU time (``time.process_time``)
    is this process's own."""
    files = sorted((REPO / "tests").glob("test_*.py"))
    assert len(files) > 40
    assert [f for p in files for f in _findings(p)] == []
