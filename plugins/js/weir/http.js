// Many outbound HTTP requests at once, for a transform or sink
// (`grants.http` in the TOML; the WIT `http-batch` interface), imported on
// its own (`import * as http from "./weir/http.js"`) since only those two
// worlds import the interface. `fetchAll` sends the requests together and
// returns when every one is done: a `Response` or an `HttpError` per
// request, in order. A plain synchronous call: no promise, no event loop.
import { fetchAll as hostFetchAll } from "weir:plugin/http-batch@0.3.0";

const encoder = new TextEncoder();
const utf8 = new TextDecoder();

function bytes(body) {
  if (body === undefined) return new Uint8Array();
  if (body instanceof Uint8Array) return body;
  if (typeof body === "string") return encoder.encode(body);
  return encoder.encode(JSON.stringify(body));
}

/** A request: `method`, `url`, `headers` ([[name, value], …]), `body`
 * (bytes, a string, or a value sent as JSON). */
export function request(method, url, { headers = [], body } = {}) {
  return { method, url, headers, body: bytes(body) };
}

export function get(url, headers = []) {
  return request("GET", url, { headers });
}

export function post(url, body, { contentType = "application/json", headers = [] } = {}) {
  return request("POST", url, { headers: [["content-type", contentType], ...headers], body });
}

/** One response: `status`, `headers` ([[name, value], …]), `body` (bytes). */
export class Response {
  constructor(status, headers, body) {
    this.status = status;
    this.headers = headers;
    this.body = body;
  }

  text() {
    return utf8.decode(this.body);
  }

  json() {
    return JSON.parse(this.text());
  }

  /** The first value of header `name` (compared case-insensitively). */
  header(name) {
    const found = this.headers.find(([n]) => n.toLowerCase() === name.toLowerCase());
    return found === undefined ? undefined : found[1];
  }
}

/** Why one request has no response: `kind` is "refused" (never sent:
 * outside `grants.http`, or malformed), "timeout" or "failed"; the
 * message is the reason (`refused: …`, `timed out`, `failed: …`). Returned,
 * not thrown: throw it from `row` to dead-letter the row with it. */
export class HttpError extends Error {
  constructor(kind, reason = "") {
    super(kind === "timeout" ? "timed out" : `${kind}: ${reason}`);
    this.name = "HttpError";
    this.kind = kind;
    this.reason = reason;
  }
}

/** Sends every request at once: a `Response` or an `HttpError` each, in
 * order. At most `http_max_in_flight` are in flight at once; `timeoutMs`
 * bounds each from when it is sent (0: only the call's deadline);
 * `dedupe`: identical GETs of this call are sent once. */
export function fetchAll(requests, { timeoutMs = 0, dedupe = false } = {}) {
  const results = hostFetchAll(requests, { timeoutMs, dedupe });
  return results.map((result) => {
    if (result.tag === "ok") {
      const { status, headers, body } = result.val;
      return new Response(status, headers, body);
    }
    return new HttpError(result.val.tag, result.val.val ?? "");
  });
}
