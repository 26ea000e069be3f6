#!/usr/bin/env python3
"""HTTP server on 127.0.0.1 for the download tests. Serves the files of DIR under
/good/, and misbehaves under the other prefixes:
  /recompressed/NAME  the file's content gzip-compressed again (other bytes, same data)
  /truncate/NAME      declares the full length, sends half, closes
  /corrupt/NAME       one byte changed (a wrong checksum)
  /stall/NAME         accepts and sends nothing, for at most --stall seconds
  /drip/NAME          declares the full length, then sends 2 bytes a second (fast enough
                      for a stall check), for at most --stall seconds
  anything else       404
Prints the port on the first line of stdout; exits by itself after --lifetime seconds.

    tests/loopback_server.py DIR [--stall S] [--lifetime S]
"""
import argparse
import gzip
import http.server
import sys
import threading
import time
from pathlib import Path


def make_handler(root, stall):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def send_body(self, body, declared=None):
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body) if declared is None else declared))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            parts = self.path.strip("/").split("/")
            path = root / parts[-1] if len(parts) == 2 else None
            if path is None or not path.is_file():
                self.send_error(404)
                return
            mode, data = parts[0], path.read_bytes()
            if mode == "good":
                self.send_body(data)
            elif mode == "recompressed":
                self.send_body(gzip.compress(gzip.decompress(data), compresslevel=1, mtime=12345))
            elif mode == "truncate":
                self.send_body(data[: len(data) // 2], declared=len(data))
                self.close_connection = True
            elif mode == "corrupt":
                self.send_body(data[:-1] + bytes([data[-1] ^ 0xFF]))
            elif mode == "stall":
                time.sleep(stall)
                self.close_connection = True
            elif mode == "drip":
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    for i in range(min(len(data), int(2 * stall))):
                        self.wfile.write(data[i : i + 1])
                        time.sleep(0.5)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up
                self.close_connection = True
            else:
                self.send_error(404)

    return Handler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--stall", type=float, default=20.0)
    p.add_argument("--lifetime", type=float, default=300.0)
    args = p.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(Path(args.dir), args.stall))
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    threading.Timer(args.lifetime, server.shutdown).start()
    server.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()
