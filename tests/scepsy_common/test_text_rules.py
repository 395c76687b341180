"""One rule per concept, one message per rule: names, text that reaches a command line or an
environment, environment variable names, hosts. Each rule is checked against an oracle
written here from the rule's own words, and each message says that rule, not another's."""

from __future__ import annotations

import json
import re
import socket
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from conftest import REPO, run_cli
from scepsy_common.errors import NAME_EXPECTED, NAME_MAX, InputError, Name, check_name, validated
from scepsy_common.net import URL_EXPECTED, check_url
from scepsy_opt.ingest.otel import sanitize_name
from scepsy_serve.launch.launchplan import (
    ENV_NAME_EXPECTED,
    HOST_EXPECTED,
    TEXT_EXPECTED,
    TEXT_MAX,
    WORD_EXPECTED,
    check_env_name,
    check_text,
)
from scepsy_serve.launch.planfile import LaunchSection

# ---------------------------------------------------------------------------------- names

START = set(string.ascii_letters + string.digits + "_")
ALLOWED = START | set(".+:-/")


def stated_name_rule(s: str) -> bool:
    """NAME_EXPECTED, read literally: 1 to 128 characters, ASCII letters, digits and _ . + : -
    in parts separated by single /, each part starting with an ASCII letter, digit or _."""
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
    assert "each part starting with an ASCII letter, digit or _" in NAME_EXPECTED
    assert "ASCII letters, digits and _ . + : -" in NAME_EXPECTED


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
    ({"args": ["--x", "a\nb"]}, "args[1]", TEXT_EXPECTED),
    ({"env": {"HF_TOKEN": "a\x1bb"}}, "env.HF_TOKEN", TEXT_EXPECTED),
    ({"env": {"HF_TOKEN": "a\x9bb"}}, "env.HF_TOKEN", TEXT_EXPECTED),
    ({"command": [""]}, "command[0]", WORD_EXPECTED),
    ({"command": ["vllm\tserve"]}, "command[0]", WORD_EXPECTED),
    ({"env": {"1BAD": "x"}}, "env.1BAD", ENV_NAME_EXPECTED),
    ({"env": {"A-B": "x"}}, "env.A-B", ENV_NAME_EXPECTED),
    ({"addresses": {"n0": "-host"}}, "addresses.n0", HOST_EXPECTED),
    ({"addresses": {"n0": "host name"}}, "addresses.n0", HOST_EXPECTED),
    ({"addresses": {"../n0": "host"}}, "addresses.../n0", NAME_EXPECTED),
    ({"args": ["x" * (TEXT_MAX + 1)]}, "args[0]", f"a string of at most {TEXT_MAX} characters"),
])
def test_each_string_field_says_its_own_rule(change, field, expected):
    with pytest.raises(InputError) as exc:
        validated(LaunchSection, _launch(**change), "plan.json", "launch.")
    assert exc.value.field == f"launch.{field}" and exc.value.expected == expected
    assert "\n" not in str(exc.value)
    if expected != NAME_EXPECTED:
        assert "letters, digits and _ . + : -" not in exc.value.expected


@pytest.mark.parametrize("name", ["кластер", "modèle", "名前"])
def test_a_non_ascii_letter_is_refused_in_words_that_say_so(name):
    with pytest.raises(InputError) as exc:
        check_name(name, "cluster.yaml", "name")
    assert "ASCII letters" in str(exc.value)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(value=st.one_of(st.text(min_size=0, max_size=300), st.integers(-10**400, 10**400),
                       st.lists(st.integers(), max_size=60)))
def test_a_long_bad_value_is_quoted_shortened(value):
    from scepsy_common.errors import GOT_MAX
    message = str(InputError("f.yaml", "name", "a name", value))
    assert len(message) <= len("f.yaml: name: expected a name (got )") + GOT_MAX + 40
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= GOT_MAX:
        assert message.endswith(f"(got {value!r})")


def test_a_5000_character_name_is_not_echoed_in_full():
    with pytest.raises(InputError) as exc:
        check_name("a" * 5000, "cluster.yaml", "name")
    assert len(str(exc.value)) < 500 and "(5000 characters)" in str(exc.value)
    assert exc.value.got == "a" * 5000


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


# ------------------------------------------------------------------------------ URLs, ports

RAG_YAML = str(REPO / "datasets" / "workflows" / "rag.yaml")


