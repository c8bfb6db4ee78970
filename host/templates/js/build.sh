#!/bin/sh
# Builds {{name}}.wasm with componentize-js (npm install), against weir's WIT
# in wit/. `-d http fetch-event` leaves wasi:http out of the component: weir
# refuses a component importing it without `grants.http`. Drop them only if
# the plugin calls fetch() (see the weir plugin guide on outbound HTTP).
set -e
cd "$(dirname "$0")"
if [ -n "$WEIR_COMPONENTIZE_JS" ]; then
  set -- $WEIR_COMPONENTIZE_JS
elif [ -x node_modules/.bin/componentize-js ]; then
  set -- node_modules/.bin/componentize-js
else
  echo "componentize-js is missing: run npm install" >&2
  exit 1
fi
"$@" plugin.js -w wit -n {{world}} -d http fetch-event -o {{name}}.wasm
