"""pytest settings shared by the Python package's tests."""


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped where torch.cuda.is_available() is False")
