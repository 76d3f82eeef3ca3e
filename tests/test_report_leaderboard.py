"""The report presents a study (issue 39): the main table it compares, the leaderboard that opens it, the main
figure after it, the records of other sections listed, not dropped; figures whose text never collides; a page that
fits 1400 px.

Fast tests use the record fixtures of tests/test_report.py (micro ViT: SimpleCIL and TOSCA, three seeds); the tests
on the committed 95-record study (``reports/emoji/runs`` with ``reports/emoji-table.yaml``) are in the full tier.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from clbench.cli import build_parser
from clbench.report.collect import collect
from clbench.report.labels import short_label
from clbench.report.leaderboard import automatic, from_study_file, leaderboard
from clbench.report.uncertainty import Predicted

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "records"
STUDY = REPO / "reports" / "emoji-table.yaml"
STUDY_RUNS = REPO / "reports" / "emoji" / "runs"
MICRO = ["sc-s1993", "sc-s1994", "sc-s1995", "tosca-s1993", "tosca-s1994"]


def copy_runs(dest: Path, names=MICRO, mutate=None) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for folder in FIXTURES.glob("*/*"):
        if folder.name in names:
            shutil.copytree(folder, dest / folder.name)
    for name, edit in (mutate or {}).items():
        src, new = name if isinstance(name, tuple) else (name, name)
        if new != src:
            shutil.copytree(dest / src, dest / new)
        path = dest / new / "result.json"
        rec = json.loads(path.read_text())
        edit(rec)
        path.write_text(json.dumps(rec))
    return dest


def _variant(epochs: int):
    def edit(rec: dict) -> None:
        rec["strategy_config"]["epochs"] = epochs
        rec["run_id"] = f"{rec['run_id']}-e{epochs}"

    return edit


def test_automatic_main_table_is_one_row_per_strategy_and_protocol_and_lists_the_rest(tmp_path):
    runs = copy_runs(tmp_path / "runs", mutate={("tosca-s1993", "tosca-e3"): _variant(3)})
    coll, study = automatic(collect([runs]))
    slots = [(k.bench, k.strategy, k.protocol) for k in study.main]
    assert sorted(slots) == sorted(set(slots))
    assert {k.strategy for k in study.main} == {"simplecil", "tosca"}
    assert study.baseline == "simplecil"
    placed = {r.run_id for rs in study.main.values() for r in rs} | {r.run_id for s in study.sections for r in s.runs}
    assert placed == {r.run_id for r in coll.runs}  # nothing silently dropped
    (budget,) = [s for s in study.sections if s.kind == "budget"]
    assert [r.variant for r in budget.runs] == ["tosca epochs=3"]


def test_leaderboard_is_sorted_by_final_accuracy_and_marks_the_best_and_the_baseline(tmp_path):
    coll, study = automatic(collect([copy_runs(tmp_path / "runs")]))
    board = leaderboard(study, coll, Predicted())
    assert list(board.table["rank"]) == [str(i) for i in range(1, len(board.table) + 1)]
    assert board.finals == sorted(board.finals, reverse=True)
    assert board.table["differs from best"].iloc[0] == "best"
    column = board.versus_column
    assert column is not None and "Holm p vs SimpleCIL" in board.table.columns
    base = board.table[board.table["method"] == "SimpleCIL"]
    assert list(base[column]) == ["baseline"]
    assert board.study is not None and f"Family: {board.study.family}" in board.caption
    assert "each main row vs the best row and vs the baseline (SimpleCIL)" in board.caption
    assert "95 % interval" in board.caption  # explained once in the caption, not in a column per row
    assert not any("bootstrap" in str(v) for v in board.table.to_numpy().ravel())


def test_leaderboard_tests_do_not_change_when_variant_records_are_added(tmp_path):
    """Holm over the main rows only: records outside the main table (a budget variant) take no power away."""
    plain = copy_runs(tmp_path / "a")
    more = copy_runs(
        tmp_path / "b", mutate={("sc-s1993", "sc-e3"): _variant(3), ("tosca-s1994", "tosca-e3"): _variant(3)}
    )
    boards = []
    for folder in (plain, more):
        coll, study = automatic(collect([folder]))
        boards.append(leaderboard(study, coll, Predicted()))
    a, b = boards
    assert a.versus_column is not None
    assert list(a.table[a.versus_column]) == list(b.table[b.versus_column])
    assert list(a.table["method"]) == list(b.table["method"])


def test_a_baseline_outside_the_main_table_is_refused(tmp_path):
    from clbench.errors import ClbenchError

    with pytest.raises(ClbenchError, match="--baseline ranpac"):
        automatic(collect([copy_runs(tmp_path / "runs")]), baseline="ranpac")


def test_short_labels_name_the_method_and_protocol():
    from clbench.report.collect import AccKey

    key = AccKey("emoji B0 Inc6", "vit 112px fp32", "abc", "tosca", "reference")
    assert short_label(key) == "TOSCA, reference protocol"
    assert short_label(key._replace(strategy="ranpac epochs=300", protocol="per-sample")) == "RanPAC epochs=300"


def test_palette_is_fixed_by_strategy_name():
    from clbench.report.figures.style import strategy_color, variant_styles

    assert strategy_color("tosca") == strategy_color("tosca l1=0") == strategy_color("tosca:quick")
    assert strategy_color("tosca") != strategy_color("simplecil")
    assert strategy_color("some-new-method") == strategy_color("some-new-method")  # from its name, not its rank
    styles = variant_styles(["ranpac", "ranpac epochs=300"])
    assert styles["ranpac"] != styles["ranpac epochs=300"]


@pytest.fixture(scope="module")
def report_and_figures(tmp_path_factory) -> tuple[Path, list]:
    """A report of the fixtures plus a budget variant, and the matplotlib figures it saved."""
    from clbench.report.build import write_report

    base = tmp_path_factory.mktemp("lb")
    runs = copy_runs(base / "runs", mutate={("tosca-s1993", "tosca-e3"): _variant(3)})
    out = base / "report"
    with pytest.MonkeyPatch.context() as mp:
        made = _capture_figures(mp)
        write_report(collect([runs]), out, with_tsne=False)
    return out, made


@pytest.fixture(scope="module")
def report_dir(report_and_figures) -> Path:
    return report_and_figures[0]


def _tables(page: str) -> list[str]:
    return re.findall(r"<table>.*?</table>", page, flags=re.S)


def test_report_opens_on_the_leaderboard_then_the_main_figure(report_dir):
    page = (report_dir / "index.html").read_text()
    first = _tables(page)[0]
    assert "differs from best" in first and 'class="best"' in first
    lead = page.index('<section id="leaderboard">')
    assert lead < page.index("<table>") < page.index('id="fig-accuracy_curves"') < page.index('id="summary"')
    assert 'id="contents"' in page and page.index('id="contents"') < lead
    md = (report_dir / "README.md").read_text()
    assert md.index("## Leaderboard") < md.index("accuracy_curves.png") < md.index("## Summary")
    assert "| **1** |" in md
    manifest = json.loads((report_dir / "report.json").read_text())
    assert manifest["study"]["baseline"] == "simplecil"
    assert [s["kind"] for s in manifest["study"]["sections"]] == ["budget"]


def test_every_figure_links_to_its_files_and_its_data(report_dir):
    page = (report_dir / "index.html").read_text()
    for fig in json.loads((report_dir / "report.json").read_text())["figures"]:
        block = page[page.index(f'id="fig-{fig["name"]}"') :].split("</figure>")[0]
        for rel in fig["files"].values():
            assert f'href="{rel}"' in block
        assert 'href="report.json"' in block


# ------------------------------------------------------------------------------------------- text overlap
def text_collisions(fig) -> list[str]:
    """Pairs of visible text artists of ``fig`` whose rendered boxes intersect, and texts that leave the canvas
    (matplotlib's renderer gives every text its window extent)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    canvas_agg = FigureCanvasAgg(fig)
    canvas_agg.draw()
    renderer = canvas_agg.get_renderer()
    canvas = fig.bbox
    tick_labels: set[int] = set()
    drawn: set[int] = set()  # tick labels inside the view limits: the only ones the renderer draws
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                tick_labels |= {id(tick.label1), id(tick.label2)}
            for tick in axis._update_ticks():
                drawn |= {id(tick.label1), id(tick.label2)}
    boxes = []
    for t in fig.findobj(Text):
        if not t.get_visible() or not t.get_text().strip() or (t.axes is not None and not t.axes.get_visible()):
            continue
        if id(t) in tick_labels and id(t) not in drawn:
            continue
        box = t.get_window_extent(renderer)
        if box.width <= 0 or box.height <= 0:
            continue
        boxes.append((t.get_text(), box))
    problems = []
    for text, box in boxes:
        if box.x0 < canvas.x0 - 1 or box.x1 > canvas.x1 + 1 or box.y0 < canvas.y0 - 1 or box.y1 > canvas.y1 + 1:
            problems.append(f"{text!r} leaves the canvas")
    for i, (ta, a) in enumerate(boxes):
        for tb, b in boxes[i + 1 :]:
            w = min(a.x1, b.x1) - max(a.x0, b.x0)
            h = min(a.y1, b.y1) - max(a.y0, b.y0)
            if w > 1 and h > 1:  # more than a pixel of ink box in common
                problems.append(f"{ta!r} overlaps {tb!r}")
    return problems


def _capture_figures(monkeypatch) -> list:
    from clbench.report import figure_base
    from clbench.report.figures import costs, curves, matrices, routing_plots, tsne_maps

    made: list = []
    save = figure_base._save

    def keep(fig, *args, **kwargs):
        made.append((args[1], fig))
        return save(fig, *args, **kwargs)

    for family in (costs, curves, matrices, routing_plots, tsne_maps):  # the report's figures, one module per family
        monkeypatch.setattr(family, "_save", keep)
    monkeypatch.setattr(figure_base, "_save", keep)  # the forest plot's (clbench.report.forest reads it there)
    return made


def test_collision_check_catches_two_labels_drawn_on_each_other():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2))
    ax = fig.subplots()
    ax.text(0.5, 0.5, "first label")
    ax.text(0.52, 0.5, "second label")
    assert any("overlaps" in p for p in text_collisions(fig))


