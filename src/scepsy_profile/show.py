"""The ``scepsy profile show`` table: latency, μ and memory of one model on one GPU type over a
grid of TP degrees and GPU shares (docs/profiles.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scepsy_common.errors import InputError
from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.fitted import FittedLatencyModel
from scepsy_profile.latency import LatencyModel
from scepsy_profile.serving import MAX_NUM_SEQS, MemoryPolicy, serving_curve


def profile_rows(latency: LatencyModel, model: str, gpu: str, tps: Sequence[int],
                 shares: Sequence[float], *, batch: int = 32, seq: int = 512,
                 input_tokens: float = 512.0, output_tokens: float = 128.0,
                 fitted: FittedLatencyModel | None = None, catalog: Catalog | None = None,
                 policy: MemoryPolicy | None = None) -> list[dict[str, Any]]:
    """One row per (tp, share): prefill and decode latency (ms) at ``batch`` × ``seq`` tokens,
    the instance's μ (calls/s) for calls of ``input_tokens`` in / ``output_tokens`` out, its
    largest batch, its memory (GiB per GPU) and whether it fits, and the curves' ``source``
    (``fitted`` where ``fitted`` covers the instance, else ``roofline``).

    TP degrees the model does not support or that exceed the GPU's NVLink domain are skipped;
    none left is an :class:`InputError` naming ``tp``. Unknown model or GPU names raise too, and
    so do a ``seq`` or calls (``input_tokens + output_tokens``) longer than the model's context
    (``max_context``): no call that long can be served, so there is no μ to show.
    """
    cat = catalog or default_catalog()
    for field, v in (("batch", batch), ("seq", seq), ("input_tokens", input_tokens),
                     ("output_tokens", output_tokens)):
        if not v >= 1:  # also catches nan
            raise InputError("profile show", field, "a number >= 1", v)
    if batch > MAX_NUM_SEQS:  # no engine runs more calls at once (MemoryPolicy.max_batch)
        raise InputError("profile show", "batch", f"a batch of 1 to {MAX_NUM_SEQS} calls (the "
                         "most one replica runs at once)", batch)
    spec = cat.model(model)
    g = cat.gpu(gpu)
    # beyond the context no call can run: the serving model would answer μ = 0 without a word
    ctx = spec.max_context
    if seq > ctx:
        raise InputError("profile show", "seq", f"a context length of at most {ctx} tokens, "
                         f"the context of {spec.name}", seq)
    if output_tokens >= ctx:
        raise InputError("profile show", "output_tokens", f"fewer output tokens than the "
                         f"context of {spec.name}, {ctx} tokens (input and output share it)",
                         output_tokens)
    if input_tokens + output_tokens > ctx:
        raise InputError("profile show", "input_tokens",
                         f"calls that fit the context of {spec.name}: input + output at most "
                         f"{ctx} tokens (output is {output_tokens:g}, so input at most "
                         f"{max(ctx - output_tokens, 0):g})", input_tokens)
    # measured curves keep their own model names; the catalog resolves aliases for the rest
    name = model if fitted is not None and model in fitted.models() else spec.name
    rows: list[dict[str, Any]] = []
    for tp in tps:
        if not spec.supports_tp(tp) or tp > g.nvlink_domain:
            continue
        for share in shares:
            src = "fitted" if fitted is not None and fitted.covers(name, g.name, tp) else "roofline"
            curve = serving_curve(latency, name, g.name, tp, share, input_tokens, output_tokens,
                                  catalog=cat, policy=policy or MemoryPolicy())
            rows.append({
                "tp": tp, "share": share, "source": src,
                "prefill_ms": round(float(latency.prefill_ms(name, g.name, tp, share, batch, seq)), 3),
                "decode_ms": round(float(latency.decode_ms(name, g.name, tp, share, batch, seq)), 3),
                "mu_calls_s": round(curve.mu, 4), "max_batch": curve.max_batch,
                "weights_gib": round(curve.memory.weights_gib, 2),
                "kv_gib": round(curve.memory.kv_gib, 2), "fits": curve.memory.feasible,
            })
    if not rows:
        raise InputError("profile show", "tp", f"a TP degree that {spec.name} supports on "
                         f"{g.name} (NVLink domain {g.nvlink_domain})", list(tps))
    return rows
