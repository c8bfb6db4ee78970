#!/bin/sh
# Builds {{name}}.wasm: componentize-py (pip install componentize-py) bundles
# CPython, app.py and weir_plugin against weir's WIT in wit/.
set -e
cd "$(dirname "$0")"
componentize-py -d wit -w {{world}} componentize app -p . -o {{name}}.wasm
