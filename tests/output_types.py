"""Answer types for the typed-output tests, at module level so a worker can import them."""

from __future__ import annotations

import dataclasses
import enum
from typing import List, Literal, Optional, TypedDict

import attrs


@attrs.frozen
class City:
    """A city and its population."""

    name: str
    population: int


@dataclasses.dataclass(frozen=True)
class Point:
    """A point on the plane."""

    x: float
    y: float


@dataclasses.dataclass(frozen=True)
class Note:
    """A note with an optional tag (not allowed in OpenAI's strict mode)."""

    text: str
    tag: Optional[str] = None


class Movie(TypedDict):
    """A film and its year."""

    title: str
    year: int


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


Mood = Literal["happy", "sad"]

Cities = List[City]

CITY_SCHEMA = {
    "type": "object",
    "title": "CityDoc",
    "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["name", "population"],
    "additionalProperties": False,
}
