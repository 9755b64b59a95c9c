# Two commands do all set-up and run: `make demo` and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The dev environment pins torch to the CPU build that lies on this machine's disk, so no CUDA build is pulled.
TORCH_PIN ?= torch==2.13.0
OUT ?= out/demo
# torchao's MX / NVFP4 reference for tests/measure/test_blockscale.py, installed beside the environment, not in it:
# transformers imports torchao whenever it is importable, and its CUDA kernels' load failures would reach every
# command's stderr. The tests run it in a subprocess with this folder on its path.
TORCHAO_PIN ?= torchao==0.18.0
TORCHAO_REF := $(VENV)/ref-torchao
# The load tools whose result files `opmap bench --from` reads, each in a venv of its own beside the environment
# (their pins clash with the dev environment's torch / transformers): tests/bench/test_imports.py runs each against
# the tests' transformers serve. guidellm needs torch: the local CPU build (TORCH_PIN) goes in first, so the CUDA
# build (6 GB) is never pulled. inference-perf needs Python >= 3.12 (PY312): python3.12 where it runs (a pyenv shim
# on PATH may not), else pyenv's newest 3.12; without one its test skips, with a note here. Measured on a loaded
# 2-core host (`make ext-tools VENV=DIR`, PIP_NO_CACHE_DIR=1): 4 min 21 s wall for the three (172 s user + 14 s sys):
# aiperf 1.4 min (1.2 GB), guidellm 1.7 min (1.5 GB, the CPU torch), inference-perf 1.2 min (0.8 GB).
EXT_TOOLS ?= aiperf==0.13.0 guidellm==0.8.1 inference-perf==0.7.0
PY312 ?= $(shell for p in $$(command -v python3.12) $$(ls -d $$HOME/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null \
                   | sort -V -r); do "$$p" -c '' 2>/dev/null && { echo "$$p"; break; }; done)

.PHONY: setup ext-tools demo test lint browser bench accuracy peers clean

$(BIN)/opmap: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check $(TORCH_PIN)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --upgrade --target $(TORCHAO_REF) $(TORCHAO_PIN)
	touch $(BIN)/opmap

setup: $(BIN)/opmap ext-tools

ext-tools:
	for pin in $(EXT_TOOLS); do name=$${pin%%==*}; py=$(PY); env=$(VENV)/ext-$$name; pre=; \
	  [ $$name = inference-perf ] && py="$(PY312)"; [ $$name = guidellm ] && pre="$(TORCH_PIN)"; \
	  [ -n "$$py" ] && command -v $$py >/dev/null || { echo "note: no Python for $$name: not installed (its test skips)"; \
	  continue; }; test -x $$env/bin/$$name || { $$py -m venv $$env && { [ -z "$$pre" ] || \
	  $$env/bin/pip install -q --disable-pip-version-check $$pre; } && \
	  $$env/bin/pip install -q --disable-pip-version-check $$pin; } || exit 1; done

demo: setup
	$(BIN)/opmap analyze gpt2 --hardware h100-sxm --batch 1 --seq 1024 --dtype bf16 --out $(OUT)

test: setup lint browser
	$(BIN)/python -m pytest

# The peers benchmarks/peer_llm_analysis.py runs beside opmap: llm-analysis pins transformers < 5 for Hugging Face
# look-ups that script never makes, so it goes in without its dependencies (fire and its two are all it imports)
peers: setup
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-analysis==0.2.2 'fire>=0.5,<0.6' six termcolor

# The dashboard's browser test drives Debian's chromium and chromedriver. As root they are installed with
# apt-get directly (package lists fetched first when missing or stale), else with `sudo -n`; a machine that could
# install them and failed fails here, so the browser test never skips where it could have run. Only a
# non-root user without passwordless sudo gets the skip (with its reason).
APT_BROWSER = DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  echo "installing chromium and chromium-driver with apt-get (root)"; \
	  $(APT_BROWSER) >/dev/null 2>&1 || { apt-get update -q >/dev/null && $(APT_BROWSER) >/dev/null; }; \
	elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then \
	  echo "installing chromium and chromium-driver with sudo -n apt-get"; \
	  sudo -n env $(APT_BROWSER) >/dev/null 2>&1 || { sudo -n apt-get update -q >/dev/null && sudo -n env $(APT_BROWSER) >/dev/null; }; \
	else \
	  echo "note: chromium/chromedriver not installed (not root, no passwordless sudo): the browser test will skip"; \
	fi

lint: setup
	$(BIN)/ruff check src tests benchmarks

bench: setup
	$(BIN)/python benchmarks/bench_capture.py
	$(BIN)/python benchmarks/bench_large.py
	$(BIN)/python benchmarks/bench_train_large.py
	$(BIN)/python benchmarks/bench_plan.py
	$(BIN)/python benchmarks/bench_sweep.py
	$(BIN)/python benchmarks/bench_serve.py
	$(BIN)/python benchmarks/bench_engine.py

accuracy: setup
	$(BIN)/python benchmarks/accuracy.py

clean:
	rm -rf $(VENV) out build src/*.egg-info
