"""runtime layer."""

__all__: list[str] = []
