"""Intervals and paired tests for report rows, from the runs' predictions files (:mod:`clbench.records.predictions`).

A row of one run gets the stratified image-bootstrap interval; a row of several seeds tested on the same images the
seed-level one (a t interval over the seeds combined with the shared test-image noise, :mod:`clbench.evaluation.stats`).
A protocol whose predictions depend on the test batch (a ``reference`` protocol: the record's strategy config names its
test-batch size, ``ref_eval_batch`` or ``eval_batch_size``; the batches are the seen test images class by class, in
test-index order within a class, cut every that many images, as the harness forms them) is resampled by whole batches.
Pairs are keyed by the full identity of both rows (benchmark, strategy variant, backbone with its precision, weights,
protocol, seeds). A row whose runs lack predictions (records written before clbench kept them) gets no interval and a
reason, never a made-up one. Two rows are paired (same benchmark and protocol) only when their runs have the same seeds,
and per seed the same class order and test images; otherwise the pair is refused with what differs. A predictions file
that does not match its record's digest stops the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np

from clbench.evaluation import stats
from clbench.records.predictions import Predictions, correctness
from clbench.records.predictions import read as read_predictions
from clbench.report.collect import AccKey, Collection, Run

# strategy-config keys that give a batch-coupled protocol's test-batch size (TOSCA; MOS, L2P, DualPrompt)
BATCH_KEYS = ("ref_eval_batch", "eval_batch_size")
PER_SAMPLE = "per-sample"
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
    seed_sd: float | None = None  # final accuracy, points: the sd over seeds (several seeds)
    image_se: float | None = None  # final accuracy, points: the shared test-image standard error (several seeds)


class Predicted:
    """Loads each run's predictions once, checked against its record's digest and accuracies (a mismatch raises)."""

    def __init__(self) -> None:
        self._cache: dict[Path, Predictions | None] = {}
        self.intervals: dict[tuple[object, ...], RowInterval] = {}  # row_interval's results (a bootstrap is seconds)

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


def batch_size(run: Run, protocol: str) -> int | None:
    """The test-batch size a batch-coupled protocol of ``run`` formed its batches with (None: per-sample)."""
    if protocol == PER_SAMPLE:
        return None
    config = run.record.strategy_config or {}
    for key in BATCH_KEYS:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def batch_blocks(index: np.ndarray, label: np.ndarray, size: int) -> np.ndarray:
    """Each test image's batch id, rows in the order given: the images sorted class by class (test index within a
    class), cut every ``size`` images. The batches of earlier evaluations (fewer classes seen) are prefixes of this
    order, so every earlier batch lies inside one of these."""
    order = np.lexsort((index, label))
    blocks = np.empty(len(index), np.int64)
    blocks[order] = np.arange(len(index)) // size
    return blocks


def row_interval(runs: list[Run], protocol: str, predicted: Predicted) -> RowInterval:
    """The interval of a row: one run (image bootstrap) or several seeds on the same images (seed level); by test
    batches for a batch-coupled protocol. Computed once per row and ``predicted`` (the tables, the leaderboard and
    the figures of one report share it)."""
    key = (tuple((str(r.path), r.run_id) for r in runs), protocol)
    if key not in predicted.intervals:
        predicted.intervals[key] = _row_interval(runs, protocol, predicted)
    return predicted.intervals[key]


def _row_interval(runs: list[Run], protocol: str, predicted: Predicted) -> RowInterval:
    data = [predicted.aligned(r, protocol) for r in runs]
    if any(d is None for d in data):
        missing = [r.run_id for r, d in zip(runs, data, strict=True) if d is None]
        if len(missing) == len(runs):
            return RowInterval(why_not=NO_PREDICTIONS)
        return RowInterval(why_not=f"no per-image predictions in {', '.join(missing)}")
    assert all(d is not None for d in data)
    ok = [d for d in data if d is not None]
    strata = ok[0][2]
    sizes = [batch_size(r, protocol) for r in runs]
    blocks = [None if b is None else batch_blocks(d[1], d[2], b) for d, b in zip(ok, sizes, strict=True)]
    by_batch = f", by whole test batches of {sizes[0]} (block bootstrap)" if sizes[0] is not None else ""
    if len(ok) == 1:
        c = ok[0][0]
        draws = stats.bootstrap_means(c, strata, blocks=blocks[0])  # (B, T)
        method = (
            f"image bootstrap ({'test batches' if blocks[0] is not None else 'within classes'}), 1 seed: "
            "no spread over seeds"
        )
        curve = np.nanmean(c, axis=0)
        last = stats.percentile_interval(float(curve[-1]), draws[:, -1]).scaled(100)
        avg = stats.percentile_interval(float(curve.mean()), draws.mean(axis=1)).scaled(100)
        lo, hi = np.percentile(draws, [2.5, 97.5], axis=0) * 100
        return RowInterval(last, avg, lo.tolist(), hi.tolist(), method)
    if not _same_images(ok):
        return RowInterval(why_not="its seeds were tested on different images or task counts")
    if len(set(sizes)) > 1:
        return RowInterval(why_not="its seeds formed their test batches with different batch sizes")
    c = np.stack([d[0] for d in ok])  # (S, N, T)
    shared: list[np.ndarray] | np.ndarray | None = None
    if blocks[0] is not None:
        ids = [b for b in blocks if b is not None]
        shared = ids[0] if all(np.array_equal(ids[0], b) for b in ids[1:]) else ids
    sl = stats.seed_level(stats.with_average(c), strata, shared)
    method = (
        f"seed level: t over {len(ok)} seeds (sd {100 * sl.seed_sd[-2]:.2f}) + shared test-image noise "
        f"(se {100 * sl.image_se[-2]:.2f}{by_batch})"
    )
    return RowInterval(
        sl.interval(-2).scaled(100),
        sl.interval(-1).scaled(100),
        (100 * sl.lo[:-1]).tolist(),
        (100 * sl.hi[:-1]).tolist(),
        method,
        seed_sd=float(100 * sl.seed_sd[-2]),
        image_se=float(100 * sl.image_se[-2]),
    )


def fmt_interval(value: float | None, interval: stats.Interval | None, nd: int = 2) -> str:
    """``28.66 ± 1.5`` (half the 95 % interval's width, to :data:`clbench.evaluation.stats.INTERVAL_DECIMALS`: the
    second decimal of a 10,000-resample bootstrap endpoint is Monte-Carlo noise) or the bare value where
    there is no interval."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    if interval is None:
        return f"{value:.{nd}f}"
    return f"{value:.{nd}f} ± {interval.half_width:.{stats.INTERVAL_DECIMALS}f}"


