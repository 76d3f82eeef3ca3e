"""Figures a reader can read (issue 56): every figure a report makes, rendered from record fixtures, has no colliding
text and no two series of one axes in colours closer than :data:`MIN_DELTA_E` (CIEDE2000); the accuracy curves are
panelled by method family with one y range and the baseline in every panel; the forest plot orients, sorts and marks
its tests; the wall-clock axis is logarithmic with short labels; the memory figure shows added and stored numbers.

The fixtures are the micro-ViT records of tests/fixtures/records (SimpleCIL, TOSCA) plus copies of SimpleCIL's
records renamed to other methods with their accuracies and counts shifted (so that a family panel holds several
series and points and labels crowd), their predictions references dropped.
"""

from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_report_leaderboard import _capture_figures, text_collisions
from test_report_leaderboard import study_report as study_report  # the full-tier fixture, shared

from clbench.report.collect import collect

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "records"
# CIEDE2000: below this, two series of one axes are told apart by colour only with effort (MOS's and FeCAM's old greens
# are 13.9 apart; Okabe-Ito's closest pair, orange and yellow, 21.7)
MIN_DELTA_E = 20.0
# (the copies: method, points added to every accuracy, added parameters, stored numbers)
CLONES = (
    ("ranpac", 9.0, 500_000, 40_000_000),
    ("acil", 8.5, 0, 30_000_000),
    ("fecam", 6.0, 0, 5_000_000),
    ("slda", 7.0, 0, 150_000),
    ("dsal", 8.8, 0, 60_000_000),
    ("l2p", 3.0, 40_000, 0),
    ("dualprompt", 2.0, 90_000, 0),
    ("aper", 1.0, 600_000, 30_000),
    ("inflora", -1.0, 1_000_000, 0),
)


def delta_e(c1: object, c2: object) -> float:
    """CIEDE2000 distance of two matplotlib colours (scikit-image's implementation, on CIELAB D65)."""
    import numpy as np
    from matplotlib.colors import to_rgb

    color = pytest.importorskip("skimage.color")
    lab = [color.rgb2lab(np.array([[to_rgb(c)]], dtype=float))[0, 0] for c in (c1, c2)]
    return float(color.deltaE_ciede2000(lab[0], lab[1]))


def _handle_colour(handle: object) -> object | None:
    """The colour a legend entry shows: a line's, a marker's face (else edge), a patch's or collection's face."""
    from matplotlib.collections import Collection
    from matplotlib.container import Container
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if isinstance(handle, Container):
        handle = handle[0]
    if isinstance(handle, Line2D):
        if handle.get_linestyle() in ("None", "", " ") and handle.get_markerfacecolor() not in ("none", "white"):
            return handle.get_markerfacecolor()
        return handle.get_color()
    if isinstance(handle, Patch):
        return handle.get_facecolor()
    if isinstance(handle, Collection):
        faces = handle.get_facecolor()
        return faces[0] if len(faces) else None
    return None


def close_colours(fig: object, min_delta: float = MIN_DELTA_E) -> list[str]:
    """Pairs of labelled series of one axes (or of a figure legend) whose colours are closer than ``min_delta``."""
    groups = []
    for ax in fig.axes:  # type: ignore[attr-defined]
        handles, labels = ax.get_legend_handles_labels()
        groups.append((ax.get_title() or "axes", list(zip(labels, handles, strict=True))))
    for legend in fig.legends:  # type: ignore[attr-defined]
        groups.append(
            ("figure legend", [(t.get_text(), h) for t, h in zip(legend.texts, legend.legend_handles, strict=True)])
        )
    problems = []
    for where, series in groups:
        coloured = [(label, c) for label, h in series if (c := _handle_colour(h)) is not None]
        for (la, ca), (lb, cb) in itertools.combinations(coloured, 2):
            if la != lb and (d := delta_e(ca, cb)) < min_delta:
                problems.append(f"{where}: {la!r} and {lb!r} are {d:.1f} apart (CIEDE2000)")
    return problems


def _shift(rec: dict, points: float) -> None:
    for holder in [rec, *rec.get("protocols", {}).values()]:
        if "acc_curve" in holder:
            holder["acc_curve"] = [v + points for v in holder["acc_curve"]]
        if holder.get("last_acc") is not None:
            holder["last_acc"] += points
        if holder.get("avg_acc") is not None:
            holder["avg_acc"] += points
        if "accuracy_matrix" in holder:
            holder["accuracy_matrix"] = [[v + points for v in row] for row in holder["accuracy_matrix"]]


