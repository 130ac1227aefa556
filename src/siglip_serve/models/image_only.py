"""What a process that builds a model's image tower alone can leave out of open_clip's imports (torch-free).

open_clip imports `transformers` whatever it builds (open_clip/hf_model.py, in a try block that does without it),
and that import is about a second of CPU at every image replica's start. Only HF text towers and HF tokenizers
need it: SigLIP's towers are timm's and open_clip's own, and an image replica tokenizes nothing. A None in
`sys.modules` makes an import fail with ImportError (the Python reference, "The module cache"), which open_clip
takes as "transformers is not installed".
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("siglip_serve.models")

# The tiny models' configs (models/loading.py registers the same folder with open_clip).
CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def model_config(model: str) -> dict[str, Any] | None:
    """`model`'s open_clip config as its JSON file says, read without importing open_clip; None where no file is
    found (a config registered at run time, say)."""
    folders = [CONFIG_DIR]
    spec = importlib.util.find_spec("open_clip")  # finds the package without running it
    if spec is not None and spec.submodule_search_locations:
        folders += [Path(location) / "model_configs" for location in spec.submodule_search_locations]
    for folder in folders:
        path = folder / f"{model}.json"
        if path.is_file():
            try:
                loaded = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
            return loaded if isinstance(loaded, dict) else None
    return None


def leave_out_transformers(model: str) -> bool:
    """Before open_clip is first imported in a process that builds `model`'s image tower alone: keep it from
    importing transformers, where `model`'s config names no HF text tower. True when left out; False where it
    cannot be (already imported, open_clip already imported, no config found, or an HF text tower)."""
    if "transformers" in sys.modules or "open_clip" in sys.modules:
        return False
    config = model_config(model)
    if config is None or (config.get("text_cfg") or {}).get("hf_model_name"):
        return False
    sys.modules["transformers"] = None  # type: ignore[assignment]
    log.debug("transformers left out of this image-tower process (%s names no HF text tower)", model)
    return True
