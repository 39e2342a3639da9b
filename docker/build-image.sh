#!/usr/bin/env bash
# Build one image target in layers, each skipped when its tag already exists, each kept in the registry under the
# key of its inputs so that a retry, or a later stack, starts from what an earlier run produced:
#   roots  the bootstrapped Debian roots (docker/bootstrap-base.sh), tagged root-<role>-<arch>-<builder>-<key>
#   base   docker/<TARGET>.Dockerfile: llama-server on those roots, tagged by its own inputs (BASE_TAG)
#   app    docker/app.Dockerfile: the runtime packages on top of that base (IMAGE_TAG), the base pulled first
# CodeBuild runs it from the unpacked source asset, one stage per run (the buildspec in stacks/image_build.py), and
# the image test tier runs it the same way against a local registry (REGISTRY_API).
#
# Environment: TARGET, PLATFORM (linux/amd64, linux/arm64), BASE_TAG, IMAGE_TAG, REPOSITORY_URI, SOURCES_DIR
# (the staged llama.cpp sdist, wheels and debootstrap), DEBIAN_MIRRORS (the mirrors the roots may come from, in
# order: the deploy option debianMirrors; docker/pick-mirror.sh picks one), STAGE (roots, base, app or all),
# BUILD_ARGS (NAME=value pairs separated by spaces; values have no spaces). Where images are kept:
# REPOSITORY_NAME (ECR: pushed there, "exists" asks ECR), else REGISTRY_API (a registry's HTTP API, e.g.
# http://127.0.0.1:5000: pushed there, "exists" asks it), else neither (local images only, nothing pushed).
set -euo pipefail

: "${TARGET:?}" "${PLATFORM:?}" "${BASE_TAG:?}" "${IMAGE_TAG:?}" "${REPOSITORY_URI:?}" "${SOURCES_DIR:?}"
stage="${STAGE:-all}"
context="$(cd "$(dirname "$0")/.." && pwd)"
arch="${PLATFORM#linux/}"
log() { echo "build-image: $*" >&2; }

# Build arguments are passed one by one, quoted: a value can neither split nor become a docker option.
read -r -a pairs <<<"${BUILD_ARGS:-}"
build_args=()
build_image="" runtime_image=""
for pair in "${pairs[@]}"; do
  if [[ ! "$pair" =~ ^[A-Z][A-Z0-9_]*=[^[:space:]]+$ ]]; then
    log "refusing build argument '$pair': NAME=value, no spaces"
    exit 2
  fi
  build_args+=(--build-arg "$pair")
  case "$pair" in
    BUILD_IMAGE=*) build_image="${pair#*=}" ;;
    RUNTIME_IMAGE=*) runtime_image="${pair#*=}" ;;
  esac
done

registry() { [[ -n "${REPOSITORY_NAME:-}" || -n "${REGISTRY_API:-}" ]]; }

# BuildKit as CodeBuild's images run it: `docker build` there is buildx (its Docker 28 CLI with the buildx plugin),
# so call buildx by name where it is installed; `docker build` elsewhere (and for the classic builder).
build() {
  if [[ "${DOCKER_BUILDKIT:-1}" != 0 ]] && docker buildx version >/dev/null 2>&1; then
    docker buildx build --load "$@"
  else
    docker build "$@"
  fi
}

exists() {
  if [[ -n "${REGISTRY_API:-}" && -z "${REPOSITORY_NAME:-}" ]]; then
    local code accept="application/vnd.docker.distribution.manifest.v2+json,application/vnd.oci.image.manifest.v1+json"
    code=$(curl -s -o /dev/null -w '%{http_code}' -I -H "Accept: $accept" \
      "$REGISTRY_API/v2/${REPOSITORY_URI#*/}/manifests/$1") || code=000
    case "$code" in
      200) return 0 ;;
      404) return 1 ;;
      *) log "cannot tell whether $1 exists: $REGISTRY_API answered $code"; exit 1 ;;
    esac
  fi
  if [[ -z "${REPOSITORY_NAME:-}" ]]; then
    docker image inspect "$REPOSITORY_URI:$1" >/dev/null 2>&1
    return
  fi
  local err
  if err=$(aws ecr describe-images --repository-name "$REPOSITORY_NAME" --image-ids imageTag="$1" 2>&1 >/dev/null); then
    return 0
  fi
  [[ "$err" == *ImageNotFoundException* ]] && return 1
  log "cannot tell whether $1 exists: $err" # never guess: pushing over an immutable tag fails the deploy
  exit 1
}

