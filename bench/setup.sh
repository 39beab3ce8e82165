#!/bin/sh
# bench/setup.sh — what the real-shapes benchmark's peers need, installed once (idempotent).
# Never needed by `make test`; `make bench` calls it through bench/real_shapes.sh.
#
#   - PyTorch eager for the Debian python (/usr/bin/python3: python3-torch; not the pyenv
#     python that may come first on PATH), matplotlib for the plot, numpy.
#   - ONNX Runtime CPU + onnx in a bench-only virtualenv bench/.venv (pip), optional: a
#     failure there is reported and the ORT column stays empty.
#
# Usage: bench/setup.sh [--no-ort]    (as root for apt-get; otherwise prints the command)
# Exit 0 when PyTorch and matplotlib are importable by /usr/bin/python3 afterwards.
set -eu
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
want_ort=1
[ "${1:-}" = --no-ort ] && want_ort=0

have() { "$PY" -c "import $1" >/dev/null 2>&1; }

pkgs=""
have torch || pkgs="$pkgs python3-torch"
have matplotlib || pkgs="$pkgs python3-matplotlib"
have numpy || pkgs="$pkgs python3-numpy"
[ $want_ort = 1 ] && ! "$PY" -c "import ensurepip, venv" >/dev/null 2>&1 && pkgs="$pkgs python3-venv"
if [ -n "$pkgs" ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "bench/setup.sh: missing Debian packages:$pkgs; run as root: apt-get install -y$pkgs" >&2
        exit 1
    fi
    echo "bench/setup.sh: installing$pkgs"
    # One update per setup, and only when something is missing (an empty package list on a
    # fresh image makes apt-get install fail).
    apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
fi
if ! have torch || ! have matplotlib; then
    echo "bench/setup.sh: torch or matplotlib still not importable by $PY" >&2
    exit 1
fi

if [ $want_ort = 1 ]; then
    V=bench/.venv
    if ! "$V/bin/python" -c "import onnxruntime, onnx, numpy" >/dev/null 2>&1; then
        echo "bench/setup.sh: ONNX Runtime into $V (pip)"
        { [ -x "$V/bin/python" ] || "$PY" -m venv "$V"; } &&
            "$V/bin/pip" install -q --disable-pip-version-check onnxruntime onnx numpy ||
            echo "bench/setup.sh: ONNX Runtime not installed (the ORT column stays empty)" >&2
    fi
fi
echo "bench/setup.sh: torch $("$PY" -c 'import torch; print(torch.__version__)')," \
    "ORT $([ -x bench/.venv/bin/python ] && bench/.venv/bin/python -c 'import onnxruntime as o; print(o.__version__)' 2>/dev/null || echo none)"
