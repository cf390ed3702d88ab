# nanoZeRO — build, run, test.
#   make          build the programs into build/ (trainers in build/bin/); make tests: the test programs
#   make run      the main job: the tour of the stages on 4 MPI ranks (installs what is missing)
#   make test     every test suite, ending with one line "N passed, N failed" (installs what is missing)
#   make diff A=stage1 B=stage2    the lesson between two stages (COLOR=always|never, WORDS=1: scripts/lesson_diff.sh)
#   make exercise [E=NAME]         list the exercises, or write one for a learner; make check E=NAME grades it
#                                  (HINT=2: find-the-bug's stronger hint); make exercise-key [E=NAME]: the answers
#   make notebooks                 Jupyter in .venv on notebooks/ (installed the first time), printing its URL
#   make bugs                      real ZeRO bugs replayed as broken rungs: source, symptom, the test that catches each (docs/faq.md)
#   make emu-check CU=file.cu [ARGS="..."]   one CUDA program on the CPU emulator with its checks on: races,
#                                  uninitialised reads, bounds, misalignment, stream order (dev/emu.mk, docs/gpu.md)
#   make gpu-bundle                what the GPU check runs, built here for a GPU machine that has CUDA but
#                                  no MPI and no GoogleTest: build/gpu-bundle/ (dev/gpu_bundle/gpu_bundle.sh)
#   make gpu-rehearsal             that bundle rehearsed here under the GPU machine's conditions, and the speed
#                                  rows' golden losses (dev/gpu_bundle/rehearsal.sh; by hand, 15-20 minutes)
#   make arm64-check               64-bit ARM from this x86-64 machine: a cross-build, and a smoke test
#                                  under emulation (scripts/arm64_check.sh)
#   make pristine-check            the README's two commands on a pristine Debian 12 root holding only make
#                                  and git, as root (scripts/pristine_check.sh; by hand, ~20 minutes)
#   make two-nodes [RATE=100mbit]  every rung across two nodes on this machine (network namespaces and a
#                                  veth pair, as root): bit for bit one node's run, and the link's bytes
#                                  beside the ledger's (scripts/two_nodes.sh; by hand, 2-3 minutes)
# The CPU backend is always built. Where nvcc runs (on PATH, or in $CUDA_HOME/bin) the CUDA backend
# is compiled into the same binaries (no GPU is needed to build); `make CUDA=0` leaves it out.

CXX        := mpicxx
NVCC       ?= nvcc
BUILD      := build
# The CUDA backend is built where nvcc runs, whatever the environment says: a CUDA_HOME set by a
# container image or a shell profile, with no nvcc in it, leaves the build on the CPU (said in one
# line); a toolkit whose bin/ is not on PATH is used through CUDA_HOME. CUDA_HOME is then the
# toolkit of the nvcc that runs (its headers and libraries), unless given on the command line.
NVCC_BIN   := $(shell $(NVCC) --version >/dev/null 2>&1 && command -v $(NVCC))
ifeq ($(NVCC_BIN),)
  ifneq ($(CUDA_HOME),)
    NVCC_BIN := $(shell $(CUDA_HOME)/bin/nvcc --version >/dev/null 2>&1 && echo $(CUDA_HOME)/bin/nvcc)
    NVCC     := $(or $(NVCC_BIN),$(NVCC))
    ifeq ($(NVCC_BIN)$(MAKELEVEL)$(CUDA),0)
      $(shell echo "make: CUDA_HOME=$(CUDA_HOME) holds no nvcc that runs, and none is on PATH: building the CPU backend only (install the CUDA toolkit, or unset CUDA_HOME)" >&2)
    endif
  endif
endif
ifneq ($(origin CUDA_HOME),command line)
  CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC_BIN))
