"""Engine-ready model configurations: a catalog model, optionally shrunk, as a Hugging Face config.

A profiler backend builds the model it times from an :class:`EngineModel`: the catalog's
architecture (layers, hidden, heads, KV heads, intermediate, vocab) mapped to a transformers
``config.json``, with random weights (no download). ``scale`` shrinks the model so that a sweep
finishes on a CPU: depth and width are multiplied by ``scale`` (heads keep their dimension, the
query/KV head ratio is kept where it divides), and the shrink is recorded in every measurement
(:func:`profiled_name`, :attr:`EngineModel.scale`, :meth:`EngineModel.config`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from scepsy_common.errors import InputError, UnknownEntryError
from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.models import DTYPE_BYTES, ModelSpec, TransformerShape

ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "llama-2": "LlamaForCausalLM",
    "llama-3": "LlamaForCausalLM",
    "codellama": "LlamaForCausalLM",
    "qwen2.5": "Qwen2ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
"""Catalog model families that the profilers build, and the transformers class for each."""

MIN_VOCAB = 1024
"""The smallest vocabulary a shrunk model keeps (token ids must stay meaningful)."""

_MODEL_TYPE = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


@dataclass(frozen=True, slots=True)
class EngineModel(TransformerShape):
    """A decoder-only causal LM as a profiler builds it (random weights): a
    :class:`~scepsy_profile.models.TransformerShape` (its fields and rules) and what an engine
    needs besides (the transformers class, the dtype) and the shrink it stands for."""

    name: str
    """The catalog model it stands for (canonical name)."""
    scale: float
    """The shrink applied to the catalog model (1.0: the model itself)."""
    architecture: str
    tied_embeddings: bool = False
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        self._check_shape(f"model {self.profiled_name!r}")

    @property
    def profiled_name(self) -> str:
        """The name measurements of this model carry (see :func:`profiled_name`)."""
        return profiled_name(self.name, self.scale)

    def config(self) -> dict[str, Any]:
        """The architecture as recorded in every measurement (sorted keys, JSON-ready)."""
        return {"architecture": self.architecture, **self.shape_values(),
                "tied_embeddings": self.tied_embeddings, "dtype": self.dtype}

    def hf_config(self) -> dict[str, Any]:
        """A transformers ``config.json`` for this architecture (what vLLM and transformers load)."""
        return {
            "architectures": [self.architecture],
            "model_type": _MODEL_TYPE[self.architecture],
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab,
            "max_position_embeddings": self.max_context,
            "tie_word_embeddings": self.tied_embeddings,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "torch_dtype": self.dtype,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
            "use_cache": True,
        }

    def model_spec(self) -> ModelSpec:
        """The catalog entry of this (possibly shrunk) model, named :attr:`profiled_name`."""
        return ModelSpec(
            name=self.profiled_name, family=_family(self.architecture), **self.shape_values(),
            dtype_bytes=DTYPE_BYTES[self.dtype], tied_embeddings=self.tied_embeddings,
        )


def profiled_name(name: str, scale: float) -> str:
    """The name of catalog model ``name`` shrunk by ``scale``: ``name`` itself at scale 1, else
    ``name:x<scale>`` (``llama-3-8b:x0.0625``). A shrunk model is a different model, with its own
    curves and catalog entry; the name stays a valid catalog name."""
    return name if scale == 1.0 else f"{name}:x{scale:g}"


_SCALED = re.compile(r"^(?P<name>.+):x(?P<scale>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)$")


def parse_scaled(model: str) -> tuple[str, float]:
    """The inverse of :func:`profiled_name`: ``("llama-3-8b", 0.0625)`` for
    ``llama-3-8b:x0.0625``, ``(model, 1.0)`` for any other name."""
    m = _SCALED.match(model)
    if m is None:
        return model, 1.0
    return m.group("name"), float(m.group("scale"))


def _family(architecture: str) -> str:
    return "qwen2.5" if architecture == "Qwen2ForCausalLM" else "llama"


def engine_model(model: str | ModelSpec, scale: float = 1.0, *, dtype: str = "bfloat16",
                 catalog: Catalog | None = None, source: str = "profile") -> EngineModel:
    """The engine configuration of catalog model ``model`` shrunk by ``scale`` (0 < scale <= 1).

    Depth: ``max(1, round(layers·s))``. Width: query heads ``max(1, round(heads·s))`` with the
    catalog's head dimension, KV heads the largest divisor of that head count not above
    ``max(1, round(kv_heads·s))``, intermediate ``round(intermediate·s)`` to a multiple of 32
    (at least 32), vocab ``max(MIN_VOCAB, round(vocab·s))``. ``max_context`` is kept.
    Raises :class:`InputError` for an unknown model, a model family no profiler builds (encoders,
    Phi...), or a scale outside (0, 1].
    """
    spec = model if isinstance(model, ModelSpec) else _lookup(model, catalog, source)
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and 0 < scale <= 1):
        raise InputError(source, "scale", "a number in (0, 1]", scale)
    arch = ARCHITECTURES.get(spec.family.casefold())
    if arch is None or spec.kind != "decoder" or spec.output_head != "lm" or not spec.gated_mlp:
        known = ", ".join(sorted(ARCHITECTURES))
        raise InputError(source, "model", f"a decoder LLM of a family the profilers build "
                         f"({known}); {spec.name} is family {spec.family!r}", spec.name)
    if dtype not in DTYPE_BYTES:
        *most, last = DTYPE_BYTES
        raise InputError(source, "dtype", f"{', '.join(most)} or {last}", dtype)
    s = float(scale)
    if s == 1.0:
        layers, heads, kv, inter, vocab = (spec.layers, spec.heads, spec.kv_heads,
                                           spec.intermediate, spec.vocab)
    else:
        layers = max(1, round(spec.layers * s))
        heads = max(1, round(spec.heads * s))
        want_kv = max(1, round(spec.kv_heads * s))
        kv = max(d for d in range(1, heads + 1) if heads % d == 0 and d <= want_kv)
        inter = max(32, round(spec.intermediate * s / 32) * 32)
        vocab = max(MIN_VOCAB, round(spec.vocab * s))
    return EngineModel(
        name=spec.name, scale=s, architecture=arch, layers=layers, hidden=heads * spec.head_dim,
        heads=heads, kv_heads=kv, intermediate=inter, vocab=vocab, max_context=spec.max_context,
        tied_embeddings=spec.tied_embeddings, dtype=dtype,
    )


def _lookup(model: str, catalog: Catalog | None, source: str) -> ModelSpec:
    try:
        return (catalog or default_catalog()).model(model)
    except UnknownEntryError as exc:
        raise InputError(source, "model", exc.expected, model) from None
