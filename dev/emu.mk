# dev/emu.mk — the CUDA backend built against nz_emu (dev/emu/), a CPU emulator of the CUDA
# subset the backend uses, so every CUDA kernel, the cuBLAS and NCCL call sites and the trainers'
# --device cuda paths run on a machine without a GPU (tests/cuda/emu_check.sh). Needs no CUDA toolkit.
#   make emu     ->  $(EMU)/bin/<stages> and pipeline, $(EMU)/tests/test_cuda_{kernels,comm,stages}, the
#                    emulator's self-test, the checks' catalogue (emu_catalogue, flash_mutant_*,
#                    stream_mutant_*)
#   make emu-check CU=file.cu [ARGS="..."]  one program built and run with every check on (below)
# The common/kernels/cuda/*.cu files (and *.cuh headers) are rewritten by dev/emu/cu2cpp.pl (launch syntax
# only) and compiled as C++ with dev/emu/include/ (cuda_runtime.h, cublas_v2.h, nccl.h) first on
# the include path.
EMU          := $(BUILD)/emu
# -O1, not the -O3 of the real build: the emulator's build is part of every `make test` and compiles
# about 2.7 times faster at -O1, while its runs are checks of correctness, not of speed.
EMU_OPT      ?= -O1
EMU_CXXFLAGS := $(filter-out -O3 -DNZ_HAVE_CUDA -DNZ_CUBLAS_DLOPEN -I$(CUDA_HOME)/include,$(CXXFLAGS)) \
                $(EMU_OPT) -DNZ_HAVE_CUDA -Idev/emu/include -Icommon/kernels/cuda -Wno-unknown-pragmas
