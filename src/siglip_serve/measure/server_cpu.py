"""Host CPU a service spends: its whole process tree's CPU time over a window, split by process kind.

On a trn2 the model runs on NeuronCores, but every image still costs host CPU in Serve's proxy, the
ingress (decode, resize, JSON), the encoder replica's Python and Ray's daemons. CPU-ms per image is
the figure that says whether a host can feed its chips, and unlike img/s it carries over between
machines. It is measured here from the operating system's accounting (psutil), not estimated.

Which processes are "the service":
- `ServerCpu.of_children(client=pids)`: the children (and their descendants) of this process, for a
  benchmark that started Ray itself; this process and its client processes (`pids`) are the client and
  are left out.
- `ServerCpu.listening_on(port)`: the tree of the process that listens on `port` (Serve's proxy),
  walked up to the process that started Ray. The client's own process tree is always left out.

A process that exits inside the window takes its CPU time with it (the OS keeps no account of
the dead), so a window should cover steady state, not start-up or shutdown.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import psutil

from siglip_serve.measure.results import CpuMsByKind, ServerCpuResult

# Process kinds, matched against Ray's process titles (`ray::ServeReplica:<app>:<deployment>...`).
KINDS = ("proxy", "ingress", "encoder", "serve_controller", "ray_daemons", "other")


def process_kind(cmdline: str) -> str:
    if "ProxyActor" in cmdline or "haproxy" in cmdline.lower():  # Serve's proxy, HAProxy and its manager
        return "proxy"
    if "ServeReplica:" in cmdline:
        if ":Ingress" in cmdline:
            return "ingress"
        if ":Encoder" in cmdline:
            return "encoder"
        return "other"
    if "ServeController" in cmdline:
        return "serve_controller"
    daemons = ("gcs_server", "raylet", "dashboard", "log_monitor", "ray/_private", "runtime_env", "agent",
               "ray::IDLE", "default_worker.py")
    if any(name in cmdline for name in daemons):
        return "ray_daemons"
    return "other"


def _cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


@dataclass
class CpuWindow:
    """CPU seconds each process kind spent between two snapshots."""

    seconds_by_kind: dict[str, float]
    processes: int

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds_by_kind.values())

    def per_image_ms(self, images: int) -> dict[str, float | None]:
        """{"total": ms, <kind>: ms, ...} per image; None where no image was served."""
        if images <= 0:
            return {"total": None, **{kind: None for kind in self.seconds_by_kind}}
        out: dict[str, float | None] = {"total": self.total_seconds * 1e3 / images}
        out.update({kind: seconds * 1e3 / images for kind, seconds in self.seconds_by_kind.items()})
        return out

    def result(self, images: int) -> ServerCpuResult:
        """This window per image served, as benchmarks and load tests record it."""
        per_image = self.per_image_ms(images)
        total = per_image.pop("total")
        return ServerCpuResult(ms_per_image=total, ms_per_image_by_kind=CpuMsByKind(**per_image),
                               seconds=self.total_seconds, processes=self.processes)


@dataclass
class ServerCpu:
    """The processes that make up a service, re-listed at every snapshot (replicas come and go)."""

    roots: list[int]
    exclude: set[int] = field(default_factory=set)
    # The client's own process: it and its descendants (e.g. Locust's processes) are never the service.
    client: int | None = None

    @classmethod
    def of_children(cls, client: Iterable[int] = ()) -> ServerCpu:
        me = os.getpid()
        return cls(roots=[me], exclude={me, *client})

    @classmethod
    def listening_on(cls, port: int) -> ServerCpu:
        listener = _listening_pid(port)
        if listener is None:
            raise LookupError(f"no local process listens on port {port}")
        client_line = _ancestors(os.getpid())
        # Walk up from the listener to the last process before one the client shares: that process
        # is what started the service (the `siglip-serve run` driver, or a shell that did).
        root = listener
        for pid in _ancestors(listener)[1:]:
            if pid in client_line or pid == 1:
                break
            root = pid
        common = next((pid for pid in _ancestors(listener) if pid in client_line), None)
        if common == os.getpid():
            # This process started the service itself: its listener-side child is the service.
            return cls(roots=[root], exclude={common})
        roots = [root]
        if common is not None and common != 1 and _is_python(common):
            # The service was started inside a Python process the client descends from (a test
            # session): its other children are Ray's daemons, started beside the proxy's raylet.
            roots = [common]
        return cls(roots=roots, exclude=set(client_line), client=os.getpid())

    def snapshot(self) -> dict[int, tuple[str, float]]:
        found: dict[int, tuple[str, float]] = {}
        exclude = set(self.exclude)
        if self.client is not None:
            try:
                exclude.update(child.pid for child in psutil.Process(self.client).children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        for root_pid in self.roots:
            try:
                root = psutil.Process(root_pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for proc in procs:
                if proc.pid in exclude or proc.pid in found:
                    continue
                try:
                    kind = process_kind(" ".join(proc.cmdline()))
                    found[proc.pid] = (kind, _cpu_seconds(proc))
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
        return found

    @staticmethod
    def between(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> CpuWindow:
        """CPU spent from `before` to `after`; a process new in `after` counts from its start."""
        by_kind = dict.fromkeys(KINDS, 0.0)
        for pid, (kind, seconds) in after.items():
            earlier = before.get(pid, (kind, 0.0))[1]
            by_kind[kind] += max(0.0, seconds - earlier)
        return CpuWindow(seconds_by_kind=by_kind, processes=len(after))


def _listening_pid(port: int) -> int | None:
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    return None


def _ancestors(pid: int) -> list[int]:
    """pid, its parent, its parent's parent, ... up to init."""
    line = [pid]
    try:
        for parent in psutil.Process(pid).parents():
            line.append(parent.pid)
    except psutil.NoSuchProcess:
        pass
    return line


def _is_python(pid: int) -> bool:
    try:
        return "python" in psutil.Process(pid).name().lower()
    except psutil.NoSuchProcess:
        return False
