"""weir_plugin: weir plugins in Python, built with componentize-py.

A plugin subclasses one of `Transform`, `Sink`, `Budget` or `Router`, and
its module ends with `WitWorld = weir_plugin.export(ThePlugin)`: the class
componentize-py instantiates. The packed batches of `weir:plugin@0.3.0`
(offsets, outcome codes, the "same table" sentinel, reason indexes, each
list of numbers a `bytes` of little-endian u32s) are read and written here; a plugin sees rows as `Row` objects and answers each
with `ok()`, `emit(...)`, `drop()`, `retry(after_ms)` or `dead_letter(reason)`.

Nothing here imports the generated bindings at import time, so a plugin's
logic also runs in plain CPython (see `weir_plugin.testing`).
"""

from array import array
import gc
import json
import json.encoder
import json.scanner
import sys
import traceback

__all__ = [
    "Row", "Out", "Transform", "Sink", "Budget", "Router", "export",
    "ok", "emit", "drop", "retry", "dead_letter",
    "admit", "throttle", "reject", "default_route", "to", "by_key",
    "log", "count", "state", "StateError", "http", "HttpError", "Response",
]

WIT_PACKAGE = "weir:plugin@0.3.0"

# The codes of `transformed.outcomes` and `delivered.outcomes` (wit/types.wit).
_OK, _EMIT, _RETRY, _DEAD_LETTER = 0, 1, 2, 3
# An emitted row's table length meaning "the input row's table".
_SAME_TABLE = 0xFFFFFFFF
# The WIT's lists of numbers are bytes of little-endian u32s (u64s for
# sequences): read in place by a memoryview cast to the native type when
# the machine is little-endian (wasm always is), byte-swapped otherwise.
_LITTLE = sys.byteorder == "little"
_U32 = "I" if array("I").itemsize == 4 else "L"
_U64 = "Q"


def _numbers(data, code):
    """The little-endian numbers packed in `data` (`code` _U32 or _U64)."""
    if _LITTLE:
        return memoryview(data).cast(code)
    numbers = array(code)
    numbers.frombytes(data)
    numbers.byteswap()
    return numbers


def _packed(numbers):
    """A list of u32s as the little-endian bytes the WIT carries."""
    packed = array(_U32, numbers)
    if not _LITTLE:
        packed.byteswap()
    return packed.tobytes()


# ---------------------------------------------------------------- rows


