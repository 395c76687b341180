"""Launching a plan: plan.json as a versioned file (:mod:`.planfile`), the launch view of it
(:mod:`.model`), renderers that turn it into files for a target (:mod:`.renderers`: shell,
Kubernetes, Ray Serve, a routing table), running the shell target on this host
(:mod:`.apply`), the workflow driver (:mod:`.drive`) and the whole loop on a real engine
(:mod:`.bench_loop`). docs/launch.md."""
