"""tlmd_client — a single-file client for the tlmd compile server (proto/openapi.yaml).

Standard library only (urllib, json). Copy this file next to your code.

    from tlmd_client import Client
    c = Client("http://127.0.0.1:8470")            # or $TLMD_SERVER / $TLMC_SERVER
    for ev in c.compile_stream("cpu", model={"name": "resnet50"}):
        if ev["event"] == "kernel":
            k = ev["kernel"]; print(ev["index"], k["node"], k["occurrences"], k["cache"])
    answer = c.compile("cuda:sm_90", workloads=[{"op": "dense", "shape": {"M": 64, "N": 64, "K": 64}}])
    c.save(answer, "out/")                          # binaries, sources, meta, manifest.json

Errors from the server raise TlmdError(status, code, message, field); a server that cannot
be reached raises urllib.error.URLError.
"""

import hashlib
import json
import os
import urllib.error
import urllib.request

__all__ = ["Client", "TlmdError"]


class TlmdError(Exception):
    """The server's {"error": {"code", "message", "field"}} with the HTTP status."""

    def __init__(self, status, code, message, field=""):
        super().__init__(f"{status} {code}{' at ' + field if field else ''}: {message}")
        self.status, self.code, self.message, self.field = status, code, message, field


def _error_from(status, body):
    try:
        e = json.loads(body)["error"]
        return TlmdError(status, e.get("code", ""), e.get("message", ""), e.get("field", ""))
    except (ValueError, KeyError, TypeError):
        return TlmdError(status, "", body[:300].decode("utf-8", "replace") if body else "")


