"""The architecture fields of a transformer are defined once (scepsy_profile.models.TransformerShape)
and every model record takes them, and their rules, from there."""

from __future__ import annotations

import dataclasses

import pytest

from scepsy_common.errors import InputError
from scepsy_profile.catalog import _ModelRecord
from scepsy_profile.models import SHAPE_FIELDS, ModelSpec, TransformerShape, shape_record_fields
from scepsy_profile.profiling.models import EngineModel, engine_model
from scepsy_profile.profiling.store import _ConfigLine

SHAPE = dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=1000,
             max_context=256)


def test_every_record_has_the_shape_fields() -> None:
    assert tuple(SHAPE) == SHAPE_FIELDS
    assert set(shape_record_fields()) == set(SHAPE_FIELDS)
    for cls in (ModelSpec, EngineModel):
        assert issubclass(cls, TransformerShape)
    for names in ([f.name for f in dataclasses.fields(ModelSpec)],
                  [f.name for f in dataclasses.fields(EngineModel)],
                  list(_ModelRecord.model_fields), list(_ConfigLine.model_fields)):
        assert [n for n in names if n in SHAPE_FIELDS] == list(SHAPE_FIELDS)


def test_model_spec_keeps_its_positional_order() -> None:
    spec = ModelSpec("m", "f", *SHAPE.values(), 4)
    assert (spec.name, spec.family, spec.max_context, spec.dtype_bytes) == ("m", "f", 256, 4)
    assert [f.name for f in dataclasses.fields(ModelSpec)] == [
        "name", "family", *SHAPE_FIELDS, "dtype_bytes", "gated_mlp", "tied_embeddings", "kind",
        "output_head"]


@pytest.mark.parametrize(("changes", "field", "expected"), [
    ({"heads": 5}, "heads", "a divisor of hidden (64)"),
    ({"kv_heads": 3}, "kv_heads", "a divisor of heads (4)"),
    ({"vocab": 0}, "vocab", "an integer >= 1"),
])
def test_one_rule_set(changes: dict[str, int], field: str, expected: str) -> None:
    shape = {**SHAPE, **changes}
    for build, source in ((lambda: TransformerShape(**shape), "model shape"),
                          (lambda: ModelSpec(name="m", family="f", **shape), "model 'm'"),
                          (lambda: EngineModel(name="m", scale=0.5, architecture="A", **shape),
                           "model 'm:x0.5'")):
        with pytest.raises(InputError) as info:
            build()
        assert (info.value.source, info.value.field, info.value.expected) == (
            source, field, expected)


def test_engine_model_config_and_spec_round_trip() -> None:
    em = engine_model("llama-3-8b", 0.0625)
    assert EngineModel(name=em.name, scale=em.scale, **em.config()) == em
    spec = em.model_spec()
    assert spec.shape_values() == em.shape_values() and spec.dtype_bytes == 2
