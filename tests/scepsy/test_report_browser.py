"""The report page in a real headless browser: Debian's chromium driven by playwright, the page
loaded from its folder by a file:// URL (as a user opens it): it renders its title and
headings, every image loads, the console and the page report no error, nothing is fetched
from outside the folder, and a screenshot is not blank.

The browser is ``$SCEPSY_CHROMIUM`` or ``chromium`` on the PATH (``.ci/run`` installs Debian's
package); playwright never downloads one. Without either, the tests skip with the reason.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import scepsy
from scepsy.report import write_report

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "datasets" / "plans" / "rag-beam-a100-16.json"
HEADINGS = ["Workflows", "LLMs", "Placement", "Solver", "Bounds"]
VIEWPORT = {"width": 1280, "height": 900}


def _chromium() -> str | None:
    return os.environ.get("SCEPSY_CHROMIUM") or shutil.which("chromium")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    exe = _chromium()
    if exe is None:
        pytest.skip("no chromium: set SCEPSY_CHROMIUM or install Debian's chromium package")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"], headless=True)
        yield b
        b.close()


def _visit(browser: Any, folder: Path, shot: Path) -> dict[str, Any]:
    """Open ``folder``'s index.html; what the page showed and reported, and a full-page
    screenshot at ``shot``."""
    page = browser.new_page(viewport=VIEWPORT)
    errors: list[str] = []
    outside: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    base = folder.resolve().as_uri()
    page.on("request", lambda r: outside.append(r.url)
            if not r.url.startswith(base + "/") else None)
    page.goto(f"{base}/index.html", wait_until="load")
    out = {
        "title": page.title(),
        "headings": page.locator("h2").all_inner_texts(),
        "images": page.evaluate("Array.from(document.images).map(i => "
                                "[i.getAttribute('src'), i.complete, i.naturalWidth])"),
        "text": page.locator("body").inner_text(),
        "errors": errors,
        "outside": outside,
    }
    page.screenshot(path=str(shot), full_page=True)
    page.close()
    return out


def _not_blank(png: Path) -> None:
    """The screenshot shows something: its pixels vary and a good part of them is not the
    background."""
    import matplotlib.image

    img = np.asarray(matplotlib.image.imread(png))[..., :3]
    assert img.shape[0] >= VIEWPORT["height"] and img.shape[1] == VIEWPORT["width"]
    assert float(img.std()) > 0.05
    ink = np.any(img < 0.9, axis=-1).mean()  # pixels darker than near-white
    assert ink > 0.03, ink


def test_bundled_plan_page_renders_in_chromium(browser, tmp_path):
    plan = tmp_path / "plan.json"
    shutil.copy(BUNDLED, plan)
    folder = write_report(plan, tmp_path / "report")
    seen = _visit(browser, folder, tmp_path / "shot.png")
    assert seen["title"] == "scepsy report: plan.json"
    assert seen["headings"] == HEADINGS
    srcs = sorted(src for src, _, _ in seen["images"])
    assert srcs == ["curve-1.png", "curve-2.png", "latency-shares.png", "placement.png"]
    for src, complete, width in seen["images"]:
        assert complete and width > 0, src
    assert seen["errors"] == []
    assert seen["outside"] == []
    for name in ("generator", "prm", "reranker", "rewriter", "A100-80GB-0", "A100-80GB-1"):
        assert name in seen["text"]
    _not_blank(tmp_path / "shot.png")


def test_infeasible_plan_page_renders_in_chromium(browser, tmp_path):
    plan = tmp_path / "infeasible.json"
    scepsy.plan(REPO / "datasets/workflows/rag.yaml", REPO / "datasets/clusters/a100-4.yaml",
                500, trace_requests=300).write(plan)
    folder = write_report(plan, tmp_path / "report")
    seen = _visit(browser, folder, tmp_path / "shot.png")
    assert seen["title"] == "scepsy report: infeasible.json"
    assert seen["headings"] == ["What happened", *HEADINGS, "Timings"]
    assert seen["images"] == []
    assert "The targets cannot be met" in seen["text"]
    assert seen["errors"] == [] and seen["outside"] == []
    _not_blank(tmp_path / "shot.png")
