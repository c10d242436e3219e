"""Main-content extraction, HTML/Markdown blocks, sections with heading paths, and links."""

from __future__ import annotations

from pathlib import Path

from kpack.ingest.html import html_blocks, main_content, markdown_blocks, page_links
from kpack.ingest.sections import category_of, internal_links, parse_pages, split_sections
from tests.hostile_site import deep_page

SITE = Path(__file__).parent / "site" / "docs"
BASE = "https://docs.example.org/docs/"


def sections_of(fmt: str, body: str, fallback: str = "fallback"):
    blocks = html_blocks(body) if fmt == "html" else markdown_blocks(body)
    return split_sections(blocks, None, fallback)


def by_path(drafts) -> dict[str, object]:
    return {" > ".join(d.path): d for d in drafts}


# main_content


def test_main_content_drops_noise_and_keeps_the_article():
    title, body = main_content((SITE / "index.html").read_text())
    assert title == "Widget Docs - Home"
    for noise in ("NOISE_SCRIPT", "NOISE_HEADER", "NOISE_NAV", "NOISE_ASIDE", "NOISE_FOOTER"):
        assert noise not in body
    assert "color:red" not in body
    assert "<h1>Widget Toolkit</h1>" in body
    assert "The Sprocket Registry keeps every sprocket" in body
    assert "pip install widget-toolkit" in body
    assert "SprocketValidator" in body


def test_main_content_prefers_role_main_and_drops_permalink_anchors():
    title, body = main_content((SITE / "guide.html").read_text())
    assert title == "User guide"
    assert "NOISE_NAV" not in body
    assert "¶" not in body
    assert "headerlink" not in body
    assert "Environment variables" in body


def test_page_header_is_chrome_only_without_a_main_landmark():
    without = (
        "<html><body><header>Site chrome</header>"
        "<div><h1>T</h1><p>Body text.</p></div></body></html>"
    )
    _, body = main_content(without)
    assert "Site chrome" not in body
    assert "Body text." in body

    within = "<body><main><header><h1>Article title</h1></header><p>Body text.</p></main></body>"
    _, body = main_content(within)
    assert "Article title" in body


def test_main_content_of_a_page_without_title_or_body_text():
    title, body = main_content("<html><body><nav>menu</nav></body></html>")
    assert title is None
    assert "menu" not in body


# Markdown blocks


def test_markdown_headings_inside_code_fences_are_code():
    title, drafts = sections_of("markdown", (SITE / "readme.md").read_text())
    assert title == "Widget Readme"
    assert [d.title for d in drafts] == ["Widget Readme", "Building from source", "Releasing"]
    building = drafts[1]
    assert "```\n# this line is code, not a heading\n./build.sh --release\n```" in building.content
    assert all("this line is code" not in d.title for d in drafts)


def test_markdown_tilde_fences_need_a_matching_closing_fence():
    text = "# T\n\n~~~~\n## not a heading\n~~~\n## still code\n~~~~\n\n## Real\n\nBody.\n"
    kinds = [(kind, text) for kind, _, text in markdown_blocks(text)]
    assert ("code", "## not a heading\n~~~\n## still code") in kinds
    assert ("heading", "Real") in kinds
    assert ("heading", "still code") not in kinds


def test_markdown_setext_headings_and_front_matter():
    text = "---\ntitle: ignored\n---\nTitle\n=====\n\nIntro text.\n\nSub\n---\n\nSub text.\n"
    blocks = list(markdown_blocks(text))
    assert blocks == [
        ("heading", 1, "Title"),
        ("text", 0, "Intro text."),
        ("heading", 2, "Sub"),
        ("text", 0, "Sub text."),
    ]


def test_markdown_closing_hashes_are_dropped():
    assert list(markdown_blocks("## Install ##\n")) == [("heading", 2, "Install")]


def test_markdown_heading_ending_in_hash_keeps_it():
    assert list(markdown_blocks("## Using C#\n")) == [("heading", 2, "Using C#")]


# Sections


def test_html_sections_have_heading_paths_and_levels():
    _, body = main_content((SITE / "guide.html").read_text())
    title, drafts = sections_of("html", body)
    assert title == "User Guide"
    sections = by_path(drafts)
    assert list(sections) == [
        "User Guide",
        "User Guide > Setup",
        "User Guide > Setup > Environment variables",
        "User Guide > Troubleshooting",
    ]
    intro = sections["User Guide"]
    assert intro.level == 1 and intro.title == "User Guide"
    assert "configure frobnication for production" in intro.content
    setup = sections["User Guide > Setup"]
    assert setup.level == 2 and setup.title == "Setup"
    assert "widget.configure(level=3)" in setup.content
    assert "WIDGET_HOME" not in setup.content
    env = sections["User Guide > Setup > Environment variables"]
    assert env.level == 3 and env.title == "Environment variables"
    assert "WIDGET_HOME" in env.content
    assert sections["User Guide > Troubleshooting"].level == 2


