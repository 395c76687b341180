"""Reader of MuxServe's measured end-to-end runs (benchmark/chatlmsys, docs/validate.md).

A folder holds, for one or more loads (workloads) and strategies:

* ``yamls/<workload>.yaml``: the cluster (``nnodes``, ``ngpus_per_node``), each LLM's model
  (a checkpoint path whose last part is a catalog model, e.g. ``.../llama-13b``) and mean
  request ``rate`` (req/s), the mean prompt and output lengths (``avg_prompt_len``,
  ``avg_output_len``);
* ``yamls/<strategy>/<workload>_GPUnum<G>_mesh_size<k>_idx<i>[_<strategy>].yaml``: one mesh of
  the placement: ``num_gpus``, ``gpu_memory_utilization`` (the mesh's fraction of each GPU's
  memory for KV caches, on top of the weights) and its LLMs with ``tensor_parallel_size``,
  ``mps_percentage`` (its prefills run at the larger limit, its decodes at the smaller:
  :func:`engine_limits`) and ``max_num_seqs``;
* ``merged/merged_<workload>_placement_<workload>_GPUnum<G>_<strategy>.json``: what was
  measured per LLM (throughput, request count, mean TTFT and TPOT, p90/p95/p99 of TTFT, TPOT
  and request latency) and, where present, the counts behind each LLM's request lengths:
  ``tokens_throughput`` (prompt plus output tokens over the same time as ``throughput``) and
  the decode batches (``decoding_avg_batches`` x ``decoding_batch_times``: one token per
  running request per step, so the output tokens of all requests).

Each LLM's mean prompt and output lengths are its requests' (:meth:`MeasuredLLM.lengths`):
output ``decode batches x steps / N``, prompt the tokens per request minus that. They are an
input of the run (the same sampled requests under every strategy and load), so they hold for
a prediction; where the counts are missing, the workload's ``avg_prompt_len`` and
``avg_output_len`` stand for every LLM.

A run is one (workload, strategy) with a merged file; its meshes must place every LLM of the
workload exactly once. Anything malformed is an :class:`InputError` naming the file and the
field.

A load's recorded requests, where one has them, are in MuxServe's workload file (the
``--workload-file`` of its runs, named ``<workload>.json``; :func:`load_muxserve_workload`):
every request's arrival time, LLM and prompt and output tokens.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

from scepsy_common.errors import InputError
from scepsy_common.files import read_json, read_yaml
from scepsy_profile.catalog import default_catalog

STRATEGIES = ("spatial", "flexsm", "temporal")
"""MuxServe's placement strategies: one LLM per mesh; LLMs sharing a mesh under MPS; LLMs of
a mesh taking turns on its GPUs."""
GPU = "A100-80GB"
"""The GPU of MuxServe's runs (32 A100-80GB)."""
_RESULT = re.compile(r"_GPUnum(?P<g>\d+)_(?:spatial|flexsm|temporal)\.json$")
_MESH = re.compile(r"^(?P<w>.+)_GPUnum(?P<g>\d+)_mesh_size(?P<k>\d+)_idx(?P<i>\d+)"
                   r"(?:_(?P<s>spatial|flexsm|temporal))?$")


@dataclass(frozen=True)
class MeshLLM:
    """One LLM of a mesh: its tensor parallelism, MPS limits (percent of the SMs) for prefill
    and decode, and its batch limit."""

    name: str
    tp: int
    prefill_pct: float
    decode_pct: float
    max_num_seqs: int


@dataclass(frozen=True)
class Mesh:
    """GPUs that serve some LLMs together (``source``: its file)."""

    source: str
    gpus: int
    memory_utilization: float
    max_num_seqs: int  # the mesh's batch limit
    llms: tuple[MeshLLM, ...]


@dataclass(frozen=True)
class MeasuredLLM:
    """What one LLM's clients measured (seconds, req/s)."""

    throughput: float
    requests: int
    ttft_mean_s: float
    tpot_mean_s: float
    p90_ttft_s: float
    p99_ttft_s: float
    p90_latency_s: float
    p99_latency_s: float
    p90_tpot_s: float
    mps: tuple[float, float] | None = None  # [prefill %, decode %] the run recorded
    tokens_per_request: float | None = None  # prompt + output (tokens_throughput/throughput)
    output_tokens: float | None = None  # mean output (decode batches x steps / requests)
    decode_batch: float | None = None  # sequences per decode step (decoding_avg_batches)

    def mean_latency_s(self, output_mean: float) -> float:
        """The mean request latency: TTFT plus ``output_mean`` mean TPOTs (MuxServe's TPOT is
        a request's decode time over its output length, and it reports no mean latency; this
        is the expectation when a request's TPOT and output length are uncorrelated)."""
        return self.ttft_mean_s + self.tpot_mean_s * output_mean

    def lengths(self) -> tuple[float, float] | None:
        """The mean prompt and output lengths of this LLM's requests (tokens), or None where
        the results lack the counts (module docstring)."""
        if self.tokens_per_request is None or self.output_tokens is None:
            return None
        return self.tokens_per_request - self.output_tokens, self.output_tokens


