"""Shared fixtures. Device-free by default; tests marked `gpu` are skipped without a usable GPU."""
from __future__ import annotations

import functools
import os

# The simulator multiplies tiny matrices: BLAS threads only contend for the cores with the other
# pytest-xdist worker (measured on a 2-core machine: the whole suite 5:54 with OpenBLAS's
# default threads, 5:32 with one). Set before NumPy loads its BLAS; child processes (notebook
# kernels, the CUDA-simulator harnesses, hands-on checks) inherit it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest

from lab.config import LabConfig
from lab.model import load_model


@functools.lru_cache(maxsize=1)
def _gpu():
    from lab.backend import gpu_status
    return gpu_status()


def pytest_collection_modifyitems(config, items):
    # the slow tier first (a stable sort: each tier keeps its file order), so that under
    # pytest-xdist the longest tests start at once and the short ones fill the gaps after
    items.sort(key=lambda item: "slow" not in item.keywords)
    usable, reason = _gpu()
    if usable:
        return
    skip = pytest.mark.skip(reason=f"no usable GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def conformance_cache(tmp_path_factory):
    """One folder per test run where conformance keeps what it simulated (lab/measure/
    conformance.py's CACHE_ENV), shared by the pytest-xdist workers and the notebook kernels
    they start: the conformance table is simulated once per run, not once per process (its
    users share the xdist group "conformance", so they run one after another)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "conformance-cache"
    os.environ["DECODE_LAB_CONFORMANCE_CACHE"] = str(folder)
    yield folder
    os.environ.pop("DECODE_LAB_CONFORMANCE_CACHE", None)


@pytest.fixture(scope="session", autouse=True)
def state_folder(tmp_path_factory):
    """The lab's state folder (lab.config.STATE_ENV: the temporary files' journal, the saved
    tracebacks of internal errors) in the run's temporary folder, never the user's ~/.decode-lab."""
    from lab.config import STATE_ENV
    folder = tmp_path_factory.mktemp("state")
    os.environ[STATE_ENV] = str(folder)
    yield folder
    os.environ.pop(STATE_ENV, None)


@pytest.fixture(scope="session")
def model():
    """The shipped tiny model (data/tiny_model.npz), validated."""
    return load_model()


@pytest.fixture
def sim_cfg():
    return LabConfig(backend="sim")


@pytest.fixture
def cuda_cfg():
    return LabConfig(backend="cuda")
