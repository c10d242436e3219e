"""The title and version of the documentation a pack was built from, read from its pages'
titles.

Sphinx titles every page "<page> — <project> <release> documentation" (its ``html_title``;
themes vary the words: "SciPy v1.10.1 Manual", "Flask Documentation (2.2.x)", the Python
docs' index "3.11.2 Documentation"). The part after the last separator names the site, so a
version number there is the documentation's release, while a page's own title ("Version
2.2.2", "What's new in 3.12") is left out. The release is the version more than half of the
pages that name one name; a site whose titles name none, or a pack of several sites none of
which holds most of its pages, has no version (None): a pack of Python's and pandas' docs is
neither 3.11.2 nor 1.5.3.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

# What separates a page's own title from the site's name in a <title>.
TITLE_SEPARATORS = re.compile(r"\s+[—–|]\s+|\s+-\s+")
# A release: 3.11.2, v1.10.1, 2.2.x, 5.0rc1, 1.5.3.post1 (two parts at least, as 3.11).
RELEASE = re.compile(r"(?<![\w.])v?(\d+(?:\.(?:\d+|x))+(?:(?:a|b|rc|\.dev|\.post)\d+)?)(?![\w.])")


def site_part(title: str | None) -> str | None:
    """The part of a page's <title> that names its site: after the last separator; None for
    a title without one (it may be the page's own title only)."""
    parts = TITLE_SEPARATORS.split((title or "").strip())
    return parts[-1] if len(parts) > 1 else None


def title_release(title: str | None) -> str | None:
    """The release a page's <title> names in its site part, or None."""
    if not title:
        return None
    found = RELEASE.search(TITLE_SEPARATORS.split(title.strip())[-1])
    return found.group(1) if found else None


def documentation_version(titles: Iterable[str | None]) -> str | None:
    """The release more than half of the titles that name one name, or None."""
    return _majority(map(title_release, titles))


def documentation_title(titles: Iterable[str | None]) -> str | None:
    """The site's name more than half of the titles with one end with ("Python 3.11.2
    documentation"), or None."""
    return _majority(map(site_part, titles))


def _majority(values: Iterable[str | None]) -> str | None:
    counted = Counter(value for value in values if value)
    if not counted:
        return None
    value, count = counted.most_common(1)[0]
    return value if count * 2 > sum(counted.values()) else None