class Row:
    """One input row. `payload` is its bytes as sent; `json()` parses them once.

    Rows of a batch from weir are views of the packed batch: tenant, table,
    payload, headers, sequence and attempts are decoded when first read, so
    a plugin pays only for what it looks at.

    A row whose payload is a JSON object is also a mapping of its top-level
    fields: `row.get(name)`, `name in row`, `row[name]` read one without
    parsing the row whole (weir finds the fields a plugin reads for its
    whole batch at once, natively), and `row[name] = value` sets one;
    `emit(row)` sends the row with what was set. Each reads and answers as
    `row.json()` would, errors included."""

    __slots__ = ("_tenant", "_table", "_payload", "_headers", "_sequence", "_attempts",
                 "index", "_json", "_view", "_edits", "_local")

    def __init__(self, tenant, table, payload, headers=(), sequence=1, attempts=1, index=0):
        self._tenant = tenant
        self._table = table
        self._payload = payload
        # (name, value) pairs in order; a name may repeat.
        self._headers = list(headers)
        self._sequence = sequence
        self._attempts = attempts
        # Its place in the batch: what `state` calls name it by.
        self.index = index
        self._json = None
        self._view = None
        # Fields set with `row[name] = value`, not yet in `_payload`.
        self._edits = None
        # The payload is not the batch's (replaced, or edited): the batch's
        # field places no longer describe it.
        self._local = True

    @property
    def tenant(self):
        if self._tenant is None:
            self._tenant = self._view.text(self.index, 0)
        return self._tenant

    @tenant.setter
    def tenant(self, value):
        self._tenant = value

    @property
    def table(self):
        if self._table is None:
            self._table = self._view.text(self.index, 2)
        return self._table

    @table.setter
    def table(self, value):
        self._table = value

    @property
    def payload(self):
        """The payload's bytes, with the fields set by `row[name] = value`."""
        if self._edits:
            return self._apply_edits()
        if self._payload is None:
            self._payload = self._view.payload(self.index)
        return self._payload

    def _emitted(self):
        """The payload `emit(row)` sends: `row.json()` written out when it
        was parsed (it may have been changed), else `payload`."""
        if self._json is not None:
            return _json_dump(self._json).encode("utf-8")
        return self.payload

    def _apply_edits(self):
        """Puts `_edits` into `_payload`, which the batch's field places
        then no longer describe; returns it."""
        payload = self._payload = self._edited()
        self._edits = None
        self._local = True
        return payload

    @payload.setter
    def payload(self, value):
        self._payload = value
        self._json = None
        self._edits = None
        self._local = True

    @property
    def headers(self):
        """(name, value) pairs in order; a name may repeat."""
        if self._headers is None:
            self._headers = self._view.headers(self.index)
        return self._headers

    @headers.setter
    def headers(self, value):
        self._headers = list(value)

    @property
    def sequence(self):
        if self._sequence is None:
            self._sequence = self._view.sequences[self.index]
        return self._sequence

    @sequence.setter
    def sequence(self, value):
        self._sequence = value

    @property
    def attempts(self):
        if self._attempts is None:
            self._attempts = self._view.attempts[self.index]
        return self._attempts

    @attempts.setter
    def attempts(self, value):
        self._attempts = value

    def json(self):
        """The payload parsed as JSON (parsed on first call, then kept).
        Mutating the result is fine: emit it (or the row) to send the
        changed row on."""
        if self._json is None:
            payload = self._payload
            if payload is None or self._edits:
                payload = self.payload
            self._json = _parse_json(payload)
        return self._json

    # The field reads below repeat one lookup inline rather than share a
    # helper: a Python call per field read was most of what they cost.

    def get(self, name, default=None):
        """The top-level field `name` of the payload's JSON object, or
        `default` when it has none."""
        edits = self._edits
        if edits is not None and name in edits:
            return edits[name]
        if self._json is None and not self._local:
            view = self._view
            slot = view.slots.get(name)
            if slot is None:
                slot = view.ask(name)
            at = view.width * self.index
            places = view.places
            if slot >= 0 and places[at] != _NOT_READ:
                start = places[at + 1 + 2 * slot]
                if start == _NOT_READ:
                    return default
                base = view.nums[8 * self.index + 4]
                return self._field(name, view.data, base + start, base + places[at + 2 + 2 * slot])
        return _object(self).get(name, default)

    def __contains__(self, name):
        edits = self._edits
        if edits is not None and name in edits:
            return True
        if self._json is None and not self._local:
            view = self._view
            slot = view.slots.get(name)
            if slot is None:
                slot = view.ask(name)
            at = view.width * self.index
            places = view.places
            if slot >= 0 and places[at] != _NOT_READ:
                return places[at + 1 + 2 * slot] != _NOT_READ
        return name in _object(self)

    def __getitem__(self, name):
        value = self.get(name, _ABSENT)
        if value is _ABSENT:
            raise KeyError(name)
        return value

    def __setitem__(self, name, value):
        if type(name) is not str:
            raise TypeError("a row's field name is a str, not %s" % type(name).__name__)
        if self._json is not None:
            _object(self)[name] = value
        if self._edits is None:
            self._edits = {name: value}
        else:
            self._edits[name] = value

    def _field(self, name, data, start, end):
        """The value at `data[start:end]` as Python's JSON reads it. An
        object or array is kept as an edit: changing it changes the row."""
        first = data[start]
        if first == 34:  # a string
            text = data[start + 1:end - 1]
            if 92 not in text:  # no backslash: its UTF-8 is its text
                return text.decode("utf-8")
            return _parse_json(data[start:end])
        if first == 116:
            return True
        if first == 102:
            return False
        if first == 110:
            return None
        if first == 123 or first == 91:
            value = _parse_json(data[start:end])
            self[name] = value
            return value
        text = data[start:end]
        return float(text) if text.strip(b"-0123456789") else int(text)

    def _edited(self):
        """`_payload` with `_edits` in: each set field's value replaced in
        place, new ones added before the closing brace, the rest of the
        bytes untouched. A payload whose fields the batch did not place is
        parsed, changed and written whole."""
        edits = self._edits
        if self._local or self._json is not None:
            return _payload_bytes(_with_edits(self._original(), edits))
        view = self._view
        if len(edits) == 1:
            # One field set (the usual case): two slices and the new bytes.
            ((name, value),) = edits.items()
            slot = view.slots.get(name)
            if slot is None:
                slot = view.ask(name)
            places = view.places
            at = view.width * self.index
            closing = places[at]
            if slot >= 0 and closing != _NOT_READ:
                if value is True:
                    encoded = b"true"
                elif value is False:
                    encoded = b"false"
                elif value is None:
                    encoded = b"null"
                else:
                    encoded = _json_dump(value).encode("utf-8")
                data = view.data
                nums = view.nums
                base = nums[8 * self.index + 4]
                end = base + nums[8 * self.index + 5]
                start = places[at + 1 + 2 * slot]
                if start != _NOT_READ:
                    return b"".join((data[base:base + start], encoded,
                                     data[base + places[at + 2 + 2 * slot]:end]))
                key = _FIELD_KEYS.get(name)
                if key is None:
                    key = _FIELD_KEYS[name] = b"," + _json_dump(name).encode("utf-8") + b":"
                closing += base
                before = data[closing - 1]
                if before == 123 or (before in _JSON_SPACE_BYTES
                                     and data[base:closing].rstrip(_JSON_SPACE_BYTES).endswith(b"{")):
                    key = key[1:]  # the object's first member: no comma
                return b"".join((data[base:closing], key, encoded, data[closing:end]))
        for name in edits:
            if name not in view.slots:
                view.ask(name)
        slots = view.slots
        places = view.places
        at = view.width * self.index
        closing = places[at]
        added = b""
        replaced = None
        for name, value in edits.items():
            slot = slots[name]
            if slot < 0 or closing == _NOT_READ:
                return _payload_bytes(_with_edits(self._original(), edits))
            if value is True:
                encoded = b"true"
            elif value is False:
                encoded = b"false"
            elif value is None:
                encoded = b"null"
            else:
                encoded = _json_dump(value).encode("utf-8")
            start = places[at + 1 + 2 * slot]
            if start == _NOT_READ:
                key = _FIELD_KEYS.get(name)
                if key is None:
                    key = _FIELD_KEYS[name] = b"," + _json_dump(name).encode("utf-8") + b":"
                added += key + encoded
            elif replaced is None:
                replaced = [(start, places[at + 2 + 2 * slot], encoded)]
            else:
                replaced.append((start, places[at + 2 + 2 * slot], encoded))
        # Cut from the batch's bytes: the places count from the payload's start.
        data = view.data
        base = view.nums[8 * self.index + 4]
        closing += base
        end = base + view.nums[8 * self.index + 5]
        if added:
            before = data[closing - 1]
            if before == 123 or (before in _JSON_SPACE_BYTES
                                 and data[base:closing].rstrip(_JSON_SPACE_BYTES).endswith(b"{")):
                added = added[1:]  # the object's first member: no comma
        if replaced is None:
            return data[base:closing] + added + data[closing:end]
        pieces = []
        done = base
        for start, stop, encoded in sorted(replaced):
            pieces.append(data[done:base + start])
            pieces.append(encoded)
            done = base + stop
        pieces.append(data[done:closing])
        pieces.append(added)
        pieces.append(data[closing:end])
        return b"".join(pieces)

    def _original(self):
        """The payload before `_edits`."""
        if self._payload is None:
            self._payload = self._view.payload(self.index)
        return self._payload


