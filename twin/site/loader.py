"""Load a site YAML file into a validated :class:`Site`.

Every failure raises :class:`SiteError`, whose message names the file, the 1-based line and the
field, for example::

    site.yaml:42: halls[0].rows[1].racks[3].nodes[0].model: unknown node model 'HGX-X'; ...

Lines come from the composed YAML node tree: each key path (a tuple of keys and list indices)
maps to the line of its key (mapping values) or item (list entries). A pydantic error's ``loc``
is mapped to the deepest prefix that has a line, so a missing field points at the object that
lacks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from twin.redact import parse_error_text
from twin.site.model import Loc, Site, _dotted

__all__ = ["SiteError", "SiteIssue", "load_site"]

# Error types whose message already says what was wrong with the value.
_NO_INPUT_ECHO = {"missing", "extra_forbidden", "value_error", "assertion_error", "site_reference"}


@dataclass(frozen=True)
class SiteIssue:
    """One problem in a site file: 1-based line (None if unknown), field path, message."""

    line: int | None
    field: str
    message: str

    def render(self, path: str) -> str:
        where = f"{path}:{self.line}" if self.line is not None else path
        return (
            f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        )


class SiteError(ValueError):
    """A site file that cannot be read, parsed or validated; lists every issue found."""

    def __init__(self, path: str | Path, issues: list[SiteIssue]) -> None:
        self.path = str(path)
        self.issues = list(issues)
        lines = [i.render(self.path) for i in self.issues]
        if len(lines) > 1:
            lines.insert(0, f"{self.path}: {len(lines)} errors in site file")
        super().__init__("\n".join(lines))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.issues))


#: libyaml's parser where PyYAML was built with it (the wheels are): 3x faster on a generated
#: 100,000-GPU site (4.3 MB: 3.9 s against 12.9 s), with the same nodes and line marks; a file
#: it refuses is parsed again by PyYAML's, whose error messages the site errors quote
_COMPOSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_site(path: str | Path) -> Site:
    """Read, parse and validate a site YAML file."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SiteError(name, [SiteIssue(None, "", "site file not found")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SiteError(name, [SiteIssue(None, "", f"cannot read site file: {exc}")]) from None

    try:
        try:
            root = yaml.compose(text, Loader=_COMPOSER)
        except yaml.YAMLError:  # PyYAML's own parser again, for its clearer message
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = _construct(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        raise SiteError(name, [_yaml_issue(exc)]) from None
    except yaml.YAMLError as exc:
        issue = SiteIssue(None, "", f"invalid YAML: {parse_error_text(exc)}")
        raise SiteError(name, [issue]) from None

    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        line = root.start_mark.line + 1 if root is not None else None
        message = f"top level must be a mapping of site fields (name, halls, ...), got {got}"
        raise SiteError(name, [SiteIssue(line, "", message)])

    assert root is not None  # data is a mapping, so there was a document
    lines: dict[Loc, int] = {(): root.start_mark.line + 1}
    duplicates: list[SiteIssue] = []
    _index(root, (), lines, duplicates, set())
    if duplicates:
        raise SiteError(name, duplicates)

    try:
        return Site.model_validate(data)
    except ValidationError as exc:
        issues = [_pydantic_issue(err, lines) for err in exc.errors()]
        issues.sort(key=lambda i: i.line if i.line is not None else 1 << 62)
        raise SiteError(name, issues) from None


def _construct(root: yaml.Node) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(root)
    finally:
        loader.dispose()


def _yaml_issue(exc: yaml.MarkedYAMLError) -> SiteIssue:
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark is not None else None
    message = exc.problem or exc.context or "syntax error"
    if exc.context and exc.problem and exc.context_mark is not None:
        message += f" ({exc.context} at line {exc.context_mark.line + 1})"
    return SiteIssue(line, "", f"invalid YAML: {message}")


def _index(
    node: yaml.Node,
    path: Loc,
    lines: dict[Loc, int],
    duplicates: list[SiteIssue],
    active: set[int],
) -> None:
    """Record the line of every key path under ``node``; collect duplicate mapping keys."""
    if id(node) in active:  # a recursive alias: do not loop
        return
    active.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                for merged in _merge_sources(value_node):
                    for k, v in merged.value:
                        if isinstance(k, yaml.ScalarNode) and (*path, k.value) not in lines:
                            lines[(*path, k.value)] = k.start_mark.line + 1
                            _index(v, (*path, k.value), lines, duplicates, active)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key, line = key_node.value, key_node.start_mark.line + 1
            if key in seen:
                duplicates.append(
                    SiteIssue(
                        line, _dotted((*path, key)), f"duplicate key (first at line {seen[key]})"
                    )
                )
                continue
            seen[key] = line
            lines[(*path, key)] = line
            _index(value_node, (*path, key), lines, duplicates, active)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            _index(item, (*path, i), lines, duplicates, active)
    active.discard(id(node))


def _merge_sources(node: yaml.Node) -> list[yaml.MappingNode]:
    if isinstance(node, yaml.MappingNode):
        return [node]
    if isinstance(node, yaml.SequenceNode):
        return [n for n in node.value if isinstance(n, yaml.MappingNode)]
    return []


def _pydantic_issue(err: Any, lines: dict[Loc, int]) -> SiteIssue:
    loc: Loc = tuple(err["loc"])
    line = None
    for depth in range(len(loc), -1, -1):
        if loc[:depth] in lines:
            line = lines[loc[:depth]]
            break
    message: str = err["msg"]
    if err["type"] == "value_error":
        message = message.removeprefix("Value error, ")
    elif err["type"] == "assertion_error":
        message = message.removeprefix("Assertion failed, ")
    value = err.get("input")
    if err["type"] not in _NO_INPUT_ECHO and (
        value is None or isinstance(value, str | int | float)
    ):
        shown = repr(value)
        message += f" (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
    return SiteIssue(line, _dotted(loc), message)