push() {
  registry || return 0
  docker push "$REPOSITORY_URI:$1" >&2
}

# An ECR image in a build argument (a mirror of a base, or an AWS-published image) needs its registry's login.
login_to_registries() {
  [[ -z "${REPOSITORY_NAME:-}" ]] && return
  local value registry region
  for value in "$build_image" "$runtime_image"; do
    registry="${value%%/*}"
    [[ "$registry" == *.dkr.ecr.* ]] || continue
    region="${registry#*.dkr.ecr.}"
    region="${region%%.*}"
    aws ecr get-login-password --region "$region" | docker login -u AWS --password-stdin "$registry" >/dev/null
  done
}

# The mirror, picked once per run and only when a root must be bootstrapped (docker/pick-mirror.sh).
mirror=""
debian_mirror() {
  [[ -n "$mirror" ]] || mirror=$(bash "$context/docker/pick-mirror.sh")
  echo "$mirror"
}

# The bootstrapped roots are keyed by what makes them (the script, the pinned keyring and the staged debootstrap);
# the mirror is not part of the key: every mirror serves the same signed release. A root is taken from the local
# engine, else pulled from the registry, else bootstrapped and pushed there at once: a run that times out later
# (the compile) has kept it, and the next run pulls it instead of downloading it from the mirror again.
root_image() {
  local role="$1" root_arch="$2" key deb local_tag kept
  deb=$(find "$SOURCES_DIR/debian" -name 'debootstrap_*_all.deb' 2>/dev/null | head -1)
  [[ -n "$deb" ]] || { log "no debootstrap .deb in $SOURCES_DIR/debian (make image-sources)"; exit 1; }
  key=$(cat "$context/docker/bootstrap-base.sh" "$context"/docker/keyrings/*.gpg "$deb" | sha256sum | cut -c1-12)
  local_tag="gguf-serve-root/$role:$root_arch-$(uname -m)-$key"
  kept="$REPOSITORY_URI:root-$role-$root_arch-$(uname -m)-$key"
  if docker image inspect "$local_tag" >/dev/null 2>&1; then
    if registry && ! exists "${kept##*:}"; then docker tag "$local_tag" "$kept" && push "${kept##*:}"; fi
  elif registry && exists "${kept##*:}"; then
    log "pulling the $role root ($root_arch) kept as ${kept##*:}"
    docker pull -q "$kept" >&2
    docker tag "$kept" "$local_tag"
  else
    local from started
    from=$(debian_mirror)
    started=$SECONDS
    log "bootstrapping the $role root ($root_arch) from $from"
    DEBIAN_MIRROR="$from" DEBOOTSTRAP_DEB="$deb" bash "$context/docker/bootstrap-base.sh" "$role" "$root_arch" \
      "$local_tag" >/dev/null
    log "bootstrapped the $role root in $((SECONDS - started)) s"
    if registry; then docker tag "$local_tag" "$kept" && push "${kept##*:}"; fi
  fi
  echo "$local_tag"
}

# The roots a target's base is built from: the build root runs on the builder (a cross compiler in it for arm64
# on x86), the runtime root is the image's architecture. The CUDA ones add Debian non-free's CUDA 12.4.
roles() {
  case "$TARGET" in
    cuda) echo build-cuda runtime-cuda ;;
    *) echo build runtime ;;
  esac
}

# The machine (uname -m, a wheel's platform tag) of a Docker architecture.
machine_of() {
  case "$1" in
    amd64) echo x86_64 ;;
    arm64) echo aarch64 ;;
    *) log "no machine known for architecture $1"; exit 1 ;;
  esac
}

# A root of the builder's architecture with the same Python as the image's: the application layer's check
# imports the launcher with it (in the image's own root when the builder can run it, see docker/selfcheck.py).
check_image() {
  local host
  host=$(uname -m)
  root_image runtime "$([[ "$host" == aarch64 ]] && echo arm64 || echo amd64)"
}

# The classic builder for a foreign-architecture image: BuildKit (Docker 20.10 here) looks a FROM of another
# platform up in a registry only, never in the local store where the bootstrapped roots are. Nothing in the
# build runs the image's architecture (the compile is a cross compile), so no emulator is needed.
use_classic_builder_for_foreign_arch() {
  [[ "$(machine_of "$arch")" == "$(uname -m)" ]] || export DOCKER_BUILDKIT=0
}

# A stage of its own in CodeBuild (its own run and timeout): the roots come from the mirror, the base's compile
# then starts from them in the registry. Nothing to do once the base exists.
build_roots() {
  if exists "$BASE_TAG"; then
    log "base $BASE_TAG exists; its roots are not needed"
    return
  fi
  local build_role runtime_role
  read -r build_role runtime_role <<<"$(roles)"
  root_image "$build_role" "$arch" >/dev/null
  root_image "$runtime_role" "$arch" >/dev/null
  check_image >/dev/null
}

build_base() {
  if exists "$BASE_TAG"; then
    log "base $BASE_TAG exists"
    return
  fi
  login_to_registries
  use_classic_builder_for_foreign_arch
  local build_role runtime_role started=$SECONDS
  read -r build_role runtime_role <<<"$(roles)"
  # The build root is named by the image's architecture (it holds the cross compiler for it) and runs on the host.
  [[ -n "$build_image" ]] || build_args+=(--build-arg "BUILD_IMAGE=$(root_image "$build_role" "$arch")")
  [[ -n "$runtime_image" ]] || build_args+=(--build-arg "RUNTIME_IMAGE=$(root_image "$runtime_role" "$arch")")
  rm -rf "$context/sources"
  mkdir -p "$context/sources"
  cp "$SOURCES_DIR"/llama_cpp_python-*.tar.gz "$context/sources/" 2>/dev/null || log "llama.cpp source not staged"
  local network=none # the staged source is all the build needs
  [[ " ${pairs[*]} " == *" PIP_INDEX_URL="* ]] && network=host
  log "building base $BASE_TAG"
  build --network "$network" -f "$context/docker/$TARGET.Dockerfile" \
    "${build_args[@]}" -t "$REPOSITORY_URI:$BASE_TAG" "$context"
  log "built base $BASE_TAG in $((SECONDS - started)) s"
  push "$BASE_TAG"
}

build_app() {
  if exists "$IMAGE_TAG"; then
    log "image $IMAGE_TAG exists"
    return
  fi
  # From the registry, as every CodeBuild run starts with an empty engine (a local engine then only re-tags).
  if registry || ! docker image inspect "$REPOSITORY_URI:$BASE_TAG" >/dev/null 2>&1; then
    log "pulling base $BASE_TAG"
    docker pull -q "$REPOSITORY_URI:$BASE_TAG" >&2
  fi
  use_classic_builder_for_foreign_arch
  (cd "$SOURCES_DIR/wheels" && sha256sum -c --quiet SHA256SUMS)
  rm -rf "$context/site"
  mkdir -p "$context/site"
  # Pure-Python wheels, and the binary ones (uvloop) built for this target's machine only.
  local wheel machine
  machine=$(machine_of "$arch")
  for wheel in "$SOURCES_DIR"/wheels/*.whl; do
    case "${wheel##*/}" in
      *-none-any.whl | *"_$machine.whl") python3 -m zipfile -e "$wheel" "$context/site" ;;
    esac
  done
  log "building image $IMAGE_TAG on $BASE_TAG"
  local app_args=(-f "$context/docker/app.Dockerfile" --build-arg "LLAMA_BASE=$REPOSITORY_URI:$BASE_TAG"
    --build-arg "CHECK_IMAGE=$(check_image)")
  # The check stage first (the bytecode, then the launcher imports in the image's root), then the image: its
  # files and that bytecode.
  build --network none "${app_args[@]}" --target check "$context"
  build --network none "${app_args[@]}" --target serving -t "$REPOSITORY_URI:$IMAGE_TAG" "$context"
  push "$IMAGE_TAG"
}

case "$stage" in
  roots) build_roots ;;
  base) build_base ;;
  app) build_app ;;
  all) build_roots && build_base && build_app ;;
  *) log "unknown STAGE $stage" && exit 2 ;;
esac