def test_code_blocks_are_kept_fenced_in_the_section():
    _, body = main_content((SITE / "index.html").read_text())
    _, drafts = sections_of("html", body)
    install = by_path(drafts)["Widget Toolkit > Installation"]
    assert "```\npip install widget-toolkit\n```" in install.content


def test_h3_path_follows_the_latest_h2():
    text = "# Doc\n\n## One\n\na\n\n### Sub\n\nb\n\n## Two\n\nc\n\n### Sub\n\nd\n"
    _, drafts = sections_of("markdown", text)
    assert [" > ".join(d.path) for d in drafts] == [
        "Doc > One",
        "Doc > One > Sub",
        "Doc > Two",
        "Doc > Two > Sub",
    ]


def test_h4_stays_inside_its_section():
    for fmt, text in (
        ("html", "<h1>Doc</h1><h2>Usage</h2><p>First.</p><h4>Details</h4><p>Second.</p>"),
        ("markdown", "# Doc\n\n## Usage\n\nFirst.\n\n#### Details\n\nSecond.\n"),
    ):
        _, drafts = sections_of(fmt, text)
        assert [d.title for d in drafts] == ["Usage"], fmt
        assert "Details" in drafts[0].content
        assert drafts[0].content.index("First.") < drafts[0].content.index("Second.")


def test_title_falls_back_when_the_page_has_no_h1():
    blocks = markdown_blocks("Just an intro.\n\n## Part\n\nBody.\n")
    title, drafts = split_sections(blocks, "Notes page", "url name")  # the <title> hint wins
    assert title == "Notes page"
    assert [" > ".join(d.path) for d in drafts] == ["Notes page", "Notes page > Part"]


def test_empty_sections_are_dropped():
    _, drafts = sections_of("markdown", "# Doc\n\n## Empty\n\n## Full\n\nText.\n")
    assert [d.title for d in drafts] == ["Full"]


def test_malformed_html_keeps_its_text():
    _, body = main_content((SITE / "malformed.html").read_text())
    title, drafts = sections_of("html", body)
    assert title == "Broken Page"
    text = " ".join(d.content for d in drafts)
    assert "gasket seals two flanges" in text
    assert "unclosed tags" in text


def test_blocks_inside_a_link_keep_headings_and_word_boundaries():
    html = (
        "<h1>Doc</h1><h2>Cards</h2>"
        '<a href="a.html"><h3>First card</h3><p>Describes the first thing.</p></a>'
    )
    _, drafts = sections_of("html", html)
    assert "Doc > Cards > First card" in by_path(drafts)
    assert "cardDescribes" not in " ".join(d.content for d in drafts)


def test_malformed_html_heading_inside_unclosed_inline_is_a_section():
    _, body = main_content((SITE / "malformed.html").read_text())
    _, drafts = sections_of("html", body)
    assert "Still parsed" in [d.title for d in drafts]
    assert "parsedThe" not in " ".join(d.content for d in drafts)


def test_lists_and_tables_become_text():
    html = (
        "<h2>Data</h2><ul><li>alpha <b>one</b></li><li>beta</li></ul>"
        "<table><tr><th>key</th><th>value</th></tr><tr><td>a</td><td>1</td></tr></table>"
    )
    _, drafts = sections_of("html", html)
    content = drafts[0].content
    assert "- alpha one" in content and "- beta" in content
    assert "key | value" in content and "a | 1" in content


# Categories and links


def test_category_of():
    assert category_of("https://docs.python.org/3/library/os.html") == "library"
    assert category_of("https://example.org/index.html") == "example.org"
    assert category_of("https://example.org/") == "example.org"
    assert category_of("file:///work/project/docs/intro.md") == "docs"


def test_page_links_of_html_and_markdown():
    html_links = page_links("html", '<p><a href="a.html">the <b>A</b> page</a> <a>no href</a></p>')
    assert html_links == [("a.html", "the A page")]
    md = (
        'See [guide](guide.md#setup), [site](<https://x.org/y> "Title") '
        "and <a href='raw.html'>raw</a>."
    )
    assert [href for href, _ in page_links("markdown", md)] == [
        "guide.md#setup",
        "https://x.org/y",
        "raw.html",
    ]


