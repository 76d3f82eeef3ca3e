"""One study, one answer (clbench.report.study): the report builds its study once and every output reads it, so a
pair of rows has one p, one adjusted p and one verdict in the leaderboard, the paired table, ``report.json``,
``clbench compare`` and the README's results block; rows with different seeds are compared on the seeds they
share; the family of tests is declared once; the README block is ranked with one generated sentence.

Records: run folders with simulated predictions of the embedded benchmark's test set (tests/test_uncertainty_report.py):
SimpleCIL and APER at seeds 1-3, TOSCA at seeds 1-2 (15 points better), SLDA at seed 1 only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from test_uncertainty_report import make_run, test_y  # noqa: F401 (a fixture)

from clbench.cli import main
from clbench.evaluation.stats import fmt_p
from clbench.report.collect import collect
from clbench.report.front import BEGIN, END, readme_block
from clbench.report.leaderboard import automatic
from clbench.report.study import build_study
from clbench.report.uncertainty import Predicted

REPO = Path(__file__).resolve().parent.parent
README = f"# Project\n\nIntro.\n\n{BEGIN}\nold\n{END}\n\nAfter.\n"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, test_y) -> Path:  # noqa: F811
    tmp = tmp_path_factory.mktemp("study")
    runs = make_runs(tmp / "runs", test_y)
    (tmp / "README.md").write_text(README)
    rc = main(["report", str(runs), "--out", str(tmp / "rep"), "--no-tsne", "--readme", str(tmp / "README.md")])
    assert rc == 0
    rc = main(["compare", str(runs), "--bench", "emoji", "--out", str(tmp / "cmp")])
    assert rc == 0
    return tmp


def make_runs(root: Path, test_y) -> Path:  # noqa: F811
    for seed in (1, 2, 3):
        make_run(root, test_y, "simplecil", seed, 0.30)
        make_run(root, test_y, "aper", seed, 0.31)
    for seed in (1, 2):
        make_run(root, test_y, "tosca", seed, 0.45)
    make_run(root, test_y, "slda", 1, 0.40)
    return root


def _model(tmp: Path, family: str = "default"):
    coll, selection = automatic(collect([tmp / "runs"]))
    return build_study(selection, coll, Predicted(), family)


def printed_pairs(
    report: Path, readme: tuple[Path, str], compare: Path | None = None
) -> dict[tuple[str, str], set[tuple[str, str, str]]]:
    """Every (row, row) pair printed anywhere in a report's outputs (``report``: its folder; ``readme``: a file and
    the tag of its results block; ``compare``: a compare folder of the same records) -> the set of (p, Holm p,
    verdict) it is printed with (the verdict where the output prints one, else "")."""
    out: dict[tuple[str, str], set[tuple[str, str, str]]] = {}

    def add(a: str, b: str, p: str, holm: str, verdict: str = "") -> None:
        out.setdefault(tuple(sorted((a, b))), set()).add((p, holm, verdict))

    def from_json(study: dict) -> None:
        labels = {r["id"]: r["label"] for r in study["rows"]}
        for t in study["tests"]:
            v = "yes" if t["significant"] else "no"
            p, holm = fmt_p(t["p"], t["p_bound"]), fmt_p(t["p_adj"], t["p_adj_bound"])
            add(labels[t["a"]], labels[t["b"]], p, holm, v)

    manifest = json.loads((report / "report.json").read_text())
    assert "tests" in manifest["study"], f"{report}: made before the study model; regenerate it"
    from_json(manifest["study"])
    tables = [report / "tables" / "pairs.csv"]
    if compare is not None:
        from_json(json.loads((compare / "compare.json").read_text()))
        tables.append(compare / "compare_pairs.csv")
    for table in tables:  # the paired tables
        for r in pd.read_csv(table, dtype=str, keep_default_na=False).to_dict(orient="records"):
            if r["p"] not in ("-", ""):  # numbers, a p printed as a bound with its "<" beside it
                p = fmt_p(float(r["p"]), bool(r.get("p bound")))
                holm = fmt_p(float(r["p (Holm)"]), bool(r.get("p (Holm) bound")))
                add(r["A"], r["B"], p, holm, "yes" if r["differ (Holm, 5 %)"] == "yes" else "no")
    board = manifest["study"]["leaderboard"]  # the leaderboard: against the best and the baseline
    best = board[0]["method"]
    base = next(x["method"] for x in board if x["Δ final vs SimpleCIL [95 % CI]"] == "baseline")
    for r in board:
        if r["p vs best"] != "-":
            add(r["method"], best, r["p vs best"], r["Holm p vs best"], r["differs from best"])
        if r["p vs SimpleCIL"] != "-":
            add(r["method"], base, r["p vs SimpleCIL"], r["Holm p vs SimpleCIL"])
    block = readme_block(readme[0].read_text(), readme[1])  # the README block: "Δ [..]; p X, Holm Y"
    rows = [line.strip("|").split(" | ") for line in block.splitlines() if line.startswith("| ") and "---" not in line]
    head, body = [c.strip() for c in rows[0]], rows[1:]
    best_label = body[0][1].strip().strip("*")
    assert head[5].startswith("vs best") and head[6].startswith("vs SimpleCIL")
    for cells in body:
        cells = [c.strip().strip("*") for c in cells]
        for col, other in ((5, best_label), (6, "SimpleCIL")):
            m = re.search(r"; p (.+?), Holm ([^,]+)", cells[col])
            if m:
                add(cells[1], other, m.group(1), m.group(2))
    return out


def assert_one_answer(pairs: dict[tuple[str, str], set[tuple[str, str, str]]]) -> None:
    assert pairs, "no pair printed"
    for pair, values in pairs.items():
        ps = {(p, holm) for p, holm, _ in values}
        verdicts = {v for _, _, v in values if v}
        assert len(ps) == 1, f"{pair}: printed with {sorted(ps)}"
        assert len(verdicts) <= 1, f"{pair}: verdicts {sorted(verdicts)}"


def test_no_pair_is_printed_with_two_p_values_or_verdicts(outputs):
    pairs = printed_pairs(outputs / "rep", (outputs / "README.md", "main"), outputs / "cmp")
    assert_one_answer(pairs)
    # the check can fail: one output printing another p for a pair is caught
    some = next(iter(pairs))
    broken = {**pairs, some: pairs[some] | {("0.5", "0.9", "")}}
    with pytest.raises(AssertionError, match="printed with"):
        assert_one_answer(broken)


def test_the_committed_report_and_readmes_print_each_pair_once():
    """reports/emoji (made by `clbench report reports/emoji/runs --study reports/emoji-table.yaml --out
    reports/emoji --readme README.md`), README.md's block: one p, one Holm p, one verdict per pair."""
    assert_one_answer(printed_pairs(REPO / "reports" / "emoji", (REPO / "README.md", "emoji-table")))


