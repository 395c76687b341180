"""Tests for the hardware/model catalog: specs, derived sizes, YAML files and docs/catalog.md."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_common.errors import InputError, UnknownEntryError
from scepsy_profile.catalog import (
    Catalog,
    default_catalog,
    dump_catalog,
    load_catalog,
    parse_catalog,
    save_catalog,
)
from scepsy_profile.hardware import GPUSpec
from scepsy_profile.models import ModelSpec

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "catalog.md"

H100 = GPUSpec("H100-80GB", 79.65, 989.0, 3350.0, 8, 900.0)
TINY = ModelSpec("tiny", "test", layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128,
                 vocab=1000, max_context=256)

GPU_YAML = """\
gpus:
  X-GPU:
    memory_gib: 24
    bf16_tflops: 100
    hbm_gbps: 1000
    nvlink_domain: 1
    interconnect_gbps: 64
"""


def model_yaml(**overrides: object) -> str:
    fields: dict[str, object] = dict(family="test", layers=2, hidden=64, heads=4, kv_heads=2,
                                     intermediate=128, vocab=1000, max_context=256)
    fields.update(overrides)
    body = "".join(f"    {k}: {v}\n" for k, v in fields.items() if v is not None)
    return f"models:\n  m:\n{body}"


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return default_catalog()


# --- bundled catalog ---------------------------------------------------------------------------


def test_bundled_catalog_has_the_listed_gpus_and_models(cat: Catalog) -> None:
    assert set(cat.gpus) == {"A100-80GB", "A100-40GB", "H100-80GB", "H200", "L4", "A10",
                             "B200", "GB200"}
    expected_models = {
        "llama-7b", "llama-13b", "llama-30b", "llama-65b", "llama-2-7b", "llama-2-13b",
        "llama-2-70b", "llama-3-8b", "llama-3-70b", "qwen2.5-0.5b", "qwen2.5-1.5b",
        "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b",
        "codellama-34b", "qwen-72b", "phi-2", "bge-reranker-large", "qwen2.5-math-prm-7b",
        "skywork-prm-1.5b",
    }
    assert expected_models <= set(cat.models)


def test_default_catalog_is_cached_and_read_only(cat: Catalog) -> None:
    assert default_catalog() is cat
    with pytest.raises(TypeError):
        cat.gpus["new"] = H100  # type: ignore[index]
    with pytest.raises(AttributeError):
        cat.gpus = {}  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("llama-7b", 6.74e9), ("llama-2-7b", 6.74e9), ("llama-13b", 13.0e9),
        ("llama-2-13b", 13.0e9), ("llama-30b", 32.5e9), ("llama-65b", 65.2e9),
        ("llama-2-70b", 69.0e9), ("llama-3-8b", 8.03e9), ("llama-3-70b", 70.6e9),
        ("codellama-34b", 33.7e9), ("qwen-72b", 72.3e9), ("phi-2", 2.78e9),
        ("qwen2.5-0.5b", 0.49e9), ("qwen2.5-1.5b", 1.54e9), ("qwen2.5-3b", 3.09e9),
        ("qwen2.5-7b", 7.61e9), ("qwen2.5-14b", 14.7e9), ("qwen2.5-32b", 32.5e9),
        ("qwen2.5-72b", 72.7e9), ("bge-reranker-large", 0.56e9),
        ("qwen2.5-math-prm-7b", 7.07e9), ("skywork-prm-1.5b", 1.54e9),
    ],
)
def test_parameter_counts_match_published_sizes(cat: Catalog, name: str, published: float) -> None:
    assert cat.model(name).params == pytest.approx(published, rel=0.03)


def test_parameter_count_formula_for_llama_7b(cat: Catalog) -> None:
    m = cat.model("llama-7b")
    per_layer = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096
    assert m.params == 2 * 32000 * 4096 + 32 * per_layer + 4096 == 6_738_415_616
    assert m.weight_bytes == 2 * m.params
    assert m.head_dim == 128


@pytest.mark.parametrize(("name", "kv_bytes"), [
    ("llama-7b", 524_288), ("llama-2-7b", 524_288), ("llama-3-8b", 131_072),
    ("llama-2-70b", 327_680), ("qwen2.5-7b", 57_344), ("bge-reranker-large", 0),
])
def test_kv_bytes_per_token(cat: Catalog, name: str, kv_bytes: int) -> None:
    assert cat.model(name).kv_bytes_per_token == kv_bytes


def test_kv_bytes_per_gpu_split_kv_heads_and_replicate_past_them(cat: Catalog) -> None:
    llama = cat.model("llama-7b")
    assert llama.kv_bytes_per_token_per_gpu(1) == 524_288
    assert llama.kv_bytes_per_token_per_gpu(4) == 524_288 // 4
    l3 = cat.model("llama-3-8b")  # 8 KV heads
    assert l3.kv_bytes_per_token_per_gpu(8) == 131_072 // 8
    assert l3.kv_heads_per_gpu(16) == 1  # heads 32 split 16 ways, KV heads replicated
    assert l3.kv_bytes_per_token_per_gpu(16) == 131_072 // 8
    assert cat.model("bge-reranker-large").kv_bytes_per_token_per_gpu(2) == 0


def test_weight_bytes_per_gpu(cat: Catalog) -> None:
    for m in cat.models.values():
        assert m.weight_bytes_per_gpu(1) == m.weight_bytes, m.name
    l70 = cat.model("llama-2-70b")
    per_gpu = [l70.weight_bytes_per_gpu(tp) for tp in (1, 2, 4, 8)]
    assert per_gpu == sorted(per_gpu, reverse=True)
    assert per_gpu[3] == pytest.approx(l70.weight_bytes / 8, rel=1e-3)
    l3 = cat.model("llama-3-8b")  # at tp=16 the k/v projections are replicated, not split
    kv_proj = 32 * 2 * 4096 * 128 * 2  # one KV head's k and v in every layer, bf16
    assert l3.weight_bytes_per_gpu(16) > l3.weight_bytes / 16 + kv_proj / 2


def test_tensor_parallel_degree_is_checked(cat: Catalog) -> None:
    qwen = cat.model("qwen2.5-7b")  # 28 heads, 4 KV heads
    assert qwen.supports_tp(4) and qwen.supports_tp(2) and qwen.supports_tp(1)
    assert not qwen.supports_tp(8) and not qwen.supports_tp(7) and not qwen.supports_tp(0)
    with pytest.raises(InputError, match="tp"):
        qwen.weight_bytes_per_gpu(8)
    with pytest.raises(InputError, match="28 attention heads"):
        qwen.kv_bytes_per_token_per_gpu(3)


def test_linear_flops_count_every_matmul_including_the_head(cat: Catalog) -> None:
    llama = cat.model("llama-7b")  # untied: params = embedding + matmuls + norms
    norms = 32 * 2 * 4096 + 4096
    assert llama.linear_flops_per_token == 2 * (llama.params - 32000 * 4096 - norms)
    qwen = cat.model("qwen2.5-0.5b")  # tied: the embedding matrix is also the LM head matmul
    assert qwen.linear_flops_per_token == 2 * (qwen.params - (24 * 2 * 896 + 896))
    prm = cat.model("qwen2.5-math-prm-7b")  # score head (d x d, d x 2) instead of the LM head
    lm = cat.model("qwen2.5-7b")
    assert prm.linear_flops_per_token == lm.linear_flops_per_token - 2 * 152064 * 3584 + 2 * (
        3584 * 3584 + 3584 * 2)
    assert prm.params == lm.params - 152064 * 3584 + 3584 * 3584 + 3584 * 2
    # tied embeddings drop only an LM head: a tied model with a score head still has the head
    skywork, base = cat.model("skywork-prm-1.5b"), cat.model("qwen2.5-1.5b")
    assert skywork.tied_embeddings and base.tied_embeddings
    assert skywork.params == base.params + 1536 * 1536 + 1536 * 2


def test_attention_flops(cat: Catalog) -> None:
    m = cat.model("llama-7b")
    unit = 4 * 32 * 32 * 128  # 4 * L * H * h
    assert m.attention_flops(1, 1000) == unit * 1000  # decode step, KV cache of 999
    assert m.attention_flops(512, 512) == unit * 512 * 513 // 2  # causal fresh prefill
    assert m.attention_flops(512, 512, causal=False) == unit * 512 * 512
    assert m.attention_flops(2, 10) == unit * (9 + 10)  # a chunk after 8 cached tokens
    assert m.layer_attention_flops(1, 100) * 32 == m.attention_flops(1, 100)
    bge = cat.model("bge-reranker-large")  # encoders attend both ways by default
    assert bge.attention_flops(512, 512) == 4 * 24 * 16 * 64 * 512 * 512
    with pytest.raises(InputError, match="context"):
        m.attention_flops(10, 5)
    with pytest.raises(InputError, match="tokens_new"):
        m.attention_flops(-1, 5)


def test_gpu_spec_derived_units(cat: Catalog) -> None:
    a100 = cat.gpu("A100-80GB")
    assert a100.memory_bytes == 80 * 2**30
    assert a100.peak_flops == 312e12
    assert a100.hbm_bytes_per_s == 2039e9
    assert cat.gpu("GB200").nvlink_domain == 72 and cat.gpu("L4").nvlink_domain == 1


# --- direct validation -------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), [
    ("memory_gib", -1.0), ("memory_gib", 0), ("bf16_tflops", float("nan")),
    ("hbm_gbps", float("inf")), ("interconnect_gbps", True), ("nvlink_domain", 0),
    ("nvlink_domain", 2.0), ("name", ""), ("name", " H100"),
])
def test_gpu_spec_rejects_bad_values(field: str, value: object) -> None:
    kwargs = dict(name="G", memory_gib=80.0, bf16_tflops=1.0, hbm_gbps=1.0, nvlink_domain=1,
                  interconnect_gbps=1.0)
    kwargs[field] = value
    with pytest.raises(InputError) as info:
        GPUSpec(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize(("changes", "field"), [
    ({"heads": 5}, "heads"),  # 64 % 5
    ({"kv_heads": 3}, "kv_heads"),  # 4 % 3
    ({"layers": 0}, "layers"),
    ({"vocab": 10.0}, "vocab"),
    ({"dtype_bytes": True}, "dtype_bytes"),
    ({"gated_mlp": 1}, "gated_mlp"),
    ({"kind": "seq2seq"}, "kind"),
    ({"output_head": "value"}, "output_head"),
    ({"family": " "}, "family"),
])
def test_model_spec_rejects_bad_values(changes: dict[str, object], field: str) -> None:
    kwargs = dict(name="m", family="f", layers=2, hidden=64, heads=4, kv_heads=2,
                  intermediate=128, vocab=1000, max_context=256)
    kwargs.update(changes)
    with pytest.raises(InputError) as info:
        ModelSpec(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


# --- lookup ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("alias", "canonical"), [
    ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
    ("META-LLAMA/LLAMA-2-7B-HF", "llama-2-7b"),
    ("meta-llama/Meta-Llama-3-8B", "llama-3-8b"),
    ("meta-llama/meta-llama-3-70b", "llama-3-70b"),
    ("meta-llama/Llama-2-70b-hf", "llama-2-70b"),
    ("codellama/CodeLlama-34b-Instruct-hf", "codellama-34b"),
    ("Qwen/Qwen-72B", "qwen-72b"),
    ("microsoft/phi-2", "phi-2"),
    ("qwen/qwen2.5-7b-instruct", "qwen2.5-7b"),
    ("BAAI/bge-reranker-large", "bge-reranker-large"),
    ("Qwen/Qwen2.5-Math-PRM-7B", "qwen2.5-math-prm-7b"),
    ("LLaMA-7B", "llama-7b"),
    ("  llama-65b ", "llama-65b"),
])
def test_model_lookup_resolves_aliases_case_insensitively(
    cat: Catalog, alias: str, canonical: str
) -> None:
    assert cat.model(alias).name == canonical
    assert cat.has_model(alias)


def test_gpu_lookup_is_case_insensitive(cat: Catalog) -> None:
    assert cat.gpu("h100-80gb") is cat.gpus["H100-80GB"]
    assert cat.gpu("gb200").name == "GB200"
    assert cat.has_gpu("l4") and not cat.has_gpu("L40S")


def test_aliases_of(cat: Catalog) -> None:
    assert "meta-llama/Llama-2-7b-hf" in cat.aliases_of("LLAMA-2-7B")
    assert cat.aliases_of("huggyllama/llama-7b") == ("huggyllama/llama-7b",)


@pytest.mark.parametrize(("kind", "name", "suggestion"), [
    ("model", "llama2-7b", "llama-2-7b"),
    ("model", "Qwen/Qwen2.5-7B-Instruc", "Qwen/Qwen2.5-7B-Instruct"),
    ("GPU", "H100", "H100-80GB"),
    ("GPU", "a100-80g", "A100-80GB"),
])
def test_unknown_names_raise_with_suggestions(
    cat: Catalog, kind: str, name: str, suggestion: str
) -> None:
    lookup = cat.model if kind == "model" else cat.gpu
    with pytest.raises(UnknownEntryError) as info:
        lookup(name)
    err = info.value
    assert isinstance(err, InputError) and isinstance(err, KeyError)
    assert suggestion in err.suggestions  # type: ignore[attr-defined]
    text = str(err)
    assert f"unknown {kind} {name!r}" in text and repr(suggestion) in text


def test_unknown_name_without_close_match_lists_known_names(cat: Catalog) -> None:
    with pytest.raises(UnknownEntryError, match="known: A10, A100-40GB"):
        cat.gpu("zzzzzzzz")


# --- derivation --------------------------------------------------------------------------------


def test_with_gpu_and_with_model_return_new_catalogs(cat: Catalog) -> None:
    mine = GPUSpec("a100-80gb", 79.2, 312.0, 2039.0, 8, 600.0)
    c2 = cat.with_gpu(mine).with_model(TINY, aliases=["org/Tiny-Instruct"])
    assert c2.gpu("A100-80GB") == mine and "A100-80GB" not in c2.gpus
    assert c2.model("ORG/tiny-instruct") == TINY
    assert cat.gpu("A100-80GB").memory_gib == 80.0  # the original is unchanged
    assert not cat.has_model("tiny")
    assert len(c2.gpus) == len(cat.gpus) and len(c2.models) == len(cat.models) + 1


def test_merge_overrides_whole_entries_and_keeps_aliases_pointing_at_replacements(
    cat: Catalog,
) -> None:
    llama = ModelSpec("LLaMA-7B", "llama", 32, 4096, 32, 32, 11008, 32000, 4096)
    merged = cat.merge(Catalog(models={llama.name: llama}))
    assert merged.model("huggyllama/llama-7b") is merged.models["LLaMA-7B"]
    assert "llama-7b" not in merged.models and merged.model("llama-7b").max_context == 4096


def test_model_name_in_override_shadows_a_base_alias(cat: Catalog) -> None:
    own = ModelSpec("microsoft/phi-2", "phi", 2, 64, 4, 4, 128, 1000, 256)
    merged = cat.merge(Catalog(models={own.name: own}))
    assert merged.model("microsoft/phi-2") == own
    assert merged.model("phi-2").name == "phi-2"


def test_catalog_rejects_inconsistent_entries() -> None:
    with pytest.raises(InputError, match=r"gpus\.other"):
        Catalog(gpus={"other": H100})
    with pytest.raises(InputError, match="unique ignoring case"):
        Catalog(models={"tiny": TINY, "TINY": ModelSpec("TINY", "t", 2, 64, 4, 2, 128, 1000, 9)})
    with pytest.raises(InputError, match=r"aliases\.x"):
        Catalog(models={"tiny": TINY}, aliases={"x": "tiny2"})
    with pytest.raises(InputError, match="not also a model name"):
        Catalog(models={"tiny": TINY}, aliases={"Tiny": "tiny"})


def test_catalog_pickles(cat: Catalog) -> None:
    assert pickle.loads(pickle.dumps(cat)) == cat


# --- files -------------------------------------------------------------------------------------


def test_save_load_round_trip_of_the_bundled_catalog(cat: Catalog, tmp_path: Path) -> None:
    path = tmp_path / "sub" / "catalog.yaml"
    save_catalog(cat, path)
    back = load_catalog(path)
    assert back == cat
    assert back.model("Qwen/Qwen2.5-7B-Instruct") == cat.model("qwen2.5-7b")
    text = path.read_text(encoding="utf-8")
    save_catalog(back, path)
    assert path.read_text(encoding="utf-8") == text  # deterministic
    assert text == dump_catalog(cat)
    assert [p.name for p in path.parent.iterdir()] == ["catalog.yaml"]  # no temporary left


def test_user_file_extends_and_overrides_the_bundled_catalog(cat: Catalog, tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(GPU_YAML.replace("X-GPU", "h100-80GB") + model_yaml()
                    + "aliases:\n  org/M: m\n  my-llama: LLAMA-7B\n", encoding="utf-8")
    merged = load_catalog(path, base=cat)
    assert merged.gpu("H100-80GB").memory_gib == 24
    assert merged.model("org/m").name == "m"
    assert merged.model("my-llama") == cat.model("llama-7b")
    assert merged.aliases["my-llama"] == "llama-7b"  # stored with the canonical spelling
    assert len(merged.gpus) == len(cat.gpus)
    assert cat.gpu("H100-80GB").memory_gib == 79.65
    with pytest.raises(InputError, match=r"aliases\.my-llama"):
        load_catalog(path)  # without the base, llama-7b is unknown


def test_empty_sections_are_allowed(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("gpus:\nmodels:\naliases:\n", encoding="utf-8")
    assert load_catalog(path) == Catalog()


@pytest.mark.parametrize(("text", "field", "expected"), [
    (GPU_YAML.replace("    hbm_gbps: 1000\n", ""), "gpus.X-GPU.hbm_gbps", "field is missing"),
    (GPU_YAML.replace("memory_gib: 24", "memory_gib: -24"), "gpus.X-GPU.memory_gib",
     "a number > 0"),
    (GPU_YAML.replace("nvlink_domain: 1", "nvlink_domain: 1.5"), "gpus.X-GPU.nvlink_domain",
     "an integer"),
    (GPU_YAML.replace("hbm_gbps: 1000", "hbm_gbps: .nan"), "gpus.X-GPU.hbm_gbps",
     "a finite number"),
    (GPU_YAML + "    pcie_gbps: 64\n", "gpus.X-GPU.pcie_gbps", "unknown field"),
    (model_yaml(head_size=128), "models.m.head_size", "unknown field"),
    (model_yaml(kv_heads=3), "models.m.kv_heads", "a divisor of heads (4)"),
    (model_yaml(heads=5, kv_heads=5), "models.m.heads", "a divisor of hidden (64)"),
    (model_yaml(layers=None), "models.m.layers", "field is missing"),
    (model_yaml(layers='"32"'), "models.m.layers", "an integer"),
    (model_yaml(kind="decodr"), "models.m.kind", "one of"),
    (model_yaml(gated_mlp='"yes"'), "models.m.gated_mlp", "true or false"),
    (model_yaml() + "aliases:\n  org/m: n\n", "aliases.org/m", "the name of a model"),
    (model_yaml() + "  m:\n    family: x\n", "line 11: m", "duplicate key"),
    (model_yaml() + model_yaml().replace("models:\n  m:", "  M:"), "models.M",
     "unique ignoring case"),
    ("gpus: [A100]\n", "gpus", "a mapping"),
    ("gpu:\n  A: {}\n", "gpu", "allowed: gpus, models, aliases"),
    ("gpus:\n  A100: {memory_gib: 80\n", "line 3", "valid YAML"),
])
def test_malformed_files_name_the_file_and_the_field(
    tmp_path: Path, text: str, field: str, expected: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_catalog(path)
    err = info.value
    assert (err.source, err.field) == (str(path), field)
    assert str(err).startswith(f"{path}: {field}: expected ")
    assert expected in str(err)


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just text\n"])
def test_files_that_are_not_mappings_are_rejected(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match="a YAML mapping"):
        load_catalog(path)


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=re.escape(str(tmp_path / "none.yaml"))):
        load_catalog(tmp_path / "none.yaml")


def test_negative_memory_message_matches_the_documented_form(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(GPU_YAML.replace("X-GPU", "A100-80GB").replace("24", "-1"), encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_catalog(path)
    assert str(info.value) == f"{path}: gpus.A100-80GB.memory_gib: expected a number > 0 (got -1)"


# --- property-based round trip -----------------------------------------------------------------

_NAMES = st.one_of(
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._/+-]{0,20}", fullmatch=True),
    st.sampled_from(["null", "True", "on", "1.5", "0x1F", "~", "2024-01-01", "a: b", "#x"]),
)
_POSITIVE = st.one_of(
    st.floats(min_value=0.0, exclude_min=True, allow_nan=False, allow_infinity=False),
    st.integers(min_value=1, max_value=10**12),
)
_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1,
                max_size=12).filter(lambda s: s.strip() != "")


@st.composite
def gpu_specs(draw: st.DrawFn, name: str) -> GPUSpec:
    return GPUSpec(name, draw(_POSITIVE), draw(_POSITIVE), draw(_POSITIVE),
                   draw(st.integers(1, 1024)), draw(_POSITIVE))


@st.composite
def model_specs(draw: st.DrawFn, name: str) -> ModelSpec:
    heads = draw(st.integers(1, 64))
    kv_heads = draw(st.sampled_from([k for k in range(1, heads + 1) if heads % k == 0]))
    return ModelSpec(
        name=name, family=draw(_TEXT), layers=draw(st.integers(1, 200)),
        hidden=heads * draw(st.integers(1, 256)), heads=heads, kv_heads=kv_heads,
        intermediate=draw(st.integers(1, 10**5)), vocab=draw(st.integers(1, 10**6)),
        max_context=draw(st.integers(1, 10**7)), dtype_bytes=draw(st.sampled_from([1, 2, 4])),
        gated_mlp=draw(st.booleans()), tied_embeddings=draw(st.booleans()),
        kind=draw(st.sampled_from(["decoder", "encoder"])),
        output_head=draw(st.sampled_from(["lm", "score"])),
    )


@st.composite
def catalogs(draw: st.DrawFn) -> Catalog:
    gpu_names = draw(st.lists(_NAMES, max_size=4, unique_by=str.casefold))
    names = draw(st.lists(_NAMES, max_size=8, unique_by=str.casefold))
    n_models = draw(st.integers(0, len(names)))
    models = [draw(model_specs(n)) for n in names[:n_models]]
    aliases = {a: draw(st.sampled_from(models)).name for a in names[n_models:]} if models else {}
    return Catalog(gpus={n: draw(gpu_specs(n)) for n in gpu_names},
                   models={m.name: m for m in models}, aliases=aliases)


@settings(max_examples=60, deadline=None)
@given(catalog=catalogs())
def test_random_catalogs_round_trip_through_yaml_files(
    tmp_path_factory: pytest.TempPathFactory, catalog: Catalog
) -> None:
    path = tmp_path_factory.getbasetemp() / "round-trip.yaml"
    save_catalog(catalog, path)
    back = load_catalog(path)
    assert back == catalog
    assert dump_catalog(back) == path.read_text(encoding="utf-8")
    for name, spec in catalog.models.items():
        assert back.model(name.upper()) == spec


@settings(max_examples=60, deadline=None)
@given(model=model_specs("m"))
def test_derived_sizes_are_consistent(model: ModelSpec) -> None:
    assert model.weight_bytes_per_gpu(1) == model.weight_bytes == model.params * model.dtype_bytes
    assert model.kv_bytes_per_token_per_gpu(1) == model.kv_bytes_per_token
    for tp in (2, 4, 8):
        if model.supports_tp(tp):
            assert model.weight_bytes_per_gpu(tp) * tp >= model.weight_bytes
            assert model.weight_bytes_per_gpu(tp) <= model.weight_bytes
            assert model.kv_bytes_per_token_per_gpu(tp) * tp >= model.kv_bytes_per_token
    assert model.attention_flops(1, 1) == 4 * model.layers * model.heads * model.head_dim


# --- docs/catalog.md ---------------------------------------------------------------------------


def _first_block(lang: str) -> str:
    match = re.search(rf"^```{lang}\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)
    assert match, f"docs/catalog.md has no ```{lang} block"
    return match.group(1)


def test_the_yaml_example_in_the_docs_loads(cat: Catalog, tmp_path: Path) -> None:
    path = tmp_path / "my-catalog.yaml"
    path.write_text(_first_block("yaml"), encoding="utf-8")
    mine = load_catalog(path, base=cat)
    assert set(mine.gpus) - set(cat.gpus) and set(mine.models) - set(cat.models)
    assert parse_catalog(_first_block("yaml"), "doc", base=cat) == mine
