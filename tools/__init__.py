"""Demo and local tools, one module each, registered explicitly (arrives with the tools work)."""

__all__: list[str] = []
