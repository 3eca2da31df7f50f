"""Shared fixtures: tiny random models written once per session, and the real pair."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tinymodel import write_tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def localspec_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test runs with its own localspec home: no calibration or registry leaks in or out.

    History is off unless a test turns it on: a drafter that learns from earlier
    tests would make their statistics depend on the order they run in.
    """
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSPEC_HOME", str(home))
        mp.setenv("LOCALSPEC_HISTORY", "off")
        yield home


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process measurements see no other programs: whether one is cached must not depend on what else
    the test machine runs. The tests of that check restore the real one."""
    from localspec.drafting import calibration

    monkeypatch.setattr(calibration, "others_running", lambda *args, **kwargs: 0.0)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    write_tiny_model(d / "target.gguf", seed=0)
    write_tiny_model(d / "draft.gguf", seed=0, noise=0.35)  # agrees often, not always
    write_tiny_model(d / "other.gguf", seed=7)  # same vocabulary, unrelated weights
    write_tiny_model(d / "renamed.gguf", seed=0, rename={100: "XYZ"})  # vocabulary differs at id 100
    return d


@pytest.fixture(scope="session")
def tiny_pair(tiny_dir: Path):
    import localspec

    pair = localspec.load(tiny_dir / "target.gguf", tiny_dir / "draft.gguf", n_ctx=1024)
    yield pair
    pair.close()


@pytest.fixture
def make_pair(tiny_dir: Path):
    """A factory of freshly loaded tiny pairs, each with its own cost profile and history setting.

    Tests that change a pair's profile or history take their own instead of
    mutating the session's ``tiny_pair``; every pair made is closed afterwards.
    """
    import localspec

    opened = []

    def make(profile=None, history=False, draft=True, n_ctx=1024):
        pair = localspec.load(tiny_dir / "target.gguf", tiny_dir / "draft.gguf" if draft else None, n_ctx=n_ctx,
                              history=history)
        pair.set_profile(profile)
        opened.append(pair)
        return pair

    yield make
    for pair in opened:
        pair.close()


def real_models_dir() -> Path:
    """Where scripts/fetch_test_models.py puts the real pair."""
    sys.path.insert(0, str(REPO / "scripts"))
    from fetch_test_models import default_dest

    return default_dest()


@pytest.fixture(scope="session")
def real_pair():
    import localspec

    d = real_models_dir()
    if not (d / "target.gguf").is_file() or not (d / "draft.gguf").is_file():
        pytest.fail(f"The real model pair is not in {d}; run `python scripts/fetch_test_models.py` first "
                    "(or deselect these tests with -m 'not real').")
    pair = localspec.load(d / "target.gguf", d / "draft.gguf", n_ctx=2048)
    yield pair
    pair.close()


@pytest.fixture(scope="module")
def server(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """``localspec serve`` on the tiny pair, one per test module that asks (a module may define its own)."""
    from serverproc import ServeProcess

    s = ServeProcess(["-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "draft.gguf"), "--ctx", "1024"],
                     tmp_path_factory.mktemp("serve"))
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    """The ``openai`` client of ``server``."""
    import openai

    return openai.OpenAI(base_url=server.url, api_key="not-needed", max_retries=0, timeout=60)
