#!/usr/bin/env python3
"""A tiny lookup service for the enrich example: GET /customers/<id>
answers the customer's record as JSON after 20 ms (a slow network), 404
for an unknown id; id `slow` never answers in time."""
import json
import sys
import time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler

CUSTOMERS = {
    "c1": {"name": "Ada", "tier": "gold", "country": "GB"},
    "c2": {"name": "Grace", "tier": "silver", "country": "US"},
    "c3": {"name": "Edsger", "tier": "bronze", "country": "NL"},
}


class Lookup(BaseHTTPRequestHandler):
    # HTTP/1.1: weir keeps its connections alive between lookups.
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        key = self.path.rsplit("/", 1)[-1]
        time.sleep(5 if key == "slow" else 0.02)
        found = CUSTOMERS.get(key)
        body = json.dumps(found).encode() if found else b"unknown customer"
        self.send_response(200 if found else 404)
        self.send_header("content-type", "application/json" if found else "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8091
    ThreadingHTTPServer(("127.0.0.1", port), Lookup).serve_forever()