@dataclass(frozen=True)
class MuxRun:
    """One measured run: a workload under one strategy."""

    workload: str
    strategy: str
    nodes: int
    gpus_per_node: int
    rates: Mapping[str, float]
    models: Mapping[str, str]
    prompt_mean: float
    output_mean: float
    meshes: tuple[Mesh, ...]
    measured: Mapping[str, MeasuredLLM]

    def mesh_of(self, llm: str) -> Mesh:
        return next(m for m in self.meshes if any(x.name == llm for x in m.llms))

    def lengths(self, llm: str) -> tuple[float, float]:
        """The mean prompt and output lengths of ``llm``'s requests (its measured counts,
        else the workload's means)."""
        return self.measured[llm].lengths() or (self.prompt_mean, self.output_mean)


READ_FOLDERS = ("yamls", "merged")
"""The sub-folders of a results folder that :func:`load_muxserve_dir` reads (with their
sub-folders): an output written there would become, or overwrite, one of its inputs."""


def inside_read_folders(folder: str | Path, path: str | Path) -> bool:
    """Whether ``path`` lies in one of ``folder``'s :data:`READ_FOLDERS`."""
    real = Path(os.path.realpath(path))
    return any(real.is_relative_to(os.path.realpath(Path(folder) / sub))
               for sub in READ_FOLDERS)


def load_muxserve_dir(path: str | Path) -> tuple[MuxRun, ...]:
    """Every run in ``path`` (the layout of the module docstring), sorted by workload and
    strategy (:data:`STRATEGIES` order)."""
    root = Path(path)
    if not root.is_dir():
        raise InputError(str(root), "", "a folder of MuxServe results (yamls/, merged/)")
    ydir = root / "yamls"
    workloads = sorted(p for p in ydir.glob("*.yaml")) if ydir.is_dir() else []
    if not workloads:
        raise InputError(str(ydir), "", "one or more workload files yamls/<workload>.yaml")
    runs: list[MuxRun] = []
    for wfile in workloads:
        w = _workload(wfile)
        for strategy in STRATEGIES:
            merged = sorted((root / "merged").glob(
                f"merged_{wfile.stem}_placement_{wfile.stem}_GPUnum*_{strategy}.json"))
            if not merged:
                continue
            if len(merged) > 1:
                raise InputError(str(root / "merged"), f"{wfile.stem} {strategy}",
                                 "one results file per load and strategy",
                                 [p.name for p in merged])
            gpus = _RESULT.match(merged[0].name)
            meshes = _meshes(ydir / strategy, wfile.stem, strategy, w,
                             int(gpus.group("g")) if gpus else None)
            measured = _measured(merged[0], w["rates"])
            meshes = _recorded_mps(meshes, measured)
            runs.append(MuxRun(wfile.stem, strategy, w["nodes"], w["per_node"],
                               MappingProxyType(w["rates"]), MappingProxyType(w["models"]),
                               w["prompt"], w["output"], meshes, MappingProxyType(measured)))
    if not runs:
        raise InputError(str(root / "merged"), "", "measured results merged/merged_<workload>_"
                         "placement_..._<strategy>.json for a workload of yamls/")
    return tuple(runs)


