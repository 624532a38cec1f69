"""resnet8ptq/memory.py: a user's own malloc settings win (its effect on the heap:
tests/integration/test_memory.py)."""

from __future__ import annotations

import pytest

from resnet8ptq import memory


@pytest.mark.parametrize(
    "variable",
    [
        ("MALLOC_TOP_PAD_", "0"),
        ("MALLOC_MMAP_THRESHOLD_", "65536"),
        ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1000"),
    ],
)
def test_a_users_malloc_setting_is_left_alone(monkeypatch: pytest.MonkeyPatch, variable: tuple[str, str]):
    monkeypatch.setenv(*variable)
    assert memory.keep_freed_memory.__wrapped__() is False
