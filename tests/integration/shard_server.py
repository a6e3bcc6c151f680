#!/usr/bin/env python3
"""An HTTP server of the shards under DIR for tests/integration/shards_test.cc, on 127.0.0.1 and
a free port, which it prints as "ready PORT" once it listens. With --drop-first, the first request
for each file gets its full Content-Length but only half the bytes before the connection closes
(a server or proxy dropping mid-shard); later requests get the whole file. With --trickle, every
file is sent a byte every 0.1 s (a connection that moves, too slowly to be of use). With
--endless, every request gets a body that never ends, 2 KiB a second (fast enough for the stall
rule, never done). With --redirect-loop, every request is redirected to itself. Every request is
logged on stderr as "GET PATH STATUS".

  shard_server.py DIR [--drop-first] [--trickle] [--endless] [--redirect-loop]
"""
import argparse
import http.server
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--drop-first", action="store_true")
    ap.add_argument("--trickle", action="store_true")
    ap.add_argument("--endless", action="store_true")
    ap.add_argument("--redirect-loop", action="store_true")
    args = ap.parse_args()
    served = set()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            if args.redirect_loop:
                self.send_response(302)
                self.send_header("Location", self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                sys.stderr.write(f"GET {self.path} 302\n")
                return
            if args.endless:
                self.send_response(200)
                self.send_header("Content-Length", str(1 << 40))
                self.end_headers()
                sys.stderr.write(f"GET {self.path} endless\n")
                try:
                    while True:
                        self.wfile.write(b"\0" * 2048)
                        self.wfile.flush()
                        time.sleep(1)
                except OSError:  # the client gave up
                    sys.stderr.write(f"GET {self.path} left\n")
                return
            path = os.path.join(args.dir, self.path.lstrip("/"))
            if not os.path.isfile(path):
                self.send_error(404)
                sys.stderr.write(f"GET {self.path} 404\n")
                return
            with open(path, "rb") as f:
                data = f.read()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if args.drop_first and self.path not in served:
                served.add(self.path)
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                sys.stderr.write(f"GET {self.path} dropped\n")
                return
            if args.trickle:
                try:
                    for i in range(len(data)):
                        self.wfile.write(data[i : i + 1])
                        self.wfile.flush()
                        time.sleep(0.1)
                except OSError:  # the client gave up
                    sys.stderr.write(f"GET {self.path} left\n")
                    return
            else:
                self.wfile.write(data)
            sys.stderr.write(f"GET {self.path} 200\n")

        def log_message(self, *_):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"ready {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
