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


def check(plugin_class, rows_path, expected_path, settings=None):
    """Compares `plugin_class`'s outcomes on `rows_path` with `expected_path`
    (one JSON outcome a line); returns the differences as text lines."""
    with open(rows_path, encoding="utf-8") as f:
        got = run(plugin_class, f.read().splitlines(), settings)
    with open(expected_path, encoding="utf-8") as f:
        expected = [json.loads(line) for line in f if line.strip()]
    problems = []
    if len(got) != len(expected):
        problems.append("%d outcomes, expected %d" % (len(got), len(expected)))
    for index, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            problems.append("row %d: got %s, expected %s" % (index + 1, json.dumps(g), json.dumps(e)))
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
