#!/usr/bin/env python3
"""A small HTTP inference server for one ONNX model (the onnxruntime image's Entrypoint).

  GET  /health      200 {"status": "ok", "model": PATH, "onnxruntime": VERSION}
  POST /v1/infer    {"inputs": [[...], ...]}          -> 200 {"outputs": [[...], ...]}
                    {"fill": F, "rows": N}             -> the model on N rows of F (a batch
                                                          the server builds itself)
Bad JSON, a wrong shape or a body over MAX_BODY answers 400/413 with {"error": ...}.

Runs with the standard library's threading HTTP server; one onnxruntime session is shared
by all requests (InferenceSession.run is thread-safe). The model is opened read-only.
"""

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import onnxruntime as ort

MAX_BODY = 16 * 1024 * 1024


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    session = None
    model_path = ""

    def log_message(self, fmt, *args):
        sys.stderr.write("server: %s %s\n" % (self.address_string(), fmt % args))

    def reply(self, code, doc):
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self.reply(200, {"status": "ok", "model": self.model_path,
                             "onnxruntime": ort.__version__})
        else:
            self.reply(404, {"error": "no such path: " + self.path})

    def do_POST(self):
        if self.path != "/v1/infer":
            return self.reply(404, {"error": "no such path: " + self.path})
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            return self.reply(400, {"error": "bad Content-Length"})
        if length < 0 or length > MAX_BODY:
            return self.reply(413, {"error": "body over %d bytes" % MAX_BODY})
        raw = self.rfile.read(length)
        if len(raw) != length:
            return  # the client went away mid-request
        try:
            doc = json.loads(raw)
            x = self.batch(doc)
        except (ValueError, TypeError, KeyError) as e:
            return self.reply(400, {"error": str(e)})
        (y,) = self.session.run(["y"], {"x": x})
        self.reply(200, {"outputs": y.tolist()})

    def batch(self, doc):
        if "inputs" in doc:
            x = np.asarray(doc["inputs"], dtype=np.float32)
        else:
            x = np.full((int(doc["rows"]), 4), float(doc["fill"]), dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != 4:
            raise ValueError("inputs must be N rows of 4 numbers, got shape %s" % (x.shape,))
        return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/models/tiny.onnx")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    a = ap.parse_args()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    Handler.session = ort.InferenceSession(a.model, opts, providers=["CPUExecutionProvider"])
    Handler.model_path = a.model
    server = ThreadingHTTPServer((a.host, a.port), Handler)
    server.daemon_threads = True
    sys.stderr.write("server: onnxruntime %s serving %s on %s:%d\n"
                     % (ort.__version__, a.model, a.host, a.port))
    sys.stderr.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
