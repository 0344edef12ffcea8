# commplan: make PLAN=<name>.lua builds build/<name>/<name> and lib<name>.a
# from plans/<name>.lua (or PLAN=path/to/plan.lua); make test runs every
# test that this machine can run.
LUA      ?= lua5.4
CC       ?= cc
NVCC     ?= /usr/local/cuda/bin/nvcc
CSTD     := -std=c11 -Wall -Wextra -Werror -pthread
CFLAGS   ?= -O2 -g
SAN      := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
PLAN     ?= llama70b.lua
PLAN_FILE := $(if $(findstring /,$(PLAN)),$(PLAN),plans/$(PLAN))
NAME     := $(basename $(notdir $(PLAN_FILE)))
OUT      := plans/$(NAME)
BUILD    := build/$(NAME)

RUNTIME_SRC := runtime/launch.c runtime/check.c runtime/dtype.c runtime/topology.c runtime/executor.c runtime/backend_host.c runtime/simulate.c
RUNTIME_HDR := $(wildcard runtime/*.h)
RUNTIME_OBJ := $(patsubst runtime/%.c,build/runtime/%.o,$(RUNTIME_SRC))
GEN_SRC     := $(wildcard gen/*.lua gen/models/*.lua) $(wildcard templates/*.in)
SMALL_PLANS := $(filter-out plans/llama%.lua,$(wildcard plans/*.lua))
ALL_PLANS   := $(wildcard plans/*.lua)

.PHONY: all deps test test-lua test-c test-e2e test-oracle test-cli check-generated lint clean regen-all

all: deps $(BUILD)/$(NAME) $(BUILD)/lib$(NAME).a
	@echo "built $(BUILD)/$(NAME) and $(BUILD)/lib$(NAME).a from $(PLAN_FILE) (tables in $(OUT)/)"

# Debian packages the build and tests need: installed when running as root,
# otherwise named in one command.
DEPS_PKGS := lua5.4 libcmocka-dev lua-check
deps:
	@missing=""; \
	command -v $(LUA) >/dev/null 2>&1 || missing="$$missing lua5.4"; \
	[ -f /usr/include/cmocka.h ] || missing="$$missing libcmocka-dev"; \
	command -v luacheck >/dev/null 2>&1 || missing="$$missing lua-check"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$$missing) >/dev/null || \
	      { echo "apt-get install$$missing failed" >&2; exit 1; }; \
	  else echo "missing packages; run: sudo apt-get install -y$$missing" >&2; exit 1; fi; \
	fi

# Generation is all-or-nothing (the generator renames temporaries); the
# stamp keeps make from re-running it when nothing changed.
$(BUILD)/.generated: $(PLAN_FILE) $(GEN_SRC)
	@mkdir -p $(BUILD)
	$(LUA) gen/commplan.lua $(PLAN_FILE) $(OUT)
	@touch $@

build/runtime/%.o: runtime/%.c $(RUNTIME_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(CFLAGS) -Iruntime -c $< -o $@

$(BUILD)/plan.o: $(BUILD)/.generated
	$(CC) $(CSTD) $(CFLAGS) -Iruntime -I$(OUT) -c $(OUT)/plan.c -o $@

$(BUILD)/lib$(NAME).a: $(BUILD)/plan.o $(RUNTIME_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/main.o: runtime/main.c $(RUNTIME_HDR) $(BUILD)/.generated
	$(CC) $(CSTD) $(CFLAGS) -Iruntime -DCP_PLAN=$(NAME)_plan -c $< -o $@

$(BUILD)/$(NAME): $(BUILD)/main.o $(BUILD)/lib$(NAME).a
	$(CC) $(CSTD) $(CFLAGS) -o $@ $^ -lm

# ---- tests ----

test: deps
	@tests/run.sh

test-lua:
	@$(LUA) tests/lua/run.lua

lint:
	luacheck -q gen tests/lua plans

check-generated:
	@rc=0; for f in $(ALL_PLANS); do \
	  n=$$(basename $$f .lua); \
	  $(LUA) gen/commplan.lua --check $$f plans/$$n || rc=1; \
	done; exit $$rc

regen-all:
	@for f in $(ALL_PLANS); do $(LUA) gen/commplan.lua $$f plans/$$(basename $$f .lua) || exit 1; done

clean:
	rm -rf build

# cmocka runtime tests against committed generated plans, built plain
# (build/tests) and with AddressSanitizer + UBSan (build/tests-asan).
TEST_PLANS := fsdp8_uneven hsdp2x3_bf16 hsdp4x2_fp16
TEST_DEPS  := tests/c/test_runtime.c $(RUNTIME_SRC) $(RUNTIME_HDR) $(foreach p,$(TEST_PLANS),plans/$(p)/plan.c)
define cmocka_test
$(1)/test_runtime: $(TEST_DEPS)
	@mkdir -p $(1)
	@for p in $(TEST_PLANS); do $$(CC) $$(CSTD) $(2) -O1 -g -Iruntime -Iplans/$$$$p -c plans/$$$$p/plan.c -o $(1)/$$$$p.o || exit 1; done
	$$(CC) $$(CSTD) $(2) -O1 -g -Iruntime -o $$@ tests/c/test_runtime.c $$(RUNTIME_SRC) $(foreach p,$(TEST_PLANS),$(1)/$(p).o) -lcmocka -lm
endef
$(eval $(call cmocka_test,build/tests,))
$(eval $(call cmocka_test,build/tests-asan,$(SAN)))

test-c: build/tests/test_runtime build/tests-asan/test_runtime
	build/tests/test_runtime
	build/tests-asan/test_runtime

# ---- CUDA: generated copy kernels (nvcc) ----
CUDA_HOME  ?= /usr/local/cuda
NVCCFLAGS  ?= -O3 -std=c++17 -arch=sm_90 -Xcompiler -Wall,-Wextra,-Werror
CUDA_LIBS  := -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -Xlinker -rpath,$(CUDA_HOME)/lib64 -Xlinker -rpath,$(CUDA_HOME)/lib
KERNEL_TEST_PLANS := fsdp8_uneven hsdp2x3_bf16 hsdp4x2_fp16 llama_tiny

build/kernels/%/plan_kernels.o: plans/%/plan_kernels.cu runtime/cp_kernels.cuh runtime/cp_gpu_kernels.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Iruntime -c $< -o $@

build/kernels/%/plan.o: plans/%/plan.c $(RUNTIME_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) -O1 -g -Iruntime -Iplans/$* -c $< -o $@

build/tests/test_kernels: tests/c/test_kernels.cu $(RUNTIME_SRC) $(RUNTIME_HDR) \
    $(foreach p,$(KERNEL_TEST_PLANS),build/kernels/$(p)/plan_kernels.o build/kernels/$(p)/plan.o)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Iruntime -o $@ tests/c/test_kernels.cu $(RUNTIME_SRC) \
	  $(foreach p,$(KERNEL_TEST_PLANS),build/kernels/$(p)/plan_kernels.o build/kernels/$(p)/plan.o) $(CUDA_LIBS) -lm
