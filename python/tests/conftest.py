"""pytest settings and fixtures shared by the Python package's tests (support.py has the rest:
the producer process, the build tree's paths and the helpers)."""

import numpy as np
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped where torch.cuda.is_available() is False")


@pytest.fixture(scope="session")
def dataset(tmp_path_factory):
    """A small ImageFolder of real JPEG files: NUM_CLASSES classes, NUM_IMAGES images."""
    from PIL import Image

    from support import NUM_CLASSES, NUM_IMAGES  # here: support needs torch, not every test does

    root = tmp_path_factory.mktemp("imagefolder")
    rng = np.random.default_rng(0)
    for i in range(NUM_IMAGES):
        cls = root / ("class%d" % (i % NUM_CLASSES))
        cls.mkdir(exist_ok=True)
        h, w = int(rng.integers(40, 72)), int(rng.integers(40, 72))
        # Smooth gradients plus noise: compresses like a photo more than pure noise does.
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([(x * 255 // w), (y * 255 // h), ((x + y) * 127 // (w + h))], axis=-1)
        pixels = np.clip(base + rng.integers(-40, 40, size=(h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(cls / ("img%03d.jpg" % i), quality=90)
    return root


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A private run directory, for this process and the children it starts."""
    from support import LIBRARY
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    monkeypatch.setenv("COLOADER_RUN_DIR", str(run_dir))
    monkeypatch.setenv("COLOADER_LIBRARY", str(LIBRARY))
    return run_dir


@pytest.fixture
def serve(dataset, env):
    """Starts `coloader serve` processes (support.Producer) over `dataset`; stops them after the test."""
    from support import Producer

    started = []

    def start(*args, **kwargs):
        p = Producer(dataset, *args, **kwargs)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()
