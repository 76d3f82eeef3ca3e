"""Reports, comparisons and the regression gate, from the record fixtures in tests/fixtures/records.

The fixtures are real run records (see tests/fixtures/records/README.md): SimpleCIL and TOSCA on the micro ViT
(seeds 1993-1995, TOSCA with both protocols and one reference-only run), SimpleCIL on the offline DINOv2 ViT-S/14,
and four folders that must be skipped (incomplete, torn JSON, old schema, no record).

Regenerate the golden tables after an intended change with ``CLBENCH_UPDATE_GOLDEN=1 pytest tests/test_report.py``
and review the diff.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from clbench.errors import ClbenchError
from clbench.gate import check as chk
from clbench.gate.commands import COMMANDS as GATE_COMMANDS
from clbench.report.collect import collect
from clbench.report.commands import COMMANDS as REPORT_COMMANDS
from clbench.report.tables import markdown_tables, runs_table, skipped_table, summary_frame, summary_table, to_markdown

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path("tests/fixtures/records")  # relative: paths in the tables are shown as given
GOLDEN = REPO / "tests" / "golden" / "report_tables.md"
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (Debian: apt-get install chromium); the headless-browser checks need it",
)
MICRO_RUNS = ["sc-s1993", "sc-s1994", "sc-s1995", "tosca-s1993", "tosca-s1994", "tosca-ref-s1995"]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def cli(*argv: str) -> int:
    """Run one of the report commands or ``check`` the way the CLI will (argparse + the command function)."""
    parser = argparse.ArgumentParser(prog="clbench")
    sub = parser.add_subparsers()
    for name, (_, add_args, func) in {**REPORT_COMMANDS, **GATE_COMMANDS}.items():
        p = sub.add_parser(name)
        add_args(p)
        p.set_defaults(func=func)
    args = parser.parse_args(list(argv))
    return args.func(args)


def copy_runs(dest: Path, names=MICRO_RUNS, mutate=None) -> Path:
    """Copy fixture runs into ``dest/<name>``; ``mutate[name](record)`` edits a record in place."""
    dest.mkdir(parents=True, exist_ok=True)
    for folder in REPO.joinpath(FIXTURES).glob("*/*"):
        if folder.name in names:
            shutil.copytree(folder, dest / folder.name)
            if mutate and folder.name in mutate:
                path = dest / folder.name / "result.json"
                rec = json.loads(path.read_text())
                mutate[folder.name](rec)
                path.write_text(json.dumps(rec))
    return dest


def shift_accuracy(delta: float):
    """A record edit: every accuracy of every protocol moves by ``delta`` points (kept within 0..100 %, which a
    record must hold)."""

    def move(a: float) -> float:
        return min(100.0, max(0.0, a + delta))

    def edit(rec):
        for summary in [rec, *rec.get("protocols", {}).values()]:
            summary["accuracy_matrix"] = [[move(a) for a in row] for row in summary["accuracy_matrix"]]
            summary["acc_curve"] = [move(a) for a in summary["acc_curve"]]
            summary["last_acc"] = move(summary["last_acc"])
            summary["avg_acc"] = move(summary["avg_acc"])

    return edit


# ------------------------------------------------------------------------------------------- tables
@pytest.mark.pins_numbers  # tables of committed records: the same on every CPU
def test_markdown_tables_match_golden():
    text = markdown_tables(collect([FIXTURES]))
    if os.environ.get("CLBENCH_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), "no golden file: run with CLBENCH_UPDATE_GOLDEN=1 once and review it"
    assert text == GOLDEN.read_text(), "report tables changed; if intended, regenerate with CLBENCH_UPDATE_GOLDEN=1"


def _row(df, **match):
    sel = df
    for k, v in match.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, f"expected one row for {match}, got {len(sel)}"
    return sel.iloc[0]


def test_backbones_and_protocols_are_separate_rows():
    coll = collect([FIXTURES])
    df = summary_frame(coll)
    micro = _row(df, strategy="simplecil", backbone="vit_micro 32px bf16")
    dino = _row(df, strategy="simplecil", backbone="vit_small_patch14_dinov2 224px bf16")
    assert (micro["n"], dino["n"]) == (3, 1)
    lasts = [r.record.last_acc for r in coll.runs if r.strategy == "simplecil" and r.record.backbone == "vit_micro"]
    assert micro["last_acc_mean"] == pytest.approx(sum(lasts) / 3)
    assert dino["last_acc_mean"] == pytest.approx(23.35456475583864)  # the DINOv2 run alone
    per_sample = _row(df, strategy="tosca", protocol="per-sample")
    reference = _row(df, strategy="tosca", protocol="reference")
    assert per_sample["runs"] == ["tosca-s1993", "tosca-s1994"]
    assert reference["runs"] == ["tosca-s1993", "tosca-s1994", "tosca-ref-s1995"]  # the reference-only run joins here
    ref_lasts = [r.record.summary("reference").last_acc for r in coll.runs if r.strategy == "tosca"]
    assert reference["last_acc_mean"] == pytest.approx(sum(ref_lasts) / 3)


def test_runs_at_another_precision_are_not_averaged(tmp_path):
    def fp32(rec):
        assert rec["precision"] == "bf16"  # these micro-ViT records were made with bf16 autocast
        rec["precision"] = "fp32"

    runs = copy_runs(tmp_path / "runs", ["sc-s1993", "sc-s1994"], {"sc-s1994": fp32})
    df = summary_frame(collect([runs]))
    assert sorted(df["backbone"]) == ["vit_micro 32px bf16", "vit_micro 32px fp32"]
    assert sorted(df["n"]) == [1, 1]


def test_different_settings_of_one_strategy_are_not_averaged(tmp_path):
    def more_epochs(rec):
        rec["strategy_config"]["epochs"] = 5

    runs = copy_runs(tmp_path / "runs", ["tosca-s1993", "tosca-s1994"], {"tosca-s1994": more_epochs})
    df = summary_frame(collect([runs]))
    assert len(df) == 4  # 2 configurations x 2 protocols
    assert sorted(df["n"]) == [1, 1, 1, 1]
    assert sorted(set(df["strategy"])) == ["tosca", "tosca epochs=5"]  # named by the setting that differs


def test_a_repeated_seed_counts_once_and_is_named(tmp_path):
    def later(rec):
        rec["run_id"], rec["created"] = "sc-again", "2099-01-01T00:00:00+00:00"

    first = copy_runs(tmp_path / "a", ["sc-s1993", "sc-s1994"])
    again = copy_runs(tmp_path / "b", ["sc-s1993"], {"sc-s1993": later})
    coll = collect([first, again])
    assert {r.run_id: r.repeat_of for r in coll.runs}["sc-s1993"] == "sc-again"  # the newest of one seed is kept
    df = summary_frame(coll)
    assert list(df["n"]) == [2]  # seeds 1993 and 1994, not 1993 twice
    assert any("sc-s1993 repeats seed 1993" in n and "from sc-again" in n for n in coll.notes)


def test_skipped_runs_are_listed_and_not_averaged():
    coll = collect([FIXTURES])
    reasons = {Path(s.path).name: s.reason for s in coll.skipped}
    assert set(reasons) == {"tosca-incomplete", "garbage", "old-schema", "crashed-early"}
    assert "not complete" in reasons["tosca-incomplete"]
    assert "not a readable JSON" in reasons["garbage"]
    assert "schema version 0" in reasons["old-schema"]
    assert "no result.json" in reasons["crashed-early"]
    ids = {r.run_id for r in coll.runs}
    assert not ids & {"tosca-incomplete", "garbage", "old-schema"}
    assert _row(summary_frame(coll), strategy="tosca", protocol="per-sample")["n"] == 2
    md = markdown_tables(coll)
    skipped = md.split("## Skipped", 1)[1]
    for name in reasons:
        assert name in skipped


def test_run_folder_given_directly_and_missing_paths():
    coll = collect([FIXTURES / "broken" / "garbage", FIXTURES / "simplecil" / "sc-s1994"])
    assert [r.run_id for r in coll.runs] == ["sc-s1994"]
    assert len(coll.skipped) == 1 and "not a readable JSON record" in coll.skipped[0].reason
    with pytest.raises(ClbenchError, match="no such file"):
        collect([FIXTURES / "does-not-exist"])


def test_report_refuses_when_nothing_is_complete(tmp_path):
    with pytest.raises(ClbenchError, match="no complete run record"):
        cli("report", str(FIXTURES / "broken"), "--out", str(tmp_path / "r"))


# ------------------------------------------------------------------------------------------- the page
# t-SNE of 100 test images, not the default 1,000: the page's figures and their byte-identical regeneration are the
# point here, and each 1,000-point embedding costs seconds
TSNE_POINTS = ("--tsne-points", "100")


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    old = Path.cwd()
    os.chdir(REPO)
    try:
        assert cli("report", str(FIXTURES), "--out", str(out), *TSNE_POINTS) == 0
    finally:
        os.chdir(old)
    return out


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.srcs: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.srcs.append(a["src"])
        if tag == "a" and a.get("href", "").startswith("figures/"):
            self.links.append(a["href"])


def test_every_image_of_the_page_exists(report_dir):
    parser = _Images()
    parser.feed((report_dir / "index.html").read_text())
    assert len(parser.srcs) >= 6  # curves, matrices, params, wall-clock, routing, t-SNE
    for src in parser.srcs + parser.links:
        assert not src.startswith(("http:", "https:", "//")), "the page must work offline"
        path = report_dir / src
        assert path.is_file(), f"{src} is referenced by index.html but missing"
        if src.endswith(".png"):
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any("figures/tsne_" in s for s in parser.srcs)  # frozen and TOSCA's adapted features from features.npz


def test_readme_has_the_tables_and_existing_figures(report_dir):
    readme = (report_dir / "README.md").read_text()
    coll = collect([FIXTURES])
    for table in (summary_table(coll), runs_table(coll), skipped_table(coll)):
        assert to_markdown(table) in readme

    for src in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme):
        assert (report_dir / src).is_file(), src


def test_figure_captions_name_their_runs(report_dir):
    manifest = json.loads((report_dir / "report.json").read_text())
    assert manifest["figures"]
    for fig in manifest["figures"]:
        assert fig["runs"]
        for rid in fig["runs"]:
            assert rid in fig["caption"]
        assert "Git:" in fig["caption"] and "Backbone weights:" in fig["caption"]
    assert {s["path"].split("/")[-1] for s in manifest["skipped"]} == {
        "tosca-incomplete",
        "garbage",
        "old-schema",
        "crashed-early",
    }


@pytest.mark.pins_numbers  # the same records give the same bytes: figures, tables, page and report.json
def test_a_report_regenerates_byte_identically_but_for_its_stamp(report_dir, tmp_path):
    again = tmp_path / "again"
    assert cli("report", str(FIXTURES), "--out", str(again), *TSNE_POINTS) == 0
    files = sorted(p.relative_to(report_dir) for p in report_dir.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for rel in files:
        first, second = (report_dir / rel).read_bytes(), (again / rel).read_bytes()
        # the stamp names the output folder (the command); nothing else may differ
        assert first.replace(str(report_dir).encode(), b"OUT") == second.replace(str(again).encode(), b"OUT"), rel


def test_rewriting_a_report_removes_its_stale_figures(tmp_path):
    runs = copy_runs(tmp_path / "runs", ["sc-s1993", "tosca-s1993"])
    out = tmp_path / "r"
    assert cli("report", str(runs), "--out", str(out), "--tsne-points", "60") == 0
    assert [p.name for p in (out / "figures").glob("tsne_*.png")]
    (out / "figures" / "mine.png").write_bytes(b"not ours")
    assert cli("report", str(runs), "--out", str(out), "--no-tsne") == 0
    assert not list((out / "figures").glob("tsne_*"))
    assert (out / "figures" / "mine.png").exists()  # a file the report did not write stays
    assert "t-SNE figures were not made" in (out / "README.md").read_text()


def _chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'chromium-profile'}", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
    )


class _Body(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.attrs: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        if tag == "body":
            self.attrs = {k: v or "" for k, v in attrs}


def _body_attrs(dom: str) -> dict[str, str]:
    parser = _Body()
    parser.feed(dom)
    return parser.attrs


@needs_chromium
def test_chromium_screenshot_is_not_blank(report_dir, tmp_path):
    import numpy as np
    from PIL import Image

    shot = tmp_path / "shot.png"
    _chromium(f"--screenshot={shot}", "--window-size=1400,3000", (report_dir / "index.html").as_uri(), tmp=tmp_path)
    assert shot.is_file(), "chromium wrote no screenshot"
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float32)
    assert pixels.shape == (3000, 1400)
    assert (pixels < 200).mean() > 0.02, "the screenshot is (nearly) blank"
    assert pixels.std() > 10


@needs_chromium
def test_chromium_loads_every_image(report_dir, tmp_path):
    res = _chromium("--dump-dom", "--virtual-time-budget=5000", (report_dir / "index.html").as_uri(), tmp=tmp_path)
    attrs = _body_attrs(res.stdout)
    assert int(attrs.get("data-image-count", "0")) >= 6, f"the page's image check did not run: {attrs}"
    assert attrs["data-broken-images"] == "0", f"images failed to load: {attrs.get('data-broken-sources')}"


@needs_chromium
def test_chromium_image_check_catches_a_missing_figure(report_dir, tmp_path):
    broken = tmp_path / "broken-report"
    shutil.copytree(report_dir, broken)
    (broken / "figures" / "routing.png").unlink()
    res = _chromium("--dump-dom", "--virtual-time-budget=5000", (broken / "index.html").as_uri(), tmp=tmp_path)
    attrs = _body_attrs(res.stdout)
    assert attrs["data-broken-images"] == "1"
    assert attrs["data-broken-sources"] == "figures/routing.png"


# ------------------------------------------------------------------------------------------- compare
def test_accuracy_matrices_are_split_into_figures_of_at_most_matrix_panels(tmp_path, monkeypatch):
    """One figure of 63 heatmaps ran out of 24 GB: the matrices of a benchmark come as figures of at most
    MATRIX_PANELS panels (here 2), named accuracy_matrix_<bench>, _2, ..., together showing every run."""
    from clbench.report.figure_base import slug
    from clbench.report.figures import matrices

    coll = collect([FIXTURES])
    bench = coll.benches()[0]  # "emoji B0 Inc6"
    keys = [k for k in coll.acc_groups() if k.bench == bench]
    assert len(keys) >= 3  # enough row keys for more than one page of 2
    monkeypatch.setattr(matrices, "MATRIX_PANELS", 2)
    out = matrices.accuracy_matrices(coll, tmp_path)
    pages, name = -(-len(keys) // 2), "accuracy_matrix_" + slug(bench)
    assert [f.name for f in out] == [name] + [f"{name}_{i}" for i in range(2, pages + 1)]
    assert all(f"({i} of {pages})" in f.title for i, f in enumerate(out, start=1))
    shown = {run for f in out for run in f.runs}
    assert shown == {r.run_id for k in keys for r in coll.acc_groups()[k]}  # every run is shown
    assert all((tmp_path / path).is_file() for f in out for path in f.files.values())


def test_compare_writes_one_figure_and_the_bench_rows(tmp_path):
    out = tmp_path / "cmp"
    assert cli("compare", str(FIXTURES), "--bench", "emoji", "--out", str(out)) == 0
    md = (out / "compare.md").read_text()
    assert (out / "figures" / "compare_emoji.png").is_file() and (out / "figures" / "compare_emoji.svg").is_file()
    assert "| 13.23 | 21.04 | none: no per-image predictions in its records" in md  # SimpleCIL micro: no interval
    assert "| 0.34 |" in md  # its standard deviation over seeds
    assert "tosca-ref-s1995" in md
    assert r"\toprule" in (out / "compare.tex").read_text()
    assert len((out / "compare.csv").read_text().splitlines()) == 1 + 4
    with pytest.raises(ClbenchError, match="cifar"):
        cli("compare", str(FIXTURES), "--bench", "cifar", "--out", str(out))


# ------------------------------------------------------------------------------------------- check
# The shipped gate (reports/reference-emoji.json and its planted bugs) is tested in tests/test_gate.py; these tests
# run the command itself on the micro fixtures: writing, reading, and the rules in both directions.
CALIBRATION = {
    "format": "clbench-calibration/1",
    "measurements": [
        {"workload": "vit-s14-random-56px-b64-fp32-forward/1", "seconds": 0.25, "host": {"torch_threads": 2}}
    ],
}


def runs_with_calibration(dest: Path, **kwargs) -> Path:
    runs = copy_runs(dest, **kwargs)
    (runs / chk.CALIBRATION_FILE).write_text(json.dumps(CALIBRATION))
    return runs


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """A reference written from the micro fixture runs, as CI's would be."""
    path = tmp_path_factory.mktemp("ref") / "reference.json"
    runs = runs_with_calibration(tmp_path_factory.mktemp("runs") / "runs")
    assert (
        cli(
            "check",
            "--write-reference",
            str(path),
            "--description",
            "test",
            "--why",
            "fixture reference",
            "--who",
            "tests",
            "--no-require-ci-profiles",
            str(runs),
        )
        == 0
    )
    return path


