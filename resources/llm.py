"""Claude as a Dagster resource: a thin shell over kpack.llm.ClaudeClient."""

from __future__ import annotations

from dagster import ConfigurableResource, EnvVar, InitResourceContext
from pydantic import PrivateAttr

from kpack.llm import API_KEY_ENV, ClaudeClient


class ClaudeResource(ConfigurableResource):
    """Claude for extraction. ``api_key`` is bound to ``EnvVar("ANTHROPIC_API_KEY")`` in the
    code location (see :func:`claude_resource`), so the UI and run config show the variable's
    name, never the secret; unset, the client falls back to the environment at execution."""

    api_key: str | None = None
    base_url: str | None = None
    max_retries: int = 3
    timeout_s: float = 60.0
    max_tokens: int = 2048
    # Polling a message batch: the first wait between polls, growing 1.5x a poll up to the
    # second (most batches end within the hour; Anthropic ends every one within 24 hours).
    batch_poll_s: float = 10.0
    batch_poll_max_s: float = 120.0

    _client: ClaudeClient | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._client = self._make_client()

    def _make_client(self) -> ClaudeClient:
        # Outside a run (the dry run) an EnvVar is not resolved for us.
        api_key = self.api_key.get_value() if isinstance(self.api_key, EnvVar) else self.api_key
        return ClaudeClient(
            api_key=api_key,
            base_url=self.base_url,
            max_retries=self.max_retries,
            timeout_s=self.timeout_s,
        )

    @property
    def client(self) -> ClaudeClient:
        if self._client is None:  # used outside a Dagster run (tests, scripts)
            self._client = self._make_client()
        return self._client

    @property
    def available(self) -> bool:
        return self.client.available

    def redact(self, text: str) -> str:
        return self.client.redact(text)


def claude_resource(environ: dict[str, str]) -> ClaudeResource:
    """The deployment's Claude resource: the key through EnvVar when the variable is set.

    Without it (offline builds) nothing is bound: an EnvVar of an unset variable is a
    configuration error in Dagster, and a pack without a key builds with the offline extractor.
    """
    if environ.get(API_KEY_ENV):
        return ClaudeResource(api_key=EnvVar(API_KEY_ENV))
    return ClaudeResource()
