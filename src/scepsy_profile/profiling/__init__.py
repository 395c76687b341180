"""Profiling LLMs with real engines: backends, the sweep planner, the resumable store, serving
curves measured behind ``vllm serve``.

* :mod:`.models`: catalog models as engine configurations (random weights, ``scale`` shrinks);
* :mod:`.backend`: the :class:`ProfilerBackend` protocol; :mod:`.registry`: the backends
  (``torch``, ``vllm``) by name;
* :mod:`.planner`: which points to measure; :mod:`.sweep`: measure them into a :mod:`.store`;
* :mod:`.replay`, :mod:`.server`, :mod:`.servecurve`: the serving curve measured at increasing
  Poisson rates, compared with the one derived from the step profile.

docs/profiling.md walks the whole path.
"""
