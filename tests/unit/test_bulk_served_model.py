"""`siglip-serve embed --service-config FILE --served-model NAME`: the bulk job gets the config the service builds
that model with (serve/plan/served_models.py), from the same Serve YAML `serve deploy` takes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from siglip_serve.bulk.cli import _served, build_parser
from siglip_serve.core.errors import UserError
from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.served_models import served_models
from siglip_serve.serve.serve_yaml import BUILDER, service_args

ARGS = {"backend": "cpu", "buckets": [1, 2], "max_image_pixels": 1000000, "default_model": "old",
        "models": [{"name": "old", "model": "tiny-siglip"},
                   {"name": "new", "model": "tiny-siglip2", "seed": 1, "buckets": [1, 2, 4]}]}


def serve_yaml(tmp_path: Path, *apps: dict) -> Path:
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump({"proxy_location": "HeadOnly", "applications": list(apps)}))
    return path


def resolve(*argv: str) -> tuple[ServiceConfig, str]:
    return _served(build_parser().parse_args(["src", "-o", "out", *argv]), {"log_level": "INFO"})


def test_a_named_model_of_the_service_config_is_embedded_with_that_models_own_settings(tmp_path: Path) -> None:
    path = serve_yaml(tmp_path, {"name": "siglip", "route_prefix": "/", "import_path": BUILDER, "args": ARGS})
    config, name = resolve("--service-config", str(path), "--served-model", "new")
    served = {model.name: model.config for model in served_models(ServiceConfig.from_args(ARGS))}
    assert name == "new" and config.model_settings() == served["new"].model_settings()
    assert (config.model, config.seed, config.buckets, config.max_image_pixels) == ("tiny-siglip2", 1, (1, 2, 4),
                                                                                     1000000)
    default, name = resolve("--service-config", str(path))
    assert name == "old" and default.model_settings() == served["old"].model_settings()
    # --set still applies, on top of the model's own settings.
    capped, _ = _served(build_parser().parse_args(["src", "-o", "o", "--service-config", str(path),
                                                   "--served-model", "new"]),
                        {"max_image_pixels": 5000, "log_level": "INFO"})
    assert capped.max_image_pixels == 5000 and capped.buckets == (1, 2, 4)


def test_the_file_picks_the_app_and_the_model_or_says_which_there_are(tmp_path: Path) -> None:
    other = {"name": "other", "route_prefix": "/x", "import_path": "elsewhere:app", "args": {}}
    path = serve_yaml(tmp_path, other, {"name": "siglip", "route_prefix": "/", "import_path": BUILDER, "args": ARGS})
    assert resolve("--service-config", str(path), "--app", "siglip")[1] == "old"
    with pytest.raises(UserError, match="'newest' is not served.*'old', 'new'"):
        resolve("--service-config", str(path), "--served-model", "newest")
    with pytest.raises(UserError, match="no application named 'nope'.*'other', 'siglip'"):
        resolve("--service-config", str(path), "--app", "nope")
    with pytest.raises(UserError, match="drop --model"):
        resolve("--service-config", str(path), "--model", "tiny-siglip")
    plain = tmp_path / "args.yaml"
    plain.write_text(yaml.safe_dump(ARGS))
    assert service_args(yaml.safe_load(plain.read_text())) == ARGS
    assert resolve("--service-config", str(plain), "--served-model", "new")[0].model == "tiny-siglip2"
