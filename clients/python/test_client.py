#!/usr/bin/python3
"""Tests of tlmd_client.py against a real tlmd on loopback (run by `make test`).

TLMD_BIN names the daemon and TLM_BIN the offline tool that makes a tiny random model
(defaults: build/san/tlmd, build/san/tlm from the repository root). One daemon with a
temporary store serves every test of the class."""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tlmd_client import Client, TlmdError  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

GRAPH = {
    "name": "twin-dense",
    "inputs": [{"name": "x", "shape": [4, 32]}, {"name": "w1", "shape": [32, 32]},
               {"name": "w2", "shape": [32, 32]}, {"name": "w3", "shape": [32, 8]}],
    "nodes": [{"name": "fc1", "op": "dense", "inputs": ["x", "w1"]},
              {"name": "t1", "op": "tanh", "inputs": ["fc1"]},
              {"name": "fc2", "op": "dense", "inputs": ["t1", "w2"]},
              {"name": "t2", "op": "tanh", "inputs": ["fc2"]},
              {"name": "fc3", "op": "dense", "inputs": ["t2", "w3"]}],
}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class TlmdClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tlmd-py-")
        tlm = os.environ.get("TLM_BIN") or os.path.join(ROOT, "build/san/tlm")
        tlmd = os.environ.get("TLMD_BIN") or os.path.join(ROOT, "build/san/tlmd")
        weights = os.path.join(cls.dir, "tlm.bin")
        subprocess.run([tlm, "model", "init", "--layers", "2", "--heads", "2", "--dim", "64",
                        "--ctx", "512", "-o", weights], check=True, stdout=subprocess.DEVNULL,
                       timeout=120)
        cls.log = open(os.path.join(cls.dir, "tlmd.log"), "wb")
        for _ in range(5):
            cls.port = free_port()
            cls.proc = subprocess.Popen(
                [tlmd, "--listen", f"127.0.0.1:{cls.port}", "--store",
                 os.path.join(cls.dir, "tlmd.db"), "--weights", weights],
                stdout=cls.log, stderr=subprocess.STDOUT)
            cls.client = Client(f"127.0.0.1:{cls.port}", timeout=300)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 60 and cls.proc.poll() is None:
                try:
                    if cls.client.health():
                        return
                except (urllib.error.URLError, ConnectionError):
                    pass
                time.sleep(0.05)
            if cls.proc.poll() is None:
                cls.proc.kill()
                cls.proc.wait()
        raise RuntimeError("tlmd did not start; see " + cls.log.name)

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        try:
            rc = cls.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            cls.proc.kill()
            rc = cls.proc.wait()
        cls.log.close()
        if rc != 0:
            with open(os.path.join(cls.dir, "tlmd.log"), errors="replace") as f:
                print(f.read()[-3000:])
        shutil.rmtree(cls.dir, ignore_errors=True)
        assert rc == 0, f"tlmd exited with {rc}"

    def test_models_version_targets(self):
        models = {m["name"]: m for m in self.client.models()}
        self.assertIn("resnet50", models)
        self.assertIn("llama_7b", models)
        self.assertEqual(models["bert_base"]["options"]["seq_len"]["default"], 128)
        self.assertNotIn("seq_len", models["resnet50"]["options"])
        self.assertEqual(self.client.version()["api"], "v1")
        self.assertIn("cuda:sm_90", json.dumps(self.client.targets()))

    def test_compile_workloads_and_fetch(self):
        w = {"op": "dense", "shape": {"M": 16, "N": 32, "K": 8}, "epilogue": ["relu"]}
        a = self.client.compile("cpu", workloads=w)
        self.assertEqual(len(a["kernels"]), 1)
        k = a["kernels"][0]
        self.assertEqual(k["format"], "elf-so")
        self.assertNotIn("occurrences", k)  # only graph and model requests count launches
        data, info = self.client.kernel(k["key"])
        self.assertEqual(hashlib.sha256(data).hexdigest(), k["binary_sha256"])
        self.assertEqual(data[:4], b"\x7fELF")
        self.assertEqual(info["entry"], k["entry"])
        self.assertIn("tlm_kernel", self.client.kernel_source(k["key"]))
        self.assertEqual(self.client.kernel_meta(k["key"])["key"], k["key"])
        again = self.client.compile("cpu", workloads=[w])
        self.assertEqual(again["kernels"][0]["cache"], "hit")
        self.assertEqual(self.client.job(again["job"])["state"], "done")

    def test_stream_graph_events_then_save_and_hits(self):
        events = list(self.client.compile_stream("cuda:sm_90", graph=GRAPH))
        kinds = [e["event"] for e in events]
        self.assertEqual(kinds[0], "accepted")
        self.assertEqual(kinds[-1], "done")
        self.assertEqual(kinds.count("kernel"), 2)
        self.assertEqual(events[0]["model"]["name"], "twin-dense")
        self.assertEqual(events[0]["model"]["launches"], 3)
        by_index = {e["index"]: e["kernel"] for e in events if e["event"] == "kernel"}
        self.assertEqual(by_index[0]["occurrences"], 2)  # fc1+tanh and fc2+tanh
        self.assertEqual(by_index[0]["node"], "fc1")
        self.assertEqual(by_index[1]["occurrences"], 1)
        self.assertEqual(by_index[1]["workload"]["shape"]["N"], 8)
        done = events[-1]
        self.assertEqual(done["stats"]["subgraphs"], 2)
        self.assertEqual(done["stats"]["misses"] + done["stats"]["hits"], 2)
        out = os.path.join(self.dir, "saved")
        man = self.client.save(events, out)
        self.assertEqual([k["binary"] for k in man["kernels"]],
                         ["000_dense.cubin", "001_dense.cubin"])
        for k in man["kernels"]:
            with open(os.path.join(out, k["binary"]), "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), k["binary_sha256"])
            self.assertIn("grid", k["launch"])
        with open(os.path.join(out, "manifest.json")) as f:
            self.assertEqual(json.load(f)["kernels"][0]["occurrences"], 2)
        # the same graph again, not streamed: every subgraph is a cache hit
        a = self.client.compile("cuda:sm_90", graph=GRAPH)
        self.assertEqual([k["cache"] for k in a["kernels"]], ["hit", "hit"])
        self.assertEqual(a["stats"]["hits"], 2)

    def test_errors_name_the_field(self):
        bad = dict(GRAPH, nodes=[{"name": "y", "op": "dense", "inputs": ["x", "nope"]}])
        with self.assertRaises(TlmdError) as cm:
            self.client.compile("cpu", graph=bad)
        self.assertEqual(cm.exception.status, 400)
        self.assertEqual(cm.exception.code, "invalid_field")
        self.assertEqual(cm.exception.field, "graph.nodes[0].inputs[1]")
        with self.assertRaises(TlmdError) as cm:
            list(self.client.compile_stream("cpu", model={"name": "resnet50", "seq_len": 8}))
        self.assertEqual((cm.exception.status, cm.exception.field), (400, "model.seq_len"))
        with self.assertRaises(TlmdError) as cm:
            self.client.compile("cpu", model="alexnet")
        self.assertEqual((cm.exception.status, cm.exception.code), (422, "unsupported"))
        with self.assertRaises(TlmdError) as cm:
            self.client.kernel("0" * 64)
        self.assertEqual(cm.exception.status, 404)
        with self.assertRaises(ValueError):
            self.client.compile("cpu")


if __name__ == "__main__":
    unittest.main(verbosity=2)
