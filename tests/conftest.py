"""Suite-wide guards that keep tests independent of the order they run in and of the machine's settings."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """Tests and in-process CLI calls (`set_threads`) change torch's thread count; restore it after each test, so that
    no test's numbers depend on which tests ran before it (the thread count changes the order of GEMM reductions)."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="session")
def _cache_of_the_session(tmp_path_factory):
    """What `blocklab lab` keeps between labs on a machine (its start-up calibration, ``lab.launch.CALIBRATION``) goes
    to a folder of the session, not the user's cache: no test reads what an earlier run of the suite left."""
    import os

    before = os.environ.get("BLOCKLAB_CACHE")
    os.environ["BLOCKLAB_CACHE"] = str(tmp_path_factory.mktemp("blocklab-cache"))
    yield
    if before is None:
        os.environ.pop("BLOCKLAB_CACHE", None)
    else:
        os.environ["BLOCKLAB_CACHE"] = before


# The tiny DAG, once per session, shared by test_pipeline.py and test_report.py (tests/tiny_dag.py).
from tiny_dag import snake_project  # noqa: E402,F401



# `make test` runs the suite on one process per core (pytest-xdist). A session- or module-scoped fixture is set up once
# per process that runs a test needing it, so every test of one module runs on one process, and every module using the
# tiny DAG (`snake_project`: the whole pipeline, minutes) on one process too. These are those modules (a test elsewhere
# that asks for it stops the collection: add its module here).
TINY_DAG_MODULES = {"test_diagnostics.py", "test_faults_e2e.py", "test_new_norm.py", "test_pipeline.py",
                    "test_precision.py", "test_probe.py", "test_report.py", "test_sensitivity.py"}


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: a run without it (`-p no:xdist`) ignores it
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByModuleTinyDagTogether(LoadScopeScheduling):
        """xdist's per-module scheduling (`--dist loadscope`), with the tiny DAG's modules as one unit (the largest unit
        first: loadscope orders units by their number of tests)."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tiny-dag" if path.rsplit("/", 1)[-1] in TINY_DAG_MODULES else path

    return ByModuleTinyDagTogether(config, log)


def pytest_collection_modifyitems(config, items):
    strays = sorted({item.path.name for item in items if "snake_project" in item.fixturenames} - TINY_DAG_MODULES)
    if strays:
        raise pytest.UsageError(f"tests/conftest.py: {', '.join(strays)} use the tiny DAG (snake_project): add them to "
                                "TINY_DAG_MODULES, so that one process builds it")
