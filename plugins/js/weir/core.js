// weir plugins in JavaScript: the part that needs no WIT import, so that it
// also runs in Node (test.mjs). `index.js` adds the host imports and the
// exports componentize-js binds to `weir:plugin@0.3.0`.
//
// A plugin sees rows as `Row` objects and answers each with ok(), emit(...),
// drop(), retry(ms) or deadLetter(reason); the packed batches (offsets,
// outcome codes, the "same table" sentinel, reason indexes, each list of
// numbers a Uint8Array of little-endian u32s) stay in here.

const OK = 0, EMIT = 1, RETRY = 2, DEAD_LETTER = 3;
// An emitted row's table length meaning "the input row's table".
const SAME_TABLE = 0xffffffff;

// Typed arrays read in the machine's byte order; the WIT's numbers are
// little-endian, as wasm and every machine Node runs on here are.
if (new Uint8Array(new Uint32Array([1]).buffer)[0] !== 1) {
  throw new Error("weir's JS SDK needs a little-endian machine");
}

/** The u32s (or, with BigUint64Array, u64s) packed in `bytes`, a view
 * without a copy when they are aligned; copied when they are not. */
function numbers(bytes, Type = Uint32Array) {
  const width = Type.BYTES_PER_ELEMENT;
  const count = Math.floor(bytes.byteLength / width);
  if (bytes.byteOffset % width === 0) return new Type(bytes.buffer, bytes.byteOffset, count);
  return new Type(bytes.slice(0, count * width).buffer);
}

/** u32s as the bytes the WIT carries: a view of the same buffer. */
function asBytes(words) {
  return new Uint8Array(words.buffer, words.byteOffset, words.byteLength);
}

const utf8 = new TextDecoder();
const encoder = new TextEncoder();

/** One input row: `payload` is its bytes as sent; `json()` parses them once.
 * A row handed over by weir is a view of its packed batch: each field is
 * decoded when first read, so a plugin pays only for what it looks at. */
export class Row {
  // `view` (internal): the packed batch a row of weir's is read from.
  constructor(tenant, table, payload, headers, sequence, attempts, index = 0, view = undefined) {
    this._tenant = tenant;
    this._table = table;
    this._payload = payload;
    this._view = view;
    this._headers = view === undefined ? (headers ?? []) : undefined;
    this._sequence = view === undefined ? (sequence ?? 1n) : undefined;
    this._attempts = view === undefined ? (attempts ?? 1) : undefined;
    /** Its place in the batch: what `state` calls name it by. */
    this.index = index;
    this._json = undefined;
  }

  get tenant() { return this._tenant ??= this._view.text(this.index, 0); }
  set tenant(value) { this._tenant = value; }
  get table() { return this._table ??= this._view.text(this.index, 2); }
  set table(value) { this._table = value; }
  get payload() { return this._payload ??= this._view.bytes(this.index, 4); }
  set payload(value) { this._payload = value; this._json = undefined; }
  /** [name, value] pairs in order; a name may repeat. */
  get headers() { return this._headers ??= this._view.headers(this.index); }
  set headers(value) { this._headers = value; }
  get sequence() { return this._sequence ??= this._view.sequences[this.index]; }
  set sequence(value) { this._sequence = value; }
  get attempts() { return this._attempts ??= this._view.attempts[this.index]; }
  set attempts(value) { this._attempts = value; }

  /** The payload parsed as JSON (parsed on first call, then kept). */
  json() {
    return this._json ??= JSON.parse(this.text());
  }

  /** The payload as UTF-8 text. */
  text() {
    // The batch's own payload, cut from its text when that is ASCII: what
    // `json()` reads for every row, so without a call per step.
    if (this._payload === undefined) {
      const view = this._view;
      if (view !== undefined) {
        const whole = view.whole;
        if (!whole) return view.text(this.index, 4);
        const at = 8 * this.index + 4;
        const offset = view.nums[at];
        return whole.substring(offset, offset + view.nums[at + 1]);
      }
    }
    return utf8.decode(this.payload);
  }

  /** The first value of header `name` (exact match). */
  header(name) {
    const found = this.headers.find(([n]) => n === name);
    return found === undefined ? undefined : found[1];
  }
}

/** A packed batch read in place. Its bytes are decoded once, as one
 * string, when every byte is one UTF-16 unit (ASCII, the common case):
 * a row's text is then a substring (no copy in SpiderMonkey) instead of a
 * TextDecoder call per piece. */
