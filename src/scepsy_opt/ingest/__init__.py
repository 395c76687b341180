"""Trace ingestion: traces recorded or exported outside scepsy, turned into workflow traces.

* :mod:`scepsy_opt.ingest.otel`: OpenTelemetry GenAI / OpenInference spans to workflow traces
  (``scepsy trace import``, docs/otel.md);
* :mod:`scepsy_opt.ingest.otlp_http`: the OTLP/HTTP receiver that writes received spans as
  OTLP/JSON lines (``scepsy trace receive``);
* :mod:`scepsy_opt.ingest.record`: the recording proxy in front of OpenAI-compatible servers
  (``scepsy record``, docs/record.md);
* :mod:`scepsy_opt.ingest.tracemap`: the table from the model names a client sends to a plan's
  LLM names;
* :mod:`scepsy_opt.ingest.mooncake`: token lengths from the Mooncake production trace, as
  workflow distributions.
"""
