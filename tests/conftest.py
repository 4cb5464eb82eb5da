"""Hermetic caches and offline settings for the whole suite (DESIGN.md, Environment facts, trap 3 and 5).

Set in pytest_configure, before any test module imports tiktoken or datasets (which read these at import time):
- TIKTOKEN_CACHE_DIR, HF_HOME, HF_DATASETS_CACHE → a fresh temp folder, removed at the end of the session;
- HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1: `datasets` fails fast instead of retrying the Hub;
- SCALEVEC_TOKENIZER_DIR → ../shared/tokenizers beside the repo (gpt2.tiktoken), unless already set.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

def _find_shared() -> Path:
    """$SCALEVEC_SHARED_DIR, else shared/ beside the repo, else shared/ beside the checkout this one was cloned from
    (a scratch clone such as `git clone . /tmp/x` still finds the project's data)."""
    if os.environ.get("SCALEVEC_SHARED_DIR"):
        return Path(os.environ["SCALEVEC_SHARED_DIR"])
    repo = Path(__file__).resolve().parents[1]
    candidates = [repo.parent / "shared"]
    try:
        origin = subprocess.run(["git", "-C", str(repo), "remote", "get-url", "origin"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        origin = ""
    if origin and "://" not in origin and not origin.startswith("git@") and Path(origin).is_dir():
        candidates.append(Path(origin).resolve().parent / "shared")
    return next((c for c in candidates if c.is_dir()), candidates[0])


SHARED = _find_shared()
_CACHE: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    cache = tempfile.mkdtemp(prefix="scalevec-test-caches-")
    _CACHE.append(cache)
    os.environ["TIKTOKEN_CACHE_DIR"] = os.path.join(cache, "tiktoken")
    os.environ["HF_HOME"] = os.path.join(cache, "hf")
    os.environ["HF_DATASETS_CACHE"] = os.path.join(cache, "hf", "datasets")
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("SCALEVEC_TOKENIZER_DIR", str(SHARED / "tokenizers"))
    if os.environ.get("SCALEVEC_TEST_GPU") != "1":
        # The suite is CPU-only by design (DESIGN.md principle 8): on a GPU machine, hide the GPUs so that FSDP2,
        # "auto" devices and tolerances behave exactly as in CI. SCALEVEC_TEST_GPU=1 runs the `gpu` tests instead.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run with SCALEVEC_TEST_GPU=1 on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_unconfigure(config: pytest.Config) -> None:
    for cache in _CACHE:
        shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the repo (or $SCALEVEC_SHARED_DIR). Missing is a failure, never a skip: CI has it."""
    assert (SHARED / "tokenizers" / "gpt2.tiktoken").is_file(), (
        f"{SHARED} lacks tokenizers/gpt2.tiktoken; clone the repo next to the project's shared/ folder "
        "or set SCALEVEC_SHARED_DIR")
    return SHARED
