"""Measure the same-seed spread of the gate's runs across CPUs and precisions, and derive the gate's tolerances.

usage: python reports/gate/spread.py BASE_DIR OTHER_DIR... --labels BASE OTHER... --out reports/gate
       python reports/gate/spread.py --extend reports/gate/tolerances.json RUN_DIR

The second form adds to an existing tolerances file every strategy:profile of RUN_DIR that it lacks, with the
allowance alone (no measured spread: the fp32 difference between CPUs taken as 0, what every measured entry showed),
and lists them under ``allowance_only``.

Each DIR holds one complete set of gate runs (``.ci/gate CLBENCH DIR [flags]``) with its ``calibration.json``. BASE
is the set the reference is written from; each OTHER is compared with it entry by entry. Writes
``spread.json`` (every difference, with the commands and hosts that made each set) and ``tolerances.json`` (the
per-metric tolerances ``clbench check --write-reference --tolerances`` stores in the reference).

Tolerance rule (per strategy:profile and metric): the largest fp32 difference measured between CPUs, in points, plus
an allowance of ALLOWANCE_IMAGES[metric] test images: for a matrix entry, of the smallest task; for the final
accuracy, of the whole test set; for the average incremental accuracy, of each step's seen test images (averaged over
the steps). The allowance covers what the measurement here cannot (other core counts and BLAS code paths on real
CPUs); its size is the largest deviation of the bf16 set from the fp32 one, counted in test images, a perturbation far
larger than any fp32 difference between CPUs (the script checks that the bf16 set fits). The matrix tolerance is
capped below 2 points so that a 2-point change of one task always fails. The gate itself refuses a run at another
precision than the reference's, so bf16 never sets a tolerance directly.
"""


from __future__ import annotations

import argparse
import json
from pathlib import Path

from clbench.gate import check as chk
from clbench.report.collect import collect

ALLOWANCE_IMAGES = {"matrix": 2, "last_acc": 3, "avg_acc": 3}
MATRIX_CAP = 1.9  # points: a 2-point change of one task's accuracy must fail


def load_set(folder: Path) -> dict:
    coll = collect([folder])
    if coll.skipped:
        raise SystemExit(f"{folder}: skipped records: {coll.skipped}")
    calibration, _ = chk.find_calibration([folder])
    calib = chk.calibration_seconds(calibration)
    entries = {}
    for key, runs in chk.group_runs(coll).items():
        (run,) = runs
        rec = run.record.to_dict()
        s = run.summary(key.protocol).to_dict()
        n_test = test_images_per_task(rec)
        entries[f"{key.strategy}:{key.profile}/{key.protocol}"] = {
            "precision": rec["precision"], "matrix": s["accuracy_matrix"], "last_acc": s["last_acc"],
            "avg_acc": s["avg_acc"], "test_images_per_task": n_test,
            "time_ratio": {ph: rec["time_s"][ph] / calib for ph in chk.TIME_PHASES},
            "time_s": rec["time_s"], "command": rec["command"], "cpu_capability": rec["host"]["cpu_capability"],
            "git_revision": rec["git_revision"],
        }
    return {"folder": str(folder), "calibration_s": calib, "calibration": calibration, "entries": entries}


def test_images_per_task(rec: dict) -> list[int]:
    """Test images of each task of the run's split (from the embedded benchmark's labels and the record's class
    order): one image of task j is 100 / n_j points of a matrix entry R[t][j]."""
    import numpy as np

    from clbench.benchmarks.emoji import data_file

    with np.load(data_file(), allow_pickle=False) as z:
        test_y = z["test_y"]
    order = rec["class_order"]  # arrival position -> original label
    counts, start = [], 0
    for size in rec["task_sizes"]:
        labels = order[start:start + size]
        counts.append(int(sum((test_y == c).sum() for c in labels)))
        start += size
    return counts


def compare(base: dict, other: dict) -> dict:
    out = {}
    for name, b in base["entries"].items():
        o = other["entries"].get(name)
        if o is None:
            continue
        cells = [(abs(o["matrix"][t][j] - b["matrix"][t][j]), t, j) for t in range(len(b["matrix"]))
                 for j in range(len(b["matrix"][t]))]
        worst = max(cells)
        n = b["test_images_per_task"]
        out[name] = {
            "matrix_max_abs_points": round(worst[0], 4),
            "matrix_max_abs_images": round(worst[0] * n[worst[2]] / 100, 2),
            "matrix_entries_differing": sum(c[0] > 1e-9 for c in cells), "matrix_entries": len(cells),
            "last_acc_abs_points": round(abs(o["last_acc"] - b["last_acc"]), 4),
            "avg_acc_abs_points": round(abs(o["avg_acc"] - b["avg_acc"]), 4),
            "time_ratio_over_base": {ph: round(o["time_ratio"][ph] / b["time_ratio"][ph], 3)
                                     if b["time_ratio"][ph] > 0 else None for ph in chk.TIME_PHASES},
        }
    return out


def allowance(n: list[int]) -> dict[str, float]:
    """ALLOWANCE_IMAGES in points, for a split of ``n[j]`` test images in task j."""
    k = ALLOWANCE_IMAGES
    seen = [sum(n[:t + 1]) for t in range(len(n))]
    return {"matrix": 100 * k["matrix"] / min(n), "last_acc": 100 * k["last_acc"] / sum(n),
            "avg_acc": sum(100 * k["avg_acc"] / m for m in seen) / len(seen)}