def test_every_output_prints_the_studys_tests(outputs):
    """The leaderboard, the paired table, compare and the README read the same family: every test of the study
    appears in report.json and in the paired table, with the family named in the table's caption."""
    model = _model(outputs)
    manifest = json.loads((outputs / "rep" / "report.json").read_text())
    assert len(manifest["study"]["tests"]) == len(model.tests) > 0
    assert manifest["study"]["family"] == model.family
    assert model.family in (outputs / "rep" / "README.md").read_text()
    pairs = pd.read_csv(outputs / "rep" / "tables" / "pairs.csv", dtype=str)
    assert len(pairs[pairs["p"] != "-"]) == len(model.tests)


def test_rows_with_different_seeds_are_compared_on_the_seeds_they_share(outputs):
    model = _model(outputs)
    sc = next(r for r in model.rows if r.key.strategy == "simplecil")
    tosca = next(r for r in model.rows if r.key.strategy == "tosca")
    slda = next(r for r in model.rows if r.key.strategy == "slda")
    assert sc.seeds == (1, 2, 3) and tosca.seeds == (1, 2) and slda.seeds == (1,)
    t = model.test(tosca.id, sc.id)
    assert t is not None and t.seeds == (1, 2) and "seed-level t over 2 seeds" in t.method
    assert "(1, 2)" in t.note
    one = model.test(slda.id, sc.id)
    assert one is not None and one.seeds == (1,) and one.method.startswith("paired bootstrap over test images")
    assert not model.refused  # nothing printed "not paired"
    for t in model.tests:
        assert t.excludes_zero == (t.p < 0.05)


def test_the_test_reads_the_same_either_way(outputs):
    model = _model(outputs)
    t = model.tests[0]
    back = model.test(t.b, t.a)
    assert back is not None and back.diff == -t.diff and (back.lo, back.hi) == (-t.hi, -t.lo) and back.p == t.p


