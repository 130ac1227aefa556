"""Live settings in place (serve/plan/live_settings.py): the Serve config applied again the way `serve deploy` does,
with only the ingress deployment's user_config changed (a limit, the keys file), while a light load runs: every
request answered, the same replicas in the same processes, the new values in force; a bad user_config leaves the
ones in force. The session's Ray; loopback only."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from siglip_serve.core.poll import poll
from siglip_serve.serve.plan.live_settings import INGRESS_DEPLOYMENT
from siglip_serve.serve.serve_yaml import BUILDER
from tests.bounds import SETTLE_S, START_S
from tests.helpers import BackgroundLoad, ServeCluster, delete_apps

APP = "live"
ROUTE = "/live"
ARGS = {"model": "tiny-siglip", "replicas": 1, "neuron_cores_per_replica": 0, "encoder_num_cpus": 0.25,
        "text_replicas": 0, "ingress_replicas": 1, "torch_threads": 1, "batch_wait_timeout_s": 0.01}
OLD_KEY, NEW_KEY = "old-key", "new-key"


def apply(user_config: dict[str, Any]) -> None:
    """What `serve deploy` does with a YAML whose `deployments:` sets the ingress's user_config
    (ray/dashboard/modules/serve/serve_head.py put_all_applications): the controller's apply_config."""
    from ray.serve._private.api import serve_start
    from ray.serve.schema import ServeDeploySchema

    serve_start().deploy_apps(ServeDeploySchema.model_validate({"applications": [{
        "name": APP, "route_prefix": ROUTE, "import_path": BUILDER, "args": ARGS,
        "deployments": [{"name": INGRESS_DEPLOYMENT, "user_config": user_config}]}]}))


def keys_file(path: Path, *keys: str) -> str:
    path.write_text("".join(f'[[keys]]\nname = "{key}"\nkey = "{key}"\n' for key in keys))
    return str(path)


def replicas(client: httpx.Client, key: str) -> tuple[str, set[int], set[tuple[str, int]]]:
    """The ingress replica's id (/v1/models, asked with `key`), its process (Ray titles a replica's process
    ray::ServeReplica:APP:DEPLOYMENT), and every tower replica's (id, pid) from the registry."""
    from siglip_serve.serve.shared import registry

    ingress = client.get("/v1/models", headers=auth(key)).json()["data"][0]["ingress_replica"]
    title = f"ServeReplica:{APP}:{INGRESS_DEPLOYMENT}"
    pids = {p.pid for p in psutil.process_iter(["cmdline"]) if title in " ".join(p.info["cmdline"] or ())}
    towers = {(str(r["replica_id"]), int(r["pid"])) for r in registry.live_replicas(APP)}
    assert len(pids) == 1 and towers, (pids, towers)
    return ingress, pids, towers


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def client(serve_cluster: ServeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    directory = tmp_path_factory.mktemp("live")
    apply({"api_keys_file": keys_file(directory / "first.toml", OLD_KEY)})
    with httpx.Client(base_url=serve_cluster.base_url + ROUTE, timeout=60) as client:
        _, ready, _ = poll(lambda: client.get("/readyz").status_code, lambda code: code == 200, START_S,
                           interval_s=0.5)
        assert ready
        client.directory = directory  # type: ignore[attr-defined]
        yield client
    delete_apps([APP])


def answers(client: httpx.Client, key: str, image: str) -> httpx.Response:
    return client.post("/v1/embeddings", headers=auth(key), json={"input": image, "modality": "image"})


def test_a_limit_and_the_keys_file_change_in_place_under_load(client: httpx.Client, photo_jpegs: list[bytes]) -> None:
    image = "data:image/jpeg;base64," + base64.b64encode(photo_jpegs[0]).decode()
    directory: Path = client.directory  # type: ignore[attr-defined]
    assert answers(client, NEW_KEY, image).status_code == 401
    assert answers(client, OLD_KEY, image).status_code == 200
    second = keys_file(directory / "second.toml", OLD_KEY, NEW_KEY)
    before = replicas(client, OLD_KEY)
    body = {"input": image, "modality": "image"}
    with BackgroundLoad(client.base_url, auth(OLD_KEY), [("a", body), ("b", body)]) as load:
        poll(load.total, lambda n: n >= 10, SETTLE_S, interval_s=0.2)
        apply({"api_keys_file": second, "embedding_cache_mib": 1})
        _, switched, _ = poll(lambda: answers(client, NEW_KEY, image).status_code, lambda c: c == 200, SETTLE_S,
                              interval_s=0.3)
        assert switched
        cache = client.get("/v1/models", headers=auth(NEW_KEY)).json()["data"][0]["cache"]
        assert cache["enabled"] and cache["max_bytes"] == 1024 * 1024, cache
        count = load.total()
        poll(load.total, lambda n: n >= count + 10, SETTLE_S, interval_s=0.2)
    assert load.outcomes() == {"200"}, dict(load.got)

    # A deadline no request meets: every request now answers 504 naming it, the documented refusal.
    apply({"api_keys_file": second, "request_timeout_s": 0.001})
    timed_out, done, _ = poll(lambda: answers(client, NEW_KEY, image), lambda a: a.status_code == 504, SETTLE_S,
                              interval_s=0.3)
    assert done, timed_out.text
    assert "0.001 s" in timed_out.json()["error"]["message"], timed_out.text

    # Not live, or a keys file that cannot be read: logged by the replica, the settings in force stay.
    for bad in ({"api_keys_file": second, "decode_threads": 2}, {"api_keys_file": str(directory / "gone.toml")}):
        apply(bad)
        # Serve's controller reconfigures the replica within a loop or two (0.1 s each); a raise there would stop
        # it and start another, which the final check of the processes sees.
        time.sleep(2)
        _, running, _ = poll(serve_status, lambda s: s == "RUNNING", SETTLE_S, interval_s=0.3)
        assert running
        assert answers(client, NEW_KEY, image).status_code == 504

    apply({"api_keys_file": second})  # the args' deadline again
    _, back, _ = poll(lambda: answers(client, NEW_KEY, image).status_code, lambda c: c == 200, SETTLE_S, interval_s=0.3)
    assert back
    assert answers(client, "nobody", image).status_code == 401
    assert replicas(client, NEW_KEY) == before  # the same replicas, the same processes throughout


def serve_status() -> str:
    from ray import serve

    return str(serve.status().applications[APP].status).rsplit(".", 1)[-1]
