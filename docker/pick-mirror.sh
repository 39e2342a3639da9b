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
# Every download is bounded in time (the whole transfer, not only the wait for a byte: a mirror that trickles a byte
# a second never reaches wget's read timeout) and in size (what is written: an endless answer stops at the bound),
# and a mirror that passes a bound loses its turn to the next.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
suite=trixie
keyring="$here/keyrings/debian-$suite.gpg"
read -r -a mirrors <<<"${DEBIAN_MIRRORS:?set DEBIAN_MIRRORS to Debian mirror URLs separated by spaces}"
connect_s="${MIRROR_CONNECT_TIMEOUT_S:-15}"
index_s="${MIRROR_INDEX_TIMEOUT_S:-180}"
release_s="${MIRROR_RELEASE_TIMEOUT_S:-30}"
release_max="${MIRROR_RELEASE_MAX_BYTES:-1048576}"  # trixie's InRelease is about 150 kB; its index's size it names
log() { echo "pick-mirror: $*" >&2; }
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) log "unsupported builder $(uname -m)"; exit 2 ;;
esac
for tool in wget gpgv sha256sum awk timeout head; do
  command -v "$tool" >/dev/null || { log "the builder lacks $tool"; exit 1; }
done

work="$(mktemp -d "${TMPDIR:-/tmp}/pick-mirror.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# fetch MIRROR PATH OUT SECONDS MAX_BYTES: download MIRROR/PATH into OUT within SECONDS and MAX_BYTES; on failure
# log why and return 1.
fetch() {
  local mirror="$1" path="$2" out="$3" seconds="$4" max="$5" status=0 got
  timeout "$seconds" wget -q -T "$connect_s" -t 1 -O - "$mirror/$path" 2>/dev/null | head -c "$((max + 1))" >"$out" \
    || status=$?
  got=$(stat -c %s "$out")
  if ((got > max)); then
    log "$mirror: $path is larger than $max bytes (stopped there): next mirror"
  elif ((status == 124)); then
    log "$mirror: $path took longer than $seconds s: next mirror"
  elif ((status != 0)); then
    log "$mirror: no answer for $path"
  else
    return 0
  fi
  return 1
}

probe() {
  local mirror="${1%/}" index="main/binary-$arch/Packages.xz" line sha size started ended
  rm -f "$work"/*
  fetch "$mirror" "dists/$suite/InRelease" "$work/InRelease" "$release_s" "$release_max" || return 1
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
  fetch "$mirror" "dists/$suite/$index" "$work/Packages.xz" "$index_s" "$size" || return 1
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
