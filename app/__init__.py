"""ToolForge: a streaming tool-calling gateway."""

__version__ = "0.1.0"
__all__ = ["__version__"]