class View {
  constructor(batch) {
    this.data = batch.data;
    this.nums = numbers(batch.rows);
    this.heads = numbers(batch.headers);
    this.sequences = numbers(batch.sequences, BigUint64Array);
    this.attempts = numbers(batch.attempts);
    this.whole = undefined;
  }

  /** The text at `offset`, `length` bytes in `data`. */
  piece(offset, length) {
    if (this.whole === undefined) {
      const whole = utf8.decode(this.data);
      // Equal lengths: no multi-byte sequence, so character offsets are byte
      // offsets (an invalid byte is one U+FFFD either way).
      this.whole = whole.length === this.data.length ? whole : null;
    }
    if (this.whole !== null) return this.whole.substring(offset, offset + length);
    return utf8.decode(this.data.subarray(offset, offset + length));
  }

  /** Field `field` (0 tenant, 2 table, 4 payload) of row `row` as text. */
  text(row, field) {
    const at = 8 * row + field;
    return this.piece(this.nums[at], this.nums[at + 1]);
  }

  bytes(row, field) {
    const at = 8 * row + field;
    return this.data.slice(this.nums[at], this.nums[at] + this.nums[at + 1]);
  }

  headerCount(row) {
    return this.nums[8 * row + 7];
  }

  headers(row) {
    const { nums, heads } = this;
    const headers = [];
    for (let h = nums[8 * row + 6]; h < nums[8 * row + 6] + nums[8 * row + 7]; h++) {
      headers.push([this.piece(heads[4 * h], heads[4 * h + 1]), this.piece(heads[4 * h + 2], heads[4 * h + 3])]);
    }
    return headers;
  }
}

/** A row to emit: `table` undefined keeps the input row's table, `headers`
 * undefined keeps its headers ([[name, value], …] replaces them). */
export function out(payload, { table, headers } = {}) {
  return new Out(payload, table, headers);
}

/** A row to emit. A payload given as a value is kept as its JSON text:
 * the batch's texts are encoded together when the answer is packed. */
class Out {
  constructor(payload, table, headers) {
    if (payload instanceof Uint8Array) {
      this._bytes = payload;
      this._text = undefined;
    } else {
      this._bytes = undefined;
      this._text = typeof payload === "string" ? payload : (JSON.stringify(payload) ?? "");
    }
    this.table = table;
    this.headers = headers;
  }

  /** The payload's bytes. */
  get payload() { return this._bytes ??= encoder.encode(this._text); }
}

const OK_OUTCOME = Object.freeze({ code: OK, argument: 0 });

/** Pass the row on unchanged (for a sink: it was delivered). */
export const ok = () => OK_OUTCOME;
/** Replace the row by `rows`: each out(...) or a payload (Uint8Array,
 * string, or a value written as JSON) keeping table and headers. */
export const emit = (...rows) => {
  for (let i = 0; i < rows.length; i++) {
    if (!(rows[i] instanceof Out)) rows[i] = new Out(rows[i], undefined, undefined);
  }
  return { code: EMIT, rows };
};
/** Drop the row: nothing is emitted and it is acked. */
export const drop = () => ({ code: EMIT, rows: [] });
/** Try the row again after `afterMs` milliseconds. */
export const retry = (afterMs) => ({ code: RETRY, argument: afterMs >>> 0 });
/** Give up on the row: it is dead-lettered with `reason`. */
export const deadLetter = (reason) => ({ code: DEAD_LETTER, reason: String(reason) });

/** Budget decisions. */
export const admit = () => ({ tag: "admit" });
export const throttle = (afterMs) => ({ tag: "throttle", val: afterMs >>> 0 });
export const reject = (reason) => ({ tag: "reject", val: String(reason) });
/** Routes: weir's default, a unit, or (from routeTable) by each row's key. */
export const defaultRoute = () => ({ tag: "default-route" });
export const to = (partition, shard = 0) => ({ tag: "to", val: { partition, shard } });
export const byKey = () => ({ tag: "by-key" });

/** The outcome as the scaffolds' expected.ndjson writes it. */
export function describe(outcome) {
  if (outcome.code === OK) return { outcome: "ok" };
  if (outcome.code === RETRY) return { outcome: "retry", after_ms: outcome.argument };
  if (outcome.code === DEAD_LETTER) return { outcome: "dead_letter", reason: outcome.reason };
  if (outcome.rows.length === 0) return { outcome: "drop" };
  return {
    outcome: "emit",
    rows: outcome.rows.map((r) => {
      const row = { payload: utf8.decode(r.payload) };
      if (r.table !== undefined) row.table = r.table;
      if (r.headers !== undefined) row.headers = r.headers;
      return row;
    }),
  };
}

