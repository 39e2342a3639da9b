#!/usr/bin/env bash
# Build one image target in two layers, each skipped when its tag already exists:
#   base  docker/<TARGET>.Dockerfile: llama-server on a bootstrapped root, tagged by its own inputs (BASE_TAG)
#   app   docker/app.Dockerfile: the runtime packages on top of that base (IMAGE_TAG)
# CodeBuild runs it from the unpacked source asset (the buildspec in stacks/image_build.py), and the image test
# tier runs it the same way with REPOSITORY_NAME unset: then nothing is pushed and "exists" means a local image.
#
# Environment: TARGET, PLATFORM (linux/amd64, linux/arm64), BASE_TAG, IMAGE_TAG, REPOSITORY_URI, SOURCES_DIR
# (the staged llama.cpp sdist, wheels and debootstrap), DEBIAN_MIRROR (where the roots come from: the deploy
# option debianMirror), REPOSITORY_NAME (ECR; empty: local), STAGE (base, app or all), BUILD_ARGS (NAME=value
# pairs separated by spaces; values have no spaces).
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

exists() {
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
  [[ -z "${REPOSITORY_NAME:-}" ]] && return
  docker push "$REPOSITORY_URI:$1"
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

# The bootstrapped roots are cached as local images, keyed by what makes them (the script, the pinned keyring and
# the staged debootstrap); the mirror is not part of the key: every mirror serves the same signed release.
root_image() {
  local role="$1" root_arch="$2" key deb
  deb=$(find "$SOURCES_DIR/debian" -name 'debootstrap_*_all.deb' 2>/dev/null | head -1)
  [[ -n "$deb" ]] || { log "no debootstrap .deb in $SOURCES_DIR/debian (make image-sources)"; exit 1; }
  key=$(cat "$context/docker/bootstrap-base.sh" "$context"/docker/keyrings/*.gpg "$deb" | sha256sum | cut -c1-12)
  local tag
  tag="gguf-serve-root/$role:$root_arch-$(uname -m)-$key"
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    log "bootstrapping the $role root ($root_arch) from ${DEBIAN_MIRROR:?set DEBIAN_MIRROR}"
    DEBOOTSTRAP_DEB="$deb" bash "$context/docker/bootstrap-base.sh" "$role" "$root_arch" "$tag" >/dev/null
  fi
  echo "$tag"
}

# The roots a target's base is built from: the build root runs on the builder (a cross compiler in it for arm64
# on x86), the runtime root is the image's architecture. The CUDA ones add Debian non-free's CUDA 12.4.
roles() {
  case "$TARGET" in
    cuda) echo build-cuda runtime-cuda ;;
    *) echo build runtime ;;
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
  case "$arch/$(uname -m)" in
    amd64/x86_64 | arm64/aarch64) ;;
    *) export DOCKER_BUILDKIT=0 ;;
  esac
}

build_base() {
  if exists "$BASE_TAG"; then
    log "base $BASE_TAG exists"
    return
  fi
  login_to_registries
  use_classic_builder_for_foreign_arch
  local build_role runtime_role
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
  docker build --network "$network" -f "$context/docker/$TARGET.Dockerfile" \
    "${build_args[@]}" -t "$REPOSITORY_URI:$BASE_TAG" "$context"
  push "$BASE_TAG"
}

build_app() {
  if exists "$IMAGE_TAG"; then
    log "image $IMAGE_TAG exists"
    return
  fi
  if ! docker image inspect "$REPOSITORY_URI:$BASE_TAG" >/dev/null 2>&1; then
    docker pull "$REPOSITORY_URI:$BASE_TAG"
  fi
  use_classic_builder_for_foreign_arch
  (cd "$SOURCES_DIR/wheels" && sha256sum -c --quiet SHA256SUMS)
  rm -rf "$context/site"
  mkdir -p "$context/site"
  local wheel
  for wheel in "$SOURCES_DIR"/wheels/*.whl; do
    python3 -m zipfile -e "$wheel" "$context/site"
  done
  log "building image $IMAGE_TAG on $BASE_TAG"
  local app_args=(-f "$context/docker/app.Dockerfile" --build-arg "LLAMA_BASE=$REPOSITORY_URI:$BASE_TAG"
    --build-arg "CHECK_IMAGE=$(check_image)")
  # The check stage first (the bytecode, then the launcher imports in the image's root), then the image: its
  # files and that bytecode.
  docker build --network none "${app_args[@]}" --target check "$context"
  docker build --network none "${app_args[@]}" --target serving -t "$REPOSITORY_URI:$IMAGE_TAG" "$context"
  push "$IMAGE_TAG"
}

case "$stage" in
  base) build_base ;;
  app) build_app ;;
  all) build_base && build_app ;;
  *) log "unknown STAGE $stage" && exit 2 ;;
esac
