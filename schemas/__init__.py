"""The published JSON Schemas (frames, demo tools), package data of ``toolforge``."""