def fmt_range(interval: stats.Interval) -> str:
    """``[-5.4, +0.5]``: a signed interval at the printed resolution. An end that is not 0 never prints as 0 (it
    gets the decimals it needs, up to three), so the printed interval excludes 0 exactly when the interval does."""
    return f"[{fmt_end(interval.lo)}, {fmt_end(interval.hi)}]"


def fmt_end(value: float) -> str:
    """One end of a signed interval: :data:`clbench.evaluation.stats.INTERVAL_DECIMALS` decimals, more where fewer
    would print a nonzero end as 0."""
    nd = stats.INTERVAL_DECIMALS
    while value != 0 and float(f"{value:.{nd}f}") == 0 and nd < 3:
        nd += 1
    return f"{value:+.{nd}f}"  # the sign stays that of the value (-0.000 below 0)


# ----------------------------------------------------------------------------------------------- pairs
@dataclass(frozen=True)
class PairRow:
    """A against B on one benchmark and protocol: the difference in final accuracy (points, A minus B). ``key_a``,
    ``key_b``: the full identity of the two rows (their seeds in ``seeds``). ``test``: one seed, the paired (block)
    bootstrap; several, the seed-level test, with the image-level test beside it (``image_test``) and the exact
    sign-flip p over seeds (``sign_flip``). Holm over the pairs of each benchmark and protocol, for each test
    separately; ``*_bound``: the adjusted p is an upper bound (a resampling floor). The all-pairs matrix figure
    reads these; every table of a report reads the study's tests instead (:mod:`clbench.report.study`: one family,
    one p per pair)."""

    bench: str
    protocol: str
    a: str
    b: str
    seeds: list[int]
    test: stats.PairedTest | None = None
    p_holm: float | None = None
    refused: str | None = None  # why the two rows cannot be paired
    key_a: AccKey | None = None
    key_b: AccKey | None = None
    image_test: stats.PairedTest | None = None
    image_refused: str | None = None
    sign_flip: float | None = None
    p_holm_bound: bool = False
    image_p_holm: float | None = None
    image_p_holm_bound: bool = False

    @property
    def significant(self) -> bool | None:
        return None if self.p_holm is None else self.p_holm < ALPHA

    def identity(self, side: str = "a") -> tuple[object, ...]:
        """The row this pair belongs to: its key and seeds (``side`` "a" or "b")."""
        return (self.key_a if side == "a" else self.key_b, tuple(self.seeds))


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
    """Every pair of rows on the same benchmark and protocol (or each row against ``baseline``), tested on the final
    accuracy; p-values Holm-corrected over the tested pairs of each benchmark and protocol (each test separately)."""
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
            row = PairRow(bench, protocol, _label(ka, keys), _label(kb, keys), seeds, key_a=ka, key_b=kb)
            why = pairing_problem(ra, rb)
            result = _test_pair(row, ra, rb, protocol, predicted) if why is None else why
            rows.append(result if isinstance(result, PairRow) else _replace(row, refused=result))
        rows = _holm_column(rows, "test", "p_holm")
        rows = _holm_column(rows, "image_test", "image_p_holm")
        out.extend(rows)
    return out


