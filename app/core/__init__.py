"""Sans-IO core: parsers and state machines with no I/O, no clock, no event loop.

A layering test (tests/test_layering.py) fails if anything here imports asyncio, httpx,
fastapi, starlette, structlog, logging or time. Time, when needed, comes in as an argument.
"""

__all__: list[str] = []
