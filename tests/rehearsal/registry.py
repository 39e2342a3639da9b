"""ECR stand-in: a read-only Docker registry (API v2) serving one image, from `docker save` of the image the
image tier built, gzip-compressed layers as ECR stores them, over TLS with the rehearsal CA.

`docker login` succeeds (the registry asks for no credentials); pulls of anything but the one name:tag get
MANIFEST_UNKNOWN, as from ECR.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import ssl
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gguf_serve.container.digest import sha256_file
from tests.images.engine import docker

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"


def _sha256_file(path: Path) -> str:
    return "sha256:" + sha256_file(path)


def export_image(image: str, directory: Path) -> tuple[bytes, dict[str, Path]]:
    """(manifest, {digest: blob file}) for image; layers kept in directory, keyed by the image id."""
    image_id = docker("image", "inspect", "-f", "{{.Id}}", image).stdout.strip().removeprefix("sha256:")
    out = directory / image_id[:16]
    manifest_path = out / "manifest.json"
    for stale in directory.glob("*") if directory.exists() else []:  # one export kept: the image now served
        if stale != out:
            shutil.rmtree(stale, ignore_errors=True)
    if not manifest_path.exists():
        out.mkdir(parents=True, exist_ok=True)
        saved = out / "image.tar"
        docker("save", "-o", str(saved), image, timeout=900)
        with tarfile.open(saved) as tar:
            index = json.load(tar.extractfile("manifest.json"))[0]  # type: ignore[arg-type]
            config = tar.extractfile(index["Config"]).read()  # type: ignore[union-attr]
            (out / "config.json").write_bytes(config)
            layers = []
            for n, name in enumerate(index["Layers"]):
                blob = out / f"layer{n}.tar.gz"
                with tar.extractfile(name) as src, gzip.open(blob, "wb", compresslevel=1) as dst:  # type: ignore[union-attr]
                    shutil.copyfileobj(src, dst, 1 << 20)
                layers.append(blob)
        saved.unlink()
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "size": len(config),
                "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
            },  # fmt: skip
            "layers": [
                {
                    "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    "size": b.stat().st_size,
                    "digest": _sha256_file(b),
                }
                for b in layers
            ],  # fmt: skip
        }
        manifest_path.write_text(json.dumps(manifest))
    manifest = json.loads(manifest_path.read_text())
    blobs = {manifest["config"]["digest"]: out / "config.json"}
    blobs.update({layer["digest"]: out / f"layer{n}.tar.gz" for n, layer in enumerate(manifest["layers"])})
    return manifest_path.read_bytes(), blobs


class Registry:
    def __init__(self, name: str, tag: str, image: str, directory: Path, certificate: tuple[Path, Path]) -> None:
        self.name, self.tag = name, tag
        self.manifest, self.blobs = export_image(image, directory)
        self.manifest_digest = "sha256:" + hashlib.sha256(self.manifest).hexdigest()
        self.pulled: list[str] = []  # paths of GETs answered 200
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*certificate)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def compressed_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.blobs.values())

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(registry: Registry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            pass

        def _send(self, status: int, body: bytes = b"", content_type: str = "application/json", **headers) -> None:
            self.send_response(status)
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers.items():
                self.send_header(k.replace("_", "-"), v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _unknown(self, code: str) -> None:
            self._send(404, json.dumps({"errors": [{"code": code, "message": self.path}]}).encode())

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?", 1)[0]
            if path == "/v2/":
                return self._send(200, b"{}")
            prefix = f"/v2/{registry.name}/"
            if not path.startswith(prefix):
                return self._unknown("NAME_UNKNOWN")
            kind, _, ref = path.removeprefix(prefix).partition("/")
            if kind == "manifests":
                if ref not in (registry.tag, registry.manifest_digest):
                    return self._unknown("MANIFEST_UNKNOWN")
                registry.pulled.append(path)
                return self._send(200, registry.manifest, MANIFEST_TYPE, Docker_Content_Digest=registry.manifest_digest)
            if kind == "blobs" and ref in registry.blobs:
                blob = registry.blobs[ref]
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(blob.stat().st_size))
                self.send_header("Docker-Content-Digest", ref)
                self.end_headers()
                if self.command != "HEAD":
                    with blob.open("rb") as f:
                        shutil.copyfileobj(f, self.wfile, 1 << 20)
                    registry.pulled.append(path)
                return None
            self._unknown("BLOB_UNKNOWN")

        do_HEAD = do_GET  # noqa: N815

    return Handler
