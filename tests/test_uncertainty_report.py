"""Intervals and paired tests in `clbench compare` and `clbench report`, on run folders made from a committed record
plus simulated predictions of the embedded benchmark's test set (942 images, 36 classes in 6 tasks): the tables show
value ± half-width where predictions exist and say why not elsewhere; pairs are tested (Holm), refused when they do
not share class order or seeds; a predictions file that does not match its record stops both commands on one line."""

from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from clbench.cli import main
from clbench.records import predictions as P
from clbench.records.results import load_record

REPO = Path(__file__).resolve().parent.parent
BASE = REPO / "tests" / "fixtures" / "records" / "simplecil" / "sc-s1993"


@pytest.fixture(scope="module")
def test_y() -> np.ndarray:
    with resources.files("clbench").joinpath("data/emoji.npz").open("rb") as f, np.load(f) as npz:
        return np.asarray(npz["test_y"])


def make_run(root: Path, test_y, strategy: str, seed: int, acc: float, *, order_seed: int = 1993, keep=True) -> Path:
    """A complete run folder: the base record renamed, with predictions of accuracy ``acc`` (no predictions
    without ``keep``)."""
    rng = np.random.default_rng([seed, int(acc * 100), sum(map(ord, strategy))])
    rec = load_record(BASE)
    run_id = f"{strategy}-s{seed}" + (f"-o{order_seed}" if order_seed != 1993 else "")
    order = list(range(36)) if order_seed == 1993 else list(np.random.default_rng(order_seed).permutation(36))
    rec = dataclasses.replace(rec, run_id=run_id, strategy=strategy, seed=seed, class_order_seed=order_seed)
    rec.class_order = [int(c) for c in order]
    task = test_y // 6
    parts, preds, confs = [], [], []
    for t in range(6):
        idx = np.flatnonzero(task <= t)
        y = test_y[idx]
        right = rng.random(len(idx)) < acc
        parts.append((idx, y, task[idx]))
        preds.append(np.where(right, y, (y + 1) % (6 * (t + 1))))
        confs.append(rng.uniform(0.3, 1.0, len(idx)))
    folder = root / run_id
    folder.mkdir(parents=True)
    built = P.build(["per-sample"], parts, {"per-sample": preds}, {"per-sample": confs}, 36)
    rec.predictions = P.write(folder, built) if keep else None
    curve = [100 * e.correct.mean() for e in built.evaluations("per-sample")]  # the record agrees with its file
    summary = dataclasses.replace(rec.protocols["per-sample"], acc_curve=curve, last_acc=curve[-1])
    rec.protocols = {"per-sample": dataclasses.replace(summary, avg_acc=float(np.mean(curve)))}
    rec.protocol = "per-sample"
    rec.protocol_gap = None
    rec.write(folder)
    return folder


