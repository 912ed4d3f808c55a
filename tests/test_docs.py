"""Every ``docs/physics.md §N.M`` citation in the source tree names a section that exists.

A citation is the text ``docs/physics.md`` followed, in the same sentence, by one or more
section numbers (``docs/physics.md §2.2, §2.3 and §9.2``; the sentence may run over several
comment or docstring lines). A file that names ``docs/physics.md`` anywhere uses bare ``§N.M``
for that document too (the catalog's per-value comments do), so in such a file every ``§N.M``
is checked. A section exists when a heading of docs/physics.md starts with it
(``### §2.2 Steady state ...``).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "physics.md"
#: What is scanned: text files of the project, outside tool and environment directories.
SUFFIXES = {".py", ".md", ".rst", ".txt", ".yaml", ".yml", ".toml", ".cfg", ".html", ".j2"}
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", ".pytest_cache", ".ruff_cache"}
#: This file: its examples cite missing sections on purpose.
SELF = Path(__file__).resolve()

_HEADING = re.compile(r"^#{1,6}\s+§(\d+(?:\.\d+)*)\s", re.MULTILINE)
_CITE = re.compile(r"docs/physics\.md")
_SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
#: The end of the sentence a citation sits in: a full stop before white space, a blank line
#: (possibly with comment markers), or the next citation.
_SENTENCE_END = re.compile(r"\.(?=\s)|\n[ \t#*>/-]*\n|docs/physics\.md")


def doc_sections(doc_text: str) -> set[str]:
    """Section numbers that head a section of the document (``"2.2"``, ``"11"``)."""
    return set(_HEADING.findall(doc_text))


def cited_sections(text: str) -> list[tuple[int, str]]:
    """(line number, section) of every docs/physics.md citation in ``text``."""
    out: list[tuple[int, str]] = []

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    if not _CITE.search(text):
        return out
    # every bare section number in a file that cites the document is a citation of it
    for m in _SECTION.finditer(text):
        out.append((line_of(m.start()), m.group(1)))
    return out


def explicit_citations(text: str) -> list[tuple[int, str]]:
    """(line number, section) of the sections that follow ``docs/physics.md`` in a sentence."""
    out: list[tuple[int, str]] = []
    for m in _CITE.finditer(text):
        rest = text[m.end() : m.end() + 400]
        end = _SENTENCE_END.search(rest)
        sentence = rest if end is None else rest[: end.start()]
        for s in _SECTION.finditer(sentence):
            out.append((text.count("\n", 0, m.end() + s.start()) + 1, s.group(1)))
    return out


def missing_citations(files: dict[str, str], sections: set[str]) -> list[str]:
    """``path:line: §N.M`` for every citation whose section is not in ``sections``."""
    bad = []
    for path, text in files.items():
        for line, sec in cited_sections(text):
            if sec not in sections:
                bad.append(f"{path}:{line}: §{sec}")
    return bad


def _project_files() -> dict[str, str]:
    files = {}
    for p in REPO.rglob("*"):
        rel = p.relative_to(REPO)
        if any(part in SKIP_DIRS for part in rel.parts) or p.suffix not in SUFFIXES:
            continue
        if p.resolve() == SELF or not p.is_file() or p.stat().st_size > 2_000_000:
            continue
        files[str(rel)] = p.read_text(encoding="utf-8", errors="replace")
    return files


def test_every_physics_citation_names_an_existing_section() -> None:
    sections = doc_sections(DOC.read_text(encoding="utf-8"))
    files = _project_files()
    bad = missing_citations(files, sections)
    assert not bad, "citations of sections docs/physics.md does not have:\n" + "\n".join(bad)
    # the scan did find the citations (a parser that finds none would pass vacuously)
    explicit = [c for text in files.values() for c in explicit_citations(text)]
    assert len(explicit) >= 60, f"only {len(explicit)} docs/physics.md citations found"
    assert {"1.3", "2.2", "3.6", "4.2", "9.5"} <= {sec for _, sec in explicit}


def test_a_citation_of_a_missing_section_is_reported() -> None:
    sections = doc_sections("# Title\n\n## §1 Power\n\n### §1.3 Curve\n\n### §2.10 Other\n")
    assert sections == {"1", "1.3", "2.10"}
    files = {
        "a.py": '"""Model.\n\nReferences\n----------\ndocs/physics.md §1.3 and §9.9.\n"""\n',
        "b.py": "X = 1  # docs/physics.md §2.1, a section that is not there\n",
        "c.py": "# docs/physics.md\n# §1 applies, and so does §2.10\n",
        "d.py": "Y = 2  # physics.md §7.7 of some other file: not a citation of docs/\n",
    }
    assert missing_citations(files, sections) == ["a.py:5: §9.9", "b.py:1: §2.1"]


def test_a_citation_runs_over_lines_to_the_end_of_its_sentence() -> None:
    text = (
        "    Notes: docs/physics.md §2.2 (steady state above the local coolant),\n"
        "    §2.3 and §9.2 (time constants). Later §5.5 is another sentence.\n"
    )
    assert [s for _, s in explicit_citations(text)] == ["2.2", "2.3", "9.2"]
