"""deploy/kuberay/rayservice.yaml against KubeRay's RayService CRD and the trn2 LNC arithmetic.

The schema is the CRD's own (KubeRay v1.7.0, vendored in tests/data with its source), validated
strictly: an unknown field fails here, as `kubectl apply` (strict field validation) would refuse it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.placement import replica_asks
from siglip_serve.serve.plan.planner import plan_service
from siglip_serve.serve.plan.policy import policy_of
from tests.helpers import REPO

MANIFEST = REPO / "deploy" / "kuberay" / "rayservice.yaml"
SCHEMA = REPO / "tests" / "data" / "kuberay-v1.7.0-rayservice-v1.schema.json"

# trn2.3xlarge: one Trainium2 chip of 8 physical NeuronCores (the Neuron docs, "Logical NeuronCore
# configuration": LNC=2 groups them into 4 logical cores, LNC=1 shows 8).
CHIPS_PER_NODE = {"trn2.3xlarge": 1}
PHYSICAL_CORES_PER_CHIP = 8
# KubeRay's upgrade types (ray-operator/apis/ray/v1/rayservice_types.go, v1.7.0); only None makes no
# second RayCluster, so it is the one a fixed set of trn2 nodes can run.
UPGRADE_TYPES = {"NewClusterWithIncrementalUpgrade", "NewCluster", "None"}


def logical_cores(chips: int, lnc: int) -> int:
    return chips * PHYSICAL_CORES_PER_CHIP // lnc


def strict(schema: Any) -> Any:
    """The CRD schema with unknown object fields refused (where the CRD does not preserve them)."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = strict(json.loads(SCHEMA.read_text()))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.fixture()
def manifest() -> dict[str, Any]:
    return yaml.safe_load(MANIFEST.read_text())


def errors(validator: jsonschema.Draft7Validator, document: dict[str, Any]) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_the_manifest_is_a_valid_rayservice(validator: jsonschema.Draft7Validator, manifest: dict) -> None:
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    assert errors(validator, manifest) == []