def _routes(tmp_path, url: str):
    from scepsy_serve.launch.routes import Endpoint, Routes

    llms = ("rewriter", "reranker", "generator")
    path = tmp_path / "routes.json"
    path.write_text(Routes({"rag": {m: (Endpoint(url, m, 1.0, 0),) for m in llms}}).dumps())
    return path


@settings(max_examples=200, derandomize=True, deadline=None)
@given(port=st.integers(-5, 200_000), scheme=st.sampled_from(["http", "https", "ftp"]))
def test_a_url_is_accepted_iff_http_with_a_port_in_range(port, scheme):
    url = f"{scheme}://127.0.0.1:{port}/v1"
    ok = scheme in ("http", "https") and 1 <= port <= 65535
    try:
        check_url(url, "--upstream")
        accepted = True
    except InputError as exc:
        accepted = False
        assert exc.expected == URL_EXPECTED and exc.source == "--upstream"
    assert accepted == ok


@pytest.mark.parametrize("bad", ["http://127.0.0.1:99999/v1", "http://127.0.0.1:0/v1",
                                 "http://:8000/v1", "http://h:8000/v1?x=1", "http://h:port/v1"])
def test_drive_refuses_a_route_with_a_bad_url_naming_file_and_field(tmp_path, bad):
    routes = _routes(tmp_path, bad)
    code, out, err = run_cli("drive", "--workflow", RAG_YAML, "--routes", str(routes),
                             "--rate", "1", "--requests", "1")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert str(routes) in err and "url" in err and "port in 1..65535" in err


