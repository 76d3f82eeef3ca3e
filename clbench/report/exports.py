"""Machine-readable exports of report tables: CSV and JSON that hold numbers, one column per quantity.

A report table is made for reading (``52.76 ± 2.1``, ``"13,860"``, ``+1.68 [+0.5, +2.8], p 1e-07``). Its export
splits every such cell into numbers: a value with ``±`` gives ``NAME mean`` and ``NAME half-width`` (half the 95 %
interval, as the table prints it); a difference with its interval gives ``NAME``, ``NAME lower``, ``NAME upper`` and,
where the cell has one, ``NAME p`` (``NAME adjusted p`` where the column says the p is Holm-adjusted); a count or a
p-value gives the number, and a p printed as a bound (``< 1e-4``) its ``bound`` column (``<``) beside it. A cell
that holds words (``baseline``, ``not paired``) leaves the numbers empty and keeps its words in ``NAME note``;
columns of words (methods, tests, run ids) stay as they are. The numbers carry the table's printed precision.

Paired tests with the attributes of the study model's (:class:`clbench.report.forest.PairTestLike`) export at full
precision through :func:`pair_tests_frame`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clbench.files.atomic import atomic_write_text as _write_text

if TYPE_CHECKING:
    import pandas as pd

NUMBER = r"[-+−]?(?:(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
PLUS_MINUS = re.compile(rf"^\s*(?P<mean>{NUMBER})\s*±\s*(?P<half>{NUMBER})\s*$")
INTERVAL = re.compile(
    rf"^\s*(?P<value>{NUMBER})\s*\[\s*(?P<lower>{NUMBER})\s*,\s*(?P<upper>{NUMBER})\s*\]"
    rf"(?:\s*,?\s*p\s*(?P<bound>[<≤])?\s*(?P<p>{NUMBER}))?\s*$"
)
PLAIN = re.compile(rf"^\s*(?:p\s*)?(?P<bound>[<≤])?\s*(?P<value>{NUMBER})\s*$")
EMPTY = {"", "-", "–", "nan", "None"}


def _float(text: str) -> float | int:
    """``13,860`` -> 13860 (an int where the text is one), ``−0.5`` -> -0.5."""
    plain = text.replace(",", "").replace("−", "-")
    return int(plain) if re.fullmatch(r"[-+]?[0-9]+", plain) else float(plain)


def _base(column: str) -> str:
    """``final acc %`` of ``final acc % ± CI``; ``Δ final vs SimpleCIL [95 % CI]`` of ``..., Holm p``."""
    name = re.sub(r"\s*±\s*CI$", "", column)
    return re.sub(r",?\s*(Holm\s+)?p$", "", name).strip()


def _parse(value: object) -> dict[str, Any] | None:
    """The quantities of one cell (keys ``mean``/``half-width``, or ``value``/``lower``/``upper``/``p``, or
    ``value``), or None where the cell holds words."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return None if isinstance(value, float) and math.isnan(value) else {"value": float(value)}
    text = str(value)
    if (m := PLUS_MINUS.match(text)) is not None:
        return {"mean": _float(m["mean"]), "half-width": _float(m["half"])}
    if (m := INTERVAL.match(text)) is not None:
        out = {"value": _float(m["value"]), "lower": _float(m["lower"]), "upper": _float(m["upper"])}
        if m["p"] is not None:
            out["p"] = _float(m["p"])
            if m["bound"]:  # "p < 1e-4": the number is a bound, kept beside it
                out["p bound"] = m["bound"]
        return out
    if (m := PLAIN.match(text)) is not None:
        return {"value": _float(m["value"])} | ({"bound": m["bound"]} if m["bound"] else {})
    return None


def _column(values: list[Any]) -> Any:
    """Integers stay integers beside empty cells (pandas' nullable Int64); other numbers are floats."""
    import pandas as pd

    present = [v for v in values if v is not None]
    if present and all(isinstance(v, int) for v in present):
        return pd.array(values, dtype="Int64")
    return pd.array([None if v is None else float(v) for v in values], dtype="Float64")


