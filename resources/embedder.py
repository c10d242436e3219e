"""The embedding model as a Dagster resource: a thin shell over kpack.embedding."""

from __future__ import annotations

import numpy as np
from dagster import ConfigurableResource, InitResourceContext

from kpack.embedders import embedder_for
from kpack.embedding import DEFAULT_MODEL, Embedder


class EmbedderResource(ConfigurableResource):
    """Embeds texts with a model and precision chosen per pack, on the machine's device
    (kpack.embedding: a GPU when there is one, KPACK_EMBED_DEVICE to choose).

    The model is loaded on first use (``embed`` with texts, or ``dimension``), once per
    process, rather than in ``setup_for_execution``: a rebuild whose texts are all in the
    embedding cache never needs the model, and loading it (torch and the weights, several
    seconds) would be most of that rebuild's time. ``preload=True`` restores loading the
    default model at setup, for deployments that always embed. ``batch_size`` None: the one
    fitted to the device (kpack.embedding.batch_size_for).
    """

    default_model: str = DEFAULT_MODEL
    batch_size: int | None = None
    preload: bool = False

    def setup_for_execution(self, context: InitResourceContext) -> None:
        if self.preload:
            self.embedder(self.default_model)

    def embedder(self, name: str | None = None, precision: str = "fp32") -> Embedder:
        return embedder_for(name or self.default_model, precision)

    def dimension(self, name: str | None = None, precision: str = "fp32") -> int:
        return self.embedder(name, precision).dimension()

    def embed(
        self, texts: list[str], name: str | None = None, precision: str = "fp32"
    ) -> np.ndarray:
        return self.embedder(name, precision).encode(texts, self.batch_size)
