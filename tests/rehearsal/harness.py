"""The rehearsal's world: the AWS stand-ins seeded as a deployed stack would leave them, the ECR and ModelScope
stand-ins, and fake instances that boot the real rendered user data.

    with World(serving_image, gguf) as world:
        a = world.instance("i-0aaa")       # user data rendered for a CPU profile, run by systemd in a container
        a.start(); a.wait_boot_done()
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

from gguf_serve.catalog import ServingProfile, load_catalog
from gguf_serve.catalog.images import IMAGE_TARGETS
from gguf_serve.catalog.local import local_profile
from gguf_serve.container import names
from gguf_serve.local.hub import LocalScope
from tests.images.engine import docker
from tests.rehearsal.aws import ACCOUNT, AwsStandIn
from tests.rehearsal.image import STATE, instance_image
from tests.rehearsal.imds import Imds, Instance
from tests.rehearsal.netns import Forward, listen_in
from tests.rehearsal.registry import Registry
from tests.rehearsal.tls import ensure_ca, server_certificate
from userdata import BootSettings, InstanceSpec, render_user_data

REGION = "cn-northwest-1"
STACK = "RehearsalStack"
GROUP = "RehearsalStack-ServingGroup-REHEARSAL"
ROLE = "RehearsalStack-InstanceRole"
BUCKET = "rehearsalstack-modelcache"
LOG_GROUP = f"/gguf-serve/{STACK}"
REGISTRY_HOST = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com.cn"
REPOSITORY = "rehearsalstack-serving"
LOGS_HOST = f"logs.{REGION}.amazonaws.com.cn"
# Inside each fake instance (its own network namespace): where each stand-in answers.
IMDS_ADDRESS = "169.254.169.254"
AWS_ADDRESS = "169.254.100.1"  # :5000 HTTP (AWS_ENDPOINT_URL), :443 TLS (the awslogs driver, by name)
REGISTRY_ADDRESS = "169.254.100.2"
MODELSCOPE_ADDRESS = "169.254.100.3"  # MODELSCOPE_ENDPOINT=http://169.254.100.3
BOOT_LOG = "/var/log/gguf-serve-boot.log"


def rehearsal_profile(port: int = 8080) -> ServingProfile:
    """The catalog's local profile (the small Gemma GGUF) as an instance runs it: every interface, the CPU image."""
    profile = local_profile(load_catalog(), port=port)
    return replace(
        profile,
        stack_name=STACK,
        server=replace(profile.server, host="0.0.0.0"),
        image=IMAGE_TARGETS["x86-64-cpu"],
    )


@dataclass
class Timing:
    step: str
    at: float  # seconds since the container started


