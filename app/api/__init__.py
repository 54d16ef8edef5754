"""api layer."""

__all__: list[str] = []
