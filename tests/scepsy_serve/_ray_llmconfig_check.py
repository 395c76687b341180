"""Checks a rendered ``serve.yaml`` with Ray Serve LLM's own models; run with the vLLM
environment's interpreter (``ray.serve.llm`` imports vLLM), not the project's:

    VLLM_PYTHON tests/scepsy_serve/_ray_llmconfig_check.py DIR/serve.yaml

For every application: ``LLMServingArgs`` on its ``args``; for every entry of ``llm_configs``:
``LLMConfig(**cfg)``, its placement group config, and the engine config Ray derives from it
(which refuses engine arguments vLLM's ``AsyncEngineArgs`` or front end do not know). Prints one
JSON line: ``{"ok": true, "llms": [...], "ray": VERSION}`` or ``{"ok": false, "error": ...}``
(exit 1).
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> int:
    import ray
    import yaml
    from ray.llm._internal.common.placement import PlacementGroupConfig
    from ray.serve.llm import LLMConfig, LLMServingArgs

    with open(path, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    llms = []
    try:
        for app in raw["applications"]:
            LLMServingArgs.model_validate(app["args"])
            for cfg in app["args"]["llm_configs"]:
                config = LLMConfig(**cfg)
                PlacementGroupConfig(**cfg["placement_group_config"])
                engine = config.get_engine_config()
                llms.append({"model_id": config.model_id,
                             "tp": engine.tensor_parallel_degree,
                             "bundles": engine.placement_bundles,
                             "strategy": engine.placement_strategy,
                             "accelerator": type(engine.accelerator).__name__})
    except Exception as exc:  # report any refusal as data: the test shows it
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps({"ok": True, "llms": llms, "ray": ray.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