def _workload(path: Path) -> dict[str, Any]:
    src = str(path)
    doc = _mapping(read_yaml(path, "MuxServe workload YAML"), src, "top level")
    cluster = _mapping(doc.get("cluster"), src, "cluster")
    models = doc.get("models")
    if not isinstance(models, list) or not models:
        raise InputError(src, "models", "a list of {name, model, rate}", models)
    rates: dict[str, float] = {}
    names: dict[str, str] = {}
    for i, entry in enumerate(models):
        e = _mapping(entry, src, f"models[{i}]")
        name = e.get("name")
        if not isinstance(name, str) or not name or name in rates:
            raise InputError(src, f"models[{i}].name", "a unique LLM name", name)
        rates[name] = _num(e.get("rate"), src, f"models[{i}].rate", "a rate > 0 (req/s)", 0.0)
        if rates[name] <= 0:
            raise InputError(src, f"models[{i}].rate", "a rate > 0 (req/s)", e.get("rate"))
        names[name] = _model(e.get("model"), src, f"models[{i}].model")
    return {"nodes": _int(cluster.get("nnodes"), src, "cluster.nnodes"),
            "per_node": _int(cluster.get("ngpus_per_node"), src, "cluster.ngpus_per_node"),
            "rates": rates, "models": names,
            "prompt": _num(doc.get("avg_prompt_len"), src, "avg_prompt_len",
                           "a mean prompt length >= 1 (tokens)", 1.0),
            "output": _num(doc.get("avg_output_len"), src, "avg_output_len",
                           "a mean output length >= 1 (tokens)", 1.0)}


def _meshes(folder: Path, stem: str, strategy: str, w: Mapping[str, Any],
            gpus: int | None) -> tuple[Mesh, ...]:
    files = []
    for p in sorted(folder.glob(f"{stem}_GPUnum*_mesh_size*_idx*.yaml")) if folder.is_dir() else []:
        m = _MESH.match(p.stem)
        if m and m.group("w") == stem and m.group("s") in (None, strategy) and (
                gpus is None or int(m.group("g")) == gpus):
            files.append((int(m.group("i")), p))
    if not files:
        raise InputError(str(folder), "", f"the {strategy} placement of {stem}: files "
                         f"{stem}_GPUnum<G>_mesh_size<k>_idx<i>.yaml")
    meshes: list[Mesh] = []
    placed: dict[str, str] = {}
    for _, p in sorted(files):
        src = str(p)
        doc = _mapping(read_yaml(p, "MuxServe mesh YAML"), src, "top level")
        gpus = _int(doc.get("num_gpus"), src, "num_gpus")
        util = _num(doc.get("gpu_memory_utilization"), src, "gpu_memory_utilization",
                    "a memory fraction in (0, 1]", 0.0)
        if not 0 < util <= 1:
            raise InputError(src, "gpu_memory_utilization", "a memory fraction in (0, 1]", util)
        entries = doc.get("models")
        if not isinstance(entries, list) or not entries:
            raise InputError(src, "models", "a list of the mesh's LLMs", entries)
        llms: list[MeshLLM] = []
        for i, entry in enumerate(entries):
            e = _mapping(entry, src, f"models[{i}]")
            name: Any = e.get("name")  # the YAML's value, checked below
            where = f"models[{i}]"
            if name not in w["rates"]:
                raise InputError(src, f"{where}.name", f"an LLM of the workload "
                                 f"({', '.join(w['rates'])})", name)
            if name in placed:
                raise InputError(src, f"{where}.name", f"an LLM placed once (also in "
                                 f"{placed[name]})", name)
            placed[name] = src
            if _model(e.get("model"), src, f"{where}.model") != w["models"][name]:
                raise InputError(src, f"{where}.model", f"the workload's model of {name} "
                                 f"({w['models'][name]})", e.get("model"))
            tp = _int(e.get("tensor_parallel_size"), src, f"{where}.tensor_parallel_size")
            if tp > gpus:
                raise InputError(src, f"{where}.tensor_parallel_size",
                                 f"at most the mesh's {gpus} GPUs", tp)
            pct = e.get("mps_percentage")
            if not isinstance(pct, list) or len(pct) != 2:
                raise InputError(src, f"{where}.mps_percentage",
                                 "[prefill %, decode %] of the SMs", pct)
            pre, dec = (_num(v, src, f"{where}.mps_percentage[{j}]", "a percentage in (0, 100]",
                             0.0) for j, v in enumerate(pct))
            if not (0 < pre <= 100 and 0 < dec <= 100):
                raise InputError(src, f"{where}.mps_percentage", "percentages in (0, 100]", pct)
            seqs = _int(e.get("max_num_seqs", doc.get("max_num_seqs")), src,
                        f"{where}.max_num_seqs")
            llms.append(MeshLLM(name, tp, *engine_limits(pre, dec), seqs))
        meshes.append(Mesh(src, gpus, util, _int(doc.get("max_num_seqs"), src, "max_num_seqs"),
                           tuple(llms)))
    missing = [m for m in w["rates"] if m not in placed]
    if missing:
        raise InputError(str(folder), f"{stem} {strategy}", "a mesh for every LLM of the "
                         f"workload (none places {', '.join(missing)})")
    return tuple(meshes)


