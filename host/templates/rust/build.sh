#!/bin/sh
# Builds {{name}}.wasm for wasm32-wasip2 (rustup target add wasm32-wasip2).
set -e
cd "$(dirname "$0")"
cargo build --release --target wasm32-wasip2 "$@"
cp "${CARGO_TARGET_DIR:-target}/wasm32-wasip2/release/{{crate}}.wasm" {{name}}.wasm
