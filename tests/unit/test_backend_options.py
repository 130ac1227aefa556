"""A backend's own options: its record names a pydantic model of them (declared by its module), and
ModelSettings' `backend_options` (a config key like any other) is validated against it, so a backend
with options needs no field of ModelSettings."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from siglip_serve.core.backends import BackendRecord, registered
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.plan.config import ConfigError, ServiceConfig


class EchoOptions(BaseModel):
    """The registered backend's options, as its module would declare them."""

    model_config = ConfigDict(extra="forbid")

    depth: int = Field(2, ge=1)
    mode: Literal["fast", "exact"] = "fast"


# Pytest imports this file by its base name (tests/unit has no __init__.py), as a replica would by PYTHONPATH.
RECORD = BackendRecord("with-options", device="cpu", implementation="nowhere:IMPLEMENTATION",
                       backend_options=f"{__name__}:EchoOptions")


def test_options_are_validated_against_the_records_model() -> None:
    with registered(RECORD):
        settings = ModelSettings(backend=RECORD.name, backend_options={"depth": "3"})
        assert settings.backend_options == {"depth": 3, "mode": "fast"}  # parsed, defaults filled in
        assert ModelSettings(backend=RECORD.name).backend_options == {"depth": 2, "mode": "fast"}
        with pytest.raises(ValidationError, match="depth"):
            ModelSettings(backend=RECORD.name, backend_options={"depth": 0})
        with pytest.raises(ValidationError, match="colour"):
            ModelSettings(backend=RECORD.name, backend_options={"colour": "red"})


def test_options_are_a_config_key_and_a_backend_without_a_model_takes_none() -> None:
    with registered(RECORD):
        config = ServiceConfig.from_args({"model": "tiny-siglip", "backend": RECORD.name,
                                          "backend_options": {"mode": "exact"}})
        assert config.model_settings().backend_options == {"depth": 2, "mode": "exact"}
    with pytest.raises(ConfigError, match="the 'cpu' backend takes no backend_options"):
        ServiceConfig.from_args({"model": "tiny-siglip", "backend": "cpu", "backend_options": {"depth": 3}})
    assert ModelSettings(backend="cpu").backend_options == {}
