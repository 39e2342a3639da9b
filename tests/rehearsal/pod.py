"""A kubelet stand-in: runs one pod spec from the EKS manifests under Docker, as the kubelet would on a node.

What it takes from the spec, unchanged: every container's image, command and args, env, volume mounts, user and group,
read-only root, dropped capabilities, memory limit; the volumes (emptyDir on disk, emptyDir in memory as tmpfs,
configMap as read-only files); the order (init containers one after another, each to exit 0; a sidecar, restartPolicy
Always, started and held until its startup probe passes; then the main containers); exec and HTTP probes with their
period, timeout and failure threshold; termination as "Pod Lifecycle" describes it: the preStop hook, then SIGTERM,
SIGKILL when terminationGracePeriodSeconds (counted from the hook's start) runs out; sidecars only after the main
containers have stopped, in reverse order.

Every container shares one network namespace (the pod's: loopback only, like --network none) through a sandbox
container; `in_pod` runs a function on a thread that has entered that namespace, so the test's own servers (moto, the
ModelScope stand-in) and clients are on the pod's loopback. What is not the spec (the cluster's environment): extra
env for endpoints and credentials (IRSA's injected variables stand in for), given as `cluster_env`.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.images.engine import docker

T = TypeVar("T")
CLONE_NEWNET = 0x40000000


@dataclass
class Event:
    at: float
    what: str


@dataclass
class PodRun:
    spec: dict[str, Any]
    config_maps: dict[str, dict[str, str]]  # name -> data, for configMap volumes
    workdir: Path
    cluster_env: dict[str, str] = field(default_factory=dict)
    host_ip: str = "127.0.0.1"  # the node's private IP, as the downward API's status.hostIP gives it
    name: str = field(default_factory=lambda: f"gguf-serve-pod-{secrets.token_hex(4)}")
    events: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.containers: dict[str, str] = {}  # spec name -> docker name
        self.post_start: dict[str, tuple[int, str]] = {}  # container -> its postStart hook's exit code and output
        self.volumes: list[str] = []
        self.sandbox = ""
        self.started = time.monotonic()

    def log(self, what: str) -> None:
        self.events.append(Event(round(time.monotonic() - self.started, 2), what))

    # --- the sandbox and its volumes ---------------------------------------------------------------------------
    def create(self, image: str) -> None:
        """The volumes, then the sandbox that holds them (a tmpfs volume lives while a container mounts it, as an
        emptyDir lives with its pod) and the pod's network namespace."""
        for volume in self.spec["volumes"]:
            self._volume(volume)
        held = [a for v in self.volumes if not v.startswith("/") for a in ("-v", f"{v}:/pod/{v}")]
        self.sandbox = f"{self.name}-sandbox"
        docker("run", "-d", "--name", self.sandbox, "--network", "none", "--user", "65534", *held,
               "--entrypoint", "python3", image, "-c", "import signal; signal.pause()")  # fmt: skip

    def _volume(self, volume: dict[str, Any]) -> None:
        vname = f"{self.name}-{volume['name']}"
        uid = str(self.spec["securityContext"]["fsGroup"])
        if "emptyDir" in volume and volume["emptyDir"].get("medium") == "Memory":
            size = volume["emptyDir"].get("sizeLimit", "1Mi").replace("Mi", "m")
            opts = [
                "--opt",
                "type=tmpfs",
                "--opt",
                "device=tmpfs",
                "--opt",
                f"o=size={size},uid={uid},gid={uid},mode=0770",
            ]
            docker("volume", "create", *opts, vname)
        elif "emptyDir" in volume:
            docker("volume", "create", vname)  # the kubelet makes it writable for fsGroup: so does a first chown
            docker(
                "run",
                "--rm",
                "--user",
                "0",
                "-v",
                f"{vname}:/v",
                "--entrypoint",
                "chown",
                self._image(),
                f"{uid}:{uid}",
                "/v",
            )
        elif "configMap" in volume:
            folder = self.workdir / vname
            folder.mkdir(parents=True)
            for key, text in self.config_maps[volume["configMap"]["name"]].items():
                (folder / key).write_text(text)
            os.chmod(folder, 0o755)  # noqa: S103 - a configMap volume: world-readable, as the kubelet mounts it
            self.volumes.append(str(folder))
            return
        self.volumes.append(vname)

    def _image(self) -> str:
        return self.spec["containers"][0]["image"]

    def _source(self, volume_name: str) -> str:
        for volume, source in zip(self.spec["volumes"], self.volumes, strict=True):
            if volume["name"] == volume_name:
                return source
        raise KeyError(volume_name)

    # --- containers ----------------------------------------------------------------------------------------------
    def _run_args(self, c: dict[str, Any]) -> list[str]:
        pod_sc = self.spec["securityContext"]
        sc = c.get("securityContext", {})
        user = f"{pod_sc['runAsUser']}:{pod_sc['runAsGroup']}"
        args = ["--name", f"{self.name}-{c['name']}", "--network", f"container:{self.sandbox}", "--user", user]
        args += ["--group-add", str(pod_sc["fsGroup"])]
        if sc.get("readOnlyRootFilesystem"):
            args.append("--read-only")
        if sc.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        args += [f"--cap-drop={cap}" for cap in sc.get("capabilities", {}).get("drop", [])]
        limit = c.get("resources", {}).get("limits", {}).get("memory")
        if limit:
            args += ["--memory", limit.replace("Gi", "g").replace("Mi", "m")]
        for env in [*({"name": k, "value": v} for k, v in self.cluster_env.items()), *c.get("env", [])]:
            args += ["-e", f"{env['name']}={self._value(env)}"]
        for m in c.get("volumeMounts", []):
            args += ["-v", f"{self._source(m['name'])}:{m['mountPath']}{':ro' if m.get('readOnly') else ''}"]
        command = c.get("command")
        if command:
            args += ["--entrypoint", command[0], c["image"], *command[1:], *c.get("args", [])]
        else:
            args += [c["image"], *c.get("args", [])]
        return args

    def _value(self, env: dict[str, Any]) -> str:
        """An env entry's value: given, or from the downward API's fields the stand-in knows; anything else fails."""
        if "value" in env:
            return env["value"]
        fields = {"status.hostIP": self.host_ip, "status.podIP": "127.0.0.1", "metadata.name": self.name}
        path = env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if path not in fields:
            raise AssertionError(f"the kubelet stand-in has no value for {env}")
        return fields[path]

    def run_init(self, c: dict[str, Any], timeout: float) -> str:
        out = docker("run", *self._run_args(c), check=False, timeout=timeout)
        self.log(f"init {c['name']} exited {out.returncode}")
        docker("rm", "-f", f"{self.name}-{c['name']}", check=False)
        if out.returncode != 0:
            raise AssertionError(f"init container {c['name']} failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")
        return out.stdout + out.stderr

    def start(self, c: dict[str, Any]) -> None:
        docker("run", "-d", *self._run_args(c))
        self.containers[c["name"]] = f"{self.name}-{c['name']}"
        self.log(f"started {c['name']}")
        hook = c.get("lifecycle", {}).get("postStart", {}).get("exec", {}).get("command")
        if hook:  # as the kubelet runs it: in the container, right after it starts (a failure kills the container)
            out = docker("exec", self.containers[c["name"]], *hook, check=False, timeout=60)
            self.post_start[c["name"]] = (out.returncode, out.stdout + out.stderr)
            self.log(f"postStart {c['name']} returned {out.returncode}")
            if out.returncode != 0:
                raise AssertionError(f"postStart of {c['name']} failed: {out.stdout}{out.stderr}")

    def probe(self, c: dict[str, Any], kind: str) -> int:
        """Run `kind` (startupProbe, readinessProbe) until it passes; returns the attempts it took."""
        p = c[kind]
        for attempt in range(1, p["failureThreshold"] + 1):
            if self.check(c, p):
                self.log(f"{kind} {c['name']} passed (attempt {attempt})")
                return attempt
            time.sleep(p["periodSeconds"])
        raise AssertionError(f"{kind} of {c['name']} failed {p['failureThreshold']} times: {self.logs(c['name'])}")

    def check(self, c: dict[str, Any], p: dict[str, Any]) -> bool:
        if "exec" in p:
            out = docker(
                "exec", self.containers[c["name"]], *p["exec"]["command"], check=False, timeout=p["timeoutSeconds"] + 5
            )
            return out.returncode == 0
        port = next(x["containerPort"] for x in c["ports"] if x["name"] == p["httpGet"]["port"])
        return (
            self.in_pod(lambda: _http_status(f"http://127.0.0.1:{port}{p['httpGet']['path']}", p["timeoutSeconds"]))
            == 200
        )

    def logs(self, name: str) -> str:
        out = docker("logs", self.containers[name], check=False)
        return out.stdout + out.stderr

    def exited(self, name: str) -> dict[str, Any] | None:
        state = json.loads(docker("inspect", self.containers[name]).stdout)[0]["State"]
        return None if state["Running"] else state

    # --- termination ---------------------------------------------------------------------------------------------
    def terminate(self) -> dict[str, Any]:
        """preStop, SIGTERM, SIGKILL at the grace period; main containers first, then sidecars in reverse order."""
        grace = self.spec["terminationGracePeriodSeconds"]
        began = time.monotonic()
        deadline = began + grace
        outcome: dict[str, Any] = {"prestop": {}, "killed": [], "exit": {}}
        hooks = []
        for c in self.spec["containers"]:
            hook = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
            if hook:
                t = threading.Thread(target=self._prestop, args=(c["name"], hook, deadline, outcome), daemon=True)
                t.start()
                hooks.append((c["name"], t))
        self.log("termination: preStop hooks started")
        for name, t in hooks:
            t.join(max(0.0, deadline - time.monotonic()))
            self._stop(name, deadline, outcome)
        sidecars = [c for c in self.spec["initContainers"] if c.get("restartPolicy") == "Always"]
        for c in reversed(sidecars):
            self._stop(c["name"], deadline, outcome)
        outcome["seconds"] = round(time.monotonic() - began, 2)
        return outcome

    def _prestop(self, name: str, hook: list[str], deadline: float, outcome: dict[str, Any]) -> None:
        out = docker("exec", self.containers[name], *hook, check=False, timeout=max(1, deadline - time.monotonic()))
        outcome["prestop"][name] = (out.returncode, out.stdout + out.stderr)
        self.log(f"preStop {name} returned {out.returncode}")

    def _stop(self, name: str, deadline: float, outcome: dict[str, Any]) -> None:
        docker("kill", "--signal", "TERM", self.containers[name], check=False)
        self.log(f"SIGTERM {name}")
        while time.monotonic() < deadline and self.exited(name) is None:
            time.sleep(0.1)
        if self.exited(name) is None:
            docker("kill", "--signal", "KILL", self.containers[name], check=False)
            outcome["killed"].append(name)
            self.log(f"SIGKILL {name}")
            time.sleep(0.5)
        state = self.exited(name) or {}
        outcome["exit"][name] = state.get("ExitCode")
        self.log(f"{name} exited {state.get('ExitCode')}")

    def remove(self) -> None:
        names = [*self.containers.values(), self.sandbox]
        docker("rm", "-f", *[n for n in names if n], check=False)
        docker("volume", "rm", "-f", *[v for v in self.volumes if not v.startswith("/")], check=False)

    # --- the pod's network namespace -----------------------------------------------------------------------------
    def in_pod(self, fn: Callable[[], T]) -> T:
        """fn() on a thread inside the pod's network namespace (sockets it makes stay there)."""
        t, box = self.spawn_in_pod(fn)
        t.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def spawn_in_pod(self, fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
        """fn() started on such a thread; the box gets its value or error."""
        pid = json.loads(docker("inspect", self.sandbox).stdout)[0]["State"]["Pid"]
        box: dict[str, Any] = {}

        def run() -> None:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            try:
                if ctypes.CDLL("libc.so.6", use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns into the pod's network namespace")
            finally:
                os.close(fd)
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                box["error"] = e

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t, box


def _http_status(url: str, timeout: float) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None
