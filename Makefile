# decode-lab: every target installs what it needs into .venv first.
#   make demo       generate + launch bill (GPU when present, else the CPU simulator)
#   make test       the device-free test suite (what CI runs), notebooks included, both tiers
#   make gpu-test   the tests marked `gpu` (needs an NVIDIA GPU)
#   make gpu-record every experiment of the registry, GPU tests included, into out/gpu (decode-lab record)
#   make lab        JupyterLab on notebooks/
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
comma  := ,
# On a machine with an NVIDIA driver, install the CuPy extra that matches its CUDA major version.
CUDA_MAJOR := $(shell nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: \([0-9]*\).*/\1/p' | head -n1)
EXTRAS := dev$(if $(CUDA_MAJOR),$(if $(filter 12,$(CUDA_MAJOR)),$(comma)cuda12,$(comma)cuda13))

.PHONY: demo test gpu-test gpu-record lab notebooks clean

# PYTHONWARNINGS=ignore: the build backend's notice about editable installs is not ours to print
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	PYTHONWARNINGS=ignore $(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

demo: $(VENV)/.installed
	$(PY) -m lab demo

# both tiers at once, one worker per core (the slow tier starts first), the 15 slowest listed
test: $(VENV)/.installed
	$(PY) -m pytest -q -n auto --dist loadgroup --durations=15

gpu-test: $(VENV)/.installed
	$(PY) -m pytest -q -m gpu

gpu-record: $(VENV)/.installed
	$(VENV)/bin/decode-lab record --all --backend cuda --out out/gpu

# JupyterLab refuses to run as root unless told: containers and course servers often are root
lab: $(VENV)/.installed
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root )notebooks/

# regenerate the .ipynb files from their jupytext sources and execute them on the simulator
notebooks: $(VENV)/.installed
	$(PY) scripts/build_notebooks.py

clean:
	rm -rf $(VENV) build *.egg-info