def test_a_failed_drive_call_says_why_and_where(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    code, out, _ = run_cli("drive", "--workflow", RAG_YAML, "--routes",
                           str(_routes(tmp_path, url)), "--rate", "50", "--requests", "2",
                           "--connect-timeout", "2")
    assert code == 1
    why = [ln for ln in out.splitlines() if ln.startswith("connection: e.g. ")]
    assert len(why) == 1 and f"at {url}/completions" in why[0] and "LLM rewriter" in why[0]


@pytest.mark.parametrize("flag, value", [("--upstream", "http://127.0.0.1:99999"),
                                         ("--upstream-for", "m=http://127.0.0.1:70000/v1"),
                                         ("--upstream", "127.0.0.1:8000")])
def test_record_refuses_a_bad_upstream_before_listening(tmp_path, flag, value):
    out = tmp_path / "t.jsonl"
    code, _, err = run_cli("record", "--listen", "127.0.0.1:0", flag, value, "--out", str(out))
    assert code == 2 and flag in err and "port in 1..65535" in err
    assert not out.exists()


# ------------------------------------------------------------------- numbers, repeated flags

SHOP = str(REPO / "datasets" / "clusters" / "shop-h100-l4.yaml")
PLAN = ("plan", "--workflow", RAG_YAML, "--cluster", SHOP, "--objective", "min-cost",
        "--trace-requests", "50")


@pytest.mark.parametrize("args, words", [
    (["--target", "4", "--price", "H100-80GB=1e300"], ["--price", "1000000 USD"]),
    (["--target", "4", "--price", "L4=1e-300"], ["--price", "0.000001"]),
    (["--target", "4", "--price", "L4=nan"], ["--price"]),
    (["--target", "4", "--price", "L4=1", "--price", "l4=2"], ["--price", "l4", "twice"]),
    (["--target", "rag=1", "--target", "rag=2"], ["--target", "workflow rag"]),
    (["--target", "1", "--target", "2"], ["--target", "the total"]),
    (["--target", "4", "--latency-bound", "rag=2", "--latency-bound", "rag=3"],
     ["--latency-bound", "workflow rag"]),
    (["--target", "4", "--gap", "nan"], ["--gap"]),
])
def test_plan_refuses_absurd_numbers_and_repeated_flags(tmp_path, args, words):
    out = tmp_path / "plan.json"
    code, _, err = run_cli(*PLAN, "--out", str(out), *args)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert all(w in err for w in words), err
    assert not out.exists()


def test_a_cluster_file_price_follows_the_same_rule(tmp_path):
    from scepsy_opt.cluster import PRICE_EXPECTED, parse_cluster

    for usd in (1e300, 1e-300, -1.0):
        doc = {"name": "c", "pools": [{"gpu": "L4", "nodes": 1, "gpus_per_node": 1,
                                       "price_per_hour": usd}]}
        with pytest.raises(InputError) as exc:
            parse_cluster(doc, "c.yaml")
        assert exc.value.field == "pools[0].price_per_hour"
        if usd > 0:
            assert exc.value.expected == PRICE_EXPECTED


@pytest.mark.parametrize("args, flag", [(["--input", "nan"], "--input"),
                                        (["--output", "inf"], "--output"),
                                        (["--input", "1e308"], "--input")])
def test_profile_show_refuses_numbers_out_of_range_naming_the_flag(args, flag):
    code, out, err = run_cli("profile", "show", "--model", "qwen2.5-7b", "--gpu", "A100-80GB",
                             *args)
    assert code == 2 and out == "" and flag in err and "expected" in err


def test_an_allocation_naming_an_llm_no_workflow_calls_is_refused():
    alloc = str(REPO / "datasets" / "allocations" / "rag-beam-4gpu.yaml")
    for cmd in ("predict", "simulate"):
        code, _, err = run_cli(cmd, "--workflow", RAG_YAML, "--allocation", alloc,
                               "--rate", "1")
        assert code == 2 and "llms.prm" in err and "generator, reranker, rewriter" in err


@pytest.mark.parametrize("objective", ["min-cost", "min-latency"])
@pytest.mark.parametrize("highs", ["unbounded", "model_error", "solve_error"])
def test_a_solver_failure_is_reported_as_itself_not_as_a_time_limit(
        tmp_path, monkeypatch, objective, highs):
    """HiGHS ending neither optimal, infeasible nor at a limit is named with its status (exit 2),
    never reported as a time limit that did not happen; nothing is written."""
    from scepsy.cli import main
    from scepsy_opt.planning import milp

    monkeypatch.setattr(milp, "_status", lambda prob: (highs, float("inf"), float("inf")))
    if objective == "min-cost":
        from scepsy_opt.planning import mincost
        monkeypatch.setattr(mincost, "_status", milp._status)
    out = tmp_path / "plan.json"
    args = [*PLAN[:5], "--objective", objective, "--trace-requests", "50", "--target", "4",
            "--out", str(out)]
    if objective == "min-cost":
        args += ["--latency-bound", "rag=3"]
    code, _, err = _run_in_process(args, main)
    assert code == 2, err
    assert highs in err and "time limit" not in err.replace("not a time limit", ""), err
    assert not out.exists()


def _run_in_process(args, main):
    """(exit code, stdout, stderr) of ``scepsy ARGS`` run in this process (monkeypatches hold)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def test_a_drive_with_failures_keeps_an_earlier_result_and_writes_beside_it(tmp_path):
    """A run with failed requests (exit 1) never replaces an earlier --json result: it goes to
    NAME.failed.json and stderr says so; with nothing there it is written in place."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    routes = str(_routes(tmp_path, f"http://127.0.0.1:{port}/v1"))
    earlier = tmp_path / "res.json"
    earlier.write_text('{"earlier": 1}\n')
    args = ("drive", "--workflow", RAG_YAML, "--routes", routes, "--rate", "50", "--requests",
            "2", "--connect-timeout", "2")
    code, _, err = run_cli(*args, "--json", str(earlier))
    assert code == 1
    assert earlier.read_text() == '{"earlier": 1}\n'
    beside = tmp_path / "res.failed.json"
    assert json.loads(beside.read_text())["failed"] == 2
    assert f"{earlier} holds an earlier result and was kept" in err and str(beside) in err
    fresh = tmp_path / "new.json"
    assert run_cli(*args, "--json", str(fresh))[0] == 1
    assert json.loads(fresh.read_text())["failed"] == 2


# ------------------------------------------------------------ a KEY=VALUE option given twice

KEYS = st.sampled_from(["a", "m", "org/model", "Qwen/Qwen2.5-7B-Instruct"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(KEYS, st.sampled_from(["x", "y", "llm_b"])), min_size=1, max_size=5))
def test_a_repeated_key_is_refused_by_every_key_value_option(pairs) -> None:
    # oracle: the pairs are accepted exactly when no key repeats; then every value counts
    from scepsy_opt.ingest.record import upstream_pairs
    from scepsy_opt.ingest.tracemap import model_pairs

    keys = [k for k, _ in pairs]
    repeated = len(set(keys)) < len(keys)
    for parse, text in ((model_pairs, lambda k, v: f"{k}={v}"),
                        (upstream_pairs, lambda k, v: f"{k}=http://127.0.0.1:8000/{v}")):
        given_ = [text(k, v) for k, v in pairs]
        if repeated:
            with pytest.raises(InputError) as exc:
                parse(given_)
            assert "once" in exc.value.expected and "only one value can count" in str(exc.value)
        else:
            assert len(parse(given_)) == len(pairs)


@pytest.mark.parametrize("argv, flag", [
    (["trace", "import", "spans.json", "--out", "t.jsonl", "--model", "m=a", "--model", "m=b"],
     "--model"),
    (["record", "--listen", "127.0.0.1:0", "--upstream-for", "m=http://127.0.0.1:1",
      "--upstream-for", "m=http://127.0.0.1:2", "--out", "t.jsonl", "--duration", "1"],
     "--upstream-for"),
    (["profile", "run", "--backend", "torch", "--model", "llama-3-8b", "--engine-option",
      "device=cpu", "--engine-option", "device=cuda", "--out", "s.jsonl"], "--engine-option"),
])
def test_the_cli_refuses_a_repeated_key_before_anything_runs(argv, flag, tmp_path,
                                                             monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spans.json").write_text('{"resourceSpans": []}')
    code, _, err = run_cli(*argv)
    assert code == 2 and err.startswith(f"scepsy: error: {flag}: ") and "once" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spans.json"]  # nothing written


# ------------------------------------------------------------------ where a field lies

@given(st.lists(st.one_of(st.integers(0, 99), st.sampled_from(["pools", "gpu", "racks", "x_1"])),
                min_size=1, max_size=6))
def test_a_field_path_brackets_list_indices_and_dots_keys(loc) -> None:
    from scepsy_common.errors import loc_path

    path = loc_path(loc)
    # oracle: rebuild the parts from the written path
    parts = [p for p in re.split(r"\.|\[(\d+)\]", path) if p]
    assert parts == [str(p) for p in loc]
    assert ".[" not in path and not path.startswith(".")
    assert all(f"[{p}]" in path for p in loc if isinstance(p, int))


def test_cluster_errors_write_a_pool_index_one_way(tmp_path) -> None:
    bad = tmp_path / "c.yaml"
    for text, field in (("name: c\npools:\n  - {gpu: A100-80GB, nodes: 0, gpus_per_node: 4}\n",
                         "pools[0].nodes"),
                        ("name: c\npools:\n  - {gpu: A100-81GB, nodes: 1, gpus_per_node: 4}\n",
                         "pools[0].gpu")):
        bad.write_text(text)
        code, _, err = run_cli("plan", "--workflow", str(REPO / "datasets/workflows/rag.yaml"),
                               "--cluster", str(bad), "--target", "1")
        assert code == 2 and f": {field}: expected" in err, err


# ---------------------------------------------------------------- messages that name a flag

def test_profile_show_names_the_option_of_an_unknown_model_or_gpu() -> None:
    code, _, err = run_cli("profile", "show", "--model", "llama-999b", "--gpu", "A100-80GB")
    assert code == 2 and err.startswith("scepsy: error: --model: unknown model 'llama-999b'")
    code, _, err = run_cli("profile", "show", "--model", "llama-7b", "--gpu", "A100-81GB")
    assert code == 2 and err.startswith("scepsy: error: --gpu: unknown GPU 'A100-81GB'")


@pytest.mark.parametrize("name", ["../../../etc/passwd", "nope", "rag.yaml", "/abs/rag"])
def test_bench_control_names_its_workflows_for_an_unknown_one(name) -> None:
    names = sorted(p.stem for p in (REPO / "datasets" / "workflows").glob("*.yaml"))
    code, _, err = run_cli("bench", "control", "--quick", "--workflow", name)
    assert code == 2 and err.startswith("scepsy: error: --workflow: expected the name of a "
                                        "workflow of "), err
    assert ", ".join(names) in err and err.count("..") == name.count(".."), err


def test_a_missing_routes_file_reads_as_one_phrase(tmp_path) -> None:
    code, _, err = run_cli("drive", "--workflow", str(REPO / "datasets/workflows/rag.yaml"),
                           "--routes", str(tmp_path / "nope.json"), "--rate", "1",
                           "--requests", "1")
    assert code == 2 and err.strip().endswith(
        "expected an existing, readable routes file (routes.json)"), err
