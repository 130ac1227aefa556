"""The typed config: Serve YAML args validate at start and every problem is named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from siglip_serve.serve.plan.config import FRONT_ONLY, SERVICE_WIDE, ConfigError, ServiceConfig
from siglip_serve.serve.plan.live_settings import restart_keys
from siglip_serve.serve.plan.model_entry import PER_MODEL, ModelEntry
from siglip_serve.serve.plan.placement import replica_asks
from siglip_serve.serve.plan.served_models import model_app_args, served_models
from tests.helpers import REPO


def test_defaults_are_the_production_model_on_cpu() -> None:
    config = ServiceConfig.from_args({})
    assert config.model == "ViT-SO400M-14-SigLIP-384" and config.pretrained == "webli"
    assert config.backend == "cpu" and config.buckets == (1, 2, 4, 8) and config.max_batch_size == 8
    assert replica_asks(config).image.devices == {}
    assert config.max_body_bytes == 20 * 1024 * 1024 and config.max_image_pixels == 40_000_000
    assert config.max_images_per_request == 64


def test_neuron_backend_asks_for_one_core_per_replica() -> None:
    assert replica_asks(ServiceConfig.from_args({"backend": "neuron"})).image.devices == {"neuron_cores": 1}


@pytest.mark.parametrize("buckets, expected", [("8,1,4", (1, 4, 8)), ([2, 1], (1, 2)), ("16", (16,))])
def test_buckets_parse_and_sort(buckets: object, expected: tuple[int, ...]) -> None:
    assert ServiceConfig.from_args({"buckets": buckets}).buckets == expected


@pytest.mark.parametrize(
    "args, needle",
    [
        ({"buckets": []}, "buckets"),
        ({"buckets": [0, 2]}, "buckets"),
        ({"buckets": [2, 2]}, "distinct"),
        ({"replicas": 0}, "replicas"),
        ({"backend": "tpu"}, "backend"),
        ({"max_images_per_request": 0}, "max_images_per_request"),
        ({"request_timeout_s": 0}, "request_timeout_s"),
        ({"no_such_key": 1}, "no_such_key"),
        ({"random_weights": True, "checkpoint": __file__}, "weights source"),
        ({"ingress_replicas": 0}, "ingress_replicas"),
        ({"ingress_replicas": "many"}, "ingress_replicas"),
        ({"interactive_ingress": True}, "interactive_ingress needs api_keys_file"),
        ({"interactive_ingress": True, "api_keys_file": "keys.toml", "ingress_autoscaling": {"max_replicas": 2}},
         "interactive_ingress and ingress_autoscaling contradict"),
        ({"device_jpeg_decode": True, "backend": "neuron"}, "device_jpeg_decode needs backend cuda"),
        # classify's labels have no cache of their own: the message names the one that keeps them
        ({"classify_cache_size": 4096}, "classify_cache_size is not a setting: .* size it with embedding_cache_mib"),
    ],
)
def test_bad_config_is_refused_with_the_key_named(args: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        ServiceConfig.from_args(args)


def test_model_settings_carry_the_model_fields() -> None:
    config = ServiceConfig.from_args({"model": "tiny-siglip", "buckets": [1, 2], "replicas": 3})
    settings = config.model_settings()
    assert settings.model == "tiny-siglip" and settings.buckets == (1, 2) and settings.uses_random_weights
    assert not hasattr(settings, "replicas")


def test_api_key_is_secret_in_reprs() -> None:
    config = ServiceConfig.from_args({"api_key": "s3cret"})
    assert "s3cret" not in repr(config) and config.api_key.get_secret_value() == "s3cret"


@pytest.mark.parametrize("path", sorted((REPO / "deploy").glob("serve-*.yaml")), ids=lambda p: p.name)
def test_shipped_serve_configs_validate(path: Path) -> None:
    spec = yaml.safe_load(path.read_text())
    for app in spec["applications"]:
        assert app["import_path"] == "siglip_serve.serve.app:build_app"
        args = dict(app["args"])
        args.pop("checkpoint", None)  # a path on the target machine
        ServiceConfig.from_args(args)


def test_api_key_comes_from_args_then_file_then_environment(tmp_path) -> None:
    from siglip_serve.serve.plan.config import API_KEY_ENV, ConfigError

    def sent(args: dict, environ: dict) -> str | None:
        config = ServiceConfig.from_args(args)
        return config.key_to_send(config.api_keys_file, environ)

    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    env = {API_KEY_ENV: "from-env"}
    assert sent({"api_key": "from-args", "api_key_file": str(key_file)}, env) == "from-args"
    assert sent({"api_key_file": str(key_file)}, env) == "from-file"
    assert sent({}, env) == "from-env"
    assert sent({}, {}) is None
    with pytest.raises(ConfigError, match="cannot read"):
        sent({"api_key_file": str(tmp_path / "missing")}, {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        sent({"api_key_file": str(tmp_path / "empty")}, {})


def test_decode_limits_reach_the_image_limits() -> None:
    from siglip_serve.serve.plan.planner import image_limits, plan_service

    config = ServiceConfig.from_args({"max_image_side": 4096, "max_image_pixels": 1000})
    limits = image_limits(config)
    assert limits.max_side == 4096 and limits.max_pixels == 1000 and limits.max_bytes == config.max_body_bytes
    assert plan_service(config.model_copy(update={"replicas": 1})).model.front.image_limits == limits
    assert config.max_request_pixels == 160_000_000 and config.min_ready_replicas == 1


def test_a_checkpoint_only_the_workers_mount_is_parsed_on_the_head_and_refused_where_it_is_read() -> None:
    # The Serve config is validated on the Ray head too, which need not mount the workers' volumes.
    from siglip_serve.models.loading import ModelLoadError
    from siglip_serve.serve.plan.model_checks import preflight_weights

    config = ServiceConfig.from_args({"model": "ViT-B-16-SigLIP", "checkpoint": "/nonexistent/model.pt"})
    with pytest.raises(ModelLoadError, match="checkpoint file not found: /nonexistent/model.pt"):
        preflight_weights(config.model_settings())


def test_every_key_is_in_exactly_one_scope_the_group_that_declares_it_decides() -> None:
    scopes = {"per model": PER_MODEL, "the front's alone": FRONT_ONLY, "service-wide": SERVICE_WIDE}
    keys = set(ServiceConfig.model_fields)
    assert {key: [name for name, scope in scopes.items() if key in scope] for key in keys} == {
        key: [next(name for name, scope in scopes.items() if key in scope)] for key in keys}
    assert frozenset().union(*scopes.values()) == keys  # no scope names a key the config lacks
    assert set(ModelEntry.model_fields) == PER_MODEL | {"name"}  # an entry takes the per-model keys, no other
    # What a model's towers (and its own application's config) read is the whole service's, never the front's alone.
    assert {"log_level", "request_timeout_s", "api_keys_file", "interactive_encoder", "tracing"} <= SERVICE_WIDE


def test_a_models_own_application_gets_every_key_but_the_fronts_and_validates() -> None:
    front = {"replicas": 1, "log_level": "DEBUG", "request_timeout_s": 12, "max_body_bytes": 4096,
             "embedding_cache_mib": 8, "interactive_encoder": True, "api_keys_file": "/keys.toml",
             "models": [{"name": "a", "model": "tiny-siglip", "replicas": 2}, {"name": "b", "model": "tiny-siglip2"}]}
    own = model_app_args(front, "b")
    assert own == {"replicas": 1, "log_level": "DEBUG", "request_timeout_s": 12, "interactive_encoder": True,
                   "api_keys_file": "/keys.toml", "models": [{"name": "b", "model": "tiny-siglip2"}]}
    assert [entry.name for entry in ServiceConfig.from_args(own).models] == ["b"]


@pytest.mark.parametrize("entry, words", [
    ({"model": "tiny-siglip"}, "models[0]: Value error, name: give each model a name"),
    ({"name": "a b"}, "models[0]: Value error, name: give each model a name of letters"),
    ({"name": "a", "max_body_bytes": 2048, "tracing": True},
     "models[0] (a): Value error, max_body_bytes, tracing belong to the service, not one model; set them beside "
     "models:, or per model only allow_dimension_truncation, "),
    ({"name": "a", "buckets": [0]}, "models[0] (a): buckets: Value error, batch buckets must be between 1 and 256"),
    ({"name": "a", "replicas": 0}, "models[0] (a): Value error, replicas must be at least 1"),
])
def test_a_models_entry_is_typed_and_refused_naming_its_place_its_name_and_the_key(entry: dict, words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        ServiceConfig.from_args({"models": [entry]})
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_an_entry_is_what_it_sets_so_a_default_set_in_it_still_goes_over_the_services() -> None:
    base = {"seed": 5, "replicas": 1}
    plain = ServiceConfig.from_args({**base, "models": [{"name": "a", "model": "tiny-siglip"}]})
    zero = ServiceConfig.from_args({**base, "models": [{"name": "a", "model": "tiny-siglip", "seed": 0}]})
    assert isinstance(zero.models[0], ModelEntry) and zero.models[0].seed == plain.models[0].seed == 0
    assert zero.models[0].own() == {"model": "tiny-siglip", "seed": 0}
    assert [(m.name, m.config.seed) for m in served_models(plain)] == [("a", 5)]
    assert [(m.name, m.config.seed) for m in served_models(zero)] == [("a", 0)]
    assert zero.models != plain.models and restart_keys(plain, zero) == ["models"]  # a reload sees the change
    assert ServiceConfig.from_args({**base, "models": [{"name": "a", "model": "tiny-siglip"}]}) == plain
    renamed = ServiceConfig.from_args({**base, "models": [{"name": "b", "model": "tiny-siglip"}]})
    assert renamed.models != plain.models and restart_keys(plain, renamed) == ["models"]


def test_an_entrys_backend_options_are_checked_against_the_backend_its_model_runs_on() -> None:
    """The backend may be the service's: an entry's options are checked in its model's whole config."""
    config = ServiceConfig.from_args({"backend": "cpu", "models": [{"name": "a", "backend_options": {"x": 1}}]})
    with pytest.raises(ConfigError, match=r"models\[0\] \(a\): backend_options: .*takes no backend_options"):
        served_models(config)
