#!/usr/bin/env bash
# Build one image target in two layers, each skipped when its tag already exists:
#   base  docker/<TARGET>.Dockerfile: llama-server on a bootstrapped root, tagged by its own inputs (BASE_TAG)
#   app   docker/app.Dockerfile: the runtime packages on top of that base (IMAGE_TAG)
# CodeBuild runs it from the unpacked source asset (the buildspec in stacks/image_build.py), and the image test
# tier runs it the same way with REPOSITORY_NAME unset: then nothing is pushed and "exists" means a local image.
#
# Environment: TARGET, PLATFORM (linux/amd64, linux/arm64), BASE_TAG, IMAGE_TAG, REPOSITORY_URI, SOURCES_DIR
# (the staged llama.cpp sdist and wheels), REPOSITORY_NAME (ECR; empty: local), STAGE (base, app or all),
# ROOTFS_FLAVOR (al2023 or debian), BUILD_ARGS (NAME=value pairs separated by spaces; values have no spaces).
set -euo pipefail

: "${TARGET:?}" "${PLATFORM:?}" "${BASE_TAG:?}" "${IMAGE_TAG:?}" "${REPOSITORY_URI:?}" "${SOURCES_DIR:?}"
stage="${STAGE:-all}"
flavor="${ROOTFS_FLAVOR:-al2023}"
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

# An arm64 image on an x86 builder (no arm64 CodeBuild in the region): QEMU user emulation through binfmt_misc,
# with the F flag so that the kernel holds the interpreter open for every container. Needs a privileged build.
enable_emulation() {
  local host
  host=$(uname -m)
  [[ "$arch" == arm64 && "$host" != aarch64 ]] || return 0
  # BuildKit (Docker 20.10 here) looks a foreign-platform FROM up in a registry, never in the local store where
  # the bootstrapped roots are: the classic builder uses local images.
  export DOCKER_BUILDKIT=0
  [[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] && return 0
  local qemu="$SOURCES_DIR/qemu/qemu-aarch64-static"
  [[ -x "$qemu" ]] || qemu=$(command -v qemu-aarch64-static) || {
    log "an arm64 image on a $host builder needs qemu-aarch64-static in $SOURCES_DIR/qemu (make image-sources)"
    exit 1
  }
  mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  install -m 0755 "$qemu" /usr/local/bin/qemu-aarch64-static
  local magic='\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
  local mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
  printf '%s' ":qemu-aarch64:M::$magic:$mask:/usr/local/bin/qemu-aarch64-static:F" >/proc/sys/fs/binfmt_misc/register
  log "arm64 emulated with $qemu"
}

# The bootstrapped roots are cached as local images, keyed by the script that makes them.
root_image() {
  local role="$1" key
  key=$(sha256sum "$context/docker/bootstrap-base.sh" | cut -c1-12)
  local tag="gguf-serve-root/$role:$flavor-$arch-$key"
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    log "bootstrapping the $role root ($flavor, $arch)"
    bash "$context/docker/bootstrap-base.sh" "$role" "$flavor" "$arch" "$tag" >/dev/null
  fi
  echo "$tag"
}

build_base() {
  if exists "$BASE_TAG"; then
    log "base $BASE_TAG exists"
    return
  fi
  login_to_registries
  enable_emulation
  [[ -n "$build_image" ]] || build_args+=(--build-arg "BUILD_IMAGE=$(root_image build)")
  [[ -n "$runtime_image" ]] || build_args+=(--build-arg "RUNTIME_IMAGE=$(root_image runtime)")
  rm -rf "$context/sources"
  mkdir -p "$context/sources"
  cp "$SOURCES_DIR"/llama_cpp_python-*.tar.gz "$context/sources/" 2>/dev/null || log "llama.cpp source not staged"
  local network=none # the staged source is all the build needs
  [[ " ${pairs[*]} " == *" PIP_INDEX_URL="* ]] && network=host
  log "building base $BASE_TAG"
  docker build --network "$network" --platform "$PLATFORM" -f "$context/docker/$TARGET.Dockerfile" \
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
  enable_emulation
  (cd "$SOURCES_DIR/wheels" && sha256sum -c --quiet SHA256SUMS)
  rm -rf "$context/site"
  mkdir -p "$context/site"
  local wheel
  for wheel in "$SOURCES_DIR"/wheels/*.whl; do
    python3 -m zipfile -e "$wheel" "$context/site"
  done
  log "building image $IMAGE_TAG on $BASE_TAG"
  docker build --network none --platform "$PLATFORM" -f "$context/docker/app.Dockerfile" \
    --build-arg "LLAMA_BASE=$REPOSITORY_URI:$BASE_TAG" -t "$REPOSITORY_URI:$IMAGE_TAG" "$context"
  push "$IMAGE_TAG"
}

case "$stage" in
  base) build_base ;;
  app) build_app ;;
  all) build_base && build_app ;;
  *) log "unknown STAGE $stage" && exit 2 ;;
esac
