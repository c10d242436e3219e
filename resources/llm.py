"""Claude as a Dagster resource: a thin shell over kpack.llm.ClaudeClient."""

from __future__ import annotations

from dagster import ConfigurableResource, InitResourceContext
from pydantic import PrivateAttr

from kpack.llm import ClaudeClient, ExtractionFailed, Usage


class ClaudeResource(ConfigurableResource):
    """The API key is read from ``api_key_env`` at execution time, never from run config."""

    api_key_env: str = "ANTHROPIC_API_KEY"
    base_url: str | None = None
    max_retries: int = 3
    timeout_s: float = 60.0
    max_tokens: int = 2048

    _client: ClaudeClient | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._client = ClaudeClient(
            base_url=self.base_url,
            api_key_env=self.api_key_env,
            max_retries=self.max_retries,
            timeout_s=self.timeout_s,
        )

    @property
    def client(self) -> ClaudeClient:
        if self._client is None:  # used outside a Dagster run (tests, scripts)
            self._client = ClaudeClient(
                base_url=self.base_url, api_key_env=self.api_key_env, max_retries=self.max_retries
            )
        return self._client

    @property
    def available(self) -> bool:
        return self.client.available

    def redact(self, text: str) -> str:
        return self.client.redact(text)

    def extract(self, model: str, title: str, text: str) -> tuple[dict, Usage]:
        return self.client.extract(model, title, text, self.max_tokens)


__all__ = ["ClaudeResource", "ExtractionFailed", "Usage"]