def test_no_figure_of_a_report_has_colliding_text(report_and_figures):
    made = report_and_figures[1]
    assert len(made) >= 4
    problems = {name: p for name, fig in made if (p := text_collisions(fig))}
    assert not problems, problems


def test_the_routing_studys_panels_name_their_setting_and_keep_the_legend_outside(tmp_path, monkeypatch):
    """`clbench routing-study` on the committed runs (reports/routing/emoji, four l1 values x two seeds): each panel's
    title names the setting it differs in (its panels were four identical titles), the routers' legend is the
    figure's, beside the panels and not over the first one's lines, and no two texts collide."""
    from clbench.report.figures.routing_plots import routing_study

    made = _capture_figures(monkeypatch)
    assert routing_study(collect([REPO / "reports" / "routing" / "emoji"]), tmp_path) is not None
    [(name, fig)] = made
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert sorted(titles) == sorted(f"tosca on emoji, l1={v} (2 runs)" for v in ("0", "0.005", "0.05", "0.0005"))
    assert not any(ax.get_legend() for ax in fig.axes) and len(fig.legends) == 1
    assert not text_collisions(fig)


@pytest.fixture(scope="module")
def study_report(tmp_path_factory) -> tuple[Path, list]:
    """The report of the committed 95-record study (as the lead regenerates reports/emoji/), and its figures."""
    from clbench.report.build import write_report

    out = tmp_path_factory.mktemp("study") / "report"
    with pytest.MonkeyPatch.context() as mp:
        made = _capture_figures(mp)
        write_report(collect([STUDY_RUNS]), out, with_tsne=False, study_file=STUDY, make_parser=build_parser)
    return out, made


