"""The recording proxy in front of the real ``vllm serve`` (CPU, a tiny dummy-weight Llama with
a word-level tokenizer and a chat template written here): chat and text completions, streamed
and not, through the proxy with the ``openai`` client and plain HTTP; the recorded tokens are the
server's own usage. Marker ``vllm``; skipped when no vLLM environment is found."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from scepsy_opt.ingest.record import RecordConfig, recording_proxy
from scepsy_opt.ingest.tracemap import TraceMap
from scepsy_opt.traces import read_trace
from scepsy_profile.profiling.models import engine_model

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}assistant{% endif %}")


def _vllm_python_or_skip() -> Path:
    from scepsy_profile.profiling.backend import BackendUnavailable
    from scepsy_profile.profiling.engine_env import vllm_python

    try:
        return vllm_python().path
    except BackendUnavailable as exc:
        pytest.skip(f"no vLLM environment: {exc}")


def write_tokenizer(folder: Path, vocab: int, bos: int, eos: int, pad: int) -> None:
    """A word-level tokenizer over ``vocab`` ids (``w<i>``, specials at their ids) with a chat
    template, in the files ``vllm serve`` reads from a model folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = {pad: "<pad>", bos: "<s>", eos: "</s>"}
    table = {specials.get(i, f"w{i}"): i for i in range(vocab)}
    table["<unk>"] = table.pop(f"w{vocab - 1}", vocab - 1)
    tok = Tokenizer(models.WordLevel(vocab=table, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 512,
        "chat_template": CHAT_TEMPLATE}))


@pytest.mark.vllm
def test_recorded_tokens_are_the_servers_usage(tmp_path: Path) -> None:
    _vllm_python_or_skip()
    openai = pytest.importorskip("openai")
    pytest.importorskip("tokenizers")

    from scepsy_profile.profiling.server import ServerConfig, vllm_server

    model = engine_model("llama-3-8b", 1 / 16)
    hf = model.hf_config()
    workdir = tmp_path / "serve"
    write_tokenizer(workdir / "model", model.vocab, hf["bos_token_id"], hf["eos_token_id"],
                    hf["pad_token_id"])
    cfg = ServerConfig(model=model, kv_gib=1.0, max_num_seqs=8, max_model_len=512,
                       extra_args=("--no-skip-tokenizer-init", "--enable-prefix-caching",
                                   "--enable-prompt-tokens-details"))
    name = cfg.served_name
    system = " ".join(f"w{i}" for i in range(100, 400))  # 2+ KV blocks (128 on CPU): cached
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": "w20 w21 w22 w23 w24"}]
    prompt = "w30 w31 w32 w33"
    extra = {"ignore_eos": True}
    out = tmp_path / "trace.jsonl"
    with vllm_server(cfg, workdir) as srv:
        # the server's own usage, asked directly
        direct_chat = httpx.post(srv.base_url + "/v1/chat/completions", timeout=120, json={
            "model": name, "messages": messages, "max_tokens": 5, **extra}).json()["usage"]
        direct_comp = httpx.post(srv.base_url + "/v1/completions", timeout=120, json={
            "model": name, "prompt": prompt, "max_tokens": 4, **extra}).json()["usage"]
        rc = RecordConfig(out=out, upstream=srv.base_url + "/v1",
                          trace_map=TraceMap(workflow="agent", models={name: "planner"}),
                          timeout_s=120, client_time=False)  # the calls alone
        with recording_proxy(rc) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120)
            hdr = {"X-Scepsy-Request": "r1"}
            answer = client.chat.completions.create(
                model=name, messages=messages, max_tokens=5, extra_body=extra,
                extra_headers={**hdr, "X-Scepsy-Role": "plan"})
            streamed = client.chat.completions.create(
                model=name, messages=messages, max_tokens=7, stream=True, extra_body=extra,
                extra_headers=hdr)
            chunks = list(streamed)
            comp = client.completions.create(model=name, prompt=prompt, max_tokens=4,
                                              extra_body=extra, extra_headers=hdr)
            asked: list[Any] = list(client.completions.create(
                model=name, prompt=prompt, max_tokens=6, stream=True,
                stream_options={"include_usage": True}, extra_body=extra, extra_headers=hdr))
            models = httpx.get(url + "/v1/models", timeout=30).json()
            stats = url.stats()
    assert models["data"][0]["id"] == name  # other paths pass through
    assert answer.usage is not None and chunks and all(c.usage is None for c in chunks)
    assert asked[-1].usage is not None and asked[-1].choices == []
    calls = read_trace(out).calls
    assert [(c.call_id, c.llm, c.error) for c in calls] == [
        ("c0", "planner", None), ("c1", "planner", None), ("c2", "planner", None),
        ("c3", "planner", None)]
    assert calls[0].role == "plan" and [c.parents for c in calls] == [(), ("c0",), ("c1",),
                                                                      ("c2",)]
    tokens = [(c.input_tokens, c.output_tokens) for c in calls]
    assert tokens[0] == (answer.usage.prompt_tokens, answer.usage.completion_tokens) \
        == (direct_chat["prompt_tokens"], 5)
    assert tokens[1] == (direct_chat["prompt_tokens"], 7)  # from the usage chunk held back
    assert comp.usage is not None
    assert tokens[2] == (comp.usage.prompt_tokens, 4) == (direct_comp["prompt_tokens"], 4)
    assert tokens[3] == (asked[-1].usage.prompt_tokens, asked[-1].usage.completion_tokens) \
        == (direct_comp["prompt_tokens"], 6)
    assert stats.recorded == 4 and stats.usage_missing == 0 and stats.failed == 0
    # the prefix is the server's cached_tokens; the chat prompt was sent before: it is cached
    details = answer.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    assert calls[0].prefix_tokens == details.cached_tokens > 0
    assert calls[1].prefix_tokens > 0  # the streamed repeat, from the usage chunk
    assert calls[1].prefix_tokens <= calls[1].input_tokens


@pytest.mark.vllm
def test_our_clients_drop_idle_connections_before_vllm_closes_them() -> None:
    """vLLM's server closes a connection idle for ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` s; our
    clients (the proxy, the gateway, replays and drives) must stop reusing one before that, or a
    call sent as the server closes it is lost."""
    import subprocess

    from scepsy_common.net import CLIENT_KEEPALIVE_S

    python = _vllm_python_or_skip()
    out = subprocess.run([str(python), "-c", "import vllm.envs as e; "
                          "print(e.VLLM_HTTP_TIMEOUT_KEEP_ALIVE)"], capture_output=True,
                         text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.split()[-1]) > CLIENT_KEEPALIVE_S