def test_written_reference_records_its_runs_and_why(reference):
    ref = json.loads(reference.read_text())
    assert ref["format"] == chk.REFERENCE_FORMAT
    assert ref["written_by"]["why"] == "fixture reference" and ref["written_by"]["who"] == "tests"
    assert ref["written_by"]["command"] and ref["written_by"]["git_revision"]
    assert sorted(p["run_id"] for p in ref["produced_by"]) == sorted(MICRO_RUNS)
    assert all(p["command"].startswith("clbench run") and p["git_revision"] for p in ref["produced_by"])
    keys = sorted((e["strategy"], e["protocol"]) for e in ref["entries"])
    assert keys == [("simplecil", "per-sample"), ("tosca", "per-sample"), ("tosca", "reference")]
    tosca = next(e for e in ref["entries"] if e["strategy"] == "tosca" and e["protocol"] == "per-sample")
    assert tosca["params"] == {"added_total": 9625, "stored_total": 0, "trainable": 3525}  # head rows are learned
    assert tosca["precision"] == "bf16"  # the fixtures predate `precision`: autocast true
    assert len(tosca["accuracy_matrix"]) == 6 and [len(r) for r in tosca["accuracy_matrix"]] == [1, 2, 3, 4, 5, 6]
    times = [
        json.loads((REPO / FIXTURES / "tosca" / n / "result.json").read_text())["time_s"]["train"]
        for n in ("tosca-s1993", "tosca-s1994")
    ]
    assert tosca["time"]["train"] == pytest.approx(sum(times) / 2 / 0.25, abs=1e-3)  # seconds / calibration