@pytest.mark.full  # the committed 95-record study: minutes on 2 cores
def test_no_figure_of_the_committed_study_report_has_colliding_text(study_report):
    problems = {name: p for name, fig in study_report[1] if (p := text_collisions(fig))}
    assert not problems, problems


# ------------------------------------------------------------------------------------------- the page in a browser
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (Debian: apt-get install chromium); the headless-browser checks need it",
)


def page_facts(index: Path, tmp: Path) -> dict[str, str]:
    """The page's own report, at a 1400 px wide window: scroll width, the section of its first table, images."""
    import subprocess

    assert CHROMIUM is not None
    res = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            f"--user-data-dir={tmp / 'chromium-profile'}",
            "--window-size=1400,1000",
            "--virtual-time-budget=5000",
            "--dump-dom",
            index.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    body = re.search(r"<body([^>]*)>", res.stdout)
    assert body, res.stderr[-2000:]
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1)))


@needs_chromium
def test_page_fits_1400_px_and_opens_on_the_leaderboard(report_dir, tmp_path):
    facts = page_facts(report_dir / "index.html", tmp_path)
    assert int(facts["scroll-width"]) <= 1400, facts
    assert facts["first-table"] == "leaderboard", facts
    assert facts["broken-images"] == "0", facts


@pytest.mark.full
@needs_chromium
def test_committed_study_page_fits_1400_px_and_opens_on_the_leaderboard(study_report, tmp_path):
    facts = page_facts(study_report[0] / "index.html", tmp_path)
    assert int(facts["scroll-width"]) <= 1400, facts
    assert facts["first-table"] == "leaderboard", facts


