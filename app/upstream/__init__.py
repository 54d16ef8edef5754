"""upstream layer."""

__all__: list[str] = []
