#!/bin/sh
# The Debian packages tlmd needs, probed with pkg-config and a few files.
#
#   deps.sh [-q]                 install what is missing when run as root (one `apt-get update`
#                                first); otherwise print the exact command and exit 1. -q: quiet
#                                when nothing is missing. `make deps|test|run|bench` run this.
#   deps.sh --check [SCOPE]      probe only, never install: exit 0 silently when SCOPE's
#                                packages are present, else name the missing ones and the
#                                command that installs them (exit 1). `make` runs this before it
#                                compiles anything, so a fresh machine gets this message instead
#                                of a compiler error. SCOPE: build (libraries, tlm, tlmd, tlmc;
#                                the default), test (build + Criterion), bench (build + oneDNN),
#                                fuzz (build + clang with libFuzzer's runtime, `make fuzz`),
#                                all (everything, with numpy for the reference checks).
set -eu

mode=install
scope=all
quiet=0
case "${1:-}" in
--check)
    mode=check
    scope=${2:-build}
    ;;
-q) quiet=1 ;;
"") ;;
*)
    echo "usage: deps.sh [-q] | deps.sh --check [build|test|bench|fuzz|all]" >&2
    exit 2
    ;;
esac
case "$scope" in
build | test | bench | fuzz | all) ;;
*)
    echo "deps.sh: unknown scope '$scope' (build, test, bench, fuzz or all)" >&2
    exit 2
    ;;
esac

# pkg-config module -> Debian package, per scope
pc_build="jansson:libjansson-dev libcrypto:libssl-dev openblas:libopenblas-dev
sqlite3:libsqlite3-dev libuv:libuv1-dev libmicrohttpd:libmicrohttpd-dev xgboost:libxgboost-dev
libsystemd:libsystemd-dev libcurl:libcurl4-openssl-dev libprotobuf-c:libprotobuf-c-dev
hiredis:libhiredis-dev"
pc_test="criterion:libcriterion-dev"
# the tests' command-line tools: the crash-loop test (bench/crashloop.sh) checks the store with
# sqlite3 and talks to tlmd with curl; the Python client's tests and helper scripts use python3;
# the cluster tests (tests/daemon/test_cluster.c) start a real redis-server and poke it with
# redis-cli
files_test="/usr/bin/sqlite3:sqlite3 /usr/bin/curl:curl /usr/bin/python3:python3
/usr/bin/redis-server:redis-server /usr/bin/redis-cli:redis-tools"
pcs=$pc_build
# protoc-c regenerates compiler/frontend/onnx.pb-c.[ch] when onnx.proto changes
files="/usr/bin/protoc-c:protobuf-c-compiler"
fuzz=0
case "$scope" in
test) pcs="$pcs $pc_test"; files="$files $files_test" ;;
# the bench scripts' plots (soak, hits, eval, real_shapes) use matplotlib on /usr/bin/python3
bench) files="$files /usr/include/dnnl.h:libdnnl-dev /usr/lib/python3/dist-packages/matplotlib:python3-matplotlib" ;;
fuzz) fuzz=1 ;;
all)
    pcs="$pcs $pc_test"
    files="$files $files_test /usr/include/dnnl.h:libdnnl-dev /usr/lib/python3/dist-packages/numpy:python3-numpy
/usr/lib/python3/dist-packages/matplotlib:python3-matplotlib"
    ;;
esac

missing=""
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
command -v cc >/dev/null 2>&1 || missing="$missing gcc"
command -v make >/dev/null 2>&1 || missing="$missing make"
# objdump: a codegen test reads the built kernels' machine code (gcc pulls binutils in too)
command -v objdump >/dev/null 2>&1 || missing="$missing binutils"

# Fast path (every `make` runs this): one pkg-config call for all modules.
modules=""
for p in $pcs; do modules="$modules ${p%%:*}"; done
# shellcheck disable=SC2086
if [ -n "$missing" ] || ! pkg-config --exists $modules 2>/dev/null; then
    for p in $pcs; do
        pkg-config --exists "${p%%:*}" 2>/dev/null || missing="$missing ${p#*:}"
    done
fi
for f in $files; do
    [ -e "${f%%:*}" ] || missing="$missing ${f#*:}"
done
# libFuzzer's runtime is only "recommended" by Debian's clang: name the versioned package
if [ "$fuzz" = 1 ]; then
    command -v clang >/dev/null 2>&1 || missing="$missing clang"
    v=$(clang -dumpversion 2>/dev/null | cut -d. -f1)
    # shellcheck disable=SC2086
    ls /usr/lib/llvm-${v:-14}/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 ||
        missing="$missing libclang-rt-${v:-14}-dev"
fi

if [ -z "$missing" ]; then
    [ "$mode" = check ] || [ "$quiet" = 1 ] || echo "deps: all present"
    exit 0
fi

if [ "$mode" = check ]; then
    {
        echo "tlmd: cannot build ($scope): missing Debian packages:$missing"
        echo "tlmd: install them with \`make deps\` (as root), or run:" \
            "sudo apt-get update && sudo apt-get install -y$missing"
    } >&2
    exit 1
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