class _View:
    """A packed batch as componentize-py hands it over, read in place: a
    row's pieces are sliced out of `data` only when asked for."""

    __slots__ = ("data", "nums", "heads", "sequences", "attempts",
                 "names", "slots", "places", "width")

    def __init__(self, batch):
        self.data = batch.data
        # One cast per list, no copy: indexing reads the batch's bytes.
        self.nums = _numbers(batch.rows, _U32)
        self.heads = _numbers(batch.headers, _U32)
        self.sequences = _numbers(batch.sequences, _U64)
        self.attempts = _numbers(batch.attempts, _U32)
        # The rows' JSON fields, placed by the host (`json-members`) when
        # a plugin first reads one: a name's slot, and per row its places.
        self.names = None
        self.slots = {}
        self.places = _NO_PLACES
        self.width = 0

    def ask(self, name):
        """`name`'s slot once the host has placed it (with every field this
        plugin read before, so a batch usually asks once), or -1 when the
        host cannot: the rows are then parsed whole."""
        if type(name) is not str:
            return -1
        host = _host()
        if self.names is None:
            self.names = list(_FIELD_NAMES)
        if name not in self.names:
            self.names.append(name)
            if len(_FIELD_NAMES) < _MAX_FIELD_NAMES:
                _FIELD_NAMES.append(name)
        if host is None or len(self.names) > _MAX_FIELD_NAMES:
            self.slots[name] = -1
            return -1
        try:
            places = host.json_members(self.names)
        except Exception:  # refused: the rows are parsed whole instead
            self.slots[name] = -1
            return -1
        self.places = _numbers(places, _U32)
        self.width = 1 + 2 * len(self.names)
        self.slots = {n: k for k, n in enumerate(self.names)}
        return self.slots[name]

    def text(self, row, field):
        at = 8 * row + field
        offset = self.nums[at]
        return self.data[offset:offset + self.nums[at + 1]].decode("utf-8")

    def payload(self, row):
        at = 8 * row + 4
        offset = self.nums[at]
        return bytes(self.data[offset:offset + self.nums[at + 1]])

    def header_span(self, row):
        return self.nums[8 * row + 6], self.nums[8 * row + 7]

    def headers(self, row):
        first, count = self.header_span(row)
        data, heads = self.data, self.heads
        headers = []
        for h in range(first, first + count):
            no, nl, vo, vl = heads[4 * h: 4 * h + 4]
            headers.append((data[no:no + nl].decode("utf-8"), data[vo:vo + vl].decode("utf-8")))
        return headers


def _packed_rows(batch):
    """The rows of a packed `batch`, as lazy `Row` views of it."""
    view = _View(batch)
    new = Row.__new__
    rows = []
    append = rows.append
    for i in range(len(view.sequences)):
        row = new(Row)
        row._tenant = row._table = row._payload = row._headers = None
        row._sequence = row._attempts = row._json = row._edits = None
        row._local = False
        row._view = view
        row.index = i
        append(row)
    return rows


# A place `json-members` has no offset for: an absent field, a row not read.
_NOT_READ = 0xFFFFFFFF
_NO_PLACES = memoryview(b"").cast("B")
# The most field names one batch asks the host to place (the WIT's bound),
# and the names this plugin has read so far, asked for every batch.
_MAX_FIELD_NAMES = 64
_FIELD_NAMES = []
# `,"name":` of each field name set on a row, written once.
_FIELD_KEYS = {}
_JSON_SPACE_BYTES = b" \t\n\r"
_ABSENT = object()


def _object(row):
    """`row.json()`, which must be an object for its fields to be read."""
    data = row.json()
    if type(data) is not dict:
        raise TypeError("the row's payload is JSON %s, not an object" % type(data).__name__)
    return data


def _with_edits(payload, edits):
    """The JSON value to write for `payload` with `edits` set in it."""
    data = _parse_json(payload)
    if type(data) is not dict:
        raise TypeError("the row's payload is JSON %s, not an object" % type(data).__name__)
    data.update(edits)
    return data


