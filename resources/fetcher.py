"""The fetcher as a Dagster resource: a thin shell over kpack.ingest.fetch.Fetcher."""

from __future__ import annotations

from pathlib import Path

from dagster import ConfigurableResource

from kpack.config import FetchConfig
from kpack.ingest.fetch import USER_AGENT, Fetcher, FetchResponse, Validators
from kpack.ingest.github import GITHUB_HOST, GITHUB_RAW_BASE


class FetcherResource(ConfigurableResource):
    """How this deployment fetches: user agent, retry backoff and the GitHub blob rewrite.

    What a pack fetches and its limits come from the pack's kg_config.json (FetchConfig).
    """

    user_agent: str = USER_AGENT
    backoff_s: float = 0.5
    github_host: str = GITHUB_HOST
    github_raw_base: str = GITHUB_RAW_BASE

    def fetcher(self, config: FetchConfig, file_roots: list[Path]) -> Fetcher:
        return Fetcher(
            config,
            file_roots,
            user_agent=self.user_agent,
            backoff_s=self.backoff_s,
            github_host=self.github_host,
            github_raw_base=self.github_raw_base,
        )

    def fetch_all(
        self,
        urls: list[str],
        config: FetchConfig,
        file_roots: list[Path],
        previous: dict[str, Validators] | None = None,
    ) -> list[FetchResponse]:
        """Fetch every URL; ``previous`` (by URL) makes the requests conditional."""
        with self.fetcher(config, file_roots) as fetcher:
            return fetcher.fetch_all(urls, previous)
