"""models/image_only.py: an image-tower process leaves transformers out of open_clip's imports where the model has
no HF text tower, and still builds the real tower. Each check in a fresh interpreter, since the test session has
imported open_clip and transformers already."""

from __future__ import annotations

import subprocess
import sys

from siglip_serve.models.image_only import model_config


def test_the_model_config_is_read_without_open_clip() -> None:
    assert model_config("tiny-siglip")["vision_cfg"]["timm_model_name"] == "siglip_serve_tiny_patch8_64"
    assert model_config("ViT-SO400M-14-SigLIP-384")["vision_cfg"]["timm_model_name"] == "vit_so400m_patch14_siglip_384"
    assert model_config("no-such-model") is None


def _fresh(code: str) -> str:
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip()


def test_an_image_tower_builds_and_embeds_without_transformers() -> None:
    out = _fresh(
        "import sys, numpy as np\n"
        "from siglip_serve.models.image_only import leave_out_transformers\n"
        "left = leave_out_transformers('tiny-siglip')\n"
        "from siglip_serve.models.backends.implementation import create_encoder\n"
        "from siglip_serve.models.settings import ModelSettings\n"
        "tower = create_encoder(ModelSettings(model='tiny-siglip', buckets=(1, 2), torch_threads=1))\n"
        "tower.warmup()\n"
        "size = tower.info.image_size\n"
        "out = tower.encode(np.zeros((2, 3, *size), dtype=np.uint8))\n"
        "print(left, sys.modules['transformers'] is None, out.shape[0])\n")
    assert out == "True True 2"


def test_a_model_with_an_hf_text_tower_keeps_transformers() -> None:
    out = _fresh("import sys\n"
                 "from siglip_serve.models.image_only import leave_out_transformers\n"
                 "print(leave_out_transformers('mt5-base-ViT-B-32'), 'transformers' in sys.modules)\n")
    assert out == "False False"
    # Too late once open_clip is in: it has imported transformers (or tried) already.
    out = _fresh("import sys, open_clip\n"
                 "from siglip_serve.models.image_only import leave_out_transformers\n"
                 "print(leave_out_transformers('tiny-siglip'))\n")
    assert out == "False"
