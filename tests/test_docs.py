"""The documentation: docs/config.md is what src/cotrain/config.py gives (regenerate with `make docs`), every
relative link of README.md and docs/ points to a file that exists, and the README stays a guide (200 lines at
most; the details live in docs/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cotrain import config_docs
from cotrain.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

#: [text](target) and [text](target "title"); images too. Code spans and fenced blocks are left out first.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def relative_links(markdown: str) -> list[str]:
    """The link targets of a markdown text that name a file of this repository (no scheme, no bare anchor),
    without their #anchor."""
    text = CODE.sub("", FENCE.sub("", markdown))
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


def test_relative_links_skips_urls_anchors_and_code():
    text = ("[a](docs/x.md) [b](https://e.org/y.md) [c](#here) ![d](img/p.png \"t\") [e](../z.md#part)\n"
            "`[f](not/a/link.md)`\n```\n[g](in/a/block.md)\n```\n[h](mailto:a@b.c)\n")
    assert relative_links(text) == ["docs/x.md", "img/p.png", "../z.md"]


def test_config_md_is_generated_from_config_py():
    page = ROOT / "docs" / "config.md"
    assert page.exists(), "docs/config.md is missing: run `make docs`"
    assert page.read_text(encoding="utf-8") == config_docs.render(), \
        "docs/config.md is stale: run `make docs` (python -m cotrain.config_docs)"


def test_config_md_names_every_section_and_field():
    text = config_docs.render()
    for name, model in config_docs.sections():
        fields = RunConfig.model_fields if model is None else model.model_fields
        if model is not None:
            assert f"## [{name}]" in text
        for field in fields:
            if model is None and field in dict(config_docs.sections()):
                continue
            assert f"| `{field}` |" in text, f"{name or 'top level'}.{field} is not documented"


def test_field_comments_come_from_the_source():
    from cotrain.config import AveragingConfig, DataConfig

    comments = config_docs.field_comments(DataConfig)
    assert comments["seq_len"].startswith("truncated backpropagation through time")
    assert comments["val_fraction"] == ""  # no `#:` line above it
    # a comment of several lines is one description; a plain `#` line is not a description
    assert "rounds 3x shorter on loopback" in config_docs.field_comments(AveragingConfig)["group_formation"]


def test_the_example_in_config_md_is_a_valid_run_config():
    block = re.search(r"^```toml\n(.*?)^```", config_docs.render(), re.S | re.M).group(1)
    RunConfig.from_toml(block)


def test_the_readme_run_config_example_is_valid():
    block = re.search(r"^```toml\n(.*?)^```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S | re.M).group(1)
    RunConfig.from_toml(block)


def test_check_mode_reports_a_stale_page(tmp_path, capsys):
    page = tmp_path / "config.md"
    assert config_docs.main(["--out", str(page), "--check"]) == 1
    assert "missing" in capsys.readouterr().err
    assert config_docs.main(["--out", str(page)]) == 0
    assert config_docs.main(["--out", str(page), "--check"]) == 0
    page.write_text(page.read_text() + "edited by hand\n")
    assert config_docs.main(["--out", str(page), "--check"]) == 1
    assert f"{page} is stale" in capsys.readouterr().err


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_points_to_a_file(page):
    missing = [target for target in relative_links(page.read_text(encoding="utf-8"))
               if target and not (page.parent / target).exists()]
    assert missing == [], f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_the_readme_is_at_most_200_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the details to docs/"