class Client:
    def __init__(self, server=None, token=None, timeout=600.0):
        server = server or os.environ.get("TLMD_SERVER") or os.environ.get("TLMC_SERVER")
        server = server or "http://127.0.0.1:8470"
        if "://" not in server:
            server = "http://" + server
        self.server = server.rstrip("/")
        self.token = token if token is not None else os.environ.get("TLMC_TOKEN") or None
        self.timeout = timeout

    # ---- plumbing ----

    def _open(self, method, path, body=None, accept=None):
        headers = {"User-Agent": "tlmd_client.py/0.1"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if accept:
            headers["Accept"] = accept
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        req = urllib.request.Request(self.server + path, data=data, method=method, headers=headers)
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raise _error_from(e.code, e.read()) from None

    def _json(self, method, path, body=None):
        with self._open(method, path, body) as r:
            return json.loads(r.read())

    # ---- the API ----

    def health(self):
        """True when /healthz and /readyz both answer 200."""
        try:
            self._json("GET", "/healthz")
            self._json("GET", "/readyz")
            return True
        except TlmdError:
            return False

    def version(self):
        return self._json("GET", "/v1/version")

    def targets(self):
        return self._json("GET", "/v1/targets")

    def models(self):
        """The model zoo: [{"name", "description", "options": {opt: {default, min, max}}}]."""
        return self._json("GET", "/v1/models")["models"]

    def cache_stats(self):
        return self._json("GET", "/v1/cache/stats")

    def job(self, job_id):
        return self._json("GET", "/v1/jobs/" + job_id)

    def cancel(self, job_id):
        return self._json("DELETE", "/v1/jobs/" + job_id)

    @staticmethod
    def _request(target, workloads, graph, model, **opts):
        given = [x for x in (workloads, graph, model) if x is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of workloads, graph, model")
        body = {"target": target}
        if workloads is not None:
            body["workloads"] = [workloads] if isinstance(workloads, dict) else list(workloads)
        elif graph is not None:
            body["graph"] = graph
        else:
            body["model"] = {"name": model} if isinstance(model, str) else model
        body.update({k: v for k, v in opts.items() if v is not None})
        return body

    def compile(self, target, workloads=None, graph=None, model=None, mode=None,
                candidates=None, include_binary=None):
        """One answer: {"job", "target", "kernels": [...], "stats", "model"?}."""
        body = self._request(target, workloads, graph, model, mode=mode,
                             candidates=candidates, include_binary=include_binary)
        return self._json("POST", "/v1/compile", body)

    def compile_stream(self, target, workloads=None, graph=None, model=None, mode=None,
                       candidates=None, include_binary=None):
        """Yields the NDJSON events as they arrive: accepted, kernel (one per unique
        subgraph, any order, "index" says which), done. An "error" event raises TlmdError."""
        body = self._request(target, workloads, graph, model, mode=mode,
                             candidates=candidates, include_binary=include_binary, stream=True)
        with self._open("POST", "/v1/compile", body, accept="application/x-ndjson") as r:
            for line in r:
                line = line.strip()
                if not line:
                    continue
                ev = json.loads(line)
                if ev.get("event") == "error":
                    e = ev.get("error", {})
                    raise TlmdError(ev.get("status", 500), e.get("code", ""),
                                    e.get("message", ""), e.get("field", ""))
                yield ev

    def kernel(self, key):
        """(binary bytes, {"entry", "launch", "format", "sha256"}), checked against its SHA-256."""
        with self._open("GET", "/v1/kernels/" + key) as r:
            data = r.read()
            h = r.headers
            info = {"entry": h.get("X-TLM-Entry"), "format": h.get("X-TLM-Format"),
                    "launch": json.loads(h.get("X-TLM-Launch") or "{}"),
                    "sha256": h.get("X-TLM-SHA256")}
        if info["sha256"] and hashlib.sha256(data).hexdigest() != info["sha256"]:
            raise TlmdError(200, "corrupt", "the binary does not match its SHA-256")
        return data, info

    def kernel_source(self, key):
        with self._open("GET", "/v1/kernels/" + key + "/source") as r:
            return r.read().decode()

    def kernel_meta(self, key):
        return self._json("GET", "/v1/kernels/" + key + "/meta")

    def save(self, answer, directory):
        """Writes every kernel of a compile answer (or a list of stream events) like
        `tlmc compile -o DIR`: NNN_<op>.so|.cubin, .c|.cu, .json and manifest.json.
        Returns the manifest."""
        if isinstance(answer, dict):
            kernels, model, target, stats = (answer["kernels"], answer.get("model"),
                                              answer.get("target"), answer.get("stats"))
        else:
            by_index, model, target, stats = {}, None, None, None
            for ev in answer:
                if ev["event"] == "accepted":
                    model, target = ev.get("model"), ev.get("target")
                elif ev["event"] == "kernel":
                    by_index[ev["index"]] = ev["kernel"]
                elif ev["event"] == "done":
                    stats, model = ev.get("stats"), ev.get("model", model)
            kernels = [by_index[i] for i in sorted(by_index)]
        os.makedirs(directory, exist_ok=True)
        width = max(3, len(str(len(kernels) - 1)))
        entries = []
        for i, k in enumerate(kernels):
            cubin = k["format"] == "cubin"
            stem = f"{i:0{width}d}_{k['workload']['op']}"
            names = {"binary": stem + (".cubin" if cubin else ".so"),
                     "source": stem + (".cu" if cubin else ".c"), "meta": stem + ".json"}
            data, _ = self.kernel(k["key"])
            if hashlib.sha256(data).hexdigest() != k["binary_sha256"]:
                raise TlmdError(200, "corrupt", f"kernel {i}: SHA-256 mismatch")
            meta = self.kernel_meta(k["key"])
            meta.update(index=i, occurrences=k.get("occurrences", 1), node=k.get("node"))
            _write(os.path.join(directory, names["binary"]), data)
            _write(os.path.join(directory, names["source"]),
                   self.kernel_source(k["key"]).encode())
            _write(os.path.join(directory, names["meta"]),
                   json.dumps(meta, indent=2, sort_keys=True).encode())
            entry = {"index": i, "occurrences": k.get("occurrences", 1)}
            for f in ("node", "workload", "workload_hash", "key", "cache", "entry", "format",
                      "launch", "binary_sha256", "binary_size", "url"):
                if f in k:
                    entry[f] = k[f]
            entry.update(names)
            entries.append(entry)
        manifest = {"version": 1, "server": self.server, "model": model, "target": target,
                    "kernels": entries, "stats": stats}
        _write(os.path.join(directory, "manifest.json"), json.dumps(manifest, indent=2).encode())
        return manifest


def _write(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)  # a reader never sees half a file
