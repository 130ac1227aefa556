"""S3 as an EKS pod has it, on loopback: moto's server (in .venv-moto; `make install` builds it) with IAM
enforcement on, one user whose policy is deploy/kuberay/rayjob-embed-s3-policy.json, and every request
the server logged held against that policy with AWS's rules.

Why both: what moto 5.2.6 in server mode checks, and what it does not.
- It checks the SigV4 signature, the access key, and each statement's Action and Resource with their
  wildcards (moto/core/authorization.py ActionAuthenticatorMixin, moto/iam/access_control.py IAMRequest).
- The Action it asks for is the name of the API operation, not the IAM action AWS requires: authorization.py
  passes `self._get_action()`, the service router's operation name, so a HEAD object is checked as
  "s3:HeadObject" and a list as "s3:ListObjectsV2". moto/s3/responses.py ACTION_MAP does map a HEAD of a key
  to GetObject (getmoto/moto#8334), but into the request's data, which this check does not read; a policy
  granting only s3:GetObject is refused a HEAD here (run against 5.2.6). So the user's policy in moto is the
  file's, each action widened to the operations AWS authorizes with it (bulk/storage.py OPERATION_ACTIONS).
- It honours no Condition in an identity policy: it asks with no context values, so a statement with a
  Condition never matches (access_control.py IAMPolicyStatement._check_conditions) and what it would allow
  is denied. A prefix-scoped s3:ListBucket (`s3:prefix`) cannot be tested with it; the file has none.
The log check then reads each request as the IAM action AWS requires and asks the file's policy itself, so
an operation outside that table, a marker object or a copy is caught even where moto would let it through.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

import httpx

from siglip_serve.bulk.storage import BUCKET_ACTIONS, OPERATION_ACTIONS
from siglip_serve.core.poll import poll
from siglip_serve.launcher.preflight import free_port
from tests.bounds import START_S

ROOT = Path(__file__).resolve().parents[1]
MOTO_PYTHON = ROOT / ".venv-moto" / "bin" / "python"
POLICY_FILE = ROOT / "deploy" / "kuberay" / "rayjob-embed-s3-policy.json"
REGION = "us-east-1"

# Run by moto's own interpreter (boto3 lives there, not in .venv): one admin step, read as JSON on stdin,
# while enforcement is off.
_ADMIN = r"""
import base64, json, sys
import boto3
step = json.load(sys.stdin)
kw = dict(endpoint_url=step["endpoint"], region_name=step["region"], aws_access_key_id="admin",
          aws_secret_access_key="admin")
