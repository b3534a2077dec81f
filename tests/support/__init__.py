"""Test support that is not a fixture: helpers the tests and the benchmarks import (``from support.milvus_server
import LocalMilvusServer``; tests/ is on ``sys.path``, see pyproject's ``[tool.pytest.ini_options]``)."""
