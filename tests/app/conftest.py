"""Streamlit's AppTest runs a page as the __main__ module and leaves it there; a process spawned
later (tensor-parallel ranks) would then run that page on start-up. Each test gets its own back."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def restore_main_module():
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main