s3, iam = boto3.client("s3", **kw), boto3.client("iam", **kw)
out = {}
if step["kind"] == "setup":
    s3.create_bucket(Bucket=step["bucket"])
    iam.create_user(UserName=step["user"])
    key = iam.create_access_key(UserName=step["user"])["AccessKey"]
    out = {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
if step["kind"] in ("setup", "policy"):
    iam.put_user_policy(UserName=step["user"], PolicyName="job", PolicyDocument=step["policy"])
for name, data in step.get("objects", {}).items():
    s3.put_object(Bucket=step["bucket"], Key=name, Body=base64.b64decode(data))
print(json.dumps(out))
"""


def read_policy() -> dict[str, Any]:
    return dict(json.loads(POLICY_FILE.read_text()))


def _arn_pattern(pattern: str, flags: int = 0) -> re.Pattern[str]:
    # IAM's wildcards: * any run of characters, ? one character; nothing else is special.
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern) + r"\Z", flags)


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def allows(policy: dict[str, Any], action: str, resource: str) -> bool:
    """AWS's evaluation of an identity policy of Allow statements without conditions (the only kind this
    policy has: a statement of any other kind is refused here rather than judged wrongly)."""
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow" and set(statement) <= {"Sid", "Effect", "Action", "Resource"}, statement
        if (any(_arn_pattern(a, re.IGNORECASE).match(action) for a in _listed(statement["Action"]))
                and any(_arn_pattern(r).match(resource) for r in _listed(statement["Resource"]))):
            return True
    return False


def for_moto(policy: dict[str, Any]) -> dict[str, Any]:
    """The same statements with each action widened to the operation names moto matches."""
    operations: dict[str, set[str]] = {}
    for operation, action in OPERATION_ACTIONS.items():
        operations.setdefault(action.lower(), set()).add(f"s3:{operation}")
    statements = [{**s, "Action": sorted({a for action in _listed(s["Action"])
                                          for a in (action, *operations.get(action.lower(), ()))})}
                  for s in policy["Statement"]]
    return {**policy, "Statement": statements}


def without(policy: dict[str, Any], sid: str, action: str) -> dict[str, Any]:
    """The policy less one action of one statement (the statement dropped where it was its only one)."""
    statements = []
    for statement in policy["Statement"]:
        actions = _listed(statement["Action"])
        if statement.get("Sid") == sid:
            actions = [a for a in actions if a != action]
        if actions:
            statements.append({**statement, "Action": actions})
    return {**policy, "Statement": statements}


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    status: int

    def operation(self) -> tuple[str, str, str]:
        """(S3 operation, bucket, key) of a path-style request."""
        path, _, query = self.target.partition("?")
        params = parse_qs(query, keep_blank_values=True)
        bucket, _, key = unquote(path.lstrip("/")).partition("/")
        if not key:
            names = {"GET": "ListObjectsV2" if params.get("list-type") == ["2"] else "ListObjects",
                     "HEAD": "HeadBucket", "PUT": "CreateBucket", "DELETE": "DeleteBucket",
                     "POST": "DeleteObjects" if "delete" in params else "PostBucket"}
            return names.get(self.method, self.method), bucket, ""
        if self.method == "PUT":
            return ("UploadPart" if "partNumber" in params else "PutObject"), bucket, key
        if self.method == "POST":
            return ("CreateMultipartUpload" if "uploads" in params else "CompleteMultipartUpload"), bucket, key
        if self.method == "DELETE":
            return ("AbortMultipartUpload" if "uploadId" in params else "DeleteObject"), bucket, key
        return {"HEAD": "HeadObject", "GET": "GetObject"}.get(self.method, self.method), bucket, key

    def needs(self) -> tuple[str, str]:
        """The IAM action and resource AWS authorizes this request with (an unknown operation: its own name)."""
        operation, bucket, key = self.operation()
        action = OPERATION_ACTIONS.get(operation, f"s3:{operation}")
        return action, f"arn:aws:s3:::{bucket}" if action in BUCKET_ACTIONS else f"arn:aws:s3:::{bucket}/{key}"


_LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<target>\S+) HTTP/[\d.]+" (?P<status>\d{3})')
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class MotoS3:
    """moto's server on 127.0.0.1 with one bucket and one user; enforcement on once `setup` returns."""

    def __init__(self, tmp: Path, bucket: str, user: str = "siglip-embed") -> None:
        if not MOTO_PYTHON.exists():
            raise AssertionError(f"{MOTO_PYTHON} is missing: `make install` builds it (moto's server, the suite's S3)")
        self.bucket, self.user, self.port = bucket, user, free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / "moto.log"
        self._log = self.log_path.open("w")
        command = [str(MOTO_PYTHON), "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)

        def answers() -> bool:
            assert self.process.poll() is None, self.log_path.read_text()
            try:
                httpx.get(f"{self.endpoint}/moto-api/", timeout=2)
            except httpx.HTTPError:
                return False
            return True

        _, up, waited = poll(answers, bool, START_S, interval_s=0.2)
        assert up, f"moto's server did not answer in {waited:.0f} s"
        self.key = self.secret = ""

    def _enforce(self, on: bool) -> None:
        # moto/moto_api/_internal/responses.py reset_auth_response: the count of requests let through
        # unchecked (INITIAL_NO_AUTH_ACTION_COUNT); 0 checks every one from now on.
        response = httpx.post(f"{self.endpoint}/moto-api/reset-auth", content=b"0" if on else b"inf",
                              headers={"Content-Type": "text/plain"}, timeout=10)
        response.raise_for_status()

    def _admin(self, step: dict[str, Any]) -> dict[str, str]:
        self._enforce(False)
        try:
            done = subprocess.run([str(MOTO_PYTHON), "-c", _ADMIN], capture_output=True, text=True, timeout=120,
                                  input=json.dumps({"endpoint": self.endpoint, "region": REGION, "bucket": self.bucket,
                                                    "user": self.user, **step}))
            assert done.returncode == 0, done.stderr
            return dict(json.loads(done.stdout))
        finally:
            self._enforce(True)

    def setup(self, policy: dict[str, Any], objects: dict[str, bytes]) -> None:
        import base64

        keys = self._admin({"kind": "setup", "policy": json.dumps(for_moto(policy)),
                            "objects": {k: base64.b64encode(v).decode() for k, v in objects.items()}})
        self.key, self.secret = keys["key"], keys["secret"]

    def set_policy(self, policy: dict[str, Any]) -> None:
        self._admin({"kind": "policy", "policy": json.dumps(for_moto(policy))})

    def env(self) -> dict[str, str]:
        """What a pod's AWS SDK finds: the user's keys, the region, and (pyarrow reads AWS_ENDPOINT_URL_S3) the
        endpoint, plain HTTP on loopback."""
        return {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_DEFAULT_REGION": REGION,
                "AWS_ENDPOINT_URL_S3": self.endpoint, "AWS_EC2_METADATA_DISABLED": "true"}

    def filesystem(self) -> Any:
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(access_key=self.key, secret_key=self.secret, region=REGION, scheme="http",
                                 endpoint_override=f"127.0.0.1:{self.port}")

    def log_mark(self) -> int:
        self._log.flush()
        return self.log_path.stat().st_size

    def requests(self, since: int = 0) -> list[Request]:
        """The S3 requests the server logged after `since` (a log_mark), moto's own API left out."""
        with self.log_path.open("rb") as handle:
            handle.seek(since)
            text = _ANSI.sub("", handle.read().decode(errors="replace"))
        found = [Request(m["method"], m["target"], int(m["status"])) for m in _LINE.finditer(text)]
        return [r for r in found if not r.target.startswith("/moto-api")]

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=20)
        self._log.close()
