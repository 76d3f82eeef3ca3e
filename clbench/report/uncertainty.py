"""Intervals and paired tests for report rows, from the runs' predictions files (:mod:`clbench.predictions`).

A row of one run gets the stratified image-bootstrap interval; a row of several seeds tested on the same images the
hierarchical one (:mod:`clbench.stats`). A row whose runs lack predictions (records written before clbench kept
them) gets no interval and a reason, never a made-up one. Two rows are paired (same benchmark and protocol) only
when their runs have the same seeds, and per seed the same class order and test images; otherwise the pair is
refused with what differs. A predictions file that does not match its record's digest stops the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np

from clbench import stats
from clbench.predictions import Predictions, correctness
from clbench.predictions import read as read_predictions
from clbench.report.collect import AccKey, Collection, Run

NO_PREDICTIONS = "no per-image predictions in its records (written before clbench kept them)"
ALPHA = 0.05


@dataclass(frozen=True)
class RowInterval:
    """A row's final and average accuracy with intervals (percent), the per-task band, and how they were made;
    or ``why_not`` with every interval None."""

    last: stats.Interval | None = None
    avg: stats.Interval | None = None
    curve_lo: list[float] | None = None
    curve_hi: list[float] | None = None
    method: str = ""
    why_not: str | None = None


class Predicted:
    """Loads each run's predictions once, checked against its record's digest and accuracies (a mismatch raises)."""

    def __init__(self) -> None:
        self._cache: dict[Path, Predictions | None] = {}

    def get(self, run: Run) -> Predictions | None:
        if run.path not in self._cache:
            ref = run.record.predictions
            self._cache[run.path] = (
                None if ref is None else read_predictions(run.path, ref, expect=run.record.protocols)
            )
        return self._cache[run.path]

    def aligned(self, run: Run, protocol: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(N, T) correctness, test indices and classes, rows in test-index order; None without predictions."""
        preds = self.get(run)
        if preds is None or protocol not in preds.protocols:
            return None
        c, index, label = correctness(preds, protocol)
        order = np.argsort(index, kind="stable")
        return c[order], index[order], label[order]


