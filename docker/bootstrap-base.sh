#!/usr/bin/env bash
# Bootstrap a Debian root filesystem from a Debian mirror and load it as a local image, so that no image is
# pulled from Docker Hub or any other registry. The same script, with the same arguments, runs on CodeBuild in
# region and in the image tests here; only DEBIAN_MIRROR differs. Runs on the builder as root.
#
#   bootstrap-base.sh ROLE ARCH TAG
#     ROLE  build: compilers, CMake, Python, for the builder's own architecture, with a cross compiler when ARCH
#           is another one (arm64 on an x86 builder: g++-aarch64-linux-gnu); build-cuda: the same plus Debian
#           non-free's CUDA toolkit. runtime: Python, libgomp, CA certificates and user 10001, for ARCH;
#           runtime-cuda: the same plus Debian non-free's libcudart and libcublas.
#     ARCH  the image's architecture: amd64 or arm64
#     TAG   the local image name to load it as
#
# Environment:
#   DEBIAN_MIRROR   the mirror (the deploy option debianMirror); any mirror will do: every Release file is checked
#                   against the keyring pinned in docker/keyrings/ (gpgv), and every package against its Release
#   DEBOOTSTRAP_DEB the staged debootstrap .deb (architecture all), unpacked with ar and tar: the builder needs no
#                   Debian tools, only wget, perl, ar, xz, tar and gpgv (CodeBuild's Amazon Linux image has them)
#   EXTRA_CA_DIR    extra CA certificates to trust inside the root (default /usr/local/share/ca-certificates):
#                   a corporate proxy, or this project's test machines, present their own CA
#
# A runtime root is only unpacked, never configured (debootstrap --foreign, then the remaining packages with ar
# and tar): nothing of ARCH runs on the builder, so an arm64 root builds on x86 without an emulator, and the
# amd64 root is made the same way. What maintainer scripts would have written (passwd, group, the CA bundle)
# is written here.
set -euo pipefail

role="$1" arch="$2" tag="$3"
here="$(cd "$(dirname "$0")" && pwd)"
mirror="${DEBIAN_MIRROR:?set DEBIAN_MIRROR to a Debian mirror, e.g. http://deb.debian.org/debian}"
suite=trixie
keyring="$here/keyrings/debian-$suite.gpg"
deb="${DEBOOTSTRAP_DEB:?set DEBOOTSTRAP_DEB to the staged debootstrap .deb (make image-sources)}"
extra_ca_dir="${EXTRA_CA_DIR:-/usr/local/share/ca-certificates}"
uid=10001
log() { echo "bootstrap-base: $*" >&2; }

case "$(uname -m)" in
  x86_64) builder=amd64 ;;
  aarch64) builder=arm64 ;;
  *) log "unsupported builder $(uname -m)"; exit 2 ;;
esac
case "$arch" in amd64 | arm64) ;; *) log "unknown ARCH $arch"; exit 2 ;; esac
components=main
case "$role" in
  build | build-cuda)
    packages=(build-essential cmake python3 ca-certificates)
    [[ "$arch" == "$builder" ]] || packages+=("g++-${arch/arm64/aarch64}-linux-gnu")
    if [[ "$role" == build-cuda ]]; then
      packages+=(nvidia-cuda-toolkit)
      components=main,contrib,non-free
    fi
    root_arch="$builder"
    ;;
  runtime | runtime-cuda)
    packages=(libgomp1 python3 ca-certificates)
    if [[ "$role" == runtime-cuda ]]; then
      packages+=(libcudart12 libcublas12)
      components=main,contrib,non-free
    fi
    root_arch="$arch"
    ;;
  *) log "unknown ROLE $role"; exit 2 ;;
esac
for tool in wget perl ar xz tar gpgv chroot; do
  command -v "$tool" >/dev/null || { log "the builder lacks $tool"; exit 1; }
done

work="$(mktemp -d "${TMPDIR:-/tmp}/rootfs.XXXXXX")"
trap 'rm -rf "$work"' EXIT
root="$work/root"
tools="$work/debootstrap"
mkdir -p "$root" "$tools"
ar p "$deb" data.tar.gz | tar -xz -C "$tools"
export DEBOOTSTRAP_DIR="$tools/usr/share/debootstrap"