# JSON with the standard library's C scanner and encoder called directly:
# `json.loads` and `json.dumps` add a Python-level layer per call (encoding
# detection, a regex per end, an encoder built per call) that cost as much
# as the parse itself for a row-sized object. Anything off the fast path
# goes through `json.loads` for its exact behaviour and errors.
_json_scan = json.scanner.make_scanner(json.JSONDecoder())
_JSON_SPACE = " \t\n\r"


def _parse_json(payload):
    try:
        text = payload.decode("utf-8")
        value, end = _json_scan(text, 0)
    except (UnicodeDecodeError, StopIteration, AttributeError):
        return json.loads(payload)
    if end != len(text) and text[end:].strip(_JSON_SPACE):
        return json.loads(payload)
    return value


_json_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _make_json_dump():
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if c_make_encoder is not None:
        try:
            # No circular-reference markers: a cycle still fails (RecursionError).
            encode = c_make_encoder(None, _json_encoder.default, json.encoder.encode_basestring,
                                    None, ":", ",", False, False, True)
            join = "".join
            dump = lambda value: join(encode(value, 0))  # noqa: E731
            if dump({"a": [1, "é", None]}) == '{"a":[1,"é",null]}':
                return dump
        except Exception:
            pass
    return _json_encoder.encode


_json_dump = _make_json_dump()


class Out:
    """A row to emit. `payload` is bytes, str, or anything else (written as
    compact JSON). `table` None keeps the input row's table; `headers` None
    keeps the input row's headers, a list of (name, value) replaces them."""

    __slots__ = ("payload", "table", "headers")

    def __init__(self, payload, table=None, headers=None):
        self.payload = _payload_bytes(payload)
        self.table = table
        self.headers = None if headers is None else list(headers)


def _payload_bytes(payload):
    kind = type(payload)
    if kind is dict or kind is list:
        return _json_dump(payload).encode("utf-8")
    if kind is bytes:
        return payload
    if kind is Row:
        return payload._emitted()
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload)
    if isinstance(payload, str):
        return payload.encode("utf-8")
    return _json_dump(payload).encode("utf-8")


# ---------------------------------------------------------------- outcomes


class Outcome:
    """What was decided for one row: build it with ok(), emit(), drop(),
    retry() or dead_letter()."""

    __slots__ = ("code", "rows", "argument", "reason")

    def __init__(self, code, rows=(), argument=0, reason=""):
        self.code = code
        self.rows = rows
        self.argument = argument
        self.reason = reason

    def describe(self):
        """The outcome as the scaffolds' `expected.ndjson` writes it."""
        if self.code == _OK:
            return {"outcome": "ok"}
        if self.code == _RETRY:
            return {"outcome": "retry", "after_ms": self.argument}
        if self.code == _DEAD_LETTER:
            return {"outcome": "dead_letter", "reason": self.reason}
        if not self.rows:
            return {"outcome": "drop"}
        rows = []
        for out in self.rows:
            row = {"payload": out.payload.decode("utf-8", "replace")}
            if out.table is not None:
                row["table"] = out.table
            if out.headers is not None:
                row["headers"] = [list(h) for h in out.headers]
            rows.append(row)
        return {"outcome": "emit", "rows": rows}

    def __repr__(self):
        return "Outcome(%r)" % (self.describe(),)


_OK_OUTCOME = Outcome(_OK)
_new_out = Out.__new__
_new_outcome = Outcome.__new__


def ok():
    """Pass the row on unchanged (for a sink: it was delivered)."""
    return _OK_OUTCOME


def emit(*rows):
    """Replace the row by `rows`, in order: each an `Out`, or a payload
    (bytes, str, a `Row` as changed, or a value written as JSON) keeping
    table and headers."""
    if len(rows) == 1 and rows[0].__class__ is Row:
        # The transform's usual answer, without the general path's calls.
        row = rows[0]
        out = _new_out(Out)
        out.payload = row._apply_edits() if row._edits and row._json is None else row._emitted()
        out.table = out.headers = None
        outcome = _new_outcome(Outcome)
        outcome.code = _EMIT
        outcome.rows = [out]
        outcome.argument = 0
        outcome.reason = ""
        return outcome
    return Outcome(_EMIT, [r if isinstance(r, Out) else Out(r) for r in rows])


def drop():
    """Drop the row: nothing is emitted and it is acked."""
    return Outcome(_EMIT, [])


def retry(after_ms):
    """Try the row again after `after_ms` milliseconds."""
    return Outcome(_RETRY, argument=int(after_ms))


def dead_letter(reason):
    """Give up on the row: it goes to the dead-letter stream with `reason`."""
    return Outcome(_DEAD_LETTER, reason=str(reason))


# ---------------------------------------------------------------- policies


def admit():
    """Budget: store the request's rows."""
    return ("admit",)


def throttle(after_ms):
    """Budget: not now; the client is told to retry after `after_ms` (HTTP 429)."""
    return ("throttle", int(after_ms))


def reject(reason):
    """Budget: never, as sent (HTTP 403 with `reason`)."""
    return ("reject", str(reason))


def default_route():
    """Router: weir's default route (a hash of tenant and table)."""
    return ("default",)


