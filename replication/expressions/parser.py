"""The filter parser: text to syntax tree, with errors that point at the fault."""

from __future__ import annotations

import re
from dataclasses import dataclass

from replication.errors import ConfigError
from replication.expressions.syntax import (
    Between,
    BoolOp,
    Compare,
    Expr,
    Field,
    InList,
    IsNull,
    Like,
    Literal,
    Not,
    Operand,
)

__all__ = ["FilterSyntaxError", "canonical", "parse"]


class FilterSyntaxError(ConfigError):
    """A content filter does not parse; the message shows the filter with a caret under the fault."""

    def __init__(self, message: str, *, text: str = "", position: int = 0, file: str = "", line: int | None = None):
        super().__init__(message, file=file, line=line)
        self.text = text
        self.position = position

    def __reduce__(self):
        return (_rebuild_filter_error, (str(self), self.text, self.position, self.file, self.line))


def _rebuild_filter_error(message: str, text: str, position: int, file: str, line: int | None) -> FilterSyntaxError:
    return FilterSyntaxError(message, text=text, position=position, file=file, line=line)


_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<field>/[^\s()=<>!,'"/]+(?:/[^\s()=<>!,'"/]+)*)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*")
  | (?P<op>==|!=|<>|<=|>=|=|<|>)
  | (?P<punct>[(),+-])
  | (?P<word>[A-Za-z_][A-Za-z_0-9]*)
    """,
    re.VERBOSE,
)
_KEYWORDS = {"AND", "OR", "NOT", "IN", "BETWEEN", "LIKE", "IS", "NULL", "TRUE", "FALSE"}


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    pos: int


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            ch = text[pos]
            hint = "close the string with the same quote it opened with" if ch in "'\"" else "remove it or quote it"
            raise _error(text, pos, f"unexpected character {ch!r}: {hint}")
        kind = m.lastgroup or ""
        if kind == "word":
            word = m.group().upper()
            if word not in _KEYWORDS:
                raise _error(
                    text,
                    pos,
                    f"unknown word {m.group()!r}: fields start with '/' (e.g. /{m.group()}) "
                    "and strings are quoted (e.g. '" + m.group() + "')",
                )
            toks.append(_Tok("kw", word, pos))
        elif kind != "ws":
            toks.append(_Tok(kind, m.group(), pos))
        pos = m.end()
    toks.append(_Tok("end", "", len(text)))
    return toks


def _error(text: str, pos: int, problem: str) -> FilterSyntaxError:
    shown = text.replace("\n", " ")
    message = f"invalid filter at position {pos + 1}: {problem}\n    {shown}\n    {' ' * pos}^"
    return FilterSyntaxError(message, text=text, position=pos)


def _unquote(token: str) -> str:
    quote, body = token[0], token[1:-1]
    # Only an escaped quote is unescaped: backslashes belong to LIKE regexes ("^90\..*").
    return body.replace("\\" + quote, quote)


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def at_kw(self, *words: str) -> bool:
        return self.tok.kind == "kw" and self.tok.text in words

    def expect_kw(self, word: str, what: str) -> None:
        if not self.at_kw(word):
            raise self.fail(f"expected {word} {what}")
        self.take()

    def fail(self, problem: str) -> FilterSyntaxError:
        found = "the end of the filter" if self.tok.kind == "end" else repr(self.tok.text)
        return _error(self.text, self.tok.pos, f"{problem}, found {found}")

    def parse(self) -> Expr:
        if self.tok.kind == "end":
            raise _error(self.text, 0, "the filter is empty: remove the <Filter> element or write a condition")
        expr = self.or_expr()
        if self.tok.kind != "end":
            raise self.fail("expected AND, OR or the end of the filter")
        return expr

    def or_expr(self) -> Expr:
        items = [self.and_expr()]
        while self.at_kw("OR"):
            self.take()
            items.append(self.and_expr())
        return items[0] if len(items) == 1 else BoolOp("OR", tuple(_flatten("OR", items)))

    def and_expr(self) -> Expr:
        items = [self.not_expr()]
        while self.at_kw("AND"):
            self.take()
            items.append(self.not_expr())
        return items[0] if len(items) == 1 else BoolOp("AND", tuple(_flatten("AND", items)))

    def not_expr(self) -> Expr:
        if self.at_kw("NOT"):
            self.take()
            return Not(self.not_expr())
        return self.predicate()

    def predicate(self) -> Expr:
        if self.tok.kind == "punct" and self.tok.text == "(":
            self.take()
            inner = self.or_expr()
            if not (self.tok.kind == "punct" and self.tok.text == ")"):
                raise self.fail("expected ')' to close the '('")
            self.take()
            return inner
        start = self.tok
        left = self.operand("a condition")
        tok = self.tok
        if tok.kind == "op":
            self.take()
            op = {"==": "=", "<>": "!="}.get(tok.text, tok.text)
            return Compare(op, left, self.operand(f"a value after '{tok.text}'"))
        negated = False
        if self.at_kw("NOT"):
            self.take()
            negated = True
            if not self.at_kw("IN", "BETWEEN", "LIKE"):
                raise self.fail("expected IN, BETWEEN or LIKE after NOT")
        if self.at_kw("IN"):
            self.take()
            if not (self.tok.kind == "punct" and self.tok.text == "("):
                raise self.fail("expected '(' after IN")
            self.take()
            items = [self.operand("a value in the IN list")]
            while self.tok.kind == "punct" and self.tok.text == ",":
                self.take()
                items.append(self.operand("a value after ','"))
            if not (self.tok.kind == "punct" and self.tok.text == ")"):
                raise self.fail("expected ',' or ')' in the IN list")
            self.take()
            return InList(left, tuple(items), negated)
        if self.at_kw("BETWEEN"):
            self.take()
            low = self.operand("a lower bound after BETWEEN")
            self.expect_kw("AND", "between the bounds of BETWEEN")
            high = self.operand("an upper bound after AND")
            return Between(left, low, high, negated)
        if self.at_kw("LIKE"):
            self.take()
            ptok = self.tok
            if ptok.kind != "string":
                raise self.fail("expected a quoted regular expression after LIKE")
            self.take()
            pattern = _unquote(ptok.text)
            try:
                re.compile(pattern)
            except re.error as exc:
                raise _error(self.text, ptok.pos, f"LIKE pattern is not a valid regular expression: {exc}") from None
            return Like(left, pattern, negated)
        if self.at_kw("IS"):
            self.take()
            neg = False
            if self.at_kw("NOT"):
                self.take()
                neg = True
            self.expect_kw("NULL", "after IS")
            return IsNull(left, neg)
        if isinstance(left, Literal) and isinstance(left.value, str) and start.kind == "kw":
            return left  # bare TRUE / FALSE
        raise self.fail("expected a comparison (=, !=, <, <=, >, >=), IN, BETWEEN, LIKE or IS NULL")

    def operand(self, what: str) -> Operand:
        tok = self.tok
        if tok.kind == "field":
            self.take()
            return Field(tuple(tok.text[1:].split("/")))
        if tok.kind == "string":
            self.take()
            return Literal(_unquote(tok.text))
        if tok.kind == "number":
            self.take()
            return Literal(float(tok.text))
        if tok.kind == "punct" and tok.text in "+-":
            self.take()
            if self.tok.kind != "number":
                raise self.fail(f"expected a number after '{tok.text}'")
            value = float(self.take().text)
            return Literal(-value if tok.text == "-" else value)
        if self.at_kw("TRUE", "FALSE"):
            self.take()
            return Literal(tok.text.lower())
        raise self.fail(f"expected {what} (a /field, a number or a quoted string)")


def _flatten(op: str, items: list[Expr]) -> list[Expr]:
    out: list[Expr] = []
    for item in items:
        if isinstance(item, BoolOp) and item.op == op:
            out.extend(item.items)
        else:
            out.append(item)
    return out


def parse(text: str) -> Expr:
    """Parse a filter; raises :class:`FilterSyntaxError` showing the position of the fault.

    Example:
        >>> parse("/a/b BETWEEN 1 AND 5 OR /c IS NULL")
        BoolOp(op='OR', items=(Between(...), IsNull(...)))  # doctest: +SKIP
    """
    return _Parser(text).parse()


def canonical(text: str) -> str:
    """The normal form of a filter (keywords upper case, spacing and redundant parentheses removed).

    Two filters with the same canonical form select the same messages; the
    replicate_filter validation check compares filters this way.
    """
    return str(parse(text))
