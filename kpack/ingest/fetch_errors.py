"""The errors of a fetch: FetchError (a failure worth telling the user, never retried), and
which error texts say a host could not be reached at all."""

from __future__ import annotations

import re


class FetchError(Exception):
    """A fetch that failed for a reason worth telling the user (not retried)."""


# The errors that say a page's host could not be reached at all: its name does not resolve or
# nothing answers a connection (what every page of a web pack gets on a machine that is
# offline), maybe as the failure of a sitemap or robots.txt ("sitemap: ...").
UNREACHABLE = re.compile(
    r"^(?:(?:sitemap|robots\.txt): )?(?:cannot resolve host|connection failed)"
)


def unreachable(error: str) -> bool:
    """Whether the fetch error ``error`` says its host could not be reached at all."""
    return UNREACHABLE.match(error) is not None