/** The settings JSON `init` receives, as an object ("" is {}). */
export function parseSettings(text) {
  if (!text || !text.trim()) return {};
  const settings = JSON.parse(text);
  if (settings === null || typeof settings !== "object" || Array.isArray(settings)) {
    throw new Error("settings: expected a JSON object");
  }
  return settings;
}

/** Prints an error's message and stack to stderr: the host quotes the tail
 * of a plugin's stderr when it traps. */
export function report(error) {
  const text = error && error.stack ? `${error}\n${error.stack}` : String(error);
  console.error(text);
}

/** `Error: boom (plugin.js:12)`: the error and the first line of its stack
 * outside the SDK. */
export function shortReason(error) {
  const name = error && error.name ? error.name : "Error";
  const message = error && error.message !== undefined ? error.message : String(error);
  let where = "";
  const stack = (error && error.stack) || "";
  for (const line of stack.split("\n")) {
    const match = /([^/\s(@]+\.m?js):(\d+)(?::\d+)?\)?\s*$/.exec(line);
    if (match && !/^(core|index|state|http)\.js$/.test(match[1])) {
      where = ` (${match[1]} line ${match[2]})`;
      break;
    }
  }
  return `${name}: ${message}`.slice(0, 400) + where;
}

/** `decide(row)`, an exception becoming the row's dead letter. */
export function perRow(decide, row) {
  let outcome;
  try {
    outcome = decide(row);
  } catch (error) {
    report(error);
    return deadLetter(shortReason(error));
  }
  return checked(outcome);
}

function checked(outcome) {
  if (outcome === undefined || outcome === null) return OK_OUTCOME;
  if (typeof outcome.code !== "number") {
    throw new TypeError(`a row's outcome must be ok(), emit(...), drop(), retry(ms) or deadLetter(reason), not ${JSON.stringify(outcome)}`);
  }
  return outcome;
}

/** The rows of a packed batch: views of it, decoded when read. */
export function unpack(batch) {
  const view = new View(batch);
  const rows = new Array(view.sequences.length);
  // Only what every row has: the rest is undefined until first read,
  // and a property store per field per row cost more than the reads.
  for (let i = 0; i < rows.length; i++) {
    const row = Object.create(Row.prototype);
    row._view = view;
    row.index = i;
    rows[i] = row;
  }
  return rows;
}

/** A growable byte buffer. */
class Bytes {
  constructor() {
    this.buf = new Uint8Array(4096);
    this.len = 0;
  }
  put(bytes) {
    if (this.len + bytes.length > this.buf.length) {
      const bigger = new Uint8Array(Math.max(this.buf.length * 2, this.len + bytes.length));
      bigger.set(this.buf.subarray(0, this.len));
      this.buf = bigger;
    }
    this.buf.set(bytes, this.len);
    const at = this.len;
    this.len += bytes.length;
    return [at, bytes.length];
  }
  bytes() {
    return this.buf.slice(0, this.len);
  }
}

/** The `transformed` record for `outcomes` of `rows`. Every text (JSON
 * payloads, tables, headers) is laid out in one string and encoded with one
 * TextEncoder call; if that string turns out not to be ASCII its character
 * offsets are not byte offsets, and the pieces are encoded one by one. */
