#!/bin/sh
# bench/setup_tvm.sh — the TVM MetaSchedule peer's bench-only virtualenv bench/.venv-tvm
# (idempotent). Never needed by `make test`; bench/peers_tvm.py runs in it.
#
# The working combination (pinned below), from PyPI wheels only, Python 3.11 (Debian's
# /usr/bin/python3 -m venv):
#     apache-tvm 0.26.0 + apache-tvm-ffi 0.1.13.post2 + xgboost + psutil + cloudpickle
#
# What was tried (December 2026, this 2-core Sapphire Rapids VM):
#   - apache-tvm 0.27.0.post1 with apache-tvm-ffi 0.1.15.post2 (what `pip install apache-tvm`
#     gives a new user): segfaults in tvm-ffi's ToJSONGraph as soon as a MetaSchedule
#     TuneContext is built (tune_tir and tune_tasks alike); plain tvm.build works (issue 11).
#   - apache-tvm 0.25.0 against apache-tvm-ffi 0.1.15.post2: fails to load (undefined symbol;
#     issue 11). Its metadata asks only apache-tvm-ffi>=0.1.12, so pip picks the newest ffi.
#   - apache-tvm 0.26.0 with apache-tvm-ffi 0.1.15.post2 (what pip picks for 0.26.0, whose
#     metadata asks apache-tvm-ffi>=0.1.13.post2): the same ToJSONGraph segfault, reproduced
#     here by just building an ms.TuneContext (rc 139).
#   - apache-tvm 0.26.0 with apache-tvm-ffi 0.1.14.post1 / 0.1.14.post0: inconclusive (the
#     TuneContext smoke test ran past 120 s while niced on the loaded machine); not used.
#   - apache-tvm 0.26.0 with apache-tvm-ffi 0.1.13.post2, the oldest it allows: imports,
#     builds, tune_tir runs end to end, the tuned kernels match numpy (this script).
#     apache-tvm 0.27.0.post1 requires apache-tvm-ffi>=0.1.14.post0, so it cannot take it.
#   - Older wheels (the pre-relax `tvm.meta_schedule` API): PyPI has only apache-tvm 0.25 and
#     later (`pip index versions apache-tvm`); mlc-ai nightlies are not on PyPI.
#   - Building TVM from source: not needed (and too slow on 2 cores).
#
# API notes for 0.26 (peers_tvm.py handles them): `tvm.tir` is `tvm.tirx`, MetaSchedule is
# `tvm.s_tir.meta_schedule`, targets are dicts ({"kind": "llvm", "mcpu": ...}; the string form
# "llvm -mcpu=..." is refused). MetaSchedule's default LocalBuilder imports
# tvm.s_tir.tensor_intrin in every build worker, which takes ~60 s on this machine, more than
# its 30 s build timeout: every build "times out" and tuning finds nothing. peers_tvm.py passes
# a build function without that import.
#
# Usage: bench/setup_tvm.sh        Exit 0 when the venv imports tvm's MetaSchedule and xgboost.
set -eu
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
V=bench/.venv-tvm
TVM=apache-tvm==0.26.0
FFI=apache-tvm-ffi==0.1.13.post2

check() {
    "$V/bin/python" - <<'EOF' >/dev/null 2>&1
import importlib.metadata as m, tvm, xgboost, psutil, cloudpickle
from tvm.s_tir import meta_schedule
assert m.version("apache-tvm") == "0.26.0", m.version("apache-tvm")
assert m.version("apache-tvm-ffi") == "0.1.13.post2", m.version("apache-tvm-ffi")
EOF
}

if ! check; then
    if ! "$PY" -c "import ensurepip, venv" >/dev/null 2>&1; then
        echo "bench/setup_tvm.sh: $PY has no venv module; as root: apt-get install -y python3-venv" >&2
        exit 1
    fi
    [ -x "$V/bin/python" ] || "$PY" -m venv "$V"
    echo "bench/setup_tvm.sh: $TVM $FFI into $V (pip)"
    "$V/bin/pip" install -q --disable-pip-version-check "$TVM" "$FFI" xgboost psutil \
        cloudpickle numpy
fi
if ! check; then
    echo "bench/setup_tvm.sh: $V does not import tvm $TVM with $FFI and xgboost" >&2
    exit 1
fi
"$V/bin/python" -c 'import importlib.metadata as m
print("bench/setup_tvm.sh: apache-tvm", m.version("apache-tvm"), "apache-tvm-ffi",
      m.version("apache-tvm-ffi"), "xgboost", m.version("xgboost"), "numpy", m.version("numpy"))'
