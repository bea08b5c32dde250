# The README's two commands: `make run` (set up + run the pipeline on the embedded default config)
# and `make test` (set up + run the whole test suite). Both are idempotent.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: megatron-core-src setup system system-test run test test-fast lint clean slurm-profile gpu-wheels

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# pin the CPU build of torch first so no multi-GB CUDA build is pulled in
	$(PY) -m pip install -q 'torch==2.13.0'
	$(PY) -m pip install -q -e '.[harness,sandbox,model,train,report,test]'
	touch $@

# swebench 5.x beside 4.x (same package name, so not in one venv): only its pure-Python modules, whose
# imports the venv already has; tests put this folder first on sys.path in a subprocess
$(VENV)/harness5/.installed: $(VENV)/.installed
	$(PY) -m pip install -q --no-deps --upgrade --target $(VENV)/harness5 'swebench==5.0.2'
	touch $@

# upstream's own grading test data for tests/unit/test_upstream_corpus.py: swebench 5.0.2's sdist ships its
# parser and grading tests (read as data, never imported by sweflow)
$(VENV)/upstream/.installed: $(VENV)/.installed
	rm -rf $(VENV)/upstream && mkdir -p $(VENV)/upstream
	$(PY) -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d $(VENV)/upstream 'swebench==5.0.2'
	tar -xzf $(VENV)/upstream/swebench-5.0.2.tar.gz -C $(VENV)/upstream swebench-5.0.2/tests
	touch $@

# verl (with Ray) only for the tests: the embedded default trains with the TRL engine
$(VENV)/.verl-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[harness,sandbox,model,train,report,test,verl]'
	touch $@

# megatron-core 0.16.1 (the old pin, from the package index) beside the venv for
# tests/unit/test_megatron_qwen35.py: it must refuse Qwen3.5's Gated DeltaNet at context parallel 4
$(VENV)/megatron-core-0.16.1/.installed: $(VENV)/.installed
	$(PY) -m pip install -q --no-deps --upgrade --target $(VENV)/megatron-core-0.16.1 'megatron-core==0.16.1'
	touch $@

# megatron-core releases the package index lacks (the 0.19.0 pin: release commit 5d4cf1d00bcc; 0.18.2),
# built from a Megatron-LM clone for the same test: make megatron-core-src MEGATRON_LM=~/src/Megatron-LM
MCORE_REFS ?= 5d4cf1d00bcc core_v0.18.2
megatron-core-src: setup
	bash .ci/megatron_core_src.sh $(VENV) '$(MEGATRON_LM)' $(MCORE_REFS)

setup: $(VENV)/.installed $(VENV)/harness5/.installed $(VENV)/upstream/.installed

system:
	bash .ci/system.sh

system-test:
	bash .ci/system.sh --test

run: setup system
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/snakemake --profile profiles/local

# The whole suite on $(JOBS) xdist workers (tests/conftest.py groups what shares a run); per-test durations
# go to the log and test-results/junit.xml. `make test-fast`: the unit tier without the slow tests.
# Three workers on 2 cores: the pipeline and Slurm tests spend much of their time waiting on jobs and
# sandboxes, and a third worker fills it (2 cores: 13 min 37 s against 15 min 35 s with two).
JOBS ?= 3
FAST_JOBS ?= 2
TEST_OUT ?= test-results
test: setup $(VENV)/.verl-installed $(VENV)/megatron-core-0.16.1/.installed system-test
	mkdir -p $(TEST_OUT)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/pytest -ra -n $(JOBS) --dist loadgroup --durations=40 \
		--junitxml=$(TEST_OUT)/junit.xml $(PYTEST_ARGS) tests

test-fast: setup $(VENV)/.verl-installed $(VENV)/megatron-core-0.16.1/.installed
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/pytest -q -n $(FAST_JOBS) -m "not slow and not integration" \
		--durations=15 $(PYTEST_ARGS) tests

# `snakemake --profile slurm` from the repository: profiles/slurm installed as your named profile, e.g.
#   make slurm-profile ACCOUNT=my-lab CPU_PARTITION=cpu GPU_PARTITION=gpu
slurm-profile: setup
	$(VENV)/bin/sweflow slurm-profile --account '$(ACCOUNT)' --cpu-partition '$(CPU_PARTITION)' \
		--gpu-partition '$(GPU_PARTITION)' $(if $(FORCE),--force)

# The wheels benchmarks/gpu_check.py needs on the GPU machine beyond its image, into .whl/ (carried there).
gpu-wheels:
	python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
		$$(sed -e 's/#.*//' benchmarks/gpu_wheels.txt)

lint: setup
	$(VENV)/bin/ruff check sweflow tests scripts benchmarks
	$(VENV)/bin/ruff format --check sweflow tests scripts benchmarks
	$(VENV)/bin/snakefmt --check Snakefile rules
	$(VENV)/bin/snakemake --lint --workflow-profile none

clean:
	rm -rf results resources/datasets logs .snakemake
