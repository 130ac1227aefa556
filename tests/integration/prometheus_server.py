"""A real Prometheus server for tests: Debian's `prometheus` package, on 127.0.0.1, free port.

`ensure_installed` installs the package with apt when `prometheus`/`promtool` are missing (CI and
a fresh machine run as root), `scrape_config_for` turns the shipped deploy/prometheus/prometheus.yml
into one that scrapes the test cluster every second, and `PrometheusServer` runs it and answers
PromQL through the HTTP API.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.bounds import scaled
from tests.helpers import REPO, wait_until_ready

log = logging.getLogger(__name__)

SHIPPED_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
BINARIES = ("prometheus", "promtool")


def ensure_installed() -> None:
    """Put `prometheus` and `promtool` on PATH, installing Debian's package if needed."""
    if all(shutil.which(name) for name in BINARIES):
        return
    if os.geteuid() != 0:
        raise RuntimeError("prometheus/promtool are missing and installing them needs root: "
                           "apt-get install -y prometheus")
    log.info("installing Debian's prometheus package (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "prometheus"]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    missing = [name for name in BINARIES if shutil.which(name) is None]
    if missing:
        raise RuntimeError(f"apt-get installed prometheus but {missing} are still not on PATH")


def scrape_config_for(targets: dict[str, list[str]], scrape_interval: str = "1s") -> dict[str, Any]:
    """The shipped config with each named job's static targets replaced; every job must exist."""
    config = yaml.safe_load(SHIPPED_CONFIG.read_text())
    config["global"]["scrape_interval"] = scrape_interval
    config["global"]["evaluation_interval"] = scrape_interval
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    unknown = set(targets) - set(jobs)
    if unknown:
        raise KeyError(f"jobs {sorted(unknown)} are not in {SHIPPED_CONFIG}; it has {sorted(jobs)}")
    for name, addresses in targets.items():
        jobs[name]["static_configs"] = [{"targets": addresses}]
    return config


class PrometheusServer:
    def __init__(self, config: dict[str, Any], workdir: Path, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={self.config_path}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        self.client = httpx.Client(base_url=self.url, timeout=10.0)

    def wait_ready(self, timeout_s: float = scaled(60)) -> None:
        wait_until_ready(f"{self.url}/-/ready", timeout_s, self.process, lambda: self.log_path.read_text()[-2000:])

    def query(self, promql: str) -> dict[str, Any]:
        """/api/v1/query's JSON; raises with Prometheus's own message when the query is rejected."""
        response = self.client.get("/api/v1/query", params={"query": promql})
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise ValueError(f"{body.get('errorType')}: {body.get('error')} in {promql}")
        return body["data"]

    def scrape_health(self) -> str:
        """Each target's last scrape as Prometheus saw it: why a series went missing, when one did."""
        targets = self.client.get("/api/v1/targets").json()["data"]["activeTargets"]
        return "; ".join(f"{t['labels'].get('job')}: {t['health']}, last scrape {t['lastScrapeDuration']:.2f} s"
                         f"{', ' + t['lastError'] if t.get('lastError') else ''}" for t in targets)

    def scalar(self, promql: str) -> float | None:
        """The single value of an instant vector with at most one series; None when it is empty."""
        result = self.query(promql)["result"]
        if not result:
            return None
        if len(result) != 1:
            raise ValueError(f"{promql} returned {len(result)} series, expected one")
        return float(result[0]["value"][1])

    def targets_health(self) -> dict[str, str]:
        active = self.client.get("/api/v1/targets").json()["data"]["activeTargets"]
        return {f"{t['labels']['job']} {t['scrapeUrl']}": t["health"] for t in active}

    def stop(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
