#!/usr/bin/python3
"""Soak load for tlmd (bench/soak.sh starts the daemon and runs this).

CLIENTS threads for SECONDS, each in a closed loop over a mix of requests on keep-alive
connections (one per thread, reopened after an error or a server close):
  hit      POST /v1/compile of a workload compiled during warm-up        40 %
  get      GET /v1/kernels/{key} of a warm kernel (the binary)           15 %
  miss     POST /v1/compile of a random dense / softmax (a compile)       8 %
  graph    POST /v1/compile of a small random MLP graph                   5 %
  bad      a bad request (bad JSON, unknown field, bad budget, no route,
           bad Content-Length, 4 KiB target, 505) on its own connection  20 %
  cancel   a streaming compile, its job DELETEd after "accepted"          2 %
  metrics  GET /metrics                                                   5 %
  stats    GET /v1/cache/stats                                            5 %
Every answer is timed; an answer counts as an error when its status is not the one its kind
expects (200; the 4xx each bad request deserves; cancel: 200 for the DELETE). The daemon's
RSS (/proc/PID/status VmRSS) is sampled every 10 s. Prints JSON with per-kind counts,
p50/p99 ms, statuses, unexpected answers, and the RSS series.

usage: soak.py PORT PID CLIENTS SECONDS
"""
import http.client
import json
import random
import socket
import sys
import threading
import time

PORT, PID, CLIENTS, SECONDS = (int(a) for a in sys.argv[1:5])
WARM = [
    {"op": "dense", "shape": {"M": m, "N": n, "K": 64}, "epilogue": ["relu"]}
    for m in (16, 32, 64) for n in (16, 48)
]
lock = threading.Lock()
lat = {}  # kind -> [ms]
status = {}  # kind -> {status: n}
unexpected = {}  # kind -> n
rss = []  # (t, MiB)


def record(kind, ms, st, ok):
    with lock:
        lat.setdefault(kind, []).append(ms)
        status.setdefault(kind, {}).setdefault(str(st), 0)
        status[kind][str(st)] += 1
        if not ok:
            unexpected[kind] = unexpected.get(kind, 0) + 1


def body(target="cpu", **kw):
    d = {"target": target}
    d.update(kw)
    return json.dumps(d)


def raw(req):
    """One request on its own socket; the status of the answer (0: none)."""
    s = socket.create_connection(("127.0.0.1", PORT), timeout=60)
    try:
        s.sendall(req)
        got = b""
        while b"\r\n" not in got:
            d = s.recv(4096)
            if not d:
                break
            got += d
        parts = got.split(b" ", 2)
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    finally:
        s.close()


BAD = [
    ("POST", "/v1/compile", "{not json", 400),
    ("POST", "/v1/compile", body(workloads=[WARM[0]], evil=1), 400),
    ("POST", "/v1/compile", body(workloads=[WARM[0]], budget={"seconds": -5}), 400),
    ("POST", "/v1/compile", body(workloads=[{"op": "nope", "shape": {}}]), 422),
    ("GET", "/v1/nothing", None, 404),
    ("GET", "/v1/kernels/zz", None, 404),
    ("RAW", b"POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", None, 400),
    ("RAW", b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", None, 414),
    ("RAW", b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", None, 505),
]


def client(keys, stop, seed):
    rnd = random.Random(seed)
    conn = None
    while time.time() < stop:
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
        r = rnd.random()
        t0 = time.time()
        kind, want = "?", 200
        try:
            if r < 0.40:
                kind = "hit"
                conn.request("POST", "/v1/compile", body(workloads=[rnd.choice(WARM)]),
                             {"Content-Type": "application/json"})
            elif r < 0.55:
                kind = "get"
                conn.request("GET", "/v1/kernels/" + rnd.choice(keys))
            elif r < 0.63:
                kind = "miss"
                w = rnd.choice([
                    {"op": "dense", "shape": {"M": rnd.randint(1, 300), "N": rnd.randint(1, 300),
                                              "K": rnd.randint(1, 300)}},
                    {"op": "softmax", "shape": {"R": rnd.randint(1, 999), "C": rnd.randint(1, 999)}},
                ])
                conn.request("POST", "/v1/compile", body(workloads=[w]),
                             {"Content-Type": "application/json"})
            elif r < 0.68:
                kind = "graph"
                h = rnd.choice([32, 64, 96, 128, rnd.randint(8, 256)])
                g = {"inputs": [{"name": "x", "shape": [8, 64]},
                                {"name": "w1", "shape": [64, h], "param": True},
                                {"name": "w2", "shape": [h, 16], "param": True}],
                     "nodes": [{"name": "fc1", "op": "dense", "inputs": ["x", "w1"]},
                               {"name": "act", "op": "relu", "inputs": ["fc1"]},
                               {"name": "fc2", "op": "dense", "inputs": ["act", "w2"]}],
                     "outputs": ["fc2"]}
                conn.request("POST", "/v1/compile", body(graph=g),
                             {"Content-Type": "application/json"})
            elif r < 0.88:
                kind = "bad"
                m, path, b, want = rnd.choice(BAD)
                if m == "RAW":
                    st = raw(path)
                    record(kind, (time.time() - t0) * 1e3, st, st == want)
                    continue
                conn.request(m, path, b, {"Content-Type": "application/json"})
            elif r < 0.90:
                kind = "cancel"
                w = {"op": "dense", "shape": {"M": rnd.randint(300, 600), "N": 257, "K": 129}}
                c2 = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
                c2.request("POST", "/v1/compile", body(workloads=[w], stream=True),
                           {"Content-Type": "application/json"})
                resp = c2.getresponse()
                first = json.loads(resp.readline())
                conn.request("DELETE", "/v1/jobs/" + first["job"])
                c2.close()
            elif r < 0.95:
                kind = "metrics"
                conn.request("GET", "/metrics")
            else:
                kind = "stats"
                conn.request("GET", "/v1/cache/stats")
            resp = conn.getresponse()
            resp.read()
            ms = (time.time() - t0) * 1e3
            record(kind, ms, resp.status, resp.status == want)
            if resp.getheader("Connection", "").lower() == "close":
                conn.close()
                conn = None
        except Exception as e:  # a reset, a timeout: an unexpected answer
            record(kind, (time.time() - t0) * 1e3, type(e).__name__, False)
            if conn:
                conn.close()
            conn = None


def rss_sampler(stop):
    t0 = time.time()
    while time.time() < stop:
        try:
            with open(f"/proc/{PID}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss.append((round(time.time() - t0, 1), int(line.split()[1]) / 1024))
        except OSError:
            pass
        time.sleep(10)


def main():
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)
    c.request("POST", "/v1/compile", body(workloads=WARM), {"Content-Type": "application/json"})
    a = json.loads(c.getresponse().read())
    keys = [k["key"] for k in a["kernels"]]
    stop = time.time() + SECONDS
    ts = [threading.Thread(target=rss_sampler, args=(stop,))]
    ts += [threading.Thread(target=client, args=(keys, stop, i)) for i in range(CLIENTS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()

    def pct(v, p):
        v = sorted(v)
        return v[min(len(v) - 1, int(p / 100 * len(v)))] if v else 0

    out = {"clients": CLIENTS, "seconds": SECONDS, "kinds": {}, "rss_mib": rss}
    for k, v in sorted(lat.items()):
        out["kinds"][k] = {"n": len(v), "p50_ms": round(pct(v, 50), 2), "p99_ms": round(pct(v, 99), 2),
                           "status": status[k], "unexpected": unexpected.get(k, 0)}
    print(json.dumps(out))


main()
