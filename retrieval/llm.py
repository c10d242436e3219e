"""Claude for the query side: text completions with token accounting that never raise.

The key comes from the caller or ANTHROPIC_API_KEY; ANTHROPIC_BASE_URL (or base_url) points the
real SDK at another endpoint, which is how the tests reach their loopback fake.
"""

from __future__ import annotations

import os

import anthropic

SYNTHESIS_MODEL = "claude-opus-4-6"
EXPANSION_MODEL = "claude-haiku-4-5"
SYNTHESIS_MAX_TOKENS = 1024


class LLMError(Exception):
    pass


class LLMClient:
    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 2,
        enabled: bool = True,
    ):
        key = (api_key or os.environ.get("ANTHROPIC_API_KEY")) if enabled else None
        self.client = (
            anthropic.Anthropic(
                api_key=key,
                base_url=base_url or os.environ.get("ANTHROPIC_BASE_URL"),
                max_retries=max_retries,
                timeout=60.0,
            )
            if key
            else None
        )
        self.usage = {"input_tokens": 0, "output_tokens": 0, "api_calls": 0}

    @property
    def available(self) -> bool:
        return self.client is not None

    def complete(
        self, model: str, system: str, prompt: str, max_tokens: int = SYNTHESIS_MAX_TOKENS
    ) -> str:
        if self.client is None:
            raise LLMError("no API key")
        try:
            response = self.client.messages.create(
                model=model,
                max_tokens=max_tokens,
                system=system,
                messages=[{"role": "user", "content": prompt}],
            )
        except anthropic.APIError as exc:
            raise LLMError(type(exc).__name__) from exc
        self.usage["api_calls"] += 1
        self.usage["input_tokens"] += response.usage.input_tokens
        self.usage["output_tokens"] += response.usage.output_tokens
        return "".join(block.text for block in response.content if block.type == "text").strip()
