# The README's two commands: `make run` (set up + run the pipeline on the embedded default config)
# and `make test` (set up + run the whole test suite). Both are idempotent.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup system system-test run test test-fast lint clean slurm-profile gpu-wheels

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

# The production env's Python (3.12) with the lock's packages that the Megatron actor's build needs, for
# tests/unit/test_megatron_qwen35.py (verl's own build of Qwen3.5-4B at TP 2 x CP 4 on 8 CPU ranks): a subset
# of envs/train-verl.lock.txt at its versions (uv, the lock as constraints), then stage 2 (megatron-bridge
# --no-deps) as envs/train-verl.post-deploy.sh does; and the index's mbridge beside it (the old path's check).
VERL_VENV ?= .venv-verl
PY312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) $(shell command -v python3.12))
VERL_BUILD_PKGS := torch megatron-core verl transformers hydra-core omegaconf peft tensordict einops triton
UVPIP = UV_PYTHON_DOWNLOADS=never $(VENV)/bin/uv pip install -q --python $(VERL_VENV)/bin/python
$(VERL_VENV)/.installed: $(VENV)/.installed envs/train-verl.lock.txt envs/train-verl.nodeps.txt
	@test -n "$(PY312)" || { echo "make: Python 3.12 not found (set PY312=/path/to/python3.12)" >&2; exit 2; }
	rm -rf $(VERL_VENV)
	UV_PYTHON_DOWNLOADS=never $(VENV)/bin/uv venv -q --python $(PY312) $(VERL_VENV)
	$(UVPIP) -c envs/train-verl.lock.txt $(VERL_BUILD_PKGS)
	$(UVPIP) --no-deps -r envs/train-verl.nodeps.txt
	$(UVPIP) --no-deps --target $(VERL_VENV)/mbridge-index 'mbridge==0.15.1'
	touch $@

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
test: setup $(VENV)/.verl-installed $(VERL_VENV)/.installed system-test
	mkdir -p $(TEST_OUT)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/pytest -ra -n $(JOBS) --dist loadgroup --durations=40 \
		--junitxml=$(TEST_OUT)/junit.xml $(PYTEST_ARGS) tests

test-fast: setup $(VENV)/.verl-installed
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
