"""The docs: the README stays short and undated, every relative link in it and in docs/ resolves, the generated
reference pages match the code (tools/gen_reference.py), every config key, flag and metric is in them, the site
builds with --strict (mkdocs.yml), and the service's /docs page loads nothing from outside the host."""

from __future__ import annotations

import argparse
import filecmp
import importlib.util
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path
from types import ModuleType

import pytest
from fastapi.testclient import TestClient

from siglip_serve.serve.ingress.endpoints import ROUTES
from siglip_serve.serve.ingress.endpoints.probes import SWAGGER_ASSETS
from siglip_serve.serve.ingress.http_app import http_app
from tests.helpers import API_KEY, REPO, TowerHandle, stand_in_ingress

DOCS = REPO / "docs"
README = REPO / "README.md"
README_LIMIT = 15_000
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
FENCED = re.compile(r"^\s*(```|~~~).*?^\s*\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)


def gen_reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", REPO / "tools" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def slug(heading: str) -> str:
    """Python-Markdown's toc slug (what mkdocs anchors are); GitHub's agrees for these headings."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    return {slug(match[2]) for match in HEADING.finditer(FENCED.sub("", page.read_text(encoding="utf-8")))}


def test_the_readme_is_short_and_keeps_the_two_commands_and_no_dated_log() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= README_LIMIT, "new figures go to docs/benchmarks.md and the log, not here"
    first = [" ".join(line.split()[:2]) for line in text.splitlines()[:5]]
    assert {"make serve", "make test"} <= set(first)
    headings = [match[2] for match in HEADING.finditer(FENCED.sub("", text))]
    dated = [h for h in headings if re.search(r"\b20\d\d-\d\d-\d\d\b|\bround\b", h, re.IGNORECASE)]
    assert not dated, f"dated or 'round' headings belong in docs/dev/benchmark-log.md: {dated}"
    assert "Apache-2.0" in text and (REPO / "LICENSE").is_file()


def test_every_relative_link_in_the_readme_and_the_docs_resolves() -> None:
    broken: list[str] = []
    checked = 0
    for page in pages():
        for match in LINK.finditer(CODE_SPAN.sub("", FENCED.sub("", page.read_text(encoding="utf-8")))):
            target = match[1]
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            checked += 1
            if not resolved.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert checked > 200  # the README's and every page's links were read
    assert not broken, "\n".join(broken)


def test_the_generated_reference_pages_match_the_code(tmp_path: Path) -> None:
    # With a key in the environment (loadtest's --api-key defaults to it): the pages must not carry it.
    run = subprocess.run([sys.executable, str(REPO / "tools" / "gen_reference.py"), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=REPO,
                         env={**os.environ, "SIGLIP_API_KEY": "a-key-never-documented"})
    assert run.returncode == 0, run.stderr
    names = sorted(gen_reference().PAGES)
    match, mismatch, errors = filecmp.cmpfiles(tmp_path, DOCS / "reference", names, shallow=False)
    assert sorted(match) == names, (f"stale: {mismatch + errors}; run `.venv/bin/python tools/gen_reference.py` "
                                    "and commit docs/reference/")


def test_every_config_key_is_in_the_reference_and_the_guide() -> None:
    from siglip_serve.serve.plan.config import ServiceConfig
    from siglip_serve.serve.plan.scaling import Autoscaling, IngressAutoscaling

    reference = (DOCS / "reference" / "configuration.md").read_text(encoding="utf-8")
    guide = (DOCS / "guides" / "configuration.md").read_text(encoding="utf-8")
    keys = list(ServiceConfig.model_fields)
    assert {"api_keys_file", "tracing", "retry_after_s", "encoder_num_cpus", "log_level"} <= set(keys)
    assert [k for k in keys if f"| `{k}` |" not in reference] == []
    assert [k for k in keys if f"`{k}`" not in guide] == []
    nested = [*Autoscaling.model_fields, *IngressAutoscaling.model_fields]
    assert [k for k in nested if f"| `{k}` |" not in reference] == []


def test_every_flag_of_every_command_is_in_the_cli_reference() -> None:
    from siglip_serve.__main__ import COMMANDS

    module = gen_reference()
    reference = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert {command.split()[0] for command in module.PARSERS if not command.startswith("python")} == set(COMMANDS)
    missing: list[str] = []
    flags = 0
    for command, (where, builder) in module.PARSERS.items():
        parsers = [getattr(importlib.import_module(where), builder)()]
        parsers += [sub for parser in parsers for sub in module._subparsers(parser).values()]
        for parser in parsers:
            for action in parser._actions:
                if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                    continue
                for flag in action.option_strings:
                    flags += 1
                    if f"`{flag}`" not in reference:
                        missing.append(f"{command}: {flag}")
    assert flags > 150
    assert not missing, missing


def test_every_metric_is_in_the_metrics_reference() -> None:
    from siglip_serve.serve.shared.metrics import METRIC_NAMES

    reference = (DOCS / "reference" / "metrics.md").read_text(encoding="utf-8")
    assert [name for name in METRIC_NAMES if f"| `ray_{name}` |" not in reference] == []


def test_the_site_builds_with_strict(tmp_path: Path) -> None:
    """What `make lint` runs: a broken link or anchor, a missing page, or a page outside the nav fails it."""
    mkdocs = Path(sys.executable).parent / "mkdocs"
    run = subprocess.run([str(mkdocs), "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
                         capture_output=True, text=True, timeout=300, cwd=REPO,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "site" / "reference" / "openapi.json").is_file()
    assert (tmp_path / "site" / "assets" / "swagger" / "swagger-ui-bundle.js").is_file()
    assert "mkdocs build --strict" in (REPO / "Makefile").read_text()  # `make lint` builds it


def local_urls(html: str) -> list[str]:
    """Every URL the page loads: src and href attributes, and the document Swagger UI fetches."""
    urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)
    urls += re.findall(r"""url:\s*["']([^"']+)["']""", html)
    return urls


def test_the_docs_page_loads_only_what_the_service_serves() -> None:
    with TestClient(http_app(stand_in_ingress(TowerHandle(), None), ROUTES)) as client:
        page = client.get("/docs")
        assert page.status_code == 200
        urls = local_urls(page.text)
        assert len(urls) >= 4, urls  # script, style, icon, the document
        outside = [u for u in urls if not (u.startswith("/") and not u.startswith("//"))
                   and not re.match(r"^https?://127\.0\.0\.1[:/]", u)]
        assert not outside, f"/docs loads from outside the host: {outside}"
        assert "validatorUrl\": null" in page.text  # no badge asking validator.swagger.io
        for url in urls:
            answer = client.get(url)
            assert answer.status_code == 200, url
        bundle = client.get("/docs/swagger-ui-bundle.js")
        assert bundle.headers["content-type"].startswith("text/javascript") and b"SwaggerUIBundle" in bundle.content
        assert client.get("/docs/swagger-ui.css").headers["content-type"].startswith("text/css")


@pytest.mark.parametrize("path", ["/docs", *(f"/docs/{name}" for name in SWAGGER_ASSETS)])
def test_the_docs_page_and_its_assets_are_behind_the_key(path: str) -> None:
    with TestClient(http_app(stand_in_ingress(TowerHandle(), None, api_key=API_KEY), ROUTES)) as client:
        assert client.get(path).status_code == 401
        assert client.get(path, headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