def to(partition, shard=0):
    """Router: this unit, which must exist in the topology."""
    return ("to", int(partition), int(shard))


def by_key():
    """Router, from `route_table`: route each row by its key (`route_key`)."""
    return ("by-key",)


class Request:
    """One ingest request a budget decides: tenant, table, rows, bytes,
    usage (queued_rows, queued_bytes, recent_rows, recent_bytes, window_ms)
    and settings (the tenant's settings parsed, or None)."""

    __slots__ = ("tenant", "table", "rows", "bytes", "usage", "settings")

    def __init__(self, tenant, table, rows, bytes, usage, settings):
        self.tenant = tenant
        self.table = table
        self.rows = rows
        self.bytes = bytes
        self.usage = usage
        self.settings = settings


# ---------------------------------------------------------------- plugins


class Plugin:
    """What every world shares: `init(settings)` gets the plugin's settings
    table parsed (a dict). Raise to refuse the settings: the message is the
    reason weir prints."""

    def init(self, settings):
        pass


class Transform(Plugin):
    """A pipeline step. Override `row(row)` (one outcome per row), or
    `batch(rows)` to see the whole batch (a list of outcomes, in order).
    An exception in `row` dead-letters that row, naming it and its line."""

    world = "transform"

    def row(self, row):
        return ok()

    def batch(self, rows):
        return _per_rows(self.row, rows)


class Sink(Plugin):
    """The last step. Override `row(row)` (ok() once delivered, retry() or
    dead_letter()), or `batch(rows)`. An exception dead-letters the row."""

    world = "sink"

    def row(self, row):
        return ok()

    def batch(self, rows):
        return _per_rows(self.row, rows)


class Budget(Plugin):
    """Override `admit(request)`: return admit(), throttle(ms) or reject(reason)."""

    world = "budget"

    def admit(self, request):
        return admit()


class Router(Plugin):
    """Override `route_table(topology, tenant, table)` (a route, or by_key())
    and, for by-key tables, `route_key(topology, tenant, table, key)`.
    `topology` has `partitions` and `shards`."""

    world = "router"

    def route_table(self, topology, tenant, table):
        return default_route()

    def route_key(self, topology, tenant, table, key):
        return default_route()


def _per_row(decide, row):
    """`decide(row)`, an exception becoming the row's dead letter."""
    return _per_rows(decide, (row,))[0]


def _per_rows(decide, rows):
    """`decide(row)` for each row, in one loop (a call per row less: this
    runs for every row of every batch); an exception becomes that row's
    dead letter."""
    outcomes = []
    append_outcome = outcomes.append
    for row in rows:
        try:
            outcome = decide(row)
        except Exception as error:  # a bad row must not take its batch down
            _print_exception()
            outcome = dead_letter(_short_reason(error))
        else:
            if outcome.__class__ is not Outcome:
                outcome = _checked(outcome)
        append_outcome(outcome)
    return outcomes


def _checked(outcome):
    if outcome is None:
        return _OK_OUTCOME
    if not isinstance(outcome, Outcome):
        raise TypeError("a row's outcome must be ok(), emit(...), drop(), retry(ms) "
                        "or dead_letter(reason), not %r" % (outcome,))
    return outcome


def _short_reason(error):
    """`KeyError: 'id' (app.py line 9)`: the exception and the innermost
    line of the plugin's own code that raised it."""
    where = ""
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        if not frame.filename.startswith(_NOT_THE_PLUGIN):
            where = " (%s line %d)" % (frame.filename.rsplit("/", 1)[-1], frame.lineno)
            break
    message = str(error)
    if isinstance(error, KeyError) and error.args:
        message = repr(error.args[0])
    text = type(error).__name__ + (": " + message if message else "")
    return text[:400] + where


# Frames of these files are not the plugin's own: the SDK and the standard
# library (json lives there), so that a reason names the plugin's line.
_NOT_THE_PLUGIN = (__file__.rsplit("/", 1)[0] + "/", json.__file__.rsplit("/", 2)[0] + "/")


def _print_exception():
    # The host quotes the tail of a plugin's stderr when it traps.
    traceback.print_exc(file=sys.stderr)
    sys.stderr.flush()


def _print_frames(error):
    # For an error whose message the host already reports (init's `err`):
    # only where it happened, so the message is said once.
    sys.stderr.write("Traceback (most recent call last):\n")
    traceback.print_tb(error.__traceback__, file=sys.stderr)
    sys.stderr.flush()


def parse_settings(text):
    """The settings JSON `init` receives, as a dict (an empty string is {})."""
    if not text or not text.strip():
        return {}
    settings = json.loads(text)
    if not isinstance(settings, dict):
        raise ValueError("settings: expected a JSON object")
    return settings


# ---------------------------------------------------------------- host


class _Log:
    """Structured log lines, attributed to the plugin by the host; outside
    wasm they go to stderr."""

    def _send(self, level, message):
        host = _host()
        if host is None:
            print("%s: %s" % (level, message), file=sys.stderr)
        else:
            host.log(getattr(host.Level, level.upper()), str(message))

    def trace(self, message):
        self._send("trace", message)

    def debug(self, message):
        self._send("debug", message)

    def info(self, message):
        self._send("info", message)

    def warn(self, message):
        self._send("warn", message)

    def error(self, message):
        self._send("error", message)


