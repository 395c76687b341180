"""A number written with an exponent (1e15, -2E-3, .5e3) in a project YAML file is a number,
as in YAML 1.2, not the string PyYAML's YAML 1.1 makes of it; and what the project writes reads
back as written (a string that looks like such a number is quoted)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO
from scepsy_common.files import dump_yaml, parse_yaml
from scepsy_opt.workflows import load_workflow


@settings(max_examples=300, derandomize=True, deadline=None)
@given(value=st.one_of(st.text(), st.from_regex(r"[-+]?[0-9]*\.?[0-9]+[eE][-+]?[0-9]+",
                                                fullmatch=True),
                       st.floats(allow_nan=False), st.integers(), st.booleans(), st.none()))
def test_what_is_written_reads_back_as_written(value):
    doc = {"name": value, "list": [value]}
    assert parse_yaml(dump_yaml(doc, sort_keys=False), "f.yaml") == doc


def test_a_string_like_an_exponent_number_is_quoted():
    assert dump_yaml({"family": "0E0"}) == "family: '0E0'\n"


@settings(max_examples=300, derandomize=True, deadline=None)
@given(x=st.floats(allow_nan=False, allow_infinity=False, width=64),
       form=st.sampled_from(["{:e}", "{:E}", "{:.3e}", "{:.0e}"]),
       plus=st.booleans())
def test_an_exponent_number_reads_as_that_number(x, form, plus):
    text = form.format(x)
    if not plus:
        text = text.replace("e+", "e").replace("E+", "E")
    got = parse_yaml(f"v: {text}\n", "f.yaml")["v"]
    assert isinstance(got, float) and math.isclose(got, float(text), rel_tol=0, abs_tol=0)


@pytest.mark.parametrize("text, value", [("1e15", 1e15), ("-2E-3", -2e-3), (".5", 0.5),
                                         (".5e3", 500.0), ("1.0e15", 1e15), ("12", 12),
                                         ("1_000", 1000)])
def test_usual_numbers(text, value):
    got = parse_yaml(f"v: {text}\n", "f.yaml")["v"]
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("text", ["1e", "e5", "1e1.5", "1.2.3e4", "'1e15'", "v1e5"])
def test_what_is_not_a_number_stays_a_string(text):
    assert isinstance(parse_yaml(f"v: {text}\n", "f.yaml")["v"], str)


def test_a_workflow_with_exponent_numbers_loads(tmp_path):
    src = (REPO / "datasets" / "workflows" / "rag.yaml").read_text()
    old = "rerank_k: {kind: poisson, mean: 20, min: 5, max: 40}"
    assert old in src
    path = tmp_path / "wf.yaml"
    path.write_text(src.replace(old, "rerank_k: {kind: poisson, mean: 2e1, min: 5, max: 4e1}"))
    spec = load_workflow(path)
    assert spec.name == "rag"
