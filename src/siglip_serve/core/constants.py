"""Environment variables and defaults shared by several packages, declared once."""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Mapping

# The Neuron runtime's logical NeuronCore size (LNC) and the cores a process may use (Ray sets it per
# replica from its neuron_cores resource).
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
# Ray's resource for a logical NeuronCore (ray/_private/accelerators/neuron.py, get_resource_name), which
# `neuron_cores_per_replica` asks for and `replicas: auto` counts.
NEURON_CORES = "neuron_cores"
# The GPUs a process may use; Ray sets it per replica from its GPU resource (ray/_private/accelerators/
# nvidia_gpu.py, get_visible_accelerator_ids_env_var).
CUDA_VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
# The Neuron docs (Logical NeuronCore configuration): "LNC can only be set to 1 or 2 ... On Trn2, each
# chip has 8 physical NeuronCores. With LNC=2 (default), these are grouped into 4 Logical NeuronCores."
# LNC applies only to Trn2/Trn3; every other target runs one physical core per logical.
VALID_LNC = (1, 2)
TRN2_DEFAULT_LNC = 2
LNC_DEFAULT_BY_TARGET = {"trn2": TRN2_DEFAULT_LNC, "trn3": TRN2_DEFAULT_LNC}

# The chip NKI compiles and simulates for (nki.jit and the NKI CPU Simulator pages). Unset, the simulator
# "uses the Neuron chip detected on the running machine, otherwise defaults to trn3" (nki_simulator,
# "Target Platform"): a dev box's check would hold the kernels to another chip's limits.
PLATFORM_TARGET_ENV = "NEURON_PLATFORM_TARGET_OVERRIDE"
KERNEL_TARGET = "trn2"
# nl.tile_size.psum_num_banks: "Returns 7 when dma_transpose is lowered to PE transpose
# (NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE=true on trn2+), since bank 7 is reserved for nc_transpose. Otherwise 8."
DMA_TRANSPOSE_AS_PE_ENV = "NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE"

# KubeRay sets both in every Ray container it creates, head and workers (ray-operator/controllers/ray/
# common/pod.go setContainerEnvVars, KubeRay v1.7.0); Ray's worker processes, Serve's application
# builder among them, inherit the raylet's environment. Either one present: the cluster is KubeRay's,
# whose workers register after the head (and after Serve's config is submitted: serve/plan/cluster_fit.py).
KUBERAY_ENV = ("RAY_CLUSTER_NAME", "KUBERAY_GEN_RAY_START_CMD")

# Backends registered at run time (core/backends.py `register`, e.g. by a test), as a JSON list
# of their records: every process of the app gets it, so a replica finds a backend its driver registered.
EXTRA_BACKENDS_ENV = "SIGLIP_SERVE_EXTRA_BACKENDS"

# The API key the ingress requires when the config names neither api_key nor api_key_file; `siglip-serve
# run` takes the key from here or from --api-key-file, never from its command line (launcher/cli.py).
API_KEY_ENV = "SIGLIP_API_KEY"

# Every config key of `siglip-serve run` can also be given as SIGLIP_<KEY> (any case), a nested key's parts
# joined by `__` and a list or mapping as JSON (core/cli.py environment_values, through pydantic-settings);
# a flag beats the variable, the variable beats the default. The other SIGLIP_ variables below are not keys.
SETTINGS_ENV_PREFIX = "SIGLIP_"
SETTINGS_ENV_NESTED_DELIMITER = "__"

# With `tracing: true`, write spans as JSON lines into this file instead of exporting them over OTLP
# (serve/shared/tracing.py): tests, and a look at the spans without a collector. The OTLP exporter itself reads
# the standard OTEL_* variables.
TRACES_FILE_ENV = "SIGLIP_TRACES_FILE"