def numeric_table(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (a report table of display strings) with each numeric column split into numbers (module docstring)."""
    import pandas as pd

    out: dict[str, list[Any]] = {}
    for column in df.columns:
        name = str(column)
        cells = list(df[column])
        parsed = [_parse(v) for v in cells]
        words = [str(v) for v, p in zip(cells, parsed, strict=True) if p is None and str(v).strip() not in EMPTY]
        lists = any(re.fullmatch(r"[0-9]+(\s*,\s*[0-9]+)+", w) for w in words)  # seeds: 1993,1994,1995
        if lists or not any(p is not None for p in parsed):
            out[name] = [None if str(v).strip() in EMPTY else v for v in cells]  # a column of words stays
            continue
        if any(p is not None and "mean" in p for p in parsed):  # a value printed without its interval
            parsed = [{"mean": p["value"]} if p is not None and list(p) == ["value"] else p for p in parsed]
        keys: list[str] = []
        for p in parsed:
            keys += [k for k in (p or {}) if k not in keys]
        base = _base(name)
        adjusted = bool(re.search(r"\bHolm\b|adjusted", name))
        for key in keys:
            if key.endswith("bound"):  # "<" where the printed number is an upper bound (a resampling floor)
                label = f"{name} bound" if key == "bound" else f"{base} {'adjusted p' if adjusted else 'p'} bound"
                out[label] = [(p or {}).get(key) for p in parsed]
                continue
            if key == "value":
                label = name if [k for k in keys if not k.endswith("bound")] == ["value"] else base
            elif key == "p":
                label = f"{base} {'adjusted p' if adjusted else 'p'}"
            else:
                label = f"{base} {key}"
            out[label] = _column([(p or {}).get(key) for p in parsed])
        if words:
            out[f"{base} note"] = [str(v) if p is None and str(v).strip() not in EMPTY else None for v, p in
                                   zip(cells, parsed, strict=True)]  # fmt: skip
    return pd.DataFrame(out)


def table_csv(df: pd.DataFrame) -> str:
    """:func:`numeric_table` of ``df`` as CSV (numbers unquoted, at full float precision; empty where none)."""
    return numeric_table(df).to_csv(index=False)


def _jsonable(value: Any) -> Any:
    import pandas as pd

    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return _jsonable(value.item())
    return value


def table_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """:func:`numeric_table` of ``df`` as JSON-ready records (NaN as null)."""
    return [{k: _jsonable(v) for k, v in row.items()} for row in numeric_table(df).to_dict(orient="records")]


def pair_tests_frame(tests: Sequence[Any]) -> pd.DataFrame:
    """Paired tests (:class:`clbench.report.forest.PairTestLike`) at full precision: one row per pair, one column per
    quantity (difference, lower, upper, p, adjusted p, verdict) beside the pair's ids, labels, seeds and method."""
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "a": t.a,
                "b": t.b,
                "label a": t.label_a,
                "label b": t.label_b,
                "diff": t.diff,
                "lower": t.lo,
                "upper": t.hi,
                "p": t.p,
                "adjusted p": t.p_adj,
                "significant": t.significant,
                "seeds": ",".join(str(s) for s in t.seeds) if not isinstance(t.seeds, str) else t.seeds,
                "method": t.method,
            }
            for t in tests
        ],
        columns=["a", "b", "label a", "label b", "diff", "lower", "upper", "p", "adjusted p", "significant", "seeds",
                 "method"],
    )  # fmt: skip


def write_compare_exports(
    out_dir: Path, table: pd.DataFrame, pairs: pd.DataFrame, meta: str = "", study: dict[str, Any] | None = None
) -> list[Path]:
    """``compare.csv`` (and ``compare_pairs.csv`` where there are pairs) holding numbers, and ``compare.json`` with the
    summary table's records (``table``), the pairs table's (``pairs``), how it was made and, given ``study``
    (:meth:`clbench.report.study.Study.to_dict`), the study's rows, family and tests at full precision; returns
    the paths written."""

    files = [_write_text(out_dir / "compare.csv", table_csv(table))]
    if len(pairs):
        files.append(_write_text(out_dir / "compare_pairs.csv", table_csv(pairs)))
    doc = {"generated_by": meta, "table": table_records(table), "pairs": table_records(pairs) if len(pairs) else []}
    doc.update(study or {})
    files.append(_write_text(out_dir / "compare.json", json.dumps(doc, indent=2, allow_nan=False) + "\n"))
    return files


__all__ = ["numeric_table", "pair_tests_frame", "table_csv", "table_records", "write_compare_exports"]
