#!/usr/bin/env bash
# Pick the Debian mirror the roots are bootstrapped from: each of DEBIAN_MIRRORS in order, the first whose signed
# release answers, verifies and is consistent wins. Prints its URL on stdout; logs every mirror's verdict and the
# winner's download rate on stderr. The same probe runs in CodeBuild (docker/build-image.sh, before the first
# root is bootstrapped) and, when asked, from the pre-flight (gguf-serve-preflight --probe-mirrors).
#
#   pick-mirror.sh            DEBIAN_MIRRORS="url url ..." (the deploy option debianMirrors)
#
# For each mirror: dists/<suite>/InRelease, checked with gpgv against the keyring pinned in docker/keyrings/ (a
# mirror that serves anything but the signed release fails here), then the Packages.xz of the builder's
# architecture that this InRelease names, checked against its sha256 (a mirror caught mid-sync serves an index the
# release does not name, and fails here, not in the middle of debootstrap) and timed: that is the rate logged.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
suite=trixie
keyring="$here/keyrings/debian-$suite.gpg"
read -r -a mirrors <<<"${DEBIAN_MIRRORS:?set DEBIAN_MIRRORS to Debian mirror URLs separated by spaces}"
connect_s="${MIRROR_CONNECT_TIMEOUT_S:-15}"
index_s="${MIRROR_INDEX_TIMEOUT_S:-180}"
log() { echo "pick-mirror: $*" >&2; }
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) log "unsupported builder $(uname -m)"; exit 2 ;;
esac
for tool in wget gpgv sha256sum awk; do
  command -v "$tool" >/dev/null || { log "the builder lacks $tool"; exit 1; }
done

work="$(mktemp -d "${TMPDIR:-/tmp}/pick-mirror.XXXXXX")"
trap 'rm -rf "$work"' EXIT

probe() {
  local mirror="${1%/}" index="main/binary-$arch/Packages.xz" line sha size started ended
  rm -f "$work"/*
  if ! wget -q -T "$connect_s" -t 1 -O "$work/InRelease" "$mirror/dists/$suite/InRelease"; then
    log "$mirror: no answer for dists/$suite/InRelease"
    return 1
  fi
  # As apt and debootstrap judge it: a valid signature by a pinned key and no bad one (the archive also signs with
  # keys of other releases, which the pinned keyring does not hold: gpgv then exits 2 on a good release).
  gpgv --keyring "$keyring" --status-fd 3 --output "$work/Release" "$work/InRelease" 3>"$work/status" 2>/dev/null || true
  if ! grep -q '^\[GNUPG:\] VALIDSIG ' "$work/status" || grep -q '^\[GNUPG:\] BADSIG ' "$work/status"; then
    log "$mirror: dists/$suite/InRelease is not signed by the pinned keyring"
    return 1
  fi
  if ! grep -qx "Codename: $suite" "$work/Release"; then
    log "$mirror: dists/$suite is not $suite ($(grep -m1 '^Codename:' "$work/Release" || echo 'no Codename'))"
    return 1
  fi
  line=$(awk -v f="$index" '/^SHA256:/ { on = 1; next } /^[^ ]/ { on = 0 } on && $3 == f { print $1, $2 }' \
    "$work/Release")
  read -r sha size <<<"$line"
  if [[ -z "${sha:-}" ]]; then
    log "$mirror: its release names no $index"
    return 1
  fi
  started=$(date +%s.%N)
  if ! timeout "$index_s" wget -q -T "$connect_s" -t 1 -O "$work/Packages.xz" "$mirror/dists/$suite/$index"; then
    log "$mirror: dists/$suite/$index could not be downloaded within ${index_s} s"
    return 1
  fi
  ended=$(date +%s.%N)
  if [[ "$(sha256sum "$work/Packages.xz" | cut -d' ' -f1)" != "$sha" ]]; then
    log "$mirror: $index does not match its signed release (a mirror in the middle of a sync?)"
    return 1
  fi
  awk -v m="$mirror" -v b="$size" -v s="$started" -v e="$ended" -v f="$index" 'BEGIN {
    t = e - s; if (t < 0.001) t = 0.001
    printf "pick-mirror: %s: release signed, %s %.1f MB in %.1f s (%.2f MB/s): using it\n", m, f, b / 1e6, t, b / 1e6 / t
  }' >&2
}

for mirror in "${mirrors[@]}"; do
  if probe "$mirror"; then
    echo "${mirror%/}"
    exit 0
  fi
done
log "no mirror of ${mirrors[*]} answered with the signed $suite release; set debianMirrors to one the builder reaches"
exit 1