log = _Log()

# Counters added outside wasm (a plugin's own tests read them here).
counters = {}


def count(name, delta=1):
    """Adds `delta` to the plugin's counter `name` (a metric of the host)."""
    host = _host()
    if host is None:
        counters[name] = counters.get(name, 0) + delta
    else:
        host.add_counter(name, int(delta))


class StateError(Exception):
    """A `state` call the host refused: a write past a `grants.state` limit,
    or a plugin without the grant. Raised from `row`, it dead-letters the
    row with the host's reason."""


def _bytes(value):
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


class _State:
    """Durable state (`grants.state` in the TOML): this plugin's keys for a
    row's tenant and table, kept across batches, crashes and handovers.
    Every call names the row it is about; keys and values are bytes (a str
    is written as UTF-8). A batch's writes are stored with its acks (see
    plugins/README.md, "Durable state"). Outside wasm (a plugin's own
    tests) it is a dict per tenant and table, in `state.memory`."""

    def __init__(self):
        self.memory = {}

    def _scope(self, row):
        return self.memory.setdefault((row.tenant, row.table), {})

    def get(self, row, key):
        """The value of `key` (bytes), or None."""
        api = _state_api()
        if api is None:
            return self._scope(row).get(_bytes(key))
        return _state_call(api.get, row.index, _bytes(key))

    def set(self, row, key, value):
        """Sets `key`; raises StateError past the grant's limits."""
        api = _state_api()
        if api is None:
            self._scope(row)[_bytes(key)] = _bytes(value)
        else:
            _state_call(api.set, row.index, _bytes(key), _bytes(value))

    def delete(self, row, key):
        api = _state_api()
        if api is None:
            self._scope(row).pop(_bytes(key), None)
        else:
            _state_call(api.delete, row.index, _bytes(key))

    def list(self, row, prefix=b""):
        """Every (key, value) whose key starts with `prefix`, in key order."""
        api = _state_api()
        prefix = _bytes(prefix)
        if api is None:
            scope = self._scope(row)
            return [(k, scope[k]) for k in sorted(scope) if k.startswith(prefix)]
        return [(bytes(k), bytes(v)) for k, v in _state_call(api.list, row.index, prefix)]


state = _State()


def _state_call(function, *args):
    from componentize_py_types import Err

    try:
        return function(*args)
    except Err as err:
        raise StateError(str(err.value)) from None


_STATE = []


def _state_api():
    """The generated `state` import, or None outside wasm (never a silent
    stand-in inside it)."""
    if not _STATE:
        if sys.platform != "wasi":
            _STATE.append(None)
        else:
            try:
                from wit_world.imports import state as api
            except ImportError:
                raise StateError("this plugin's world has no state (only transforms and sinks do)") from None
            _STATE.append(api)
    return _STATE[0]


_HOST = []


def _host():
    """The generated host imports, or None outside wasm."""
    if not _HOST:
        try:
            from wit_world.imports import host
        except ImportError:
            host = None
        if host is not None and sys.platform != "wasi":
            host = None
        _HOST.append(host)
    return _HOST[0]


class HttpError(Exception):
    """Why one request of `http.fetch_all` has no response. `kind` is
    "refused" (never sent: outside `grants.http`, or malformed), "timeout"
    or "failed" (sent, no response); `str()` is the reason: `refused: …`,
    `timed out`, `failed: …`. Returned in the list, not raised: raise it
    from `row` to dead-letter the row with it."""

    def __init__(self, kind, reason=""):
        self.kind = kind
        self.reason = reason
        super().__init__("timed out" if kind == "timeout" else "%s: %s" % (kind, reason))


