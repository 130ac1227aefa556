"""Where a model's tokenizer comes from, and a check that it loads, without torch or open_clip.

`siglip-serve run` checks the tokenizer before Ray starts (serve/plan/model_checks.py `preflight_tokenizer`); the
text replicas load it through open_clip (models/text.py `load_tokenizer`), whose import brings torch and
transformers with it, seconds of a start's critical path on a small host. Where the tokenizer is a
`tokenizer.json` (a local directory, or the model's HF tokenizer already in the Hugging Face cache), the Rust
`tokenizers` library that transformers' fast tokenizers wrap parses it here instead; anything else (a slow
tokenizer's vocabulary files, an open_clip `local-dir:`, a tokenizer still to fetch) is loaded the replicas' way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from siglip_serve.core.errors import ModelLoadError
from siglip_serve.models.settings import TINY_MODEL, TINY_SIGLIP2, ModelSettings

CONFIGS = Path(__file__).resolve().parent / "configs"
BUNDLED_TINY_TOKENIZER = CONFIGS / "tiny-siglip-tokenizer"
BUNDLED_TOKENIZERS = {TINY_MODEL: BUNDLED_TINY_TOKENIZER, TINY_SIGLIP2: CONFIGS / "tiny-siglip2-tokenizer"}
FAST_FILE = "tokenizer.json"
OPEN_CLIP_CONFIG = "open_clip_config.json"


def tokenizer_dir(settings: ModelSettings) -> Path | None:
    """The local directory the tokenizer is read from (`tokenizer: DIR`, or a tiny model's bundled one); None: the
    model's own, by its config's HF tokenizer name."""
    if settings.tokenizer is not None:
        return Path(settings.tokenizer).expanduser()
    return BUNDLED_TOKENIZERS.get(settings.model)


def missing_directory(directory: Path) -> ModelLoadError:
    return ModelLoadError(f"tokenizer directory not found: {directory}; set tokenizer: DIR to a local copy of the "
                          "model's tokenizer files (tokenizer.json, tokenizer_config.json)")


def unloadable(where: str, exc: BaseException) -> ModelLoadError:
    """The one line for a tokenizer that does not load from `where`, whatever raised."""
    return ModelLoadError(
        f"cannot load the tokenizer from {where} ({type(exc).__name__}); set tokenizer: DIR to a local "
        "copy of the model's tokenizer files (tokenizer.json, tokenizer_config.json), e.g. "
        "`huggingface-cli download timm/ViT-SO400M-14-SigLIP-384 --local-dir DIR`")


def names_hf_tokenizer(config: Path) -> bool:
    """Whether an open_clip `local-dir:` config has open_clip read the directory's own HF tokenizer files, as its
    `get_tokenizer` does where the config's text_cfg names any `hf_tokenizer_name`."""
    try:
        loaded = json.loads(config.read_text(encoding="utf-8"))
        return bool(loaded["model_cfg"]["text_cfg"]["hf_tokenizer_name"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def fast_file(settings: ModelSettings, text_cfg: dict[str, Any]) -> tuple[Path, str] | None:
    """The `tokenizer.json` the replicas' tokenizer is built from, and where it is said to come from, where this
    machine holds one already; None where only loading it the replicas' way can tell. Raises ModelLoadError for a
    named directory that does not exist."""
    directory = tokenizer_dir(settings)
    if directory is not None:
        if not directory.is_dir():
            raise missing_directory(directory)
        if (directory / OPEN_CLIP_CONFIG).is_file() and not names_hf_tokenizer(directory / OPEN_CLIP_CONFIG):
            return None  # open_clip's local-dir: builds its own tokenizer, not from the directory's files
        path = directory / FAST_FILE
        return (path, str(directory)) if path.is_file() else None
    name = text_cfg.get("hf_tokenizer_name")
    if not name:
        return None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(str(name), FAST_FILE)
    return (Path(cached), f"the Hugging Face cache for {name}") if isinstance(cached, str) else None


def check_fast_tokenizer(settings: ModelSettings, text_cfg: dict[str, Any]) -> bool:
    """True once the tokenizer's `tokenizer.json` parsed; False where it has to be loaded the replicas' way.
    Raises ModelLoadError (one line) for a missing directory or a file that does not parse."""
    found = fast_file(settings, text_cfg)
    if found is None:
        return False
    path, where = found
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(str(path))
    except Exception as exc:  # broad on purpose: the Rust parser raises its own kinds; all mean "no tokenizer"
        raise unloadable(where, exc) from None
    return True
