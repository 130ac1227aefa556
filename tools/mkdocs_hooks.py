"""mkdocs hooks for the docs site (mkdocs.yml `hooks:`).

The pages link to the code and the manifests the way GitHub renders them (`../src/siglip_serve/...`,
`../deploy/...`); those files are not part of the site, so mkdocs would report each as a missing page. Here such a
link is checked on disk instead (missing: a warning, which `--strict` turns into a failed build) and shown as its
path in the repository. The OpenAPI page embeds Swagger UI from the assets the service itself serves at /docs
(fastapi-swagger's package), copied into the built site so it needs no CDN.
"""

from __future__ import annotations

import logging
import re
import shutil
from importlib.resources import files
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.siglip_serve")
REPO = Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!!)\[(?P<label>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)", re.MULTILINE)
# Inline code (`kernel[2](...)`) is no link.
CODE_SPAN = re.compile(r"(`[^`\n]*`)")
SWAGGER_FILES = ("swagger-ui-bundle.js", "swagger-ui.css")
# Where the OpenAPI page expects them, relative to the site's root (tools/gen_reference.py's openapi.md).
SWAGGER_DIR = "assets/swagger"


def _outside(label: str, target: str, page_dir: Path, docs_dir: Path, src: str) -> str | None:
    """The text that replaces a link to a repository file outside docs/, or None to leave the link to mkdocs."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    path = target.split("#", 1)[0]
    resolved = (page_dir / path).resolve()
    if resolved.is_relative_to(docs_dir.resolve()):
        return None
    if not resolved.exists():
        log.warning("Doc file '%s' links to '%s', which is not in the repository", src, target)
        return None
    shown = resolved.relative_to(REPO).as_posix() + ("/" if resolved.is_dir() else "")
    return label if shown.rstrip("/") in label.strip("`") else f"{label} (`{shown}`)"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **_: Any) -> str:
    docs_dir = Path(config["docs_dir"])
    page_dir = (docs_dir / page.file.src_uri).parent
    parts = FENCE.split(markdown)
    # split() with one group: text, fence, inside, fence, text, ...; only the text outside fences is rewritten.
    out: list[str] = []
    inside = False
    for index, part in enumerate(parts):
        if index % 2 == 1:
            out.append(part)
            inside = not inside
            continue
        if inside:
            out.append(part)
            continue

        def replace(match: re.Match[str]) -> str:
            text = _outside(match["label"], match["target"], page_dir, docs_dir, page.file.src_uri)
            return match[0] if text is None else text

        out.extend(piece if piece.startswith("`") else LINK.sub(replace, piece) for piece in CODE_SPAN.split(part))
    return "".join(out)


def on_post_build(config: Any, **_: Any) -> None:
    target = Path(config["site_dir"]) / SWAGGER_DIR
    target.mkdir(parents=True, exist_ok=True)
    resources = files("fastapi_swagger").joinpath("resources")
    for name in SWAGGER_FILES:
        with resources.joinpath(name).open("rb") as source, open(target / name, "wb") as copy:
            shutil.copyfileobj(source, copy)
