"""The embedding model as a Dagster resource: a thin shell over kpack.embedding."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from dagster import ConfigurableResource, InitResourceContext

from kpack.embedding import DEFAULT_MODEL, encode, load_model

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


class EmbedderResource(ConfigurableResource):
    """Embeds texts with a sentence-transformers model chosen per pack.

    The model is loaded on first use (``embed`` with texts, or ``dimension``), once per
    process, rather than in ``setup_for_execution``: a rebuild whose texts are all in the
    embedding cache never needs the model, and loading it (torch and the weights, several
    seconds) would be most of that rebuild's time. ``preload=True`` restores loading the
    default model at setup, for deployments that always embed.
    """

    default_model: str = DEFAULT_MODEL
    batch_size: int = 64
    preload: bool = False

    def setup_for_execution(self, context: InitResourceContext) -> None:
        if self.preload:
            self.model(self.default_model)

    def model(self, name: str | None = None) -> SentenceTransformer:
        return load_model(name or self.default_model)

    def dimension(self, name: str | None = None) -> int:
        return int(self.model(name).get_embedding_dimension())

    def embed(self, texts: list[str], name: str | None = None) -> np.ndarray:
        return encode(self.model(name), texts, self.batch_size)
