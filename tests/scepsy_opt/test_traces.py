"""The JSONL trace format: validation errors name the line and the field; write → read is exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy_common.errors import InputError, is_name
from scepsy_opt.traces import (
    MAX_TOKENS,
    CallRecord,
    Trace,
    read_trace,
    request_span_s,
    validate_calls,
    write_trace,
)


def _good() -> list[dict]:
    """A tiny valid RAG request: rewrite → retrieval → two rerank calls → answer."""
    base = {"workflow": "rag", "request_id": "r0"}
    return [
        {**base, "call_id": "c0", "llm": "rewriter", "start_s": 0.0, "end_s": 0.2,
         "input_tokens": 200, "output_tokens": 20, "prefix_tokens": 180},
        {**base, "call_id": "c1", "tool": "retrieval", "parents": ["c0"], "start_s": 0.2,
         "end_s": 0.25},
        {**base, "call_id": "c2", "llm": "reranker", "parents": ["c1"], "start_s": 0.25,
         "end_s": 0.27, "input_tokens": 240, "output_tokens": 1},
        {**base, "call_id": "c3", "llm": "reranker", "parents": ["c1"], "start_s": 0.25,
         "end_s": 0.28, "input_tokens": 260, "output_tokens": 1},
        {**base, "call_id": "c4", "llm": "generator", "parents": ["c2", "c3"], "start_s": 0.28,
         "end_s": 2.5, "input_tokens": 900, "output_tokens": 150, "role": "answer"},
    ]


def _write(tmp_path: Path, rows: list, name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def _error(tmp_path: Path, rows: list) -> InputError:
    with pytest.raises(InputError) as info:
        read_trace(_write(tmp_path, rows))
    return info.value


def test_good_trace_reads(tmp_path):
    trace = read_trace(_write(tmp_path, _good()))
    assert isinstance(trace, Trace)
    assert len(trace.calls) == 5
    assert trace.workflows() == ["rag"]
    assert trace.llms() == ["generator", "reranker", "rewriter"]
    (key, calls), = trace.requests.items()
    assert key == ("rag", "r0")
    assert request_span_s(calls) == pytest.approx(2.5)
    assert trace.calls[4].role == "answer" and trace.calls[1].tool == "retrieval"
    assert trace.calls[1].name == "retrieval" and not trace.calls[1].is_llm


def test_blank_lines_are_skipped_and_lines_are_counted(tmp_path):
    rows = _good()
    rows[3] = {**rows[3], "end_s": 0.1}  # end before start, on file line 5 after a blank line
    with pytest.raises(InputError) as info:
        read_trace(_write(tmp_path, [*rows[:1], "", *rows[1:]]))
    assert info.value.field == "line 5: end_s"


@pytest.mark.parametrize(("change", "field"), [
    (lambda r: r[2].update(colour="red"), "line 3: colour"),
    (lambda r: r[2].update(end_s=0.1), "line 3: end_s"),
    (lambda r: r[2].update(input_tokens=-5), "line 3: input_tokens"),
    (lambda r: r[2].update(output_tokens=-1), "line 3: output_tokens"),
    (lambda r: r[0].update(prefix_tokens=-1), "line 1: prefix_tokens"),
    (lambda r: r[2].update(start_s=-1.0), "line 3: start_s"),
    (lambda r: r[2].update(start_s="soon"), "line 3: start_s"),
    (lambda r: r[2].update(input_tokens=1.5), "line 3: input_tokens"),
    (lambda r: r[2].update(parents="c1"), "line 3: parents"),
    (lambda r: r[2].pop("call_id"), "line 3: call_id"),
    (lambda r: r[2].update(workflow=""), "line 3: workflow"),
    (lambda r: r[4].update(parents=["c2", "c9"]), "line 5: parents"),
    (lambda r: r[4].update(start_s=0.26), "line 5: parents"),  # c3 ends at 0.28
    (lambda r: r[3].update(call_id="c2"), "line 4: call_id"),
    (lambda r: r[1].update(llm="x"), "line 2: top level"),      # both llm and tool
    (lambda r: r[2].pop("llm"), "line 3: top level"),           # neither
])
def test_each_error_names_line_and_field(tmp_path, change, field):
    rows = _good()
    change(rows)
    err = _error(tmp_path, rows)
    assert err.source == str(tmp_path / "t.jsonl")
    assert err.field == field, str(err)
    assert str(err).startswith(f"{tmp_path / 't.jsonl'}: {field}: expected")


def test_both_and_neither_llm_and_tool_say_so(tmp_path):
    rows = _good()
    rows[1]["llm"] = "x"
    assert "exactly one of 'llm' and 'tool'" in str(_error(tmp_path, rows))


def test_dangling_parent_and_late_parent_messages(tmp_path):
    rows = _good()
    rows[4]["parents"] = ["c9"]
    err = _error(tmp_path, rows)
    assert "dangling" in err.expected and err.got == "c9"
    rows = _good()
    rows[2]["start_s"] = 0.1  # before its parent c1 ends (0.25); end_s stays >= start_s
    err = _error(tmp_path, rows)
    assert err.field == "line 3: parents" and err.got == "c1"


def test_same_call_id_in_other_request_or_workflow_is_fine(tmp_path):
    rows = _good()
    other = [{**r, "request_id": "r1"} for r in _good()]
    other_wf = [{**r, "workflow": "rag2"} for r in _good()]
    trace = read_trace(_write(tmp_path, rows + other + other_wf))
    assert len(trace.requests) == 3
    assert trace.workflows() == ["rag", "rag2"]
    assert len(trace.of("rag2").calls) == 5


def test_parent_in_other_request_is_dangling(tmp_path):
    rows = _good()
    rows.append({"workflow": "rag", "request_id": "r1", "call_id": "c7", "llm": "g",
                 "parents": ["c4"], "start_s": 3.0, "end_s": 4.0})
    err = _error(tmp_path, rows)
    assert err.field == "line 6: parents"


@pytest.mark.parametrize("line", [
    "{not json", "[1, 2]", "42", "null", '"a string"', "{\"workflow\": ", "\x00", "[{}]",
    "{\"workflow\": \"rag\"}", "{}", "NaN",
    json.dumps({**_good()[0], "start_s": float("nan")}),
    json.dumps({**_good()[0], "end_s": 1e400}),
])
def test_malformed_lines_never_crash(tmp_path, line):
    err = _error(tmp_path, [_good()[0], line])
    assert err.field.startswith("line 2"), str(err)


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(InputError, match="at least one call"):
        read_trace(_write(tmp_path, ["", "  "]))
    with pytest.raises(InputError, match="existing, readable"):
        read_trace(tmp_path / "nope.jsonl")
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b"\xff\xfe{}\n")
    with pytest.raises(InputError, match="UTF-8"):
        read_trace(bad)


def test_validate_calls_reports_records_without_lines():
    rec = CallRecord("w", "r0", "c0", start_s=1.0, end_s=0.5, llm="m")
    with pytest.raises(InputError) as info:
        validate_calls([rec], source="mine")
    assert info.value.source == "mine" and info.value.field == "record 1: end_s"


def test_to_json_omits_unset_optionals():
    rec = CallRecord("w", "r0", "c0", start_s=0.0, end_s=1.0, tool="search")
    d = json.loads(rec.to_json())
    assert "llm" not in d and "role" not in d and d["tool"] == "search" and d["parents"] == []


@given(st.sampled_from([None, "gen"]), st.sampled_from([None, "plan"]),
       st.lists(st.sampled_from(["c0", "c1", "c2"]), max_size=3, unique=True),
       st.sampled_from([None, "upstream_503"]), st.integers(0, 10**6))
def test_to_json_is_asdict_without_nones(llm, role, parents, error, tokens):
    """The line the recorder writes per call is built from the fields directly (fast path):
    it is the dataclass's fields, None left out, byte for byte."""
    from dataclasses import asdict

    rec = CallRecord("w", "r0", "c3", start_s=0.25, end_s=1.5, llm=llm,
                     tool=None if llm else "search", role=role, parents=tuple(parents),
                     input_tokens=tokens, output_tokens=tokens // 3, error=error)
    want = {k: v for k, v in asdict(rec).items() if v is not None}
    want["parents"] = list(parents)
    assert rec.to_json() == json.dumps(want, sort_keys=True)


# --------------------------------------------------------------------------- round trip

# names as the trace format allows them (NAME_PATTERN): a letter, digit or _ first
_name = st.builds(lambda a, b: a + b, st.sampled_from("aZ09_"),
                  st.text("aZ09_.+:/-", max_size=7)).filter(is_name)
_time = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
_tokens = st.integers(min_value=0, max_value=MAX_TOKENS)


@st.composite
def _requests(draw) -> list[CallRecord]:
    """Valid calls: per request a sequence in time, each call's parents among earlier calls."""
    calls: list[CallRecord] = []
    for r in range(draw(st.integers(1, 3))):
        workflow = draw(_name)
        t = draw(_time)
        ids: list[str] = []
        for n in range(draw(st.integers(1, 6))):
            start = t + draw(st.floats(0, 100, allow_nan=False))
            end = start + draw(st.floats(0, 100, allow_nan=False))
            t = end
            parents = tuple(draw(st.lists(st.sampled_from(ids), unique=True))) if ids else ()
            is_llm = draw(st.booleans())
            call_id = f"c{n}-{draw(_name)}"
            ids.append(call_id)
            calls.append(CallRecord(
                workflow=workflow, request_id=f"r{r}", call_id=call_id, start_s=start,
                end_s=end, llm=draw(_name) if is_llm else None,
                tool=None if is_llm else draw(_name),
                role=draw(st.none() | _name) if is_llm else None, parents=parents,
                input_tokens=draw(_tokens), output_tokens=draw(_tokens),
                prefix_tokens=draw(_tokens)))
    return calls


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=_requests())
def test_write_read_round_trip(tmp_path, calls):
    validate_calls(calls)
    path = tmp_path / "rt.jsonl"
    write_trace(path, calls)
    back = read_trace(path)
    assert back.calls == tuple(calls)
    write_trace(tmp_path / "again.jsonl", back.calls)
    assert (tmp_path / "again.jsonl").read_bytes() == path.read_bytes()
