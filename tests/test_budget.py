"""Budget curves (``clbench report``): final accuracy against optimizer steps, from micro records that differ only
in their budget; records that differ in more are refused by name; the methods note their steps per task."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from test_report import FIXTURES, REPO, cli, copy_runs, shift_accuracy
from tinytasks import make_split

from clbench.errors import ClbenchError
from clbench.methods.contract import Context, Task
from clbench.report.budget import (
    QUICK,
    REFERENCE,
    budget_curves,
    curve_label,
    differing_settings,
    optimizer_steps,
)
from clbench.report.collect import collect


def budget(epochs: int, steps_per_epoch: int = 3, delta: float = 0.0):
    """A record edit: ``epochs`` epochs, their optimizer steps in every task, accuracy moved by ``delta``."""

    def edit(rec):
        rec["strategy_config"]["epochs"] = epochs
        rec["params"]["optimizer_steps_per_task"] = [epochs * steps_per_epoch] * len(rec["task_sizes"])
        shift_accuracy(delta)(rec)

    return edit


def budget_runs(dest: Path, extra: dict | None = None) -> Path:
    """TOSCA micro records at 2, 5 and 20 (its default) epochs; ``extra`` edits more records by name."""
    runs = copy_runs(
        dest, ["tosca-s1993", "tosca-s1994"], {"tosca-s1993": budget(2, delta=-5), "tosca-s1994": budget(5)}
    )
    shutil.copytree(REPO / FIXTURES / "tosca" / "tosca-s1993", runs / "tosca-e20")
    path = runs / "tosca-e20" / "result.json"
    rec = json.loads(path.read_text())
    budget(20, delta=3)(rec)
    rec["run_id"] = "tosca-e20"
    path.write_text(json.dumps(rec))
    for name, edit in (extra or {}).items():
        p = runs / name / "result.json"
        r = json.loads(p.read_text())
        edit(r)
        p.write_text(json.dumps(r))
    return runs


def test_records_that_differ_only_in_budget_make_one_curve(tmp_path):
    curves, notes = budget_curves(collect([budget_runs(tmp_path / "runs")]), strict=True)
    assert notes == []
    (curve,) = curves
    tasks = len(curve.settings["task_sizes"])
    assert [p.steps for p in curve.points] == [2 * 3 * tasks, 5 * 3 * tasks, 20 * 3 * tasks]
    assert [p.budget["epochs"] for p in curve.points] == [2, 5, 20]
    accs = [p.mean for p in curve.points]
    assert accs[0] < accs[1] < accs[2]
    # TOSCA's default config trains 20 epochs; so does its quick profile, which only shrinks the input
    assert [p.marks for p in curve.points] == [(), (), (REFERENCE, QUICK)]


def test_the_report_draws_the_figure_and_its_table(tmp_path):
    runs = budget_runs(tmp_path / "runs")
    assert cli("report", str(runs), "--out", str(tmp_path / "rep"), "--no-tsne", "--budget-curves") == 0
    assert (tmp_path / "rep" / "figures" / "budget_curves.png").is_file()
    text = (tmp_path / "rep" / "README.md").read_text()
    assert "## Training budget" in text and "reference epochs" in text
    manifest = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert "budget_curves" in [f["name"] for f in manifest["figures"]]


def test_records_that_differ_in_more_than_budget_are_refused_by_name(tmp_path):
    def other_lr(rec):
        rec["strategy_config"]["lr"] = 0.5

    runs = budget_runs(tmp_path / "runs", {"tosca-e20": other_lr})
    coll = collect([runs])
    assert list(differing_settings([r.record for r in coll.runs])) == ["lr"]
    with pytest.raises(ClbenchError, match=r"differ in more than their budget \(lr: 0.025 vs 0.5\)"):
        budget_curves(coll, strict=True)
    with pytest.raises(ClbenchError, match="lr: 0.025 vs 0.5"):
        cli("report", str(runs), "--out", str(tmp_path / "rep"), "--no-tsne", "--budget-curves")
    assert not (tmp_path / "rep").exists()  # refused before anything was written
    # without the request, the figure draws the records that agree and names the one left out
    curves, notes = budget_curves(coll)
    assert [p.budget["epochs"] for c in curves for p in c.points] == [2, 5]
    assert len(notes) == 1 and "leaves out tosca-e20: other settings than the rest" in notes[0]


def on_cpu(precision: str, capability: str, amx: bool):
    def edit(rec):
        rec["precision"] = precision
        rec["host"] = {**rec.get("host", {}), "cpu_capability": capability, "amx": amx}

    return edit


def test_bf16_records_of_other_cpu_kernels_are_other_curves_fp32_ones_are_not(tmp_path):
    """bf16 numbers move with the CPU's kernels, fp32 ones do not: a bf16 curve holds one CPU kind."""
    xeon, epyc = on_cpu("bf16", "AVX512", True), on_cpu("bf16", "AVX512", False)
    runs = budget_runs(tmp_path / "bf16", {"tosca-s1993": xeon, "tosca-s1994": epyc, "tosca-e20": epyc})
    coll = collect([runs])
    assert differing_settings([r.record for r in coll.runs]) == {"bf16 kernels": ['"AVX512 AMX"', '"AVX512"']}
    with pytest.raises(ClbenchError, match=r"bf16 kernels: \"AVX512 AMX\" vs \"AVX512\""):
        budget_curves(coll, strict=True)
    curves, notes = budget_curves(coll)
    assert [p.budget["epochs"] for c in curves for p in c.points] == [5, 20]
    assert curve_label(curves[0]) == "tosca (bf16, AVX512)"
    assert "leaves out tosca-s1993: other settings than the rest" in notes[0]
    fp32 = {"tosca-s1993": on_cpu("fp32", "AVX512", True), "tosca-s1994": on_cpu("fp32", "AVX2", False)}
    fp32["tosca-e20"] = fp32["tosca-s1994"]
    (curve,) = budget_curves(collect([budget_runs(tmp_path / "fp32", fp32)]), strict=True)[0]
    assert len(curve.points) == 3 and curve_label(curve) == "tosca (fp32)"


