"""t-SNE maps of the frozen and adapted test features a run keeps (``features.npz``), one panel per method and the
frozen features, with a fixed seed: the same records give the same picture."""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clbench.errors import ClbenchError
from clbench.features import embeddings
from clbench.features.embeddings import FORMAT, reduce
from clbench.features.embeddings import POINTS as EMBEDDED_POINTS
from clbench.features.embeddings import subsample as pick
from clbench.files.safety import npz_arrays, read_bytes
from clbench.records.features import checked_embeddings
from clbench.report.collect import AccKey, Collection, Run
from clbench.report.figure_base import (
    RC,
    FigureOut,
    _save,
    provenance,
    slug,
)
from clbench.report.figures.style import (
    new_figure,
)
from clbench.report.labels import short_label

TSNE_MAX_POINTS = EMBEDDED_POINTS  # the test images a record keeps (clbench.features.embeddings.POINTS)
TSNE_SEED = 0  # fixed random_state and subsample seed: the same records give the same picture


def load_features(run: Run) -> dict[str, np.ndarray]:
    """``features.npz`` beside the record (:mod:`clbench.features.embeddings`): ``index`` (the subsample's test images),
    ``labels``, ``tasks``, ``frozen`` and maybe ``adapted``, reduced (``format``). A file of an older clbench holds
    the whole test split's unreduced features without ``index``: it is read as the subsample of every image. Read
    bounded (:data:`FEATURES_MAX_BYTES` on disk and expanded, every array header checked before it is allocated:
    :func:`clbench.files.safety.npz_arrays`); ValueError for a file that is not one, or whose sizes differ from its
    record's test split."""
    n_test = (run.record.n_images or {}).get("test")
    # what the record's test split can need: fp16 frozen and adapted features up to FEATURE_WIDTH wide per image
    limit = FEATURES_MAX_BYTES if n_test is None else min(FEATURES_MAX_BYTES, 2**26 + n_test * 4 * FEATURE_WIDTH)
    try:
        raw = read_bytes(run.path / "features.npz", limit, "features")
    except ClbenchError as e:
        raise ValueError(str(e.args[0]).rsplit(": ", 1)[-1]) from None
    data = npz_arrays(raw, limit)
    missing = {"frozen", "labels", "tasks"} - set(data)
    if missing:
        raise ValueError(f"features.npz lacks {', '.join(sorted(missing))}")
    text = {k: str(data.pop(k)) for k in ("format", "embedding") if k in data and data[k].dtype.kind == "U"}
    if "format" in text and text["format"] != FORMAT:
        raise ValueError(f"features.npz holds {text['format']!r} embeddings; this clbench reads {FORMAT!r}")
    if "index" not in data:  # an older clbench's file: every test image, unreduced
        n = len(data["labels"]) if n_test is None else n_test
        data["index"] = np.arange(n)
    n = len(data["index"])
    for name, arr in data.items():
        if name in ("format", "embedding"):
            raise ValueError(f"{name} is {arr.dtype}, expected text")
        if arr.ndim not in (1, 2) or arr.shape[0] != n or arr.dtype.kind not in "iuf":
            raise ValueError(f"{name} is {arr.dtype} {arr.shape}, expected {n} rows of numbers (the test split)")
    index = data["index"]
    if n and (index.min() < 0 or (n_test is not None and index.max() >= n_test)):
        raise ValueError(f"index names test images outside the record's {n_test}")
    return checked_embeddings(run.path / "features.npz", {**data, **{k: np.array(v) for k, v in text.items()}})


FEATURES_MAX_BYTES = 2**30  # frozen and adapted fp16 features of a 100k-image test split at d=2048 stay below
FEATURE_WIDTH = 8192  # widest feature a backbone gives (ViT-g: 1536; ViT-22B: 6144)
TSNE_PANELS = 16  # panels per t-SNE figure (4 x 4: the frozen features and 15 methods); more: further figures


def subsample(n: int, max_points: int = TSNE_MAX_POINTS, seed: int = TSNE_SEED) -> np.ndarray:
    """Sorted indices of at most ``max_points`` of ``n`` points, the same for the same ``n``."""
    return pick(n, max_points, seed)


