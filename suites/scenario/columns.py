"""The notation of the scenario table: a Column record, a Rule record, and the decorator
that turns a tuple of columns into the Scenario dataclass (suites/scenario/table.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

REQUIRED = object()
"""The default of a column every row must name."""



class ScenarioError(ValueError):
    """A scenario row names an unknown column, a value its column does not allow, or a
    combination of columns RULES forbids; the message names the row and the fix."""


@dataclass(frozen=True)
class Column:
    """One column of the scenario table, declared once.

    fragment: what the column adds to the scenario id when its value is not the
    default: a format string (`{}` is the value), a {value: fragment} mapping, or a
    callable (scenario) -> fragment | None for columns whose spelling depends on others.
    axis: False for bookkeeping (the tier), which is no point of the configuration space.
    """

    name: str
    values: tuple
    default: Any
    fragment: str | dict | Callable[[Any], str | None] | None
    doc: str
    title: str
    axis: bool = True

    @property
    def type(self) -> type:
        return type(self.values[0])

    def id_part(self, scenario: Any) -> str | None:
        value = getattr(scenario, self.name)
        if callable(self.fragment):
            return self.fragment(scenario)
        if value == self.default or self.fragment is None:
            return None
        if isinstance(self.fragment, dict):
            return self.fragment.get(value, str(value))
        return self.fragment.format(value)


@dataclass(frozen=True)
class Rule:
    """An invalid combination: `broken(scenario)` is True when the row breaks the rule."""

    broken: Callable[[Any], bool]
    message: str


def with_columns(columns: tuple[Column, ...]) -> Callable[[type], type]:
    """A class decorator: makes the class a frozen dataclass whose fields are `columns`,
    in their order (a column's default becomes the field's; REQUIRED: no default)."""

    def make(cls: type) -> type:
        cls.__annotations__ = {c.name: c.type.__name__ for c in columns}
        for c in columns:
            if c.default is not REQUIRED:
                setattr(cls, c.name, c.default)
        return dataclass(frozen=True)(cls)

    return make


def describe(columns: tuple[Column, ...]) -> str:
    """The column list of the table's docstring: name, values, default, one line of doc."""
    return "\n".join(f"  {c.name:<14}{' | '.join(map(str, c.values))}  "
                     f"(default {c.default if c.default is not REQUIRED else '-'})\n                {c.doc}"
                     for c in columns)