def test_the_strict_schema_catches_what_kubernetes_would_refuse(validator: jsonschema.Draft7Validator,
                                                                  manifest: dict) -> None:
    typo = copy.deepcopy(manifest)
    typo["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replica"] = 2
    assert any("'replica' was unexpected" in e for e in errors(validator, typo))
    wrong_type = copy.deepcopy(manifest)
    wrong_type["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = "two"
    assert any("replicas" in e and "integer" in e for e in errors(validator, wrong_type))


def test_upgrades_need_no_second_set_of_trn2_nodes(manifest: dict) -> None:
    strategy = manifest["spec"]["upgradeStrategy"]["type"]
    assert strategy in UPGRADE_TYPES and strategy == "None"


def test_workers_take_whole_chips_and_declare_the_lnc_arithmetic(manifest: dict) -> None:
    cluster = manifest["spec"]["rayClusterConfig"]
    args = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"][0]["args"]
    config = ServiceConfig.from_args(args)
    min_cores = max_cores = min_nodes = max_nodes = 0
    for group in cluster["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        assert "schedulerName" not in pod  # no chart creates a neuron-scheduler; whole chips need none
        (container,) = pod["containers"]
        limits, requests = container["resources"]["limits"], container["resources"]["requests"]
        # Whole devices only: a neuroncore request is counted at the node's LNC by the device plugin.
        assert "aws.amazon.com/neuroncore" not in limits and "aws.amazon.com/neuroncore" not in requests
        chips = limits["aws.amazon.com/neuron"]
        assert requests["aws.amazon.com/neuron"] == chips
        assert chips == CHIPS_PER_NODE[pod["nodeSelector"]["node.kubernetes.io/instance-type"]]
        assert "IPC_LOCK" in container["securityContext"]["capabilities"]["add"]
        env = {e["name"]: e["value"] for e in container["env"]}
        lnc = int(env["NEURON_LOGICAL_NC_CONFIG"])
        declared = json.loads(json.loads(group["rayStartParams"]["resources"]))["neuron_cores"]
        assert declared == logical_cores(chips, lnc)
        assert config.env_vars["NEURON_LOGICAL_NC_CONFIG"] == str(lnc) and f"lnc{lnc}" in args["artifact_dir"]
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        min_cores += declared * group["minReplicas"]
        max_cores += declared * group["maxReplicas"]
        min_nodes += group["minReplicas"]
        max_nodes += group["maxReplicas"]
    cores_per_replica = replica_asks(config).image.devices["neuron_cores"]
    assert config.backend == "neuron" and cores_per_replica == 1 and config.replicas is None
    # Encoders scale by node: one per logical core of the fewest and of the most worker nodes.
    assert config.autoscaling is not None
    assert config.autoscaling.min_replicas == min_cores // cores_per_replica
    assert config.autoscaling.max_replicas == max_cores // cores_per_replica
    # The ingress scales with them, on its CPU: one per node at the fewest nodes, two per node at the most.
    assert config.ingress_autoscaling is not None
    assert plan_service(config).ingress.deployment.autoscaling_config is not None
    assert (config.ingress_autoscaling.min_replicas, config.ingress_autoscaling.max_replicas) == (min_nodes,
                                                                                                2 * max_nodes)
    assert cluster["rayVersion"] == "2.60.0"


def test_the_first_deploy_on_the_bare_head_is_not_refused(manifest: dict) -> None:
    """KubeRay submits serveConfigV2 once the head pod is ready, before any worker registers: the builder's
    cluster check on the head alone (num-cpus 0, no neuron_cores) must deploy, not refuse (B1 of issue 35)."""
    from siglip_serve.serve.plan.cluster_fit import check_cluster_fits, cluster_growth

    config = ServiceConfig.from_args(yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"][0]["args"])
    head = manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]
    growth = cluster_growth(config, {})  # said by the manifest itself, not only by KubeRay's environment
    assert growth.grows and isinstance(policy_of(config).replica_setting, int)
    check_cluster_fits(plan_service(config), growth, {"CPU": float(head["num-cpus"])})


def test_the_autoscaler_adds_trn2_nodes_and_removes_idle_ones(manifest: dict,
                                                               validator: jsonschema.Draft7Validator) -> None:
    cluster = manifest["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    options = cluster["autoscalerOptions"]
    assert options["upscalingMode"] == "Default" and options["idleTimeoutSeconds"] > 0
    typo = copy.deepcopy(manifest)
    typo["spec"]["rayClusterConfig"]["autoscalerOptions"]["upscalingMode"] = "Fast"
    assert any("upscalingMode" in e for e in errors(validator, typo))


@pytest.mark.parametrize("lnc,cores", [(2, 4), (1, 8)])
def test_lnc_arithmetic_of_a_trn2_3xlarge(lnc: int, cores: int) -> None:
    assert logical_cores(CHIPS_PER_NODE["trn2.3xlarge"], lnc) == cores


def test_the_device_plugin_install_covers_every_worker_instance_type_and_says_how_to_check(manifest: dict) -> None:
    """Issue 35, B9: the chart version read (1.0.0) lists no trn2 type in neuronInstances, so the install command
    in the manifest and docs/trn2.md sets the list, with every type a worker group runs on, and the node check
    that shows whether the plugin runs there."""
    import re

    header = "\n".join(line[1:].strip() for line in MANIFEST.read_text().splitlines() if line.startswith("#"))
    doc = (REPO / "docs" / "trn2.md").read_text()
    workers = {group["template"]["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"]
               for group in manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    for text in (header, doc):
        (install,) = re.findall(r"helm upgrade --install neuron-helm-chart oci://public\.ecr\.aws/neuron/"
                                r"neuron-helm-chart --version <V> --set 'neuronInstances=\{([^}]*)\}'", text)
        assert workers <= set(install.split(","))
        for worker in workers:
            assert (f"kubectl get nodes -l node.kubernetes.io/instance-type={worker} -o custom-columns="
                    f"'NAME:.metadata.name,NEURON:.status.allocatable.aws\\.amazon\\.com/neuron'") in text
        assert "helm show values oci://public.ecr.aws/neuron/neuron-helm-chart" in " ".join(text.split())


def test_the_head_stays_off_trn2_nodes(manifest: dict) -> None:
    head = manifest["spec"]["rayClusterConfig"]["headGroupSpec"]
    terms = head["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    for term in terms:  # every term must exclude trn2 (terms are ORed)
        (expression,) = [e for e in term["matchExpressions"] if e["key"] == "node.kubernetes.io/instance-type"]
        assert expression["operator"] == "NotIn" and "trn2.3xlarge" in expression["values"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    (container,) = head["template"]["spec"]["containers"]
    assert not any(k.startswith("aws.amazon.com/") for k in container["resources"]["limits"])


def test_every_ray_process_runs_serve_in_throughput_mode(manifest: dict) -> None:
    from siglip_serve.core.constants import SERVE_THROUGHPUT_ENV

    cluster = manifest["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        (container,) = group["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        assert {k: env.get(k) for k in SERVE_THROUGHPUT_ENV} == SERVE_THROUGHPUT_ENV, container["name"]


# -- deploy/kuberay/rayjob-embed.yaml: the bulk job -------------------------------------------

JOB_MANIFEST = REPO / "deploy" / "kuberay" / "rayjob-embed.yaml"
JOB_SCHEMA = REPO / "tests" / "data" / "kuberay-v1.7.0-rayjob-v1.schema.json"


def test_the_bulk_job_is_a_valid_rayjob_whose_entrypoint_our_cli_takes() -> None:
    import shlex

    from siglip_serve.bulk.cli import build_parser
    from siglip_serve.bulk.job import JobSpec, plan_workers
    from siglip_serve.models.cli_args import model_values

    schema = strict(json.loads(JOB_SCHEMA.read_text()))
    job = yaml.safe_load(JOB_MANIFEST.read_text())
    assert job["kind"] == "RayJob" and errors(jsonschema.Draft7Validator(schema), job) == []
    command = shlex.split(job["spec"]["entrypoint"])
    assert command[:2] == ["siglip-serve", "embed"]
    args = build_parser().parse_args(command[2:])
    config = ServiceConfig.from_args(model_values(args))
    assert args.address == "auto" and config.backend == "neuron"
    # Every logical NeuronCore of the worker group gets an encoder; the decoders take the CPUs left.
    (group,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    cores = json.loads(json.loads(group["rayStartParams"]["resources"]))["neuron_cores"]
    cpus = int(group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])
    plan = plan_workers(config, JobSpec(args.source, args.output), {"CPU": group["replicas"] * cpus,
                                                                    "neuron_cores": group["replicas"] * cores})
    assert plan.encoders == group["replicas"] * logical_cores(CHIPS_PER_NODE["trn2.3xlarge"], 2)
    assert plan.decode_workers == group["replicas"] * (cpus - cores)
    # No retries: each would be a new cluster failing as the first did; a rerun resumes by shard (docs/batch.md).
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["shutdownAfterJobFinishes"] is True


# -- every pod that reads the artifacts or touches S3 can -------------------------------------

def _cluster(document: dict) -> dict:
    return document["spec"]["rayClusterConfig" if document["kind"] == "RayService" else "rayClusterSpec"]


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return [s for v in value for s in _strings(v)] if isinstance(value, list) else []


def workload(document: dict) -> tuple[set[str], set[str]]:
    """(the local folders the model's processes read, the s3:// locations the workload reads or writes): from
    each Serve application's args (`*_dir` keys) or from the job's entrypoint (`--*-dir` options)."""
    import shlex

    if document["kind"] == "RayService":
        apps = yaml.safe_load(document["spec"]["serveConfigV2"])["applications"]
        paths = {str(v) for app in apps for k, v in app.get("args", {}).items() if k.endswith("_dir") and v}
        found = _strings([app.get("args", {}) for app in apps])
    else:
        found = shlex.split(document["spec"]["entrypoint"])
        options = [(a.split("=", 1) + [found[i + 1] if i + 1 < len(found) else ""])[:2]
                   for i, a in enumerate(found) if a.startswith("--")]
        paths = {value for option, value in options if option.endswith("-dir") and value}
    return paths, {s for s in found if s.startswith("s3://")}


def _hosts_work(params: dict) -> bool:
    """Whether Ray can place tasks, actors or replicas on this pod's node: it offers CPUs or declares a
    custom resource (a head started with num-cpus 0 and none holds only the driver and Ray's own processes)."""
    return str(params.get("num-cpus", "")) != "0" or bool(params.get("resources"))


def access_violations(document: dict) -> list[str]:
    """Each pod that would fail at the first read: one whose node hosts the model's processes without a
    mount holding every path they read, and, when the workload names S3, one without a service account
    (the head too: a RayJob's driver and a RayService's builder run there)."""
    from pathlib import PurePosixPath

    paths, s3 = workload(document)
    cluster = _cluster(document)
    pods = [("head", cluster["headGroupSpec"])] + [(f"workers {g['groupName']}", g)
                                                   for g in cluster.get("workerGroupSpecs", [])]
    found = []
    for name, group in pods:
        spec = group["template"]["spec"]
        volumes = {v["name"] for v in spec.get("volumes", [])}
        if _hosts_work(group.get("rayStartParams", {})):
            for container in spec["containers"]:
                mounted = [PurePosixPath(m["mountPath"]) for m in container.get("volumeMounts", [])
                           if m["name"] in volumes]
                found += [f"{name}: container {container['name']} reads {path} but mounts no volume holding it"
                          for path in sorted(paths) if not any(PurePosixPath(path).is_relative_to(m) for m in mounted)]
        if s3 and spec.get("serviceAccountName", "default") == "default":
            found.append(f"{name}: touches {', '.join(sorted(s3))} with no serviceAccountName for S3")
    return found


@pytest.mark.parametrize("path", [MANIFEST, JOB_MANIFEST], ids=["rayservice", "rayjob"])
def test_every_pod_mounts_the_artifacts_it_reads_and_may_use_the_s3_it_touches(path: Any) -> None:
    """Issue 41: the replicas and bulk actors run on the workers and read the artifact there; a bulk job's
    driver (on the head) and its decode tasks (on the workers) read and write S3."""
    document = yaml.safe_load(path.read_text())
    paths, s3 = workload(document)
    assert paths == {"/artifacts/so400m-lnc2"}  # what the rule is checked against, found by the parser
    assert (s3 != set()) == (document["kind"] == "RayJob")
    assert access_violations(document) == []


def test_a_manifest_missing_a_mount_or_the_service_account_is_caught() -> None:
    job = yaml.safe_load(JOB_MANIFEST.read_text())
    service = yaml.safe_load(MANIFEST.read_text())

    def broken(document: dict, change: Any) -> list[str]:
        document = copy.deepcopy(document)
        change(_cluster(document))
        return access_violations(document)

    s3 = "s3://my-bucket/catalogue/images.parquet, s3://my-bucket/embeddings/so400m-webli"
    unmounted = ("workers trn2-3xlarge: container ray-worker reads /artifacts/so400m-lnc2 but mounts no volume "
                 "holding it")
    no_mount = lambda c: c["workerGroupSpecs"][0]["template"]["spec"]["containers"][0].pop("volumeMounts")  # noqa: E731
    assert broken(job, no_mount) == broken(service, no_mount) == [unmounted]
    no_volume = lambda c: c["workerGroupSpecs"][0]["template"]["spec"].pop("volumes")  # noqa: E731
    assert broken(service, no_volume) == [unmounted]
    assert broken(job, lambda c: c["headGroupSpec"]["template"]["spec"].pop("serviceAccountName")) == [
        f"head: touches {s3} with no serviceAccountName for S3"]
    assert broken(job, lambda c: c["workerGroupSpecs"][0]["template"]["spec"].pop("serviceAccountName")) == [
        f"workers trn2-3xlarge: touches {s3} with no serviceAccountName for S3"]
    # A head that offers CPUs hosts work too, so it must then mount what the work reads.
    assert broken(service, lambda c: c["headGroupSpec"]["rayStartParams"].pop("num-cpus")) == [
        "head: container ray-head reads /artifacts/so400m-lnc2 but mounts no volume holding it"]
    moved = copy.deepcopy(job)
    moved["spec"]["entrypoint"] = moved["spec"]["entrypoint"].replace("/artifacts/", "/models/")
    assert access_violations(moved) == [unmounted.replace("/artifacts/", "/models/")]


def test_the_s3_policy_file_grants_the_jobs_own_input_and_output_and_nothing_else() -> None:
    """The header, docs/batch.md and tests/integration/test_bulk_s3.py all point at one policy file; here it is
    held against the entrypoint's locations: what the job reads and writes is granted, nothing beside it."""
    import shlex

    from siglip_serve.bulk.cli import build_parser
    from tests.s3_stand_in import allows, read_policy

    job = yaml.safe_load(JOB_MANIFEST.read_text())
    args = build_parser().parse_args(shlex.split(job["spec"]["entrypoint"])[2:])
    assert "rayjob-embed-s3-policy.json" in JOB_MANIFEST.read_text().split("apiVersion:")[0]
    policy = read_policy()
    table, out = args.source.removeprefix("s3://"), args.output.removeprefix("s3://")
    bucket, images = table.split("/")[0], table.rsplit("/", 1)[0]
    shard = "part-000000-x.parquet"
    wanted = [("s3:GetObject", f"arn:aws:s3:::{table}"), ("s3:GetObject", f"arn:aws:s3:::{images}/img/1.jpg"),
              ("s3:ListBucket", f"arn:aws:s3:::{bucket}"), ("s3:PutObject", f"arn:aws:s3:::{out}/{shard}"),
              ("s3:GetObject", f"arn:aws:s3:::{out}/_errors/{shard}")]
    assert [w for w in wanted if not allows(policy, *w)] == []
    refused = [("s3:PutObject", f"arn:aws:s3:::{bucket}/embeddings/"), ("s3:PutObject", f"arn:aws:s3:::{images}/x"),
               ("s3:DeleteObject", f"arn:aws:s3:::{out}/{shard}"), ("s3:GetObject", f"arn:aws:s3:::{out}"),
               ("s3:ListBucket", "arn:aws:s3:::other-bucket")]
    assert [r for r in refused if allows(policy, *r)] == []


# -- the artifact volume and where the heads run --------------------------------------------------

VOLUME_MANIFEST = REPO / "deploy" / "kuberay" / "artifacts-efs.yaml"


def _artifact_volumes(document: dict) -> list[tuple[str, dict, dict]]:
    """(pod group, its volume, the Ray container's mount of it) for every pod of a workload that mounts the claim."""
    cluster = _cluster(document)
    found = []
    groups = [("head", cluster["headGroupSpec"]), *((g["groupName"], g) for g in cluster["workerGroupSpecs"])]
    for name, group in groups:
        spec = group["template"]["spec"]
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                (mount,) = [m for m in spec["containers"][0].get("volumeMounts", []) if m["name"] == volume["name"]]
                found.append((name, volume, mount))
    return found


def test_the_artifact_claim_is_made_filled_and_mounted_read_only_by_both_workloads() -> None:
    storage_class, claim, populate = yaml.safe_load_all(VOLUME_MANIFEST.read_text())
    assert (storage_class["kind"], claim["kind"], populate["kind"]) == ("StorageClass", "PersistentVolumeClaim", "Pod")
    assert storage_class["provisioner"] == "efs.csi.aws.com"
    assert storage_class["parameters"]["provisioningMode"] == "efs-ap"
    assert claim["spec"]["storageClassName"] == storage_class["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # the populate pod writes; the Ray pods mount read-only
    (volume,) = populate["spec"]["volumes"]
    (mount,) = populate["spec"]["containers"][0]["volumeMounts"]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"] and not mount.get("readOnly")
    for path in (MANIFEST, JOB_MANIFEST):
        document = yaml.safe_load(path.read_text())
        mounted = _artifact_volumes(document)
        assert mounted, path
        for group, ray_volume, ray_mount in mounted:
            assert ray_volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"], (path, group)
            assert ray_volume["persistentVolumeClaim"]["readOnly"] is True and ray_mount["readOnly"] is True, group
            # The same layout on both sides: what the populate pod writes at /artifacts/X, the Ray pods read there.
            assert ray_mount["mountPath"] == mount["mountPath"], (path, group)
        assert {str(Path(p).parent) for p in workload(document)[0]} == {mount["mountPath"]}
    # The populate commands copy the artifact's directory and then the link `compile --link` wrote.
    text = VOLUME_MANIFEST.read_text()
    assert 'tar -C artifacts -cf - "$(readlink artifacts/so400m-lnc2)" so400m-lnc2' in text
    assert "kubectl exec -i siglip-artifacts-populate -- tar -C /artifacts --no-same-owner -xf -" in text
    # A rerun starts a fresh pod, and waits for it longer than kubectl's 30 s default.
    commands = [line.lstrip("# ") for line in text.splitlines() if line.startswith("#   kubectl")]
    assert commands[0] == "kubectl delete pod siglip-artifacts-populate --ignore-not-found --wait=true", commands
    assert commands[-1] == "kubectl delete pod siglip-artifacts-populate", commands
    assert "kubectl wait --for=condition=Ready pod/siglip-artifacts-populate --timeout=10m" in commands
    populate = list(yaml.safe_load_all(text))[2]["spec"]["containers"][0]
    assert populate["command"] == ["sleep", "infinity"] and "neuron" not in populate["image"], populate


def test_both_heads_and_the_populate_pod_run_on_amd64_nodes() -> None:
    """The image is x86_64; a mixed cluster's arm64 (Graviton) node would fail it with "exec format error"."""
    for path in (MANIFEST, JOB_MANIFEST):
        head = _cluster(yaml.safe_load(path.read_text()))["headGroupSpec"]["template"]["spec"]
        assert head["nodeSelector"] == {"kubernetes.io/arch": "amd64"}, path
    populate = list(yaml.safe_load_all(VOLUME_MANIFEST.read_text()))[2]
    assert populate["spec"]["nodeSelector"] == {"kubernetes.io/arch": "amd64"}
