#!/bin/sh
# Builds {{name}}.wasm with componentize-js (npm install), against weir's WIT
# in wit/. `-d http fetch-event` leaves wasi:http out of the component: weir
# refuses a component importing it without `grants.http`. Drop them only if
# the plugin calls fetch() (see the weir plugin guide on outbound HTTP).
#
# The build is ahead of time (`--aot`: weval specializes SpiderMonkey's
# interpreter to this code): each row costs about a third less.
# weval is WEIR_WEVAL, else `weval` on PATH, else what componentize-js
# downloads from GitHub. If that build fails, the plain one (interpreter
# only) is made instead, saying so. WEIR_JS_AOT=0 skips the AOT build.
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
componentize() {
  "$@" plugin.js -w wit -n {{world}} -d http fetch-event -o {{name}}.wasm
}
if [ "${WEIR_JS_AOT:-1}" != 0 ]; then
  weval=${WEIR_WEVAL:-$(command -v weval || true)}
  if componentize "$@" --aot ${weval:+--weval-bin "$weval"}; then exit 0; fi
  echo "build.sh: the AOT build (componentize-js --aot, with weval) failed, see above;" \
    "building without AOT: the plugin works, about 1.5 × slower per row." \
    "WEIR_WEVAL names a weval binary (cargo install weval); WEIR_JS_AOT=0 skips AOT." >&2
fi
componentize "$@"