# ------------------------------------------------------------------------------------------- the committed study
@pytest.mark.full  # reads the 95 committed records and plans the study file: about 10 s
def test_study_file_groups_choose_the_main_table_and_sections():
    coll, study = from_study_file(collect([STUDY_RUNS]), STUDY, build_parser)
    strategies = {k.strategy for k in study.main}
    assert strategies == {
        "simplecil", "tosca", "acil", "dsal", "fecam", "randumb", "slda", "l2p", "ease", "ranpac", "aper",
        "dualprompt", "mos", "inflora:reference", "slca:reference", "coda_prompt:reference-6tasks",
        "hide_prompt:reference", "aper:reference-ssf", "aper:reference-vpt", "lae",
    }  # fmt: skip  # inflora: a group at the `reference` profile is a main row too, CODA's at `reference-6tasks`
    assert study.baseline == "simplecil"  # the first strategy of the first main group
    titles = [s.title for s in study.sections]
    assert "Study group reference-steps" in titles and "Study group ranpac-no-first-session" in titles
    assert titles[-1] == "Not in the comparison"
    assert any("tosca-routers" in n for n in study.notes)  # its record lives under reports/routing/
    placed = {r.run_id for rs in study.main.values() for r in rs} | {r.run_id for s in study.sections for r in s.runs}
    repeats = {r.run_id for r in coll.runs if r.repeat_of in placed}  # one seed run twice: the notes name them
    assert placed | repeats == {r.run_id for r in coll.runs}
    assert any("repeats seed" in n for n in coll.notes)


@pytest.mark.full  # bootstrap intervals and paired tests of the main rows: about a minute
def test_study_leaderboard_reproduces_the_readme_five_seed_numbers():
    from test_readme_numbers import FIVE_SEEDS, five_seed_folders, table_row

    coll, study = from_study_file(collect([STUDY_RUNS]), STUDY, build_parser)
    board = leaderboard(study, coll, Predicted())
    by_key = dict(zip(board.keys, board.table.to_dict(orient="records"), strict=True))
    folders = tuple(sorted(f for s, _ in FIVE_SEEDS.values() for f in five_seed_folders(s)))
    for strategy, protocol in FIVE_SEEDS.values():
        (key,) = [k for k in board.keys if k.strategy == strategy and k.protocol == protocol]
        expected = table_row(folders, True, five_seed_folders(strategy)[0], protocol)
        assert by_key[key]["final acc % ± CI"] == expected["final acc %"], strategy
        assert by_key[key]["avg inc acc % ± CI"] == expected["avg inc acc %"], strategy
    assert np.all(np.diff(board.finals) <= 0)


# ------------------------------------------------------------------------------------------- paper exports
PDFLATEX = shutil.which("pdflatex")
needs_pdflatex = pytest.mark.skipif(
    PDFLATEX is None,
    reason="pdflatex is not installed (Debian: apt-get install texlive-latex-base texlive-latex-recommended, "
    "which has booktabs); the LaTeX compile check needs it",
)