def tsne_embed(x: np.ndarray, seed: int = TSNE_SEED) -> np.ndarray:
    """(N, k) -> (N, 2): scikit-learn t-SNE of embeddings reduced by :func:`clbench.features.embeddings.reduce`
    (L2-normalised,
    PCA: the cosine geometry the heads see)."""
    from sklearn.manifold import TSNE
    from threadpoolctl import threadpool_limits

    x = x.astype(np.float32)
    perplexity = float(min(30.0, max(2.0, (len(x) - 1) / 3)))
    tsne = TSNE(n_components=2, init="pca", random_state=seed, perplexity=perplexity, learning_rate="auto")
    # One OpenMP thread: on a shared machine, spinning OpenMP threads made a 1000-point t-SNE 7x slower
    # (49 s against 6.6 s on 2 busy cores); at <= 1500 points one thread is fast enough anywhere.
    with threadpool_limits(limits=1, user_api="openmp"):
        return tsne.fit_transform(x)


def _digest(x: np.ndarray) -> str:
    return hashlib.sha256(x.tobytes()).hexdigest()


TSNE_PARALLEL_POINTS = 300  # below this many points per embedding, worker processes cost more than they save


def embed_all(xs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """:func:`tsne_embed` of each distinct array, keyed by its digest. Several large ones run in worker processes,
    one per available core, each on one thread: the same numbers as in this process (one OpenMP thread each, so
    no reduction order depends on the thread count), a report's seven 500-point panels in about half the time
    on two cores."""
    todo = {_digest(x): x for x in xs}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    jobs = min(cores, len(todo))
    if jobs < 2 or max(len(x) for x in todo.values()) < TSNE_PARALLEL_POINTS:
        return {h: tsne_embed(x) for h, x in todo.items()}
    from joblib import Parallel, delayed

    done = Parallel(n_jobs=jobs, backend="loky")(delayed(tsne_embed)(x) for x in todo.values())
    return dict(zip(todo, done, strict=True))


@dataclass
class _TsnePanel:
    """One t-SNE panel: a title, the embedding drawn and each point's task."""

    title: str
    x: np.ndarray  # (n, k) reduced embeddings
    tasks: np.ndarray
    runs: list[Run]


def _tsne_panels(
    runs: Sequence[Run], labels: dict[str, str], max_points: int, notes: list[str]
) -> dict[tuple[str, str], list[_TsnePanel]]:
    """Per (benchmark, backbone): the frozen features' panel first (naming the methods that classify them), then
    one panel per run whose method scores something else; the same test images (the first run's subsample) in
    every panel."""
    out: dict[tuple[str, str], list[_TsnePanel]] = {}
    frozen_users: dict[tuple[str, str], list[str]] = {}
    chosen: dict[tuple[str, str], np.ndarray] = {}
    for run in runs:
        try:
            data = load_features(run)
        except (OSError, ValueError, KeyError) as e:
            notes.append(f"no t-SNE for run {run.run_id}: features.npz is unreadable ({e})")
            continue
        rec = run.record
        group = (rec.bench, f"{rec.backbone} {rec.img_size}px, {run.weights_label}" if rec.img_size else rec.backbone)
        index = data["index"]
        if group not in chosen:  # the images every record of this test split keeps (an older file: all of them)
            kept = embeddings.subsample((rec.n_images or {}).get("test") or len(index))
            chosen[group] = kept[subsample(len(kept), max_points)]
        keep = np.isin(index, chosen[group])
        if keep.sum() != len(chosen[group]):
            notes.append(f"no t-SNE panel for run {run.run_id}: its features.npz holds other test images")
            continue

        arrays = {k: data[k][keep] for k in ("frozen", "adapted") if k in data}
        if "format" not in data:  # an older clbench's file holds unreduced features
            arrays = {k: reduce(a) for k, a in arrays.items()}
        panels = out.setdefault(group, [])
        if not panels:
            panels.append(_TsnePanel("", arrays["frozen"], data["tasks"][keep], [run]))
        if "adapted" in arrays:
            kind = str(data.get("embedding", "adapted features"))
            panels.append(_TsnePanel(f"{labels[run.run_id]}\n{kind}", arrays["adapted"], data["tasks"][keep], [run]))
        else:
            frozen_users.setdefault(group, []).append(labels[run.run_id])
            if run not in panels[0].runs:
                panels[0].runs.append(run)
    for group, panels in out.items():
        users = frozen_users.get(group, [])
        panels[0].title = "frozen features" + (
            f"\n(what {', '.join(users)} classif{'y' if len(users) > 1 else 'ies'})" if users else ""
        )
    return out


def tsne(
    coll: Collection, out_dir: Path, max_points: int = TSNE_MAX_POINTS, main: Collection | None = None
) -> tuple[list[FigureOut], list[str]]:
    """t-SNE of what each method's classifier sees, coloured by task: per benchmark and backbone, the frozen
    features once (the reference panel) and one panel per method of the main table (``main``; default: every run
    configuration) that scores something else, from the first seed whose record kept ``features.npz``; the same
    test images, t-SNE settings and seed in every panel. Returns figures and notes (which rows have none, why)."""
    import matplotlib

    rows = coll if main is None else main
    figures: list[FigureOut] = []
    notes: list[str] = []
    picked: list[Run] = []
    labels: dict[str, str] = {}
    missing: set[AccKey] = set()
    for key, group in rows.acc_groups().items():
        run = next((r for r in sorted(group, key=lambda r: r.seed) if r.has_features()), None)
        if run is None and key._replace(protocol="per-sample") in missing:
            continue  # another protocol of the same runs: named once
        if run is None:
            missing.add(key._replace(protocol="per-sample"))
            name = short_label(key._replace(protocol="per-sample"))
            notes.append(
                f"no t-SNE panel for {name} on {key.bench}: no features.npz beside "
                f"{', '.join(r.run_id for r in group)} (made before records kept them: run it again to draw its panel)"
            )
        elif run.run_id not in labels:  # one run evaluated under two protocols embeds once
            picked.append(run)
            labels[run.run_id] = short_label(key._replace(protocol="per-sample"))
    groups = _tsne_panels(picked, labels, max_points, notes)
    cache = embed_all([p.x for panels in groups.values() for p in panels])
    for (bench, backbone), panels in groups.items():
        # pages of even size (17 panels: 9 and 8, not 16 and a lone panel whose title the narrow page clips)
        per_page = math.ceil(len(panels) / math.ceil(len(panels) / TSNE_PANELS))
        for page, start in enumerate(range(0, len(panels), per_page)):
            chunk = panels[start : start + per_page]
            cols = min(4, len(chunk))
            with matplotlib.rc_context({**RC, "axes.grid": False}):
                fig, axes = new_figure(cols, math.ceil(len(chunk) / cols), 3.4, 3.5)
                n_tasks = int(max(p.tasks.max() for p in chunk)) + 1 if chunk[0].tasks.size else 1
                runs = [r for p in chunk for r in p.runs]
                domain = any((r.record.scenario or "class") == "domain" for r in runs)
                unit = "domain" if domain else "task"  # the domain scenario's tasks are its domains
                cmap = matplotlib.colormaps["tab10" if n_tasks <= 10 else "tab20"]
                for ax, panel in zip(axes, chunk, strict=False):
                    e = cache[_digest(panel.x)]
                    for t in range(n_tasks):
                        m = panel.tasks == t
                        ax.scatter(e[m, 0], e[m, 1], color=cmap(t % cmap.N), s=4, linewidths=0, label=f"{unit} {t + 1}")
                    ax.set_title(panel.title, fontsize=8)
                for ax in axes:
                    ax.set_xticks([])
                    ax.set_yticks([])
                    ax.spines[:].set_visible(False)
                for ax in axes[len(chunk) :]:
                    ax.set_visible(False)
                handles, names = axes[0].get_legend_handles_labels()
                fig.legend(handles, names, loc="outside right upper", frameon=False, markerscale=3, fontsize=7)
                suffix = f" ({page + 1})" if len(panels) > TSNE_PANELS else ""
                title = f"t-SNE of what each method classifies, {bench} ({backbone}){suffix}"
                colour = "the domain they were drawn in" if domain else "the task that brought their class"
                caption = (
                    f"{title}: {len(chunk[0].tasks)} test images (the same in every panel), coloured by {colour}; "
                    "each method's embeddings L2-normalised and reduced to 50 dimensions "
                    f"by PCA when the run was recorded, then scikit-learn t-SNE (init pca, random_state {TSNE_SEED}). "
                    "The first panel is the frozen backbone's features, which the methods it names classify "
                    "directly. " + provenance(runs)
                )
                name = f"tsne_{slug(bench)}_{slug(backbone)}" + (f"_{page + 1}" if suffix else "")
                figures.append(_save(fig, out_dir, name, title, caption, runs))
    return figures, notes
