"""Where a model comes from, decided once from the name `model:` gives it: an open_clip config name (its weights a
pretrained tag, a checkpoint or random), an open_clip repository on the Hugging Face hub (`hf-hub:ORG/NAME`), or a
transformers SigLIP repository (`ORG/NAME`). Everything past the settings asks this record, never the name again.

Torch-free: the settings, the plan and the ingress read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

SourceKind = Literal["open_clip", "open_clip_hub", "transformers"]
OPEN_CLIP: SourceKind = "open_clip"
OPEN_CLIP_HUB: SourceKind = "open_clip_hub"
TRANSFORMERS: SourceKind = "transformers"

# open_clip's own prefix for a repository of its format (open_clip/factory.py HF_HUB_PREFIX).
HF_HUB_PREFIX = "hf-hub:"
# The hub's repository ids: ORG/NAME of letters, digits, '-', '_' and '.'. open_clip config names hold no '/'.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class ModelSource:
    """The model's kind, the name as configured, and for a hub kind its repository and pinned revision."""

    kind: SourceKind
    name: str
    repo: str | None = None
    revision: str | None = None  # None: the repository's main branch

    @property
    def on_hub(self) -> bool:
        return self.kind != OPEN_CLIP

    @property
    def label(self) -> str:
        """The weights' name where weights are recorded: 'hub:ORG/NAME', '@REVISION' added when pinned."""
        return f"hub:{self.repo}" + (f"@{self.revision}" if self.revision else "")


def model_source(model: str, revision: str | None = None) -> ModelSource:
    """The record for `model:` and `revision:`; ValueError (one line) for a malformed id or a revision that pins
    nothing."""
    if model.startswith(HF_HUB_PREFIX):
        repo = model[len(HF_HUB_PREFIX):]
        if not _REPO_ID.fullmatch(repo):
            raise ValueError(f"{model!r}: an open_clip hub id is hf-hub:ORG/NAME")
        return ModelSource(OPEN_CLIP_HUB, model, repo, revision)
    if "/" in model:
        if not _REPO_ID.fullmatch(model):
            raise ValueError(f"{model!r} is neither an open_clip config name nor a Hugging Face repository id "
                             "(ORG/NAME)")
        return ModelSource(TRANSFORMERS, model, model, revision)
    if revision is not None:
        raise ValueError(f"revision pins a Hugging Face repository; {model!r} is an open_clip config name (its "
                         "weights are a pretrained tag or a checkpoint)")
    return ModelSource(OPEN_CLIP, model)
