"""The bad-input campaign's instrument (benchmarks/bad_input.py): the classifier on known
outcomes, the runner on fake commands (a traceback, a silent exit 0, a clobbered sentinel, a
sleeper, a server that logs tracebacks), the case table's coverage, and a smoke run of a few
real cases through ``main``. None of it depends on how well scepsy itself answers."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import REPO

_spec = importlib.util.spec_from_file_location("bad_input", REPO / "benchmarks" / "bad_input.py")
assert _spec is not None and _spec.loader is not None
bad_input = importlib.util.module_from_spec(_spec)
sys.modules["bad_input"] = bad_input
_spec.loader.exec_module(bad_input)

Case, ServerCase = bad_input.Case, bad_input.ServerCase
REFUSE, EITHER = bad_input.REFUSE, bad_input.EITHER


def classify(**kw):
    args = dict(expect=REFUSE, code=2, stdout="", stderr="scepsy: error: --cluster: bad\n",
                timed_out=False, changed=(), names=("--cluster", "c.yaml"))
    args.update(kw)
    return bad_input.classify(**args)[0]


def test_classifier_on_known_outcomes():
    assert classify() == "ok"
    assert classify(stderr="scepsy: error: c.yaml: pools[0].nodes: expected > 0\n") == "ok"
    assert classify(stderr="Traceback (most recent call last):\n  ...\nValueError: x\n",
                    code=1) == "traceback"
    assert classify(code=-11, stderr="") == "traceback"  # killed by a signal
    assert classify(code=3) == "traceback"  # not a documented status of this case
    assert classify(code=3, allowed_codes=(0, 1, 2, 3), refuse_codes=(2, 3)) == "ok"
    assert classify(timed_out=True, code=None) == "hang"
    assert classify(code=0, stderr="") == "silent"
    assert classify(code=0, stderr="", expect=EITHER) == "ok"
    assert classify(changed=("out.json",)) == "clobbered"
    assert classify(code=0, changed=("out.json",), expect=EITHER) == "ok"  # a success replaces
    assert classify(stderr="scepsy: error: something is wrong\n") == "unclear"
    assert classify(stderr="warning: x\nscepsy: error: --cluster: bad\n") == "unclear"
    assert classify(code=1) == "unclear"  # refused, but not with the usage status
    # a flag named without its dashes counts, as a whole word of four letters or more
    assert classify(stderr="scepsy: error: launch: target: expected shell\n",
                    names=("--target",)) == "ok"
    assert classify(stderr="scepsy: error: layout: bad\n", names=("--out",)) == "unclear"
    # a command that ran before it failed may print progress before the refusal, when allowed
    progress = "started a\nstarted b\nscepsy: error: --x: the servers did not start\n"
    assert classify(stderr=progress, names=("--x",)) == "unclear"
    assert classify(stderr=progress, names=("--x",), one_line=False) == "ok"


@given(code=st.integers(-20, 300), out=st.text(max_size=40), err=st.text(max_size=40),
       expect=st.sampled_from([REFUSE, EITHER]), changed=st.booleans())
def test_classifier_precedence(code, out, err, expect, changed):
    """A hang wins over everything; then a traceback (in either stream, or a crash status);
    an exit 0 is never clobbered; every outcome gets one of the classes."""
    kw = dict(expect=expect, stdout=out, stderr=err, changed=("o",) if changed else (),
              names=("--x",))
    assert bad_input.classify(code=None, timed_out=True, **kw)[0] == "hang"
    tb = bad_input.classify(code=code, timed_out=False,
                            **{**kw, "stdout": out + "Traceback (most recent call last):"})[0]
    assert tb == "traceback"
    cls = bad_input.classify(code=code, timed_out=False, **kw)[0]
    assert cls in bad_input.CLASSES
    if code not in (0, 1, 2) and "Traceback (most recent call last)" not in out + err:
        assert cls == "traceback"
    if code == 0 and "Traceback (most recent call last)" not in out + err:
        assert cls == ("silent" if expect == REFUSE else "ok")


def _fake(name: str, code: str, **kw) -> Case:
    return Case("fake", name, (), program=(sys.executable, "-c", code), **kw)


def test_runner_classifies_fake_commands(tmp_path):
    sentinel = {"out.json": bad_input.text('{"good": true}\n')}
    cases = {
        "traceback": _fake("tb", "raise ValueError('boom')"),
        "silent": _fake("zero", "print('all fine')"),
        "clobbered": _fake("clobber", "import sys; open('out.json', 'w').write('{}'); "
                           "print('scepsy: error: --x: bad', file=sys.stderr); sys.exit(2)",
                           files=sentinel, outputs=("out.json",), names=("--x",)),
        "hang": _fake("sleep", "import time; time.sleep(60)", timeout=1.0),
        "ok": _fake("refuse", "import sys; print('scepsy: error: --x: expected > 0', "
                    "file=sys.stderr); sys.exit(2)", files=sentinel, outputs=("out.json",),
                    names=("--x",)),
        "unclear": _fake("noise", "import sys; print('scepsy: error: bad\\nmore', "
                         "file=sys.stderr); sys.exit(2)", names=("--x",)),
    }
    for want, case in cases.items():
        r = bad_input.run_case(case, tmp_path)
        assert r.cls == want, (case.name, r)
    r = bad_input.run_case(cases["traceback"], tmp_path)
    assert r.code == 1 and "ValueError" in r.first_line
    # an input the case needs and the base folder lacks: skipped, not run
    r = bad_input.run_case(_fake("needs", "pass", needs=("absent.json",)), tmp_path)
    assert r.cls == "skipped" and "absent.json" in r.why


FAKE_SERVER = r'''
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
MODE = sys.argv[1]

class H(BaseHTTPRequestHandler):
    def _answer(self, code):
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        self._answer(200)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        if MODE == "careless":
            raise ValueError("a careless server")
        if n > 1000:
            self._answer(413)
            self.close_connection = True
            return
        self.rfile.read(max(n, 0))
        self._answer(200)

    def log_message(self, *a):
        pass

srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(f"fake: listening on http://127.0.0.1:{srv.server_address[1]}, writing x", flush=True)
try:
    srv.serve_forever()
except KeyboardInterrupt:
    pass
'''


@pytest.mark.parametrize(("mode", "want"), [("careful", "ok"), ("careless", "traceback")])
def test_server_runner(tmp_path, mode, want):
    script = tmp_path / "server.py"
    script.write_text(FAKE_SERVER)
    case = ServerCase("fake", mode, (), ("huge-length", "garbage", "bad-json"), "otlp",
                      want_413=True, timeout=20,
                      program=(sys.executable, str(script), mode))
    r = bad_input.run_server_case(case, tmp_path)
    assert r.cls == want, r


def test_case_table_covers_the_commands():
    cases = bad_input.cases()
    assert len(cases) >= 150
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids))
    commands = {c.command for c in cases}
    assert {"plan", "replan", "predict", "simulate", "stats", "trace import", "trace receive",
            "record", "profile fit", "profile show", "profile run", "launch", "stop", "drive",
            "report", "validate", "bench"} <= commands
    launch_targets = {c.argv[c.argv.index("--target") + 1] for c in cases
                      if c.command == "launch" and "--target" in c.argv}
    assert {"shell", "k8s", "ray", "routes"} <= launch_targets
    assert any("--apply" in c.argv for c in cases)
    assert any(isinstance(c, ServerCase) and c.command == "record" for c in cases)
    assert any(isinstance(c, ServerCase) and c.command == "trace receive" for c in cases)
    # every case with an output path starts with a sentinel there
    for c in cases:
        if isinstance(c, Case):
            for o in c.outputs:
                assert o in c.files, (c.id, o)
    assert {c.id for c in bad_input.select(cases, "stats/*")} == \
        {i for i in ids if i.startswith("stats/")}
    assert bad_input.select(cases, "launch-routes-huge") and not bad_input.select(cases, "zzz")
    assert len(bad_input.select(cases, "stats/trace-missing,stop/a-file")) == 2


def test_summary_counts():
    R = bad_input.Result
    rows = bad_input.summary([R("a/1", "a", [], "ok", "", 2, "", 0.1),
                              R("a/2", "a", [], "silent", "", 0, "", 0.1),
                              R("b/1", "b", [], "hang", "", None, "", 0.1)])
    assert [r["command"] for r in rows] == ["a", "b", "total"]
    assert rows[0]["cases"] == 2 and rows[0]["ok"] == 1 and rows[0]["silent"] == 1
    assert rows[-1]["cases"] == 3 and rows[-1]["hang"] == 1


def test_smoke_run_of_real_cases(tmp_path, capsys):
    """A few real cases through main: the JSON has every case with its argv, class, exit status
    and first stderr line, and the table has a row per command."""
    out = tmp_path / "campaign.json"
    assert bad_input.main(["--only", "stats/trace-[meb]*", "--inputs", str(tmp_path / "inputs"),
                           "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["cases"]) == len(bad_input.select(bad_input.cases(), "stats/trace-[meb]*"))
    for c in data["cases"]:
        assert c["class"] in (*bad_input.CLASSES, "skipped")
        assert c["argv"][0] == "stats" and "exit" in c and "stderr_first_line" in c
    missing = next(c for c in data["cases"] if c["id"] == "stats/trace-missing")
    assert missing["exit"] != 0 and missing["stderr_first_line"]
    assert "stats" in capsys.readouterr().out
    assert not (tmp_path / "inputs" / "plan.json").exists()  # only the inputs the cases need
