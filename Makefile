# tlmd build. Sources are discovered by folder, so a new module needs no edit here:
#   compiler/*/*.c -> build/libtlm.a        (the compiler library, no servers)
#   proto/*.c      -> build/libtlmproto.a   (JSON codecs between the wire and the compiler)
#   store/*.c      -> build/libtlmstore.a   (SQLite kernel cache)
#   tools/tlm/*.c  -> build/tlm             (offline toolkit)
#   daemon/*.c     -> build/tlmd            (the compile server; + hiredis for the cluster tier)
#   clients/tlmc/*.c -> build/tlmc          (the command-line client; libcurl, no compiler)
#   tests/**/test_*.c -> one Criterion binary each, built with ASan+UBSan under build/san/
#   bench/*.c      -> build/bench/<name>

CC       ?= cc
PREFIX   ?= /usr/local
DESTDIR  ?=
BUILD    := build
SAN      := $(BUILD)/san
CUDA_HOME ?= /usr/local/cuda

# pkg-config runs at the first recipe that needs a flag, once (`once`), not when the Makefile is
# read: so `make test` on a fresh machine sees what its `deps` step has just installed.
once = $(eval $(1) := $$(shell $(2)))$($(1))
PKGS     := jansson libcrypto openblas sqlite3 libprotobuf-c xgboost
PKG_CFLAGS = $(call once,PKG_CFLAGS,pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(call once,PKG_LIBS,pkg-config --libs $(PKGS) 2>/dev/null)

WARN     := -Wall -Wextra -Wno-unused-parameter -Wshadow -Wstrict-prototypes
CFLAGS   ?= -O2 -g
BASEFLAGS = -std=gnu11 -fopenmp -fPIC -I. $(WARN) $(PKG_CFLAGS) -D_GNU_SOURCE
LDLIBS   = $(PKG_LIBS) -fopenmp -ldl -lm -lpthread
SANFLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

# CUDA: headers only at build time. Libraries (libcuda, libnvrtc, libcublas) are
# dlopen'ed at run time so every binary starts on machines without a driver.
ifneq ($(wildcard $(CUDA_HOME)/include/cuda.h),)
  HAVE_CUDA := 1
  BASEFLAGS += -DTLM_HAVE_CUDA_HEADERS=1 -DTLM_CUDA_HOME='"$(CUDA_HOME)"' -isystem $(CUDA_HOME)/include
  NVCC     := $(CUDA_HOME)/bin/nvcc
else
  HAVE_CUDA := 0
  $(info tlmd: CUDA toolkit not found under CUDA_HOME=$(CUDA_HOME); building CPU targets only)
endif

LIB_SRC   := $(sort $(wildcard compiler/*/*.c))
PROTO_SRC := $(sort $(wildcard proto/*.c))
STORE_SRC := $(sort $(wildcard store/*.c))
TLM_SRC   := $(sort $(wildcard tools/tlm/*.c))
DAEMON_SRC := $(sort $(wildcard daemon/*.c))
TEST_SRC  := $(sort $(shell find tests -name 'test_*.c' 2>/dev/null))
BENCH_SRC := $(sort $(wildcard bench/*.c))
# tlmc does not link libtlm; it compiles the one libcrypto-only helper file it shares with it.
TLMC_SRC  := $(sort $(wildcard clients/tlmc/*.c)) compiler/util/util.c
TLMC_LIBS = $(call once,TLMC_LIBS,pkg-config --libs libcurl jansson libcrypto 2>/dev/null)

obj = $(patsubst %.c,$(1)/obj/%.o,$(2))

LIB_OBJ       := $(call obj,$(BUILD),$(LIB_SRC))
PROTO_OBJ     := $(call obj,$(BUILD),$(PROTO_SRC))
STORE_OBJ     := $(call obj,$(BUILD),$(STORE_SRC))
TLM_OBJ       := $(call obj,$(BUILD),$(TLM_SRC))
SAN_LIB_OBJ   := $(call obj,$(SAN),$(LIB_SRC))
SAN_PROTO_OBJ := $(call obj,$(SAN),$(PROTO_SRC))
SAN_STORE_OBJ := $(call obj,$(SAN),$(STORE_SRC))
SAN_TLM_OBJ   := $(call obj,$(SAN),$(TLM_SRC))
DAEMON_OBJ    := $(call obj,$(BUILD),$(DAEMON_SRC))
SAN_DAEMON_OBJ := $(call obj,$(SAN),$(DAEMON_SRC))
DAEMON_LIBS   = $(call once,DAEMON_LIBS,pkg-config --libs libmicrohttpd libuv libsystemd hiredis 2>/dev/null)
TEST_BIN      := $(patsubst tests/%.c,$(SAN)/tests/%,$(TEST_SRC))
BENCH_BIN     := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

.PHONY: all weights deps deps-check-build deps-check-test deps-check-bench deps-check-fuzz test \
    test-build run bench fuzz install clean format
.DEFAULT_GOAL := all

all: $(BUILD)/libtlm.a $(BUILD)/libtlmproto.a $(BUILD)/libtlmstore.a $(BUILD)/tlm $(BUILD)/tlmd \
    $(BUILD)/tlmc

# `make deps` installs the missing Debian packages (as root) or prints the command.
deps:
	@./scripts/deps.sh

# Everything that compiles waits for a probe of the packages it needs (order-only, ~20 ms once
# per make), so a machine without them stops at once with their names and `make deps`, not with
# a compiler error. test, run and bench install them first, as `make deps` does.
deps-check-build:
	@./scripts/deps.sh --check build
deps-check-test:
	@./scripts/deps.sh --check test
deps-check-bench:
	@./scripts/deps.sh --check bench
deps-check-fuzz:
	@./scripts/deps.sh --check fuzz
ifneq ($(filter test test-build run bench,$(MAKECMDGOALS)),)
deps-check-build deps-check-test deps-check-bench: deps
endif

# The ONNX protobuf decoder (compiler/frontend/onnx.pb-c.[ch]) is generated from the vendored
# onnx.proto and committed; it is regenerated only when onnx.proto changes (protoc-c).
compiler/frontend/onnx.pb-c.c compiler/frontend/onnx.pb-c.h: compiler/frontend/onnx.proto
	cd compiler/frontend && protoc-c --c_out=. onnx.proto

$(BUILD)/obj/%.o: %.c | deps-check-build
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(SAN)/obj/%.o: %.c | deps-check-build
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(SANFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libtlm.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libtlmproto.a: $(PROTO_OBJ)
	rm -f $@ && ar rcs $@ $^

$(SAN)/libtlm.a: $(SAN_LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(SAN)/libtlmproto.a: $(SAN_PROTO_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libtlmstore.a: $(STORE_OBJ)
	rm -f $@ && ar rcs $@ $^

$(SAN)/libtlmstore.a: $(SAN_STORE_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/tlm: $(TLM_OBJ) $(BUILD)/libtlmstore.a $(BUILD)/libtlmproto.a $(BUILD)/libtlm.a
	$(CC) $(BASEFLAGS) $(CFLAGS) -o $@ $(TLM_OBJ) $(BUILD)/libtlmstore.a $(BUILD)/libtlmproto.a $(BUILD)/libtlm.a $(LDLIBS)

# The sanitized tlm is what integration tests drive.
$(SAN)/tlm: $(SAN_TLM_OBJ) $(SAN)/libtlmstore.a $(SAN)/libtlmproto.a $(SAN)/libtlm.a
	$(CC) $(BASEFLAGS) $(SANFLAGS) -o $@ $(SAN_TLM_OBJ) $(SAN)/libtlmstore.a $(SAN)/libtlmproto.a $(SAN)/libtlm.a $(LDLIBS)

$(BUILD)/tlmd: $(DAEMON_OBJ) $(BUILD)/libtlmstore.a $(BUILD)/libtlmproto.a $(BUILD)/libtlm.a
	$(CC) $(BASEFLAGS) $(CFLAGS) -o $@ $(DAEMON_OBJ) $(BUILD)/libtlmstore.a $(BUILD)/libtlmproto.a \
	    $(BUILD)/libtlm.a $(DAEMON_LIBS) $(LDLIBS)

# The sanitized tlmd is what the daemon integration tests start.
$(SAN)/tlmd: $(SAN_DAEMON_OBJ) $(SAN)/libtlmstore.a $(SAN)/libtlmproto.a $(SAN)/libtlm.a
	$(CC) $(BASEFLAGS) $(SANFLAGS) -o $@ $(SAN_DAEMON_OBJ) $(SAN)/libtlmstore.a $(SAN)/libtlmproto.a \
	    $(SAN)/libtlm.a $(DAEMON_LIBS) $(LDLIBS)

# tlmc links only libcurl, jansson and libcrypto: it is what users copy to their machines.
$(BUILD)/tlmc: $(TLMC_SRC) | deps-check-build
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(CFLAGS) -o $@ $(TLMC_SRC) $(TLMC_LIBS)

$(SAN)/tlmc: $(TLMC_SRC) | deps-check-build
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(SANFLAGS) -o $@ $(TLMC_SRC) $(TLMC_LIBS)

$(SAN)/tests/%: tests/%.c $(SAN)/libtlmproto.a $(SAN)/libtlmstore.a $(SAN)/libtlm.a | deps-check-test
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) $(SANFLAGS) -MMD -MP -o $@ $< $(SAN)/libtlmproto.a $(SAN)/libtlmstore.a $(SAN)/libtlm.a \
	    $(LDLIBS) $(shell pkg-config --libs criterion libcurl)

$(BUILD)/bench/%: bench/%.c $(BUILD)/libtlmproto.a $(BUILD)/libtlm.a | deps-check-bench
	@mkdir -p $(dir $@)
	$(CC) $(BASEFLAGS) -O3 -march=native -o $@ $< $(BUILD)/libtlmproto.a $(BUILD)/libtlm.a \
	    $(LDLIBS) -ldnnl

# `make fuzz FUZZ_S=N`: every libFuzzer harness (tests/fuzz/fuzz_*.c, built with Debian clang,
# ASan + UBSan) for N seconds on its seeded corpus; fails on any crash, leak or timeout, and
# prints execs and coverage per harness (scripts/fuzz.sh). FUZZ_RUNS=N stops each harness after N
# executions instead (FUZZ_S then bounds it as well).
FUZZ_S    ?= 60
FUZZ_RUNS ?= 0
FUZZ_SRC  := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN  := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRC))
FUZZ_OBJ  := $(call obj,$(BUILD)/fuzz,$(LIB_SRC) $(PROTO_SRC) $(STORE_SRC) daemon/head.c daemon/request.c)
FUZZFLAGS := -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined

$(BUILD)/fuzz/obj/%.o: %.c | deps-check-fuzz
	@mkdir -p $(dir $@)
	clang $(BASEFLAGS) -Wno-unknown-warning-option $(FUZZFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

.SECONDARY: $(FUZZ_OBJ)
$(BUILD)/fuzz/libtlmfuzz.a: $(FUZZ_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(BUILD)/fuzz/libtlmfuzz.a | deps-check-fuzz
	clang $(BASEFLAGS) $(FUZZFLAGS) -fsanitize=fuzzer -o $@ $< $(BUILD)/fuzz/libtlmfuzz.a $(LDLIBS)

# fuzz_mhd drives libmicrohttpd itself (request bytes on a socketpair), so it links it.
$(BUILD)/fuzz/fuzz_mhd: tests/fuzz/fuzz_mhd.c $(BUILD)/fuzz/libtlmfuzz.a | deps-check-fuzz
	clang $(BASEFLAGS) $(FUZZFLAGS) -fsanitize=fuzzer -o $@ $< $(BUILD)/fuzz/libtlmfuzz.a $(LDLIBS) \
	    $(shell pkg-config --libs libmicrohttpd)

# fuzz_door runs tlmd's HTTP layer (daemon/http.c: the front door, MHD, the libuv loop) on a
# loopback listener.
$(BUILD)/fuzz/fuzz_door: tests/fuzz/fuzz_door.c $(BUILD)/fuzz/obj/daemon/http.o \
    $(BUILD)/fuzz/obj/daemon/metrics.o $(BUILD)/fuzz/libtlmfuzz.a | deps-check-fuzz
	clang $(BASEFLAGS) $(FUZZFLAGS) -fsanitize=fuzzer -o $@ $< $(BUILD)/fuzz/obj/daemon/http.o \
	    $(BUILD)/fuzz/obj/daemon/metrics.o $(BUILD)/fuzz/libtlmfuzz.a $(LDLIBS) $(DAEMON_LIBS)

fuzz: $(FUZZ_BIN)
	FUZZ_RUNS=$(FUZZ_RUNS) ./scripts/fuzz.sh $(FUZZ_S) $(FUZZ_BIN)

test-build: deps all $(SAN)/tlm $(SAN)/tlmd $(SAN)/tlmc $(TEST_BIN)

# Each test binary runs on its own; Criterion forks every test. TLM_BIN points the
# integration tests at the sanitized tools.
test: test-build
	@TLM_BIN=$(abspath $(SAN)/tlm) TLMD_BIN=$(abspath $(SAN)/tlmd) TLMC_BIN=$(abspath $(SAN)/tlmc) \
	    ./scripts/run-tests.sh $(TEST_BIN)

# `make run`: dependencies, build, and tlmd in the foreground on the defaults (127.0.0.1:8470,
# store var/tlmd.db). No model is needed: without trained weights (model_weights/tlm.bin with a
# MANIFEST saying trained = true) tlmd serves the rule-of-thumb schedules, and GET /v1/version
# says which ("schedules": "default" | "tlm").
run: deps all
	@mkdir -p var
	exec $(BUILD)/tlmd

# `make weights`: model_weights/tlm.bin and its MANIFEST from the committed records
# (model_weights/data/*.jsonl.gz), reproducibly (scripts/make_weights.sh).
weights: deps all
	./scripts/make_weights.sh

bench: deps all $(BENCH_BIN)
	@./bench/run.sh

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/tlm
	install -m 0755 $(BUILD)/tlm $(DESTDIR)$(PREFIX)/bin/tlm
	install -m 0755 $(BUILD)/tlmd $(DESTDIR)$(PREFIX)/bin/tlmd
	install -d $(DESTDIR)/etc/systemd/system $(DESTDIR)/etc/tlmd
	sed 's|@PREFIX@|$(PREFIX)|g' systemd/tlmd.service > $(DESTDIR)/etc/systemd/system/tlmd.service
	install -m 0644 systemd/tlmd.socket $(DESTDIR)/etc/systemd/system/tlmd.socket
	[ -f $(DESTDIR)/etc/tlmd/tlmd.conf ] || install -m 0644 systemd/tlmd.conf $(DESTDIR)/etc/tlmd/tlmd.conf
	[ ! -f model_weights/tlm.bin ] || install -D -m 0644 model_weights/tlm.bin \
	    $(DESTDIR)$(PREFIX)/share/tlmd/tlm.bin
	[ ! -f model_weights/MANIFEST ] || install -D -m 0644 model_weights/MANIFEST \
	    $(DESTDIR)$(PREFIX)/share/tlmd/MANIFEST
	install -m 0644 $(BUILD)/libtlm.a $(BUILD)/libtlmproto.a $(DESTDIR)$(PREFIX)/lib/
	for h in compiler/*/*.h proto/*.h; do \
	    install -D -m 0644 $$h $(DESTDIR)$(PREFIX)/include/tlm/$$h; done

format:
	clang-format -i $$(find compiler proto tools tests bench daemon -name '*.[ch]' 2>/dev/null)

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
