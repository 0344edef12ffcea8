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

RUNTIME_SRC := runtime/harness.c runtime/arena.c runtime/launch.c runtime/check.c runtime/dtype.c runtime/topology.c runtime/executor.c runtime/backend_host.c runtime/simulate.c
RUNTIME_HDR := $(wildcard runtime/*.h)
RUNTIME_OBJ := $(patsubst runtime/%.c,build/runtime/%.o,$(RUNTIME_SRC))
GEN_SRC     := $(wildcard gen/*.lua gen/models/*.lua) $(wildcard templates/*.in)
SMALL_PLANS := $(filter-out plans/llama%.lua,$(wildcard plans/*.lua))
ALL_PLANS   := $(wildcard plans/*.lua)

.PHONY: all deps deps-test test test-lua test-c test-e2e test-oracle test-cli check-generated lint clean regen-all

all: deps $(BUILD)/$(NAME) $(BUILD)/lib$(NAME).a $(BUILD)/lib$(NAME).so
	@echo "built $(BUILD)/$(NAME), lib$(NAME).a and lib$(NAME).so from $(PLAN_FILE) (tables in $(OUT)/)$(if $(HAVE_NVCC),, without the GPU backend: nvcc not found)"

# Debian packages: the build needs lua5.4 only; the tests also need cmocka
# and luacheck. Installed when running as root, otherwise named in one command.
define need_pkgs
	@missing=""; \
	command -v $(LUA) >/dev/null 2>&1 || missing="$$missing lua5.4"; \
	$(if $(1),[ -f /usr/include/cmocka.h ] || missing="$$missing libcmocka-dev"; \
	command -v luacheck >/dev/null 2>&1 || missing="$$missing lua-check";) \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$$missing) >/dev/null || \
	      { echo "apt-get install$$missing failed: install them by hand (or set LUA=/path/to/lua5.4)" >&2; exit 1; }; \
	  else echo "missing packages; run: sudo apt-get install -y$$missing" >&2; exit 1; fi; \
	fi
endef
deps:
	$(call need_pkgs,)
deps-test:
	$(call need_pkgs,test)

# Generation is all-or-nothing (the generator renames temporaries); the
# stamp keeps make from re-running it when nothing changed.
$(BUILD)/.generated: $(PLAN_FILE) $(GEN_SRC)
	@mkdir -p $(BUILD)
	$(LUA) gen/commplan.lua $(PLAN_FILE) $(OUT)
	@touch $@

# CUDA toolkit and NCCL: the GPU backend and kernels are built when nvcc is
# there; without it the binary runs --simulate and --dry-run only.
CUDA_HOME  ?= /usr/local/cuda
HAVE_NVCC  := $(shell [ -x "$(NVCC)" ] && echo 1)
NVCCFLAGS  ?= -O3 -std=c++17 -arch=sm_90 -Xcompiler -Wall,-Wextra,-Werror
comma := ,
# NCCL: beside CUDA (as here), in /usr, or wherever NCCL_HOME says (a tree
# with include/nccl.h and lib/libnccl.so, e.g. pip's nvidia/nccl).
NCCL_HOME  ?= $(firstword $(patsubst %/include/nccl.h,%,$(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h)) $(CUDA_HOME))
CUDA_INC   := -I$(CUDA_HOME)/include $(if $(filter-out $(CUDA_HOME),$(NCCL_HOME)),-I$(NCCL_HOME)/include)
CUDA_LIBS  := -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -Xlinker -rpath,$(CUDA_HOME)/lib64 -Xlinker -rpath,$(CUDA_HOME)/lib \
              $(if $(filter-out $(CUDA_HOME),$(NCCL_HOME)),-L$(NCCL_HOME)/lib -Xlinker -rpath$(comma)$(NCCL_HOME)/lib)
GPU_SRC    := runtime/gpu.c runtime/gpu_run.c
GPU_OBJ    := $(patsubst runtime/%.c,build/runtime/%.o,$(GPU_SRC))
LIB_OBJ    := $(BUILD)/plan.o $(RUNTIME_OBJ)
ifeq ($(HAVE_NVCC),1)
LIB_OBJ    += $(BUILD)/plan_kernels.o $(GPU_OBJ)
MAIN_DEFS  := -DCP_WITH_GPU -DCP_KERNELS=$(NAME)_kernels
LINK       = $(NVCC) -o $@ $^ -lnccl -lm $(CUDA_LIBS)
SHARED     = $(NVCC) -shared -o $@ $^ -lnccl $(CUDA_LIBS)
else
LINK       = $(CC) $(CSTD) $(CFLAGS) -o $@ $^ -lm
SHARED     = $(CC) -shared -o $@ $^ -lm -pthread
endif

build/runtime/%.o: runtime/%.c $(RUNTIME_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(CFLAGS) -fPIC -Iruntime $(if $(filter $(GPU_SRC),$<),$(CUDA_INC)) -c $< -o $@

$(BUILD)/plan.o: $(BUILD)/.generated
	$(CC) $(CSTD) $(CFLAGS) -fPIC -Iruntime -I$(OUT) -c $(OUT)/plan.c -o $@

$(BUILD)/plan_kernels.o: $(BUILD)/.generated runtime/cp_kernels.cuh runtime/cp_gpu_kernels.h
	$(NVCC) $(NVCCFLAGS) -Xcompiler -fPIC -Iruntime -c $(OUT)/plan_kernels.cu -o $@

$(BUILD)/lib$(NAME).a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/lib$(NAME).so: $(LIB_OBJ)
	$(SHARED)

$(BUILD)/main.o: runtime/main.c $(RUNTIME_HDR) $(BUILD)/.generated
	$(CC) $(CSTD) $(CFLAGS) -Iruntime $(CUDA_INC) -DCP_PLAN=$(NAME)_plan $(MAIN_DEFS) -c $< -o $@

$(BUILD)/$(NAME): $(BUILD)/main.o $(BUILD)/lib$(NAME).a
	$(LINK)

# ---- tests ----

test: deps-test
	@tests/run.sh

test-lua:
	@$(LUA) tests/lua/run.lua

lint:
	luacheck -q gen tests/lua tests/plans tests/oracle_check.lua plans bench

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

# ---- CUDA: the generated kernels against the host executor; GPU tests ----
KERNEL_TEST_PLANS := fsdp8_uneven hsdp2x3_bf16 hsdp4x2_fp16 llama_tiny
# tests/plans/: plans that exist to exercise the kernels (multi-tile
# pieces, padding inside full tiles), generated into build/gen/.
KERNEL_TEST_EXTRA := kernels_big
KERNEL_TEST_OBJ   := $(foreach p,$(KERNEL_TEST_PLANS) $(KERNEL_TEST_EXTRA),build/$(p)/plan_kernels.o build/$(p)/plan.o)

# The plans' own builds make the objects; a sub-make per plan keeps each
# plan's variables (PLAN, OUT, BUILD) its own.
.PHONY: kernel-test-plans
kernel-test-plans:
	@for p in $(KERNEL_TEST_PLANS); do $(MAKE) --no-print-directory -s PLAN=$$p.lua >/dev/null || exit 1; done
	@for p in $(KERNEL_TEST_EXTRA); do \
	  $(MAKE) --no-print-directory -s PLAN=tests/plans/$$p.lua OUT=build/gen/$$p >/dev/null || exit 1; done

build/tests/test_kernels: tests/c/test_kernels.cu $(RUNTIME_SRC) $(RUNTIME_HDR) runtime/cp_kernels.cuh kernel-test-plans
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Iruntime -o $@ tests/c/test_kernels.cu $(RUNTIME_SRC) $(KERNEL_TEST_OBJ) $(CUDA_LIBS) -lm

# On a machine with an NVIDIA GPU: kernels on the device against the host
# reference, and a real one-rank NCCL run of plans/single.lua with --check,
# eager and as a CUDA graph.
test-gpu: build/tests/test_kernels
	@$(MAKE) --no-print-directory -s PLAN=single.lua >/dev/null
	build/tests/test_kernels
	build/single/single --check --steps 3
	build/single/single --warmup 3 --iters 20 --graph
	@$(MAKE) --no-print-directory -s build/example/example
	build/example/example
	@$(MAKE) --no-print-directory -s PLAN=tests/plans/too_big.lua OUT=build/gen/too_big >/dev/null
	@$(MAKE) --no-print-directory -s PLAN=fsdp4.lua >/dev/null
	tests/gpu_faults.sh

# docs/example.c must keep building against the library it documents.
build/example/example: docs/example.c $(RUNTIME_HDR)
	@$(MAKE) --no-print-directory -s PLAN=single.lua >/dev/null
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(CFLAGS) -Iruntime -Iplans/single $(CUDA_INC) -c docs/example.c -o build/example/example.o
	$(NVCC) -o $@ build/example/example.o build/single/libsingle.a -lnccl -lm $(CUDA_LIBS)
