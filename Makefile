# The engine's one Makefile (llm.c style: plain, no generator).
#
#   make              the library and the programs, into build/
#   make test         every CPU + meta GoogleTest test (what CI runs), in one shard per core at once
#                     (tools/run_tests.sh; TEST_SHARDS=1: one process); with nvcc, also compiles the CUDA tests;
#                     then builds the example applications against an installed copy and runs them
#   make install      the library, its headers and a pkg-config file under PREFIX (models/api.h: the public header)
#   make test-cuda    the CUDA tests (GPU machine)
#   make check-ptxas  fails when ptxas reports a "Potential Performance Loss" in any kernel file (make test runs it
#                     with nvcc; each .cu's compiler messages are kept beside its object, build/**/*.cu.o.log)
#   make test-sanitize the cpu suite under AddressSanitizer + UBSan (build-sanitize/)
#   make fuzz         libFuzzer over every input reader (clang, build-fuzz/)
#   make format       clang-format over the lines changed since main, and new files (.clang-format)
#   make run          the main job (see README.md)
#   make deps         installs missing build dependencies when run as root (Debian), else says how
#
# CUDA sources (engine/cuda/*.cpp, ops/cuda/*.cu, tests/**/*_cuda_test.cpp) are built when nvcc is found;
# CUDA=0 forces them off.

CXX      ?= g++
NVCC     ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA     ?= $(if $(NVCC),1,0)
BUILD    ?= build
OPT      ?= -O2
# Debug information: line tables only (file:line in backtraces, gdb's `bt`, sanitizer reports, perf); DEBUG=-g adds
# the variables and types for gdb, at about a third more C++ compile time (measured on the 2-core CI machine).
DEBUG    ?= -g1
EIGEN_INC ?= /usr/include/eigen3

# EXTRA_FLAGS: instrumentation for every compile and link (make test-sanitize and make fuzz set it).
EXTRA_FLAGS ?=
CXXFLAGS := -std=c++17 $(OPT) $(DEBUG) -Wall -Wextra -Wno-unused-parameter -fopenmp -I. -I$(EIGEN_INC) -MMD -MP $(EXTRA_FLAGS)
LDFLAGS  := -fopenmp $(EXTRA_FLAGS)
# libjpeg-turbo, libpng and zlib (the vision data sets' decoders: models/data/image_io.*) are linked statically,
# so the programs also run on machines without those shared libraries (the GPU machine).
LDLIBS   := -lpthread -Wl,-Bstatic -ljpeg -lpng16 -lz -Wl,-Bdynamic

ifeq ($(CUDA),1)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# ENGINE_CUDA is defined once engine/cuda/ exists (the cuda device); until then nvcc only builds ops/cuda.
CUDA_DEVICE := $(wildcard engine/cuda/cuda_device.cpp)
CXXFLAGS  += $(if $(CUDA_DEVICE),-DENGINE_CUDA) -I$(CUDA_HOME)/include
# The project's GPU is an H200 (sm_90): one target keeps `make test` (which compiles every kernel, to catch CUDA
# compile errors in CI) well under its time budget. 90a is sm_90 with Hopper's own instructions (wgmma), machine
# code for compute capability 9.0 only (as plain 90 was); it defines ENGINE_WGMMA, which lets the convolutions choose
# their wgmma kernels there (ops/cuda/wgmma.cuh). CUDA_ARCHS="90a 80 75" adds Ampere and Turing binaries; "90"
# builds without the wgmma kernels (the mma.sync ones run instead).
CUDA_ARCHS ?= 90a
WGMMA_DEF := $(if $(filter 90a,$(CUDA_ARCHS)),-DENGINE_WGMMA)
CXXFLAGS  += $(WGMMA_DEF)
NVCCFLAGS := -std=c++17 -O3 -I. -DENGINE_CUDA -MMD -MP --expt-relaxed-constexpr -Xcompiler -fopenmp \
             $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
             $(WGMMA_DEF)
LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lcublas
endif

# ---- sources --------------------------------------------------------------------------------------
LIB_CPP  := $(wildcard engine/*.cpp graph/*.cpp ops/*.cpp ops/cpu/*.cpp models/*.cpp models/nn/*.cpp \
                       models/*/*.cpp)