def extend(path: Path, folder: Path) -> dict:
    """Add allowance-only tolerances for every strategy:profile of ``folder``'s runs that ``path`` lacks."""
    tol = json.loads(path.read_text())
    table, added = tol["tolerances"], []
    for run in collect([folder]).runs:
        group = f"{run.strategy}:{run.record.profile}"
        if group in table:
            continue
        a = allowance(test_images_per_task(run.record.to_dict()))
        table[group] = {m: round(a[m], 2) for m in ("matrix", "last_acc", "avg_acc")}
        table[group]["matrix"] = min(table[group]["matrix"], MATRIX_CAP)
        added.append(group)
    tol["tolerances"] = dict(sorted(table.items()))
    tol["allowance_only"] = sorted({*tol.get("allowance_only", []), *added})
    path.write_text(json.dumps(tol, indent=2) + "\n")
    return tol


def tolerances(base: dict, diffs: dict[str, dict], fp32_labels: list[str]) -> dict:
    table: dict[str, dict] = {}
    for name, b in base["entries"].items():
        group = name.split("/")[0]  # strategy:profile (protocols share one tolerance)
        allowance_pts = allowance(b["test_images_per_task"])
        measured = {m: max([diffs[lab][name][key] for lab in fp32_labels if name in diffs[lab]] or [0.0])
                    for m, key in (("matrix", "matrix_max_abs_points"), ("last_acc", "last_acc_abs_points"),
                                   ("avg_acc", "avg_acc_abs_points"))}
        tol = {m: round(measured[m] + allowance_pts[m], 2) for m in measured}
        tol["matrix"] = min(tol["matrix"], MATRIX_CAP)
        prev = table.get(group, {})
        table[group] = {m: max(tol[m], prev.get(m, 0.0)) for m in tol}
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--extend", type=Path, help="a tolerances.json to add allowance-only entries to, from one DIR")
    ap.add_argument("--labels", nargs="+")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--commands", nargs="*", default=[], help="the command that made each set, in order")
    ap.add_argument("--walls", nargs="*", default=[], help="wall.json of each set (gate wall-clock), in order")
    args = ap.parse_args()
    if args.extend:
        (folder,) = args.dirs
        print(json.dumps(extend(args.extend, folder), indent=2))
        return
    if not args.labels or not args.out:
        ap.error("--labels and --out are needed to measure a spread")
    sets = {lab: load_set(d) for lab, d in zip(args.labels, args.dirs)}
    base_label = args.labels[0]
    base = sets[base_label]
    diffs = {lab: compare(base, s) for lab, s in sets.items() if lab != base_label}
    fp32 = [lab for lab, s in sets.items() if lab != base_label
            and {e["precision"] for e in s["entries"].values()} == {"fp32"}]
    walls = [json.loads(Path(w).read_text()) for w in args.walls]
    spread = {
        "what": "same seed (1993), same code, gate runs (ci profiles) on other CPUs/precisions, against the base set",
        "base": base_label,
        "sets": {lab: {"folder": s["folder"], "calibration_s": round(s["calibration_s"], 4),
                       "command": args.commands[i] if i < len(args.commands) else None,
                       "gate_wall": walls[i] if i < len(walls) else None,
                       "cpu_capability": sorted({e["cpu_capability"] for e in s["entries"].values()}),
                       "precision": sorted({e["precision"] for e in s["entries"].values()}),
                       "entries": {n: {"last_acc": e["last_acc"], "avg_acc": e["avg_acc"],
                                       "time_ratio": {k: round(v, 3) for k, v in e["time_ratio"].items()},
                                       "time_s": {k: round(v, 3) for k, v in e["time_s"].items()}}
                                   for n, e in s["entries"].items()}}
                 for i, (lab, s) in enumerate(sets.items())},
        "differences_from_base": diffs,
        "time_ratio_over_base_range": {lab: {ph: [min(v[ph] for v in (d[n]["time_ratio_over_base"] for n in d)
                                                      if v[ph] is not None),
                                                  max(v[ph] for v in (d[n]["time_ratio_over_base"] for n in d)
                                                      if v[ph] is not None)] for ph in chk.TIME_PHASES}
                                       for lab, d in diffs.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "spread.json").write_text(json.dumps(spread, indent=2) + "\n")
    table = tolerances(base, diffs, fp32)
    for lab in set(diffs) - set(fp32):  # the bf16 envelope must fit in the tolerances it sized
        for name, d in diffs[lab].items():
            t = table[name.split("/")[0]]
            for m, key in (("matrix", "matrix_max_abs_points"), ("last_acc", "last_acc_abs_points"),
                           ("avg_acc", "avg_acc_abs_points")):
                if d[key] > t[m]:
                    print(f"warning: {lab} {name} {m} differs by {d[key]} > tolerance {t[m]}")
    tol = {"what": f"per-metric tolerances (points) of the gate, from spread.json: the largest fp32 difference "
                   f"between CPUs plus {ALLOWANCE_IMAGES} test images of the smallest set each metric covers (matrix "
                   f"capped at {MATRIX_CAP}); rule and reasons in reports/gate/spread.py and README.md",
           "from": "reports/gate/spread.json", "fp32_sets_used": fp32,
           "tolerances": table}
    (args.out / "tolerances.json").write_text(json.dumps(tol, indent=2) + "\n")
    print(json.dumps(tol, indent=2))
    for lab, d in diffs.items():
        for n, v in d.items():
            print(f"{lab:14s} {n:28s} matrix {v['matrix_max_abs_points']:6.2f} pts ({v['matrix_max_abs_images']} img)"
                  f" final {v['last_acc_abs_points']:5.2f} avg {v['avg_acc_abs_points']:5.2f} time {v['time_ratio_over_base']}")
    print("calibration s", {lab: round(s["calibration_s"], 3) for lab, s in sets.items()})


if __name__ == "__main__":
    main()
