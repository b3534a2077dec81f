"""Fixtures of the program tests: spying retrievers over the tiny corpus."""

import pytest
from programs.program_helpers import PoolRetriever, SpyRetriever


@pytest.fixture
def spy(tiny_corpus):
    return SpyRetriever(tiny_corpus)


@pytest.fixture
def pool(tiny_corpus):
    return PoolRetriever(tiny_corpus)
