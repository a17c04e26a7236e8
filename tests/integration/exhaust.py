#!/usr/bin/env python3
"""exhaust.py - what an idle or vanishing client can do to oversubd's API (test_security.sh).

  exhaust.py longpolls PORT N         N long-polls sent and closed at once; exits when sent
  exhaust.py idle PORT N SRC SECONDS  N idle connections from source address SRC, held SECONDS
                                      (prints how many were answered 503 or closed by the daemon)
"""
import socket
import sys
import time


def longpolls(port, n):
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /v1/events?since=999999999&wait=120 HTTP/1.1\r\nHost: x\r\n\r\n")
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


if __name__ == "__main__":
    if sys.argv[1] == "longpolls":
        longpolls(int(sys.argv[2]), int(sys.argv[3]))
    else:
        idle(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