def compare(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = main(["compare", *argv])
    except SystemExit as e:  # argparse
        code = int(e.code or 0)
    cap = capsys.readouterr()
    return code, cap.out + cap.err


def test_compare_shows_intervals_and_holm_corrected_pairs(tmp_path, test_y, capsys):
    for seed in (1, 2, 3):
        make_run(tmp_path / "runs", test_y, "simplecil", seed, 0.30)
        make_run(tmp_path / "runs", test_y, "tosca", seed, 0.60)  # 30 points better: a real difference
        make_run(tmp_path / "runs", test_y, "aper", seed, 0.30)  # no difference to simplecil
        make_run(tmp_path / "runs", test_y, "slda", seed, 0.30)
    out = tmp_path / "cmp"
    runs = str(tmp_path / "runs")
    code, text = compare(capsys, runs, "--bench", "emoji", "--out", str(out), "--baseline", "simplecil")
    assert code == 0, text
    md = (out / "compare.md").read_text()
    assert "seed level: t over 3 seeds" in md
    rows = {line.split("|")[2].strip(): line for line in md.splitlines() if line.startswith("| emoji")}
    assert " ± " in rows["tosca"].split("|")[7]  # final acc: value ± half-width
    assert ": differs)" in rows["tosca"] and "not significantly different" in rows["aper"]
    import pandas as pd

    # the default family: each row against the best (TOSCA) and against the baseline: 3 + 2 pairs, not all 6
    table = pd.read_csv(out / "compare_pairs.csv")
    pairs = set(zip(table["A"], table["B"], strict=True))
    assert len(pairs) == 5 and ("SLDA", "APER") not in pairs and ("APER", "SLDA") not in pairs
    assert "each main row vs the best row and vs the baseline (SimpleCIL)" in md and "Holm over 5 tests" in md
    assert (out / "figures" / "compare_emoji_pairs.png").is_file()
    # every pair with --all-pairs; Holm's p is never below the raw one
    code, text = compare(capsys, runs, "--bench", "emoji", "--out", str(out), "--all-pairs")
    assert code == 0, text
    table = pd.read_csv(out / "compare_pairs.csv")
    assert len(table) == 6 and (table["p (Holm)"] >= table["p"]).all()


def test_one_seed_uses_the_paired_bootstrap_and_says_it_has_no_seed_spread(tmp_path, test_y, capsys):
    make_run(tmp_path / "runs", test_y, "simplecil", 1, 0.30)
    make_run(tmp_path / "runs", test_y, "tosca", 1, 0.40)
    out = tmp_path / "cmp"
    assert compare(capsys, str(tmp_path / "runs"), "--bench", "emoji", "--out", str(out))[0] == 0
    md = (out / "compare.md").read_text()
    assert "1 seed: no spread over seeds" in md and "paired bootstrap over test images, seed 1" in md
    pairs = md.partition("## Paired comparisons")[2].partition("![")[0]
    assert pairs and "McNemar" not in pairs  # no test printed beside another procedure's interval


def test_pairs_with_another_class_order_or_no_shared_seed_are_refused_naming_it(tmp_path, test_y, capsys):
    make_run(tmp_path / "runs", test_y, "simplecil", 1, 0.30)
    make_run(tmp_path / "runs", test_y, "tosca", 1, 0.30, order_seed=7)
    make_run(tmp_path / "runs", test_y, "aper", 2, 0.30)
    out = tmp_path / "cmp"
    argv = [str(tmp_path / "runs"), "--bench", "emoji", "--out", str(out), "--pool-class-orders", "--all-pairs"]
    assert compare(capsys, *argv)[0] == 0
    md = (out / "compare.md").read_text()
    assert "not tested: class orders differ (seed 1: class-order seeds 1993 vs 7)" in md
    assert "not tested: no seed in common (2 vs 1)" in md or "not tested: no seed in common (1 vs 2)" in md


def test_rows_with_different_seeds_are_compared_on_the_seeds_they_share(tmp_path, test_y, capsys):
    for seed in (1, 2, 3):
        make_run(tmp_path / "runs", test_y, "simplecil", seed, 0.30)
    make_run(tmp_path / "runs", test_y, "tosca", 2, 0.60)
    out = tmp_path / "cmp"
    assert compare(capsys, str(tmp_path / "runs"), "--bench", "emoji", "--out", str(out))[0] == 0
    md = (out / "compare.md").read_text()
    assert "paired bootstrap over test images, seed 2" in md and "on the 1 seed both rows have (2)" in md
    assert "not tested" not in md and "not paired" not in md


def test_runs_without_predictions_show_no_interval_and_say_why(tmp_path, test_y, capsys):
    make_run(tmp_path / "runs", test_y, "simplecil", 1, 0.30, keep=False)
    make_run(tmp_path / "runs", test_y, "simplecil", 2, 0.30)
    out = tmp_path / "cmp"
    assert compare(capsys, str(tmp_path / "runs"), "--bench", "emoji", "--out", str(out))[0] == 0
    md = (out / "compare.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| emoji"))
    assert "none: no per-image predictions in simplecil-s1" in row and " ± " not in row.split("|")[7]


def test_a_changed_predictions_file_stops_report_and_compare_on_one_line(tmp_path, test_y, capsys):
    run = make_run(tmp_path / "runs", test_y, "simplecil", 1, 0.30)
    make_run(tmp_path / "runs", test_y, "tosca", 1, 0.30)
    data = bytearray((run / P.PREDICTIONS_FILE).read_bytes())
    other = P.from_bytes(bytes(data))
    flipped = dataclasses.replace(other, pred=other.pred[:, ::-1].copy())
    (run / P.PREDICTIONS_FILE).write_bytes(P.to_bytes(flipped))
    for argv in (
        ["compare", str(tmp_path / "runs"), "--bench", "emoji", "--out", str(tmp_path / "c")],
        ["report", str(tmp_path / "runs"), "--out", str(tmp_path / "r"), "--no-tsne"],
    ):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2, err
        first = err.strip().splitlines()[0]
        assert "predictions.npz: sha256" in first and "does not match its record's" in first, err
        assert "Traceback" not in err