def _same_images(data: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> bool:
    first = data[0]
    return all(d[1].shape == first[1].shape and np.array_equal(d[1], first[1]) for d in data[1:]) and all(
        d[0].shape == first[0].shape for d in data[1:]
    )


def row_interval(runs: list[Run], protocol: str, predicted: Predicted) -> RowInterval:
    """The interval of a row: one run (image bootstrap) or several seeds on the same images (hierarchical)."""
    data = [predicted.aligned(r, protocol) for r in runs]
    if any(d is None for d in data):
        missing = [r.run_id for r, d in zip(runs, data, strict=True) if d is None]
        if len(missing) == len(runs):
            return RowInterval(why_not=NO_PREDICTIONS)
        return RowInterval(why_not=f"no per-image predictions in {', '.join(missing)}")
    assert all(d is not None for d in data)
    ok = [d for d in data if d is not None]
    strata = ok[0][2]
    if len(ok) == 1:
        c = ok[0][0]
        draws = stats.bootstrap_means(c, strata)  # (B, T)
        method = "image bootstrap (within classes), 1 seed: no spread over seeds"
        curves = np.nanmean(c, axis=0)[None]
    else:
        if not _same_images(ok):
            return RowInterval(why_not="its seeds were tested on different images or task counts")
        c = np.stack([d[0] for d in ok])  # (S, N, T)
        draws = stats.hierarchical_draws(c, strata)
        method = f"hierarchical bootstrap over {len(ok)} seeds and images"
        curves = np.nanmean(c, axis=1)  # (S, T)
    curve = curves.mean(axis=0)
    last = stats.percentile_interval(float(curve[-1]), draws[:, -1]).scaled(100)
    avg = stats.percentile_interval(float(curve.mean()), draws.mean(axis=1)).scaled(100)
    lo, hi = np.percentile(draws, [2.5, 97.5], axis=0) * 100
    return RowInterval(last, avg, lo.tolist(), hi.tolist(), method)


def fmt_interval(value: float | None, interval: stats.Interval | None, nd: int = 2) -> str:
    """``28.66 ± 1.45`` (half the 95 % interval's width) or the bare value where there is no interval."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    return f"{value:.{nd}f}" if interval is None else f"{value:.{nd}f} ± {interval.half_width:.{nd}f}"


# ----------------------------------------------------------------------------------------------- pairs
@dataclass(frozen=True)
class PairRow:
    """A against B on one benchmark and protocol: the difference in final accuracy (points, A minus B)."""

    bench: str
    protocol: str
    a: str
    b: str
    seeds: list[int]
    test: stats.PairedTest | None = None
    p_holm: float | None = None
    refused: str | None = None  # why the two rows cannot be paired

    @property
    def significant(self) -> bool | None:
        return None if self.p_holm is None else self.p_holm < ALPHA


def pairing_problem(a_runs: list[Run], b_runs: list[Run]) -> str | None:
    """What keeps two rows from being paired (seeds, class order, test set), or None."""
    seeds_a, seeds_b = sorted(r.seed for r in a_runs), sorted(r.seed for r in b_runs)
    if seeds_a != seeds_b or len(set(seeds_a)) != len(seeds_a):
        return f"seeds differ ({_seeds(seeds_a)} vs {_seeds(seeds_b)})"
    by_seed = {r.seed: r for r in b_runs}
    for ra in a_runs:
        rb = by_seed[ra.seed]
        if ra.record.class_order != rb.record.class_order:
            return (
                f"class orders differ (seed {ra.seed}: class-order seeds {ra.record.class_order_seed} vs "
                f"{rb.record.class_order_seed})"
            )
        if ra.record.n_images != rb.record.n_images:
            return f"test sets differ (seed {ra.seed}: {ra.record.n_images} vs {rb.record.n_images} images)"
        fa, fb = ra.record.data_fingerprint or {}, rb.record.data_fingerprint or {}
        for split in ("test", "train"):  # a record without the digest is of unknown data: it matches
            if fa.get(split) and fb.get(split) and fa[split] != fb[split]:
                return f"{split} data differ (seed {ra.seed}: {split} digests {fa[split]} vs {fb[split]})"
    return None


def _seeds(seeds: list[int]) -> str:
    return ",".join(map(str, seeds)) or "none"


def paired_rows(coll: Collection, predicted: Predicted, baseline: str | None = None) -> list[PairRow]:
    """Every pair of rows on the same benchmark and protocol (or each row against ``baseline``), tested on the
    final accuracy; p-values Holm-corrected over the tested pairs of each benchmark and protocol."""
    groups = coll.acc_groups()
    by_setting: dict[tuple[str, str], list[AccKey]] = {}
    for key in groups:
        by_setting.setdefault((key.bench, key.protocol), []).append(key)
    out: list[PairRow] = []
    for (bench, protocol), keys in by_setting.items():
        pairs = list(combinations(keys, 2))
        if baseline is not None:
            with_baseline = [(a, b) for a, b in pairs if baseline in (a.strategy, b.strategy)]
            pairs = [(a, b) if b.strategy == baseline else (b, a) for a, b in with_baseline]
        rows: list[PairRow] = []
        for ka, kb in pairs:
            ra, rb = groups[ka], groups[kb]
            seeds = sorted(r.seed for r in ra)
            row = PairRow(bench, protocol, _label(ka, keys), _label(kb, keys), seeds)
            why = pairing_problem(ra, rb)
            result = _test_pair(row, ra, rb, protocol, predicted) if why is None else why
            rows.append(result if isinstance(result, PairRow) else _replace(row, refused=result))
        tested = [i for i, r in enumerate(rows) if r.test is not None]
        adjusted = stats.holm([rows[i].test.p for i in tested])  # type: ignore[union-attr]
        for i, p in zip(tested, adjusted, strict=True):
            rows[i] = _replace(rows[i], p_holm=float(p))
        out.extend(rows)
    return out


def _label(key: AccKey, keys: list[AccKey]) -> str:
    several = len({(k.backbone, k.weights) for k in keys}) > 1
    return f"{key.strategy} ({key.backbone})" if several else key.strategy


def _replace(row: PairRow, **changes) -> PairRow:
    from dataclasses import replace

    return replace(row, **changes)


def _test_pair(row: PairRow, ra: list[Run], rb: list[Run], protocol: str, predicted: Predicted) -> PairRow | str:
    by_seed = {r.seed: r for r in rb}
    a_final, b_final = [], []
    strata = None
    for run_a in sorted(ra, key=lambda r: r.seed):
        da, db = predicted.aligned(run_a, protocol), predicted.aligned(by_seed[run_a.seed], protocol)
        if da is None or db is None:
            return NO_PREDICTIONS
        if not np.array_equal(da[1], db[1]):
            return f"test images differ (seed {run_a.seed})"
        a_final.append(da[0][:, -1])
        b_final.append(db[0][:, -1])
        strata = da[2] if strata is None else strata
    test = stats.paired_test(np.stack(a_final), np.stack(b_final), strata)
    return _replace(row, test=test)


def pairs_frame(rows: list[PairRow]):
    """The paired-test table (display strings)."""
    import pandas as pd

    out = []
    for r in rows:
        cells = {"benchmark": r.bench, "protocol": r.protocol, "A": r.a, "B": r.b, "seeds": _seeds(r.seeds)}
        if r.test is None:
            cells.update({"A - B final acc (points)": "-", "test": f"not paired: {r.refused}"})
            cells.update({"p": "-", "p (Holm)": "-", "differ at 5 %": "-"})
        else:
            d = r.test.diff
            cells.update(
                {
                    "A - B final acc (points)": f"{d.value:+.2f} [{d.lo:+.2f}, {d.hi:+.2f}]",
                    "test": r.test.test,
                    "p": f"{r.test.p:.3g}",
                    "p (Holm)": f"{r.p_holm:.3g}",
                    "differ at 5 %": "yes" if r.significant else "no (not significantly different)",
                }
            )
        out.append(cells)
    return pd.DataFrame(out)
