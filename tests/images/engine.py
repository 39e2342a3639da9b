"""A Docker engine for the image tier: Debian's docker.io, installed and started when missing, and the few tools
docker/bootstrap-base.sh needs on a builder (the same ones CodeBuild's image has; debootstrap itself is staged).

CI is a clean clone on a fresh machine, as root, with no engine; this is what findings.md verified there:
`dockerd --iptables=false` with overlay2. The engine is left running and its images (the bootstrapped roots,
the llama.cpp bases) stay in /var/lib/docker, outside the checkout: later runs reuse them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from gguf_serve.local.cache import cache_root
from tests.apt import apt_install

DOCKER = "/usr/bin/docker"  # Debian's client, which speaks to Debian's engine (another may be first on PATH)
CACHE = cache_root()


def docker(*args: str, check: bool = True, timeout: float = 600, text: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([DOCKER, *args], check=check, capture_output=True, text=text, timeout=timeout)


def engine_env() -> dict[str, str]:
    return {**os.environ, "PATH": f"/usr/bin:/usr/sbin:{os.environ.get('PATH', '')}", "DOCKER_BUILDKIT": "1"}


def ensure_engine() -> None:
    tools = {"docker.io": DOCKER, "wget": "wget", "binutils": "ar", "xz-utils": "xz", "gpgv": "gpgv", "perl": "perl"}
    missing = [p for p, exe in tools.items() if not shutil.which(exe, path="/usr/bin:/bin:/usr/sbin")]
    if missing:
        if os.geteuid() != 0:
            raise RuntimeError(f"the image tier needs {', '.join(missing)} (apt-get install) and root")
        apt_install(*missing)
    if docker("info", check=False, timeout=30).returncode == 0:
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    log = (CACHE / "dockerd.log").open("a")
    subprocess.Popen(
        [shutil.which("dockerd", path="/usr/sbin:/usr/bin") or "dockerd", "--iptables=false"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # outlives the test session: the next run finds it warm
    )
    deadline = time.monotonic() + 90
    while docker("info", check=False, timeout=30).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"dockerd did not start; see {CACHE / 'dockerd.log'}")
        time.sleep(1)


def ensure_arm64_emulation() -> None:
    """Run (never build) arm64 images here: Debian's qemu-user-static registered with binfmt_misc.

    Only the opt-in arm64 tier calls it, after the image is built: the build itself needs no emulator.
    """
    if Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        return
    if not Path("/usr/bin/qemu-aarch64-static").exists():
        apt_install("qemu-user-static", "binfmt-support")
    if not Path("/proc/sys/fs/binfmt_misc/register").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", "/proc/sys/fs/binfmt_misc"], check=True)
    subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], check=False, capture_output=True)
    if not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        raise RuntimeError("qemu-aarch64 is not registered with binfmt_misc (update-binfmts --enable qemu-aarch64)")


# Debian 12 has no docker-buildx package; trixie's (0.13.1, "Depends: libc6 (>= 2.34)") runs on Debian 12's libc.
BUILDX = ("trixie", "docker-buildx", "0.13.1+ds1-3")


def ensure_buildx() -> Path:
    """A DOCKER_CONFIG folder whose cli-plugins/ holds Debian trixie's docker-buildx, for `docker buildx build`
    as CodeBuild's images run `docker build` (there buildx 0.32 on Docker 28; here buildx 0.13 on this engine's
    BuildKit). Downloaded by apt from Debian's signed trixie index into a folder of its own: nothing of this
    machine's apt configuration or packages changes, and no other docker client sees the plugin."""
    suite, package, version = BUILDX
    config = CACHE / "buildx" / version
    plugin = config / "cli-plugins" / "docker-buildx"
    if plugin.exists():
        return config
    work = CACHE / "buildx" / "apt"
    for sub in ("lists/partial", "cache/archives/partial", "deb"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    (work / "sources.list").write_text(
        f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian {suite} main\n"
    )
    (work / "status").touch()
    options = [f"-oDir::Etc::SourceList={work / 'sources.list'}", "-oDir::Etc::SourceParts=/dev/null",
               f"-oDir::State::Lists={work / 'lists'}", f"-oDir::Cache={work / 'cache'}",
               f"-oDir::State::status={work / 'status'}"]  # fmt: skip
    subprocess.run(["apt-get", *options, "update", "-qq"], check=True, capture_output=True, timeout=600)
    subprocess.run(["apt-get", *options, "download", f"{package}={version}"], cwd=work / "deb", check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    (deb,) = (work / "deb").glob(f"{package}_*.deb")
    unpacked = work / "unpacked"
    shutil.rmtree(unpacked, ignore_errors=True)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True, timeout=120)
    tmp = plugin.with_suffix(".tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(unpacked / "usr/libexec/docker/cli-plugins/docker-buildx", tmp)
    tmp.rename(plugin)  # whole or not at all: a later run never finds half a plugin
    return config


class LocalRegistry:
    """Debian's docker-registry (the distribution registry, 2.8) on loopback, storing under `root`: the tier pushes
    each layer to it and pulls the base from it, as the deploy does with ECR. The engine speaks plain HTTP to a
    registry on 127.0.0.0/8 without configuration (Docker treats loopback registries as insecure by default)."""

    def __init__(self, root: Path) -> None:
        if not Path("/usr/bin/docker-registry").exists():
            apt_install("docker-registry")
        from gguf_serve.local.process import free_port

        self.root, self.port = root, free_port()
        self.host, self.url = f"127.0.0.1:{self.port}", f"http://127.0.0.1:{self.port}"
        root.mkdir(parents=True, exist_ok=True)
        (root / "config.yml").write_text(
            f"version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
            f"http:\n  addr: {self.host}\n"
        )
        self.log = root / "registry.log"
        self._process = subprocess.Popen(["/usr/bin/docker-registry", "serve", str(root / "config.yml")],
                                         stdout=self.log.open("w"), stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + 30
        while subprocess.run(["curl", "-sf", f"{self.url}/v2/"], capture_output=True).returncode != 0:
            if time.monotonic() > deadline or self._process.poll() is not None:
                raise RuntimeError(f"docker-registry did not start; see {self.log}")
            time.sleep(0.2)

    def served(self, method: str, path_part: str) -> list[str]:
        """Request lines of the registry's access log with this method whose path holds `path_part`."""
        return [line for line in self.log.read_text().splitlines() if f'"{method} ' in line and path_part in line]

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=30)
