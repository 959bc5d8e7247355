"""Secure, strict reading of an XML config: element paths, cardinality, ``${VAR}``, located errors.

Generic plumbing for :mod:`replication.config.parser`, which holds the schema,
and :mod:`replication.config.values`, which parses the values. Each :class:`Node`
knows its path (``AMPSConfig/Replication/Destination[2]``) so every error reads
``<file>:<line>: <path>: <problem>. Fix: <fix>``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Concatenate, NoReturn, ParamSpec, TypeVar

from lxml import etree

from replication.config.model import Source
from replication.errors import ConfigError

ROOT = "AMPSConfig"
_VAR = re.compile(r"\$\{([^}]*)\}")
_VAR_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?\Z", re.S)

_P = ParamSpec("_P")
_T = TypeVar("_T")


@dataclass(frozen=True)
class Ctx:
    """The file being read: its name as the user gave it, its directory, the environment."""

    file: str
    base_dir: str
    env: Mapping[str, str]


def config_error(ctx: Ctx, line: int | None, where: str, what: str, fix: str) -> ConfigError:
    """``<file>:<line>: <where>: <what>. Fix: <fix>`` as a :class:`ConfigError`."""
    location = f"{ctx.file}:{line}" if line else ctx.file
    prefix = f"{location}: {where}: " if where else f"{location}: "
    what = what.rstrip(".")
    end = " " if what.endswith("?") else ". "
    return ConfigError(f"{prefix}{what}{end}Fix: {fix}", file=ctx.file, line=line)


_SYNTAX_FIXES: tuple[tuple[str, str], ...] = (
    ("Document is empty", "the file is empty: write an <AMPSConfig> document (see conf/replication.xsd)"),
    ("tag mismatch", "make the closing tag match its opening tag (element names are case-sensitive)"),
    ("Premature end of data", "close every open element; the file ends inside an element"),
    ("EndTag", "close every open element with its </Name> tag"),
    ("Extra content at the end", "keep a single <AMPSConfig> root element; put everything inside it"),
    ("EntityRef: no name", "write a literal & as &amp; (and < as &lt;)"),
    ("Entity", "entities are not supported: write & as &amp;, < as &lt;, > as &gt;"),
    ("StartTag: invalid element name", "write a literal < in a value as &lt;"),
    ("AttValue", "quote attribute values, or better, remove attributes: values go in elements"),
)


def read_root(data: bytes, ctx: Ctx, expected: str = ROOT) -> Node:
    """Parse ``data`` without DTDs, entities or network; return the checked root (``<AMPSConfig>``, or the
    ``expected`` element of a file holding one section)."""
    parser = etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        collect_ids=False,
    )
    try:
        root_el = etree.fromstring(data, parser)
    except etree.XMLSyntaxError as exc:
        line, column = exc.position if exc.position else (exc.lineno or 1, 0)
        message = re.sub(r", line \d+, column \d+$", "", (exc.msg or str(exc)).strip())
        fix = next((f for key, f in _SYNTAX_FIXES if key in message), None)
        fix = fix or f"correct the XML at line {line}, column {column}"
        raise config_error(ctx, line or 1, "", f"XML syntax error at column {column}: {message}", fix) from None
    docinfo = root_el.getroottree().docinfo
    if docinfo.doctype or docinfo.internalDTD is not None:
        raise config_error(
            ctx,
            _line_of(data, b"<!DOCTYPE"),
            "",
            "the file declares a <!DOCTYPE>; DTDs and <!ENTITY> declarations are refused "
            "(they allow entity-expansion and external-file attacks)",
            "remove the <!DOCTYPE ...> declaration and write values directly; "
            "use ${VAR} to take a value from the environment",
        )
    root = Node(root_el, root_el.tag if isinstance(root_el.tag, str) else expected, ctx)
    if root_el.tag != expected:
        tag = str(root_el.tag)
        if tag.endswith("}" + expected):
            root.fail(f"<{expected}> has an XML namespace ({tag})", "remove the xmlns=... declaration")
        root.fail(f"the root element is <{tag}>, expected <{expected}>", f"rename <{tag}> to <{expected}>")
    for attr in root_el.attrib:
        # xsi:noNamespaceSchemaLocation lets editors validate against conf/replication.xsd.
        if not attr.startswith("{http://www.w3.org/2001/XMLSchema-instance}"):
            root.fail_attribute(attr)
    return root


def _line_of(data: bytes, needle: bytes) -> int:
    index = data.find(needle)
    return data.count(b"\n", 0, index) + 1 if index >= 0 else 1


@dataclass(frozen=True)
class Card:
    """How often a child element may appear, and an example for the "missing" fix."""

    required: bool = False
    repeat: bool = False
    example: str = ""


def one(example: str) -> Card:
    return Card(required=True, example=example)


def some(example: str) -> Card:
    return Card(required=True, repeat=True, example=example)


OPT = Card()
MANY = Card(repeat=True)


class Node:
    """One element plus its path (``AMPSConfig/Replication/Destination[2]``) for messages."""

    __slots__ = ("ctx", "el", "path")

    def __init__(self, el: etree._Element, path: str, ctx: Ctx) -> None:
        self.el = el
        self.path = path
        self.ctx = ctx

    @property
    def tag(self) -> str:
        return str(self.el.tag)

    @property
    def line(self) -> int:
        return self.el.sourceline or 1

    def source(self) -> Source:
        return Source(self.ctx.file, self.line)

    def error(self, what: str, fix: str, *, line: int | None = None) -> ConfigError:
        """The :class:`ConfigError` placed at this element (or at ``line`` within it)."""
        return config_error(self.ctx, line or self.line, self.path, what, fix)

    def fail(self, what: str, fix: str, *, line: int | None = None) -> NoReturn:
        raise self.error(what, fix, line=line)

    def fail_attribute(self, attr: str) -> NoReturn:
        self.fail(
            f"attribute {attr}='{self.el.get(attr)}' is not used by this configuration",
            "remove the attribute; values are written as child elements, e.g. <Name>value</Name>",
        )

    def _check_plain(self) -> None:
        for attr in self.el.attrib:
            self.fail_attribute(attr)

    def text(self) -> str:
        """The element's value: text only, ``${VAR}`` substituted, stripped, not empty."""
        self._check_plain()
        parts = [self.el.text or ""]
        for child in self.el:
            if isinstance(child.tag, str):
                self.fail(
                    f"<{self.tag}> takes a text value, but contains the element <{child.tag}>",
                    f"remove <{child.tag}> from <{self.tag}>, or move it to where it belongs",
                    line=child.sourceline,
                )
            _check_markup(self, child)
            parts.append(child.tail or "")
        raw = "".join(parts).strip()
        if not raw:
            self.fail(
                f"<{self.tag}> is empty",
                f"write a value between <{self.tag}> and </{self.tag}>, or remove the element if it is optional",
            )
        value = _substitute(self, raw).strip()
        if not value:
            self.fail(
                f"<{self.tag}> '{raw}' is empty once environment variables are substituted",
                "export a non-empty value for the variable, or give a default: ${NAME:-value}",
            )
        return value

    def read(self, parse: Callable[Concatenate[str, Node, _P], _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """The element's :meth:`text` parsed by ``parse`` (a :mod:`replication.config.values` parser),
        its errors placed at this element."""
        return parse(self.text(), self, *args, **kwargs)

    def children(self, schema: Mapping[str, Card]) -> Kids:
        """Group child elements by name, refusing unknown, repeated, missing ones and stray text."""
        self._check_plain()
        if self.el.text and self.el.text.strip():
            self._stray_text(self.el.text, self.line)
        groups: dict[str, list[Node]] = {name: [] for name in schema}
        for child in self.el:
            if child.tail and child.tail.strip():
                self._stray_text(child.tail, child.sourceline)
            if not isinstance(child.tag, str):
                _check_markup(self, child)
                continue
            tag = child.tag
            card = schema.get(tag)
            if card is None:
                Node(child, f"{self.path}/{tag}", self.ctx).fail(*_unknown(tag, self.tag, schema))
            found = groups[tag]
            path = f"{self.path}/{tag}[{len(found) + 1}]" if card.repeat else f"{self.path}/{tag}"
            node = Node(child, path, self.ctx)
            if found and not card.repeat:
                node.fail(
                    f"<{tag}> appears more than once in <{self.tag}> (first at line {found[0].line})",
                    f"keep a single <{tag}> in <{self.tag}>",
                )
            found.append(node)
        for name, card in schema.items():
            if card.required and not groups[name]:
                example = card.example or f"<{name}>...</{name}>"
                self.fail(
                    f"missing required element <{name}> in <{self.tag}>",
                    f"add {example} inside <{self.tag}>",
                )
        return Kids(groups)

    def _stray_text(self, text: str, line: int | None) -> NoReturn:
        self.fail(
            f"text '{text.strip()}' is not allowed directly inside <{self.tag}>",
            "put the value inside the child element it belongs to, or remove it",
            line=line,
        )


def _check_markup(parent: Node, child: etree._Element) -> None:
    """Comments are fine inside elements; processing instructions and entity references are not."""
    if child.tag is etree.Comment:
        return
    kind = "an entity reference" if child.tag is etree.Entity else "a processing instruction"
    parent.fail(
        f"<{parent.tag}> contains {kind} '{child}', which this configuration does not use",
        "remove it and write the value directly (use ${VAR} for values from the environment)",
        line=child.sourceline,
    )


def _unknown(tag: str, parent: str, schema: Mapping[str, Card]) -> tuple[str, str]:
    allowed = ", ".join(schema)
    guess, hint = did_you_mean(tag, schema, shown="<{}>")
    what = f"unknown element <{tag}> in <{parent}>; allowed here: {allowed}"
    if guess:
        return f"{what}{hint}", f"rename <{tag}> to <{guess}>"
    return what, f"remove <{tag}>, or rename it to one of the allowed elements"


def suggest(value: str, choices: Mapping[str, object] | tuple[str, ...]) -> str | None:
    by_lower = {c.lower(): c for c in choices}
    if value.lower() in by_lower:
        return by_lower[value.lower()]
    close = difflib.get_close_matches(value.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[close[0]] if close else None


def did_you_mean(
    value: str, choices: Mapping[str, object] | tuple[str, ...], *, shown: str = "'{}'"
) -> tuple[str | None, str]:
    """The choice closest to ``value`` (:func:`suggest`) and the ``; did you mean 'x'?`` that names it
    (``shown`` formats the choice), or ``(None, "")`` when none is close."""
    guess = suggest(value, choices)
    return guess, f"; did you mean {shown.format(guess)}?" if guess else ""


class Kids:
    """Children of one element, grouped by name (already checked against the schema)."""

    def __init__(self, groups: dict[str, list[Node]]) -> None:
        self._groups = groups

    def one(self, name: str) -> Node:
        return self._groups[name][0]

    def opt(self, name: str) -> Node | None:
        found = self._groups[name]
        return found[0] if found else None

    def all(self, name: str) -> list[Node]:
        return self._groups[name]

    def text(self, name: str, default: str | None = None) -> str | None:
        node = self.opt(name)
        return node.text() if node is not None else default


def _substitute(node: Node, raw: str) -> str:
    if "${" in _VAR.sub("", raw):
        node.fail(
            f"unterminated environment variable reference in '{raw}'",
            "close it with }, e.g. ${NAME}",
        )

    def replace(match: re.Match[str]) -> str:
        body = _VAR_BODY.match(match.group(1))
        if body is None:
            node.fail(
                f"malformed environment variable reference '{match.group(0)}' in '{raw}'",
                "write ${NAME} or ${NAME:-default}; NAME is letters, digits and _, not starting with a digit",
            )
        name, default = body.group(1), body.group(2)
        value = node.ctx.env.get(name)
        if value is None or (value == "" and default is not None):
            if default is None:
                node.fail(
                    f"environment variable ${{{name}}} used in '{raw}' is not defined",
                    f"export {name}=<value> before starting, or give a default: ${{{name}:-<value>}}",
                )
            return default
        return value

    return _VAR.sub(replace, raw)
