#!/bin/sh
# Check every build/test dependency; install the missing Debian packages when
# run as root (one `apt-get update` first), otherwise print the exact command.
set -eu

# pkg-config module or probe file -> Debian package
missing=""
need_pc() { pkg-config --exists "$1" 2>/dev/null || missing="$missing $2"; }
need_file() { [ -e "$1" ] || missing="$missing $2"; }
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing="$missing $2"; }

need_cmd pkg-config pkg-config
need_cmd cc gcc
need_cmd make make
need_pc jansson libjansson-dev
need_pc libcrypto libssl-dev
need_pc openblas libopenblas-dev
need_pc criterion libcriterion-dev
need_pc libuv libuv1-dev
need_pc libmicrohttpd libmicrohttpd-dev
need_pc sqlite3 libsqlite3-dev
need_pc libcurl libcurl4-openssl-dev
need_pc libsystemd libsystemd-dev
need_file /usr/include/dnnl.h libdnnl-dev
need_file /usr/lib/python3/dist-packages/numpy python3-numpy

if [ -z "$missing" ]; then
    [ "${1:-}" = "-q" ] || echo "deps: all present"
    exit 0
fi

if [ "$(id -u)" = 0 ]; then
    echo "deps: installing:$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing
else
    echo "deps: missing packages; run:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y$missing" >&2
    exit 1
fi