EMU_GEN      := $(patsubst %.cu,$(EMU)/gen/%.cpp,$(wildcard common/kernels/cuda/*.cu inference/*.cu))
EMU_OBJ      := $(COMMON_SRC:%.cpp=$(EMU)/obj/%.o) $(EMU_GEN:$(EMU)/gen/%.cpp=$(EMU)/obj/gen/%.o) \
                $(EMU)/obj/dev/emu/emu.o $(EMU)/obj/dev/emu/check.o $(EMU)/obj/dev/emu/streams.o
EMU_LIB      := $(EMU)/libnanozero_emu.a
# the host libraries the common/ objects need: the BLAS, oneDNN when built with it (Makefile DNNL), and
# MPI where the compiler is not mpicxx (a cross-build: Makefile MPI_LIBS)
EMU_LIBS     := -lpthread $(BLAS_LIBS) $(DNNL_LIBS) $(MPI_LIBS)
# the ladder, the pipeline (test_cuda_stages runs it on both paths) and infinity (its slices' copies to
# and from the host, checked by the stream check: tests/cuda/emu_check.sh), ulysses (its all-to-alls
# on device memory) and tensor (its vocabulary kernels, the all-reduces of its tensor groups); zeropp
# runs on the CPU only (stages.txt)
EMU_STAGES   := $(foreach s,$(STAGES) pipeline infinity ulysses tensor,$(if $(wildcard $(s)/train.cpp),$(EMU)/bin/$(s)))
# Broken copies of the flash attention kernels (dev/emu/flash_mutants.pl), each linked into the kernel
# tests in place of the real ones: the catalogue of bugs the race check must catch.
EMU_MUTANTS  := dq_no_syncwarp early_prefetch q_no_barrier
EMU_MUTANT_TESTS := $(EMU_MUTANTS:%=$(EMU)/tests/flash_mutant_%)
# Trainers linked with a broken copy of the runtime's stream code (dev/emu/stream_mutants.pl), each with
# the trainer that shows it: the stream check's catalogue of the project's own patterns.
EMU_STREAM_MUTANTS := comm_no_wait:stage2 copy_no_wait:offload host_no_sync:offload
EMU_STREAM_MUTANT_BINS := $(foreach m,$(EMU_STREAM_MUTANTS),$(EMU)/tests/stream_mutant_$(firstword $(subst :, ,$(m))))
EMU_TESTS    := $(addprefix $(EMU)/tests/,$(basename $(notdir $(wildcard tests/cuda/test_cuda_*.cpp)))) \
                $(EMU)/tests/emu_selftest $(EMU)/tests/emu_catalogue $(EMU_MUTANT_TESTS) $(EMU_STREAM_MUTANT_BINS)

.PHONY: emu
emu: $(EMU_STAGES) $(EMU_TESTS)

$(EMU)/gen/%.cpp: %.cu dev/emu/cu2cpp.pl
	@mkdir -p $(dir $@)
	perl dev/emu/cu2cpp.pl $< >$@.tmp && mv $@.tmp $@

# A header may launch kernels too (column_sum.cuh): every common/kernels/cuda/*.cuh is rewritten the same way
# into the folder of the rewritten .cpp files, where their #include "x.cuh" finds it first.
EMU_GEN_CUH  := $(patsubst %.cuh,$(EMU)/gen/%.cuh,$(wildcard common/kernels/cuda/*.cuh))
$(EMU)/gen/%.cuh: %.cuh dev/emu/cu2cpp.pl
	@mkdir -p $(dir $@)
	perl dev/emu/cu2cpp.pl $< >$@.tmp && mv $@.tmp $@

# The kernels' translation units are compiled with GCC's thread-sanitizer instrumentation: a call
# before every load and store, which dev/emu/check.cpp answers (NZ_EMU_CHECK; the sanitizer's own
# library is not linked), and line tables (-g1) so that a finding names its source lines.
EMU_INSTRUMENT := -fsanitize=thread --param=tsan-instrument-func-entry-exit=0 -g1
# -ffp-contract=fast: a * b + c fused into one FMA where the CPU has one (GCC fuses in a pass that
# -O1 leaves out: -fexpensive-optimizations turns it on), as nvcc does in device code by default
# (--fmad=true; the real build's -ffp-contract=off reaches only the host compiler). So a kernel whose
# bits must equal the CPU's (AdamW and the gradient accumulation: offload runs them on the CPU) and
# that is not written with __fmul_rn/__fadd_rn fails here as on a GPU, instead of passing by luck.
EMU_KERNEL_FLAGS := -ffp-contract=fast -fexpensive-optimizations
$(EMU)/obj/gen/%.o: $(EMU)/gen/%.cpp $(EMU_GEN_CUH)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(EMU_KERNEL_FLAGS) $(EMU_INSTRUMENT) -c $< -o $@

$(EMU)/obj/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

# Where the real build has the CUDA backend too (CUDA=1: the same -DNZ_HAVE_CUDA), a library,
# trainer or test object that includes no header of the CUDA toolkit is the same code in both builds:
# the emulator's build takes the real build's object (the library's -O3, the tests' -O0: test code
# drives the kernels and compares, at any level the same bits) instead of compiling it again at -O1.
# The real object's dependency files say which (dev/emu/uses_toolkit.sh: a header under CUDA_HOME, or
# a file of the project that includes one the emulator stands in for), and that one is compiled here.
# A test object's are its own and the precompiled header's, which it is compiled with (Makefile TEST_PCH).
ifeq ($(CUDA),1)
EMU_SHARED   := $(COMMON_SRC:%.cpp=$(EMU)/obj/%.o) $(foreach s,$(STAGES) pipeline infinity ulysses tensor,$(EMU)/obj/$(s)/train.o) \
                $(patsubst %.cpp,$(EMU)/obj/%.o,$(wildcard tests/cuda/test_cuda_*.cpp tests/zeropp/test_cuda_*.cpp) \
                  tests/lib/gtest_mpi_main.cpp)
$(EMU_SHARED): $(EMU)/obj/%.o: %.cpp $(BUILD)/obj/%.o dev/emu/uses_toolkit.sh
	@mkdir -p $(dir $@)
	@rc=0; bash dev/emu/uses_toolkit.sh '$(CUDA_HOME)' $(BUILD)/obj/$*.d $(if $(filter tests/%,$*),$(TEST_PCH).d) || rc=$$?; \
	  case $$rc in 0) echo "$(CXX) $(EMU_CXXFLAGS) -c $< -o $@"; $(CXX) $(EMU_CXXFLAGS) -c $< -o $@;; \
	    1) cp $(BUILD)/obj/$*.o $@;; *) exit $$rc;; esac
endif

$(EMU_LIB): $(EMU_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(EMU)/bin/%: $(EMU)/obj/%/train.o $(EMU_LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $< $(EMU_LIB) $(EMU_LIBS) -o $@

$(EMU)/obj/tests/%.o: EMU_CXXFLAGS += -Itests/lib
$(EMU)/tests/%: $(EMU)/obj/tests/cuda/%.o $(EMU)/obj/tests/lib/gtest_mpi_main.o $(EMU_LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $^ -lgtest $(EMU_LIBS) -o $@

$(EMU)/tests/emu_selftest: $(EMU)/obj/gen/dev/emu/selftest.o $(EMU_LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $^ $(EMU_LIBS) -o $@

$(EMU)/tests/emu_catalogue: $(EMU)/obj/gen/tests/cuda/emu_catalogue.o $(EMU_LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $^ $(EMU_LIBS) -o $@

$(EMU)/gen/mutants/%/kernels_flash_attention.cpp: $(EMU)/gen/common/kernels/cuda/kernels_flash_attention.cpp \
    dev/emu/flash_mutants.pl
	@mkdir -p $(dir $@)
	perl dev/emu/flash_mutants.pl $* <$< >$@.tmp && mv $@.tmp $@
# the rewritten headers (.cuh) of the real kernels' folder, for the mutant's #include "x.cuh"
$(EMU)/obj/gen/mutants/%.o: EMU_CXXFLAGS += -iquote $(EMU)/gen/common/kernels/cuda
# the mutant's object before the library: the library's flash attention object is never pulled in
$(EMU)/tests/flash_mutant_%: $(EMU)/obj/tests/cuda/test_cuda_kernels.o $(EMU)/obj/tests/lib/gtest_mpi_main.o \
    $(EMU)/obj/gen/mutants/%/kernels_flash_attention.o $(EMU_LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) $^ -lgtest $(EMU_LIBS) -o $@

$(EMU)/gen/stream_mutants/%.cpp: $(EMU)/gen/common/kernels/cuda/comm_nccl.cpp $(EMU)/gen/common/kernels/cuda/runtime.cpp \
    dev/emu/stream_mutants.pl
	@mkdir -p $(dir $@)
	perl dev/emu/stream_mutants.pl $* $(EMU)/gen/common/kernels/cuda >$@.tmp && mv $@.tmp $@
$(EMU)/obj/gen/stream_mutants/%.o: EMU_CXXFLAGS += -iquote $(EMU)/gen/common/kernels/cuda
# the mutant's object before the library: the library's own copy of that file is never pulled in
define emu_stream_mutant
$(EMU)/tests/stream_mutant_$(1): $(EMU)/obj/$(2)/train.o $(EMU)/obj/gen/stream_mutants/$(1).o $(EMU_LIB)
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(LDFLAGS) $$^ $$(EMU_LIBS) -o $$@
endef
$(foreach m,$(EMU_STREAM_MUTANTS),$(eval $(call emu_stream_mutant,$(firstword $(subst :, ,$(m))),$(lastword $(subst :, ,$(m))))))

-include $(shell find $(EMU)/obj -name '*.d' 2>/dev/null)

# make emu-check CU=path/to/program.cu [ARGS="..."]: one CUDA program (kernels and a host main using
# the runtime API; no MPI needed) built against the emulator with every check on (NZ_EMU_CHECK=all)
# and run with ARGS (dev/emu/emu_check.sh). Each finding is a line "emu-check: KIND: ...", and the
# exit status is non-zero; a clean program exits with its own. CU and ARGS reach the script as raw
# text in the environment: nothing in them is expanded by make or the shell.
.PHONY: emu-check
ifneq ($(filter emu-check,$(MAKECMDGOALS)),)
ifeq ($(strip $(value CU)),)
$(error make emu-check: no program given (CU is empty); expected: make emu-check CU=path/to/program.cu [ARGS="arguments"])
else ifeq ($(wildcard $(value CU)),)
$(error make emu-check: $(value CU): no such file; expected: make emu-check CU=path/to/program.cu [ARGS="arguments"])
endif
endif
emu-check: export EMU_CHECK_CU = $(value CU)
emu-check: export EMU_CHECK_ARGS = $(value ARGS)
emu-check: $(EMU_LIB)
	@EMU_CXX='$(CXX)' EMU_FLAGS='$(EMU_CXXFLAGS) $(EMU_KERNEL_FLAGS) $(EMU_INSTRUMENT)' EMU_LINK='$(LDFLAGS)' EMU_LIB='$(EMU_LIB)' \
	  EMU_LIBS='$(EMU_LIBS)' bash dev/emu/emu_check.sh
