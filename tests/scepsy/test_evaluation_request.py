"""The requests of predict and simulate: the options are their fields, the API builds the
same models, and what cannot work is refused naming the argument or the option."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, run_cli
from scepsy import api
from scepsy.cli import build_parser
from scepsy.cli.evaluate import evaluation_request
from scepsy.evaluation import (
    PredictRequest,
    SimulateRequest,
    predict_flag_fields,
    request_of,
    simulate_flag_fields,
    split_keywords,
)
from scepsy_common.errors import InputError

RAG = str(REPO / "datasets" / "workflows" / "rag.yaml")
ALLOC = str(REPO / "datasets" / "allocations" / "rag-4gpu.yaml")


@pytest.mark.parametrize(("command", "fields"), [("predict", predict_flag_fields),
                                                 ("simulate", simulate_flag_fields)])
def test_every_field_with_a_flag_is_an_option_with_its_help(command, fields):
    code, out, _ = run_cli(command, "--help")
    assert code == 0
    flat = " ".join(out.split())
    for f in fields():
        assert f.flag.name in out
        assert f.help and f.help.split(";")[0][:30] in flat, f.flag.name


# options given on the command line -> the same keywords given to the API
_OPTIONS = {
    "--trace-requests": ("trace_requests", st.integers(1, 5000)),
    "--seed": ("seed", st.integers(0, 2**31)),
    "--requests": ("requests", st.integers(1, 10_000)),
    "--routing": ("routing", st.sampled_from(["round_robin", "least_loaded"])),
    "--max-num-seqs": ("max_batch", st.integers(1, 512)),
}


@given(st.dictionaries(st.sampled_from(sorted(_OPTIONS)), st.integers(0, 0), max_size=5),
       st.data())
@settings(max_examples=40, deadline=None)
def test_the_command_line_builds_the_request_the_api_builds(chosen, data):
    argv = ["simulate", "--workflow", RAG, "--allocation", ALLOC, "--rate", "1.5"]
    keywords: dict[str, object] = {}
    engine: dict[str, object] = {}
    for flag in sorted(chosen):
        name, strategy = _OPTIONS[flag]
        value = data.draw(strategy)
        argv += [flag, str(value)]
        (engine if name == "max_batch" else keywords)[name] = value
    args = build_parser(argv).parse_args(argv)
    from_cli = evaluation_request(args, SimulateRequest, simulate_flag_fields())
    data_ = split_keywords(RAG, ALLOC, 1.5, keywords)
    if engine:
        data_["engine"] = engine
    from_api = request_of(SimulateRequest, data_)
    assert from_cli.model_dump(mode="python") == {
        **from_api.model_dump(mode="python"),
        "inputs": {**from_api.inputs.model_dump(), "workflow": args.workflow,
                   "allocation": args.allocation}}


@pytest.mark.parametrize(("call", "kwargs", "field"), [
    (api.predict, {"nonsense": 1}, "nonsense"),
    (api.simulate, {"time_scale": 2.0}, "time_scale"),
    (api.simulate, {"arrivals": "x.txt"}, "rate"),  # a total rate with recorded arrivals
    (api.simulate, {"requests": 0}, "requests"),
    (api.predict, {"form": "sum"}, "form"),
    (api.predict, {"trace_requests": 0}, "trace_requests"),
])
def test_what_cannot_work_is_refused_naming_the_argument(call, kwargs, field):
    with pytest.raises(InputError) as exc:
        call(RAG, ALLOC, 1.0, **kwargs)
    assert field in (exc.value.source, exc.value.field)


@pytest.mark.parametrize(("argv", "flag"), [
    (["--time-scale", "2"], "--time-scale"),
    (["--requests", "0"], "--requests"),
    (["--routing", "random"], "--routing"),
])
def test_the_command_line_names_the_option(argv, flag):
    code, _out, err = run_cli("simulate", "--workflow", RAG, "--allocation", ALLOC,
                              "--rate", "1", *argv)
    assert code == 2 and flag in err and "Traceback" not in err


def test_a_request_runs_as_its_keywords_do():
    request = request_of(PredictRequest, {"inputs": {"workflow": RAG, "allocation": ALLOC,
                                                     "rate": 1.0, "trace_requests": 60}})
    a = api.run_predict(request)
    b = api.predict(RAG, ALLOC, 1.0, trace_requests=60)
    assert a.workflows.keys() == b.workflows.keys()
    for w in a.workflows:
        assert a.workflows[w].mean_latency_s == pytest.approx(b.workflows[w].mean_latency_s,
                                                              rel=1e-12)