ifeq ($(CUDA),1)
LIB_CPP  += $(wildcard engine/cuda/*.cpp)
LIB_CU   := $(wildcard ops/cuda/*.cu)
endif
LIB_OBJ  := $(LIB_CPP:%.cpp=$(BUILD)/%.o) $(LIB_CU:%.cu=$(BUILD)/%.cu.o)
# A thin archive: it refers to the objects by path, so ops/attention.o and models/nn/attention.o coexist.
LIB      := $(BUILD)/libengine.a

# cpu ranks' collectives: Gloo, in a plugin the engine loads when a cpu world has several ranks (engine/dist.h), so
# that no program depends on libgloo (and its hiredis and ibverbs) otherwise.
GLOO_PLUGIN := $(BUILD)/libengine_gloo.so

TOOLS    := $(patsubst tools/%.cpp,$(BUILD)/%,$(wildcard tools/engine_*.cpp))
TOOL_LIB_CPP := $(filter-out tools/engine_%.cpp,$(wildcard tools/*.cpp))
# Data the programs carry inside them, so that they read nothing outside the binary: the 2020 study's table
# tools/data/lambda2020.csv becomes the C string tools::kStudy2020Csv in $(BUILD)/gen/lambda2020_csv.cpp.
TOOL_LIB_OBJ := $(TOOL_LIB_CPP:%.cpp=$(BUILD)/%.o) $(BUILD)/gen/lambda2020_csv.o

TEST_CPP      := $(filter-out %_cuda_test.cpp tests/util/cuda% tests/fuzz/%,$(wildcard tests/*.cpp tests/*/*.cpp))
TEST_OBJ      := $(TEST_CPP:%.cpp=$(BUILD)/%.o)
CUDA_TEST_CPP := $(wildcard tests/*/*_cuda_test.cpp) tests/test_main.cpp $(wildcard tests/*/*_util.cpp)
CUDA_TEST_OBJ := $(CUDA_TEST_CPP:%.cpp=$(BUILD)/%.o)
GTEST_LIBS    := -lgtest -lpthread

