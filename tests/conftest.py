import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from autopersona_flows import JsonlMemoryStore


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(store_root: Path) -> JsonlMemoryStore:
    return JsonlMemoryStore(store_root)


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the ``autopersona`` command line in a fresh interpreter, as a user would."""

    def run(
        *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "autopersona_flows", *args],
            capture_output=True,
            text=True,
            check=False,
            env=env,
            timeout=timeout,
        )

    return run
