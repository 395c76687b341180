"""`scepsy trace import` when every span is dropped: the one-line error says how many spans were
read, how many were dropped for each reason with an example span id, and what to do; with
``--report`` the report lists the drops too (written only where no file is yet)."""

from __future__ import annotations

import json
from pathlib import Path

from test_otel_import import BIG, Otlp, sid

from scepsy.cli import main


def _all_dropped(tmp_path: Path) -> Path:
    b = Otlp()
    # a parent cycle: 1 -> 2 -> 1, with an LLM call beneath it
    b.span(1, 2, 0, 10)
    b.span(2, 1, 0, 10)
    b.chat(3, 1, 1, 2, BIG)
    # a bad token count, a NaN-like time, a bad id
    b.chat(4, None, 0, 5, BIG, (-3, 10))
    s = b.chat(5, None, 0, 5, BIG)
    s["startTimeUnixNano"] = "NaN"
    s = b.chat(6, None, 0, 5, BIG)
    s["spanId"] = "xyz"
    # an LLM call of a model nobody mapped, and a span that only groups
    b.chat(7, None, 0, 5, "gpt-4o")
    b.span(8, None, 0, 5, name="POST /run")
    return b.jsonl(tmp_path / "spans.jsonl")


def _args(src: Path, out: Path, *more: str) -> list[str]:
    return ["trace", "import", str(src), "--out", str(out), "--model", f"{BIG}=planner", *more]


def test_every_span_dropped_says_why_per_reason_and_what_to_do(tmp_path, capsys) -> None:
    src, out = _all_dropped(tmp_path), tmp_path / "trace.jsonl"
    assert main(_args(src, out)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not out.exists()
    assert f"no LLM or tool calls in {src}: 8 spans read, none usable as a call" in err
    # the span without a usable id is named by where it is in its file
    assert f"3 malformed (bad ids, times or token counts) (e.g. {src}:line 3 " \
           "resourceSpans[0].scopeSpans[0].spans[1]: spanId: expected 16 hex digits" in err
    assert f"3 in or beneath a parent cycle (e.g. {sid(1)}>{sid(2)})" in err
    assert f"1 LLM calls of unmapped models (e.g. {sid(7)} (model 'gpt-4o'))" in err
    assert f"1 without LLM or tool attributes (structure only) (e.g. {sid(8)} 'POST /run')" in err
    for todo in ("fix what writes those spans", "fix the parent ids", "--model MODEL=LLM",
                 "instrument the LLM and tool calls", "--report REPORT.json"):
        assert todo in err, todo


def test_with_report_the_drops_are_in_the_report(tmp_path, capsys) -> None:
    src, out, rep = _all_dropped(tmp_path), tmp_path / "trace.jsonl", tmp_path / "r.json"
    assert main(_args(src, out, "--report", str(rep))) == 2
    err = capsys.readouterr().err
    assert f"every span id is in {rep}" in err and not out.exists()
    doc = json.loads(rep.read_text())
    assert doc["spans"] == 8 and doc["cycle_dropped"] == 3
    assert {k: v["spans"] for k, v in doc["dropped"].items()} == {
        "malformed": 3, "cycle": 3, "unmapped": 1, "structure": 1}
    assert {m["span"] for m in doc["malformed"]} >= {sid(4), sid(5)}
    assert doc["unmapped"] == {"gpt-4o": {"calls": 1, "spans": [sid(7)]}}
    # an existing report is never replaced by a failed run's
    rep.write_text("keep\n")
    assert main(_args(src, out, "--report", str(rep))) == 2
    assert f"{rep} exists and was left as it is" in capsys.readouterr().err
    assert rep.read_text() == "keep\n"


def test_an_empty_file_says_no_spans(tmp_path, capsys) -> None:
    src = tmp_path / "spans.jsonl"
    src.write_text(json.dumps({"resourceSpans": []}) + "\n")
    assert main(_args(src, tmp_path / "t.jsonl")) == 2
    assert f"no LLM or tool calls in {src}: no spans in it" in capsys.readouterr().err


def test_an_import_with_problems_warns_on_stderr_and_names_strict(tmp_path, capsys) -> None:
    """Some spans usable, some not: the usable ones are imported (exit 0) and one warning line on
    stderr counts the problems and names --strict, with or without --json."""
    b = Otlp()
    b.chat(1, None, 0, 5, BIG)
    b.chat(2, None, 0, 5, BIG, (-3, 10))  # a bad token count: dropped
    src = b.jsonl(tmp_path / "spans.jsonl")
    for more in ((), ("--json",)):
        out = tmp_path / f"trace{len(more)}.jsonl"
        assert main(_args(src, out, *more)) == 0
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "warning: 1 problems in" in err, err
        assert str(src) in err and "malformed 1" in err and "--strict" in err, err
        assert out.exists()
