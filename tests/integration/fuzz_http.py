#!/usr/bin/env python3
"""fuzz_http.py - mutated HTTP requests at a server: each on its own connection, sent whole
(50 connections at a time, each read for half a second); the answer must be an HTTP/1.1 status
line or nothing, and the
server must stay up. Seeds are valid requests (GET, POST with a length, chunked POST,
pipelined); mutations change, insert, delete and truncate bytes. Deterministic (seeded).
Usage: fuzz_http.py PORT PREFIX COUNT SEED
Prints one JSON line: counts of answers by status class and of closed connections.
"""
import json, random, selectors, socket, sys, time

port, prefix, count, seed = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rnd = random.Random(seed)
p = prefix.encode()
seeds = [
    b"GET " + p + b"/echo?a=1 HTTP/1.1\r\nHost: x\r\nX-Priority: online\r\n\r\n",
    b"POST " + p + b"/gen HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
    b"POST " + p + b"/gen HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"GET " + p + b"/echo HTTP/1.1\r\nHost: x\r\n\r\nGET " + p + b"/echo HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET " + p + b"/echo HTTP/1.0\r\nConnection: keep-alive\r\nX-Request-Deadline-Ms: 100\r\n\r\n",
]
special = [b"\r\n", b"\n", b":", b" ", b"\x00", b"\xff", b"0", b"-1", b"99999999999999999999",
           b"Content-Length: 3\r\n", b"Transfer-Encoding: chunked\r\n", b"\t", b"HTTP/1.1"]

def mutate(data):
    b = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        op = rnd.random()
        i = rnd.randrange(len(b) + 1)
        if op < 0.3 and len(b) > 0:
            b[min(i, len(b) - 1)] = rnd.randrange(256)
        elif op < 0.55:
            b[i:i] = rnd.choice(special)
        elif op < 0.75 and len(b) > 1:
            j = min(len(b), i + rnd.randint(1, 8))
            del b[i:j]
        elif op < 0.9:
            b = b[:i]
        else:
            b[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 32)))
    return bytes(b)

res = {"2xx": 0, "3xx": 0, "4xx": 0, "5xx": 0, "closed": 0, "bad": 0}
bad = []
BATCH, WAIT = 50, 0.5


def verdict(data, out):
    if not out:
        res["closed"] += 1
    elif out.startswith(b"HTTP/1.1 ") and out[9:10] in b"12345" and len(out) >= 12:
        res[out[9:10].decode() + "xx"] = res.get(out[9:10].decode() + "xx", 0) + 1
    else:
        res["bad"] += 1
        if len(bad) < 3:
            bad.append([repr(data[:120]), repr(out[:80])])


# in batches of connections at once: each sends its request whole and reads what comes back
# for WAIT seconds (or until the gateway closes), then closes: a request left incomplete by the
# mutations is answered by nothing (closed), the others with a status line
done = 0
while done < count:
    n = min(BATCH, count - done)
    conns = []
    for _ in range(n):
        data = mutate(rnd.choice(seeds))
        s = socket.create_connection(("127.0.0.1", port))
        s.setblocking(False)
        try:
            s.sendall(data)
        except (BlockingIOError, ConnectionResetError, BrokenPipeError):
            pass
        conns.append([s, data, b"", False])
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c[0], selectors.EVENT_READ, c)
    end = time.monotonic() + WAIT
    while time.monotonic() < end and any(not c[3] for c in conns):
        for key, _ in sel.select(timeout=max(0.0, end - time.monotonic())):
            c = key.data
            try:
                b = c[0].recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except (ConnectionResetError, OSError):
                b = b""
            if b:
                c[2] += b
            else:
                c[3] = True
                sel.unregister(c[0])
    sel.close()
    for c in conns:
        c[0].close()
        verdict(c[1], c[2])
    done += n
print(json.dumps({"results": res, "examples_of_bad": bad}))