export function packTransformed(rows, outcomes) {
  if (outcomes.length !== rows.length) throw new Error(`${outcomes.length} outcomes for ${rows.length} rows`);
  const texts = [], blobs = [], blobSlots = [];
  let chars = 0, blobBytes = 0;
  const codes = new Uint32Array(2 * rows.length);
  const emitted = [], headerNums = [], reasons = [];
  const putText = (text) => {
    texts.push(text);
    chars += text.length;
    return chars - text.length;
  };
  const putHeaders = (pairs) => {
    const first = headerNums.length / 4;
    for (const [name, value] of pairs) {
      headerNums.push(putText(name), name.length, putText(value), value.length);
    }
    return first;
  };
  // Indexed loops and no closure per text: without a JIT, for-of's
  // iterator calls and a call per piece cost more than the packing itself.
  for (let i = 0; i < rows.length; i++) {
    const outcome = outcomes[i];
    const code = outcome.code;
    if (code === EMIT) {
      let first = -1, count = 0;
      const outRows = outcome.rows;
      for (let e = 0; e < outRows.length; e++) {
        const r = outRows[e];
        const table = r.table;
        const text = r._text;
        if (r.headers === undefined && first < 0) {
          // Every row emitted for one input shares its headers' bytes; a
          // row without headers has none to decode.
          const row = rows[i];
          if (row._headers === undefined && row._view !== undefined && row._view.nums[8 * row.index + 7] === 0) {
            first = headerNums.length / 4;
          } else {
            count = row.headers.length;
            first = putHeaders(row.headers);
          }
        }
        if (table === undefined && text !== undefined && r.headers === undefined) {
          // A text payload with the input's table and headers, as most
          // are: one push.
          texts.push(text);
          emitted.push(0, SAME_TABLE, chars, text.length, first, count);
          chars += text.length;
          continue;
        }
        if (table === undefined) {
          emitted.push(0, SAME_TABLE);
        } else {
          texts.push(table);
          emitted.push(chars, table.length);
          chars += table.length;
        }
        if (text !== undefined) {
          texts.push(text);
          emitted.push(chars, text.length);
          chars += text.length;
        } else {
          // Bytes go after the texts: their offsets are fixed up below.
          const bytes = r.payload;
          blobSlots.push(emitted.length);
          blobs.push(bytes);
          emitted.push(blobBytes, bytes.length);
          blobBytes += bytes.length;
        }
        if (r.headers !== undefined) emitted.push(putHeaders(r.headers), r.headers.length);
        else emitted.push(first, count);
      }
      codes[2 * i] = EMIT;
      codes[2 * i + 1] = outRows.length;
    } else if (code === DEAD_LETTER) {
      codes[2 * i] = DEAD_LETTER;
      codes[2 * i + 1] = reasons.length;
      reasons.push(outcome.reason);
    } else {
      codes[2 * i] = code;
      codes[2 * i + 1] = outcome.argument;
    }
  }
  const encoded = encoder.encode(texts.length === 1 ? texts[0] : texts.join(""));
  if (encoded.length !== chars) return packTransformedPieces(rows, outcomes);
  let data = encoded;
  if (blobs.length > 0) {
    data = new Uint8Array(encoded.length + blobBytes);
    data.set(encoded);
    let at = encoded.length;
    for (const blob of blobs) {
      data.set(blob, at);
      at += blob.length;
    }
    for (const slot of blobSlots) emitted[slot] += encoded.length;
  }
  return {
    data,
    outcomes: asBytes(codes),
    emitted: asBytes(new Uint32Array(emitted)),
    headers: asBytes(new Uint32Array(headerNums)),
    reasons,
  };
}

/** `packTransformed` for answers with non-ASCII text: each piece encoded
 * on its own. */
function packTransformedPieces(rows, outcomes) {
  const data = new Bytes();
  const codes = [], emitted = [], headerNums = [], reasons = [];
  const putHeaders = (pairs) => {
    const first = headerNums.length / 4;
    for (const [name, value] of pairs) {
      headerNums.push(...data.put(encoder.encode(name)), ...data.put(encoder.encode(value)));
    }
    return [first, pairs.length];
  };
  for (let i = 0; i < rows.length; i++) {
    const outcome = outcomes[i];
    if (outcome.code === EMIT) {
      let inherited;
      for (const r of outcome.rows) {
        const table = r.table === undefined ? [0, SAME_TABLE] : data.put(encoder.encode(r.table));
        const payload = data.put(r.payload);
        let headers;
        if (r.headers !== undefined) headers = putHeaders(r.headers);
        else headers = inherited ??= putHeaders(rows[i].headers);
        emitted.push(...table, ...payload, ...headers);
      }
      codes.push(EMIT, outcome.rows.length);
    } else if (outcome.code === DEAD_LETTER) {
      codes.push(DEAD_LETTER, reasons.length);
      reasons.push(outcome.reason);
    } else {
      codes.push(outcome.code, outcome.argument);
    }
  }
  return {
    data: data.bytes(),
    outcomes: asBytes(new Uint32Array(codes)),
    emitted: asBytes(new Uint32Array(emitted)),
    headers: asBytes(new Uint32Array(headerNums)),
    reasons,
  };
}

/** The `delivered` record for `outcomes` of `rows`. */
export function packDelivered(rows, outcomes) {
  if (outcomes.length !== rows.length) throw new Error(`${outcomes.length} outcomes for ${rows.length} rows`);
  const codes = [], reasons = [];
  for (const outcome of outcomes) {
    if (outcome.code === DEAD_LETTER) {
      codes.push(DEAD_LETTER, reasons.length);
      reasons.push(outcome.reason);
    } else if (outcome.code === EMIT) {
      throw new TypeError("a sink cannot emit rows: return ok(), retry(ms) or deadLetter(reason)");
    } else {
      codes.push(outcome.code, outcome.argument);
    }
  }
  return { outcomes: asBytes(new Uint32Array(codes)), reasons };
}