def test_check_passes_on_the_same_runs(reference, tmp_path, capsys):
    assert cli("check", "--reference", str(reference), str(runs_with_calibration(tmp_path / "runs"))) == 0
    assert "check passed" in capsys.readouterr().out


def test_check_fails_on_a_better_run_as_changed(reference, tmp_path, capsys):
    runs = runs_with_calibration(tmp_path / "runs", mutate={"tosca-s1993": shift_accuracy(+10.0)})
    assert cli("check", "--reference", str(reference), str(runs)) == 1
    out = capsys.readouterr().out
    assert "changed" in out and "a gain is a change too" in out and "FAIL" not in out


def test_check_tolerates_a_drop_within_the_stored_tolerance(reference, tmp_path):
    tol = min(json.loads(reference.read_text())["entries"][1]["tolerance"].values())
    runs = runs_with_calibration(tmp_path / "runs", mutate={"tosca-s1993": shift_accuracy(-1.9 * tol)})  # mean: -0.95
    assert cli("check", "--reference", str(reference), str(runs)) == 0


def test_check_fails_on_a_drop_beyond_the_stored_tolerance(reference, tmp_path, capsys):
    tol = max(json.loads(reference.read_text())["entries"][1]["tolerance"].values())
    runs = runs_with_calibration(tmp_path / "runs", mutate={"tosca-s1993": shift_accuracy(-2.2 * tol)})  # mean -1.1
    assert cli("check", "--reference", str(reference), str(runs)) == 1
    out = capsys.readouterr().out
    assert "check failed" in out and "final acc" in out and "accuracy matrix" in out and "tosca" in out