class World:
    def __init__(self, serving_image: str, gguf: Path, *, profile: ServingProfile | None = None) -> None:
        self.serving_image = serving_image
        self.gguf = gguf
        self.profile = profile or rehearsal_profile()
        self.work = STATE / "run"
        self.instances: list[FakeInstance] = []
        self.release = "rel-" + secrets.token_hex(6)
        self.api_key = secrets.token_urlsafe(24)

    def __enter__(self) -> World:
        self.instance_image = instance_image()
        ca = ensure_ca(STATE / "ca")
        cert = server_certificate(ca, [LOGS_HOST, REGISTRY_HOST], self.work / "tls")
        self.aws = AwsStandIn(cert)
        tag = self.serving_image.rsplit(":", 1)[1]
        self.registry = Registry(REPOSITORY, tag, self.serving_image, STATE / "registry", cert)
        self.hub = LocalScope().start()
        self.hub.add_file(self.profile.model.repo, self.profile.model.file, self.gguf)
        self.boot = self._deploy(f"{REGISTRY_HOST}/{REPOSITORY}:{tag}")
        return self

    def __exit__(self, *exc: object) -> None:
        for instance in self.instances:
            instance.remove()
        self.hub.stop()
        self.registry.close()
        self.aws.close()

    def _deploy(self, image_uri: str) -> BootSettings:
        """What `cdk deploy` leaves behind for an instance to use, in moto."""
        from stacks.fleet import (
            DRAIN_HEARTBEATS_MISSED,
            DRAIN_HOOK,
            GROUP_LOGICAL_ID,
            READY_HOOK,
            release_parameter_name,
        )

        s3, sm, ssm, logs, asg = (self.aws.client(s) for s in ("s3", "secretsmanager", "ssm", "logs", "autoscaling"))
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        secret = sm.create_secret(Name=f"{STACK}-ApiKey", SecretString=self.api_key)
        ssm.put_parameter(Name=release_parameter_name(STACK), Value=self.release, Type="String")
        logs.create_log_group(logGroupName=LOG_GROUP)
        asg.create_launch_configuration(
            LaunchConfigurationName=f"{STACK}-lc", ImageId="ami-0123456789abcdef0", InstanceType="c8i.4xlarge"
        )
        asg.create_auto_scaling_group(
            AutoScalingGroupName=GROUP,
            LaunchConfigurationName=f"{STACK}-lc",
            MinSize=0,
            MaxSize=0,
            DesiredCapacity=0,
            AvailabilityZones=[f"{REGION}a"],
        )
        asg.put_lifecycle_hook(
            AutoScalingGroupName=GROUP,
            LifecycleHookName=READY_HOOK,
            LifecycleTransition="autoscaling:EC2_INSTANCE_LAUNCHING",
            HeartbeatTimeout=self.profile.fleet.boot.model_load_s,
            DefaultResult="ABANDON",
        )
        asg.put_lifecycle_hook(  # the hop completes it when it has drained (gguf_serve/container/hop/drain.py)
            AutoScalingGroupName=GROUP,
            LifecycleHookName=DRAIN_HOOK,
            LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
            HeartbeatTimeout=names.DRAIN_HEARTBEAT_S * DRAIN_HEARTBEATS_MISSED,
            DefaultResult="CONTINUE",
        )
        return BootSettings(
            region=REGION,
            stack_name=STACK,
            group_logical_id=GROUP_LOGICAL_ID,
            image_uri=image_uri,
            registry=REGISTRY_HOST,
            api_key_secret_arn=secret["ARN"],
            model_cache_url=f"s3://{BUCKET}/models/",
            log_group=LOG_GROUP,
            metrics_namespace=names.METRICS_NAMESPACE,
            route_url="",
            lifecycle_hook=READY_HOOK,
            release=self.release,
            release_parameter=release_parameter_name(STACK),
        )

    def seed_cache(self, path: Path, sha256: str) -> str:
        """Put the profile's model in the S3 cache as a first instance's write-back leaves it (served from `path`,
        a sparse file costs no disk); returns its key."""
        m = self.profile.model
        key = f"models/{m.repo}/{m.revision}/{m.file}"
        meta = {"sha256": sha256, "modelscope-repo": m.repo, "modelscope-revision": m.revision}
        self.aws.objects.put(BUCKET, key, path, meta)
        return key

    def user_data(self, *, profile: ServingProfile | None = None, boot: BootSettings | None = None) -> str:
        return render_user_data(InstanceSpec.of(profile or self.profile), boot or self.boot)

    def instance(self, instance_id: str, user_data: str | None = None) -> FakeInstance:
        instance = FakeInstance(self, instance_id, user_data or self.user_data())
        self.instances.append(instance)
        return instance


