"""The gateway harness for the packs' stream tests (tests/api's fixture)."""

from tests.api.conftest import make_gateway

__all__ = ["make_gateway"]