def test_check_fails_on_a_missing_strategy(reference, tmp_path, capsys):
    runs = runs_with_calibration(tmp_path / "runs", names=["sc-s1993", "sc-s1994", "sc-s1995"])
    assert cli("check", "--reference", str(reference), str(runs)) == 1
    out = capsys.readouterr().out
    assert "missing" in out and "clbench run --strategy tosca" in out


def test_check_fails_on_a_changed_parameter_count(reference, tmp_path, capsys):
    def one_more(rec):  # the last task's module one parameter larger, and the total with it
        rec["params"]["added_per_task"][-1] += 1
        rec["params"]["added_total"] += 1

    runs = runs_with_calibration(tmp_path / "runs", mutate={"tosca-s1994": one_more})
    assert cli("check", "--reference", str(reference), str(runs)) == 1
    assert "params added_total" in capsys.readouterr().out


def test_check_calibrate_writes_a_measurement(tmp_path, capsys):
    assert cli("check", "--calibrate", str(tmp_path)) == 0
    data = json.loads((tmp_path / chk.CALIBRATION_FILE).read_text())
    (m,) = data["measurements"]
    assert m["workload"] == chk.CALIBRATION_ID and m["seconds"] == pytest.approx(sorted(m["all_seconds"])[2], abs=1e-5)
    assert "calibration:" in capsys.readouterr().out


def test_check_rejects_a_reference_not_written_by_clbench(tmp_path):
    bad = tmp_path / "ref.json"
    bad.write_text(json.dumps({"entries": []}))
    with pytest.raises(ClbenchError, match="format None"):
        cli("check", "--reference", str(bad), str(FIXTURES))


def test_check_refuses_write_only_flags_when_checking(reference):
    with pytest.raises(ClbenchError, match="--why apply only with --write-reference"):
        cli("check", "--reference", str(reference), "--why", "because", str(FIXTURES))


def test_write_reference_needs_a_why(tmp_path):
    runs = runs_with_calibration(tmp_path / "runs")
    with pytest.raises(ClbenchError, match="--write-reference needs --why"):
        cli("check", "--write-reference", str(tmp_path / "ref.json"), str(runs))
    assert not (tmp_path / "ref.json").exists()


def test_check_needs_a_mode():
    with pytest.raises(SystemExit):
        cli("check", str(FIXTURES))
