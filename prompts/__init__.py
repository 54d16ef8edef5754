"""The prompt templates, package data of ``toolforge`` (read with ``importlib.resources``)."""
