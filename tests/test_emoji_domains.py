"""The embedded domain-incremental benchmark ``emoji-domains``: the shipped file, its loader and its build rules.

The shipped ``clbench/data/emoji_domains.npz`` is read as it is (the properties a domain-incremental run relies
on: the same emoji in every domain, a grouped split, the digest check); the build script's rules are tested on a
tiny fake emoji table, since a real build needs npm and four tarballs (about 250 MB).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clbench.benchmarks import BENCHMARKS, build_benchmark
from clbench.benchmarks.check import check_data
from clbench.benchmarks.emoji_domains import DOMAINS, N_CLASSES, content_digest, data_file, load
from clbench.errors import ClbenchError
from clbench.tools.build_emoji_domains import (
    DOMAINS as BUILD_DOMAINS,
)
from clbench.tools.build_emoji_domains import (
    NOTICE_BEGIN,
    NOTICE_END,
    build_samples,
    code_key,
    collect_groups,
    notice_text,
    select_classes,
    update_notice,
)


@pytest.fixture(scope="module")
def shipped() -> dict[str, np.ndarray]:
    with np.load(data_file(), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


# ----------------------------------------------------------------------------------------------- shipped file
def test_spec_names_four_domains_and_the_embedded_settings():
    spec = BENCHMARKS.get("emoji-domains")
    assert spec.domains == DOMAINS == ("noto", "twemoji", "emojione", "openmoji")
    assert tuple(d.name for d in BUILD_DOMAINS) == DOMAINS
    assert (spec.n_classes, spec.img_size, spec.backbone) == (N_CLASSES, 112, BENCHMARKS.get("emoji").backbone)
    assert not spec.needs_data_root and "CC-BY-SA" in spec.licence and "OpenMoji" in spec.licence
    assert data_file().stat().st_size < 12 * 2**20  # the whole repository travels in 64 MiB


def test_every_domain_holds_the_same_emoji_and_every_class(shipped):
    assert N_CLASSES >= 20
    for split in ("train", "test"):
        y, g, d = shipped[f"{split}_y"], shipped[f"{split}_group"], shipped[f"{split}_domain"]
        per_domain = [sorted(zip(y[d == k].tolist(), g[d == k].tolist(), strict=True)) for k in range(len(DOMAINS))]
        assert all(p == per_domain[0] for p in per_domain[1:]), split  # the same (class, base emoji) list
        for k in range(len(DOMAINS)):
            assert set(y[d == k].tolist()) == set(range(N_CLASSES)), (split, k)
    assert not set(shipped["train_group"].tolist()) & set(shipped["test_group"].tolist())  # grouped split
    assert shipped["train_x"].shape[1:] == (64, 64, 3) and shipped["train_x"].dtype == np.uint8


def test_the_domains_differ_in_style(shipped):
    """The same emoji in two domains is another drawing: mean absolute pixel difference well above zero."""
    x, d = shipped["test_x"].astype(np.int16), shipped["test_domain"]
    for a in range(len(DOMAINS)):
        for b in range(a + 1, len(DOMAINS)):
            assert np.abs(x[d == a] - x[d == b]).mean() > 10, (DOMAINS[a], DOMAINS[b])


def test_loads_in_both_scenarios():
    spec = BENCHMARKS.get("emoji-domains")
    dom = build_benchmark(spec, scenario="domain")
    assert dom.n_tasks == 4 and dom.n_classes == N_CLASSES
    assert dom.image_tasks("train").tolist() == dom.train.domains.tolist()
    assert len(dom.seen_test(0)) * 4 == len(dom.seen_test(3)) == len(dom.test)
    pooled = build_benchmark(spec)  # class-incremental: every domain's images together
    assert pooled.task_sizes == [10] * 5 and len(pooled.train) == len(dom.train)


def test_data_check_finds_no_leak_and_no_empty_class():
    report = check_data("emoji-domains")
    assert report.problems == [] and report.classes_found == N_CLASSES


def test_a_damaged_or_missing_file_is_refused(tmp_path, shipped):
    with pytest.raises(ClbenchError, match="emoji_domains.npz is missing") as e:
        load(tmp_path)
    assert "build_emoji_domains" in (e.value.hint or "")
    arrays = dict(shipped)
    arrays["test_x"] = arrays["test_x"].copy()
    arrays["test_x"][0, 0, 0, 0] ^= 1
    np.savez(tmp_path / "emoji_domains.npz", **arrays)
    with pytest.raises(ClbenchError, match="content digest .* expected"):
        load(tmp_path)
    (tmp_path / "emoji_domains.npz").write_bytes(b"not a zip")
    with pytest.raises(ClbenchError, match="cannot read"):
        load(tmp_path)


def test_the_digest_is_of_the_arrays_not_of_the_zip(tmp_path, shipped):
    """Uncompressed and in another key order, the same arrays load: the check is of content."""
    arrays = {k: shipped[k] for k in reversed(sorted(shipped))}
    np.savez(tmp_path / "emoji_domains.npz", **arrays)
    train, test, names = load(tmp_path)
    assert len(names) == N_CLASSES and train.domains is not None and len(train.domains) == len(train)
    assert content_digest(arrays) == content_digest(shipped)


# ----------------------------------------------------------------------------------------------- build rules
def test_code_key_drops_the_variation_selector():
    assert code_key("0023-fe0f-20e3") == code_key("0023-20E3") == "0023-20E3"
    assert code_key("1F44B-1F3FB") == "1F44B-1F3FB"


def _entry(code: str, sub: str, skins: tuple[str, ...] = ()) -> dict:
    return {
        "unified": code,
        "category": "Cat",
        "subcategory": sub,
        "skin_variations": {s: {"unified": f"{code}-{s}"} for s in skins},
    }


def test_an_emoji_is_kept_only_where_every_domain_draws_it_and_the_split_is_grouped():
    tones = ("1F3FB", "1F3FC")
    table = [_entry(f"A{i}", "hands", tones) for i in range(6)] + [_entry(f"B{i}", "few") for i in range(3)]
    everyone = {code_key(e["unified"]) for e in table} | {f"A{i}-{t}" for i in range(6) for t in tones}
    keys = [everyone, everyone - {"A0-1F3FB"}, everyone - {"A5"}]
    classes = collect_groups(table, keys)
    assert classes["Cat/hands"]["A0"] == ["A0", "A0-1F3FC"] and classes["Cat/hands"]["A5"] == ["A5-1F3FB", "A5-1F3FC"]
    names = select_classes(classes, n_domains=3)
    assert names == ["Cat/hands"]  # 'few' has 3 base emoji (< 4)
    train, test, stats = build_samples(classes, names, n_domains=3)
    assert {s.group for s in train}.isdisjoint({s.group for s in test}) and test
    for split in (train, test):
        by_domain = [sorted((s.group, s.key) for s in split if s.domain == k) for k in range(3)]
        assert by_domain[0] == by_domain[1] == by_domain[2]
    assert stats[0]["test_groups"] >= 1 and stats[0]["train_groups"] >= 1


def test_notice_section_is_appended_once_and_replaced_on_rebuild(tmp_path):
    notice = tmp_path / "NOTICE"
    notice.write_text("embedded emoji attribution\n")
    update_notice(notice)
    update_notice(notice)
    text = notice.read_text()
    assert text.startswith("embedded emoji attribution\n") and text.count(NOTICE_BEGIN) == 1
    assert text.endswith(NOTICE_END + "\n") and "openmoji@17.0.0" in text and "CC-BY-SA 4.0" in text
    notice.write_text(text.replace("CC-BY-SA 4.0", "stale") + "tail\n")
    update_notice(notice)
    again = notice.read_text()
    assert notice_text().strip() in again and again.endswith("tail\n") and "stale" not in again


def test_rebuilding_the_emoji_benchmark_keeps_the_domains_section_of_notice(tmp_path):
    from clbench.tools import build_emoji

    notice = tmp_path / "NOTICE"
    notice.write_text("an older emoji attribution\n")
    update_notice(notice)  # emoji-domains' section appended
    build_emoji.write_notice(notice)  # emoji.npz rebuilt: its text replaced, the other section kept
    build_emoji.write_notice(notice)
    text = notice.read_text()
    assert text.startswith(build_emoji.notice_text()) and "an older emoji attribution" not in text
    assert text.count(NOTICE_BEGIN) == 1 and text.count(NOTICE_END) == 1 and notice_text().strip() in text
    committed = (Path(build_emoji.__file__).resolve().parents[1] / "data" / "NOTICE").read_text()
    assert committed.startswith(build_emoji.notice_text()) and NOTICE_BEGIN in committed


def test_the_shipped_notice_carries_the_section():
    text = (Path(data_file()).parent / "NOTICE").read_text(encoding="utf-8")
    assert notice_text().strip() in text and 'embedded benchmark "emoji"' in text  # both benchmarks attributed