/** What every world does with a plugin object: `init(settings)` (optional,
 * `this` is the plugin), then per world `row`/`batch`, `admit`,
 * `routeTable`/`routeKey`. */
export function runBatch(plugin, rows) {
  if (typeof plugin.batch === "function") return plugin.batch(rows);
  const outcomes = new Array(rows.length);
  if (typeof plugin.row !== "function") return outcomes.fill(OK_OUTCOME);
  // One loop, no closure per row: this runs for every row of every batch.
  for (let i = 0; i < rows.length; i++) {
    let outcome;
    try {
      outcome = plugin.row(rows[i]);
    } catch (error) {
      report(error);
      outcomes[i] = deadLetter(shortReason(error));
      continue;
    }
    outcomes[i] = outcome !== undefined && outcome !== null && typeof outcome.code === "number" ? outcome : checked(outcome);
  }
  return outcomes;
}

/** Calls `plugin.init` with the parsed settings; throws the message as a
 * string, which componentize-js turns into the `err` the host reports (an
 * Error object would lose its message). */
export function initPlugin(plugin, settings) {
  try {
    if (typeof plugin.init === "function") plugin.init(parseSettings(settings));
  } catch (error) {
    // The message becomes init's `err`; stderr gets only where it was
    // thrown, so the host's report says the message once.
    if (error && error.stack) console.error(error.stack);
    throw error && error.message !== undefined ? String(error.message) : String(error);
  }
}

/** Runs `call`; an error prints its message and stack before it traps the
 * plugin, so that the host can quote it. */
export function guarded(call) {
  try {
    return call();
  } catch (error) {
    report(error);
    throw error;
  }
}

/** Packs rows the way the host does: for a plugin's own tests. */
export function packBatch(rows) {
  const data = new Bytes();
  const nums = [], headerNums = [];
  for (const row of rows) {
    const first = headerNums.length / 4;
    const tenant = data.put(encoder.encode(row.tenant));
    const table = data.put(encoder.encode(row.table));
    const payload = data.put(row.payload);
    for (const [name, value] of row.headers) {
      headerNums.push(...data.put(encoder.encode(name)), ...data.put(encoder.encode(value)));
    }
    nums.push(...tenant, ...table, ...payload, first, row.headers.length);
  }
  return {
    data: data.bytes(),
    rows: asBytes(new Uint32Array(nums)),
    sequences: asBytes(new BigUint64Array(rows.map((row) => BigInt(row.sequence)))),
    attempts: asBytes(new Uint32Array(rows.map((row) => row.attempts))),
    headers: asBytes(new Uint32Array(headerNums)),
  };
}

/** Reads back a `transformed` (or, with `delivered`, a `delivered`) record
 * as outcomes: for a plugin's own tests. */
export function readOutcomes(packed, delivered = false) {
  const result = [];
  let next = 0;
  const text = (o, l) => utf8.decode(packed.data.subarray(o, o + l));
  const codes = numbers(packed.outcomes), emitted = numbers(packed.emitted ?? new Uint8Array());
  const heads = numbers(packed.headers ?? new Uint8Array());
  for (let i = 0; i + 1 < codes.length; i += 2) {
    const code = codes[i], argument = codes[i + 1];
    if (code === DEAD_LETTER) result.push(deadLetter(packed.reasons[argument]));
    else if (code === RETRY) result.push(retry(argument));
    else if (code === EMIT && !delivered) {
      const rows = [];
      for (let e = next; e < next + argument; e++) {
        const n = emitted.subarray(6 * e, 6 * e + 6);
        const headers = [];
        for (let h = n[4]; h < n[4] + n[5]; h++) {
          const hn = heads.subarray(4 * h, 4 * h + 4);
          headers.push([text(hn[0], hn[1]), text(hn[2], hn[3])]);
        }
        rows.push({
          payload: packed.data.slice(n[2], n[2] + n[3]),
          table: n[1] === SAME_TABLE ? undefined : text(n[0], n[1]),
          headers: headers.length ? headers : undefined,
        });
      }
      next += argument;
      result.push({ code: EMIT, rows });
    } else result.push(OK_OUTCOME);
  }
  return result;
}