_Mps = tuple[float, float]  # a MeasuredLLM's mps where it is not None


def engine_limits(first: float, second: float) -> tuple[float, float]:
    """An LLM's (prefill, decode) MPS limits from its ``mps_percentage`` pair, as MuxServe's
    engine uses them: its prefills run in the process with the larger limit and its decodes in
    the one with the smaller (``MuxScheduler.estimate_mps``), whichever the file lists first."""
    return max(first, second), min(first, second)


def _with_limits(x: MeshLLM, limits: tuple[float, float]) -> MeshLLM:
    return replace(x, prefill_pct=limits[0], decode_pct=limits[1])


def _recorded_mps(meshes: tuple[Mesh, ...], measured: Mapping[str, MeasuredLLM]
                  ) -> tuple[Mesh, ...]:
    """The meshes with each LLM's MPS limits as the run recorded them (``mps`` of the results,
    where given): the placement YAMLs are inputs to MuxServe's placement generator, and six
    flexsm LLMs of the ChatLMSYS runs recorded other limits than their YAML's."""
    out = []
    for mesh in meshes:
        llms = tuple(_with_limits(x, engine_limits(*cast(_Mps, measured[x.name].mps)))
                     if measured[x.name].mps is not None else x for x in mesh.llms)
        out.append(replace(mesh, llms=llms))
    return tuple(out)


def _measured(path: Path, rates: Mapping[str, float]) -> dict[str, MeasuredLLM]:
    src = str(path)
    doc = _mapping(read_json(path, "MuxServe merged results JSON"), src, "top level")
    out: dict[str, MeasuredLLM] = {}
    for name in rates:
        if name not in doc:
            raise InputError(src, name, f"a results entry for LLM {name} (every LLM of the "
                             "workload is measured)")
        e = _mapping(doc.get(name), src, name)

        def f(key: str, low: float = 0.0, e: Mapping[str, Any] = e, name: str = name) -> float:
            return _num(e.get(key), src, f"{name}.{key}", f"a number >= {low:g}", low)
        requests = _int(e.get("request_num"), src, f"{name}.request_num")
        throughput = f("throughput")
        tokens, output = _length_counts(e, src, name, requests, throughput, f)
        out[name] = MeasuredLLM(
            throughput=throughput, requests=requests,
            ttft_mean_s=f("first_token_latency"), tpot_mean_s=f("output_per_token_latency"),
            p90_ttft_s=f("p90[TTFT]"), p99_ttft_s=f("p99[TTFT]"),
            p90_latency_s=f("p90[avg_latency]"), p99_latency_s=f("p99[avg_latency]"),
            p90_tpot_s=f("p90[TPOT]"), mps=_mps(e.get("mps"), src, f"{name}.mps"),
            tokens_per_request=tokens, output_tokens=output,
            decode_batch=None if output is None else f("decoding_avg_batches"))
    return out


LENGTH_KEYS = ("tokens_throughput", "decoding_avg_batches", "decoding_batch_times")


def _length_counts(e: Mapping[str, Any], src: str, name: str, requests: int, throughput: float,
                   f: Callable[[str], float]) -> tuple[float | None, float | None]:
    """Tokens per request and output tokens per request from one LLM's results entry (None,
    None where any of :data:`LENGTH_KEYS` is missing or the LLM served nothing)."""
    if any(e.get(k) is None for k in LENGTH_KEYS):
        return None, None
    tokens, steps = f("tokens_throughput"), f("decoding_avg_batches") * f("decoding_batch_times")
    if throughput <= 0 or requests < 1:
        return None, None
    per, output = tokens / throughput, steps / requests
    if not (output >= 1.0 and per - output >= 1.0):
        raise InputError(src, f"{name}.tokens_throughput", "token counts with at least one "
                         "prompt and one output token per request (tokens_throughput / "
                         "throughput > decoding_avg_batches x decoding_batch_times / "
                         "request_num)", f"{per:.4g} tokens, {output:.4g} output")
    return per, output


def _mps(raw: object, src: str, where: str) -> tuple[float, float] | None:
    """The ``[prefill %, decode %]`` a run recorded, or None where it recorded none."""
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != 2:
        raise InputError(src, where, "[prefill %, decode %] of the SMs", raw)
    pre, dec = (_num(v, src, f"{where}[{j}]", "a percentage in (0, 100]", 0.0)
                for j, v in enumerate(raw))
    if not (0 < pre <= 100 and 0 < dec <= 100):
        raise InputError(src, where, "percentages in (0, 100]", raw)
    return pre, dec