def test_the_family_is_declared_and_all_pairs_is_larger(outputs):
    default, every = _model(outputs), _model(outputs, "all")
    assert default.family.startswith("each main row vs the best row and vs the baseline")
    assert every.family.startswith("every pair of main rows")
    assert f"Holm over {len(every.tests)} tests" in every.family
    # per setting (benchmark, protocol) of n rows: n (n - 1) / 2 pairs
    sizes: dict[tuple[str, str], int] = {}
    for r in every.rows:
        sizes[r.setting] = sizes.get(r.setting, 0) + 1
    assert len(every.tests) == sum(n * (n - 1) // 2 for n in sizes.values())


def test_readme_block_is_ranked_with_one_sentence_and_the_rest_kept(outputs):
    text = (outputs / "README.md").read_text()
    assert text.startswith("# Project\n\nIntro.\n\n" + BEGIN + "\n") and text.endswith(END + "\n\nAfter.\n")
    block = readme_block(text)
    first = block.splitlines()[0]
    assert first.startswith("**") and " ranks first (" in first and "over the baseline SimpleCIL" in first
    rows = [line for line in block.splitlines() if line.startswith("| ") and "---" not in line][1:]
    finals = [float(re.sub(r"\*", "", r.split(" | ")[3]).split(" ± ")[0]) for r in rows]
    assert finals == sorted(finals, reverse=True)
    assert rows[0].startswith("| **1")  # the best in bold
    assert all("reference protocol" not in r for r in rows)  # one line per method: variant rows stay in the report


def test_readme_without_markers_is_refused_before_anything_is_written(tmp_path, capsys, test_y):  # noqa: F811
    runs = make_runs(tmp_path / "runs", test_y)
    (tmp_path / "README.md").write_text("# no markers\n")
    rc = main(["report", str(runs), "--out", str(tmp_path / "rep"), "--no-tsne", "--readme", str(tmp_path / "R.md")])
    assert rc != 0 and not (tmp_path / "rep").exists()
    readme = str(tmp_path / "README.md")
    rc = main(["report", str(runs), "--out", str(tmp_path / "rep"), "--no-tsne", "--readme", readme])
    err = capsys.readouterr().err
    assert rc != 0 and "clbench results: begin" in err and not (tmp_path / "rep").exists()


# ------------------------------------------------------------------------------------- a study row is one data set
SC1993 = REPO / "reports" / "emoji" / "runs" / "seeds" / "simplecil-emoji-s1993-o1993"
STUDY_HEAD = "benches: emoji\nseeds: 1993\nprecision: fp32\nout: runs/x\n"


def _copy_record(src: Path, dest: Path, **changes) -> Path:
    import shutil

    shutil.copytree(src, dest)
    path = dest / "result.json"
    rec = json.loads(path.read_text())
    rec.update(changes)
    path.write_text(json.dumps(rec))
    return dest


def test_a_study_group_with_records_of_two_data_sets_is_refused_naming_them(tmp_path):
    """Two records with the same settings (fingerprint) but other data digests: before, both joined the group as
    two rows of one method; now the report refuses in one line naming both records."""
    from clbench.cli import build_parser
    from clbench.errors import ClbenchError
    from clbench.report.leaderboard import from_study_file

    runs = tmp_path / "runs"
    _copy_record(SC1993, runs / "a")
    other = {"train": "0" * 16, "test": "1" * 16}
    _copy_record(SC1993, runs / "b", run_id="simplecil-other-data", data_fingerprint=other)
    study = tmp_path / "study.yaml"
    study.write_text(
        STUDY_HEAD + "groups:\n  - name: seeds\n    strategies: simplecil\n    seeds: 1993..1997\n    vary: both\n"
    )
    with pytest.raises(ClbenchError) as err:
        from_study_file(collect([runs]), study, build_parser)
    text = err.value.args[0]  # the message line (the hint is apart)
    assert "group seeds has records of 2 data sets on emoji" in text and "\n" not in text
    assert "simplecil-emoji-s1993-o1993" in text and "simplecil-other-data" in text
    # one data set: accepted, one row
    (runs / "b").rename(tmp_path / "b")
    coll, selection = from_study_file(collect([runs]), study, build_parser)
    assert len(selection.main) == 1


def test_a_study_file_of_20000_groups_is_refused_before_any_group_is_planned(tmp_path, monkeypatch):
    from clbench.cli import build_parser
    from clbench.errors import ClbenchError
    from clbench.report import leaderboard

    def never(*_a, **_k):
        raise AssertionError("a group was planned")

    monkeypatch.setattr(leaderboard, "study_groups", never)
    runs = tmp_path / "runs"
    _copy_record(SC1993, runs / "a")
    study = tmp_path / "many.yaml"
    study.write_text(STUDY_HEAD + "groups:\n" + "".join(f"- {{name: g{i}, strategies: slda}}\n" for i in range(20_000)))
    with pytest.raises(ClbenchError, match=r"bytes, more than a study file's"):
        leaderboard.from_study_file(collect([runs]), study, build_parser)
    # under the byte cap, over the group cap: refused by its count, still before planning
    monkeypatch.setattr(leaderboard, "MAX_STUDY_BYTES", 10**7)
    with pytest.raises(ClbenchError, match=r"20,000 groups, more than a study's 256"):
        leaderboard.from_study_file(collect([runs]), study, build_parser)
