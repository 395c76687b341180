"""Guards every command shares (scepsy.cli.main): an output never overwrites an input or
another output, a single-valued option is given once, an integer too long for Python is a field
error, a write the system refuses is one line naming the path, and Ctrl-C ends without a
traceback, leaving nothing half-written."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, run_cli
from scepsy_common.errors import InputError
from scepsy_common.files import atomic_write_text, parse_json, parse_yaml, replace_folder

RAG = REPO / "datasets" / "workflows" / "rag.yaml"
A16 = REPO / "datasets" / "clusters" / "a100-16.yaml"


def _copy(src: Path, dest: Path) -> Path:
    dest.write_bytes(src.read_bytes())
    return dest


@pytest.mark.parametrize("argv", [
    ["plan", "--workflow", "{w}", "--cluster", str(A16), "--target", "1", "--out", "{w}"],
    ["plan", "--workflow", str(RAG), "--cluster", "{c}", "--target", "1", "--out", "{c}"],
    ["trace", "generate", "--workflow", "{w}", "--requests", "2", "--out", "{w}"],
])
def test_an_output_naming_an_input_is_refused_and_the_input_kept(tmp_path, argv):
    w, c = _copy(RAG, tmp_path / "w.yaml"), _copy(A16, tmp_path / "c.yaml")
    before = {p: p.read_bytes() for p in (w, c)}
    code, _, err = run_cli(*[a.format(w=w, c=c) for a in argv])
    assert code == 2 and "--out: expected a path other than an input" in err, err
    assert {p: p.read_bytes() for p in (w, c)} == before


def test_two_outputs_naming_one_path_are_refused(tmp_path):
    code, _, err = run_cli("trace", "import", str(tmp_path / "s.jsonl"), "--out",
                           str(tmp_path / "x.json"), "--report", str(tmp_path / "x.json"))
    assert code == 2 and "--report: expected a path other than --out's" in err, err
    assert not (tmp_path / "x.json").exists()


SINGLE = [
    ("plan", "--workflow", ["plan", "--cluster", str(A16), "--target", "1"]),
    ("predict", "--rate", ["predict", "--workflow", str(RAG), "--allocation", "a.yaml"]),
    ("launch", "--target", ["launch", "p.json", "--out", "o"]),
    ("stop", "--node", ["stop", "folder"]),
    ("profile show", "--model", ["profile", "show", "--gpu", "A100-80GB"]),
]


@settings(max_examples=10, deadline=None)
@given(case=st.sampled_from(SINGLE), first=st.sampled_from(["1", "a", "x.yaml"]),
       second=st.sampled_from(["2", "b", "y.yaml"]), joined=st.booleans())
def test_a_single_valued_option_given_twice_is_refused_naming_both_values(
        case, first, second, joined):
    _command, flag, argv = case
    twice = [f"{flag}={first}", flag, second] if joined else [flag, first, flag, second]
    code, out, err = run_cli(*argv, *twice)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"{flag}: expected once (given {first!r}, then {second!r}" in err, err


def test_a_repeatable_option_still_repeats(tmp_path):
    code, _, err = run_cli("plan", "--workflow", str(REPO / "datasets/workflows/rag-beam.yaml"),
                           "--cluster", str(A16), "--target", "rag=0.3", "--target",
                           "beam_search=0.3", "--trace-requests", "100", "--out",
                           str(tmp_path / "p.json"), "--quiet")
    assert code == 0, err


@pytest.mark.parametrize("sign", ["", "-"])
def test_an_integer_too_long_for_python_is_an_infinity_in_json(sign):
    doc = parse_json('{"a": ' + sign + "9" * 5000 + "}", "f.json")
    assert doc["a"] == (-1 if sign else 1) * float("inf")


def test_an_integer_too_long_for_python_is_bad_yaml_naming_the_file():
    with pytest.raises(InputError) as exc:
        parse_yaml("a: " + "9" * 5000 + "\n", "c.yaml")
    assert exc.value.source == "c.yaml" and "4300 digits" in exc.value.expected


def test_a_plan_json_with_a_huge_integer_names_the_field(tmp_path):
    text = (REPO / "datasets" / "plans" / "rag-beam-a100-16.json").read_text()
    bad = tmp_path / "p.json"
    bad.write_text(text.replace('"version": 1', '"version": ' + "9" * 5000, 1))
    code, _, err = run_cli("report", str(bad), "--out", str(tmp_path / "r"))
    assert code == 2 and f"{bad}: version:" in err and "Traceback" not in err, err


def test_writes_never_replace_a_device_or_a_folder(tmp_path):
    with pytest.raises(InputError, match="device or special file"):
        atomic_write_text("/dev/null", "x")
    assert Path("/dev/null").is_char_device()
    with pytest.raises(InputError, match="this is a folder"):
        atomic_write_text(tmp_path, "x")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(InputError, match="symbolic link"):
        replace_folder(tmp_path / "link", lambda d: None)
    assert (tmp_path / "link").is_symlink() and (tmp_path / "real").is_dir()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EROFS])
def test_a_refused_write_names_the_path_and_leaves_nothing(tmp_path, monkeypatch, code):
    target = tmp_path / "out.json"
    target.write_text("earlier\n")

    def refuse(*_a, **_k):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(InputError) as exc:
        atomic_write_text(target, "new")
    assert exc.value.source == str(target) and os.strerror(code) in exc.value.expected
    assert target.read_text() == "earlier\n" and sorted(tmp_path.iterdir()) == [target]


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_ctrl_c_during_plan_exits_130_without_traceback_or_output(tmp_path):
    out = tmp_path / "plan.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from scepsy.cli import main; sys.exit(main())",
         "plan", "--workflow", str(REPO / "datasets/workflows/rag-beam.yaml"), "--cluster",
         str(A16), "--target", "0.6", "--trace-requests", "20000", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # past `from scepsy.cli import main` (under a second of CPU), inside the command's imports or
    # its planning (20000 requests take a minute): waited for in CPU time, which a loaded
    # machine does not shorten as it does wall time
    deadline = time.monotonic() + 120
    while _cpu_s(proc.pid) < 2.5 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "scepsy: interrupted" in err, err
    assert not out.exists() and not list(tmp_path.glob(".*"))


def test_a_launch_folder_over_the_plan_it_renders_is_refused(tmp_path):
    out = tmp_path / "p.json"
    out.write_text("an earlier plan\n")
    code, _, err = run_cli("plan", "--workflow", str(RAG), "--cluster", str(A16), "--target",
                           "1", "--out", str(out), "--launch", "shell", "--launch-out", str(out))
    assert code == 2 and "--launch-out: expected a path other than --out's" in err, err
    assert out.read_text() == "an earlier plan\n"