.PHONY: all test test-cuda check-ptxas test-sanitize fuzz format run deps clean install examples
.SECONDARY:
# Build in parallel on every core unless the caller gave -j (use -j1 for readable errors).
ifeq ($(filter -j%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(shell nproc)
endif
all: deps $(LIB) $(TOOLS) $(GLOO_PLUGIN)

# ---- dependencies ---------------------------------------------------------------------------------
# Installs what is missing when run as root on Debian/Ubuntu; otherwise stops with the exact command.
deps:
	@missing=""; \
	[ -f $(EIGEN_INC)/Eigen/Dense ] || missing="$$missing libeigen3-dev"; \
	[ -f /usr/include/gtest/gtest.h ] || missing="$$missing libgtest-dev"; \
	[ -f /usr/include/jpeglib.h ] || missing="$$missing libjpeg62-turbo-dev"; \
	[ -f /usr/include/png.h ] || missing="$$missing libpng-dev"; \
	[ -f /usr/include/zlib.h ] || missing="$$missing zlib1g-dev"; \
	[ -f /usr/include/gloo/allreduce.h ] || missing="$$missing libgloo-dev"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing:$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) || exit 1; \
	  else \
	    echo "missing build dependencies:$$missing. Install them with: sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi

# ---- build rules ----------------------------------------------------------------------------------
$(BUILD)/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/gen/lambda2020_csv.cpp: tools/data/lambda2020.csv
	@mkdir -p $(dir $@)
	@grep -q ')csv"' $< && { echo "$<: the text )csv\" would end the embedded string"; exit 1; } || true
	{ echo '// Generated by the Makefile from $<; do not edit.'; \
	  echo 'namespace tools { extern const char kStudy2020Csv[] = R"csv('; cat $<; echo ')csv"; }'; } > $@

$(BUILD)/gen/%.o: $(BUILD)/gen/%.cpp
	$(CXX) $(CXXFLAGS) -c $< -o $@

# The compiler's messages are shown and kept in $@.log for make check-ptxas.
$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@ 2> $@.log; rc=$$?; cat $@.log >&2; exit $$rc

$(GLOO_PLUGIN): engine/gloo/gloo_communicator.cpp | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -fPIC -shared $< -o $@ -lgloo

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcsTP $@ $^

$(BUILD)/engine_%: $(BUILD)/tools/engine_%.o $(TOOL_LIB_OBJ) $(LIB)
	$(CXX) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/engine_tests: $(TEST_OBJ) $(TOOL_LIB_OBJ) $(LIB)
	$(CXX) $(LDFLAGS) $^ -o $@ $(GTEST_LIBS) $(LDLIBS)

$(BUILD)/engine_cuda_tests: $(CUDA_TEST_OBJ) $(TOOL_LIB_OBJ) $(LIB)
	$(CXX) $(LDFLAGS) $^ -o $@ $(GTEST_LIBS) $(LDLIBS)

# ---- the library for applications -----------------------------------------------------------------
# make install [PREFIX=/usr/local]: the library as a regular archive (every object, duplicate names kept:
# ops/attention.o and models/nn/attention.o), every header of engine/ graph/ ops/ models/ under
# PREFIX/include/engine (their include paths unchanged), and PREFIX/lib/pkgconfig/engine.pc. The public header
# is models/api.h; an application builds with `g++ app.cpp $(pkg-config --cflags --libs engine)`.
PREFIX ?= /usr/local
LIB_HEADERS := $(wildcard engine/*.h engine/cuda/*.h graph/*.h ops/*.h ops/cpu/*.h ops/cuda/*.h models/*.h \
                          models/*/*.h)
PC_CFLAGS := -std=c++17 -fopenmp -I$${includedir} -I$(EIGEN_INC)$(if $(filter 1,$(CUDA)),$(if $(CUDA_DEVICE), \
             -DENGINE_CUDA) -I$(CUDA_HOME)/include)
install: $(LIB) $(GLOO_PLUGIN)
	@test -n "$(PREFIX)" || { echo "make install: PREFIX is empty"; exit 1; }
	mkdir -p $(PREFIX)/lib/pkgconfig $(PREFIX)/include/engine
	cp $(GLOO_PLUGIN) $(PREFIX)/lib/libengine_gloo.so.tmp && mv $(PREFIX)/lib/libengine_gloo.so.tmp $(PREFIX)/lib/libengine_gloo.so
	rm -f $(PREFIX)/lib/libengine.a.tmp && ar qc $(PREFIX)/lib/libengine.a.tmp $(LIB_OBJ) && \
	  ranlib $(PREFIX)/lib/libengine.a.tmp && mv $(PREFIX)/lib/libengine.a.tmp $(PREFIX)/lib/libengine.a
	for h in $(LIB_HEADERS); do mkdir -p $(PREFIX)/include/engine/$$(dirname $$h) && \
	  cp $$h $(PREFIX)/include/engine/$$h || exit 1; done
	{ echo 'prefix=$(abspath $(PREFIX))'; echo 'libdir=$${prefix}/lib'; echo 'includedir=$${prefix}/include/engine'; \
	  echo; echo 'Name: engine'; \
	  echo 'Description: a C++/CUDA training engine with exact memory accounting (public header: models/api.h)'; \
	  echo 'Version: 0.1'; echo 'Cflags: $(PC_CFLAGS)'; \
	  echo 'Libs: -L$${libdir} -lengine $(LDFLAGS) $(LDLIBS)'; } > $(PREFIX)/lib/pkgconfig/engine.pc.tmp && \
	  mv $(PREFIX)/lib/pkgconfig/engine.pc.tmp $(PREFIX)/lib/pkgconfig/engine.pc

# The example applications (tools/examples/*.cpp), built as a user would: against a copy installed under
# $(BUILD)/install, with pkg-config's flags only (no -I. into the tree).
EXAMPLES := $(patsubst tools/examples/%.cpp,$(BUILD)/examples/%,$(wildcard tools/examples/*.cpp))
$(BUILD)/install/lib/libengine.a: $(LIB) $(LIB_HEADERS)
	$(MAKE) --no-print-directory install PREFIX=$(BUILD)/install
$(BUILD)/examples/%: tools/examples/%.cpp $(BUILD)/install/lib/libengine.a
	@mkdir -p $(dir $@)
	$(CXX) $< -o $@ $$(PKG_CONFIG_PATH=$(BUILD)/install/lib/pkgconfig pkg-config --cflags --libs engine)
examples: $(EXAMPLES)
	@for e in $(EXAMPLES); do echo "== $$e"; $$e || exit 1; done

# ---- programs -------------------------------------------------------------------------------------
# With nvcc present, `make test` also builds (without running) the CUDA tests, so that CI compiles every CUDA
# source, the tests included. It also builds and runs the example applications against an installed copy.
test: deps $(BUILD)/engine_tests $(TOOLS) $(GLOO_PLUGIN) $(if $(filter 1,$(CUDA)),$(BUILD)/engine_cuda_tests check-ptxas)
	tools/run_tests.sh $(BUILD)/engine_tests $(TEST_ARGS)
	$(MAKE) --no-print-directory examples

# ptxas's "Potential Performance Loss" advisories are silent speed bugs: C7513 (wgmma serialized because a register
# it reads is written inside its pipeline stage) cost the overlapped flash forward its whole overlap for a session.
# Each kernel file's messages are in its object's .log (the rule above); this fails on any such advisory.
CUDA_OBJ := $(LIB_CU:%.cu=$(BUILD)/%.cu.o)
check-ptxas: $(CUDA_OBJ)
	@bad=0; for o in $(CUDA_OBJ); do \
	  n=$$(grep -c "Potential Performance Loss" $$o.log 2>/dev/null); \
	  if [ "$${n:-0}" -gt 0 ]; then bad=1; \
	    echo "$${o#$(BUILD)/}: ptxas reports a performance loss in $$n kernel(s) ($$o.log):"; \
	    grep -m 2 "Potential Performance Loss" $$o.log; fi; \
	done; \
	[ $$bad = 0 ] || echo "fix the kernels above (a register a wgmma reads must not be written before its wait)"; \
	exit $$bad

# engine_train too: the multi-GPU tests (tests/tools/data_parallel_cuda_test.cpp) run it.
test-cuda: deps $(BUILD)/engine_cuda_tests $(BUILD)/engine_train
	$(BUILD)/engine_cuda_tests $(TEST_ARGS)

# The cpu suite built with AddressSanitizer + UBSan (CUDA off) in build-sanitize/, the programs too (the
# program-level tests run the ones beside the test binary). Any report fails the run.
# The meta-only sweeps of every model x precision (max-batch steady state, the README's table) take 25 of the
# run's minutes under the sanitizers and read no input; SANITIZE_TEST_ARGS= runs them too.
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
SANITIZE_TEST_ARGS ?= --gtest_filter=-*SteadyState*:Docs.*
test-sanitize: deps
	$(MAKE) BUILD=build-sanitize CUDA=0 OPT=-O1 EXTRA_FLAGS="$(SANITIZE_FLAGS)" \
	  build-sanitize/engine_tests build-sanitize/engine_train build-sanitize/engine_bench build-sanitize/libengine_gloo.so
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 OMP_NUM_THREADS=1 \
	  build-sanitize/engine_tests $(SANITIZE_TEST_ARGS)

# libFuzzer over every reader (tests/fuzz/fuzz_readers.cpp), FUZZ_SECONDS each, built with clang in
# build-fuzz/; FUZZ_FORMATS picks some (the names of tests/util/hostile_util.h).
FUZZ_CXX     ?= clang++
FUZZ_SECONDS ?= 60
FUZZ_FORMATS ?= checkpoint batch_file squad_json glue_tsv token_file vocab jpeg png coco_json byte_data
fuzz:
	@command -v $(FUZZ_CXX) >/dev/null || { echo "make fuzz needs $(FUZZ_CXX) (Debian: apt-get install clang libomp-dev)"; exit 1; }
	$(MAKE) BUILD=build-fuzz CUDA=0 CXX=$(FUZZ_CXX) OPT=-O1 EXTRA_FLAGS="-fsanitize=fuzzer-no-link,address,undefined" \
	  build-fuzz/fuzz_readers
	for f in $(FUZZ_FORMATS); do \
	  echo "== fuzzing $$f for $(FUZZ_SECONDS) s"; \
	  FUZZ_FORMAT=$$f build-fuzz/fuzz_readers -max_total_time=$(FUZZ_SECONDS) -max_len=1048576 build-fuzz/corpus_$$f || exit 1; \
	done

$(BUILD)/fuzz_readers: $(BUILD)/tests/fuzz/fuzz_readers.o $(BUILD)/tests/util/hostile_util.o $(TOOL_LIB_OBJ) $(LIB)
	$(CXX) $(LDFLAGS) -fsanitize=fuzzer $^ -o $@ $(LDLIBS)

# clang-format (.clang-format: the house style) over the lines of C++ and CUDA files changed since main
# (git clang-format: older code that predates the style is left as it is, so a change's diff stays its own), and
# over new files whole.
format:
	@command -v clang-format >/dev/null && command -v git-clang-format >/dev/null || { echo "make format needs clang-format and git-clang-format (Debian: apt-get install clang-format)"; exit 1; }
	@patch=$$(mktemp); git clang-format --diff main -- '*.cpp' '*.h' '*.cu' '*.cuh' > $$patch; \
	  if grep -q '^diff --git' $$patch; then git apply $$patch && grep '^diff --git' $$patch | sed 's|.* b/|clang-format (changed lines) |'; fi; \
	  rm -f $$patch
	@for f in $$(git ls-files --others --exclude-standard -- '*.cpp' '*.h' '*.cu' '*.cuh'); do \
	  echo "clang-format $$f" && clang-format -i "$$f"; done; true

run: all
	tools/run_main_job.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-sanitize build-fuzz

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
