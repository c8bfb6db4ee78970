"""Run a plugin's logic in plain CPython on fixture rows, without weir or
wasm: `python3 -m weir_plugin.testing app rows.ndjson expected.ndjson`."""

import json
import sys

from . import Row, parse_settings


def run(plugin_class, lines, settings=None, table="events", tenant="t"):
    """The outcomes (as `Outcome.describe()` dicts) of `plugin_class` on
    the NDJSON `lines`, each line one row of `tenant`/`table`."""
    plugin = plugin_class()
    plugin.init(parse_settings(json.dumps(settings or {})))
    rows = [Row(tenant, table, line.encode("utf-8"), sequence=i + 1, index=i)
            for i, line in enumerate(l for l in lines if l.strip())]
    return [outcome.describe() for outcome in plugin.batch(rows)]


def normalize(outcome):
    """An outcome as `weir plugin test --expect` compares it: a sink's
    `delivered` is `ok`, an emitted payload that is JSON is compared as
    JSON (key order and spacing never matter), headers as an object."""
    outcome = dict(outcome)
    if outcome.get("outcome") == "delivered":
        outcome["outcome"] = "ok"
    rows = []
    for row in outcome.get("rows") or []:
        row = dict(row)
        if isinstance(row.get("payload"), str):
            try:
                row["payload"] = json.loads(row["payload"])
            except ValueError:
                pass
        if isinstance(row.get("headers"), list):
            row["headers"] = {name: value for name, value in row["headers"]}
        if row.get("headers") == {}:
            del row["headers"]
        rows.append(row)
    if "rows" in outcome:
        outcome["rows"] = rows
    return outcome


def differences(path, got, expected):
    """Where `got` is not `expected`, one line each, as `weir plugin test
    --expect` says it: `rows[0].payload.id: got 2, expected 1`."""
    at = path or "the outcome"
    if isinstance(got, dict) and isinstance(expected, dict):
        found = []
        for key, want in expected.items():
            sub = "%s.%s" % (path, key) if path else key
            if key in got:
                found += differences(sub, got[key], want)
            else:
                found.append("%s: missing, expected %s" % (sub, json.dumps(want)))
        for key in got:
            if key not in expected:
                sub = "%s.%s" % (path, key) if path else key
                found.append("%s: got %s, expected nothing" % (sub, json.dumps(got[key])))
        return found
    if isinstance(got, list) and isinstance(expected, list):
        found = []
        if len(got) != len(expected):
            found.append("%s: got %d items, expected %d" % (at, len(got), len(expected)))
        for index, (g, e) in enumerate(zip(got, expected)):
            found += differences("%s[%d]" % (path, index), g, e)
        return found
    if got != expected or type(got) is not type(expected):
        return ["%s: got %s, expected %s" % (at, json.dumps(got), json.dumps(expected))]
    return []


def check(plugin_class, rows_path, expected_path, settings=None):
    """Compares `plugin_class`'s outcomes on `rows_path` with `expected_path`
    (one JSON outcome a line) as JSON values; returns the differences as
    text lines."""
    with open(rows_path, encoding="utf-8") as f:
        got = run(plugin_class, f.read().splitlines(), settings)
    with open(expected_path, encoding="utf-8") as f:
        expected = [json.loads(line) for line in f if line.strip()]
    problems = []
    if len(got) != len(expected):
        problems.append("%d rows but %d expected outcomes: one is expected per row" % (len(got), len(expected)))
    for index, (g, e) in enumerate(zip(got, expected)):
        problems += ["line %d: %s" % (index + 1, found)
                     for found in differences("", normalize(g), normalize(e))]
    return problems


def main(argv):
    if len(argv) not in (4, 5):
        print("usage: python3 -m weir_plugin.testing MODULE ROWS EXPECTED [SETTINGS_JSON]", file=sys.stderr)
        return 2
    import importlib

    sys.path.insert(0, ".")
    module = importlib.import_module(argv[1])
    from . import _PLUGIN

    settings = json.loads(argv[4]) if len(argv) == 5 else None
    problems = check(_PLUGIN[0], argv[2], argv[3], settings)
    for problem in problems:
        print(problem)
    print("%s: %s" % (module.__name__, "FAILED" if problems else "every row as expected"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