def _holm_column(rows: list[PairRow], test: str, adjusted_field: str) -> list[PairRow]:
    """Holm over the rows' ``test`` p-values (the rows that have that test): ``adjusted_field`` and its ``_bound``
    flag (a p at its resampling floor stays a bound) set on each."""
    tested = [i for i, r in enumerate(rows) if getattr(r, test) is not None]
    adjusted, bound = stats.holm_bounds(
        [getattr(rows[i], test).p for i in tested], [getattr(rows[i], test).at_floor for i in tested]
    )
    out = list(rows)
    for i, p, is_bound in zip(tested, adjusted, bound, strict=True):
        out[i] = _replace(out[i], **{adjusted_field: float(p), f"{adjusted_field}_bound": bool(is_bound)})
    return out


def _label(key: AccKey, keys: list[AccKey]) -> str:
    several = len({(k.backbone, k.weights) for k in keys}) > 1
    return f"{key.strategy} ({key.backbone})" if several else key.strategy


def _replace(row: PairRow, **changes) -> PairRow:
    from dataclasses import replace

    return replace(row, **changes)


def pair_size(ra: Run, rb: Run, protocol: str) -> int | None:
    """The block of a pair: the smallest run of images both sides' batches keep together (None: per-sample)."""
    import math

    sa, sb = batch_size(ra, protocol), batch_size(rb, protocol)
    if sa is None and sb is None:
        return None
    return math.lcm(sa or 1, sb or 1)


@dataclass(frozen=True)
class PairedFinals:
    """Two sides' final per-image correctness on the seeds they share, ready for a paired test."""

    a: np.ndarray  # (seeds, images): side A's final-task correctness, one row per seed in ``runs_a``'s order
    b: np.ndarray  # (seeds, images): side B's, the same images
    strata: np.ndarray  # (images,): each test image's class
    blocks: list[np.ndarray | None]  # per seed: the batch block of each image (None: per-sample)


