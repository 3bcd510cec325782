"""Fixtures for the observatory tests (helpers live in observatory_helpers.py, importable from test modules)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from timm.models.vision_transformer import VisionTransformer

from tests.observatory.observatory_helpers import make_vit


@pytest.fixture
def vit() -> VisionTransformer:
    return make_vit()


@pytest.fixture
def vit_factory() -> Callable[..., VisionTransformer]:
    return make_vit
