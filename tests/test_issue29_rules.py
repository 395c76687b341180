"""One rule per concept, one message per rule: names, text that reaches a command line or an
environment, environment variable names, hosts. Each rule is checked against an oracle
written here from the rule's own words, and each message says that rule, not another's."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from scepsy_common.errors import NAME_EXPECTED, NAME_MAX, InputError, Name, check_name, validated
from scepsy_opt.ingest.otel import sanitize_name
from scepsy_place.launch.model import (
    ENV_NAME_EXPECTED,
    HOST_EXPECTED,
    TEXT_EXPECTED,
    TEXT_MAX,
    WORD_EXPECTED,
    check_env_name,
    check_text,
)
from scepsy_place.launch.planfile import LaunchSection

# ---------------------------------------------------------------------------------- names

START = set(string.ascii_letters + string.digits + "_")
ALLOWED = START | set(".+:-/")


def stated_name_rule(s: str) -> bool:
    """NAME_EXPECTED, read literally: 1 to 128 characters, letters, digits and _ . + : - in
    parts separated by single /, each part starting with a letter, digit or _."""
    if not 1 <= len(s) <= NAME_MAX or any(c not in ALLOWED for c in s):
        return False
    return all(part and part[0] in START for part in s.split("/"))


class _Named(BaseModel):
    model_config = ConfigDict(strict=True)
    name: Name


_name_like = st.text(st.sampled_from([*sorted(ALLOWED), " ", "\n", "é", "\x00", "$"]),
                     max_size=10)
_long = st.builds(lambda a, n: a * n, st.sampled_from(["a", "a.", "a/"]),
                  st.integers(60, 70))


def test_the_message_states_the_rule_the_oracle_reads():
    assert f"1 to {NAME_MAX} characters" in NAME_EXPECTED
    assert "parts separated by single /" in NAME_EXPECTED
    assert "each part starting with a letter, digit or _" in NAME_EXPECTED


@settings(max_examples=400, derandomize=True, deadline=None)
@given(text=st.one_of(_name_like, _long))
def test_a_name_is_accepted_iff_it_follows_the_stated_rule(text):
    ok = stated_name_rule(text)
    try:
        check_name(text, "f.yaml", "llms")
        accepted = True
    except InputError as exc:
        accepted = False
        assert exc.expected == NAME_EXPECTED
    assert accepted == ok, text
    try:
        validated(_Named, {"name": text}, "f.json")
        accepted = True
    except InputError as exc:
        accepted = False
        # the pattern's words, or (too long) the length the rule states
        assert exc.expected in (NAME_EXPECTED, f"a string of at most {NAME_MAX} characters")
    assert accepted == ok, text


@pytest.mark.parametrize("bad", ["..", ".x", "a/../b", "a/./b", "/a", "a/", "a//b", "-a",
                                 "a\n", "a/.hidden", "x" * (NAME_MAX + 1)])
def test_path_escapes_and_empty_parts_are_not_names(bad):
    with pytest.raises(InputError) as exc:
        check_name(bad, "f.yaml", "name")
    assert "expected a name of 1 to 128 characters" in str(exc.value)


@pytest.mark.parametrize("good", ["rag", "qwen2.5-7b", "meta-llama/Llama-3.1-8B", "a:b+c",
                                  "_x", "org/team/model.v2", "x" * NAME_MAX])
def test_usual_names_stay_names(good):
    assert check_name(good, "f.yaml", "name") == good


@settings(max_examples=300, derandomize=True, deadline=None)
@given(text=st.one_of(st.text(max_size=20), _long, st.text("./a", max_size=300)))
def test_a_sanitized_trace_name_is_always_a_name(text):
    assert stated_name_rule(sanitize_name(text))


# ------------------------------------------------------------- the launch section's strings


def _launch(**change):
    doc = {"command": ["vllm", "serve"], "args": [], "env": {}, "base_port": 8000,
           "health_timeout_s": 60.0, "addresses": {}, "models": {}}
    doc.update(change)
    return doc


@pytest.mark.parametrize("change, field, expected", [
    ({"args": ["--x", "a\nb"]}, "args.1", TEXT_EXPECTED),
    ({"env": {"HF_TOKEN": "a\x1bb"}}, "env.HF_TOKEN", TEXT_EXPECTED),
    ({"env": {"HF_TOKEN": "a\x9bb"}}, "env.HF_TOKEN", TEXT_EXPECTED),
    ({"command": [""]}, "command.0", WORD_EXPECTED),
    ({"command": ["vllm\tserve"]}, "command.0", WORD_EXPECTED),
    ({"env": {"1BAD": "x"}}, "env.1BAD", ENV_NAME_EXPECTED),
    ({"env": {"A-B": "x"}}, "env.A-B", ENV_NAME_EXPECTED),
    ({"addresses": {"n0": "-host"}}, "addresses.n0", HOST_EXPECTED),
    ({"addresses": {"n0": "host name"}}, "addresses.n0", HOST_EXPECTED),
    ({"addresses": {"../n0": "host"}}, "addresses.../n0", NAME_EXPECTED),
    ({"args": ["x" * (TEXT_MAX + 1)]}, "args.0", f"a string of at most {TEXT_MAX} characters"),
])
def test_each_string_field_says_its_own_rule(change, field, expected):
    with pytest.raises(InputError) as exc:
        validated(LaunchSection, _launch(**change), "plan.json", "launch.")
    assert exc.value.field == f"launch.{field}" and exc.value.expected == expected
    assert "\n" not in str(exc.value)
    if expected != NAME_EXPECTED:
        assert "letters, digits and _ . + : -" not in exc.value.expected


@settings(max_examples=300, derandomize=True, deadline=None)
@given(text=st.text(max_size=8))
def test_text_is_accepted_iff_no_character_is_a_control_character(text):
    ok = not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in text)
    try:
        check_text(text, "plan", "env.X")
        accepted = True
    except InputError as exc:
        accepted = False
        assert exc.expected == TEXT_EXPECTED
    assert accepted == ok
    try:
        validated(LaunchSection, _launch(env={"X": text}), "plan.json", "launch.")
        accepted = True
    except InputError as exc:
        accepted = False
        assert exc.expected == TEXT_EXPECTED
    assert accepted == ok


def test_env_names_one_rule():
    for good in ("HF_TOKEN", "_X", "a1"):
        assert check_env_name(good, "plan", "env") == good
    for bad in ("1A", "A-B", "", "A B", "A\n"):
        with pytest.raises(InputError) as exc:
            check_env_name(bad, "plan", "env")
        assert exc.value.expected == ENV_NAME_EXPECTED
