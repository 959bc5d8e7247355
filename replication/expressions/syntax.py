"""The syntax tree of a content filter: its nodes, the visitor every walk over them uses, and the fields read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

__all__ = [
    "Between",
    "BoolOp",
    "Compare",
    "Expr",
    "Field",
    "InList",
    "IsNull",
    "Like",
    "Literal",
    "Not",
    "Operand",
    "OperandVisitor",
    "Visitor",
    "fields",
]


@dataclass(frozen=True)
class Field:
    """A ``/a/b`` path into the JSON message."""

    path: tuple[str, ...]

    def __str__(self) -> str:
        return "/" + "/".join(self.path)


@dataclass(frozen=True)
class Literal:
    """A number (``float``) or a string literal."""

    value: float | str

    def __str__(self) -> str:
        if isinstance(self.value, str):
            return "'" + self.value.replace("'", "\\'") + "'"
        text = repr(self.value)
        return text[:-2] if text.endswith(".0") else text


Operand = Field | Literal


@dataclass(frozen=True)
class Compare:
    op: str
    """One of ``= != < <= > >=`` (``==`` and ``<>`` are normalised to ``=`` and ``!=``)."""
    left: Operand
    right: Operand

    def __str__(self) -> str:
        return f"{self.left} {self.op} {self.right}"


@dataclass(frozen=True)
class InList:
    operand: Operand
    items: tuple[Operand, ...]
    negated: bool = False

    def __str__(self) -> str:
        items = ", ".join(str(i) for i in self.items)
        return f"{self.operand} {'NOT IN' if self.negated else 'IN'} ({items})"


@dataclass(frozen=True)
class Between:
    operand: Operand
    low: Operand
    high: Operand
    negated: bool = False

    def __str__(self) -> str:
        word = "NOT BETWEEN" if self.negated else "BETWEEN"
        return f"{self.operand} {word} {self.low} AND {self.high}"


@dataclass(frozen=True)
class Like:
    operand: Operand
    pattern: str
    negated: bool = False

    def __str__(self) -> str:
        return f"{self.operand} {'NOT LIKE' if self.negated else 'LIKE'} {Literal(self.pattern)}"


@dataclass(frozen=True)
class IsNull:
    operand: Operand
    negated: bool = False

    def __str__(self) -> str:
        return f"{self.operand} IS {'NOT NULL' if self.negated else 'NULL'}"


@dataclass(frozen=True)
class Not:
    item: Expr

    def __str__(self) -> str:
        return f"NOT {self.item}"


@dataclass(frozen=True)
class BoolOp:
    op: str
    """``AND`` or ``OR``."""
    items: tuple[Expr, ...]

    def __str__(self) -> str:
        return "(" + f" {self.op} ".join(str(i) for i in self.items) + ")"


Expr = Compare | InList | Between | Like | IsNull | Not | BoolOp | Literal
"""A parsed filter. A bare ``TRUE``/``FALSE`` is a :class:`Literal` of ``'true'``/``'false'``."""

_NODES: tuple[type, ...] = (Field, Literal, Compare, InList, Between, Like, IsNull, Not, BoolOp)

R = TypeVar("R")


class Visitor(Generic[R]):
    """A walk over the tree: ``visit(node, *args)`` calls the subclass's ``visit_<NodeClass>(node, *args)``.

    The method for each node class is looked up once, when the subclass is
    defined (keyed by the class itself, not its name), so a visit costs one
    dict lookup. A node the subclass has no method for, or anything that is
    not a node, raises :class:`TypeError` ("not a filter node: ...", or what
    ``expects`` says); a ``visit_`` method naming no node class is a typo and
    fails at class definition.

    Example:
        >>> class Depth(Visitor[int]):
        ...     def visit_Not(self, node): return 1 + self.visit(node.item)
        ...     def visit_Compare(self, node): return 1
        >>> Depth().visit(Not(Compare("=", Field(("a",)), Literal(1.0))))
        2
    """

    _methods: ClassVar[dict[type, Callable[..., Any]]] = {}
    #: What the visitor takes, for the error on anything else.
    expects: ClassVar[str] = "a filter node"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        names = {"visit_" + node.__name__: node for node in _NODES}
        unknown = sorted(a for a in dir(cls) if a.startswith("visit_") and a not in names)
        if unknown:
            raise TypeError(f"{cls.__name__}: {', '.join(unknown)} name no filter node class")
        cls._methods = {node: getattr(cls, name) for name, node in names.items() if hasattr(cls, name)}

    def visit(self, node: Any, *args: Any) -> R:
        method = self._methods.get(type(node))
        if method is None:
            raise TypeError(f"not {self.expects}: {node!r}")
        return method(self, node, *args)


class OperandVisitor(Visitor[R]):
    """A visitor of operands only (``visit_Field``, ``visit_Literal``).

    Operands get visitors of their own because a :class:`Literal` there is a
    value, while a bare ``TRUE``/``FALSE`` filter is a boolean.
    """

    expects = "an operand (a /field or a literal)"


class _Fields(Visitor[None]):
    """Collects the ``/path``s under a node into ``out``."""

    def __init__(self) -> None:
        self.out: set[Field] = set()

    def visit_Field(self, node: Field) -> None:
        self.out.add(node)

    def visit_Literal(self, node: Literal) -> None:
        pass

    def visit_Compare(self, node: Compare) -> None:
        self.visit(node.left), self.visit(node.right)

    def visit_InList(self, node: InList) -> None:
        self.visit(node.operand)
        for i in node.items:
            self.visit(i)

    def visit_Between(self, node: Between) -> None:
        self.visit(node.operand), self.visit(node.low), self.visit(node.high)

    def visit_Like(self, node: Like) -> None:
        self.visit(node.operand)

    def visit_IsNull(self, node: IsNull) -> None:
        self.visit(node.operand)

    def visit_Not(self, node: Not) -> None:
        self.visit(node.item)

    def visit_BoolOp(self, node: BoolOp) -> None:
        for i in node.items:
            self.visit(i)


def fields(expr: Expr) -> set[Field]:
    """Every ``/path`` the filter reads."""
    walk = _Fields()
    walk.visit(expr)
    return walk.out