def _mapping(obj: object, src: str, where: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise InputError(src, where, "a mapping", type(obj).__name__)
    return obj


def _num(raw: object, src: str, where: str, expected: str, low: float) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) \
            or raw < low:
        raise InputError(src, where, expected, raw)
    return float(raw)


def _int(raw: object, src: str, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise InputError(src, where, "an integer >= 1", raw)
    return raw


def _model(raw: object, src: str, where: str) -> str:
    """The catalog model a checkpoint path names (its last part, e.g. ``llama-13b``)."""
    if not isinstance(raw, str) or not raw.strip("/"):
        raise InputError(src, where, "a model checkpoint path ending in a catalog model name",
                         raw)
    base = raw.rstrip("/").rsplit("/", 1)[-1]
    try:
        return default_catalog().model(base).name
    except InputError:
        raise InputError(src, where, "a checkpoint path whose last part is a catalog model "
                         "(e.g. .../llama-13b)", raw) from None


MAX_RECORDED = 10_000_000
"""The most requests one workload file may hold."""


@dataclass(frozen=True)
class RecordedLLM:
    """One LLM's requests in a MuxServe workload file: arrival times from the workload's
    start (s, sorted) and each request's prompt and output tokens (in arrival order)."""

    times_s: tuple[float, ...]
    prompts: tuple[int, ...]
    outputs: tuple[int, ...]

    @property
    def rate(self) -> float:
        """The LLM's rate as MuxServe defines it: its requests over their span (req/s; its
        count over its first arrival's time when all arrive at once)."""
        span = self.times_s[-1] - self.times_s[0]
        return len(self.times_s) / (span if span > 0 else max(self.times_s[-1], 1e-9))


@dataclass(frozen=True)
class RecordedWorkload:
    """A load's recorded requests (:func:`load_muxserve_workload`): per LLM, from ``source``."""

    source: str
    llms: Mapping[str, RecordedLLM]


def load_muxserve_workload(path: str | os.PathLike[str]) -> RecordedWorkload:
    """Each LLM's recorded requests in MuxServe's workload file (its ``--workload-file``:
    ``{"arrivals": [s, ...], "requests": [{"model_name": "llm-3", "data": [prompt, prompt
    tokens, output tokens], ...}, ...]}``, one request per arrival; other fields ignored).
    Anything malformed is an :class:`InputError` naming the file and the field."""
    src = str(path)
    doc = _mapping(read_json(Path(path), "MuxServe workload JSON"), src, "top level")
    arrivals, requests = doc.get("arrivals"), doc.get("requests")
    if not isinstance(arrivals, list) or not arrivals:
        raise InputError(src, "arrivals", "a list of arrival times (s), one per request",
                         type(arrivals).__name__)
    if not isinstance(requests, list) or len(requests) != len(arrivals):
        raise InputError(src, "requests", f"a list of {len(arrivals)} requests, one per arrival",
                         len(requests) if isinstance(requests, list) else type(requests).__name__)
    if len(arrivals) > MAX_RECORDED:
        raise InputError(src, "arrivals", f"at most {MAX_RECORDED} requests", len(arrivals))
    per: dict[str, list[tuple[float, int, int]]] = {}
    for i, (t, r) in enumerate(zip(arrivals, requests, strict=True)):
        time = _num(t, src, f"arrivals[{i}]", "an arrival time >= 0 (s)", 0.0)
        e = _mapping(r, src, f"requests[{i}]")
        name = e.get("model_name")
        if not isinstance(name, str) or not name:
            raise InputError(src, f"requests[{i}].model_name", "the LLM's name (e.g. llm-3)",
                             name)
        data = e.get("data")
        if not isinstance(data, list | tuple) or len(data) < 3:
            raise InputError(src, f"requests[{i}].data", "[prompt, prompt tokens, output "
                             "tokens]", data)
        prompt = _int(data[1], src, f"requests[{i}].data[1] (prompt tokens)")
        output = _int(data[2], src, f"requests[{i}].data[2] (output tokens)")
        per.setdefault(name, []).append((time, prompt, output))
    out = {}
    for name, reqs in sorted(per.items()):
        reqs.sort(key=lambda x: x[0])
        out[name] = RecordedLLM(tuple(x[0] for x in reqs), tuple(x[1] for x in reqs),
                                tuple(x[2] for x in reqs))
    return RecordedWorkload(src, MappingProxyType(out))
