# strata - the one build file.
#   make            build/strata (+ CUDA kernels for sm_90 when nvcc is found)
#   make NVCC=      CPU-only build
#   make NVEXTRA=-lineinfo   extra nvcc flags (scripts/gpu-profile.sh: source lines for ncu)
#   make test       build and run the test suite (ends with "N passed, N failed")
#   make asan       CPU-only build with AddressSanitizer + UBSan in build-asan/
#   make test-asan  the suite under ASan + UBSan
#   make fuzz       build the libFuzzer targets (clang) and run each for FUZZ_SECONDS (60)

CC      ?= cc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ( [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc ))
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
BUILD   ?= build
OPT     ?= -O3 -march=x86-64-v3
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra $(OPT) -g -fopenmp -Isrc
LIBS    := -ljansson -lpcre2-8 -licuuc -licudata -lmicrohttpd -lm -lpthread
LDLIBS  += $(LIBS)
LDFLAGS += -fopenmp
NVFLAGS ?= -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DSTRATA_SM90A -Xcompiler -Wall,-Wextra -Isrc --expt-relaxed-constexpr
NVFLAGS += $(NVEXTRA)

SRC      := $(wildcard src/*.c src/*/*.c src/model/cpu/*.c)
MAIN_SRC := src/cli/main.c
LIB_SRC  := $(filter-out $(MAIN_SRC),$(SRC))
CU_SRC   := $(if $(NVCC),$(wildcard src/model/cuda/*.cu))
TEST_SRC := $(wildcard tests/test_*.c)
HEADERS  := $(wildcard src/*.h src/*/*.h src/model/*/*.h)

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.o)
TESTS    := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

ifneq ($(CU_SRC),)
CFLAGS  += -DSTRATA_CUDA
LDLIBS  += -L$(CUDA_HOME)/lib64 -lcublasLt -lcudart_static -ldl -lrt -lstdc++
endif

.PHONY: all test asan test-asan fuzz fuzz-build bench clean FORCE
all: $(BUILD)/strata

$(BUILD)/strata: $(BUILD)/src/cli/main.o $(BUILD)/libstrata.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/libstrata.a: $(LIB_OBJ) $(BUILD)/.config
	@rm -f $@
	ar rcs $@ $(LIB_OBJ)

# The compiler flags and object list of this build directory: when they change (e.g. `make NVCC=`
# after a CUDA build in the same directory) every object and the library are rebuilt.
$(BUILD)/.config: FORCE
	@mkdir -p $(BUILD)
	@echo '$(CC) $(CFLAGS) | $(NVCC) $(NVFLAGS) | $(LIB_OBJ)' | cmp -s - $@ || echo '$(CC) $(CFLAGS) | $(NVCC) $(NVFLAGS) | $(LIB_OBJ)' > $@
FORCE:

$(BUILD)/%.o: %.c $(HEADERS) $(BUILD)/.config
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

# the chat page is embedded by the assembler (.incbin) in page.o
$(BUILD)/src/api/page.o build-fuzz/src/api/page.o: src/api/page.html

$(BUILD)/%.o: %.cu $(HEADERS) $(BUILD)/.config
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

$(BUILD)/tests/%: tests/%.c tests/harness.h $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $(LDFLAGS) -o $@ $< $(BUILD)/libstrata.a $(LDLIBS)

# The fuzz targets (tests/fuzz/fuzz_*.c) replayed over their committed corpus - seeds and crash
# reproducers in tests/fuzz/corpus/<target>/ - with tests/fuzz/replay.c as main: regression tests.
FUZZ_SRC  := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_NAMES := $(FUZZ_SRC:tests/fuzz/%.c=%)
REPLAYS   := $(FUZZ_NAMES:%=$(BUILD)/tests/fuzz/%)
$(BUILD)/tests/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c tests/fuzz/fuzz.h tests/utf8_lossy.h $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -DFUZZ_NAME='"fuzz_$*"' $(LDFLAGS) -o $@ $< tests/fuzz/replay.c $(BUILD)/libstrata.a $(LDLIBS)

# The suite: every test binary, plus the loader's malformed-input corpus under ASan + UBSan.
ASAN_OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
ASAN_TESTS := build-asan/tests/test_loader
# the include layers, the command line, and the server as real clients see it: the openai npm package, curl,
# and constrained decoding through the SDKs' structured-output helpers (grammar.mjs)
# (need scripts/install-deps.sh)
CLIENT_TESTS := tests/layers.sh tests/cli.sh tests/server/test.mjs tests/server/grammar.mjs tests/server/curl.sh
# OpenAI's Responses API with the openai package, Anthropic's Messages API with @anthropic-ai/sdk
CLIENT_TESTS += tests/server/responses.mjs tests/server/anthropic.mjs
# Ollama's native API with ollama-js, the chat page in headless Chromium, the access log and CORS
CLIENT_TESTS += tests/server/ollama.mjs tests/server/page.mjs tests/server/log.sh
# the agent CLIs (Claude Code, Codex) in a loopback-only network namespace
CLIENT_TESTS += tests/agents/agents.sh
test: $(BUILD)/strata $(TESTS) $(REPLAYS)
	@$(MAKE) --no-print-directory BUILD=build-asan NVCC= OPT="$(ASAN_OPT)" LDFLAGS="-fopenmp -fsanitize=address,undefined" $(ASAN_TESTS) >/dev/null
	@BUILD=$(BUILD) bash tests/run.sh $(TESTS) $(REPLAYS) $(ASAN_TESTS) $(CLIENT_TESTS)

asan:
	$(MAKE) BUILD=build-asan NVCC= OPT="$(ASAN_OPT)" LDFLAGS="-fopenmp -fsanitize=address,undefined" all

# build-asan/strata too: test_server's SIGTERM test and test_abuse run it (under ASan + UBSan)
test-asan:
	@$(MAKE) --no-print-directory BUILD=build-asan NVCC= OPT="$(ASAN_OPT)" LDFLAGS="-fopenmp -fsanitize=address,undefined" build-asan/strata $(TESTS:$(BUILD)/%=build-asan/%) $(REPLAYS:$(BUILD)/%=build-asan/%)
	@BUILD=build-asan bash tests/run.sh $(TESTS:$(BUILD)/%=build-asan/%) $(REPLAYS:$(BUILD)/%=build-asan/%)

# Fuzzing: the targets built with clang's libFuzzer and ASan + UBSan in build-fuzz/, from the
# C sources only (never the CUDA ones). `make fuzz` runs each for FUZZ_SECONDS from its corpus
# (tests/fuzz/corpus/<target>/ plus seeds made from the fixtures); a crash stops with the input
# in build-fuzz/crashes/<target>/: fix it, and copy the input into tests/fuzz/corpus/<target>/,
# where `make test` replays it from then on.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_CFLAGS  := -std=c11 -D_GNU_SOURCE -Wall -Wextra -g -O1 -fno-omit-frame-pointer -Isrc -Itests \
                -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_LIB_OBJ := $(patsubst %.c,build-fuzz/%.o,$(filter-out src/cli/%,$(LIB_SRC)))
FUZZ_BINS    := $(FUZZ_NAMES:%=build-fuzz/%)
build-fuzz/src/%.o: src/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<
build-fuzz/libstrata.a: $(FUZZ_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^
build-fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h tests/utf8_lossy.h build-fuzz/libstrata.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< build-fuzz/libstrata.a $(LIBS)
fuzz-build: $(FUZZ_BINS)
fuzz: $(FUZZ_BINS)
	@FUZZ_SECONDS=$(FUZZ_SECONDS) bash tests/fuzz/run.sh $(FUZZ_NAMES)

# benchmark programs (the engine's own benchmark is `strata bench`)
BENCHES := $(BUILD)/bench/bench_tokenizer $(BUILD)/bench/http_latency $(BUILD)/bench/bench_grammar
bench: $(BENCHES)
$(BUILD)/bench/%: bench/%.c $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libstrata.a $(LDLIBS)

clean:
	rm -rf build build-asan build-fuzz