def test_internal_links_resolve_relative_links_and_drop_the_rest():
    index, guide, readme = BASE + "index.html", BASE + "guide.html", BASE + "readme.md"
    old_guide = "https://docs.example.org/old-guide"
    articles = [
        {"url": index, "final_url": index},
        # Listed under its old address: links resolve against where it ended up.
        {"url": old_guide, "final_url": guide},
        {"url": readme, "final_url": readme},
    ]
    raw = [
        (index, index, "guide.html#setup", "user guide"),  # fragment dropped
        (index, index, "/docs/readme.md", "readme"),  # absolute path
        (index, index, "guide.html", "again"),  # duplicate edge
        (index, index, "index.html", "self"),  # self-link
        (index, index, "#concepts", "anchor"),  # in-page anchor
        (index, index, "https://elsewhere.org/docs/guide.html", "external"),
        (index, index, "mailto:team@example.org", "mail"),
        (index, index, "other.html", "not in the pack"),
        (old_guide, guide, "index.html", "home page"),  # relative to the final URL
        (readme, readme, "HTTPS://DOCS.EXAMPLE.ORG/old-guide", "old address"),
    ]
    links = internal_links(articles, raw)
    edges = [(link["source_url"], link["target_url"], link["anchor_text"]) for link in links]
    assert edges == [
        (index, old_guide, "user guide"),
        (index, readme, "readme"),
        (old_guide, index, "home page"),
        (readme, old_guide, "old address"),
    ]
    assert all(link["link_type"] == "internal" for link in links)


def test_links_between_the_site_pages():
    pages = {}
    for name in ("index.html", "guide.html"):
        _, body = main_content((SITE / name).read_text())
        pages[BASE + name] = ("html", body)
    pages[BASE + "readme.md"] = ("markdown", (SITE / "readme.md").read_text())
    articles = [{"url": url, "final_url": url} for url in pages]
    raw = [
        (url, url, href, text)
        for url, (fmt, body) in pages.items()
        for href, text in page_links(fmt, body)
    ]
    edges = {
        (s["source_url"].rsplit("/", 1)[-1], s["target_url"].rsplit("/", 1)[-1])
        for s in internal_links(articles, raw)
    }
    # index's nav link to itself was stripped with the nav; its header link to "/" is no page.
    assert edges == {
        ("index.html", "guide.html"),
        ("index.html", "readme.md"),
        ("guide.html", "index.html"),
        ("readme.md", "index.html"),
    }


def test_title_falls_back_to_title_tag_then_first_heading_then_url():
    body = "## Setup\n\nInstall it with pip before the first run of the tool.\n"
    assert split_sections(markdown_blocks("# Real\n\n" + body), "Tag", "url name")[0] == "Real"
    assert split_sections(markdown_blocks(body), "Tag", "url name")[0] == "Tag"
    assert split_sections(markdown_blocks(body), None, "url name")[0] == "Setup"
    assert split_sections(markdown_blocks("just text here"), None, "url name")[0] == "url name"


# Hostile pages


def test_a_page_nested_5000_elements_deep_is_parsed_without_recursion_error():
    _, body = main_content(deep_page())
    blocks = list(html_blocks(body))
    assert blocks == [
        ("heading", 1, "Deep Page"),
        ("text", 0, "The deepest paragraph explains the flange calibration of the deep widget."),
    ]


def test_deeply_nested_list_items_keep_one_marker_per_level():
    depth = 3000
    html = "<ul><li>" * depth + "deep item" + "</li></ul>" * depth
    assert list(html_blocks(html)) == [("text", 0, "- " * depth + "deep item")]


def test_an_empty_page_has_no_main_content():
    assert main_content("<html><head><title>Empty</title></head><body></body></html>") == (
        "Empty",
        "",
    )
    assert main_content("<html><body><main> <img src='x.png'> </main></body></html>")[1] == ""


def test_one_page_the_parser_cannot_read_fails_alone():
    good = {
        "url": "https://docs.example.org/a.html",
        "final_url": "https://docs.example.org/a.html",
        "format": "markdown",
        "body": "# A\n\nSome text about gaskets.\n",
        "title_hint": None,
        "content_hash": "h",
    }
    unreadable = {**good, "url": "https://docs.example.org/b.html", "format": "html", "body": None}
    parsed = parse_pages([unreadable, good])
    assert [a["url"] for a in parsed.articles] == [good["url"]]
    assert [f["url"] for f in parsed.failures] == [unreadable["url"]]
    assert parsed.failures[0]["error"].startswith("TypeError")
