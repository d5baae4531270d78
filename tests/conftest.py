from pathlib import Path

import pytest

from autopersona_flows import JsonlMemoryStore


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(store_root: Path) -> JsonlMemoryStore:
    return JsonlMemoryStore(store_root)
