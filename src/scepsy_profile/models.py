"""Transformer model specifications and the sizes derived from them.

A :class:`ModelSpec` holds the handful of numbers from a model's ``config.json`` that decide its
memory footprint and its FLOPs. Everything else is derived, with the formulas written next to
each property. Notation: ``L`` layers, ``d`` hidden size, ``H`` attention heads, ``K`` KV heads,
``h = d / H`` head dimension, ``F`` MLP intermediate size, ``V`` vocabulary, ``b`` bytes per value.

What the counts include and leave out (all within 0.5% for the catalog's models):

* included: token embedding, output head, per layer the q/k/v/o projections (GQA aware), the MLP
  matrices (3 for gated SwiGLU/GeGLU MLPs, 2 otherwise) and two norm weight vectors, and the
  final norm;
* left out: biases (Qwen's q/k/v biases, the BERT/phi biases), learned position embeddings of
  encoders, norm biases and the embedding LayerNorm of BERT-style encoders.

The output head is ``output_head="lm"`` (a ``V x d`` language-model head, sharing the embedding
matrix when ``tied_embeddings``) or ``output_head="score"`` (the small classifier of rerankers and
reward models: a ``d x d`` dense layer and a ``d x 2`` projection; vLLM loads these models
without their ``lm_head``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Literal

from pydantic import Field

from scepsy_common.errors import InputError
from scepsy_profile.hardware import _check_name, _check_positive_int

ModelKind = Literal["decoder", "encoder"]
OutputHead = Literal["lm", "score"]
MODEL_KINDS: tuple[ModelKind, ...] = ("decoder", "encoder")
OUTPUT_HEADS: tuple[OutputHead, ...] = ("lm", "score")
SCORE_LABELS = 2
"""Outputs of a score head (a PRM's two classes; a reranker's single logit is rounded up)."""


DTYPE_BYTES: Mapping[str, int] = MappingProxyType({"bfloat16": 2, "float16": 2, "float32": 4})
"""The dtypes a profiler builds a model in (``EngineModel.dtype``, a profile record's ``config``)
and the bytes per value of each (``ModelSpec.dtype_bytes``)."""


@dataclass(frozen=True, slots=True)
class TransformerShape:
    """The shape of a transformer: the architecture fields every model record shares, and their
    rules (each an integer >= 1; ``heads`` divides ``hidden``, ``kv_heads`` divides ``heads``).

    The one definition: :class:`ModelSpec` (a catalog model) and
    :class:`~scepsy_profile.profiling.models.EngineModel` (a profiler's build of one) inherit the
    fields, and the file formats (the catalog's model entries, a profile record's ``config``)
    build their validators from :data:`SHAPE_FIELDS` and :func:`shape_record_fields`, so a new
    field is added here.
    """

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    max_context: int

    def __post_init__(self) -> None:
        self._check_shape("model shape")

    def _check_shape(self, source: str) -> None:
        """Raise :class:`InputError` (``source``, the field) unless the shape's rules hold."""
        for name in SHAPE_FIELDS:
            _check_positive_int(getattr(self, name), source, name)
        if self.hidden % self.heads:
            raise InputError(source, "heads", f"a divisor of hidden ({self.hidden})", self.heads)
        if self.heads % self.kv_heads:
            raise InputError(source, "kv_heads", f"a divisor of heads ({self.heads})",
                             self.kv_heads)

    def shape_values(self) -> dict[str, Any]:
        """The shape fields and their values (in :data:`SHAPE_FIELDS` order)."""
        return {name: getattr(self, name) for name in SHAPE_FIELDS}

    @property
    def head_dim(self) -> int:
        """Per-head dimension ``h = d / H``."""
        return self.hidden // self.heads


SHAPE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(TransformerShape))
"""The names of :class:`TransformerShape`'s fields, in order."""


def shape_record_fields() -> dict[str, Any]:
    """The shape fields as a strict pydantic model declares them (``pydantic.create_model``
    keyword arguments): each a required integer >= 1, the rule :class:`TransformerShape` checks
    (its cross-field rules are left to the record built from the file)."""
    return {name: (int, Field(ge=1)) for name in SHAPE_FIELDS}


@dataclass(frozen=True)
class _CatalogName:
    """The fields of a :class:`ModelSpec` before its shape (a base only to place them first,
    where its positional arguments have them)."""

    __slots__ = ()
    name: str
    family: str


@dataclass(frozen=True, slots=True)
class ModelSpec(TransformerShape, _CatalogName):
    """Architecture of one transformer, as in its Hugging Face ``config.json``.

    Fields, in order: ``name``, ``family``, the :class:`TransformerShape` fields (``layers``,
    ``hidden``, ``heads``, ``kv_heads``, ``intermediate``, ``vocab``, ``max_context``), then
    ``dtype_bytes``, ``gated_mlp``, ``tied_embeddings``, ``kind`` and ``output_head``.

    ``kind="encoder"`` is a bidirectional encoder (a cross-encoder reranker): it keeps no KV cache
    between requests and its attention is not causal.
    """

    dtype_bytes: int = 2
    gated_mlp: bool = True
    tied_embeddings: bool = False
    kind: ModelKind = "decoder"
    output_head: OutputHead = "lm"

    def __post_init__(self) -> None:
        source = f"model {self.name!r}"
        _check_name(self.name, "model")
        if not isinstance(self.family, str) or not self.family.strip():
            raise InputError(source, "family", "a non-empty string", self.family)
        self._check_shape(source)
        _check_positive_int(self.dtype_bytes, source, "dtype_bytes")
        for field in ("gated_mlp", "tied_embeddings"):
            if not isinstance(getattr(self, field), bool):
                raise InputError(source, field, "true or false", getattr(self, field))
        if self.kind not in MODEL_KINDS:
            raise InputError(source, "kind", f"one of {', '.join(MODEL_KINDS)}", self.kind)
        if self.output_head not in OUTPUT_HEADS:
            raise InputError(source, "output_head", f"one of {', '.join(OUTPUT_HEADS)}",
                             self.output_head)

    # -- shapes -------------------------------------------------------------------------------

    @property
    def embedding_params(self) -> int:
        """Token embedding ``V * d``."""
        return self.vocab * self.hidden

    @property
    def attention_params_per_layer(self) -> int:
        """q and o: ``d * H * h`` each; k and v: ``d * K * h`` each (GQA shares K < H heads)."""
        return 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * (
            self.head_dim
        )

    @property
    def mlp_params_per_layer(self) -> int:
        """``3 * d * F`` for a gated MLP (gate, up, down), ``2 * d * F`` otherwise (up, down)."""
        return (3 if self.gated_mlp else 2) * self.hidden * self.intermediate

    @property
    def layer_matmul_params(self) -> int:
        """Weights of one layer that take part in matmuls: attention + MLP (no norms)."""
        return self.attention_params_per_layer + self.mlp_params_per_layer

    @property
    def layer_params(self) -> int:
        """One layer: matmul weights plus two norm weight vectors (``2 * d``)."""
        return self.layer_matmul_params + 2 * self.hidden

    @property
    def head_matmul_params(self) -> int:
        """Weights the output head multiplies by, tied or not.

        ``lm``: ``V * d``; ``score``: ``d * d + d * SCORE_LABELS``.
        """
        if self.output_head == "score":
            return self.hidden * self.hidden + self.hidden * SCORE_LABELS
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """Weights the output head adds: 0 for a tied LM head, else :attr:`head_matmul_params`."""
        if self.output_head == "lm" and self.tied_embeddings:
            return 0
        return self.head_matmul_params

    @property
    def params(self) -> int:
        """Total weights: ``V*d + head + L * layer_params + d`` (the last term is the final norm).

        With an untied LM head and a gated MLP this is
        ``2*V*d + L*(2*d*H*h + 2*d*K*h + 3*d*F + 2*d) + d``.
        """
        return self.embedding_params + self.head_params + self.layers * self.layer_params + (
            self.hidden
        )

    @property
    def weight_bytes(self) -> int:
        """``params * dtype_bytes``."""
        return self.params * self.dtype_bytes

    # -- tensor parallelism -------------------------------------------------------------------

    def supports_tp(self, tp: int) -> bool:
        """Whether vLLM-style tensor parallelism of degree ``tp`` can shard this model.

        Query heads must split evenly (``H % tp == 0``), and KV heads must either split evenly
        (``K % tp == 0``) or be replicated whole (``tp % K == 0``).
        """
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            return False
        return self.heads % tp == 0 and (self.kv_heads % tp == 0 or tp % self.kv_heads == 0)

    def check_tp(self, tp: int) -> int:
        """Return ``tp`` if :meth:`supports_tp`, else raise :class:`InputError`."""
        if not self.supports_tp(tp):
            raise InputError(
                f"model {self.name!r}",
                "tp",
                f"a tensor-parallel degree >= 1 that divides the {self.heads} attention heads "
                f"and divides or is a multiple of the {self.kv_heads} KV heads",
                tp,
            )
        return tp

    def kv_heads_per_gpu(self, tp: int) -> int:
        """KV heads each GPU holds: ``max(1, K // tp)`` (replicated when ``tp > K``)."""
        return max(1, self.kv_heads // self.check_tp(tp))

    def weight_bytes_per_gpu(self, tp: int) -> int:
        """Weight bytes on each GPU of a ``tp``-way tensor-parallel group.

        Sharded ``tp`` ways (rounded up): embedding, output head, q and o, the MLP. k and v hold
        :meth:`kv_heads_per_gpu` heads, so they are replicated once ``tp > K``. Norm weights are
        replicated. At ``tp=1`` this equals :attr:`weight_bytes`.
        """
        self.check_tp(tp)
        d, h = self.hidden, self.head_dim
        sharded = (
            self.embedding_params
            + self.head_params
            + self.layers * (2 * d * self.heads * h + self.mlp_params_per_layer)
        )
        kv = self.layers * 2 * d * self.kv_heads_per_gpu(tp) * h
        replicated = self.layers * 2 * d + d
        return (-(-sharded // tp) + kv + replicated) * self.dtype_bytes

    # -- KV cache -----------------------------------------------------------------------------

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token: ``2 * L * K * h * b`` (K and V); 0 for encoders."""
        if self.kind == "encoder":
            return 0
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_token_per_gpu(self, tp: int) -> int:
        """KV-cache bytes per token on each GPU: ``2 * L * kv_heads_per_gpu(tp) * h * b``."""
        heads = self.kv_heads_per_gpu(tp)
        if self.kind == "encoder":
            return 0
        return 2 * self.layers * heads * self.head_dim * self.dtype_bytes

    # -- FLOPs --------------------------------------------------------------------------------

    @property
    def linear_flops_per_token(self) -> int:
        """Matmul FLOPs for one token: ``2 * (L * layer_matmul_params + head_matmul_params)``.

        Embedding lookups are free; the output head is counted for every token. Engines compute
        the LM head only for the last token of each prompt in prefill, so a prefill estimate may
        use ``2 * L * layer_matmul_params`` per prompt token plus ``2 * head_matmul_params`` per
        sequence.
        """
        return 2 * (self.layers * self.layer_matmul_params + self.head_matmul_params)

    def layer_attention_flops(
        self, tokens_new: int, context: int, *, causal: bool | None = None
    ) -> int:
        """Score (``Q K^T``) and value (``A V``) FLOPs of one layer for one sequence.

        ``tokens_new`` tokens are processed while the sequence is ``context`` tokens long
        *including* them (a decode step over a KV cache of ``T`` tokens is ``(1, T + 1)``; a
        fresh prefill of ``n`` tokens is ``(n, n)``). Each query-key pair costs ``2 * h`` FLOPs
        for the score and ``2 * h`` for the value, over ``H`` heads: ``4 * H * h`` per pair.

        Causal averaging (the default for decoders): new token ``j`` (0-based) sees
        ``context - n + j + 1`` keys, on average ``context - (n - 1) / 2``, so the count is
        ``4 * H * h * (n * context - n * (n - 1) / 2)``. That is the work FlashAttention-style
        kernels do when they skip fully masked blocks; a fresh prefill costs about half of the
        unmasked ``4 * H * h * n * context``. ``causal=False`` (the default for encoders) counts
        every pair: ``4 * H * h * n * context``. Softmax and masking are not counted.
        """
        n, c = tokens_new, context
        for field, value in (("tokens_new", n), ("context", c)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InputError(f"model {self.name!r}", field, "an integer >= 0", value)
        if c < n:
            raise InputError(f"model {self.name!r}", "context",
                             f"at least tokens_new ({n}), since it includes the new tokens", c)
        if causal is None:
            causal = self.kind == "decoder"
        pairs = n * c - n * (n - 1) // 2 if causal else n * c
        return 4 * self.heads * self.head_dim * pairs

    def attention_flops(
        self, tokens_new: int, context: int, *, causal: bool | None = None
    ) -> int:
        """All layers: ``L * layer_attention_flops(tokens_new, context)``; see there."""
        return self.layers * self.layer_attention_flops(tokens_new, context, causal=causal)
