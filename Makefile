# commplan: make PLAN=<name>.lua builds build/<name>/<name> and lib<name>.a
# from plans/<name>.lua (or PLAN=path/to/plan.lua); make test runs every
# test that this machine can run (make test-full: with every repetition).
LUA      ?= lua5.4
CC       ?= cc
NVCC     ?= /usr/local/cuda/bin/nvcc
CSTD     := -std=c11 -Wall -Wextra -Werror -pthread
CFLAGS   ?= -O2 -g
SAN      := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
PLAN     ?= llama70b.lua
# PLAN is checked as text ($(value): nothing in it is expanded) before any
# use: the name must be [A-Za-z0-9_]+.lua (it becomes a C identifier) and a
# directory may hold only [A-Za-z0-9_./+-], so no plan path reaches a shell
# command or make's own syntax as anything but a plain word.
PLAN_RAW := $(value PLAN)
PLAN_FILE := $(if $(findstring /,$(PLAN_RAW)),$(PLAN_RAW),plans/$(PLAN_RAW))
NAME     := $(basename $(notdir $(PLAN_FILE)))
cp_word  := a b c d e f g h i j k l m n o p q r s t u v w x y z A B C D E F G H I J K L M N O P Q R S T U V W X Y Z 0 1 2 3 4 5 6 7 8 9 _
cp_strip = $(if $(2),$(call cp_strip,$(subst $(firstword $(2)),,$(1)),$(wordlist 2,999,$(2))),$(1))
cp_bad_path = $(if $(filter-out 1,$(words $(1))),bad)$(call cp_strip,$(1),$(cp_word) / . - +)
ifneq ($(if $(filter-out 1,$(words $(PLAN_RAW))),bad)$(if $(NAME),,bad)$(if $(filter %.lua,$(PLAN_FILE)),,bad)$(call cp_strip,$(NAME),$(cp_word))$(call cp_bad_path,$(PLAN_FILE)),)
$(error PLAN=$(PLAN_RAW): a plan file is <name>.lua with <name> made of A-Z a-z 0-9 _ (it becomes a C identifier), in a directory named with A-Z a-z 0-9 _ . / + - only; rename or move the file)
endif
ifeq ($(wildcard $(PLAN_FILE)),)
$(error PLAN=$(PLAN_RAW): there is no plan file $(PLAN_FILE); shipped plans: $(notdir $(wildcard plans/*.lua)); or give a path to a plan file)
endif
# A plan under plans/ generates into plans/<name>/ (committed); any other
# plan file into build/<name>/gen/, never over a committed plan.
ifeq ($(abspath $(PLAN_FILE)),$(abspath plans/$(NAME).lua))
OUT      := plans/$(NAME)
else
OUT      := build/$(NAME)/gen
# said once per generation (stdout): build/ is git-ignored, the output is this build's, not one to commit
OUT_NOTE := note: the files generated from $(PLAN_FILE) go to build/$(NAME)/gen/ (git-ignored, for this build only); commplan generate $(PLAN_FILE) writes them beside the plan, to commit (docs/your-repository.md)
endif
ifneq ($(call cp_bad_path,$(value OUT)),)
$(error OUT=$(value OUT): an output directory is named with A-Z a-z 0-9 _ . / + - only)
endif
BUILD    := build/$(NAME)

RUNTIME_SRC := runtime/harness.c runtime/arena.c runtime/launch.c runtime/rendezvous.c runtime/check.c runtime/dtype.c runtime/topology.c runtime/executor.c runtime/backend_host.c runtime/simulate.c runtime/safeio.c runtime/hostlib.c
RUNTIME_HDR := $(wildcard runtime/*.h)
RUNTIME_OBJ := $(patsubst runtime/%.c,build/runtime/%.o,$(RUNTIME_SRC))
GEN_SRC     := $(wildcard gen/*.lua gen/models/*.lua gen/parallel/*.lua) $(wildcard templates/*.in)
# Plan files whose names are [A-Za-z0-9_]+ only: a name holding $(, a
# space or a quote never reaches a rule, an eval or a shell (a word of a
# name with spaces is dropped unless it is itself a plan file).
cp_plan_ok   = $(if $(call cp_strip,$(1),$(cp_word)),,$(if $(wildcard plans/$(1).lua),$(1)))
ALL_PLAN_NAMES := $(foreach n,$(basename $(notdir $(wildcard plans/*.lua))),$(call cp_plan_ok,$(n)))
SMALL_PLANS := $(patsubst %,plans/%.lua,$(filter-out llama%,$(ALL_PLAN_NAMES)))
ALL_PLANS   := $(patsubst %,plans/%.lua,$(ALL_PLAN_NAMES))

.PHONY: all deps deps-test test test-full test-lua test-c test-e2e test-oracle test-cli check-generated lint clean regen-all diff-plan advise

all: deps $(BUILD)/$(NAME) $(BUILD)/lib$(NAME).a $(BUILD)/lib$(NAME).so
	@echo "built $(BUILD)/$(NAME), lib$(NAME).a and lib$(NAME).so from $(PLAN_FILE) (tables in $(OUT)/)$(if $(HAVE_NVCC),, without the GPU backend: nvcc not found)"
	@if [ -s '$(BUILD)/.fit' ]; then cat '$(BUILD)/.fit' >&2;$(if $(value STRICT), echo 'STRICT=1: a plan that does not fit is an error' >&2; exit 2;) fi

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

# Generation is all-or-nothing (the generator publishes OUT as a whole
# directory); the stamp keeps make from re-running it when nothing changed.
# .source names what the tables come from (the plan's path, its bytes, OUT)
# and changes only when that does, so a plan file swapped for another of
# the same name, or replaced by an older copy, regenerates and rebuilds
# instead of leaving a stale binary.
.PHONY: FORCE
$(BUILD)/.source: FORCE
	@mkdir -p '$(BUILD)'
	@if [ ! -f '$(PLAN_FILE)' ]; then \
	  echo '$(PLAN_FILE): the plan file is '"$$(LC_ALL=C stat -L -c %F -- '$(PLAN_FILE)' 2>/dev/null || echo unreadable)"', not a regular file; give the path of a plan file (plans/<name>.lua)' >&2; exit 2; fi
	@{ printf '%s\n' '$(abspath $(PLAN_FILE))' '$(OUT)'; cksum <'$(PLAN_FILE)'; } >'$@.new' 2>/dev/null; \
	if cmp -s '$@.new' '$@'; then rm -f '$@.new'; else mv -f '$@.new' '$@'; fi

# The generator's one line for a plan that does not fit its GPU is kept in
# $(BUILD)/.fit and printed after every build, a cached one's too (STRICT=1:
# the generator refuses such a plan, and a cached build fails).
$(BUILD)/.generated: $(PLAN_FILE) $(GEN_SRC) $(BUILD)/.source
	@mkdir -p '$(BUILD)'
	$(LUA) gen/commplan.lua $(if $(value STRICT),--strict )'$(PLAN_FILE)' '$(OUT)' 2>'$(BUILD)/.fit' \
	  || { cat '$(BUILD)/.fit' >&2; rm -f '$(BUILD)/.fit'; exit 2; }
	@$(if $(and $(OUT_NOTE),$(filter file,$(origin OUT))),echo '$(OUT_NOTE)')
	@touch '$@'

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
# The copy kernels are plan-independent: nvcc compiles them once, and each
# plan's plan_kernels.cu only binds its name to them.
GPU_OBJ    := $(patsubst runtime/%.c,build/runtime/%.o,$(GPU_SRC)) build/runtime/cp_kernels.o
LIB_OBJ    := $(BUILD)/plan.o $(RUNTIME_OBJ)
ifeq ($(HAVE_NVCC),1)
LIB_OBJ    += $(BUILD)/plan_kernels.o $(GPU_OBJ)
MAIN_DEFS  := -DCP_WITH_GPU -DCP_KERNELS=$(NAME)_kernels
LINK       = $(NVCC) -o $@ $^ -lnccl -lm $(CUDA_LIBS)
SHARED     = $(NVCC) -shared -o $@ $(LIB_OBJ) -lnccl $(CUDA_LIBS)
else
LINK       = $(CC) $(CSTD) $(CFLAGS) -o $@ $^ -lm
SHARED     = $(CC) -shared -o $@ $(LIB_OBJ) -lm -pthread
endif

# make runtime-objs: the runtime's C objects alone (tests/run.sh builds them before its torch lane starts)
.PHONY: runtime-objs
runtime-objs: $(RUNTIME_OBJ)
build/runtime/%.o: runtime/%.c $(RUNTIME_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(CFLAGS) -fPIC -Iruntime $(if $(filter $(GPU_SRC),$<),$(CUDA_INC)) -c $< -o $@

$(BUILD)/plan.o: $(BUILD)/.generated
	$(CC) $(CSTD) $(CFLAGS) -fPIC -Iruntime -I$(OUT) -c $(OUT)/plan.c -o $@

$(BUILD)/plan_kernels.o: $(BUILD)/.generated runtime/cp_gpu_kernels.h $(RUNTIME_HDR)
	$(NVCC) $(NVCCFLAGS) -Xcompiler -fPIC -Iruntime -c $(OUT)/plan_kernels.cu -o $@

build/runtime/cp_kernels.o: runtime/cp_kernels.cu runtime/cp_kernels.cuh runtime/cp_gpu_kernels.h $(RUNTIME_HDR)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Xcompiler -fPIC -Iruntime -c $< -o $@

$(BUILD)/lib$(NAME).a: $(LIB_OBJ) $(BUILD)/.backend
	@rm -f $@
	ar rcs $@ $(LIB_OBJ)

$(BUILD)/lib$(NAME).so: $(LIB_OBJ) $(BUILD)/.backend
	$(SHARED)

# One version, in VERSION: gen/commplan.lua --version reads it, the binary gets it here.
CP_VERSION := $(or $(shell tr -cd 'A-Za-z0-9.+-' <VERSION 2>/dev/null),unknown)
# .backend says whether this build has the GPU backend; it changes when nvcc
# appears or goes (a login node without CUDA, then a GPU node), so the
# binary and libraries are rebuilt with or without it instead of going stale.
# (A temporary name per shell: two makes of one plan at once must not
# remove each other's.)
$(BUILD)/.backend: FORCE
	@mkdir -p '$(BUILD)'
	@t='$@.new.'$$$$; printf '%s\n' 'gpu=$(HAVE_NVCC)' >"$$t"; if cmp -s "$$t" '$@'; then rm -f "$$t"; else mv -f "$$t" '$@'; fi

$(BUILD)/main.o: runtime/main.c $(RUNTIME_HDR) $(BUILD)/.generated VERSION $(BUILD)/.backend
	$(CC) $(CSTD) $(CFLAGS) -Iruntime $(CUDA_INC) -DCP_PLAN=$(NAME)_plan -DCP_VERSION='"$(CP_VERSION)"' $(MAIN_DEFS) -c $< -o $@

$(BUILD)/$(NAME): $(BUILD)/main.o $(BUILD)/lib$(NAME).a
	$(LINK)

# ---- tests ----

# make test: the quick tier (what CI runs, .ci/run): every check at least
# once, fewer seeds, cases, steps and sizes; make test-full: the same checks
# with every repetition (tests/run.sh reads COMMPLAN_TEST_TIER and passes it
# on; each check the quick tier trims says so in a "quick tier:" line).
test: deps-test
	@COMMPLAN_TEST_TIER=quick tests/run.sh
test-full: deps-test
	@COMMPLAN_TEST_TIER=full tests/run.sh
# The mutation pass (tests/mutate.sh): listed bugs put into gen/ and runtime/
# one at a time in build/mutate/, the kill rate printed (golden check excluded).
.PHONY: mutate
mutate: deps-test
	@tests/mutate.sh

test-lua:
	@$(LUA) tests/lua/run.lua

lint:
	luacheck -q gen tests/lua tests/plans tests/oracle_check.lua tests/byte_identity.lua tests/pp plans bench

# Every plans/*.lua, each name taken by the shell's own glob and always
# quoted: a file name holding spaces, $$(...), backticks or quotes is
# refused with one line, never run. CP_EACH_PLAN runs $$1 for each good one.
define CP_EACH_PLAN
rc=0 n=0 bad=0; for f in plans/*.lua; do \
  [ -e "$$f" ] || continue; \
  b=$${f#plans/}; b=$${b%.lua}; \
  case $$b in ''|*[!A-Za-z0-9_]*) \
    printf '%s: plan file names are [A-Za-z0-9_]+.lua (the name becomes a C identifier); rename the file\n' \
      "$$(printf '%s' "$$f" | tr -c '[:print:]' '?')" >&2; rc=1; bad=$$((bad + 1)); continue;; esac; \
  if $(1); then n=$$((n + 1)); else rc=1; bad=$$((bad + 1)); fi; \
done; \
if [ $$bad != 0 ]; then fails=", $$bad failed"; else fails=""; fi
endef

check-generated:
	@$(call CP_EACH_PLAN,$(LUA) gen/commplan.lua --check "$$f" "plans/$$b"); \
	echo "check-generated: $$n plans up to date$$fails"; exit $$rc

regen-all:
	@$(call CP_EACH_PLAN,$(LUA) gen/commplan.lua "$$f" "plans/$$b"); \
	echo "regen-all: $$n plans regenerated$$fails"; exit $$rc

# Audit verbs (gen/verbs.lua). diff-plan: A and B are plan files, plan.json
# files or REV:path (git show); REV=<rev> B=plans/<name>.lua compares the
# plan with its generated output committed at <rev>; SVG=<dir> also writes
# <dir>/before.svg and <dir>/after.svg (each side's timeline.svg). advise: rank the
# meshes for PLAN's model on WORLD GPUs (default: the plan's world).
# Operands are checked as text, like PLAN, before they reach the shell.
cp_bad_arg = $(if $(1),$(if $(filter-out 1,$(words $(1))),bad)$(call cp_strip,$(1),$(cp_word) / . - + : ~ ^ @))
.PHONY: diff-plan advise pipeline
diff-plan:
	$(if $(value B),,$(error diff-plan: give B=<plan.lua|plan.json|REV:path> and A=... or REV=<git revision>))
	$(if $(call cp_bad_arg,$(value A))$(call cp_bad_arg,$(value B))$(call cp_bad_arg,$(value REV))$(call cp_bad_arg,$(value SVG)),$(error diff-plan: A, B, REV and SVG take A-Z a-z 0-9 _ / . - + : ~ ^ @ only))
	@$(LUA) gen/verbs.lua diff $(if $(value SVG),--svg '$(value SVG)') $(if $(value REV),--rev '$(value REV)' '$(value B)','$(value A)' '$(value B)')
advise: deps
	$(if $(call cp_bad_arg,$(value WORLD)),$(error advise: WORLD is a number of GPUs))
	@$(LUA) gen/verbs.lua advise '$(PLAN_FILE)' $(if $(value WORLD),--world-size '$(value WORLD)')
# pipeline: torch's pipeline schedules for a plan with parallel.pp > 1, side by
# side (stages, the send/receive and whole-step proofs, bubble, activations in
# flight, step);
# CSV=<file> also writes the plan's schedule as torch's CSV (_load_csv).
pipeline: deps
	$(if $(call cp_bad_arg,$(value CSV)),$(error pipeline: CSV takes A-Z a-z 0-9 _ / . - + : ~ ^ @ only))
	@$(LUA) gen/verbs.lua pipeline '$(PLAN_FILE)' $(if $(value CSV),--csv '$(value CSV)')

clean:
	rm -rf build

# cmocka runtime tests against committed generated plans, built plain
# (build/tests) and with AddressSanitizer + UBSan (build/tests-asan).
TEST_PLANS := fsdp8_uneven hsdp2x3_bf16 hsdp4x2_fp16 llama_tiny_tp
TEST_DEPS  := tests/c/test_runtime.c tests/c/fake_env.h $(RUNTIME_HDR) $(foreach p,$(TEST_PLANS),plans/$(p)/plan.c)
# The runtime compiled once per tree (plain, ASan+UBSan) for every cmocka
# test that links it, not once per test binary.
define runtime_objs
$(1)/rt/%.o: runtime/%.c $(RUNTIME_HDR)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CSTD) $(2) -O1 -g -Iruntime -c $$< -o $$@
endef
$(eval $(call runtime_objs,build/tests,))
$(eval $(call runtime_objs,build/tests-asan,$(SAN)))
rt_objs = $(patsubst runtime/%.c,$(1)/rt/%.o,$(RUNTIME_SRC))
define cmocka_test
$(1)/test_runtime: $(TEST_DEPS) $(call rt_objs,$(1))
	@mkdir -p $(1)
	@for p in $(TEST_PLANS); do $$(CC) $$(CSTD) $(2) -O1 -g -Iruntime -Iplans/$$$$p -c plans/$$$$p/plan.c -o $(1)/$$$$p.o || exit 1; done
	$$(CC) $$(CSTD) $(2) -O1 -g -Iruntime -o $$@ tests/c/test_runtime.c $(call rt_objs,$(1)) $(foreach p,$(TEST_PLANS),$(1)/$(p).o) -lcmocka -lm
endef
$(eval $(call cmocka_test,build/tests,))
$(eval $(call cmocka_test,build/tests-asan,$(SAN)))

# Pipeline parallelism's runtime half (tests/c/test_pp.c): hand-written 2-
# and 4-stage tables on the host backend, plain and under ASan+UBSan.
define pp_test
$(1)/test_pp: tests/c/test_pp.c tests/c/bounded.h $(call rt_objs,$(1)) $(RUNTIME_HDR)
	@mkdir -p $(1)
	$$(CC) $$(CSTD) $(2) -O1 -g -Iruntime -o $$@ tests/c/test_pp.c $(call rt_objs,$(1)) -lcmocka -lm
endef
$(eval $(call pp_test,build/tests,))
$(eval $(call pp_test,build/tests-asan,$(SAN)))

# Expert parallelism's runtime half (tests/c/test_a2a.c): hand-written ep 2
# and ep 4 tables' all-to-alls on the host backend, plain and under ASan+UBSan.
define a2a_test
$(1)/test_a2a: tests/c/test_a2a.c tests/c/bounded.h $(call rt_objs,$(1)) $(RUNTIME_HDR)
	@mkdir -p $(1)
	$$(CC) $$(CSTD) $(2) -O1 -g -Iruntime -o $$@ tests/c/test_a2a.c $(call rt_objs,$(1)) -lcmocka -lm
endef
$(eval $(call a2a_test,build/tests,))
$(eval $(call a2a_test,build/tests-asan,$(SAN)))

# A unit of mixed all-gather dtypes on the host backend (tests/c/test_mixed.c,
# issue 39): copy-in and copy-out by byte offsets, plain and under ASan+UBSan.
define mixed_test
$(1)/test_mixed: tests/c/test_mixed.c $(call rt_objs,$(1)) $(RUNTIME_HDR)
	@mkdir -p $(1)
	$$(CC) $$(CSTD) $(2) -O1 -g -Iruntime -o $$@ tests/c/test_mixed.c $(call rt_objs,$(1)) -lcmocka -lm
endef
$(eval $(call mixed_test,build/tests,))
$(eval $(call mixed_test,build/tests-asan,$(SAN)))
# tests/plans/mixed_ag.lua's binary under ASan+UBSan: its simulation checks every byte offset
# (it and fsdp4_cli below link the runtime's ASan+UBSan objects the cmocka tests link, compiled
# with the same flags: only main.c reads the plan's -D names)
build/tests-asan/mixed_ag: runtime/main.c $(call rt_objs,build/tests-asan) $(RUNTIME_HDR) build/gen/mixed_ag/plan.c VERSION
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(SAN) -O1 -g -Iruntime -Ibuild/gen/mixed_ag -DCP_PLAN=mixed_ag_plan -DCP_VERSION='"$(CP_VERSION)"' \
	  -o $@ runtime/main.c build/gen/mixed_ag/plan.c $(call rt_objs,build/tests-asan) -lm

# The NCCL id channels (launch.c, rendezvous.c) alone, plain and under
# ASan+UBSan; the TCPStore tests start tests/fake_tcpstore.py (python3).
RDZV_SRC := tests/c/test_rendezvous.c runtime/rendezvous.c runtime/launch.c runtime/safeio.c
define rendezvous_test
$(1)/test_rendezvous: $(RDZV_SRC) runtime/rendezvous.h runtime/launch.h runtime/safeio.h tests/c/fake_env.h
	@mkdir -p $(1)
	$$(CC) $$(CSTD) $(2) -O1 -g -Iruntime -o $$@ $(RDZV_SRC) -lcmocka
endef
$(eval $(call rendezvous_test,build/tests,))
$(eval $(call rendezvous_test,build/tests-asan,$(SAN)))

# NCCL's reduction arithmetic (runtime/dtype.c) against independently
# worked-out values, plain and with the sanitizers.
build/tests/test_arith: tests/c/test_arith.c runtime/dtype.c $(RUNTIME_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) -O1 -g -Iruntime -o $@ tests/c/test_arith.c runtime/dtype.c -lcmocka -lm
build/tests-asan/test_arith: tests/c/test_arith.c runtime/dtype.c $(RUNTIME_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(SAN) -O1 -g -Iruntime -o $@ tests/c/test_arith.c runtime/dtype.c -lcmocka -lm

# The one rule for every file the runtime reads or writes (runtime/safeio.c),
# plain and with the sanitizers; and fsdp4's binary built with them for
# tests/fuzz_cli.py (argv and environment fuzzing).
SAFEIO_SRC := tests/c/test_safeio.c runtime/safeio.c
define safeio_test
$(1)/test_safeio: $(SAFEIO_SRC) runtime/safeio.h
	@mkdir -p $(1)
	$$(CC) $$(CSTD) $(2) -O1 -g -Iruntime -o $$@ $(SAFEIO_SRC) -lcmocka
endef
$(eval $(call safeio_test,build/tests,))
$(eval $(call safeio_test,build/tests-asan,$(SAN)))
build/tests-asan/fsdp4_cli: runtime/main.c $(call rt_objs,build/tests-asan) $(RUNTIME_HDR) plans/fsdp4/plan.c VERSION
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(SAN) -O1 -g -Iruntime -Iplans/fsdp4 -DCP_PLAN=fsdp4_plan -DCP_VERSION='"$(CP_VERSION)"' -o $@ \
	  runtime/main.c plans/fsdp4/plan.c $(call rt_objs,build/tests-asan) -lm

test-c: build/tests/test_runtime build/tests-asan/test_runtime build/tests/test_rendezvous build/tests-asan/test_rendezvous \
        build/tests/test_arith build/tests-asan/test_arith \
        build/tests/test_safeio build/tests-asan/test_safeio \
        build/tests/test_pp build/tests-asan/test_pp build/tests/test_a2a build/tests-asan/test_a2a \
        build/tests/test_mixed build/tests-asan/test_mixed
	build/tests/test_runtime
	build/tests-asan/test_runtime
	build/tests/test_pp
	build/tests-asan/test_pp
	build/tests/test_a2a
	build/tests-asan/test_a2a
	build/tests/test_mixed
	build/tests-asan/test_mixed
	build/tests/test_rendezvous
	build/tests-asan/test_rendezvous
	build/tests/test_arith
	build/tests-asan/test_arith
	build/tests/test_safeio
	build/tests-asan/test_safeio

# ---- CUDA: the generated kernels against the host executor; GPU tests ----
KERNEL_TEST_PLANS := fsdp8_uneven hsdp2x3_bf16 hsdp4x2_fp16 llama_tiny
# tests/plans/: plans that exist to exercise the kernels (multi-tile
# pieces, padding inside full tiles), generated into build/gen/.
KERNEL_TEST_EXTRA := kernels_big kernels_all_dtypes
# tests/ep/plans: experts units with their own shard group (Shard(0), Shard(1)).
KERNEL_TEST_EP    := ep2_mixtral ep2_dsv3_shard1
KERNEL_TEST_OBJ   := $(foreach p,$(KERNEL_TEST_PLANS) $(KERNEL_TEST_EXTRA) $(KERNEL_TEST_EP),build/$(p)/plan_kernels.o build/$(p)/plan.o)

# The plans' own builds make the objects; a sub-make per plan keeps each
# plan's variables (PLAN, OUT, BUILD) its own.
.PHONY: kernel-test-plans
kernel-test-plans:
	@for p in $(KERNEL_TEST_PLANS); do $(MAKE) --no-print-directory -s PLAN=$$p.lua >/dev/null || exit 1; done
	@for p in $(KERNEL_TEST_EXTRA); do \
	  $(MAKE) --no-print-directory -s PLAN=tests/plans/$$p.lua OUT=build/gen/$$p >/dev/null || exit 1; done
	@for p in $(KERNEL_TEST_EP); do \
	  $(MAKE) --no-print-directory -s PLAN=tests/ep/plans/$$p.lua OUT=build/gen/$$p >/dev/null || exit 1; done

build/tests/test_kernels: tests/c/test_kernels.cu $(RUNTIME_SRC) $(RUNTIME_HDR) runtime/cp_kernels.cuh kernel-test-plans build/runtime/cp_kernels.o
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Iruntime -o $@ tests/c/test_kernels.cu $(RUNTIME_SRC) $(KERNEL_TEST_OBJ) build/runtime/cp_kernels.o $(CUDA_LIBS) -lm

# On a machine with an NVIDIA GPU: kernels on the device against the host
# reference, and a real one-rank NCCL run of plans/single.lua with --check,
# eager and as a CUDA graph; then every plan with all its ranks on the GPU
# (test-gpu-ranks).
# 20 AdamW steps of a Llama-shaped model on 4 ranks (all on one GPU): the plan's library driven by
# python/commplan's hooks against PyTorch's FSDP2, losses, parameters and grads bit for bit, and
# host time per step of both (tests/python/train_compare.py; a SKIP line without torch 2.x + GPU).
PYTHON ?= python3
.PHONY: test-train
test-train:
	PYTHONPATH=python $(PYTHON) tests/python/train_compare.py

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
	@$(MAKE) --no-print-directory -s test-gpu-ranks

# Every small plan and every tests/plans kernel-coverage plan with all its
# ranks as processes on the one GPU (tests/gpu_ranks.sh: an NCCL_HOSTID per
# rank), --check eager and with --graph, GPU_RUNS times in a row; the
# FSDP2-on-NCCL recording of fsdp3 against the GPU's --dump of all 3 ranks;
# torchrun (tests/gpu_torchrun.sh). Without a GPU every check prints SKIP.
# Closes with "gpu ranks: N passed, N failed" (bench/gpu_session.sh reads it).
GPU_RUNS     ?= 3
# The shipped plans of real models (too big to simulate, emulate or run on
# one machine's ranks): every test loop skips them by this one list
# (`make print-big-plans`; tests/run.sh and bench/gpu_checks.sh read it).
BIG_PLANS    := llama8b llama8b_cp llama70b llama405b llama405b_hsdp deepseek_v3 deepseek_v3_pp llama405b_4d mixtral8x7b qwen3_8b gptoss_20b gptoss_120b_ep
GPU_PLANS    := $(filter-out $(BIG_PLANS),$(basename $(notdir $(ALL_PLANS))))
KERNEL_PLANS := $(basename $(notdir $(wildcard tests/plans/kernels_*_*.lua)))
.PHONY: test-gpu-ranks
test-gpu-ranks:
	@pass=0; fail=0; \
	ok()   { pass=$$((pass + 1)); echo "  ok    $$1"; }; \
	bad()  { fail=$$((fail + 1)); echo "  FAIL  $$1"; sed 's/^/        | /' build/gpu-ranks.log | tail -n 12; }; \
	skip() { echo "SKIP $$1: no NVIDIA GPU on this machine"; }; \
	if ! nvidia-smi -L >/dev/null 2>&1; then \
	  skip "every small and kernel plan with all ranks, --check eager and --graph, $(GPU_RUNS) runs"; \
	  skip "fsdp3 GPU --dump (3 ranks) vs the FSDP2-on-NCCL recording"; \
	  skip "torchrun --no-python launch"; \
	  echo "gpu ranks: 0 passed, 0 failed"; exit 0; \
	fi; \
	for p in $(GPU_PLANS); do $(MAKE) --no-print-directory -s PLAN=$$p.lua >/dev/null || exit 1; done; \
	for p in $(KERNEL_PLANS) fsdp3; do \
	  $(MAKE) --no-print-directory -s PLAN=tests/plans/$$p.lua OUT=build/gen/$$p >/dev/null || exit 1; done; \
	for run in $$(seq $(GPU_RUNS)); do \
	  for p in $(GPU_PLANS) $(KERNEL_PLANS); do \
	    f=plans/$$p.lua; [ -f $$f ] || f=tests/plans/$$p.lua; \
	    n=$$($(LUA) -e "print(dofile('$$f').world_size)"); \
	    for mode in "" --graph; do \
	      what="$$p: $$n ranks, --check --steps 2 $${mode:-eager}, run $$run"; \
	      if TMPDIR=build tests/gpu_ranks.sh $$n build/$$p/$$p --check --steps 2 $$mode >build/gpu-ranks.log 2>&1; \
	      then ok "$$what"; else bad "$$what"; fi; \
	    done; \
	  done; \
	done; \
	what="fsdp3: GPU --check --pattern oracle --dump, 3 ranks, vs tests/oracle/nccl byte for byte"; \
	rm -rf build/gpu-oracle/fsdp3; \
	if TMPDIR=build tests/gpu_ranks.sh 3 build/fsdp3/fsdp3 --check --pattern oracle --dump build/gpu-oracle/fsdp3 >build/gpu-ranks.log 2>&1 && \
	   $(LUA) tests/oracle_check.lua tests/oracle/nccl build/gpu-oracle/fsdp3 fsdp3 >>build/gpu-ranks.log 2>&1; \
	then ok "$$what"; else bad "$$what"; fi; \
	if [ -x tests/gpu_torchrun.sh ]; then \
	  if tests/gpu_torchrun.sh >build/gpu-ranks.log 2>&1; then \
	    if grep -q '^SKIP' build/gpu-ranks.log; then grep '^SKIP' build/gpu-ranks.log; else ok "tests/gpu_torchrun.sh"; fi; \
	  else bad "tests/gpu_torchrun.sh"; fi; \
	else echo "SKIP torchrun launch: tests/gpu_torchrun.sh is not there"; fi; \
	echo "gpu ranks: $$pass passed, $$fail failed"; [ $$fail = 0 ]

# docs/example.c must keep building against the library it documents.
build/example/example: docs/example.c $(RUNTIME_HDR)
	@$(MAKE) --no-print-directory -s PLAN=single.lua >/dev/null
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(CFLAGS) -Iruntime -Iplans/single $(CUDA_INC) -c docs/example.c -o build/example/example.o
	$(NVCC) -o $@ build/example/example.o build/single/libsingle.a -lnccl -lm $(CUDA_LIBS)

# tests/lib/ep_library.c against a plan's GPU library (the token exchanges on
# real NCCL): make PLAN=<the EP plan> first, then make build/<name>/ep_library.
build/%/ep_library: tests/lib/ep_library.c $(RUNTIME_HDR)
	@test -f build/$*/lib$*.a || { echo "build/$*/lib$*.a is not built: make PLAN=<its plan file> first" >&2; exit 1; }
	$(CC) $(CSTD) $(CFLAGS) -Iruntime $(CUDA_INC) -DCP_PLAN=$*_plan -DCP_KERNELS=$*_kernels -c $< -o build/$*/ep_library.o
	$(NVCC) -o $@ build/$*/ep_library.o build/$*/lib$*.a -lnccl -lm $(CUDA_LIBS)

# ---- host-built copy kernels (issue 18, item 1): g++ only, no nvcc, no GPU ----
# tests/c/test_kernels_host.cc runs the copy kernels (runtime/cp_kernels.cu
# and each plan's generated plan_kernels.cu, compiled by g++ against
# tests/c/kernel_standin/, a test double for the few CUDA names they use)
# on the host: every copy op of every small plan and of the tests/plans
# kernel plans, every rank, on the real arena layout, byte for byte against
# the host backend's copies. Built plain (the kernels' host loads and
# stores) and with ASan+UBSan taking the kernels' device load/store branch
# (-D__CUDA_ARCH__: every 8- and 16-byte word's alignment checked as it is
# made; UBSan's own alignment check is off in the kernels' object only,
# where the negative test makes misaligned words on purpose).
KHOST_PLANS := $(filter-out $(BIG_PLANS),$(basename $(notdir $(ALL_PLANS))))
# tests/ep/plans expert-parallel plans (issue 23): experts units sharded over
# their own group (efsdp), the kernels' tables carry each unit's group size.
EP_PLANS    := $(basename $(notdir $(wildcard tests/ep/plans/ep*.lua)))
KHOST_EXTRA := kernels_all_dtypes kernels_big llama_tiny_cp $(EP_PLANS)
# issue 41 (frozen parameters, requires_grad=False: the pack skips them; also on the emulator)
KHOST_EXTRA += frozen_params
# issue 41 (hlora): the frozen prefix (leading all-frozen units without a pre-backward)
KHOST_EXTRA += frozen_prefix
# issue 41 (hmtp): DeepSeek-V3's multi-token prediction, units called more than once a forward (also on the
# emulator, eager and as a graph; tests/ep/plans/ep2_dsv3_mtp.lua with the expert-parallel plans)
KHOST_EXTRA += fsdp4_dsv3_mtp
KHOST_ALL   := $(KHOST_PLANS) $(KHOST_EXTRA)
KHOST_DIR    = $(if $(filter $(1),$(KHOST_EXTRA)),build/gen/$(1),plans/$(1))
KHOST_RT    := runtime/backend_host.c runtime/topology.c runtime/arena.c runtime/dtype.c runtime/executor.c
KHOST_STANDIN := $(wildcard tests/c/kernel_standin/*.h)
KHOST_CXX   := $(CXX) -std=c++17 -Wall -Wextra -Werror -pthread -Itests/c/kernel_standin -Iruntime

# tests/plans kernel plans, generated into build/gen/<name> by their own sub-make.
build/gen/%/plan.c: tests/plans/%.lua $(GEN_SRC)
	@$(MAKE) --no-print-directory -s PLAN=tests/plans/$*.lua OUT=build/gen/$* build/$*/.generated >/dev/null
build/gen/%/plan_kernels.cu: build/gen/%/plan.c ;
# tests/pp/plans pipeline plans (gen/parallel/pp.lua: a class of tables per pipeline rank).
build/gen/pp_%/plan.c: tests/pp/plans/pp_%.lua $(GEN_SRC)
	@$(MAKE) --no-print-directory -s PLAN=tests/pp/plans/pp_$*.lua OUT=build/gen/pp_$* build/pp_$*/.generated >/dev/null
# tests/ep/plans expert-parallel plans (gen/parallel/ep.lua), named ep<...>.
build/gen/ep%/plan.c: tests/ep/plans/ep%.lua $(GEN_SRC)
	@$(MAKE) --no-print-directory -s PLAN=tests/ep/plans/ep$*.lua OUT=build/gen/ep$* build/ep$*/.generated >/dev/null

# $(1): build directory; $(2): flags for every file; $(3): for the C++ files
# (the test and the kernels); $(4): for the kernels' object alone
define khost_test
$(1)/khost/khost_plans.def: FORCE
	@mkdir -p $(1)/khost
	@printf 'CP_KHOST_PLAN(%s)\n' $(KHOST_ALL) >$$@.new; if cmp -s $$@.new $$@; then rm -f $$@.new; else mv -f $$@.new $$@; fi
$(1)/khost/cp_kernels.o: runtime/cp_kernels.cu runtime/cp_kernels.cuh runtime/cp_gpu_kernels.h $(RUNTIME_HDR) $(KHOST_STANDIN)
	@mkdir -p $(1)/khost
	$(KHOST_CXX) $(2) $(3) $(4) -x c++ -c $$< -o $$@
$(1)/khost/rt_%.o: runtime/%.c $(RUNTIME_HDR)
	@mkdir -p $(1)/khost
	$$(CC) $$(CSTD) $(2) -Iruntime -c $$< -o $$@
$(foreach p,$(KHOST_ALL),
$(1)/khost/$(p).plan.o: $(call KHOST_DIR,$(p))/plan.c $(RUNTIME_HDR)
	@mkdir -p $(1)/khost
	$$(CC) $$(CSTD) $(2) -Iruntime -I$(call KHOST_DIR,$(p)) -c $$< -o $$@
$(1)/khost/$(p).kernels.o: $(call KHOST_DIR,$(p))/plan_kernels.cu $(call KHOST_DIR,$(p))/plan.c runtime/cp_gpu_kernels.h $(RUNTIME_HDR) $(KHOST_STANDIN)
	@mkdir -p $(1)/khost
	$(KHOST_CXX) $(2) $(3) -I$(call KHOST_DIR,$(p)) -x c++ -c $$< -o $$@
)
$(1)/test_kernels_host: tests/c/test_kernels_host.cc $(1)/khost/khost_plans.def $(1)/khost/cp_kernels.o \
    $(patsubst runtime/%.c,$(1)/khost/rt_%.o,$(KHOST_RT)) $(foreach p,$(KHOST_ALL),$(1)/khost/$(p).plan.o $(1)/khost/$(p).kernels.o)
	$(KHOST_CXX) $(2) $(3) -I$(1)/khost -o $$@ $$< $$(filter %.o,$$^) -lm
endef
KHOST_DEVICE_WORDS := -D__CUDA_ARCH__=900 -DCP_KHOST_DEVICE_WORDS -fno-strict-aliasing
$(eval $(call khost_test,build/tests,-O2 -g,,))
$(eval $(call khost_test,build/tests-asan,$(SAN) -O1 -g,$(KHOST_DEVICE_WORDS),-fno-sanitize=alignment))

# ---- the GPU path on an emulated CUDA runtime and NCCL (issue 18) ----
# build/emu/<plan>/<plan>: the plan's binary with the unchanged
# runtime/gpu.c, gpu_run.c, launch and rendezvous code and the copy kernels
# (runtime/cp_kernels.cu, each plan's plan_kernels.cu), built with cc/g++
# against tests/emu/ (stand-in cuda_runtime.h and nccl.h, emu_cuda.c,
# emu_nccl.c: a test double, never shipped; docs/emulator.md). Ranks run as
# processes (tests/emu_ranks.sh, torchrun). Needs no nvcc and no GPU.
EMU_HDR    := $(wildcard tests/emu/*.h)
EMU_CFLAGS := -O1 -g
EMU_CC      = $(CC) $(CSTD) $(EMU_CFLAGS) -Itests/emu -Iruntime
EMU_CXX     = $(CXX) -std=c++17 -Wall -Wextra -Werror -pthread $(EMU_CFLAGS) -include tests/emu/cuda_runtime.h \
              -Itests/emu -Itests/c/kernel_standin -Iruntime
EMU_EXTRA  := $(KHOST_EXTRA) fsdp3 fsdp2_tp2 pp_tiny pp_tiny_tp pp_tiny_zbv pp_tiny_lbfs pp_tiny_gpipe pp_tiny_izb pp_tiny_dpv \
              pp_qwen3_tiny pp_ep_mixtral llama_tiny_cptp llama_tiny_cppp mixed_ag \
              gdiv_premul gdiv_hsdp gacc_units ignored_params
EMU_PLANS  := $(KHOST_ALL) fsdp3 fsdp2_tp2 pp_tiny pp_tiny_tp pp_tiny_zbv pp_tiny_lbfs pp_tiny_gpipe pp_tiny_izb pp_tiny_dpv \
              pp_qwen3_tiny pp_ep_mixtral llama_tiny_cptp llama_tiny_cppp mixed_ag \
              gdiv_premul gdiv_hsdp gacc_units ignored_params
EMU_DIR     = $(if $(filter $(1),$(EMU_EXTRA)),build/gen/$(1),plans/$(1))
EMU_LIB_PLANS := fsdp4 hsdp2x2 hsdp3x2_arlast hsdp2x2_stepend hsdp4x2_fp16 fsdp8_uneven llama_tiny_tp hsdp2x2_offload
# issue 39 (FSDPModule's schedule knobs)
EMU_EXTRA  += hsdp_keep_unsharded fsdp4_prefetch
EMU_PLANS  += hsdp_keep_unsharded fsdp4_prefetch
EMU_LIB_PLANS += hsdp_keep_unsharded fsdp4_prefetch
# issue 41 (fsdp.symm_mem: the symmetric window, ncclMemAlloc + ncclCommWindowRegister)
EMU_EXTRA  += symm_fsdp4 symm_hsdp_tp symm_ep2 symm_hsdp2x2
EMU_PLANS  += symm_fsdp4 symm_hsdp_tp symm_ep2 symm_hsdp2x2
# issue 39 (h39r): reshard_after_forward as an int (post-forward groups)
EMU_EXTRA  += fsdp4_raf2 hsdp_raf2
EMU_PLANS  += fsdp4_raf2 hsdp_raf2
EMU_LIB_PLANS += fsdp4_raf2 hsdp_raf2
# issue 39 (h39v): set_unshard_in_backward(False)
EMU_EXTRA  += unshard_bwd
EMU_PLANS  += unshard_bwd
EMU_LIB_PLANS += unshard_bwd
# The same under ASan+UBSan (the GPU path's own memory errors: a freed
# buffer a queued host function still reads), for a few plans.
EMU_ASAN_PLANS := fsdp4 llama_tiny_tp hsdp3x2_arlast ep2_mixtral_hsdp hsdp2x2_offload
# $(1): build tree; $(2): extra compiler flags; $(3): plans. Objects of the
# emulator, the GPU runtime and the host runtime, then each plan's binary
# (and library_run where $(4) names the plan).
define emu_tree
$(1)/obj/emu_%.o: tests/emu/emu_%.c $(EMU_HDR) $(RUNTIME_HDR)
	@mkdir -p $$(dir $$@)
	$$(EMU_CC) $(2) -Wno-format-truncation -c $$< -o $$@
$(1)/obj/rt_%.o: runtime/%.c $(RUNTIME_HDR) $(EMU_HDR)
	@mkdir -p $$(dir $$@)
	$$(EMU_CC) $(2) -c $$< -o $$@
$(1)/obj/cp_kernels.o: runtime/cp_kernels.cu runtime/cp_kernels.cuh runtime/cp_gpu_kernels.h $(RUNTIME_HDR) $(EMU_HDR) $(KHOST_STANDIN)
	@mkdir -p $$(dir $$@)
	$$(EMU_CXX) $(2) -x c++ -c $$< -o $$@
$(1)/emu_selftest: tests/emu/emu_selftest.c $(1)/obj/emu_cuda.o $(1)/obj/emu_nccl.o $(patsubst runtime/%.c,$(1)/obj/rt_%.o,$(RUNTIME_SRC))
	$$(EMU_CC) $(2) -o $$@ $$^ -lm -lrt
$(foreach p,$(3),
$(1)/$(p)/plan.o: $(call EMU_DIR,$(p))/plan.c $(RUNTIME_HDR)
	@mkdir -p $$(dir $$@)
	$$(EMU_CC) $(2) -I$(call EMU_DIR,$(p)) -c $$< -o $$@
$(1)/$(p)/plan_kernels.o: $(call EMU_DIR,$(p))/plan_kernels.cu $(call EMU_DIR,$(p))/plan.c runtime/cp_gpu_kernels.h $(RUNTIME_HDR) $(EMU_HDR)
	@mkdir -p $$(dir $$@)
	$$(EMU_CXX) $(2) -I$(call EMU_DIR,$(p)) -x c++ -c $$< -o $$@
$(1)/$(p)/main.o: runtime/main.c $(RUNTIME_HDR) $(call EMU_DIR,$(p))/plan.c VERSION
	@mkdir -p $$(dir $$@)
	$$(EMU_CC) $(2) -DCP_WITH_GPU -DCP_KERNELS=$(p)_kernels -DCP_PLAN=$(p)_plan -DCP_VERSION='"$(CP_VERSION)"' -c $$< -o $$@
$(1)/$(p)/library_run: tests/emu/library_run.c $(1)/$(p)/plan.o $(1)/$(p)/plan_kernels.o $(foreach o,emu_cuda emu_nccl rt_gpu rt_gpu_run cp_kernels,$(1)/obj/$(o).o) $(patsubst runtime/%.c,$(1)/obj/rt_%.o,$(RUNTIME_SRC))
	$$(EMU_CC) $(2) -DCP_PLAN=$(p)_plan -DCP_KERNELS=$(p)_kernels -c $$< -o $(1)/$(p)/library_run.o
	$$(CXX) $(2) -pthread -o $$@ $(1)/$(p)/library_run.o $$(filter %.o,$$^) -lm -lrt
$(1)/$(p)/ep_library: tests/lib/ep_library.c $(1)/$(p)/plan.o $(1)/$(p)/plan_kernels.o $(foreach o,emu_cuda emu_nccl rt_gpu rt_gpu_run cp_kernels,$(1)/obj/$(o).o) $(patsubst runtime/%.c,$(1)/obj/rt_%.o,$(RUNTIME_SRC))
	$$(EMU_CC) $(2) -DCP_PLAN=$(p)_plan -DCP_KERNELS=$(p)_kernels -c $$< -o $(1)/$(p)/ep_library.o
	$$(CXX) $(2) -pthread -o $$@ $(1)/$(p)/ep_library.o $$(filter %.o,$$^) -lm -lrt
$(1)/$(p)/example: docs/example.c $(1)/$(p)/plan.o $(1)/$(p)/plan_kernels.o $(foreach o,emu_cuda emu_nccl rt_gpu rt_gpu_run cp_kernels,$(1)/obj/$(o).o) $(patsubst runtime/%.c,$(1)/obj/rt_%.o,$(RUNTIME_SRC))
	$$(EMU_CC) $(2) -I$(call EMU_DIR,$(p)) -c $$< -o $(1)/$(p)/example.o
	$$(CXX) $(2) -pthread -o $$@ $(1)/$(p)/example.o $$(filter %.o,$$^) -lm -lrt
$(1)/$(p)/$(p): $(1)/$(p)/main.o $(1)/$(p)/plan.o $(1)/$(p)/plan_kernels.o $(foreach o,emu_cuda emu_nccl rt_gpu rt_gpu_run cp_kernels,$(1)/obj/$(o).o) $(patsubst runtime/%.c,$(1)/obj/rt_%.o,$(RUNTIME_SRC))
	$$(CXX) $(2) -pthread -o $$@ $$^ -lm -lrt
)
endef
$(eval $(call emu_tree,build/emu,,$(EMU_PLANS)))
$(eval $(call emu_tree,build/emu-asan,$(SAN),$(EMU_ASAN_PLANS)))
# Expert parallelism's all-to-alls on the GPU path: hand-written tables
# (tests/emu/a2a_plan.c, no generated plan has them yet) with the binary's
# main, plain and under ASan+UBSan (tests/emu_check.sh runs them).
define emu_a2a
$(1)/a2a_ep4/plan.o: tests/emu/a2a_plan.c $(RUNTIME_HDR)
	@mkdir -p $$(dir $$@)
	$$(EMU_CC) $(2) -c $$< -o $$@
$(1)/a2a_ep4/main.o: runtime/main.c $(RUNTIME_HDR) VERSION
	@mkdir -p $$(dir $$@)
	$$(EMU_CC) $(2) -DCP_WITH_GPU -DCP_KERNELS=a2a_ep4_kernels -DCP_PLAN=a2a_ep4_plan -DCP_VERSION='"$(CP_VERSION)"' -c $$< -o $$@
$(1)/a2a_ep4/a2a_ep4: $(1)/a2a_ep4/main.o $(1)/a2a_ep4/plan.o $(foreach o,emu_cuda emu_nccl rt_gpu rt_gpu_run cp_kernels,$(1)/obj/$(o).o) $(patsubst runtime/%.c,$(1)/obj/rt_%.o,$(RUNTIME_SRC))
	$$(CXX) $(2) -pthread -o $$@ $$^ -lm -lrt
endef
$(eval $(call emu_a2a,build/emu,))
$(eval $(call emu_a2a,build/emu-asan,$(SAN)))
.PHONY: emu-build test-emu print-emu-plans print-emu-asan-plans print-emu-lib-plans print-big-plans
print-big-plans:
	@echo $(BIG_PLANS)
print-emu-plans:
	@echo $(EMU_PLANS)
print-emu-asan-plans:
	@echo $(EMU_ASAN_PLANS)
# (EMU_LIB_PLANS: one list, above with EMU_PLANS and its additions; tests/emu_check.sh reads it from here)
print-emu-lib-plans:
	@echo $(EMU_LIB_PLANS)
# tests/lib/ep_library.c: the library's token exchanges (every EP test plan; one under ASan)
EMU_EP_LIB_PLANS := ep2_mixtral ep4_mixtral_efsdp1 ep2_dsv3_shard1 ep2_mixtral_hsdp ep2_mixtral_ac ep4_dsv3_tp2
emu-build: build/emu/emu_selftest $(foreach p,$(EMU_PLANS),build/emu/$(p)/$(p)) $(foreach p,$(EMU_LIB_PLANS),build/emu/$(p)/library_run) build/emu/single/example build/emu/pp_tiny/library_run \
           $(foreach p,$(EMU_EP_LIB_PLANS),build/emu/$(p)/ep_library) build/emu-asan/ep2_mixtral_hsdp/ep_library \
           $(foreach p,$(EMU_ASAN_PLANS),build/emu-asan/$(p)/$(p)) build/emu/a2a_ep4/a2a_ep4 build/emu-asan/a2a_ep4/a2a_ep4 \
           build/emu-asan/fsdp4/library_run
# make test-emu: every small plan and the kernel plans on the emulator
# (tests/emu_check.sh): all ranks, --check eager and --graph, three seeds,
# then the seeded faults.
test-emu: emu-build
	@LUA=$(LUA) tests/emu_check.sh $(EMU_PLANS)

# ---- live FSDP2 peer (issue 16, items 1 and 2) ----
# make torch-env: the pinned PyTorch environment the live peer runs in, a
# virtual environment outside the clone at
# ${COMMPLAN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/commplan}/torch-env,
# built from python/requirements-live.txt under a lock and only when that
# file changes (tests/live/torch_env.sh; docs/testing.md: cost and removal). make
# test runs the same script (tests/run.sh) and prints SKIP where the
# package registry cannot be reached.
# make test-live: PyTorch's fully_shard on gloo, one process per rank
# (tests/live/record.py), against the binary's --simulate --pattern oracle
# --dump, element for element (tests/live/live.py): every small plan and
# then random generic plans SEEDS (default 1-200). SEEDS=a-b runs only
# those seeds, SEEDS=n reruns one verbosely and keeps its files under
# build/live/; PLANS="fsdp4 hsdp2x2" runs only those plans. TREE=<checkout>
# builds the binaries from another checkout's generator and runtime.
.PHONY: torch-env test-live
torch-env:
	@tests/live/torch_env.sh
test-live:
	$(if $(call cp_strip,$(value SEEDS),0 1 2 3 4 5 6 7 8 9 -),$(error SEEDS=$(value SEEDS): give a seed (7) or a range (1-200)))
	$(if $(strip $(foreach w,$(value PLANS),$(call cp_strip,$(w),$(cp_word)))),$(error PLANS: plan names, [A-Za-z0-9_] separated by spaces))
	$(if $(value TREE),$(if $(call cp_bad_path,$(value TREE)),$(error TREE: a directory named with A-Z a-z 0-9 _ . / + - only)))
	@out=$$(tests/live/torch_env.sh --python); rc=$$?; \
	if [ $$rc = 3 ]; then echo "SKIP test-live: $${out#torch-env: }"; exit 1; elif [ $$rc != 0 ]; then echo "$$out"; exit 1; fi; \
	py=$$(printf '%s\n' "$$out" | tail -n 1); \
	printf '%s\n' "$$out" | head -n 1; \
	tree='$(if $(value TREE),--tree $(value TREE))'; \
	if [ -n '$(value SEEDS)' ]; then \
	  case '$(value SEEDS)' in *-*) exec "$$py" tests/live/live.py seeds '$(value SEEDS)' $$tree ;; \
	  *) exec "$$py" tests/live/live.py seed '$(value SEEDS)' $$tree ;; esac; \
	elif [ -n '$(value PLANS)' ]; then exec "$$py" tests/live/live.py plans $(value PLANS) $$tree; \
	else "$$py" tests/live/live.py plans $$tree; a=$$?; "$$py" tests/live/live.py seeds 1-200 $$tree; b=$$?; \
	  [ $$a = 0 ] && [ $$b = 0 ]; fi
# ---- end of live FSDP2 peer ----

# ---- simulation at memory speed (issue 19, item 4) ----
# test-fastpath: the host's run-at-a-time copies and reductions byte for
# byte against the per-element path they replaced (tests/c/test_fastpath.c),
# plain and with ASan+UBSan. bench-host: their GB/s beside memcpy
# (bench/host_bench.c; bench/RESULTS.md). simulate-big: llama8b, llama70b
# and llama405b_hsdp checked exactly, each rank of --ranks auto alone with
# stand-in peers (docs/simulate.md says what that covers and what not).
FASTPATH_SRC := tests/c/test_fastpath.c runtime/dtype.c runtime/backend_host.c runtime/topology.c runtime/arena.c runtime/executor.c
build/tests/test_fastpath: $(FASTPATH_SRC) $(RUNTIME_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) -O2 -g -Iruntime -o $@ $(FASTPATH_SRC) -lcmocka -lm
# (the runtime's half: the ASan+UBSan objects the cmocka tests link, the same flags)
build/tests-asan/test_fastpath: tests/c/test_fastpath.c $(patsubst runtime/%.c,build/tests-asan/rt/%.o,$(filter runtime/%,$(FASTPATH_SRC))) $(RUNTIME_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(SAN) -O1 -g -Iruntime -o $@ $(filter %.c %.o,$^) -lcmocka -lm
build/bench/host_bench: bench/host_bench.c $(filter-out tests/c/test_fastpath.c,$(FASTPATH_SRC)) $(RUNTIME_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(CFLAGS) -Iruntime -o $@ $(filter-out tests/c/test_fastpath.c,$(FASTPATH_SRC)) bench/host_bench.c -lm
.PHONY: test-fastpath bench-host simulate-big
test-fastpath: build/tests/test_fastpath build/tests-asan/test_fastpath
	build/tests/test_fastpath
	build/tests-asan/test_fastpath
bench-host: build/bench/host_bench
	build/bench/host_bench $(or $(value MELEMS),16)
simulate-big:
	@for p in llama8b llama70b llama405b_hsdp; do \
	  $(MAKE) --no-print-directory -s PLAN=$$p.lua >/dev/null || exit 1; \
	  t0=$$(date +%s); build/$$p/$$p --simulate --ranks auto || exit 1; \
	  echo "$$p: $$(( $$(date +%s) - t0 )) s"; \
	done