bootstrap=(--variant=minbase --extractor=ar --arch="$root_arch" --components="$components" --keyring="$keyring"
  --include="$(IFS=,; echo "${packages[*]}")")
if [[ "$role" == build* ]]; then
  # The builder's own architecture: a full bootstrap, maintainer scripts and all (they run natively).
  "$tools/usr/sbin/debootstrap" "${bootstrap[@]}" "$suite" "$root" "$mirror" >&2
else
  "$tools/usr/sbin/debootstrap" --foreign "${bootstrap[@]}" "$suite" "$root" "$mirror" >&2
  # The first stage unpacked the required packages; unpack the rest the same way (ar, then tar).
  while read -r package path; do
    grep -qx "$package" <(tr ' ' '\n' <"$root/debootstrap/required") && continue
    member=$(ar t "$root/$path" | grep '^data\.tar')
    case "$member" in
      data.tar.xz) ar p "$root/$path" "$member" | xz -dc ;;
      data.tar.gz) ar p "$root/$path" "$member" | gzip -dc ;;
      *) log "$package: unsupported $member"; exit 1 ;;
    esac | tar -C "$root" --keep-directory-symlink -xf -
  done <"$root/debootstrap/debpaths"
  rm -rf "$root/debootstrap" "$root"/var/cache/apt/archives/*.deb
  # Run inside a container (CodeBuild, this machine), debootstrap links proc to the host's /proc; an image needs
  # the directory (runc refuses to mount proc on a symlink: BuildKit's RUN, and Docker on the instances).
  if [[ -L "$root/proc" ]]; then rm "$root/proc"; fi
  install -d -m 0555 "$root/proc"
  # What base-passwd's maintainer script would write, then the serving user.
  cp "$root/usr/share/base-passwd/passwd.master" "$root/etc/passwd"
  cp "$root/usr/share/base-passwd/group.master" "$root/etc/group"
  echo "llama:x:$uid:" >>"$root/etc/group"
  echo "llama:x:$uid:$uid:llama-server:/nonexistent:/usr/sbin/nologin" >>"$root/etc/passwd"
  install -d -o "$uid" -g "$uid" "$root/models"
fi

# Extra CAs, and for an unconfigured root the bundle update-ca-certificates would write (Python reads the bundle).
if [[ -d "$extra_ca_dir" ]] && compgen -G "$extra_ca_dir/*.crt" >/dev/null; then
  install -d "$root/usr/local/share/ca-certificates"
  cp "$extra_ca_dir"/*.crt "$root/usr/local/share/ca-certificates/"
fi
if [[ "$role" == build* ]]; then
  chroot "$root" update-ca-certificates >&2
else
  install -d "$root/etc/ssl/certs"
  find "$root/usr/share/ca-certificates" "$root/usr/local/share/ca-certificates" -name '*.crt' -type f 2>/dev/null \
    | LC_ALL=C sort | xargs cat >"$root/etc/ssl/certs/ca-certificates.crt"
  grep -q 'BEGIN CERTIFICATE' "$root/etc/ssl/certs/ca-certificates.crt" || { log "no CA certificates"; exit 1; }
fi

# Slimmer and reproducible enough: no package caches, docs or locales the server never reads, and no device
# nodes (the container runtime provides /dev).
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
  "$root"/usr/share/info/* "$root"/var/log/* "${root:?}"/dev/*
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'C.*' -exec rm -rf {} + 2>/dev/null || true

# Loaded through a FROM scratch build rather than `docker import`, which records the builder's architecture
# (its --platform needs an experimental daemon): the image must say arm64 for an arm64 build to use it.
ctx="$work/image"
mkdir -p "$ctx"
tar -C "$root" --numeric-owner -cf "$ctx/rootfs.tar" .
printf 'FROM scratch\nADD rootfs.tar /\n' >"$ctx/Dockerfile"
DOCKER_BUILDKIT=0 docker build --quiet --network none --platform "linux/$root_arch" -t "$tag" "$ctx" >&2
echo "$tag"