def paired_finals(runs_a: list[Run], runs_b: list[Run], protocol: str, predicted: Predicted) -> PairedFinals | str:
    """Each run of ``runs_a`` paired with ``runs_b``'s run of its seed, or why they cannot be paired."""
    by_seed = {r.seed: r for r in runs_b}
    a_final, b_final, blocks = [], [], []
    strata = None
    for run_a in runs_a:
        run_b = by_seed[run_a.seed]
        da, db = predicted.aligned(run_a, protocol), predicted.aligned(run_b, protocol)
        if da is None or db is None:
            return NO_PREDICTIONS
        if not np.array_equal(da[1], db[1]):
            return f"test images differ (seed {run_a.seed})"
        a_final.append(da[0][:, -1])
        b_final.append(db[0][:, -1])
        size = pair_size(run_a, run_b, protocol)
        blocks.append(None if size is None else batch_blocks(da[1], da[2], size))
        strata = da[2] if strata is None else strata
    assert strata is not None
    return PairedFinals(np.stack(a_final), np.stack(b_final), strata, blocks)


def _test_pair(row: PairRow, ra: list[Run], rb: list[Run], protocol: str, predicted: Predicted) -> PairRow | str:
    paired = paired_finals(sorted(ra, key=lambda r: r.seed), rb, protocol, predicted)
    if isinstance(paired, str):
        return paired
    a, b, strata, blocks = paired.a, paired.b, paired.strata, paired.blocks
    if len(a) == 1:
        return _replace(row, test=stats.paired_test(a, b, strata, blocks=blocks[0]))
    ids = [x for x in blocks if x is not None]
    common = None if not ids else ids[0] if all(np.array_equal(ids[0], x) for x in ids[1:]) else None
    seed_test = stats.paired_seed_test(a, b, strata, None if not ids else (common if common is not None else ids))
    sign = stats.sign_flip_p(100 * (a.mean(axis=1) - b.mean(axis=1)))
    if ids and common is None:
        why = "its seeds' test batches differ (class order varies with the seed): no image-level test"
        return _replace(row, test=seed_test, sign_flip=sign, image_refused=why)
    image = stats.paired_test(a, b, strata, blocks=common)
    return _replace(row, test=seed_test, image_test=image, sign_flip=sign)


def p_cell(p: float | None, bound: bool = False) -> str:
    return "-" if p is None else stats.fmt_p(p, bound)


def pairs_frame(rows: list[PairRow]):
    """The paired-test table (display strings)."""
    import pandas as pd

    out = []
    for r in rows:
        cells = {"benchmark": r.bench, "protocol": r.protocol, "A": r.a, "B": r.b, "seeds": _seeds(r.seeds)}
        if r.test is None:
            cells.update({"A - B final acc (points)": "-", "test": f"not paired: {r.refused}"})
            cells.update({"p": "-", "p (Holm)": "-", "differ at 5 %": "-"})
            cells.update({"image-level test": "-", "image p": "-", "image p (Holm)": "-", "sign-flip p": "-"})
        else:
            d = r.test.diff
            cells.update(
                {
                    "A - B final acc (points)": f"{d.value:+.2f} {fmt_range(d)}",
                    "test": f"{r.test.test} ({r.test.conditions})",
                    "p": p_cell(r.test.p, r.test.at_floor),
                    "p (Holm)": p_cell(r.p_holm, r.p_holm_bound),
                    "differ at 5 %": "yes" if r.significant else "no (not significantly different)",
                }
            )
            it = r.image_test
            cells.update(
                {
                    "image-level test": (
                        f"{it.test}, {it.diff.value:+.2f} {fmt_range(it.diff)} ({it.conditions})"
                        if it is not None
                        else (r.image_refused or "-")
                    ),
                    "image p": "-" if it is None else p_cell(it.p, it.at_floor),
                    "image p (Holm)": p_cell(r.image_p_holm, r.image_p_holm_bound),
                    "sign-flip p": "-" if r.sign_flip is None else f"{r.sign_flip:.3g} (floor {_flip_floor(r)})",
                }
            )
        out.append(cells)
    return pd.DataFrame(out)


def _flip_floor(row: PairRow) -> str:
    return f"2/2^{len(row.seeds)} = {2 / 2 ** len(row.seeds):.3g}"
