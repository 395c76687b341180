"""Tests for the Vidur and DistServe importers and for the code in docs/importers.md.

Most tests write small files into ``tmp_path``; the ``shared_data`` tests read the published
files from ``../shared/data`` and skip when that folder is absent.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

from scepsy_common.errors import InputError
from scepsy_profile.catalog import default_catalog, parse_catalog
from scepsy_profile.importers.distserve import (
    DistServeCoefficients,
    distserve_measurements,
    load_distserve_profile,
    load_max_num_tokens,
)
from scepsy_profile.importers.vidur import (
    CollectiveTiming,
    OperatorTiming,
    load_vidur_all_reduce,
    load_vidur_mlp,
    vidur_layer_time_ms,
)
from scepsy_profile.measurements import read_measurements, write_measurements

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"

LLAMA = "meta-llama/Llama-2-7b-hf"


# --- file builders ---------------------------------------------------------------------------


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def mlp_header(ops: list[str]) -> list[str]:
    cols = []
    for op in ops:
        cols += [f"time_stats.{op}.{s}" for s in ("min", "max", "mean", "median", "std")]
    return [*cols, "n_head", "n_embd", "num_tokens", "num_tensor_parallel_workers"]


def mlp_row(medians: list[object], num_tokens: object, tp: object) -> list[object]:
    cells: list[object] = []
    for m in medians:
        cells += ["0.001", "9.9", "5.0", m, "0.1"]  # min/max/mean/std must be ignored
    return [*cells, 32, 4096, num_tokens, tp]


def write_mlp(
    tmp_path: Path,
    ops: list[str],
    rows: list[tuple[list[object], object, object]],
    gpu_dir: str = "a100",
    model: str = LLAMA,
) -> Path:
    path = tmp_path / "compute" / gpu_dir / model / "mlp.csv"
    return write_csv(path, mlp_header(ops), [mlp_row(*r) for r in rows])


AR_HEADER = [
    "",
    "time_stats.all_reduce.min",
    "time_stats.all_reduce.median",
    "rank",
    "num_workers",
    "size",
    "collective",
    "devices_per_node",
    "max_devices_per_node",
]


def write_all_reduce(tmp_path: Path, rows: list[list[object]], topology: str = "a100_dgx") -> Path:
    full = [[i, "0.001", *r[:1], 0, *r[1:], 8] for i, r in enumerate(rows)]
    # r = [median, num_workers, size, collective, devices_per_node]
    return write_csv(tmp_path / "network" / topology / "all_reduce.csv", AR_HEADER, full)


PROFILE = {
    "facebook/opt-66b": {
        "2": {
            "decoding_large_small_bs_threshold": 95,
            "prefill": [58.0, 0.38, -7e-06],
            "decoding_smallbs": [57.0, 0.0036, 0.22],
            "decoding_largebs": [27.0, 0.0062, 0.45],
        }
    },
    "facebook/opt-13b": {
        "4": {
            "decoding_large_small_bs_threshold": 95,
            "prefill": [30.5, 0.05, 4.2e-07],
            "decoding_smallbs": [25.9, 7.7e-05, 0.055],
            "decoding_largebs": [23.9, 0.00028, 0.063],
            "handoff_delay_ms": 0.0,  # extra keys are ignored
        },
        "1": {
            "decoding_large_small_bs_threshold": 95,
            "prefill": [22.0, 0.14, 8e-06],
            "decoding_smallbs": [23.5, 0.0006, 0.06],
            "decoding_largebs": [20.2, 0.0005, 0.12],
        },
    },
}


def write_profile(tmp_path: Path, data: object, name: str = "profiler-a100-80g.vllm.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    return path


def raises_input_error(fn, *args, **kwargs) -> str:
    with pytest.raises(InputError) as info:
        fn(*args, **kwargs)
    return str(info.value)


# --- Vidur mlp.csv ---------------------------------------------------------------------------

OPS = ["emb", "input_layernorm", "mlp_up_proj", "add"]


def test_vidur_mlp_round_trip(tmp_path: Path) -> None:
    path = write_mlp(
        tmp_path,
        OPS,
        [
            (["0.2", "0.1", "3.5", "0.05"], 4096, 1),
            (["0.02", "0.01", "0.03", "0.004"], 8, 2),
            (["0.03", "0.011", "0.02", "0.003"], 8, 1),
        ],
    )
    out = load_vidur_mlp(path)
    assert len(out) == 3 * 4
    assert all(isinstance(t, OperatorTiming) for t in out)
    assert {t.model for t in out} == {LLAMA}
    assert {t.gpu for t in out} == {"A100-80GB"}
    keys = [(t.tp, t.num_tokens, t.operator) for t in out]
    assert keys == sorted(keys)
    by = {(t.tp, t.num_tokens, t.operator): t.time_ms for t in out}
    assert by[(1, 4096, "mlp_up_proj")] == 3.5  # the median, not min/max/mean
    assert by[(2, 8, "add")] == 0.004
    assert by[(1, 8, "emb")] == 0.03
    assert "mlp.csv" in out[0].source


def test_vidur_mlp_gpu_from_folder_and_overrides(tmp_path: Path) -> None:
    rows = [(["0.2", "0.1", "3.5", "0.05"], 16, 1)]
    h100 = write_mlp(tmp_path, OPS, rows, gpu_dir="h100")
    assert {t.gpu for t in load_vidur_mlp(h100)} == {"H100-80GB"}
    other = write_mlp(tmp_path, OPS, rows, gpu_dir="l40s", model="acme/Tiny-1b")
    msg = raises_input_error(load_vidur_mlp, other)
    assert str(other) in msg and "path" in msg and "gpu=" in msg
    got = load_vidur_mlp(other, gpu="L40S-48GB", model="acme/tiny")
    assert {(t.gpu, t.model) for t in got} == {("L40S-48GB", "acme/tiny")}


def test_vidur_mlp_skips_empty_cells(tmp_path: Path) -> None:
    path = write_mlp(tmp_path, OPS, [(["0.2", "", "3.5", "0.05"], 16, 1)])
    out = load_vidur_mlp(path)
    assert sorted(t.operator for t in out) == ["add", "emb", "mlp_up_proj"]


def test_vidur_layer_time_sums_per_layer_operators_and_averages_duplicates(
    tmp_path: Path,
) -> None:
    path = write_mlp(
        tmp_path,
        OPS,
        [
            (["0.2", "0.1", "3.0", "0.05"], 4096, 1),
            (["0.2", "0.1", "3.2", "0.05"], 4096, 1),  # Vidur repeats grid end points
            (["0.02", "0.01", "0.03", "0.004"], 8, 1),
            (["0.02", "", "0.03", "0.004"], 16, 1),  # incomplete: left out
        ],
    )
    layer = vidur_layer_time_ms(load_vidur_mlp(path))
    assert list(layer) == [(LLAMA, "A100-80GB", 1, 8), (LLAMA, "A100-80GB", 1, 4096)]
    assert layer[(LLAMA, "A100-80GB", 1, 4096)] == pytest.approx(0.1 + 3.1 + 0.05)  # no emb
    assert layer[(LLAMA, "A100-80GB", 1, 8)] == pytest.approx(0.01 + 0.03 + 0.004)


def test_vidur_layer_time_keeps_models_apart() -> None:
    timings = [
        OperatorTiming("a/x", "A100-80GB", 1, 8, "mlp_up_proj", 1.0),
        OperatorTiming("a/x", "A100-80GB", 1, 8, "add", 0.5),
        OperatorTiming("a/y", "A100-80GB", 1, 8, "mlp_up_proj", 2.0),  # y has no add at all
        OperatorTiming("a/y", "H100-80GB", 1, 8, "emb", 9.0),  # only emb: no layer
    ]
    assert vidur_layer_time_ms(timings) == {
        ("a/x", "A100-80GB", 1, 8): 1.5,
        ("a/y", "A100-80GB", 1, 8): 2.0,
    }


def test_vidur_mlp_missing_column(tmp_path: Path) -> None:
    header = [h for h in mlp_header(OPS) if h != "num_tensor_parallel_workers"]
    path = write_csv(
        tmp_path / "compute/a100/x/y/mlp.csv", header, [mlp_row(["1", "1", "1", "1"], 8, 1)[:-1]]
    )
    msg = raises_input_error(load_vidur_mlp, path)
    assert str(path) in msg and "num_tensor_parallel_workers" in msg


def test_vidur_mlp_without_time_columns(tmp_path: Path) -> None:
    path = write_csv(
        tmp_path / "compute/a100/x/y/mlp.csv",
        ["num_tokens", "num_tensor_parallel_workers"],
        [[8, 1]],
    )
    msg = raises_input_error(load_vidur_mlp, path)
    assert str(path) in msg and "time_stats.<operator>.median" in msg


@pytest.mark.parametrize(
    ("bad", "column", "expected"),
    [
        ("fast", "time_stats.add.median", "a number"),
        ("-0.5", "time_stats.add.median", ">= 0"),
        ("nan", "time_stats.add.median", "finite"),
    ],
)
def test_vidur_mlp_bad_time(tmp_path: Path, bad: str, column: str, expected: str) -> None:
    path = write_mlp(
        tmp_path,
        OPS,
        [(["0.2", "0.1", "3.5", "0.05"], 4096, 1), (["0.2", "0.1", "3.5", bad], 8, 1)],
    )
    msg = raises_input_error(load_vidur_mlp, path)
    assert str(path) in msg
    assert "row 2 (line 3)" in msg
    assert column in msg
    assert expected in msg


@pytest.mark.parametrize("bad", ["12.5", "abc", "0", ""])
def test_vidur_mlp_bad_num_tokens(tmp_path: Path, bad: str) -> None:
    path = write_mlp(tmp_path, OPS, [(["0.2", "0.1", "3.5", "0.05"], bad, 1)])
    msg = raises_input_error(load_vidur_mlp, path)
    assert "row 1" in msg and "num_tokens" in msg and "positive integer" in msg


def test_vidur_mlp_ragged_row_missing_file_and_empty_file(tmp_path: Path) -> None:
    path = write_mlp(tmp_path, OPS, [(["0.2", "0.1", "3.5", "0.05"], 8, 1)])
    with path.open("a", encoding="utf-8") as fh:
        fh.write("1,2,3\n")
    msg = raises_input_error(load_vidur_mlp, path)
    assert "row 2" in msg and "fields" in msg
    missing = tmp_path / "compute/a100/x/y/none.csv"
    assert str(missing) in raises_input_error(load_vidur_mlp, missing)
    empty = tmp_path / "compute/a100/x/z/mlp.csv"
    empty.parent.mkdir(parents=True)
    empty.write_text("")
    msg = raises_input_error(load_vidur_mlp, empty)
    assert str(empty) in msg and "header" in msg


# --- Vidur all_reduce.csv --------------------------------------------------------------------


def test_vidur_all_reduce_round_trip(tmp_path: Path) -> None:
    path = write_all_reduce(
        tmp_path,
        [
            ["0.30", 4, 10240, "all_reduce", 4],
            ["0.05", 2, 10240, "all_reduce", 2],
            ["0.04", 2, 2048, "all_reduce", 2],
            ["0.90", 4, 10240, "all_reduce", 2],
        ],
    )
    out = load_vidur_all_reduce(path)
    assert all(isinstance(c, CollectiveTiming) for c in out)
    assert [(c.num_workers, c.devices_per_node, c.size_bytes, c.time_ms) for c in out] == [
        (2, 2, 2048, 0.04),
        (2, 2, 10240, 0.05),
        (4, 2, 10240, 0.90),
        (4, 4, 10240, 0.30),
    ]
    assert {(c.gpu, c.topology, c.collective) for c in out} == {
        ("A100-80GB", "a100_dgx", "all_reduce")
    }
    assert "all_reduce.csv" in out[0].source


def test_vidur_all_reduce_gpu_from_topology_and_override(tmp_path: Path) -> None:
    rows = [["0.05", 2, 2048, "all_reduce", 2], ["", 2, 10240, "all_reduce", 2]]
    h100 = write_all_reduce(tmp_path, rows, topology="h100_pairwise_nvlink")
    out = load_vidur_all_reduce(h100)
    assert [(c.gpu, c.topology, c.size_bytes) for c in out] == [
        ("H100-80GB", "h100_pairwise_nvlink", 2048)  # the empty time was skipped
    ]
    odd = write_all_reduce(tmp_path, rows, topology="mi300_xgmi")
    msg = raises_input_error(load_vidur_all_reduce, odd)
    assert str(odd) in msg and "mi300_xgmi" in msg
    assert {c.gpu for c in load_vidur_all_reduce(odd, gpu="MI300X")} == {"MI300X"}


def test_vidur_all_reduce_missing_size_column(tmp_path: Path) -> None:
    header = [h for h in AR_HEADER if h != "size"]
    path = write_csv(
        tmp_path / "network/a100_dgx/all_reduce.csv",
        header,
        [[0, "0.01", "0.02", 0, 2, "all_reduce", 2, 8]],
    )
    msg = raises_input_error(load_vidur_all_reduce, path)
    assert str(path) in msg and "column size" in msg


@pytest.mark.parametrize(
    ("row", "column", "expected"),
    [
        (["0.05", 2, "2KB", "all_reduce", 2], "column size", "positive integer"),
        (["-0.05", 2, 2048, "all_reduce", 2], "time_stats.all_reduce.median", ">= 0"),
        (["x", 2, 2048, "all_reduce", 2], "time_stats.all_reduce.median", "a number"),
        (["0.05", 2, 2048, "send_recv", 2], "column collective", "all_reduce"),
        (["0.05", 0, 2048, "all_reduce", 2], "column num_workers", "positive integer"),
    ],
)
def test_vidur_all_reduce_bad_cells(
    tmp_path: Path, row: list[object], column: str, expected: str
) -> None:
    path = write_all_reduce(tmp_path, [["0.05", 2, 2048, "all_reduce", 2], row])
    msg = raises_input_error(load_vidur_all_reduce, path)
    assert str(path) in msg and "row 2" in msg and column in msg and expected in msg


# --- DistServe profile -----------------------------------------------------------------------


def test_distserve_profile_round_trip(tmp_path: Path) -> None:
    out = load_distserve_profile(write_profile(tmp_path, PROFILE))
    assert all(isinstance(c, DistServeCoefficients) for c in out)
    assert [(c.model, c.tp) for c in out] == [
        ("facebook/opt-13b", 1),
        ("facebook/opt-13b", 4),
        ("facebook/opt-66b", 2),
    ]
    c = out[0]
    raw = PROFILE["facebook/opt-13b"]["1"]
    assert c.engine == "vllm" and c.gpu == "A100-80GB"
    assert c.prefill == tuple(raw["prefill"])
    assert c.decode_small == tuple(raw["decoding_smallbs"])
    assert c.decode_large == tuple(raw["decoding_largebs"])
    assert c.decode_threshold == 95
    assert out[2].prefill[2] < 0  # negative fitted coefficients are kept
    other = load_distserve_profile(write_profile(tmp_path, PROFILE, "p.distserve.json"))
    assert {c.engine for c in other} == {"distserve"}


def test_distserve_forms(tmp_path: Path) -> None:
    c = load_distserve_profile(write_profile(tmp_path, PROFILE))[0]  # opt-13b tp1
    # prefill: a + b*sum(len) + c*sum(len^2) for 4 prompts of 512 tokens
    assert c.prefill_ms(4, 512) == pytest.approx(22.0 + 0.14 * 2048 + 8e-06 * 4 * 512**2)
    assert isinstance(c.prefill_ms(1, 1), float)
    # decode: a + b*sum(ctx) + c*batch, small-batch triple below the threshold
    assert c.decode_ms(94, 100) == pytest.approx(23.5 + 0.0006 * 9400 + 0.06 * 94)
    assert c.decode_ms(95, 100) == pytest.approx(20.2 + 0.0005 * 9500 + 0.12 * 95)
    arr = c.decode_ms(np.array([[94], [95]]), np.array([100, 200, 300]))
    assert isinstance(arr, np.ndarray) and arr.shape == (2, 3)
    for i, b in enumerate((94, 95)):
        for j, n in enumerate((100, 200, 300)):
            assert arr[i, j] == pytest.approx(c.decode_ms(b, n))
    grid = c.prefill_ms([1, 2, 8], 128)
    assert grid.shape == (3,) and np.all(np.diff(grid) > 0)


@pytest.mark.parametrize(("batch", "seq"), [(0, 10), (1, -5), (1, float("nan")), ("many", 1)])
def test_distserve_forms_refuse_bad_arguments(tmp_path: Path, batch: object, seq: object) -> None:
    c = load_distserve_profile(write_profile(tmp_path, PROFILE))[0]
    assert "opt-13b tp1 vllm" in raises_input_error(c.prefill_ms, batch, seq)
    assert "opt-13b tp1 vllm" in raises_input_error(c.decode_ms, batch, seq)


def test_distserve_engine_from_name(tmp_path: Path) -> None:
    path = write_profile(tmp_path, PROFILE, "profile.json")
    msg = raises_input_error(load_distserve_profile, path)
    assert str(path) in msg and "file name" in msg
    assert {c.engine for c in load_distserve_profile(path, engine="distserve")} == {"distserve"}
    msg = raises_input_error(load_distserve_profile, path, engine="sglang")
    assert "engine" in msg and "sglang" in msg


def _without(key: str) -> dict:
    data = json.loads(json.dumps(PROFILE))
    del data["facebook/opt-13b"]["1"][key]
    return data


def _with(key: str, value: object) -> dict:
    data = json.loads(json.dumps(PROFILE))
    data["facebook/opt-13b"]["1"][key] = value
    return data


@pytest.mark.parametrize(
    ("data", "field", "expected"),
    [
        ('{"facebook/opt-13b": {"1": ', "", "valid JSON"),
        ([1, 2], "top level", "JSON object"),
        (_without("decoding_largebs"), "facebook/opt-13b.1.decoding_largebs", "missing"),
        (_without("decoding_large_small_bs_threshold"), "threshold", "missing"),
        (_with("prefill", [1.0, "0.1", 2.0]), "facebook/opt-13b.1.prefill[1]", "finite number"),
        (_with("prefill", [1.0, 2.0]), "facebook/opt-13b.1.prefill", "three numbers"),
        (_with("decoding_large_small_bs_threshold", 9.5), "threshold", "positive integer"),
        ({"facebook/opt-13b": {"one": PROFILE["facebook/opt-13b"]["1"]}}, "one", "integer"),
        ({"facebook/opt-13b": {"1": [1, 2, 3]}}, "facebook/opt-13b.1", "JSON object"),
    ],
)
def test_distserve_profile_malformed(
    tmp_path: Path, data: object, field: str, expected: str
) -> None:
    path = write_profile(tmp_path, data)
    msg = raises_input_error(load_distserve_profile, path)
    assert str(path) in msg and field in msg and expected in msg


def test_distserve_profile_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.vllm.json"
    msg = raises_input_error(load_distserve_profile, path)
    assert str(path) in msg and "existing" in msg


def test_distserve_measurements_grid(tmp_path: Path) -> None:
    coeffs = load_distserve_profile(write_profile(tmp_path, PROFILE))
    opt13 = [c for c in coeffs if c.model == "facebook/opt-13b"]
    pts = distserve_measurements(opt13, batches=[8, 1, 8], lengths=[512, 64])
    assert len(pts) == 2 * 2 * 2 * 2  # tp x phase x batch x length (duplicate batch dropped)
    assert {m.share for m in pts} == {1.0}
    keys = [(m.model, m.tp, m.phase, m.batch, m.tokens) for m in pts]
    assert keys == sorted(keys)
    by_tp = {c.tp: c for c in opt13}
    for m in pts:
        c = by_tp[m.tp]
        form = c.prefill_ms if m.phase == "prefill" else c.decode_ms
        assert m.latency_ms == pytest.approx(form(m.batch, m.tokens))
        assert m.source == f"{c.source}#fit"
    named = distserve_measurements(opt13[:1], [1], [16], source="distserve-vllm")
    assert {m.source for m in named} == {"distserve-vllm"}
    # the records pass the measurement store's validation
    store = tmp_path / "m.jsonl"
    write_measurements(store, pts)
    opt = ("models:\n  facebook/opt-13b: {family: opt, layers: 40, hidden: 5120, heads: 40, "
           "kv_heads: 40, intermediate: 20480, vocab: 50272, max_context: 2048}\n")
    catalog = parse_catalog(opt, "opt.yaml", base=default_catalog())
    assert read_measurements(store, catalog) == pts
    # the bundled catalog has no OPT models: the file is refused, naming the model
    with pytest.raises(InputError, match="line 1: model"):
        read_measurements(store)


def test_distserve_measurements_refuse_bad_grids(tmp_path: Path) -> None:
    coeffs = load_distserve_profile(write_profile(tmp_path, PROFILE))
    assert "batches" in raises_input_error(distserve_measurements, coeffs, [], [16])
    assert "lengths" in raises_input_error(distserve_measurements, coeffs, [1], [0, 16])
    assert "batches" in raises_input_error(distserve_measurements, coeffs, [1.5], [16])
    assert "coeffs" in raises_input_error(distserve_measurements, [], [1], [16])
    # opt-66b's negative c makes its prefill form negative for very long prompts
    opt66 = [c for c in coeffs if c.model == "facebook/opt-66b"]
    msg = raises_input_error(distserve_measurements, opt66, [1], [200_000])
    assert "opt-66b tp2" in msg and "prefill" in msg and "positive" in msg


# --- DistServe max_num_tokens.csv ------------------------------------------------------------

MNT_HEADER = ["model", "tp", "pp", "max_num_tokens"]


def test_max_num_tokens_round_trip(tmp_path: Path) -> None:
    path = write_csv(
        tmp_path / "max_num_tokens.csv",
        MNT_HEADER,
        [
            ["facebook/opt-66b", 2, 1, 11600],
            ["facebook/opt-13b", 2, 1, 163008],
            ["facebook/opt-13b", 1, 1, 66144],
        ],
    )
    out = load_max_num_tokens(path)
    assert out == {
        ("facebook/opt-13b", 1, 1): 66144,
        ("facebook/opt-13b", 2, 1): 163008,
        ("facebook/opt-66b", 2, 1): 11600,
    }
    assert list(out) == sorted(out)


@pytest.mark.parametrize(
    ("header", "row", "field", "expected"),
    [
        (["model", "tp", "max_num_tokens"], ["m", 1, 5], "column pp", "missing"),
        (MNT_HEADER, ["m", 1, 1, "lots"], "row 2 (line 3), column max_num_tokens", "integer"),
        (MNT_HEADER, ["m", 1, 1, -5], "column max_num_tokens", "positive integer"),
        (MNT_HEADER, ["m", "x", 1, 5], "column tp", "positive integer"),
        (MNT_HEADER, ["m", 1, 1, 7], "row 2", "one row per (model, tp, pp)"),
        (MNT_HEADER, ["m", 1], "row 2", "fields"),
    ],
)
def test_max_num_tokens_malformed(
    tmp_path: Path, header: list[str], row: list[object], field: str, expected: str
) -> None:
    first = ["m", 1, 1, 5] if "pp" in header else ["m", 1, 5]
    path = write_csv(tmp_path / "max_num_tokens.csv", header, [first, row])
    msg = raises_input_error(load_max_num_tokens, path)
    assert str(path) in msg and field in msg and expected in msg


def test_max_num_tokens_missing_or_empty(tmp_path: Path) -> None:
    path = tmp_path / "max_num_tokens.csv"
    assert str(path) in raises_input_error(load_max_num_tokens, path)
    path.write_text("model,tp,pp,max_num_tokens\n")
    assert "at least one data row" in raises_input_error(load_max_num_tokens, path)


# --- docs ------------------------------------------------------------------------------------


def test_docs_importers_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    text = (REPO / "docs" / "importers.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert blocks, "docs/importers.md should hold a ```python example"
    for code in blocks:
        exec(compile(code, "docs/importers.md", "exec"), {"__name__": "__docs__"})
    out = capsys.readouterr().out
    assert "prefill 4 x 512" in out and "expected" in out


# --- published data (../shared/data) ---------------------------------------------------------


def shared_file(*parts: str) -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"published data folder {SHARED} is absent (it sits beside the checkout)")
    path = SHARED.joinpath(*parts)
    if not path.is_file():
        pytest.skip(f"published data file {path} is absent")
    return path


@pytest.mark.shared_data
def test_shared_vidur_llama2_7b_a100() -> None:
    path = shared_file(
        "profiles", "vidur", "compute", "a100", "meta-llama", "Llama-2-7b-hf", "mlp.csv"
    )
    timings = load_vidur_mlp(path)
    assert {t.model for t in timings} == {LLAMA}
    assert {t.gpu for t in timings} == {"A100-80GB"}
    assert {t.tp for t in timings} == {1, 2, 4, 8}
    assert {t.operator for t in timings} == {
        "emb",
        "input_layernorm",
        "attn_pre_proj",
        "attn_rope",
        "attn_post_proj",
        "post_attention_layernorm",
        "mlp_up_proj",
        "mlp_act",
        "mlp_down_proj",
        "add",
    }
    tp1 = sorted({t.num_tokens for t in timings if t.tp == 1})
    assert tp1[0] == 1 and tp1[-1] == 4096 and len(tp1) > 200
    layer = vidur_layer_time_ms(timings)
    assert len(layer) == 4 * len(tp1)  # every (tp, num_tokens) has every operator
    t = {n: layer[(LLAMA, "A100-80GB", 1, n)] for n in (128, 1024, 4096)}
    assert t[128] < t[1024] < t[4096]
    # 4096 tokens through ~200M weights of one layer: a few ms on an A100, not us or seconds
    assert 3.0 < t[4096] < 20.0
    assert layer[(LLAMA, "A100-80GB", 8, 4096)] < t[4096] / 3


@pytest.mark.shared_data
def test_shared_vidur_phi2_has_no_post_attention_norm() -> None:
    path = shared_file("profiles", "vidur", "compute", "h100", "microsoft", "phi-2", "mlp.csv")
    timings = load_vidur_mlp(path)
    assert "post_attention_layernorm" not in {t.operator for t in timings}
    layer = vidur_layer_time_ms(timings)
    assert len(layer) == len({t.num_tokens for t in timings}) > 100


@pytest.mark.shared_data
@pytest.mark.parametrize(
    "topology", ["a100_dgx", "a100_pairwise_nvlink", "h100_dgx", "h100_pairwise_nvlink"]
)
def test_shared_vidur_all_reduce_grows_with_size(topology: str) -> None:
    path = shared_file("profiles", "vidur", "network", topology, "all_reduce.csv")
    out = load_vidur_all_reduce(path)
    sizes = sorted({c.size_bytes for c in out})
    # bytes of fp16 messages: Vidur's element grid 1024, 5120, ... doubled
    assert sizes[:3] == [2048, 10240, 18432]
    assert all(s % 2 == 0 for s in sizes)
    groups: dict[tuple[int, int], list[CollectiveTiming]] = {}
    for c in out:
        groups.setdefault((c.num_workers, c.devices_per_node), []).append(c)
    assert len(groups) >= 2
    for key, rows in groups.items():
        rows.sort(key=lambda c: c.size_bytes)
        s = np.array([c.size_bytes for c in rows], dtype=float)
        t = np.array([c.time_ms for c in rows])
        rank_s, rank_t = np.argsort(np.argsort(s)), np.argsort(np.argsort(t))
        spearman = np.corrcoef(rank_s, rank_t)[0, 1]
        assert spearman > 0.9, (topology, key, spearman)
        q = len(t) // 10
        assert np.median(t[-q:]) > 3 * np.median(t[:q]), (topology, key)


@pytest.mark.shared_data
def test_shared_vidur_all_reduce_dgx_max_size_is_bytes() -> None:
    path = shared_file("profiles", "vidur", "network", "a100_dgx", "all_reduce.csv")
    out = load_vidur_all_reduce(path)
    # Vidur's default max_collective_size is 4096 * 8192 elements; fp16 doubles it in bytes
    assert max(c.size_bytes for c in out) == 4096 * 8192 * 2
    assert {c.num_workers for c in out if c.num_workers > c.devices_per_node} == {2, 4, 8, 16}


@pytest.mark.shared_data
def test_shared_distserve_vllm_reproduces_file() -> None:
    path = shared_file("profiles", "distserve", "profiler-a100-80g.vllm.json")
    raw = json.loads(path.read_text(encoding="utf-8"))
    out = load_distserve_profile(path)
    assert {c.engine for c in out} == {"vllm"}
    assert sorted((c.model, c.tp) for c in out) == sorted(
        (m, int(tp)) for m, by_tp in raw.items() for tp in by_tp
    )
    for c in out:
        entry = raw[c.model][str(c.tp)]
        assert c.prefill == tuple(entry["prefill"])
        assert c.decode_small == tuple(entry["decoding_smallbs"])
        assert c.decode_large == tuple(entry["decoding_largebs"])
        assert c.decode_threshold == entry["decoding_large_small_bs_threshold"]
        # upstream's get_prefill_time / get_decode_time for pp = 1
        lens = [512] * 4
        a, b, k = entry["prefill"]
        assert c.prefill_ms(4, 512) == pytest.approx(
            a + b * sum(lens) + k * sum(x * x for x in lens)
        )
        a, b, k = entry["decoding_largebs"]
        assert c.decode_ms(128, 700) == pytest.approx(a + b * 128 * 700 + k * 128)
    first = next(c for c in out if (c.model, c.tp) == ("facebook/opt-13b", 1))
    assert first.prefill[0] == pytest.approx(22.052204789310185)
    pts = distserve_measurements(out, [1, 16, 64], [128, 512, 2048])
    assert len(pts) == len(out) * 2 * 9
    assert all(m.latency_ms > 0 for m in pts)


@pytest.mark.shared_data
def test_shared_distserve_max_num_tokens() -> None:
    path = shared_file("profiles", "distserve", "max_num_tokens.csv")
    out = load_max_num_tokens(path)
    assert out[("facebook/opt-13b", 1, 1)] == 66144
    assert {m for m, _, _ in out} == {"facebook/opt-13b", "facebook/opt-66b", "facebook/opt-175b"}
    # more GPUs hold more KV cache
    assert out[("facebook/opt-13b", 8, 8)] > out[("facebook/opt-13b", 1, 1)]
