#!/usr/bin/python3
"""diff_h11.py - the codec against an independent parser (Debian's python3-h11) on a corpus.

Usage: diff_h11.py H1DUMP DIR...

For every file, ours (h1dump) and h11 read it as a request head. Whenever ours accepts a
head, h11 must accept it too and read the same method, target, version and fields (names
case-insensitively, values exactly): ours is never more lenient than an independent strict
parser (the request-smuggling direction). Where ours refuses what h11 accepts, the reason is
counted (ours is stricter by design: bare LF mixed with CRLF, leading empty lines, absolute
targets...). Exit 1 on a disagreement of the first kind.
"""
import collections
import json
import os
import subprocess
import sys

import h11


def theirs(data):
    c = h11.Connection(h11.SERVER, max_incomplete_event_size=16 * 1024)
    try:
        c.receive_data(data)
        ev = c.next_event()
    except h11.RemoteProtocolError as e:
        return ("bad", str(e))
    if ev is h11.NEED_DATA:
        return ("partial",)
    if isinstance(ev, h11.Request):
        hs = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in ev.headers.raw_items()]
        return ("ok", ev.method.decode("latin-1"), ev.target.decode("latin-1"),
                ev.http_version.decode(), hs)
    return ("other", repr(ev))


def main():
    dump, dirs = sys.argv[1], sys.argv[2:]
    files = sorted(os.path.join(d, f) for d in dirs for f in os.listdir(d))
    counts = collections.Counter()
    stricter = collections.Counter()
    failures = []
    for i in range(0, len(files), 200):
        batch = files[i:i + 200]
        out = subprocess.run([dump] + batch, capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            o = json.loads(line)
            data = open(o["file"], "rb").read()
            t = theirs(data)
            if o["rc"] == 0:
                if t[0] != "ok":
                    failures.append((o["file"], "ours accepts, h11 says %s" % (t,)))
                    continue
                # h11 lowercases Transfer-Encoding's value (codings are case-insensitive,
                # RFC 9112 7); ours keeps it as sent and compares it without case
                ours = ("ok", o["method"], o["target"], "1.%d" % o["minor"],
                        [(n.lower(), v.lower() if n.lower() == "transfer-encoding" else v)
                         for n, v in o["headers"]])
                if ours != t:
                    failures.append((o["file"], "read differently: ours %s, h11 %s" % (ours, t)))
                    continue
                counts["both accept, same reading"] += 1
            elif o["rc"] == -1:
                if t[0] == "ok":
                    stricter[o["why"]] += 1
                    counts["ours refuses, h11 accepts"] += 1
                else:
                    counts["both refuse or wait"] += 1
            else:
                if t[0] == "ok":
                    failures.append((o["file"], "ours waits for more, h11 has a whole head"))
                    continue
                counts["both wait, or h11 refuses early"] += 1
    print("differential test against h11 %s on %d inputs:" % (h11.__version__, len(files)))
    for k, v in sorted(counts.items()):
        print("  %-40s %d" % (k, v))
    for k, v in stricter.most_common():
        print("    stricter: %-60s %d" % (k, v))
    for f, why in failures[:20]:
        print("DISAGREE %s: %s" % (f, why))
    if failures:
        print("%d disagreement(s)" % len(failures))
        return 1
    if counts["both accept, same reading"] == 0:
        print("no input was accepted by both: the corpus is empty or wrong")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
