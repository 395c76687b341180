"""The whole loop on a real engine (docs/quickstart.md, docs/control.md): plan, launch real
``vllm serve`` servers, drive the workflows against them, stop, and compare measured with
predicted.

* :mod:`scepsy_serve.loop.bench_loop`: ``scepsy bench loop`` on this CPU;
* :mod:`scepsy_serve.loop.bench_gpu`: ``scepsy bench gpu``, the kit for a GPU machine;
* :mod:`scepsy_serve.loop.realloop`: ``scepsy bench loop --control``, the controller in the loop.
"""
