"""Answering questions from a built pack.

    import retrieval
    retrieval.search("demo", "How is a pack published?", k=5)
"""

from retrieval.pack import PackNotReady, open_pack
from retrieval.search import search

__all__ = ["PackNotReady", "open_pack", "search"]
