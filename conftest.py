"""Hermetic caches and offline settings for the whole suite, tests/ and repro/tests/ (docs/design.md, Environment facts,
trap 3 and 5).

Set in pytest_configure, before any test module imports tiktoken or datasets (which read these at import time):
- TIKTOKEN_CACHE_DIR, HF_HOME, HF_DATASETS_CACHE → a fresh temp folder, removed at the end of the session;
- HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1: `datasets` fails fast instead of retrying the Hub;
- SCALEVEC_TOKENIZER_DIR → the tokenizers/ folder (gpt2.tiktoken) of an optional data folder, $SCALEVEC_SHARED_DIR
  or shared/ beside the checkout, when it exists and the variable is not set already. Without it, tiktoken
  downloads GPT-2's ranks once per session, as it does for any user online.

Nothing here needs that folder: the tests read text from the built-in corpus's packages (installed by the README's
test command) and GPT-2's ranks from wherever `data.tokenizer` finds them.
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
    repo = Path(__file__).resolve().parent
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
    if (SHARED / "tokenizers" / "gpt2.tiktoken").is_file():
        os.environ.setdefault("SCALEVEC_TOKENIZER_DIR", str(SHARED / "tokenizers"))
    if hasattr(config, "workerinput"):
        # A pytest-xdist worker (pytest.ini: -n 2) gets its share of the cores for torch's intra-op threads, and so do
        # the processes its tests start (OMP_NUM_THREADS, unless set already; a test that sets its own keeps it): two
        # workers on 2 cores then run one thread each. With torch's default of one per core, four OpenMP threads spin
        # against each other (measured: tests/test_moe.py, test_model.py, test_loss.py and test_ffn_padding.py took
        # 186 s instead of 36 s under -n 2). The multi-rank tests' ranks run one thread each anyway (multiproc.py).
        import torch
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        share = max(1, cores // config.workerinput["workercount"])
        torch.set_num_threads(int(os.environ.setdefault("OMP_NUM_THREADS", str(share))))
    if os.environ.get("SCALEVEC_TEST_GPU") != "1":
        # The suite is CPU-only by design (docs/design.md principle 8): on a GPU machine, hide the GPUs so that FSDP2,
        # "auto" devices and tolerances behave exactly as in CI. SCALEVEC_TEST_GPU=1 runs the `gpu` tests instead.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


# The modules whose tests prove training numerics: compiled against eager, the fused head against the plain path,
# FSDP2 ranks against one process, resume against an uninterrupted run (on another layout too), Muon against
# torch's, our Llama against transformers', host reads. .ci/torch-lane runs them (`-m numerics`) under the GPU
# machines' torch.
NUMERICS_MODULES = {"test_compile", "test_loss", "test_host_reads", "test_train", "test_moe_train", "test_optim_dist",
                    "test_parallel", "test_checkpoint", "test_checkpoint_fsdp", "test_muon", "test_model", "test_moe",
                    "test_grad_reduce", "test_elastic", "test_data_loader", "test_golden", "test_step", "test_fast", "test_stop",
                    "test_convert_checkpoint"}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move everything alive after collection (pytest's, torch's and the test modules' objects) out of the garbage
    collector's view: train.py's teardown runs a full gc.collect() before destroying the process group (trap 1 of
    runtime/dist.py's shutdown), which in this long-lived process otherwise walks all of it — about 0.3 s per
    in-process run, hundreds of times. Objects the tests create later are collected as usual."""
    import gc
    gc.collect()
    gc.freeze()


# The modules that take longest, longest first. Under pytest-xdist (pytest.ini: `-n 2 --dist loadfile
# --no-loadscope-reorder`) each file goes whole to one worker, in collection order, as a worker frees up: these start
# first, so that no long file is left to run alone at the end while the other worker idles. A stale list costs only
# time. The serial run (`-n 0`) keeps pytest's own order.
LONGEST_FIRST = ("test_bench", "test_train", "test_soak", "test_results", "test_elastic", "test_sweep", "test_golden",
                 "test_compile", "test_host_reads", "test_grad_reduce", "test_moe_train", "test_ffn_padding",
                 "test_data_prepare", "test_moe", "test_stop")


def _module_name(item: pytest.Item) -> str:
    return item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""


# The fast tier (`pytest -m fast`, under a minute on 2 cores): the step itself, the model, the loss, the scale
# vectors, the optimizers, the config, checkpoints and the loader, each in-process; no run of train.py.
FAST_MODULES = {"test_step", "test_layout", "test_config", "test_model", "test_loss", "test_fast", "test_optim_groups",
                "test_schedule", "test_muon", "test_optim_hybrid", "test_checkpoint", "test_theory", "test_config_fuzz",
                "test_data_loader", "test_footprint"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _module_name(item) in NUMERICS_MODULES:
            item.add_marker(pytest.mark.numerics)
        if _module_name(item) in FAST_MODULES:
            item.add_marker(pytest.mark.fast)
    if hasattr(config, "workerinput"):  # every worker collects, and must collect the same order: this is deterministic
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(_module_name(item), len(LONGEST_FIRST)))  # stable: the rest keep theirs
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
def shakespeare_text() -> str:
    """1.2 MB of Shakespeare's plays, scene by scene, from the built-in corpus (data/builtin.py): the text the tests
    train and tokenize on."""
    from data.builtin import pd_english_documents
    docs, size = [], 0
    for doc in pd_english_documents():
        docs.append(doc)
        size += len(doc)
        if size > 1_200_000:
            break
    return "\n\n".join(docs)


@pytest.fixture(scope="session")
def gpt2_ranks_file(tmp_path_factory) -> Path:
    """GPT-2's ranks as a file, from $SCALEVEC_TOKENIZER_DIR or tiktoken's download (data.tokenizer.named_ranks)."""
    from data.tokenizer import named_ranks, write_ranks
    path = tmp_path_factory.mktemp("tokenizers") / "gpt2.tiktoken"
    write_ranks(named_ranks("gpt2"), path)
    return path
