"""Pack folders: urls.txt parsing, pack names, unknown packs and kg_config.json validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kpack.config import FetchConfig, PackConfig, load_config, settings_reference
from kpack.packs import (
    PackError,
    list_packs,
    normalize_url,
    pack_dir,
    parse_urls,
    validate_pack_name,
)

URLS = """\
# Widget docs
https://docs.example.org/a

docs.python.org/3/tutorial/
https://example.org/a https://example.org/b
ftp://example.org/file.txt
https:///no-host
HTTPS://DOCS.EXAMPLE.ORG/a#install
file://server/share/doc.md
mailto:team@example.org
   https://docs.example.org/b
http://docs.example.org:80/c
http://docs.example.org/c
"""


def test_parse_urls_keeps_good_lines_and_reports_bad_ones_with_line_numbers(tmp_path: Path):
    sources, problems = parse_urls(URLS, tmp_path)
    assert [(s.line_no, s.url) for s in sources] == [
        (2, "https://docs.example.org/a"),
        (11, "https://docs.example.org/b"),
        (12, "http://docs.example.org:80/c"),
    ]
    assert [(p.line_no, p.reason) for p in problems] == [
        (4, "not a URL (expected http://, https:// or file:)"),
        (5, "a line holds one URL and no spaces (write a space in a path as %20)"),
        (6, "unsupported scheme 'ftp' (use http, https or file)"),
        (7, "URL has no host"),
        (8, "duplicate of line 2"),
        (9, "file URLs must not name a host"),
        (10, "unsupported scheme 'mailto' (use http, https or file)"),
        (13, "duplicate of line 12"),
    ]
    assert str(problems[0]) == (
        "urls.txt line 4: not a URL (expected http://, https:// or file:): "
        "'docs.python.org/3/tutorial/'"
    )


def test_parse_urls_of_an_empty_or_comment_only_file(tmp_path: Path):
    assert parse_urls("", tmp_path) == ([], [])
    assert parse_urls("# nothing yet\n\n   \n", tmp_path) == ([], [])


def test_relative_file_urls_resolve_against_the_pack_folder(tmp_path: Path):
    folder = tmp_path / "packs" / "demo"
    text = "file:notes/intro.md\nfile:../../docs/index.md\nfile:///abs/page.md\n"
    sources, problems = parse_urls(text, folder)
    assert problems == []
    assert [s.url for s in sources] == [
        (folder / "notes" / "intro.md").as_uri(),
        (tmp_path / "docs" / "index.md").as_uri(),
        "file:///abs/page.md",
    ]


def test_file_urls_that_name_the_same_file_are_duplicates(tmp_path: Path):
    folder = tmp_path / "pack"
    text = f"file:notes.md\n{(folder / 'notes.md').as_uri()}\n"
    sources, problems = parse_urls(text, folder)
    assert len(sources) == 1
    assert [(p.line_no, p.reason) for p in problems] == [(2, "duplicate of line 1")]


def test_an_unparseable_url_is_a_reported_line_not_a_crash(tmp_path: Path):
    sources, problems = parse_urls("https://ok.example.org/\nhttp://[::1/x\n", tmp_path)
    assert [s.line_no for s in sources] == [1]
    assert [p.line_no for p in problems] == [2]


def test_normalize_url():
    assert normalize_url("HTTPS://Docs.Example.org:443/a#frag") == "https://docs.example.org/a"
    assert normalize_url("http://example.org") == "http://example.org/"
    assert normalize_url("http://example.org/a?x=1#y") == "http://example.org/a?x=1"
    assert normalize_url("http://example.org:8080/a") == "http://example.org:8080/a"


@pytest.mark.parametrize("name", ["demo", "python-expert", "go_notes", "team-handbook-2", "a" * 64])
def test_valid_pack_names(name):
    assert validate_pack_name(name) == name


@pytest.mark.parametrize(
    "name", ["../x", "a/b", "", "..", ".", "a\\b", "a b", "-x", "_x", ".hidden", "a" * 65, "x/.."]
)
def test_invalid_pack_names_are_rejected(name):
    with pytest.raises(PackError, match="invalid pack name"):
        validate_pack_name(name)


def test_a_name_with_a_trailing_newline_is_rejected():
    with pytest.raises(PackError):
        validate_pack_name("demo\n")


def make_pack(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "urls.txt").write_text("https://example.org/\n")
    return folder


def test_list_packs_lists_folders_with_urls_txt(tmp_path: Path):
    make_pack(tmp_path, "beta")
    make_pack(tmp_path, "alpha")
    (tmp_path / "no-urls").mkdir()
    make_pack(tmp_path, ".hidden")
    (tmp_path / "stray.txt").write_text("x")
    assert list_packs(tmp_path) == ["alpha", "beta"]
    assert list_packs(tmp_path / "missing") == []


def test_pack_dir_of_a_known_pack(tmp_path: Path):
    folder = make_pack(tmp_path, "demo")
    assert pack_dir("demo", tmp_path) == folder


def test_unknown_pack_lists_the_available_ones(tmp_path: Path):
    make_pack(tmp_path, "python-expert")
    make_pack(tmp_path, "demo")
    (tmp_path / "half-made").mkdir()
    with pytest.raises(PackError) as caught:
        pack_dir("pyton-expert", tmp_path)
    assert str(caught.value) == (
        f"unknown pack 'pyton-expert' in {tmp_path} (available: demo, python-expert)"
    )
    with pytest.raises(PackError, match=r"^no urls.txt in .*half-made: a pack folder lists"):
        pack_dir("half-made", tmp_path)  # a folder, not a typo: say what it lacks


def test_unknown_pack_when_there_are_none(tmp_path: Path):
    with pytest.raises(PackError, match=r"\(available: none\)"):
        pack_dir("demo", tmp_path)


def test_pack_dir_refuses_a_path_as_name(tmp_path: Path):
    make_pack(tmp_path / "packs", "demo")
    with pytest.raises(PackError, match="invalid pack name"):
        pack_dir("../packs/demo", tmp_path / "other")


# kg_config.json


def write_config(folder: Path, content) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = content if isinstance(content, str) else json.dumps(content)
    (folder / "kg_config.json").write_text(text)
    return folder


def test_no_config_file_gives_the_defaults(tmp_path: Path):
    config = load_config(tmp_path)
    assert config == PackConfig()
    assert config.chunk_tokens == 256 and config.chunk_overlap_tokens == 48
    assert config.fetch == FetchConfig()
    assert config.fetch.allow_private_hosts is False


def test_valid_overrides_are_applied(tmp_path: Path):
    write_config(
        tmp_path,
        {
            "extraction": "offline",
            "chunk_tokens": 128,
            "chunk_overlap_tokens": 16,
            "max_failed_fraction": 1,
            "fetch": {
                "timeout_s": 5,
                "retries": 0,
                "allow_private_hosts": True,
                "file_roots": ["../..", "/srv/notes"],
            },
        },
    )
    config = load_config(tmp_path)
    assert config.extraction == "offline"
    assert (config.chunk_tokens, config.chunk_overlap_tokens) == (128, 16)
    assert config.max_failed_fraction == 1
    assert config.embedding_model == "default"
    assert config.fetch.timeout_s == 5 and config.fetch.retries == 0
    assert config.fetch.allow_private_hosts is True
    assert config.fetch.file_roots == ("../..", "/srv/notes")
    assert config.fetch.max_bytes == FetchConfig().max_bytes


@pytest.mark.parametrize(
    ("content", "named", "suggested"),
    [
        ({"extration": "claude"}, "'extration'", "'extraction'"),
        ({"chunk_token": 64}, "'chunk_token'", "'chunk_tokens'"),
        ({"fetch": {"timeout": 5}}, "'fetch.timeout'", "'fetch.timeout_s'"),
        ({"query": {"reranker_alfa": 0.5}}, "'query.reranker_alfa'", "'query.reranker_alpha'"),
    ],
)
def test_unknown_keys_anywhere_are_errors_naming_the_closest_valid_key(
    tmp_path: Path, content, named, suggested
):
    write_config(tmp_path, content)
    with pytest.raises(PackError) as caught:
        load_config(tmp_path)
    message = str(caught.value)
    assert named in message and f"did you mean {suggested}" in message


def test_every_problem_is_reported_at_once(tmp_path: Path):
    write_config(tmp_path, {"extration": "claude", "chunk_token": 64})
    with pytest.raises(PackError) as caught:
        load_config(tmp_path)
    assert "'extration'" in str(caught.value) and "'chunk_token'" in str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        '{"max_failed_fraction": NaN}',
        '{"fetch": {"timeout_s": Infinity}}',
        '{"query": {"context_confidence_threshold": -Infinity}}',
    ],
)
def test_nan_and_infinities_are_errors(tmp_path: Path, text):
    write_config(tmp_path, text)
    with pytest.raises(PackError, match=r"kg_config\.json"):
        load_config(tmp_path)


def test_config_that_is_not_utf8_is_an_error(tmp_path: Path):
    (tmp_path / "kg_config.json").write_bytes(b'{"embedding_model": "caf\xe9"}')
    with pytest.raises(PackError, match="not UTF-8"):
        load_config(tmp_path)


def test_query_settings_are_validated_by_the_same_schema(tmp_path: Path):
    write_config(tmp_path, {"query": {"profile": "fastest"}})
    with pytest.raises(PackError, match=r"query\.profile must be one of"):
        load_config(tmp_path)
    write_config(tmp_path, {"query": {"context_confidence_threshold": 0.35, "num_docs": 3}})
    query = load_config(tmp_path).query
    assert query.context_confidence_threshold == 0.35 and query.num_docs == 3


def test_configuration_docs_are_generated_from_the_schema():
    docs = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    assert docs.read_text() == settings_reference(), (
        "docs/configuration.md is stale: run python -m kpack.config > docs/configuration.md"
    )


@pytest.mark.parametrize(
    "content",
    [
        {"chunk_tokens": "256"},
        {"chunk_tokens": 256.5},
        {"chunk_tokens": True},
        {"embedding_model": 3},
        {"max_failed_fraction": "0.5"},
        {"fetch": {"allow_private_hosts": "yes"}},
        {"fetch": {"allow_private_hosts": 1}},
        {"fetch": {"max_bytes": 1.5}},
        {"fetch": {"timeout_s": None}},
        {"fetch": {"file_roots": "../.."}},
        {"fetch": {"file_roots": [1]}},
        {"fetch": ["timeout_s"]},
        {"fetch": None},
    ],
)
def test_wrong_types_are_errors_naming_the_file(tmp_path: Path, content):
    write_config(tmp_path, content)
    with pytest.raises(PackError, match=r"kg_config\.json"):
        load_config(tmp_path)


def test_invalid_json_is_an_error_with_its_line(tmp_path: Path):
    write_config(tmp_path, '{\n  "chunk_tokens": 128,\n}\n')
    with pytest.raises(PackError, match=r"kg_config.json: not valid JSON .* line 3"):
        load_config(tmp_path)


@pytest.mark.parametrize("content", ["[1, 2]", '"text"', "null"])
def test_json_that_is_not_an_object_is_an_error(tmp_path: Path, content):
    write_config(tmp_path, content)
    with pytest.raises(PackError, match="expected a JSON object"):
        load_config(tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"extraction": "gpt"}, "extraction: Input should be .auto., .claude. or .offline."),
        ({"chunk_tokens": 64, "chunk_overlap_tokens": 64}, "chunk_overlap_tokens < chunk_tokens"),
        ({"chunk_overlap_tokens": 0}, "chunk_overlap_tokens"),
        ({"schedule": "every monday"}, "schedule must be a cron string"),
    ],
)
def test_invalid_values_are_errors(tmp_path: Path, content, message):
    write_config(tmp_path, content)
    with pytest.raises(PackError, match=message):
        load_config(tmp_path)


@pytest.mark.parametrize("fetch", [{"retries": -1}, {"max_workers": 0}, {"timeout_s": 0}])
def test_out_of_range_fetch_values_are_errors(tmp_path: Path, fetch):
    write_config(tmp_path, {"fetch": fetch})
    with pytest.raises(PackError, match=r"kg_config\.json"):
        load_config(tmp_path)