def crowded_runs(dest: Path) -> Path:
    """SimpleCIL and TOSCA fixtures plus :data:`CLONES`: three seeds each (TOSCA two)."""
    dest.mkdir(parents=True, exist_ok=True)
    for folder in FIXTURES.glob("*/*"):
        if folder.name in ("sc-s1993", "sc-s1994", "sc-s1995", "tosca-s1993", "tosca-s1994"):
            shutil.copytree(folder, dest / folder.name)
    for name, points, added, stored in CLONES:
        for seed in (1993, 1994, 1995):
            folder = dest / f"{name}-s{seed}"
            shutil.copytree(dest / f"sc-s{seed}", folder)
            rec = json.loads((folder / "result.json").read_text())
            rec.update(strategy=name, run_id=f"{name}-s{seed}", strategy_config={}, predictions=None)
            _shift(rec, points)
            rec["params"].update(added_total=added, stored_total=stored)
            rec["params"]["added_per_task"] = [added] + [0] * (len(rec["params"]["added_per_task"]) - 1)
            rec["params"]["stored_per_task"] = [stored] + [0] * (len(rec["params"]["stored_per_task"]) - 1)
            (folder / "result.json").write_text(json.dumps(rec))
    return dest


@pytest.fixture(scope="module")
def crowded(tmp_path_factory) -> tuple[Path, list]:
    """Every report figure (no t-SNE) of :func:`crowded_runs`, captured as saved."""
    from clbench.report.figures import make_figures

    base = tmp_path_factory.mktemp("crowded")
    coll = collect([crowded_runs(base / "runs")])
    with pytest.MonkeyPatch.context() as mp:
        made = _capture_figures(mp)
        make_figures(coll, base / "out", with_tsne=False, baseline="simplecil")
    return base / "out", made


# ------------------------------------------------------------------------------------------- the checks themselves
def test_colour_check_catches_two_near_colours_in_one_axes():
    """MOS's and FeCAM's old fixed colours (two greens) in one panel: flagged; Okabe-Ito's blue and orange not."""
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], color="#009E73", label="MOS")
    ax.plot([0, 1], [1, 0], color="#2ca02c", label="FeCAM")
    ax.legend()
    assert close_colours(fig)
    fig = Figure()
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], color="#0072B2", label="RanPAC")
    ax.plot([0, 1], [1, 0], color="#E69F00", label="ACIL")
    assert not close_colours(fig)


def test_delta_e_matches_a_published_pair():
    """Sharma, Wu and Dalal's CIEDE2000 test data, pair 1: L*a*b* (50, 2.6772, -79.7751) vs (50, 0, -82.7485) is
    2.0425 apart (checked through the Lab route of scikit-image the check uses)."""
    import numpy as np

    color = pytest.importorskip("skimage.color")
    d = color.deltaE_ciede2000(np.array([50, 2.6772, -79.7751]), np.array([50, 0, -82.7485]))
    assert abs(float(d) - 2.0425) < 1e-3


# ------------------------------------------------------------------------------------------- every report figure
def test_every_report_figure_is_made_and_readable(crowded):
    """Each figure of the report: no text over other text or off the canvas, no two series of one axes closer in
    colour than MIN_DELTA_E."""
    _, made = crowded
    names = {name for name, _ in made}
    assert {"accuracy_curves", "accuracy_vs_params", "wall_clock"} <= names, names
    collisions = {name: p for name, fig in made if (p := text_collisions(fig))}
    assert not collisions, collisions
    colours = {name: p for name, fig in made if (p := close_colours(fig))}
    assert not colours, colours


@pytest.mark.full  # the committed study's report (reports/emoji/runs with reports/emoji-table.yaml): minutes
def test_every_figure_of_the_committed_study_is_readable(study_report):  # noqa: F811
    made = study_report[1]
    assert {"accuracy_curves", "accuracy_vs_params", "wall_clock", "paired_differences"} <= {n for n, _ in made}
    problems = {name: p for name, fig in made if (p := text_collisions(fig) + close_colours(fig))}
    assert not problems, problems


def _curves(made):
    return next(fig for name, fig in made if name == "accuracy_curves")


def test_accuracy_curves_are_panelled_by_family_with_one_y_range_and_the_baseline_everywhere(crowded):
    fig = _curves(crowded[1])
    axes = [ax for ax in fig.axes if ax.get_visible()]
    titles = [ax.get_title(loc="left") for ax in axes]
    assert titles == ["Prompts", "Adapters", "LoRA", "Closed-form heads and prototypes", "TOSCA and its routers"]
    assert len({ax.get_ylim() for ax in axes}) == 1  # one y range
    for ax in axes:
        labels = ax.get_legend_handles_labels()[1]
        assert sum("baseline" in label for label in labels) == 1, (ax.get_title(loc="left"), labels)
    closed = axes[titles.index("Closed-form heads and prototypes")]
    assert {"RanPAC", "ACIL", "FeCAM", "SLDA", "DS-AL"} <= {
        label.split(" (n=")[0] for label in closed.get_legend_handles_labels()[1]
    }


def test_accuracy_curves_leave_no_grid_cell_empty(crowded):
    """Five panels two to a row: the last one spans its row (an odd panel count left a blank quadrant)."""
    fig = _curves(crowded[1])
    axes = [ax for ax in fig.axes if ax.get_visible()]
    last = axes[-1].get_subplotspec()
    assert last.colspan.stop - last.colspan.start == 2
    left, right = axes[0].get_position(), axes[-1].get_position()
    assert right.x1 - right.x0 > 1.5 * (left.x1 - left.x0)


