"""The published results table: every carried method has a row with its source, rows are checked when read, a
measured cell finds its published values, and each row's command is a valid ``clbench run``."""

from __future__ import annotations

import shlex
from types import SimpleNamespace

import pytest
from cli_checks import run_cli

from clbench.errors import ClbenchError
from clbench.published import Published, beside, command, load, published_for, read

IN21K = "vit_base_patch16_224.augreg_in21k"
HEADER = "method,benchmark,init_cls,increment,backbone,average,final,paper,table,source,status\n"


def test_every_carried_method_has_a_row_with_a_source():
    from clbench.core.catalog import STRATEGIES

    rows = load()
    assert {r.method for r in rows} == set(STRATEGIES.names())
    assert all(r.source and r.paper for r in rows)
    assert any(r.status == "verified" for r in rows)


@pytest.mark.parametrize(
    "line,needle",
    [
        ("nomethod,cifar100,10,10,IN21K,90,80,P,t,s,secondary", "nomethod"),
        ("mos,nobench,10,10,IN21K,90,80,P,t,s,secondary", "nobench"),
        ("mos,cifar100,10,10,IN21K,190,80,P,t,s,secondary", "not an accuracy in percent"),
        ("mos,cifar100,10,10,IN21K,90,80,P,t,s,guessed", "status 'guessed'"),
        ("mos,cifar100,10,10,IN21K,,,P,t,s,secondary", "exactly when its status is not 'missing'"),
        ("mos,cifar100,10,10,IN21K,90,,P,t,s,missing", "exactly when its status is not 'missing'"),
    ],
)
def test_a_bad_row_is_refused_naming_its_line(line, needle):
    with pytest.raises(ClbenchError, match="line 2") as e:
        read(HEADER + line.replace("IN21K", IN21K))
    assert needle in str(e.value)


def test_a_measured_cell_finds_its_published_values():
    (row,) = [r for r in published_for("mos", "cifar100", (5, 5), IN21K) if r.status == "verified"]
    assert (row.average, row.final, row.split) == (93.30, 89.25, "B0 Inc5")
    assert published_for("mos", "cifar100", (5, 5), "vit_base_patch16_224") == []  # another backbone
    assert published_for("mos", "cifar100", (10, 5), IN21K) == []  # another split
    assert published_for("simplecil", "cifar100", (10, 10), "vit_base_patch16_224") == []  # missing: no value


def test_beside_puts_the_mean_measured_cell_next_to_the_published_one():
    def rec(seed_acc, sizes=(5,) * 20, scenario=None, backbone=IN21K):
        return SimpleNamespace(
            strategy="mos", bench="cifar100", task_sizes=list(sizes), backbone=backbone, scenario=scenario,
            avg_acc=seed_acc + 4, last_acc=seed_acc,
        )  # fmt: skip

    rows = [
        Published("mos", "cifar100", 5, 5, IN21K, 93.3, 89.25, "MOS", "log", "src", "verified"),
        Published("mos", "cifar100", 10, 10, IN21K, 93.8, 90.2, "MIN", "table 1", "src", "secondary"),
    ]
    records = [rec(80.0), SimpleNamespace(record=rec(82.0)), rec(70.0, sizes=(10,) * 10, backbone="other")]
    records.append(rec(50.0, scenario="domain"))
    (out,) = beside(records, rows)
    assert out["seeds"] == 2 and out["measured final"] == 81.0 and out["measured average"] == 85.0
    assert (out["published final"], out["published average"], out["split"]) == (89.25, 93.3, "B0 Inc5")


def test_each_row_has_a_command_that_clbench_run_parses():
    from clbench.cli import build_parser

    parser = build_parser(only="run")
    for row in load():
        words = shlex.split(command(row))
        assert words[:2] == ["clbench", "run"]
        args = parser.parse_args([w.replace("DIR", "/data") for w in words[1:]])
        assert (args.strategy, args.bench, args.init_cls, args.increment, args.backbone) == (
            row.method, row.benchmark, row.init_cls, row.increment, row.backbone
        )  # fmt: skip


def test_the_command_prints_the_table_and_the_commands(capsys):
    code, out, _ = run_cli(["published", "--method", "tosca", "--commands"], capsys)
    assert code == 0
    assert "| tosca  | cifar100" in out and "approximate" in out
    assert "clbench run --strategy tosca --bench omnibenchmark --data-root DIR --init-cls 30" in out
    code, _, err = run_cli(["published", "--method", "tosac"], capsys)
    assert code == 2 and "tosca" in err  # did you mean


def test_a_report_shows_the_published_value_beside_the_measured_cell(tmp_path, monkeypatch):
    """On the record fixtures (SimpleCIL, micro ViT, emoji B0 Inc6, three seeds), with a published table that holds
    that cell: the report gains a "Published results" section with both values; without it, no such section."""
    from pathlib import Path

    from clbench import published
    from clbench.report import build
    from clbench.report.collect import collect

    runs = Path(__file__).parent / "fixtures" / "records" / "simplecil"
    cell = Published("simplecil", "emoji", 6, 6, "vit_micro", 55.5, 44.25, "A paper", "table 9", "src", "secondary")
    monkeypatch.setattr(build, "beside", lambda records: published.beside(records, rows=[cell]))
    build.write_report(collect([runs]), tmp_path / "with", with_tsne=False)
    text = (tmp_path / "with" / "README.md").read_text()
    assert "Published results" in text and "44.25" in text and "A paper, table 9 (secondary)" in text
    monkeypatch.setattr(build, "beside", lambda records: published.beside(records, rows=[]))
    build.write_report(collect([runs]), tmp_path / "without", with_tsne=False)
    assert "Published results" not in (tmp_path / "without" / "README.md").read_text()
