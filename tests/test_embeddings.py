"""What a record keeps for the report's t-SNE figure (clbench.features.embeddings) and the figure drawn from it: the
same
test images for every method, what each method's classifier scores, the frozen features once."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from clbench.core.catalog import card
from clbench.features import embeddings
from clbench.report.collect import collect
from clbench.report.figures.tsne_maps import _tsne_panels, load_features, tsne
from clbench.run.harness import RunConfig, run

MICRO = dict(bench="emoji", backbone="vit_micro", weights="random", init_cls=18, increment=9, train_per_class=8)


def test_reduction_keeps_the_normalised_geometry_and_its_bytes():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 12)) * rng.uniform(0.1, 9, size=(40, 1))  # norms differ: reduce normalises first
    r = embeddings.reduce(x)
    assert r.dtype == np.float16 and r.shape == (40, 12)  # at most DIMS, and no more than the rank allows
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    want = np.linalg.norm(unit[:, None] - unit[None], axis=-1)
    got = np.linalg.norm(r.astype(np.float64)[:, None] - r.astype(np.float64)[None], axis=-1)
    np.testing.assert_allclose(got, want, atol=2e-3)  # every distance, up to fp16 rounding
    assert embeddings.reduce(x).tobytes() == r.tobytes()  # the same input, the same bytes
    wide = embeddings.reduce(rng.normal(size=(30, 500)))
    assert wide.shape == (30, 30) and embeddings.reduce(rng.normal(size=(80, 500))).shape == (80, embeddings.DIMS)
    with pytest.raises(ValueError, match="must be"):
        embeddings.reduce(np.zeros(5))


def test_the_subsample_depends_on_the_split_size_only():
    a = embeddings.subsample(5000)
    assert len(a) == embeddings.POINTS and np.all(np.diff(a) > 0)
    assert np.array_equal(a, embeddings.subsample(5000)) and np.array_equal(embeddings.subsample(7), np.arange(7))


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """SimpleCIL (classifies the frozen features) and ACIL (scores its buffer layer) on the micro ViT."""
    out = tmp_path_factory.mktemp("emb")
    for name, overrides in (("simplecil", ()), ("acil", (("M", "512"),))):
        record = run(RunConfig(strategy=name, overrides=overrides, out=str(out / name), **MICRO))
        assert record.complete
    return out


def test_a_record_keeps_the_subsample_and_what_its_classifier_scores(two_runs):
    coll = collect([two_runs])
    by = {r.strategy: r for r in coll.runs}
    n_test = by["acil"].record.n_images["test"]
    acil, simple = load_features(by["acil"]), load_features(by["simplecil"])
    for data in (acil, simple):
        assert np.array_equal(data["index"], embeddings.subsample(n_test))
        assert str(data["format"]) == embeddings.FORMAT and data["frozen"].dtype == np.float16
        assert data["frozen"].shape[1] <= embeddings.DIMS
    assert str(acil["embedding"]) == card("acil").embedding and acil["adapted"].shape[1] <= embeddings.DIMS
    assert "adapted" not in simple and str(simple["embedding"]) == "frozen"
    assert np.array_equal(acil["frozen"], simple["frozen"])  # one backbone, one test split: one reference panel
    assert not np.array_equal(acil["adapted"], acil["frozen"])


def test_the_figure_draws_the_frozen_features_once_and_names_who_classifies_them(two_runs, tmp_path):
    coll = collect([two_runs])
    runs = sorted(coll.runs, key=lambda r: r.strategy)
    labels = {r.run_id: r.strategy for r in runs}
    notes: list[str] = []
    panels = _tsne_panels(runs, labels, 200, notes)
    assert not notes and len(panels) == 1
    (group,) = panels.values()
    assert [p.title.split("\n")[0] for p in group] == ["frozen features", "acil"]
    assert "what simplecil classifies" in group[0].title and card("acil").embedding in group[1].title
    assert all(len(p.tasks) == 200 for p in group)  # the same images in every panel
    figs, notes = tsne(coll, tmp_path, 120)
    assert len(figs) == 1 and (tmp_path / figs[0].files["png"]).is_file()
    assert set(figs[0].runs) == {r.run_id for r in runs} and "the same in every panel" in figs[0].caption


def test_a_record_without_features_is_named_not_dropped(two_runs, tmp_path):
    import shutil

    runs = shutil.copytree(two_runs, tmp_path / "runs")  # the module's runs stay whole for the other tests
    (runs / "acil" / "features.npz").unlink()
    figs, notes = tsne(collect([runs]), tmp_path / "rep", 120)
    assert len(figs) == 1  # SimpleCIL's frozen features still make the reference panel
    assert any("no t-SNE panel for ACIL" in n and "no features.npz" in n for n in notes), notes


def test_a_domain_incremental_figure_says_its_colours_are_domains(tmp_path):
    out = tmp_path / "runs" / "acil-domain"
    cfg = RunConfig(strategy="acil", bench="emoji-vendors", scenario="domain", backbone="vit_micro", weights="random")
    record = run(dataclasses.replace(cfg, overrides=(("M", "512"),), train_per_class=8, out=str(out)))
    assert record.complete
    figs, _ = tsne(collect([tmp_path / "runs"]), tmp_path / "rep", 120)
    assert len(figs) == 1 and "coloured by the domain they were drawn in" in figs[0].caption