class FakeInstance:
    """A container with systemd as PID 1 and its own Docker engine, in a network namespace of its own."""

    def __init__(self, world: World, instance_id: str, user_data: str) -> None:
        self.world = world
        self.instance_id = instance_id
        self.name = f"gguf-serve-rehearsal-{instance_id}"
        self.volume = f"{self.name}-docker"
        self.imds = Imds(Instance(instance_id, GROUP, REGION, ROLE, user_data))
        self._forwards: list[Forward] = []
        self.started_at = 0.0

    def start(self) -> None:
        """Start (first time: create) the instance. Its network namespace belongs to a holder container that
        outlives stops, as an EC2 instance's network and metadata service exist before its OS boots."""
        holder = f"{self.name}-net"
        if docker("container", "inspect", holder, check=False).returncode != 0:
            docker(
                "run", "-d", "--name", holder, "--hostname", "ip-10-0-1-23", "--network", "none",
                "--cap-add", "NET_ADMIN", "--add-host", f"{LOGS_HOST}:{AWS_ADDRESS}",
                "--add-host", f"{REGISTRY_HOST}:{REGISTRY_ADDRESS}", "--entrypoint", "sleep",
                self.world.instance_image, "infinity",
            )  # fmt: skip
            self._wire(holder)
        self.started_at = time.time()
        if docker("container", "inspect", self.name, check=False).returncode == 0:
            docker("start", self.name)
            return
        docker(
            "run", "-d", "--name", self.name, "--network", f"container:{holder}",
            "--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN", "--cap-add", "SYS_PTRACE",
            "--security-opt", "seccomp=unconfined", "--cgroupns=host",
            "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock",
            "-v", f"{self.volume}:/var/lib/docker", "--stop-signal", "SIGRTMIN+3",
            self.world.instance_image,
        )  # fmt: skip

    def _wire(self, holder: str) -> None:
        """Put the stand-ins at their addresses in the instance's network namespace."""
        pid = int(docker("inspect", "-f", "{{.State.Pid}}", holder).stdout)
        for address in (IMDS_ADDRESS, AWS_ADDRESS, REGISTRY_ADDRESS, MODELSCOPE_ADDRESS):
            docker("exec", holder, "ip", "addr", "add", f"{address}/32", "dev", "lo")
        w = self.world
        for address, port, upstream in (
            (IMDS_ADDRESS, 80, self.imds.port),
            (AWS_ADDRESS, 5000, w.aws.http_port),
            (AWS_ADDRESS, 443, w.aws.https_port),
            (REGISTRY_ADDRESS, 443, w.registry.port),
            (MODELSCOPE_ADDRESS, 80, int(w.hub.url.rsplit(":", 1)[1])),
        ):
            self._forwards.append(Forward(listen_in(pid, address, port), upstream))

    def stop(self, timeout: int = 120) -> None:
        docker("stop", "-t", str(timeout), self.name, timeout=timeout + 30)

    def remove(self) -> None:
        for forward in self._forwards:
            forward.close()
        docker("rm", "-f", self.name, f"{self.name}-net", check=False, timeout=120)
        docker("volume", "rm", "-f", self.volume, check=False)
        self.imds.close()

    def sh(self, script: str, *, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
        return docker("exec", self.name, "bash", "-c", script, check=check, timeout=timeout)

    def boot_log(self) -> str:
        return self.sh(f"cat {BOOT_LOG} 2>/dev/null").stdout

    def user_data_result(self) -> str | None:
        """run-user-data's last line once the user data has exited, else None."""
        out = self.sh("journalctl -u run-user-data -o cat --no-pager | grep 'user data exited' | tail -1").stdout
        return out.strip() or None

    def wait(self, predicate, timeout: float, what: str, interval: float = 1.0):  # noqa: ANN001, ANN201
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(interval)
        raise TimeoutError(f"{self.instance_id}: {what} within {timeout:.0f} s\n{self.diagnostics()}")

    def wait_boot_done(self, timeout: float = 900) -> str:
        result = self.wait(self.user_data_result, timeout, "the user data did not finish")

        def last_line_written() -> bool:  # the log goes through `tee` in a process substitution: it may lag
            lines = self.boot_log().strip().splitlines()
            return bool(lines) and ("gguf-serve-boot: healthy" in lines[-1] or "gguf-serve-boot: FAILED" in lines[-1])

        self.wait(last_line_written, 15, "the boot log has no last step line", interval=0.2)
        return result

    def step_times(self) -> list[Timing]:
        """Each `gguf-serve-boot:` line with its journal time, in seconds since this start."""
        out = self.sh("journalctl -t gguf-serve-boot -o short-unix --no-pager").stdout
        steps = []
        for line in out.splitlines():
            stamp, _, rest = line.partition(" ")
            message = rest.split(": ", 1)[-1] if "gguf-serve-boot:" in rest else ""
            with contextlib.suppress(ValueError):
                if message.startswith("gguf-serve-boot: "):
                    steps.append(Timing(message.removeprefix("gguf-serve-boot: "), float(stamp) - self.started_at))
        return steps

    def diagnostics(self) -> str:
        parts = [
            self.sh("systemctl --no-pager --failed; tail -n 40 /var/log/gguf-serve-boot.log").stdout,
            self.sh("journalctl --no-pager -n 60 -u run-user-data -u gguf-serve-llama -u gguf-serve-ready").stdout,
        ]
        return "\n".join(parts)[-6000:]


def free_disk_note() -> str:
    return f"{shutil.disk_usage(STATE).free / 1e9:.1f} GB free under {STATE}"
