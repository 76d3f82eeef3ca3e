"""The typed-file layer (clbench.files.typedfile): one declaration per field gives the check, the reader and the
writer."""

from __future__ import annotations

import dataclasses
import json

import pytest

from clbench.files import typedfile as tf


@dataclasses.dataclass
class Point(tf.Typed):
    x: int = tf.json_field(tf.COUNT, tf.is_count, required=True)
    label: str | None = tf.json_field("a string or null", tf.or_none(tf.is_str), where_set=True, default=None)


@dataclasses.dataclass
class Shape(tf.Typed):
    name: str = tf.json_field(tf.NAME, tf.is_name, required=True)
    centre: Point = tf.json_field(part=Point, required=True)
    corners: list[Point] = tf.json_field(
        "a list", tf.list_of(tf.is_object), part=Point, shape="list", default_factory=list
    )
    named: dict[str, Point] = tf.json_field("an object", tf.is_object, part=Point, shape="map", default_factory=dict)
    # added by version 2 of the file: a version-1 file may lack it
    colour: str = tf.json_field(tf.NAME, tf.is_name, required=True, since=2, default="black")
    tags: list[str] = tf.json_field("a list of names", tf.list_of(tf.is_name), where_set=True, default_factory=list)
    scratch: int = 0  # not part of the file
    extra: dict = dataclasses.field(default_factory=dict)


GOOD = {
    "name": "square",
    "centre": {"x": 1},
    "corners": [{"x": 0, "label": "a"}, {"x": 2}],
    "named": {"top": {"x": 3}},
    "colour": "red",
    "unknown": [1, 2],
}


def test_a_sound_file_reads_and_writes_back_the_same_keys_in_order():
    assert not tf.problems(Shape, GOOD)
    shape = Shape.from_dict(GOOD)
    assert shape.centre == Point(1) and shape.corners[0].label == "a" and shape.named["top"].x == 3
    assert shape.extra == {"unknown": [1, 2]} and shape.scratch == 0
    written = shape.to_dict()
    assert json.dumps(written) == json.dumps(GOOD)  # where-set fields left out where unset, unknown keys last
    assert Shape.from_dict(written) == shape


@pytest.mark.parametrize(
    "edit,lines",
    [
        (lambda d: d.pop("name"), ["file lacks name"]),
        (lambda d: d["centre"].pop("x"), ["file lacks centre.x"]),
        (lambda d: d["corners"][1].update(x=-1), ["field corners[1].x is int -1, expected an integer >= 0"]),
        (lambda d: d["named"]["top"].update(label=5), ["field named.top.label is int 5, expected a string or null"]),
        (lambda d: d.update(corners={"x": 1}), ["field corners is dict {'x': 1}, expected a list"]),
        (lambda d: d.update(centre=[1]), ["field centre is list [1], expected an object"]),
        (lambda d: d.pop("colour"), ["file lacks colour"]),
        (
            lambda d: (d.pop("name"), d.update(colour=3)),
            ["file lacks name", "field colour is int 3, expected " + tf.NAME],
        ),
    ],
)
def test_every_problem_is_named_by_its_dotted_field(edit, lines):
    data = json.loads(json.dumps(GOOD))
    edit(data)
    assert tf.problems(Shape, data).lines() == lines


def test_a_field_added_by_a_later_version_may_be_missing_from_an_older_file():
    data = {k: v for k, v in GOOD.items() if k != "colour"}
    assert not tf.problems(Shape, data, version=1)
    assert tf.problems(Shape, data, version=2).missing == ["colour"]
    assert Shape.from_dict(data).colour == "black"


def test_the_first_problem_is_one_line():
    assert tf.problems(Shape, {**GOOD, "centre": {}}).first() == "field centre.x is missing"
    assert tf.problems(Shape, "text").first() == "field file is str 'text', expected an object"
    assert tf.problems(Shape, GOOD).first() is None


def test_an_inline_part_is_checked_at_its_level_after_its_field():
    @dataclasses.dataclass
    class Outer:
        kind: str = tf.json_field(tf.NAME, tf.is_name, required=True, inline=Point)
        after: int = tf.json_field(tf.COUNT, tf.is_count, required=True)

    assert tf.problems(Outer, {"after": 1}).missing == [
        "kind",
        "x",
    ]
    assert [c[0] for c, _ in tf.declared_checks(Outer)] == [("kind",), ("x",), ("label",), ("after",)]


def test_unset_leaves_out_none_and_empty_lists_only():
    assert tf.unset(None) and tf.unset([])
    assert not tf.unset({}) and not tf.unset(False) and not tf.unset(0)


def test_a_check_without_what_it_expects_is_refused_at_declaration():
    with pytest.raises(ValueError, match="says what it expects"):
        tf.json_field(ok=tf.is_count)
    with pytest.raises(ValueError, match="shape"):
        tf.json_field(part=Point, shape="set")
