#!/usr/bin/env python3
"""rawhttp.py - sends hand-made (broken) HTTP requests and checks each is refused.
Usage: rawhttp.py PORT CASES.py   (CASES.py defines `cases`, a dict name -> raw bytes)
Prints "<name> ok" for each request answered with a 4xx/5xx, "<name> BAD: <status line>" else.
"""
import socket, sys


def first_line(port, data):
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(3.0)
    s.sendall(data)
    out = b""
    try:
        while b"\r\n" not in out:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except socket.timeout:
        pass
    s.close()
    return out.split(b"\r\n")[0].decode(errors="replace")


port = int(sys.argv[1])
env = {}
exec(open(sys.argv[2]).read(), env)
for name, data in env["cases"].items():
    line = first_line(port, data)
    code = int(line.split()[1]) if line.startswith("HTTP/1.1 ") else 0
    print(name, "ok" if 400 <= code < 600 else "BAD: " + repr(line))
