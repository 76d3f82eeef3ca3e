"""``clbench data check BENCH --data-root DIR``: is this data root ready for a long GPU run?

Every benchmark read from files gets these checks: an ImageFolder tree (:func:`_check_tree`) and the literature's domain
benchmarks, whose loaders list their files (:func:`check_file_sources`); images stored as arrays get the class and
duplicate checks. Checks, in order: the structure the loader checks (the same messages a run stops with in its first
seconds: layout, empty or one-sided class folders, class count), images per split (min / median / max per class), every
image decoded with PIL (``verify()`` and a full decode, which also catches truncated JPEGs), and test images
byte-identical to training images (sha256 of the file bytes: a train/test leak). It prints where the benchmark is
published and the layout it expects. Exit status 0 when nothing is wrong, 1 with the list of problems otherwise.

:func:`check_data` does the work and returns a :class:`DataReport`; :func:`cmd_data_check` prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import textwrap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clbench.benchmarks import BENCHMARKS
from clbench.benchmarks.base import ArraySource, BenchmarkSpec, ImageSource, resolve_data_root
from clbench.benchmarks.folder import (
    DOMAIN_LAYOUT,
    LAYOUT,
    SPLITS,
    FileSource,
    TreeLoader,
    inspect_file,
    scan_tree,
    split_problem,
)
from clbench.errors import ClbenchError
from clbench.files.atomic import atomic_write_json, cache_dir
from clbench.files.escape import plain
from clbench.files.safety import read_bytes

# of what the loaded-array check reports, a change makes every recorded outcome stale (2: a memo vouches for its
# inputs, with a digest)
CHECK_VERSION = 2

MAX_LISTED = 10  # file names listed per problem; the count is always complete
Progress = Callable[[int], None]


@dataclass
class DataReport:
    """What ``clbench data check`` found. ``problems`` empty means the data root is ready."""

    spec: BenchmarkSpec
    root: Path | None
    root_from: str  # "--data-root", "$CLBENCH_X", or "" (embedded / cache)
    tree: bool = False  # an ImageFolder train/test tree (decoded file by file)
    classes_found: int | None = None
    split_stats: dict[str, tuple[int, int, float, int]] = field(default_factory=dict)  # n, min, median, max per class
    n_decoded: int = 0
    n_hashed: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # the run this data is checked for (`data check --init-cls/--increment/--scenario`): (init_cls, increment,
    # given, scenario), given False for the benchmark's default split; None: no split check (before a run)
    split: tuple[int, int, bool, str] | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def _listing(items: list[str]) -> str:
    shown = "".join(f"\n      {plain(x)}" for x in items[:MAX_LISTED])  # one line per item, whatever a name holds
    return shown + (f"\n      ... and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else "")


def _stats(counts: list[int], total: int) -> tuple[int, int, float, int]:
    if not counts:
        return (total, 0, 0.0, 0)
    return (total, int(min(counts)), float(np.median(counts)), int(max(counts)))


def _leaks(hashes: dict[str, list[tuple[str, str]]]) -> tuple[list[str], list[str]]:
    """(test files equal to a train file, files duplicated within one split) from split -> [(name, sha256)]."""
    first_train: dict[str, str] = {}
    within: list[str] = []
    for name, h in hashes.get("train", []):
        if h in first_train:
            within.append(f"{name} = {first_train[h]}")
        else:
            first_train[h] = name
    leaks, seen_test = [], {}
    for name, h in hashes.get("test", []):
        if h in first_train:
            leaks.append(f"{name} = {first_train[h]}")
        if h in seen_test:
            within.append(f"{name} = {seen_test[h]}")
        seen_test.setdefault(h, name)
    return leaks, within


KIND_TEXT = {  # FileFacts.kind -> how the problem reads in the report
    "unreadable": "unreadable file(s)",
    "empty": "empty file(s) (0 bytes)",
    "mismatch": "file(s) whose content does not match their extension (rename them)",
    "frames": "file(s) holding several frames (animations or stacks; a run would read the first frame only)",
    "undecodable": "unreadable image(s) (a run would stop on the first)",
}
NOTE_TEXT = {
    "16-bit": "16-bit image(s): scaled to 8 bits (value / 257), not clipped",
    "transparency": "image(s) with transparency: composited onto white",
    "CMYK": "CMYK image(s): converted to RGB",
}


def _check_files(
    root: Path, files: list[tuple[str, str]], progress: Progress | None, workers: int, decode: bool
) -> tuple[dict[str, list[tuple[str, str]]], dict[str, list[str]], dict[str, int]]:
    """Inspect every (split, relative path) (:func:`~clbench.benchmarks.folder.inspect_file`); return split ->
    [(path, sha256)], the problems by kind and the counts of modes converted with care."""

    hashes: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
    bad: dict[str, list[str]] = {}
    notes: dict[str, int] = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:  # PIL decoding and hashlib release the GIL
        found = pool.map(lambda rel: inspect_file(root / rel, rel, decode), [rel for _, rel in files], chunksize=16)
        for (split, rel), facts in zip(files, found, strict=True):
            if facts.sha256 is not None and facts.kind != "empty":
                hashes[split].append((rel, facts.sha256))
            if facts.problem is not None:
                bad.setdefault(facts.kind or "undecodable", []).append(facts.problem)
            if facts.note is not None:
                notes[facts.note] = notes.get(facts.note, 0) + 1
            if progress:
                progress(1)
    return hashes, bad, notes


def _tree_files(scan) -> list[tuple[str, str]]:
    return [(s, rel) for s in SPLITS for c in sorted(scan.files[s]) for rel in scan.files[s][c]]


def _check_tree(report: DataReport, progress_factory, workers: int, decode: bool = True) -> None:
    spec, root = report.spec, report.root
    scan = scan_tree(root, spec.n_classes, spec.name)
    report.problems += scan.problems
    if scan.link_problems:
        report.problems.append(
            f"{len(scan.link_problems)} symbolic link problem(s) (loops are walked once; links "
            f"that leave the data root make the data differ from what a copy of it holds):"
            f"{_listing(scan.link_problems)}"
        )
    if not scan.files:
        return
    train, test = scan.files["train"], scan.files["test"]
    report.classes_found = len(train)
    expected = f", {spec.n_classes} expected" if spec.n_classes is not None else " (discovered)"
    report.notes.append(f"classes: {len(train)} in train/, {len(test)} in test/{expected}")
    _check_split(report, scan)
    for split in SPLITS:
        counts = [len(v) for v in scan.files[split].values()]
        report.split_stats[split] = _stats(counts, sum(counts))
    if scan.ignored:
        report.notes.append(
            f"ignored {len(scan.ignored)} file(s) that are hidden or not images, e.g. " + ", ".join(scan.ignored[:3])
        )
    files = _tree_files(scan)
    if not files:
        return
    _inspect_files(report, root, files, progress_factory, workers, decode)


def _inspect_files(
    report: DataReport, root: Path, files: list[tuple[str, str]], progress_factory, workers: int, decode: bool
) -> None:
    """Every (split, path relative to ``root``) read, hashed and (``decode``) decoded; unreadable, empty,
    mislabelled and undecodable files and train/test duplicates go into ``report``."""
    what = "decoding and hashing" if decode else "reading and hashing"
    progress = progress_factory(f"{what} {len(files):,} images", len(files))
    hashes, bad, notes = _check_files(root, files, progress, workers, decode)
    report.n_hashed = len(files)
    report.n_decoded = len(files) if decode else 0
    for kind, text in KIND_TEXT.items():
        if bad.get(kind):
            report.problems.append(f"{len(bad[kind])} {text}:{_listing(bad[kind])}")
    for kind, n in notes.items():
        report.notes.append(f"{n} {NOTE_TEXT[kind]}")
    _report_duplicates(report, hashes)


def _is_file_list(train: ImageSource, test: ImageSource) -> bool:
    """Images read from files a loader listed (the literature's domain benchmarks), not an ImageFolder tree."""
    return all(isinstance(s, FileSource) for s in (train, test))


def check_file_sources(
    report: DataReport,
    train: FileSource,
    test: FileSource,
    names: list[str],
    progress_factory,
    workers: int,
    decode: bool,
) -> None:
    """The tree checks of :func:`_check_tree` for a benchmark whose loader lists its files (DomainNet's split
    lists, CORe50's sessions, CDDB's and Office-Home's folders): class count and labels within it, classes without
    images, two listed paths that are one file (a folder linked to another: a session linked to another session),
    and every file read, hashed and (``decode``) decoded, test images equal to training images included. Paths
    that leave the data root never get here: the loader refuses them (:class:`~clbench.benchmarks.
    literature_domains.DomainFileSource`)."""
    if train.root != test.root:
        raise ValueError(f"{train.name} and {test.name}: the splits of one benchmark share one data root")
    _note_class_count(report, names)
    for split, source in (("train", train), ("test", test)):
        bad = [p for p, y in zip(source.paths, source.labels.tolist(), strict=True) if not 0 <= y < len(names)]
        if bad:  # before anything sized by a label is built
            report.problems.append(
                f"{len(bad)} {split} image(s) with a label outside 0 ... {len(names) - 1}:{_listing(bad)}"
            )
            return
        counts = np.bincount(source.labels, minlength=len(names)).tolist() if len(source) else []
        report.split_stats[split] = _stats(counts, len(source))
        empty = [names[c] for c, k in enumerate(counts) if k == 0]
        if empty:
            report.problems.append(f"{len(empty)} class(es) have no {split} images:{_listing(empty)}")
    first: dict[str, str] = {}
    twice = []
    for split, source in (("train", train), ("test", test)):
        real = getattr(source, "real_paths", None) or [os.path.realpath(source.root / p) for p in source.paths]
        for rel, where in zip(source.paths, real, strict=True):
            if where in first:
                twice.append(f"{split}/{rel} = {first[where]} (both are {where})")
            else:
                first[where] = f"{split}/{rel}"
    if twice:
        report.problems.append(
            f"{len(twice)} listed image(s) are a file listed already, through a symbolic link (a folder linked to "
            f"another one: its images would count twice):{_listing(twice)}"
        )
    files = [("train", p) for p in train.paths] + [("test", p) for p in test.paths]
    _inspect_files(report, train.root, files, progress_factory, workers, decode)


def _check_split(report: DataReport, scan) -> None:
    """The split (or the domains) of the run the data is checked for fits the classes found."""
    if scan.domains:
        report.notes.append(f"domains: {', '.join(scan.domains)} (in this order with --scenario domain)")
    if report.split is None:
        return
    init_cls, increment, given, scenario = report.split
    if scenario == "domain":
        if not scan.domains:
            report.problems.append(f"--scenario domain needs domains: this tree has none; expected {DOMAIN_LAYOUT}")
        return
    problem = split_problem(len(scan.files["train"]), init_cls, increment, defaults=not given)
    if problem is not None:
        report.problems.append(problem)


def _array_hashes(source: ImageSource, split: str) -> list[tuple[str, str]]:
    images = getattr(source, "images", None)
    if images is None:
        return []
    return [
        (f"{split}[{i}]", hashlib.sha256(np.ascontiguousarray(images[i]).tobytes()).hexdigest())
        for i in range(len(source))
    ]


def _check_arrays(report: DataReport, loader, progress_factory, workers: int = 1, decode: bool = True) -> None:
    _spec, root = report.spec, report.root
    locate = getattr(importlib.import_module(loader.__module__), "locate", None)
    if root is None and locate is not None and locate(None) is None:
        report.problems.append("not on this machine (clbench downloads no data set): pass --data-root DIR")
        return
    try:
        train, test, names = loader(root)
    except ClbenchError as e:
        report.problems.append(str(e).replace("\n  hint:", ";"))
        return
    if _is_file_list(train, test):
        check_file_sources(report, train, test, names, progress_factory, workers, decode)
        return
    _check_loaded_arrays(report, train, test, names, progress_factory)


def _note_class_count(report: DataReport, names: list[str]) -> None:
    """Notes how many classes the data has, and a problem where the benchmark declares another count."""
    spec = report.spec
    report.classes_found = len(names)
    expected = f", {spec.n_classes} expected" if spec.n_classes is not None else ""
    report.notes.append(f"classes: {len(names)} found{expected}")
    if spec.n_classes is not None and len(names) != spec.n_classes:
        report.problems.append(
            f"benchmark {spec.name!r} should have {spec.n_classes} classes but the data has {len(names)}"
        )


def _check_loaded_arrays(
    report: DataReport, train: ImageSource, test: ImageSource, names: list[str], progress_factory
) -> None:
    _note_class_count(report, names)
    hashes = {}
    for split, source in (("train", train), ("test", test)):
        counts = np.bincount(source.labels, minlength=len(names)).tolist() if len(source) else []
        report.split_stats[split] = _stats(counts, len(source))
        empty = [names[c] for c, k in enumerate(counts) if k == 0]
        if empty:
            report.problems.append(f"{len(empty)} class(es) have no {split} images:{_listing(empty)}")
        progress = progress_factory(f"hashing {split} ({len(source):,} images)", len(source))
        hashes[split] = _array_hashes(source, split)
        report.n_hashed += len(hashes[split])
        if progress:
            progress(len(source))
    report.notes.append("images are stored as arrays: nothing to decode")
    _report_duplicates(report, hashes)


def _report_duplicates(report: DataReport, hashes: dict[str, list[tuple[str, str]]]) -> None:
    leaks, within = _leaks(hashes)
    known = [x for x in leaks if x in report.spec.known_leaks]
    if known:
        report.notes.append(
            f"{len(known)} test image(s) are byte-identical to a training image in the benchmark as "
            f"published (known; kept so that results compare with the published ones), e.g. {known[0]}"
        )
        leaks = [x for x in leaks if x not in report.spec.known_leaks]
    if leaks:
        report.problems.append(
            f"{len(leaks)} test image(s) are byte-identical to a training image (sha256; a "
            f"train/test leak):{_listing(leaks)}"
        )
    if within:
        report.notes.append(
            f"{len(within)} image(s) duplicate another image of the same split (not a leak), e.g. " + within[0]
        )


def check_data(
    bench: str,
    data_root: str | Path | None = None,
    progress_factory: Callable[[str, int], Progress | None] | None = None,
    workers: int | None = None,
    decode: bool = True,
    init_cls: int | None = None,
    increment: int | None = None,
    scenario: str = "class",
) -> DataReport:
    """Check a benchmark's data root; never raises for problems with the data (they are listed in the report).
    ``decode=False``: every check but the full decode of each image (a run decodes them anyway, and stops on the
    first that fails with the same message)."""
    spec = BENCHMARKS.get(bench)  # an unknown name is a usage error: raises with "did you mean"
    root_from = (
        "--data-root" if data_root else (f"${spec.data_env}" if spec.data_env and os.environ.get(spec.data_env) else "")
    )
    given = init_cls is not None or increment is not None
    split = (spec.init_cls if init_cls is None else init_cls, spec.increment if increment is None else increment)
    report = DataReport(spec, None, root_from, split=(*split, given, scenario))
    factory = progress_factory or (lambda description, total: None)
    try:
        report.root = resolve_data_root(spec, data_root)
    except ClbenchError as e:
        report.problems.append(str(e).split("\n")[0])
        return report
    module, _, attr = spec.load.partition(":")
    loader = getattr(importlib.import_module(module), attr)
    report.tree = isinstance(loader, TreeLoader)
    if report.tree:
        _check_tree(report, factory, workers or min(8, os.cpu_count() or 1), decode)
    else:
        _check_arrays(report, loader, factory, workers or min(8, os.cpu_count() or 1), decode)
    return report


# ----------------------------------------------------------------------------------------------- before a run
IGNORE_FLAG = "--ignore-data-problems"


def _first(problem: str) -> str:
    """A report problem on one line: its heading and its first listed item."""
    head, *items = [x.strip() for x in problem.split("\n") if x.strip()]
    return f"{head.rstrip(':')}, e.g. {items[0]}" if items else head


def verdict(report: DataReport, ignore: bool) -> list[str]:
    """Raise for the report's problems, or (``ignore``) return them, one line each, for the log and the record."""
    if not report.problems:
        return []
    where = f" --data-root {report.root}" if report.root else ""
    if not ignore:
        more = len(report.problems) - 1
        raise ClbenchError(
            f"the {report.spec.name} data{f' at {report.root}' if report.root else ''} fails `clbench data check`: "
            f"{_first(report.problems[0])}" + (f" (and {more} more problem{'s' * (more > 1)})" if more else ""),
            f"run `clbench data check {report.spec.name}{where}` for the list; fix the data, or pass {IGNORE_FLAG} "
            "to run anyway (the problems are written into the record)",
        )
    return [_first(p) for p in report.problems]


def check_before_run(bench: str, data_root: str | None, ignore: bool) -> list[str]:
    """The checks of ``clbench data check`` that a run of a benchmark read from files (an ImageFolder tree, or a
    loader whose module says ``LISTS_FILES``: :func:`check_file_sources`) makes before anything loads (all but the
    full decode). Raises a ClbenchError for the first problem unless ``ignore``; returns the problems
    (empty when there are none, or for array benchmarks: :func:`check_loaded` checks those once loaded)."""
    spec = BENCHMARKS.get(bench)
    module, _, attr = spec.load.partition(":")
    loader = getattr(importlib.import_module(module), attr)
    workers = min(8, os.cpu_count() or 1)
    if not isinstance(loader, TreeLoader):
        if not getattr(importlib.import_module(module), "LISTS_FILES", False):
            return []
        root = resolve_data_root(spec, data_root)
        train, test, names = loader(root)  # the lists only (a path out of the root is refused here); no pixel read
        report = DataReport(spec, root, "--data-root")
        check_file_sources(report, train, test, names, lambda d, t: None, workers, decode=False)
        return verdict(report, ignore)
    root = resolve_data_root(spec, data_root)
    loader(root)  # a missing root or a structural problem: the loader's own message, as a run's would be
    report = DataReport(spec, root, "--data-root", tree=True)
    _check_tree(report, lambda d, t: None, workers, decode=False)
    return verdict(report, ignore)


MEMO_FORMAT = "clbench-data-check"
MAX_MEMO_BYTES = 16 * 2**20  # a memo lists problems of at most MAX_LISTED names each: a few kilobytes


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _read_memo(path: Path, vouches: dict) -> list[str] | None:
    """The problems a data-check memo records, or None (then the check is made again) unless it is one: a regular
    file of at most :data:`MAX_MEMO_BYTES`, of :data:`MEMO_FORMAT`, vouching for exactly ``vouches`` (the content
    fingerprints, the spec's class count and known leaks, the class names, the check's version), a list of problem
    lines, and a digest of those that matches (a memo copied from other data, cut short or edited is not used)."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(read_bytes(path, MAX_MEMO_BYTES, "data-check memo"))
    except (ClbenchError, ValueError):
        return None
    if not isinstance(doc, dict) or set(doc) != {"format", "vouches", "problems", "digest"}:
        return None
    problems = doc["problems"]
    if doc["format"] != MEMO_FORMAT or doc["vouches"] != vouches:
        return None
    if not isinstance(problems, list) or not all(isinstance(p, str) for p in problems):
        return None
    if doc["digest"] != _digest({"vouches": vouches, "problems": problems}):
        return None
    return problems


def check_loaded(bench, ignore: bool) -> list[str]:
    """The duplicate check of ``clbench data check`` on a loaded array benchmark (:class:`~clbench.benchmarks.base.
    Benchmark`); benchmarks read from files were checked before loading (:func:`check_before_run`). Its problems
    depend on the images' content only, so they are recorded in the clbench cache under the content
    fingerprints (and what else the check reads: the spec's class count and known leaks, the class names) and read
    back by the next run of the same data, which then never decompresses an image whose features are cached."""
    if not all(isinstance(s, ArraySource) for s in (bench.train, bench.test)):
        return []
    report = DataReport(bench.spec, None, "")
    vouches = {  # what the memo's problems are the problems of
        "bench": bench.spec.name,
        "n_classes": bench.spec.n_classes,
        "known_leaks": list(bench.spec.known_leaks),
        "class_names": list(bench.class_names),
        "train": bench.train.fingerprint(),
        "test": bench.test.fingerprint(),
        "check": CHECK_VERSION,
    }
    key = _digest(vouches)[:24]
    memo = cache_dir() / "data" / f"check-{key}.json"
    known = _read_memo(memo, vouches)
    if known is not None:
        report.problems = known
        return verdict(report, ignore)
    _check_loaded_arrays(report, bench.train, bench.test, bench.class_names, lambda d, t: None)
    with contextlib.suppress(OSError, ClbenchError):
        memo.parent.mkdir(parents=True, exist_ok=True)
        body = {"vouches": vouches, "problems": report.problems}
        atomic_write_json(memo, {"format": MEMO_FORMAT, **body, "digest": _digest(body)})
    return verdict(report, ignore)


# ----------------------------------------------------------------------------------------------- CLI
def add_data_check_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bench", metavar="BENCH", help="benchmark name (see `clbench list`)")
    parser.add_argument("--data-root", help="the data folder to check (default: the benchmark's environment variable)")
    parser.add_argument("--init-cls", type=int, help="the run's classes in the first task (default: the benchmark's)")
    parser.add_argument("--increment", type=int, help="the run's classes per later task (default: the benchmark's)")
    parser.add_argument("--scenario", choices=("class", "domain"), default="class", help="the run's scenario")


def _wrap(label: str, text: str) -> str:
    return textwrap.fill(text, width=110, initial_indent=f"  {label:<11} ", subsequent_indent=" " * 14)


def format_report(r: DataReport) -> str:
    spec = r.spec
    lines = [f"clbench data check {spec.name}: {spec.summary}"]
    root = f"{r.root} (from {r.root_from})" if r.root and r.root_from else str(r.root) if r.root else "none"
    root = plain(root)
    lines.append(_wrap("data root", root))
    if spec.source_info:
        lines.append(_wrap("published", spec.source_info))
    if r.tree:
        n = f"{spec.n_classes} class folders" if spec.n_classes else "any number of class folders"
        lines.append(_wrap("layout", f"{LAYOUT}; {n}"))
    if spec.licence:
        lines.append(_wrap("licence", spec.licence))
    for split, (n, lo, med, hi) in r.split_stats.items():
        lines.append(_wrap(split, f"{n:,} images; per class min {lo:,}, median {med:g}, max {hi:,}"))
    if r.n_decoded:
        lines.append(_wrap("decoded", f"{r.n_decoded:,} images with PIL (verify() and a full decode)"))
    if r.n_hashed:
        lines.append(_wrap("hashed", f"{r.n_hashed:,} images (sha256) to find test images equal to training images"))
    for note in r.notes:
        lines.append(_wrap("note", plain(note)))
    if r.ok:
        lines.append(f"OK: {spec.name} data is ready" + (f" at {plain(r.root)}" if r.root else ""))
    else:
        lines.append(f"{len(r.problems)} problem(s):")
        lines += [f"  {i}. {plain(p, keep_newlines=True)}" for i, p in enumerate(r.problems, 1)]  # listings: escaped
    return "\n".join(lines)


def cmd_data_check(args: argparse.Namespace) -> int:
    """Print the report; 0 when the data root is ready, 1 when it has problems."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
    from rich.progress import Progress as Bar

    with Bar(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:

        def factory(description: str, total: int) -> Progress:  # rich bar on stderr; stdout keeps the report
            task = bar.add_task(description, total=total)
            return lambda n: bar.advance(task, n)

        split = dict(init_cls=args.init_cls, increment=args.increment, scenario=args.scenario)
        report = check_data(args.bench, args.data_root, factory, **split)
    print(format_report(report))
    return 0 if report.ok else 1
