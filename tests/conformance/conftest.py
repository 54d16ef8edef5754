"""The conformance cases run against the same real gateway harness as tests/api."""

from tests.api.conftest import make_gateway

__all__ = ["make_gateway"]
