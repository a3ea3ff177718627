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


# The tiny DAG, once per session, shared by test_pipeline.py and test_report.py (tests/tiny_dag.py).
from tiny_dag import snake_project  # noqa: E402,F401
