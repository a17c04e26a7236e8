#!/usr/bin/env python3
"""replay_azure.py - replays the start of ../shared/traces/azure_llm_conv_2023.csv through the
gateway, open loop (each request sent at its scheduled time, whatever came back before).

Row i goes to the online, batch or experiment service by FNV-1a 64 of its row number, mod 100,
against 20:40:40. Its output tokens become the example LLM server's service time
(examples/fake-llm-server --token-ms 2: MS_PER_TOKEN each, asked for with ?tokens=N). The trace's gaps are scaled so that the offered load is 3x the three
services' capacity (capacity: max_inflight / mean service time), while the online share stays
under 0.8x the online service's capacity.

Prints one JSON line: per class sent, 2xx, 429, other, and whether every 429 had Retry-After.
Usage: replay_azure.py TRACE GATEWAY_PORT ROWS ONLINE_LIMIT BATCH_LIMIT EXPERIMENT_LIMIT
"""
import csv, datetime, http.client, json, queue, sys, threading, time

MS_PER_TOKEN = 2
trace, port, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
limits = {"online": int(sys.argv[4]), "batch": int(sys.argv[5]), "experiment": int(sys.argv[6])}
svc = {"online": "on", "batch": "ba", "experiment": "ex"}

def fnv1a64(s):
    h = 0xcbf29ce484222325
    for b in s.encode():
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h

reqs = []
with open(trace, newline="") as f:
    for i, r in enumerate(csv.DictReader(f)):
        if i >= rows:
            break
        t = datetime.datetime.strptime(r["TIMESTAMP"][:26], "%Y-%m-%d %H:%M:%S.%f").timestamp()
        k = fnv1a64(str(i)) % 100
        cls = "online" if k < 20 else "batch" if k < 60 else "experiment"
        reqs.append((t, cls, int(float(r["GeneratedTokens"]))))
t0 = reqs[0][0]
span = reqs[-1][0] - t0
mean_s = sum(r[2] for r in reqs) * MS_PER_TOKEN / len(reqs) / 1000.0
capacity = sum(limits.values()) / mean_s            # requests a second
offered_natural = len(reqs) / span
scale = offered_natural / (3.0 * capacity)          # trace seconds -> test seconds
online_rate = sum(1 for r in reqs if r[1] == "online") / (span * scale)
online_capacity = limits["online"] / mean_s
sched = [((t - t0) * scale, cls, tokens) for t, cls, tokens in reqs]

res = {c: {"sent": 0, "2xx": 0, "429": 0, "other": 0} for c in svc}
retry_ok = True
lock = threading.Lock()
work = queue.Queue()

def worker():
    global retry_ok
    while True:
        item = work.get()
        if item is None:
            return
        cls, tokens, i = item
        st, ra = 0, None
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("GET", "/%s/v1/completions?tokens=%d&row=%d" % (svc[cls], tokens, i))
            r = c.getresponse()
            r.read()
            st, ra = r.status, r.getheader("Retry-After")
            c.close()
        except Exception:
            st = -1
        with lock:
            res[cls]["sent"] += 1
            if 200 <= st < 300:
                res[cls]["2xx"] += 1
            elif st == 429:
                res[cls]["429"] += 1
                if ra is None or not ra.isdigit() or int(ra) < 1:
                    retry_ok = False
            else:
                res[cls]["other"] += 1

threads = [threading.Thread(target=worker, daemon=True) for _ in range(160)]
for th in threads:
    th.start()
start = time.monotonic()
for i, (at, cls, tokens) in enumerate(sched):
    delay = start + at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    work.put((cls, tokens, i))
for _ in threads:
    work.put(None)
for th in threads:
    th.join()
print(json.dumps({"results": res, "retry_after_ok": retry_ok,
                  "offered_over_capacity": round(len(reqs) / (span * scale) / capacity, 2),
                  "online_over_online_capacity": round(online_rate / online_capacity, 2),
                  "seconds": round(span * scale, 1)}))