def test_accuracy_curves_leave_out_a_band_that_would_cover_the_panel(tmp_path, monkeypatch):
    """Seeds 30 points apart give a band wider than WIDE_BAND of the y range: not drawn, and the caption says so."""
    from matplotlib.collections import PolyCollection

    from clbench.report.figures.curves import accuracy_curves

    runs = crowded_runs(tmp_path / "runs")
    rec = json.loads((runs / "fecam-s1994" / "result.json").read_text())
    _shift(rec, 40.0)
    (runs / "fecam-s1994" / "result.json").write_text(json.dumps(rec))
    made = _capture_figures(monkeypatch)
    out = accuracy_curves(collect([runs]), tmp_path / "out", baseline="simplecil")
    assert out is not None and "no band for FeCAM" in out.caption
    fig = made[0][1]
    ax = next(a for a in fig.axes if a.get_title(loc="left").startswith("Closed-form"))
    lo, hi = ax.get_ylim()
    for band in (c for c in ax.collections if isinstance(c, PolyCollection)):
        ys = band.get_paths()[0].vertices[:, 1]
        assert ys.max() - ys.min() < 0.9 * (hi - lo)


def test_wall_clock_is_on_a_log_axis_with_short_labels(crowded):
    fig = next(fig for name, fig in crowded[1] if name == "wall_clock")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "RanPAC (n=3)" in labels and "SimpleCIL (n=3)" in labels
    assert all(len(label) <= 40 and "|" not in label for label in labels), labels


def test_memory_figure_shows_added_and_stored_numbers_and_labels_every_point(crowded):
    fig = next(fig for name, fig in crowded[1] if name == "accuracy_vs_params")
    added, stored = fig.axes[:2]
    assert added.get_xscale() == stored.get_xscale() == "log"
    assert "added" in added.get_xlabel() and "stored" in stored.get_xlabel()
    for ax in (added, stored):
        texts = " ".join(t.get_text() for t in ax.texts)
        for method in ("RanPAC", "FeCAM", "DS-AL", "SimpleCIL", "TOSCA", "L2P"):
            assert method in texts, (ax.get_title(loc="left"), texts)
    xs = [float(line.get_xdata()[0]) for line in stored.lines]
    assert any(x == pytest.approx(5_000_000) for x in xs)  # FeCAM's stored numbers: 5 M, not "adds 0"
    assert any(x == pytest.approx(60_000_000) for x in xs)  # DS-AL's


# ------------------------------------------------------------------------------------------- the forest plot
@dataclass(frozen=True)
class Test:
    """The attributes of the study model's paired test (clbench.report.forest.PairTestLike)."""

    a: str
    b: str
    label_a: str
    label_b: str
    diff: float
    lo: float
    hi: float
    p: float
    p_adj: float | None
    significant: bool | None
    seeds: tuple[int, ...]
    method: str


def _t(a: str, b: str, diff: float, half: float, sig: bool) -> Test:
    return Test(a, b, a.upper(), b.upper(), diff, diff - half, diff + half, 0.01, 0.02 if sig else 0.3, sig, (1,), "m")


def test_forest_plot_orients_each_difference_to_the_best_and_the_baseline(tmp_path, monkeypatch):
    from clbench.report.forest import SIGNIFICANT_COLOR, differences, forest_plot

    tests = [
        _t("best", "mid", 1.0, 0.5, True),  # best minus mid: mid minus best is -1
        _t("low", "best", -5.0, 1.0, True),
        _t("mid", "low", 4.0, 1.0, True),
        _t("mid", "base", 0.5, 1.0, False),
        _t("base", "best", -1.5, 1.0, True),
        _t("low", "base", -4.5, 1.0, True),
    ]
    d = differences(tests, "best")
    assert d["mid"].diff == -1.0 and (d["mid"].lo, d["mid"].hi) == (-1.5, -0.5)
    assert d["low"].diff == -5.0 and set(d) == {"mid", "low", "base"}
    made = _capture_figures(monkeypatch)
    labels = {"best": "Best", "mid": "Mid", "base": "Base", "low": "Low"}  # ranked
    out = forest_plot(tests, "best", "base", labels, tmp_path, family="Holm over 6 tests")
    assert out is not None and "Holm over 6 tests" in out.caption
    fig = made[0][1]
    vs_best, vs_base = fig.axes
    assert [t.get_text() for t in vs_best.get_yticklabels()] == ["Best", "Mid", "Base", "Low"]
    assert vs_best.yaxis_inverted()  # best at the top
    assert "minus Best (best)" in vs_best.get_title(loc="left") and "minus Base" in vs_base.get_title(loc="left")
    points = [ln for ln in vs_base.lines if ln.get_marker() == "o"]
    mid = next(p for p in points if p.get_ydata()[0] == 1)
    assert mid.get_xdata()[0] == 0.5 and mid.get_markerfacecolor() == "white"  # not significant: open
    low = next(p for p in points if p.get_ydata()[0] == 3)
    assert low.get_xdata()[0] == -4.5 and low.get_color() == SIGNIFICANT_COLOR
    assert not text_collisions(fig)