# Ray Serve's throughput-optimized mode (Ray 2.56+, docs.ray.io kuberay/user-guides/serve-high-throughput;
# ray/serve/_private/constants.py): calls between replicas over gRPC instead of Ray actor tasks, user
# code and the handle's router on the replica's own event loop instead of a thread each. Serve reads
# these at import in every replica, so the app puts them in each deployment's runtime_env
# (`throughput_optimized: true`). Two of its switches are set back: replica stderr would go to Serve's
# log files only (our replicas' log lines must still reach the console), and direct ingress would come
# on in the replicas while a controller started without the mode runs Serve's proxy actor (`serve run`
# of a YAML, KubeRay): direct ingress stays what the front end makes it (HAProxy mode forces it on,
# ray/serve/_private/constants.py, after the mode's block).
SERVE_THROUGHPUT_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_LOG_TO_STDERR": "1",
                        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}


def expand_visible_cores(raw: str) -> list[int]:
    """The NeuronCore indices NEURON_RT_VISIBLE_CORES names: single indices and inclusive ranges, comma separated
    ("0-3", "0-1,4"), as the Neuron runtime takes them (its configuration guide: "a single NeuronCore index or
    an inclusive range"; comma lists of both since runtime 2.16.18). ValueError names what is not an index."""
    cores: list[int] = []
    for part in raw.replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        if not (low.isdigit() and (high.isdigit() if dash else not high)) or (dash and int(high) < int(low)):
            raise ValueError(f"{VISIBLE_CORES_ENV}={raw!r}: {part!r} is not a core index or an inclusive range")
        cores.extend(range(int(low), int(high) + 1) if dash else [int(low)])
    return cores


class InvalidLnc(ValueError):
    """NEURON_LOGICAL_NC_CONFIG holds something the Neuron runtime would refuse."""


def lnc_setting(env: Mapping[str, str] | None = None, target: str = "trn2") -> tuple[int, bool]:
    """(the LNC the Neuron runtime will use, whether NEURON_LOGICAL_NC_CONFIG set it explicitly)."""
    env = os.environ if env is None else env
    raw = (env.get(LNC_ENV) or "").strip()
    if not raw:
        return LNC_DEFAULT_BY_TARGET.get(target, 1), False
    if raw not in {str(v) for v in VALID_LNC}:
        raise InvalidLnc(f"{LNC_ENV}={raw!r} is not a valid LNC; the Neuron runtime accepts 1 or 2")
    return int(raw), True


def package_version(distribution: str) -> str | None:
    """An installed distribution's version from its metadata (nothing imported), or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None

# The other SIGLIP_ variables, none of them a config key. `siglip-serve run` sets the HAProxy ones for the Ray it
# starts (launcher/haproxy_front.py), and the session one for its child (launcher/session.py); the tests set
# the TorchNeuron runtime (models/backends/neuron_native.py); the multi-core bench hands its workers their spec
# (measure/multicore.py); the load test reads its key (loadtest/).
HAPROXY_HEADER_TIMEOUT_ENV = "SIGLIP_HAPROXY_HEADER_TIMEOUT_S"
HAPROXY_LOCAL_ONLY_ENV = "SIGLIP_HAPROXY_LOCAL_ONLY"
HAPROXY_LIMITS_DIR_ENV = "SIGLIP_HAPROXY_LIMITS_DIR"
OWN_SESSION_ENV = "SIGLIP_SERVE_OWN_SESSION"
TORCHNEURON_RUNTIME_ENV = "SIGLIP_SERVE_TORCHNEURON_RUNTIME"
MULTICORE_WORKER_ENV = "SIGLIP_MULTICORE_WORKER"
LOADTEST_API_KEY_ENV = "SIGLIP_LOADTEST_API_KEY"
# deploy/systemd/siglip-serve.service: the model flags its ExecStart= expands (systemd puts it in the environment).
UNIT_MODEL_ENV = "SIGLIP_SERVE_MODEL"

# The SIGLIP_ variables that are not config keys (a run warns of any other SIGLIP_ name it cannot place).
NOT_SETTINGS_ENV = frozenset({API_KEY_ENV, TRACES_FILE_ENV, EXTRA_BACKENDS_ENV, HAPROXY_HEADER_TIMEOUT_ENV,
                              HAPROXY_LOCAL_ONLY_ENV, HAPROXY_LIMITS_DIR_ENV, OWN_SESSION_ENV, TORCHNEURON_RUNTIME_ENV,
                              MULTICORE_WORKER_ENV, LOADTEST_API_KEY_ENV, UNIT_MODEL_ENV})
