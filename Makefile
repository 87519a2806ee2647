# `make demo` and `make test` create .venv on first use.
PY := .venv/bin/python
VENV_STAMP := .venv/.installed
WORKDIR ?= workdir/demo

.PHONY: demo test bench clean

$(VENV_STAMP): setup.py
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# rapidocr pulls opencv-python-headless, whose cv2 would shadow the contrib build (SIFT, dnn_superres).
	$(PY) -m pip install -q --force-reinstall --no-deps opencv-contrib-python-headless==5.0.0.93
	touch $(VENV_STAMP)

demo: $(VENV_STAMP)
	$(PY) -m osvl_jax.demo --workdir=$(WORKDIR)

# The test files on 2 xdist workers, the heaviest folders first (tests/conftest.py): the multi-process jobs of
# tests/distributed run while the workers are small (late, beside two ~8 GB workers, they exceeded a 24 GB machine).
# The tests compile many small programs and run each briefly (compiling is ~80% of a sharded test's time): XLA's
# CPU backend at optimization level 0 compiles them ~35% faster, and its older elemental emitters instead of the
# MLIR fusion emitters another ~35% (measured on tests/models/test_scan_layers.py and on test_sharded_step.py +
# test_sharding.py: 258 s -> 166 s; every tolerance is independent of code generation). A persistent
# compilation cache, fresh for each run, is shared by the workers and the servers they start (tests/distributed's
# jobs run without it).
TEST_XLA_FLAGS := --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 \
                  --xla_cpu_use_fusion_emitters=false
test: $(VENV_STAMP)
	cache=$$(mktemp -d) && trap 'rm -rf "$$cache"' EXIT && \
	JAX_COMPILATION_CACHE_DIR=$$cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0.2 XLA_FLAGS="$(TEST_XLA_FLAGS)" \
	    $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests

clean:
	rm -rf workdir .pytest_cache
