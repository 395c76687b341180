"""Launching a plan: plan.json as a versioned file (:mod:`.planfile`), the launch view of it
(:mod:`.launchplan`), renderers that turn it into files for a target (:mod:`.renderers`: shell,
Kubernetes, Ray Serve, a routing table), running the shell target on this host
(:mod:`.host`) and the workflow driver (:mod:`.drive`). docs/launch.md."""
