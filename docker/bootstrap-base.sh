#!/usr/bin/env bash
# Bootstrap a base root filesystem from OS package repositories and load it as a local image, so that no
# image is pulled from Docker Hub or any other registry. Runs on the builder as root.
#
#   bootstrap-base.sh ROLE FLAVOR ARCH TAG
#     ROLE    build (compilers, CMake, Python) or runtime (Python, libgomp, CA certificates, user 10001)
#     FLAVOR  al2023: dnf --installroot from the Amazon Linux 2023 repositories the builder is configured with
#             (CodeBuild's AL2023 image in region); debian: debootstrap from DEBIAN_MIRROR (tests, workstations)
#     ARCH    amd64 or arm64 (the image's architecture; a runtime root for another architecture runs nothing)
#     TAG     local image name to load it as
#
# Extra CA certificates in EXTRA_CA_DIR (default /usr/local/share/ca-certificates) are trusted inside the root:
# a corporate proxy, or this project's test machines, present their own CA.
set -euo pipefail

role="$1" flavor="$2" arch="$3" tag="$4"
debian_mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
debian_suite="${DEBIAN_SUITE:-trixie}"
extra_ca_dir="${EXTRA_CA_DIR:-/usr/local/share/ca-certificates}"
uid=10001

root="$(mktemp -d "${TMPDIR:-/tmp}/rootfs.XXXXXX")"
trap 'rm -rf "$root"' EXIT

case "$flavor/$role" in
  debian/build) packages=(build-essential cmake python3 ca-certificates) ;;
  debian/runtime) packages=(libgomp1 python3 ca-certificates) ;;
  al2023/build) packages=(gcc-c++ make cmake python3 ca-certificates tar gzip findutils) ;;
  # Python 3.12 runs the launcher (AL2023's default python3 is 3.9); shadow-utils only for the user below.
  al2023/runtime) packages=(libgomp python3.12 ca-certificates shadow-utils) ;;
  *) echo "unknown flavor/role $flavor/$role" >&2; exit 2 ;;
esac

case "$flavor" in
  debian)
    # Another architecture than the builder's needs qemu-user-static registered with binfmt_misc.
    debootstrap --variant=minbase --arch="$arch" --include="$(IFS=,; echo "${packages[*]}")" \
      "$debian_suite" "$root" "$debian_mirror" >&2
    ;;
  al2023)
    rpm_arch=$([[ "$arch" == arm64 ]] && echo aarch64 || echo x86_64)
    mkdir -p "$root/etc/dnf"
    cp -r /etc/dnf/vars "$root/etc/dnf/" 2>/dev/null || true # $awsregion/$awsdomain: the in-region repositories
    dnf --installroot="$root" --releasever=2023 --forcearch="$rpm_arch" --setopt=reposdir=/etc/yum.repos.d \
      --setopt=install_weak_deps=False --setopt=tsflags=nodocs -y install "${packages[@]}" >&2
    dnf --installroot="$root" clean all >&2
    ;;
esac

if [[ -d "$extra_ca_dir" ]] && compgen -G "$extra_ca_dir/*.crt" >/dev/null; then
  install -d "$root/usr/local/share/ca-certificates" "$root/etc/pki/ca-trust/source/anchors"
  cp "$extra_ca_dir"/*.crt "$root/usr/local/share/ca-certificates/"
  cp "$extra_ca_dir"/*.crt "$root/etc/pki/ca-trust/source/anchors/"
  chroot "$root" sh -c 'if command -v update-ca-certificates >/dev/null; then update-ca-certificates; \
    else update-ca-trust extract; fi' >&2
fi

if [[ "$role" == runtime ]]; then
  # The serving user, written directly (no command runs inside a root of another architecture).
  grep -q "^llama:" "$root/etc/group" || echo "llama:x:$uid:" >>"$root/etc/group"
  grep -q "^llama:" "$root/etc/passwd" \
    || echo "llama:x:$uid:$uid:llama-server:/nonexistent:/usr/sbin/nologin" >>"$root/etc/passwd"
  install -d -o "$uid" -g "$uid" "$root/models"
  if [[ "$flavor" == al2023 ]]; then
    ln -sf /usr/bin/python3.12 "$root/usr/local/bin/python3" # first on PATH: the launcher's interpreter
  fi
fi

# Slimmer and reproducible enough: no package caches, docs or locales the server never reads.
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/cache/dnf/* "$root"/usr/share/doc/* \
  "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'C.*' -exec rm -rf {} + 2>/dev/null || true

# Loaded through a FROM scratch build rather than `docker import`, which records the builder's architecture
# (its --platform needs an experimental daemon): the image must say arm64 for an arm64 build to use it.
ctx="$(mktemp -d "${TMPDIR:-/tmp}/rootfs-image.XXXXXX")"
trap 'rm -rf "$root" "$ctx"' EXIT
tar -C "$root" --numeric-owner -cf "$ctx/rootfs.tar" .
printf 'FROM scratch\nADD rootfs.tar /\n' >"$ctx/Dockerfile"
DOCKER_BUILDKIT=0 docker build --quiet --network none --platform "linux/$arch" -t "$tag" "$ctx" >&2
echo "$tag"
