"""A base image's last build step: llama-server and Python in the runtime root must find every library they need.

    selfcheck.py ROOT [--elf PATH]... [--allow-missing SONAME]... [--version-contains TEXT] [--import MODULE]...
    selfcheck.py ROOT --no-elf --import MODULE...   (the application layer: the imports only)

ROOT is the runtime root with llama-server in it, copied into a stage of the build root (the builder's own
architecture). Every ELF given, every Python extension module in ROOT, and what they need are resolved inside
ROOT as the dynamic loader would (RUNPATH with $ORIGIN, the multiarch and ld.so.conf directories), and must be
built for ROOT's architecture. When ROOT's code can run here (the builder's architecture, or an emulator the
kernel knows), it also runs `ldd` and `llama-server --version` in ROOT and imports the modules with ROOT's
Python; otherwise (an arm64 root on an x86 builder) it says so and imports them with the build root's Python,
the same Debian release. Exits 1 with every problem listed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TRIPLETS = {"AArch64": "aarch64-linux-gnu", "Advanced Micro Devices X86-64": "x86_64-linux-gnu"}
# Found on the builder's PATH: the runs inside the root get the root's own PATH.
CHROOT = shutil.which("chroot", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") or "chroot"


def readelf(path: Path, flag: str) -> str:
    return subprocess.run(["readelf", flag, "-W", str(path)], capture_output=True, text=True, check=True).stdout


def machine(path: Path) -> str | None:
    try:
        header = readelf(path, "-h")
    except subprocess.CalledProcessError:
        return None
    m = re.search(r"^\s*Machine:\s*(.+?)\s*$", header, re.M)
    return m.group(1) if m else None


class Root:
    def __init__(self, root: Path, *, elf: bool = True) -> None:
        self.root = root
        self.dirs: list[str] = []
        if not elf:
            self.machine = None
            return
        self.machine = machine(self.inside(Path("/usr/bin/python3")))
        if self.machine not in TRIPLETS:
            raise SystemExit(f"selfcheck: {root}/usr/bin/python3 is not an ELF for a known machine ({self.machine})")
        triplet = TRIPLETS[self.machine]
        self.dirs = [f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib", "/usr/lib", *self._ld_so_conf()]

    def inside(self, path: Path) -> Path:
        """The file a path inside the root names, following symlinks inside the root."""
        current = self.root
        parts = list(path.parts[1:]) if path.is_absolute() else list(path.parts)
        hops = 0
        while parts:
            candidate = current / parts.pop(0)
            if candidate.is_symlink():
                hops += 1
                if hops > 40:
                    return candidate
                target = Path(os.readlink(candidate))
                parts = list(target.parts[1:] if target.is_absolute() else target.parts) + parts
                current = self.root if target.is_absolute() else current
            else:
                current = candidate
        return current

    def _ld_so_conf(self) -> list[str]:
        dirs = []
        for conf in sorted((self.root / "etc" / "ld.so.conf.d").glob("*.conf")):
            dirs += [line.strip() for line in conf.read_text().splitlines() if line.startswith("/")]
        return dirs

    def needed(self, path: Path) -> tuple[list[str], list[str]]:
        dynamic = readelf(path, "-d")
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
        runpath = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[(.+?)\]", dynamic)
        origin = "/" + str(path.parent.relative_to(self.root))
        dirs = [d.replace("$ORIGIN", origin) for entry in runpath for d in entry.split(":")]
        return needed, dirs

    def resolve(self, elf: Path, allow_missing: set[str], problems: list[str], seen: set[Path]) -> None:
        if elf in seen:
            return
        seen.add(elf)
        if machine(elf) != self.machine:
            problems.append(f"{self.show(elf)} is built for {machine(elf)}, not {self.machine}")
            return
        needed, dirs = self.needed(elf)
        for soname in needed:
            found = None
            for d in [*dirs, *self.dirs]:
                candidate = self.inside(Path(d) / soname)
                if candidate.is_file():
                    found = candidate
                    break
            if found is None:
                if soname not in allow_missing:
                    problems.append(f"{self.show(elf)} needs {soname}, which is not in the root")
                continue
            self.resolve(found, allow_missing, problems, seen)

    def show(self, path: Path) -> str:
        return "/" + str(path.relative_to(self.root))

    def runs_here(self) -> bool:
        try:
            return subprocess.run([CHROOT, str(self.root), "/usr/bin/true"], capture_output=True).returncode == 0
        except OSError:
            return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--elf", action="append", default=[], help="a binary or library inside ROOT (globs work)")
    parser.add_argument("--allow-missing", action="append", default=[], help="a soname the host provides")
    parser.add_argument("--version-contains", help="what `llama-server --version` must print")
    parser.add_argument("--import", dest="imports", action="append", default=[], help="a module to import")
    parser.add_argument("--pythonpath", default="", help="PYTHONPATH inside ROOT for the imports")
    parser.add_argument("--no-elf", action="store_true", help="only the imports (no readelf in this root)")
    parser.add_argument(
        "--stub", action="append", default=[], help="SONAME=FILE: a stand-in for the runs only (the driver's libcuda)"
    )
    args = parser.parse_args()

    root = Root(args.root.resolve(), elf=not args.no_elf)
    allow = set(args.allow_missing)
    problems: list[str] = []
    elves = [] if args.no_elf else [root.inside(Path("/usr/bin/python3"))]
    elves += [] if args.no_elf else sorted(root.root.glob("usr/lib/python3*/lib-dynload/*.so"))
    for pattern in args.elf:
        matches = sorted(root.root.glob(pattern.lstrip("/")))
        if not matches:
            problems.append(f"{pattern} is not in the root")
        elves += [root.inside(Path("/") / m.relative_to(root.root)) for m in matches]
    seen: set[Path] = set()
    for elf in elves:
        root.resolve(elf, allow, problems, seen)
    if not args.no_elf:
        print(f"selfcheck: {len(seen)} ELF files resolved inside the root ({root.machine})")

    server = "/usr/local/bin/llama-server"
    if root.runs_here():
        # The chroot has no /proc, where the loader reads $ORIGIN from: LD_ORIGIN_PATH says it (glibc's fallback).
        server = root.show(root.inside(Path(server))) if root.inside(Path(server)).is_file() else server
        stubs = "/selfcheck-stubs"  # inside ROOT, never in the image: the check stage is thrown away
        for stub in args.stub:
            soname, source = stub.split("=", 1)
            (root.root / stubs.lstrip("/")).mkdir(parents=True, exist_ok=True)
            (root.root / stubs.lstrip("/") / soname).write_bytes(Path(source).read_bytes())
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": args.pythonpath}
        env["LD_LIBRARY_PATH"] = stubs if args.stub else ""
        env["LD_ORIGIN_PATH"] = str(Path(server).parent)
        ldd = subprocess.run([CHROOT, str(root.root), "ldd", server], capture_output=True, text=True, env=env)
        for line in ldd.stdout.splitlines():
            if "not found" in line and line.split()[0] not in allow:
                problems.append(f"ldd {server}: {line.strip()}")
        if ldd.returncode != 0:
            problems.append(f"ldd {server} exited {ldd.returncode}: {ldd.stderr.strip()}")
        if args.version_contains:
            out = subprocess.run([CHROOT, str(root.root), server, "--version"], capture_output=True, text=True, env=env)
            text = out.stdout + out.stderr
            print(text.strip())
            if out.returncode != 0 or args.version_contains not in text:
                problems.append(f"{server} --version exited {out.returncode} without {args.version_contains!r}")
        python = [CHROOT, str(root.root), "python3"]
    else:
        print("selfcheck: the root's code does not run on this builder: ELF files are checked statically only")
        env = {"PYTHONPATH": ":".join(str(root.root) + p for p in args.pythonpath.split(":") if p)}
        python = [sys.executable]
    if args.imports:
        code = "import importlib, sys\nfor m in sys.argv[1:]: print('imported', importlib.import_module(m).__file__)"
        out = subprocess.run([*python, "-B", "-c", code, *args.imports], capture_output=True, text=True, env=env)
        print(out.stdout.strip())
        if out.returncode != 0:
            problems.append(f"importing {', '.join(args.imports)} failed: {out.stderr.strip()[-2000:]}")

    for problem in problems:
        print(f"selfcheck: FAIL {problem}", file=sys.stderr)
    if not problems:
        print("selfcheck: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