endif
CUDA       ?= $(if $(NVCC_BIN),1,0)
# The GPU generations the CUDA objects are compiled for, plus PTX for the last one (so that newer
# GPUs can run it, compiled by the driver): the machine's own GPUs where nvidia-smi lists them,
# else sm_80 alone (the first with bf16 tensor cores, which the kernels need): a machine without a
# GPU builds for one generation, not every one (make gpu-bundle builds its own, for sm_90).
CUDA_ARCH  ?= $(or $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d . | sort -un | tr '\n' ' '),80)
# The machine the binaries are for (x86_64-linux-gnu, aarch64-linux-gnu): the compiler's target.
# A build for another architecture (make arm64-check: ARM64 from an x86-64 machine) sets CXX to that
# target's compiler and SYSROOT to a root file system holding its libraries: they are found under
# $(SYSROOT) here and at their usual paths where the binaries run. MPI_CFLAGS and MPI_LIBS then say
# where MPI's headers are and name its library: what mpicxx adds by itself.
TARGET     := $(shell $(CXX) -dumpmachine 2>/dev/null)
MULTIARCH  := $(shell $(CXX) -print-multiarch 2>/dev/null)
SYSROOT    ?=
MPI_CFLAGS ?=
MPI_LIBS   ?=
# The CPU the binaries are compiled for: this machine's, unless they are built for another one
# (make gpu-bundle: x86-64-v3, any x86-64 CPU of the last ten years with AVX2; make arm64-check:
# armv8-a, every 64-bit ARM CPU). On ARM, GCC's flag for "this machine's CPU" is -mcpu=native (its
# architecture, extensions and tuning); any other HOST_ARCH there is an architecture (-march).
HOST_ARCH  ?= native
ifneq ($(filter aarch64%,$(TARGET)),)
  ARCH_FLAGS := $(if $(filter native,$(HOST_ARCH)),-mcpu=native,-march=$(HOST_ARCH))
else
  ARCH_FLAGS := -march=$(HOST_ARCH)
endif

# The CPU fast path's matrix products: OpenBLAS in its OpenMP build (Debian's libopenblas-openmp-dev,
# which scripts/install_deps.sh installs), named by its directory so that it is this build and not
# another BLAS: it then runs on each rank's own OpenMP threads, one pool per rank.
BLAS_INC   := $(SYSROOT)/usr/include/$(MULTIARCH)/openblas-openmp
BLAS_DIR   := /usr/lib/$(MULTIARCH)/openblas-openmp
BLAS_LIBS  := -L$(SYSROOT)$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas
# -ffp-contract=off: no fused multiply-add unless written, so a kernel gives the same bits
# wherever it is called from (the stages are compared bit for bit).
CXXFLAGS   := -std=c++17 -O3 $(ARCH_FLAGS) -ffp-contract=off -fno-math-errno -fopenmp -Wall -Wextra \
              -Wno-unused-parameter -Icommon -I. -I$(BLAS_INC) $(MPI_CFLAGS) -MMD -MP
# The gold linker where the toolchain has it (binutils does on Debian and Ubuntu): it links a trainer
# in about a third of ld.bfd's CPU time (0.37 -> 0.11 s), which make test pays for every test
# binary, mutant and graded exercise. Without it, the default linker.
LD_GOLD    := $(shell $(CXX) -fuse-ld=gold -Wl,--version 2>/dev/null | grep -q 'GNU gold' && echo -fuse-ld=gold)
LDFLAGS    := -fopenmp $(LD_GOLD)
LDLIBS     := -lpthread $(BLAS_LIBS) $(MPI_LIBS)
# oneDNN (libdnnl-dev): bf16 products on the CPU's bf16 dot-product instructions (common/kernels/gemm_bf16.h).
# `make DNNL=0` leaves it out (a build for a GPU machine, say): CPU bf16 products are then widened for sgemm.
# Beyond x86-64 it is optional (Debian builds it for 64-bit ARM, not for every architecture): used
# where it is installed.
ifneq ($(filter x86_64%,$(TARGET)),)
  DNNL     ?= 1
else
  DNNL     ?= $(if $(wildcard $(SYSROOT)/usr/include/oneapi/dnnl/dnnl.hpp),1,0)
endif
DNNL_LIBS  :=
ifeq ($(DNNL),1)
  CXXFLAGS   += -DNZ_HAVE_DNNL
  DNNL_LIBS  := -ldnnl
endif
LDLIBS     += $(DNNL_LIBS)