class Response:
    """One response of `http.fetch_all`: `status`, `headers` ((name, value)
    pairs), `body` (bytes)."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status, headers=(), body=b""):
        self.status = status
        self.headers = list(headers)
        self.body = bytes(body)

    def json(self):
        return json.loads(self.body)

    def text(self):
        return self.body.decode("utf-8")

    def header(self, name, default=None):
        """The first value of header `name` (compared case-insensitively)."""
        for n, v in self.headers:
            if n.lower() == name.lower():
                return v
        return default

    def __repr__(self):
        return "Response(status=%r, body=%r)" % (self.status, self.body[:80])


class _HttpRequest:
    __slots__ = ("method", "url", "headers", "body")

    def __init__(self, method, url, headers=(), body=b""):
        self.method = method
        self.url = url
        self.headers = [(str(n), str(v)) for n, v in headers]
        self.body = _bytes(body)


class _Http:
    """Many outbound HTTP requests at once (`grants.http` in the TOML; the
    WIT `http-batch` interface): `fetch_all` sends them together and
    returns when every one is done, a `Response` or an `HttpError` per
    request, in order. At most `http_max_in_flight` are in flight at once;
    `timeout_ms` bounds each from when it is sent, and the call's deadline
    all of them. Outside wasm (a plugin's own tests) a function given to
    `respond_with(fn)` answers each request (`fn(request)` returns a
    `Response` or an `HttpError`); without one every request is refused."""

    def __init__(self):
        self.responder = None

    def request(self, method, url, headers=(), body=b""):
        return _HttpRequest(method, url, headers, body)

    def get(self, url, headers=()):
        return _HttpRequest("GET", url, headers)

    def post(self, url, body, content_type="application/json", headers=()):
        return _HttpRequest("POST", url, [("content-type", content_type)] + list(headers), body)

    def respond_with(self, responder):
        self.responder = responder

    def fetch_all(self, requests, timeout_ms=0, dedupe=False):
        """A `Response` or an `HttpError` per request, in order. `dedupe`:
        identical GETs of this call are sent once and share the answer."""
        requests = list(requests)
        api = _http_api()
        if api is None:
            if self.responder is None:
                return [HttpError("refused", "no host outside wasm: answer with weir_plugin.http.respond_with")
                        for _ in requests]
            return [self.responder(request) for request in requests]
        from componentize_py_types import Ok

        results = api.fetch_all(
            [api.Request(r.method, r.url, r.headers, r.body) for r in requests],
            api.FetchOptions(int(timeout_ms), bool(dedupe)))
        answers = []
        for result in results:
            if isinstance(result, Ok):
                answer = result.value
                answers.append(Response(answer.status, answer.headers, answer.body))
                continue
            error = result.value
            if isinstance(error, api.FetchError_Timeout):
                answers.append(HttpError("timeout"))
            elif isinstance(error, api.FetchError_Refused):
                answers.append(HttpError("refused", error.value))
            else:
                answers.append(HttpError("failed", error.value))
        return answers


http = _Http()

_HTTP = []


def _http_api():
    """The generated `http-batch` import, or None outside wasm."""
    if not _HTTP:
        if sys.platform != "wasi":
            _HTTP.append(None)
        else:
            try:
                from wit_world.imports import http_batch as api
            except ImportError:
                raise HttpError("refused", "this plugin's world has no http-batch (only transforms and sinks do)") from None
            _HTTP.append(api)
    return _HTTP[0]


# ---------------------------------------------------------------- packing


def unpack(batch):
    """The rows of a packed `batch`, as `Row` objects (views of the batch:
    each piece is decoded when first read)."""
    return _packed_rows(batch)


def pack_transformed(rows, outcomes):
    """The fields of a `transformed` record for `outcomes` of `rows`:
    (data, outcomes, emitted, headers, reasons). The bytes are gathered
    as pieces and joined once."""
    if len(outcomes) != len(rows):
        raise ValueError("%d outcomes for %d rows" % (len(outcomes), len(rows)))
    pieces = []
    put_piece = pieces.append
    size = 0
    codes = []
    emitted = []
    header_nums = []
    reasons = []

    def put_headers(pairs):
        nonlocal size
        first = len(header_nums) // 4
        for name, value in pairs:
            name = name.encode("utf-8")
            value = value.encode("utf-8")
            header_nums.extend((size, len(name), size + len(name), len(value)))
            pieces.append(name)
            pieces.append(value)
            size += len(name) + len(value)
        return first, len(pairs)

    for row, outcome in zip(rows, outcomes):
        code = outcome.code
        if code == _EMIT:
            inherited = None
            outs = outcome.rows
            if len(outs) == 1:
                out = outs[0]
                if out.table is None and out.headers is None:
                    # One row with the input's table and headers, as most
                    # answers are: fewer steps than the general loop below.
                    view = row._view
                    if row._headers is None and view is not None and view.nums[8 * row.index + 7] == 0:
                        first, count = len(header_nums) // 4, 0
                    else:
                        first, count = put_headers(row.headers)
                    payload = out.payload
                    put_piece(payload)
                    emitted.extend((0, _SAME_TABLE, size, len(payload), first, count))
                    size += len(payload)
                    codes.extend((_EMIT, 1))
                    continue
            for out in outs:
                if out.table is None:
                    table_at, table_len = 0, _SAME_TABLE
                else:
                    table = out.table.encode("utf-8")
                    table_at, table_len = size, len(table)
                    put_piece(table)
                    size += table_len
                payload = out.payload
                payload_at = size
                put_piece(payload)
                size += len(payload)
                if out.headers is not None:
                    headers = put_headers(out.headers)
                else:
                    # Every row emitted for one input shares its headers' bytes.
                    if inherited is None:
                        view = row._view
                        # A row read from a batch without headers (the common
                        # case) has none to copy: no need to decode them.
                        if row._headers is None and view is not None and view.nums[8 * row.index + 7] == 0:
                            inherited = (len(header_nums) // 4, 0)
                        else:
                            inherited = put_headers(row.headers)
                    headers = inherited
                emitted.extend((table_at, table_len, payload_at, len(payload), headers[0], headers[1]))
            codes.extend((_EMIT, len(outcome.rows)))
        elif code == _DEAD_LETTER:
            codes.extend((_DEAD_LETTER, len(reasons)))
            reasons.append(outcome.reason)
        else:
            codes.extend((code, outcome.argument))
    return b"".join(pieces), _packed(codes), _packed(emitted), _packed(header_nums), reasons


def pack_delivered(rows, outcomes):
    """The fields of a `delivered` record: (outcomes, reasons)."""
    if len(outcomes) != len(rows):
        raise ValueError("%d outcomes for %d rows" % (len(outcomes), len(rows)))
    codes = []
    reasons = []
    for outcome in outcomes:
        if outcome.code == _DEAD_LETTER:
            codes.extend((_DEAD_LETTER, len(reasons)))
            reasons.append(outcome.reason)
        elif outcome.code == _EMIT:
            raise TypeError("a sink cannot emit rows: return ok(), retry(ms) or dead_letter(reason)")
        else:
            codes.extend((outcome.code, outcome.argument))
    return _packed(codes), reasons


# ---------------------------------------------------------------- export


def export(plugin_class):
    """The `WitWorld` class componentize-py instantiates for `plugin_class`
    (a subclass of Transform, Sink, Budget or Router)."""
    world = getattr(plugin_class, "world", None)
    glue = {"transform": _TransformWorld, "sink": _SinkWorld,
            "budget": _BudgetWorld, "router": _RouterWorld}.get(world)
    if glue is None:
        raise TypeError("%r is not a Transform, Sink, Budget or Router" % (plugin_class,))
    if world in ("transform", "sink"):
        # componentize-py keeps only the modules imported while it builds
        # (it snapshots the interpreter after importing the app): the
        # `state` bindings are imported now, for plugins that use them.
        try:
            import wit_world.imports.state  # noqa: F401
        except ImportError:
            pass
        try:
            import wit_world.imports.http_batch  # noqa: F401
        except ImportError:
            pass
    _PLUGIN.clear()
    _PLUGIN.append(plugin_class)
    return glue


# [plugin class, its instance once init succeeded]
_PLUGIN = []


def _instance():
    if len(_PLUGIN) < 2:
        raise RuntimeError("weir called the plugin before init")
    return _PLUGIN[1]


def _guarded(call):
    """Runs `call`; an exception prints its traceback before it traps the
    plugin, so that the host can quote it."""
    try:
        return call()
    except BaseException:
        _print_exception()
        raise


class _World:
    def init(self, settings):
        from componentize_py_types import Err

        try:
            plugin = _PLUGIN[0]()
            plugin.init(parse_settings(settings))
        except Exception as error:
            _print_frames(error)
            message = str(error) if isinstance(error, ValueError) and str(error) else None
            raise Err(message or "%s: %s" % (type(error).__name__, error))
        del _PLUGIN[1:]
        _PLUGIN.append(plugin)
        # Everything alive now (the interpreter's snapshot: every module,
        # the plugin) is kept out of the cycle collector's scans: with it
        # in, each collection walked megabytes of objects that never die,
        # most of a row's cost, and the heap grew call after call.
        gc.freeze()


_TYPES = []


def _wit_types():
    """weir's `types` interface: componentize-py names it `weir_plugin_types`
    when the world imports another `types` too (wasi:http's). Looked up
    once: a failed import per call (the first name, in most worlds) cost
    more than a small batch's rows."""
    if not _TYPES:
        try:
            from wit_world.imports import weir_plugin_types as types
        except ImportError:
            from wit_world.imports import types
        _TYPES.append(types)
    return _TYPES[0]


class _TransformWorld(_World):
    def transform(self, rows):
        def run():
            Transformed = _wit_types().Transformed

            # The cycle collector runs between batches, not within one: a
            # batch's rows make no cycles, and its passes cost a row's time.
            # (A plugin that turned it off keeps it off.)
            collecting = gc.isenabled()
            gc.disable()
            try:
                unpacked = unpack(rows)
                outcomes = _instance().batch(unpacked)
                return Transformed(*pack_transformed(unpacked, list(outcomes)))
            finally:
                if collecting:
                    gc.enable()

        return _guarded(run)


class _SinkWorld(_World):
    def deliver(self, rows):
        def run():
            Delivered = _wit_types().Delivered

            unpacked = unpack(rows)
            outcomes = _instance().batch(unpacked)
            return Delivered(*pack_delivered(unpacked, list(outcomes)))

        return _guarded(run)


class _BudgetWorld(_World):
    def admit(self, request):
        def run():
            from wit_world.imports import policy

            settings = request.tenant_settings
            decided = _instance().admit(Request(
                request.tenant, request.table, request.rows, request.bytes, request.usage,
                None if settings is None else parse_settings(settings)))
            if decided is None or decided[0] == "admit":
                return policy.Decision_Admit()
            if decided[0] == "throttle":
                return policy.Decision_Throttle(decided[1])
            if decided[0] == "reject":
                return policy.Decision_Reject(decided[1])
            raise TypeError("a budget returns admit(), throttle(ms) or reject(reason), not %r" % (decided,))

        return _guarded(run)


def _route(policy, route):
    if route is None or route[0] == "default":
        return policy.Route_DefaultRoute()
    if route[0] == "to":
        return policy.Route_To(policy.Unit(route[1], route[2]))
    raise TypeError("a route is default_route() or to(partition, shard), not %r" % (route,))


class _RouterWorld(_World):
    def route_table(self, topology, tenant, table):
        def run():
            from wit_world.imports import policy

            route = _instance().route_table(topology, tenant, table)
            if route is not None and route[0] == "by-key":
                return policy.TableRoute_ByKey()
            return policy.TableRoute_Fixed(_route(policy, route))

        return _guarded(run)

    def route_keys(self, topology, tenant, table, keys):
        def run():
            from wit_world.imports import policy

            plugin = _instance()
            return [_route(policy, None if key is None else plugin.route_key(topology, tenant, table, key))
                    for key in keys]

        return _guarded(run)