def test_records_without_step_counts_are_refused_or_left_out(tmp_path):
    runs = budget_runs(tmp_path / "runs", {"tosca-e20": lambda r: r["params"].pop("optimizer_steps_per_task")})
    coll = collect([runs])
    assert optimizer_steps(next(r for r in coll.runs if r.run_id == "tosca-e20").record) is None
    with pytest.raises(ClbenchError, match="no optimizer step count in tosca-e20"):
        budget_curves(coll, strict=True)
    curves, notes = budget_curves(coll)
    assert len(curves) == 1 and len(curves[0].points) == 2
    assert "no optimizer step count" in notes[0]


def test_the_quick_profile_point_is_marked(tmp_path):
    from clbench.core.catalog import STRATEGIES

    quick = STRATEGIES.get("ease").profiles[QUICK]["epochs"]

    def as_ease(epochs: int):
        def edit(rec):
            from dataclasses import asdict

            from baselines.ease import EASEConfig

            rec["strategy"] = "ease"
            rec["strategy_config"] = asdict(EASEConfig(epochs=epochs))
            rec["params"]["optimizer_steps_per_task"] = [epochs] * len(rec["task_sizes"])
            rec["params"]["adapter_params_per_task"] = 0  # what an EASE record's accounting needs (schema 4)

        return edit

    runs = copy_runs(
        tmp_path / "runs", ["tosca-s1993", "tosca-s1994"], {"tosca-s1993": as_ease(quick), "tosca-s1994": as_ease(20)}
    )
    (curve,) = budget_curves(collect([runs]), strict=True)[0]
    assert [p.marks for p in curve.points] == [(QUICK,), (REFERENCE,)]


@pytest.mark.parametrize("name", ["l2p", "ease", "aper"])
def test_methods_note_their_optimizer_steps_per_task(backbone, name):
    """Each task's steps = epochs x batches; APER trains in the first task only."""
    from clbench.core.catalog import STRATEGIES
    from clbench.core.config import make_strategy_config

    cls = STRATEGIES.get(name)
    cfg = make_strategy_config(cls, None, (("epochs", "1"), ("batch_size", "8")))
    strategy = cls(cfg, Context(backbone=backbone, device=torch.device("cpu"), precision="fp32", seed=0))
    first, second = make_split(backbone, [0, 1], 10, seed=1), make_split(backbone, [2, 3], 6, seed=2)
    strategy.learn_task(Task(0, [0, 1], 2, first))
    strategy.learn_task(Task(1, [2, 3], 4, second))
    expected = [math.ceil(20 / 8), 0 if name == "aper" else math.ceil(12 / 8)]
    assert strategy.optimizer_steps == expected


def test_a_record_made_before_a_setting_existed_reads_its_default_on_a_curve(tmp_path):
    """A record without a setting added to the strategy's config since (it trained at what is now the default)
    shares the curve of records that hold the default; one holding another value is still refused."""

    def drop_l1(rec):
        del rec["strategy_config"]["l1"]

    runs = budget_runs(tmp_path / "runs", {"tosca-e20": drop_l1})
    (curve,) = budget_curves(collect([runs]), strict=True)[0]
    assert [p.budget["epochs"] for p in curve.points] == [2, 5, 20]

    def other_l1(rec):
        rec["strategy_config"]["l1"] = 0.5

    runs = budget_runs(tmp_path / "other", {"tosca-e20": other_l1})
    with pytest.raises(ClbenchError, match="differ in more than their budget"):
        budget_curves(collect([runs]), strict=True)


def test_a_step_schedules_milestone_scaled_with_the_epochs_stays_on_the_curve(tmp_path):
    """SLCA's budget points move the decay epoch with the epochs (0.9 x E, as the reference's 18 of 20): the
    milestone is part of the budget, so the points form one curve, and the point at the default epochs and
    milestone is the reference one."""

    def milestone(value):
        def edit(rec):
            rec["strategy_config"]["milestone"] = value

        return edit

    runs = budget_runs(tmp_path / "runs", {"tosca-s1993": milestone(2), "tosca-s1994": milestone(4)})
    (curve,) = budget_curves(collect([runs]), strict=True)[0]
    assert [p.budget.get("milestone") for p in curve.points] == [2, 4, None]
    assert [p.marks for p in curve.points] == [(), (), (REFERENCE, QUICK)]


def test_each_curve_takes_the_panels_next_colour(tmp_path, monkeypatch):
    """The curves of a panel take :data:`SERIES_COLORS` in turn (distinct within the panel, tests/
    test_report_figures.py), whatever their records' variant labels (a budget point's label names its settings,
    e.g. ``tosca:... epochs=2``): the fixed strategy colours put near-identical ones side by side."""
    import matplotlib.axes

    from clbench.report.figures.curves import budget_curves_figure
    from clbench.report.figures.style import SERIES_COLORS

    drawn: list[str] = []
    real = matplotlib.axes.Axes.errorbar

    def errorbar(self, *args, **kwargs):
        drawn.append(kwargs["color"])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", errorbar)
    coll = collect([budget_runs(tmp_path / "runs", {"tosca-e20": budget(30)})])  # no record at the default
    assert "tosca" not in {r.variant for r in coll.runs}
    curves, _ = budget_curves(coll, strict=True)
    assert budget_curves_figure(coll, tmp_path / "figures", curves) is not None
    assert drawn == [SERIES_COLORS[0]]