# The library: the core (common/*.cpp, what a learner reads), its rooms (common/kernels, runtime,
# input, io, compression), the rungs' own files (DIR/*.cpp of stages.txt), and the inference pieces
# the tools and tests share (inference/decoder, quant; the CUDA ops of its decode step,
# inference/kernels_decode.cu, are in CUDA_SRC). Includes
# name the room from common/ ("kernels/kernels.h") or from the root ("inference/decoder.h").
# A rung's own files (its plan, its store, its formulas) live beside its train.cpp: DIR/*.cpp for each
# rung of stages.txt, included from the root ("pipeline/pipeline.h").
RUNG_DIRS  := $(shell sed -n 's/^+*\([a-z][a-z0-9_]*\).*/\1/p' stages.txt)
RUNG_SRC   := $(filter-out %/train.cpp,$(wildcard $(addsuffix /*.cpp,$(RUNG_DIRS))))
COMMON_SRC := $(wildcard common/*.cpp common/*/*.cpp) $(RUNG_SRC) inference/decoder.cpp inference/quant.cpp
COMMON_OBJ := $(COMMON_SRC:%.cpp=$(BUILD)/obj/%.o)

ifeq ($(CUDA),1)
  CXXFLAGS   += -DNZ_HAVE_CUDA -I$(CUDA_HOME)/include
  NVCCFLAGS  := -std=c++17 -O3 -ccbin $(CXX) -DNZ_HAVE_CUDA -Icommon -I. -MMD -MP \
                -Xcompiler -fopenmp,-ffp-contract=off --expt-relaxed-constexpr \
                $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_$(lastword $(CUDA_ARCH)),code=compute_$(lastword $(CUDA_ARCH))
  CUDA_SRC   := $(wildcard common/kernels/cuda/*.cu inference/*.cu)
  CUDA_OBJ   := $(CUDA_SRC:%.cu=$(BUILD)/obj/%.o)
  CUDA_PTXAS := $(CUDA_SRC:%.cu=$(BUILD)/obj/%.ptxas)  # their resource reports (tests/cuda/ptxas_check.sh)
  # cuBLAS is opened by the first GPU matmul, not linked: loading it costs every process about
  # 0.2 s of CPU time, GPU or not (common/kernels/cuda/cublas_dlopen.cpp). The bundle links it.
  ifneq ($(NZ_BUNDLE),1)
    CUDA_OBJ += $(BUILD)/obj/common/kernels/cuda/cublas_dlopen.o
    CXXFLAGS += -DNZ_CUBLAS_DLOPEN
  endif
  LDLIBS     += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lnccl -ldl
endif

# NZ_BUNDLE=1 (set by make gpu-bundle): binaries that run on another machine from one folder. The C++
# library is linked in (-static-libstdc++, exporting none of its symbols: NCCL and cuBLAS load the
# machine's own libstdc++.so.6, which must not bind to the program's copy), and so is the CUDA
# runtime (cudart_static: the driver, cuBLAS and NCCL come from that machine); libgcc_s stays the
# machine's (NCCL needs it there anyway, and its unwinder on glibc 2.35 would raise the bundle's
# glibc floor); every other library is looked
# up first in the bundle's lib/ ($$ORIGIN/../lib as an RPATH, not a RUNPATH, so that it holds for the
# libraries those libraries load too).
LINK_EXTRA :=
ifeq ($(NZ_BUNDLE),1)
  BLAS_LIBS  := -L$(BLAS_DIR) -lopenblas
  LDFLAGS    += -static-libstdc++ -Wl,--exclude-libs,ALL -Wl,--disable-new-dtags -Wl,-rpath,'$$ORIGIN/../lib'
  LDLIBS     := -lpthread $(BLAS_LIBS) -L$(CUDA_HOME)/lib64 -lcudart_static -lnccl -lcublasLt -lcublas -ldl -lrt
  LINK_EXTRA := $(BUILD)/obj/dev/gpu_bundle/glibc_compat.o
endif

# Objects depend on the configuration that compiled them: $(BUILD)/config.flags holds the compilers
# and their flags (CUDA on or off, oneDNN, -march, CUDA_ARCH), is rewritten when they change (by any
# make that may build: not print-build-flags, which a script may call with other settings, nor make -n), and
# every object already in $(BUILD) depends on it. So a build after `make CUDA=0` (or another
# HOST_ARCH, DNNL, CUDA_ARCH) recompiles instead of linking objects made for another configuration.
CONFIG_FILE := $(BUILD)/config.flags
CONFIG_NOW  := CXX=$(CXX) CXXFLAGS=$(CXXFLAGS) | CUDA=$(CUDA) NVCC=$(NVCC) NVCCFLAGS=$(NVCCFLAGS)
DRY_RUN     := $(findstring n,$(firstword -$(MAKEFLAGS)))
BUILDS      := $(if $(DRY_RUN),,$(filter-out print-build-flags clean diff exercise exercise-key deps,$(or $(MAKECMDGOALS),all)))
ifneq ($(BUILDS),)
  ifneq ($(CONFIG_NOW),$(file <$(CONFIG_FILE)))
    ifneq ($(wildcard $(CONFIG_FILE)),)
      $(info build configuration changed: every object in $(BUILD) is recompiled ($(CONFIG_FILE)))
    endif
    $(shell mkdir -p $(BUILD))
    $(file >$(CONFIG_FILE),$(CONFIG_NOW))
  endif
endif
$(shell find $(BUILD) -name '*.o' 2>/dev/null): $(CONFIG_FILE)
# (a rule whose targets are found files: `make` alone must still mean `all`, not the first of them)
.DEFAULT_GOAL := all

LIB        := $(BUILD)/libnanozero.a
STAGES     := $(shell awk '/^[a-z]/ {print $$1}' stages.txt)  # the rungs, in order: stages.txt, the one list
BESIDE     := $(shell sed -n 's/^+\([a-z][a-z0-9_]*\).*/\1/p' stages.txt)  # trainers beside the ladder ('+' lines)
STAGE_BINS := $(foreach s,$(STAGES) $(BESIDE),$(if $(wildcard $(s)/train.cpp),$(BUILD)/bin/$(s)))
# tools/zero_quiz.cpp is part of zero_estimate, not a program of its own; dev/bench/ holds the benches
TOOL_BINS  := $(patsubst tools/%.cpp,$(BUILD)/bin/%,$(filter-out tools/zero_quiz.cpp,$(wildcard tools/*.cpp))) \
              $(BUILD)/bin/generate \
              $(patsubst dev/bench/%.cpp,$(BUILD)/bin/%,$(wildcard dev/bench/*.cpp))
# tests/<subject>/test_*.cpp -> $(BUILD)/tests/test_* (one folder of test programs; sources by subject)
TEST_SRC   := $(wildcard tests/*/test_*.cpp)
TEST_BINS  := $(addprefix $(BUILD)/tests/,$(basename $(notdir $(TEST_SRC))))

.PHONY: all tests extra deps run test diff clean explorer explore bench-adam bench muon-study bench-inference plots notebooks exercise exercise-key check \
        student-pack grade \
        print-build-flags gpu-bundle gpu-rehearsal arm64-check pristine-check two-nodes
# `make` builds the programs; `make tests` the test programs and the deliberately broken trainers
all: $(STAGE_BINS) $(TOOL_BINS) $(CUDA_PTXAS)
tests: $(TEST_BINS) extra

# Fragments tests/*/*.mk and dev/*.mk add their own targets (the deliberately broken trainers of the
# tests of the tests, built into $(BUILD)/mutants/bin) to EXTRA_BINS; `make tests` builds them.
EXTRA_BINS :=
# The mutants' objects (below, at MUTANT_CXXFLAGS) depend on their precompiled header: each fragment's rule names it.
MUTANT_PCH := $(BUILD)/obj/mutants/precompiled.h
MUTANT_GCH := $(MUTANT_PCH).gch
-include $(sort $(wildcard tests/*/*.mk dev/*.mk))
extra: $(EXTRA_BINS)

$(BUILD)/obj/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

# Each CUDA object comes with OBJ.ptxas (one recipe makes both): the GPU assembler's resource report
# (-Xptxas -v: registers, spills, shared memory per kernel) and each kernel's .maxntid (its
# __launch_bounds__) from the PTX, kept for that in OBJ.keep/ and removed after. The report's lines
# go to the file; any other message of the compiler still reaches the terminal.
# tests/cuda/ptxas_check.sh reads the reports.
$(BUILD)/obj/%.o $(BUILD)/obj/%.ptxas: %.cu
	@mkdir -p $(dir $@)
	@rm -rf $(BUILD)/obj/$*.keep && mkdir -p $(BUILD)/obj/$*.keep
	$(NVCC) $(NVCCFLAGS) -c $< -o $(BUILD)/obj/$*.o -Xptxas -v --keep --keep-dir $(BUILD)/obj/$*.keep \
	  2>$(BUILD)/obj/$*.ptxas || { cat $(BUILD)/obj/$*.ptxas >&2; rm -rf $(BUILD)/obj/$*.keep $(BUILD)/obj/$*.ptxas; exit 1; }
	@grep -v '^ptxas info\|^    [0-9]* bytes stack frame' $(BUILD)/obj/$*.ptxas >&2 || true
	@grep -h '\.entry\|\.maxntid' $(BUILD)/obj/$*.keep/*.ptx | sed 's/^/ptx: /' >>$(BUILD)/obj/$*.ptxas
	@rm -rf $(BUILD)/obj/$*.keep

# stages.txt's columns (rung.h): its rung lines, one C string each, compiled into common/rung.cpp
# (and into the emulator's copy of it, dev/emu.mk)
RUNG_LINES := $(BUILD)/gen/stages_txt.inc
$(RUNG_LINES): stages.txt
	@mkdir -p $(dir $@)
	sed -n 's/^\(+*[a-z][^"\\]*\)$$/"\1",/p' $< >$@.tmp && mv $@.tmp $@
$(BUILD)/obj/common/rung.o $(BUILD)/emu/obj/common/rung.o: $(RUNG_LINES)
$(BUILD)/obj/common/rung.o: CXXFLAGS += -I$(BUILD)/gen
$(BUILD)/emu/obj/common/rung.o: EMU_CXXFLAGS += -I$(BUILD)/gen

$(LIB): $(COMMON_OBJ) $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/bin/%: $(BUILD)/obj/%/train.o $(LIB) $(LINK_EXTRA)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $< $(LIB) $(LINK_EXTRA) $(LDLIBS) -o $@

$(BUILD)/bin/%: $(BUILD)/obj/tools/%.o $(LIB) $(LINK_EXTRA)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $< $(LIB) $(LINK_EXTRA) $(LDLIBS) -o $@

$(BUILD)/bin/zero_estimate: $(BUILD)/obj/tools/zero_estimate.o $(BUILD)/obj/tools/zero_quiz.o $(LIB) $(LINK_EXTRA)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $(filter-out $(LIB) $(LINK_EXTRA),$^) $(LIB) $(LINK_EXTRA) $(LDLIBS) -lsodium -o $@

# dev/bench/: the benches (make bench-adam, make bench). A static pattern rule, so a build folder
# from before they moved out of tools/ (its dependency files name tools/bench_*.cpp) still builds.
BENCH_BINS := $(patsubst dev/bench/%.cpp,$(BUILD)/bin/%,$(wildcard dev/bench/*.cpp))
$(BENCH_BINS): $(BUILD)/bin/%: $(BUILD)/obj/dev/bench/%.o $(LIB) $(LINK_EXTRA)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $< $(LIB) $(LINK_EXTRA) $(LDLIBS) -o $@

# inference/: one more rung beside the stages (generate: KV cache, batching, weight placement)
$(BUILD)/bin/%: $(BUILD)/obj/inference/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@

# the tests include their shared pieces by name ("harness.h"): tests/lib/. They are compiled at -O0:
# what they check runs in the library and the trainers (built at -O3), and a first `make test`
# compiles the suites in about a third of the time -O3 takes (test_kernels: 8.7 CPU-s at -O1, 5.0 at -O0).
TEST_CXXFLAGS := $(filter-out -O3,$(CXXFLAGS)) -O0 -Itests/lib
$(BUILD)/obj/tests/%.o: CXXFLAGS := $(TEST_CXXFLAGS)
# The test programs' objects start from a precompiled header (tests/lib/precompiled.h: GoogleTest,
# the harness, the library headers most of them include), compiled once with their flags, instead
# of parsing them again for each test (the 35 test objects: 80 -> 61 CPU-s; test_ddp 2.1 -> 1.1).
# The same code either way (each object's functions compared). The copy in $(BUILD) keeps the .gch
# beside the header GCC is told to include; it is compiled with the tests' flags spelled out (a
# prerequisite would otherwise inherit the object's, -include of itself among them).
TEST_OBJ   := $(TEST_SRC:%.cpp=$(BUILD)/obj/%.o) $(BUILD)/obj/tests/lib/gtest_mpi_main.o
TEST_PCH   := $(BUILD)/obj/tests/lib/precompiled.h
$(TEST_PCH): tests/lib/precompiled.h
	@mkdir -p $(dir $@)
	cp $< $@
$(TEST_PCH).gch: $(TEST_PCH) $(CONFIG_FILE)
	$(CXX) $(TEST_CXXFLAGS) -x c++-header -c $< -o $@
$(TEST_OBJ): $(TEST_PCH).gch
$(TEST_OBJ): CXXFLAGS += -include $(TEST_PCH) -Winvalid-pch
# The deliberately broken trainers (tests/*/*.mk) too: each is a trainer file, or one library file,
# with a line changed, run on tiny models. -O0 changes no bit of what they compute (-ffp-contract=off:
# no fused multiply-add at any level, and no level reorders a floating-point sum) and about halves
# their compile time; the exercise grader builds the learners' trainers the same way.
# Their objects start from a precompiled header as the test programs' do (tests/lib/mutant_precompiled.h:
# the Trainer's headers; 58 objects, about 0.9 -> 0.3 CPU-s each, the same instructions).
MUTANT_CXXFLAGS := $(filter-out -O3,$(CXXFLAGS)) -O0
$(MUTANT_PCH): tests/lib/mutant_precompiled.h
	@mkdir -p $(dir $@)
	cp $< $@
$(MUTANT_GCH): $(MUTANT_PCH) $(CONFIG_FILE)
	$(CXX) $(MUTANT_CXXFLAGS) -x c++-header -c $< -o $@
$(BUILD)/obj/mutants/%.o: CXXFLAGS := $(MUTANT_CXXFLAGS) -include $(MUTANT_PCH) -Winvalid-pch
define test_program
$(BUILD)/tests/$(basename $(notdir $(1))): $(BUILD)/obj/$(1:.cpp=.o) $(BUILD)/obj/tests/lib/gtest_mpi_main.o $(LIB) $(LINK_EXTRA)
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(LDFLAGS) $$^ -lgtest $$(LDLIBS) -o $$@
endef
$(foreach t,$(TEST_SRC),$(eval $(call test_program,$(t))))

# ---- the two commands of the README ----
# They build with one job per core: a first build from a clone is minutes of compiling.
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
deps:
	@bash scripts/install_deps.sh

# run and plots build only the programs (not the tests, the broken trainers or the emulator)
run: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@bash scripts/tour.sh

# the explorer's compiler and browser too: its browser test is a suite (tests/tools/explorer_check.sh)
test:
	@bash scripts/install_deps.sh --explorer
	@$(MAKE) --no-print-directory -j$(JOBS) all tests
	@bash tests/run_all.sh

bench-adam: all
	@bash scripts/bench_adam.sh

# CPU speed: tokens/s and GFLOP/s on two model shapes (1M and 11M parameters), by op, against the BLAS (and PyTorch
# where it imports)
bench: all
	@bash scripts/bench.sh

# Muon against AdamW on small: final validation loss over seeds, paired by seed (docs/muon.md; minutes,
# not part of make test). SEEDS=4 STEPS=300 by default.
muon-study: all
	@bash scripts/muon_study.sh $(SEEDS) $(STEPS)

# inference: tokens/s against B for each weight placement (sharded on 2 ranks), ms per byte with and
# without the KV cache, bytes moved per token (inference/generate.cpp --bench)
bench-inference: all
	@$(BUILD)/bin/generate --preset small --bench --length 32
	@mpirun -np 2 $(BUILD)/bin/generate --preset small --bench --length 32

plots: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@.venv/bin/python scripts/plots.py --out runs/plots

# Jupyter on the notebooks, for a workshop (scripts/notebooks.sh: installs it into .venv the first time,
# then serves until Ctrl-C, printing the URL; NOTEBOOK_IP=0.0.0.0 in a container). Not part of make test.
notebooks: deps
	@$(MAKE) --no-print-directory all
	@bash scripts/notebooks.sh

# ---- the explorer (docs/explorer.md): zero_estimate compiled to WebAssembly, in a static page ----
# $(BUILD)/explorer/ holds the whole page (index.html, its script and style, and zero_estimate.js with the
# WebAssembly inside it, so that it opens from disk too); `make explore` builds it and serves it. The
# compiler is Debian's emscripten (scripts/install_deps.sh --explorer installs it); its tools run on
# Node, whose Debian modules (acorn) are looked for in /usr/share/nodejs whichever Node is first on PATH.
EMXX          ?= em++
HAVE_EMXX     := $(shell command -v $(EMXX) 2>/dev/null)
EXPLORER      := $(BUILD)/explorer
# What zero_estimate links, less what it never calls in a page (MPI: tools/explorer/wasm/mpi_stub.h, copied
# under the name the code includes, <mpi.h>, into $(EXPLORER)/include). cli.cpp is
# there for parse_bytes (--fit); its trainer flags, whose limits shift a 32-bit long here, are never parsed.
EXPLORER_CPP  := tools/zero_estimate.cpp tools/zero_quiz.cpp common/zero_formulas.cpp common/layout.cpp \
                 pipeline/pipeline.cpp pipeline/formulas.cpp zeropp/formulas.cpp common/muon_formulas.cpp \
                 tensor/formulas.cpp tensor/tensor.cpp ulysses/formulas.cpp \
                 common/ledger.cpp common/runtime/check.cpp common/input/cli.cpp \
                 common/runtime/json.cpp common/runtime/device.cpp common/kernels/quantize.cpp
EXPLORER_PAGE := $(addprefix $(EXPLORER)/,index.html explorer.js quiz.js explorer.css)
$(EXPLORER)/zero_estimate.js: $(EXPLORER_CPP) $(wildcard common/*.h common/*/*.h tools/*.h pipeline/*.h zeropp/*.h tensor/*.h ulysses/*.h) $(EXPLORER)/include/mpi.h
	@mkdir -p $(dir $@)
	NODE_PATH=/usr/share/nodejs $(EMXX) -std=c++17 -O2 -ffp-contract=off -Wall -Wno-shift-count-overflow -I$(EXPLORER)/include -Icommon -I. \
	  $(EXPLORER_CPP) -sSINGLE_FILE=1 -sMODULARIZE=1 -sEXPORT_NAME=createZeroEstimate -sINVOKE_RUN=0 \
	  -sEXPORTED_RUNTIME_METHODS=callMain,FS -sALLOW_MEMORY_GROWTH=1 -o $@
$(EXPLORER)/include/mpi.h: tools/explorer/wasm/mpi_stub.h
	@mkdir -p $(dir $@)
	cp $< $@
$(EXPLORER)/%: tools/explorer/%
	@mkdir -p $(dir $@)
	cp $< $@
explorer: $(EXPLORER)/zero_estimate.js $(EXPLORER_PAGE)
# `make tests` builds the page where em++ is installed (make test's install step installs it);
# without it the explorer's check says SKIP. (Here, after HAVE_EMXX is set: a prerequisite list is
# expanded when its rule is read.)
ifneq ($(HAVE_EMXX),)
tests: explorer
endif

# EXPLORE_IP=0.0.0.0 in a container, EXPLORE_PORT= another port (scripts/explore.sh)
explore:
	@bash scripts/install_deps.sh --explore
	@$(MAKE) --no-print-directory explorer
	@bash scripts/explore.sh $(EXPLORER)

# ---- exercises (scripts/exercises.py): regions of the real files for a learner to write ----
exercise:
	@python3 scripts/exercises.py make $(E)

check: deps
	@$(MAKE) --no-print-directory -s $(STAGE_BINS)
	@python3 scripts/exercises.py check $(E) $(if $(HINT),--hint $(HINT))

# for instructors: the student edition, every code exercise's region cut, into a new or empty OUT
# (docs/exercises.md, "The student edition"); and the hidden grading of a folder of submissions
student-pack: all
	@python3 scripts/exercises.py pack "$(OUT)" $(if $(E),--only "$(E)")

grade: all
	@python3 scripts/exercises.py grade "$(SUBMISSIONS)" $(if $(OUT),--out "$(OUT)") $(if $(E),--only "$(E)") $(if $(filter 0,$(HINTS)),--no-hints) $(if $(SIGNING_KEY),--signing-key "$(SIGNING_KEY)")

# for instructors: the answers to the find-the-bug exercises (kept encoded in scripts/exercise_bugs.dat)
exercise-key:
	@python3 scripts/exercises.py key $(E)

# for instructors: the course's Ed25519 key pair for the quiz's certificates, made once
# (docs/certificates.md); KEYS=DIR another folder. An existing key is never overwritten.
KEYS ?= $(HOME)/.nanozero-course
.PHONY: course-keys
course-keys: $(BUILD)/bin/zero_estimate
	@$(BUILD)/bin/zero_estimate --course-keys $(KEYS)

# what scripts/exercises.py compiles a learner's file with
print-build-flags:
	@echo "CXX=$(CXX)"; echo "CXXFLAGS=$(CXXFLAGS)"; echo "LDFLAGS=$(LDFLAGS)"; echo "LDLIBS=$(LDLIBS)"; echo "LIB=$(LIB)"

diff:
	@test -n "$(A)" -a -n "$(B)" || { echo "usage: make diff A=stage1 B=stage2"; exit 2; }
	@bash scripts/lesson_diff.sh $(A) $(B)

clean:
	rm -rf $(BUILD)

# ---- the GPU bundle: built here (no GPU needed), run there with bash build/gpu-bundle/gpu_check.sh ----
# Objects in $(BUILD)/gpu-bundle-build (sm_90 only, for the H100/H200 the check is sized for: set
# CUDA_ARCH to change it), then dev/gpu_bundle/gpu_bundle.sh gathers them, the MPI launcher and the
# libraries they need into $(BUILD)/gpu-bundle and checks that every binary resolves there. DNNL=0:
# oneDNN (40 MB) serves only the CPU's bf16 products, which a GPU run does not use.
BUNDLE_BUILD := $(BUILD)/gpu-bundle-build
BUNDLE_ARCH  ?= 90
BUNDLE_TESTS := test_cuda_kernels test_cuda_comm test_cuda_stages test_cuda_inference test_cuda_quantize
BUNDLE_BINS  := $(foreach s,$(STAGES) pipeline ulysses tensor,$(if $(wildcard $(s)/train.cpp),$(BUNDLE_BUILD)/bin/$(s))) \
                $(addprefix $(BUNDLE_BUILD)/tests/,$(BUNDLE_TESTS))
gpu-bundle:
	@test "$(CUDA)" = 1 || { echo "make gpu-bundle: nvcc not found (CUDA=0); expected the CUDA toolkit on PATH: install it or set NVCC"; exit 2; }
	@$(MAKE) --no-print-directory BUILD=$(BUNDLE_BUILD) NZ_BUNDLE=1 DNNL=0 HOST_ARCH=x86-64-v3 CUDA_ARCH="$(BUNDLE_ARCH)" $(BUNDLE_BINS)
	@bash dev/gpu_bundle/gpu_bundle.sh $(BUNDLE_BUILD) $(BUILD)/gpu-bundle
# The bundle's dress rehearsal (by hand before a GPU slot, 15-20 minutes the first time; not in make
# test): the real bundle, copied, run under the GPU machine's conditions, and the speed rows' golden
# losses computed (dev/gpu_bundle/rehearsal.sh, docs/gpu.md).
gpu-rehearsal:
	@bash dev/gpu_bundle/rehearsal.sh

# ---- 64-bit ARM, from this x86-64 machine: a cross-build and a smoke test under QEMU (docs/cpus.md, "64-bit ARM") ----
# Its own builds and the arm64 Debian root it builds against are in build/arm64-check; not part of
# make test (it takes many minutes more).
arm64-check:
	@bash scripts/arm64_check.sh

# ---- Slurm on this machine (docs/cluster.md): a private one-node cluster runs scripts/slurm/nanozero.sbatch
# against mpirun -np 4 and requeues a job mid-run (tests/cluster/slurm_cluster.sh; as root, installs Slurm and
# munge where missing; about 100 s on 2 cores; not part of make test, which checks the batch scripts' dry runs).
.PHONY: slurm-check
# Not root: the check's one SKIP line, nothing built.
slurm-check:
	@[ "$$(id -u)" != 0 ] || $(MAKE) --no-print-directory -j$(JOBS) $(BUILD)/bin/stage0_ddp $(BUILD)/bin/stage3
	@bash tests/cluster/slurm_cluster.sh

# ---- a new user's first contact: make run and make test on a pristine Debian 12 root (mmdebstrap, as
# root; not part of make test: it takes them both, plus the root). Run it before a stop when the install
# step, the Makefile or a test's environment changed.
pristine-check:
	@bash scripts/pristine_check.sh

# ---- past one machine: two nodes on this one (network namespaces joined by a veth pair, as root), every
# rung's run across them against its one-node run, and the bytes that crossed (docs/cluster.md). Not part
# of make test: it runs every rung twice and MPI's TCP teardown can take 20 s per run.
two-nodes: all
	@bash scripts/two_nodes.sh $(if $(RATE),--rate $(RATE))

# keep intermediate objects (train.o) between builds
.SECONDARY:

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