def test_every_table_is_written_as_csv_and_booktabs_latex(report_dir):
    manifest_tables = sorted(p.stem for p in (report_dir / "tables").glob("*.csv"))
    assert manifest_tables[0:1] and "leaderboard" in manifest_tables and "summary" in manifest_tables
    for stem in manifest_tables:
        tex = (report_dir / "tables" / f"{stem}.tex").read_text()
        assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex, stem
        assert "±" not in tex, stem  # written as $\pm$


def test_leaderboard_latex_bolds_the_best_and_marks_significance(report_and_figures):
    from clbench.report.latex import SIGNIFICANT, leaderboard_latex
    from clbench.report.leaderboard import Board

    tex = (report_and_figures[0] / "tables" / "leaderboard.tex").read_text()
    body = tex.split(r"\midrule")[1].split(r"\bottomrule")[0].strip().splitlines()
    assert body[0].startswith(r"\textbf{1}")  # the fixtures keep no predictions: values without an interval
    assert not any(r"\textbf" in line for line in body[1:])
    # the marker follows the Holm-adjusted test against the baseline, row by row
    import pandas as pd

    table = pd.DataFrame({"rank": ["1", "2"], "method": ["A", "B"], "final acc % ± CI": ["50.00 ± 1.0", "40 ± 1"]})
    board = Board(table, [], "Main table: x.", [], None, None, [50.0, 40.0], [None, True])
    rows = leaderboard_latex(board).split(r"\midrule")[1].splitlines()
    assert SIGNIFICANT not in rows[1] and "B" + SIGNIFICANT in rows[2]
    assert r"50.0 $\pm$ 1.0" in rows[1] and "±" not in "".join(rows)  # one decimal in the paper table


def test_latex_only_writes_the_table_and_the_main_figure_for_a_paper(tmp_path):
    from PIL import Image

    from clbench.report.build import write_report

    out = tmp_path / "paper"
    written = write_report(collect([copy_runs(tmp_path / "runs")]), out, latex_only=True)
    names = sorted(str(p.relative_to(out)) for p in written.files)
    assert names == [
        "figures/accuracy_curves.pdf",
        "figures/accuracy_curves.png",
        "figures/accuracy_curves.svg",
        "leaderboard.csv",
        "leaderboard.tex",
    ]
    assert not (out / "index.html").exists()
    dpi = Image.open(out / "figures" / "accuracy_curves.png").info["dpi"]
    assert round(dpi[0]) == 300
    assert (out / "figures" / "accuracy_curves.pdf").read_bytes().startswith(b"%PDF")


@needs_pdflatex
def test_latex_tables_compile_with_pdflatex(report_dir, tmp_path):
    import subprocess

    tables = sorted((report_dir / "tables").glob("*.tex"))
    doc = "\n".join(
        [
            r"\documentclass{article}",
            r"\usepackage[T1]{fontenc}",
            r"\usepackage{booktabs}",
            r"\usepackage{graphicx}",
            r"\begin{document}",
            *(r"\input{" + str(t) + "}" + "\n" + r"\clearpage" for t in tables),
            r"\end{document}",
        ]
    )
    (tmp_path / "doc.tex").write_text(doc)
    res = subprocess.run(
        [PDFLATEX, "-interaction=nonstopmode", "-halt-on-error", "doc.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:]
    assert (tmp_path / "doc.pdf").is_file()


def test_a_group_at_any_reference_budget_profile_is_a_main_row():
    """The defaults, ``reference`` and ``reference-WHAT`` (another split's reference budget: CODA-Prompt's
    ``reference-6tasks``, InfLoRA's ``reference-imr``) are reference budgets; ``quick``, ``ci`` are not."""
    from clbench.report.leaderboard import is_reference_profile

    assert all(map(is_reference_profile, [None, "reference", "reference-6tasks", "reference-imr"]))
    assert not any(map(is_reference_profile, ["quick", "ci", "ci-augment", "references", "my-reference"]))
