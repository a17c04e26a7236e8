#!/usr/bin/env python3
"""exhaust.py - what an idle or vanishing client can do to oversubd's API (test_security.sh).

  exhaust.py longpolls PORT N         N long-polls sent and closed at once; exits when sent
  exhaust.py idle PORT N SRC SECONDS  N idle connections from source address SRC, held SECONDS
                                      (prints how many were answered 503 or closed by the daemon)
  exhaust.py slowhead PORT SECONDS    a request head trickled; prints the status line it got
  exhaust.py directives PORT ID N     N directive long-polls sent and closed at once
"""
import socket
import sys
import time


def longpolls(port, n):
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /v1/events?since=999999999&wait=120 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port)
        s.close()


def idle(port, n, src, seconds):
    held, refused, failed = [], 0, 0
    for _ in range(n):
        s = socket.socket()
        try:
            s.bind((src, 0))
            s.connect(("127.0.0.1", port))
            held.append(s)
        except OSError:
            failed += 1
            s.close()
    time.sleep(0.5)
    for s in held:
        s.setblocking(False)
        try:
            data = s.recv(4096)
            if data.startswith(b"HTTP/1.1 503") or data == b"":
                refused += 1
        except BlockingIOError:
            pass
        except OSError:
            refused += 1
    print(f"held {len(held)} refused {refused} failed {failed}", flush=True)
    time.sleep(seconds)
    for s in held:
        s.close()




def slowhead(port, seconds):
    """a first request's head trickled a line at a time: answered 408 and closed, or not"""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /v1/pool HTTP/1.1\r\n")
    s.settimeout(1.0)
    end = time.time() + seconds
    got = b""
    while time.time() < end:
        try:
            s.sendall(b"X-Slow: 1\r\n")
        except OSError:
            break
        try:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        except socket.timeout:
            pass
    print(got.split(b"\r\n", 1)[0].decode() or "no answer", flush=True)


def directive_polls(port, service, n):
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /v1/services/%s/directives?wait=60 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (service.encode(), port))
        s.close()


if __name__ == "__main__":
    if sys.argv[1] == "longpolls":
        longpolls(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "slowhead":
        slowhead(int(sys.argv[2]), float(sys.argv[3]))
    elif sys.argv[1] == "directives":
        directive_polls(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    else:
        idle(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
