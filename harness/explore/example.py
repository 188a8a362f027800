"""One example of the search as data: a geometry's values and a workload of request shapes.

An ``Example`` is what a finding records and a regression test replays: the geometry as the
keys of ``fixtures/geometries.toml`` (read back through ``parse_geometry``, so an example holds
only what a geometry file may say) and each request as a ``RequestShape`` (its prompt length,
how much of the prompt it shares with the other requests of its text family, max_tokens, the
step it arrives at and, optionally, how many steps after that it is aborted). The token ids are
made from the shapes and the model's tokenizer (``Example.scenario``), so an example reads as
shapes and replays on the same model the same way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from functools import cache
from typing import Any

from harness.core.paths import FIXTURES
from harness.geometry.catalog import KEYS, Geometry, parse_geometry
from harness.scenario.prompts import RequestSpec, Scenario, Tokenizer, prompt_of_length

FORMAT = 1  # the example's JSON layout; a finding of another layout is refused, naming it
SOURCE = "hil explore"  # where an example's geometry comes from, as its error messages say
GEOMETRY_KEYS = tuple(k for k in KEYS if k != "description")
# The texts requests are made of: a family's shared text, and each request's own.
FAMILY_FILES = ("lab.txt", "weather.txt", "kitchen_travel.txt")
OWN_FILE = "weather.txt"
FAMILIES = len(FAMILY_FILES)


class ExampleError(ValueError):
    """An example (a finding's JSON) that cannot be read: what is wrong and where."""


@dataclass(frozen=True)
class RequestShape:
    """One request of a workload.

    Its prompt is ``prompt_len`` tokens: the first ``shared`` come from its text family's
    shared text (requests of one family share the shorter one's share of it: a prefix the
    prefix cache can serve), the rest from a text of its own. It asks for ``max_tokens``,
    arrives before step ``arrival`` and, with ``abort_after``, its client goes away before
    step ``arrival + abort_after`` (1 <= abort_after < max_tokens: it is still running then,
    whatever the scheduler did with it).
    """

    prompt_len: int
    max_tokens: int
    arrival: int = 0
    abort_after: int | None = None
    family: int = 0
    shared: int = 0

    def problem(self) -> str | None:
        """What makes this shape impossible, or None."""
        if self.prompt_len < 1 or self.max_tokens < 1:
            return f"prompt_len {self.prompt_len} and max_tokens {self.max_tokens} must be >= 1"
        if self.arrival < 0:
            return f"arrival {self.arrival} must be >= 0"
        if not 0 <= self.shared <= self.prompt_len:
            return f"shared {self.shared} must be from 0 to prompt_len {self.prompt_len}"
        if not 0 <= self.family < FAMILIES:
            return f"family {self.family} must be from 0 to {FAMILIES - 1}"
        if self.abort_after is not None and not 1 <= self.abort_after < self.max_tokens:
            return (f"abort_after {self.abort_after} must be from 1 to max_tokens - 1"
                    f" ({self.max_tokens - 1}): a request aborted later may have finished")
        return None

    @property
    def abort_step(self) -> int | None:
        """The step before which the request is aborted (None: it runs to its end)."""
        return None if self.abort_after is None else self.arrival + self.abort_after

    def describe(self) -> str:
        text = f"prompt {self.prompt_len}"
        if self.shared:
            text += f" (its first {self.shared} shared with text family {self.family})"
        text += f", max_tokens {self.max_tokens}, arrives at step {self.arrival}"
        if self.abort_step is not None:
            text += f", aborted before step {self.abort_step}"
        return text


@dataclass(frozen=True)
class Example:
    """A geometry's values (the keys of fixtures/geometries.toml, description left out) and a
    workload."""

    geometry_values: tuple[tuple[str, Any], ...]
    requests: tuple[RequestShape, ...]

    @classmethod
    def of(cls, geometry: Geometry | Mapping[str, Any],
           requests: Sequence[RequestShape]) -> Example:
        values = geometry_values(geometry) if isinstance(geometry, Geometry) else dict(geometry)
        return cls(tuple(sorted(values.items())), tuple(requests))

    @property
    def values(self) -> dict[str, Any]:
        return dict(self.geometry_values)

    @property
    def geometry(self) -> Geometry:
        """The geometry, read as a geometry file's table is (a bad value raises GeometryError)."""
        return geometry_of(self.values)

    @property
    def key(self) -> str:
        """A short, stable name: equal examples, equal keys."""
        blob = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    def simplicity(self) -> tuple[int, ...]:
        """Smaller is simpler: fewer requests, then fewer tokens, then earlier arrivals, fewer
        aborts and less shared text (how a finding's examples are compared)."""
        r = self.requests
        return (len(r), sum(q.prompt_len + q.max_tokens for q in r), sum(q.arrival for q in r),
                sum(q.abort_after is not None for q in r), sum(q.shared for q in r))

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "geometry": self.values,
                "workload": [asdict(r) for r in self.requests]}

    def describe(self) -> str:
        """The geometry's line and one line per request (r0, r1, ...)."""
        lines = [self.geometry.describe().split(": ", 1)[1]]
        lines += [f"r{i}: {r.describe()}" for i, r in enumerate(self.requests)]
        return "\n".join(lines)

    def scenario(self, tokenizer: Tokenizer, salt: int = 0) -> Scenario:
        """The requests as a Scenario in this geometry's limits. A ``salt`` other than 0 makes
        every prompt's text new (the same shapes and shared prefixes): a run on an engine whose
        prefix cache still holds an earlier run's prompts then meets none of them."""
        limits = self.geometry.limits()
        specs = []
        for i, r in enumerate(self.requests):
            ids = prompt_ids(tokenizer, r, i, salt, limits.max_model_len)
            specs.append(RequestSpec(
                request_id=f"r{i}", prompt_token_ids=tuple(ids), max_tokens=r.max_tokens,
                arrival_step=r.arrival, prompt_text=tokenizer.decode(list(ids)),
                abort_step=r.abort_step))
        tags = {"scenario": f"explore-{self.key}", "batch_size": len(specs),
                "max_num_seqs": limits.max_num_seqs}
        return Scenario(name=f"explore-{self.key}", requests=specs, limits=limits, tags=tags)


def geometry_values(g: Geometry) -> dict[str, Any]:
    """A geometry's values as a geometry file's keys (those unset left out)."""
    values = {k: getattr(g, k) for k in GEOMETRY_KEYS}
    if g.pool is None:  # pool_requests or num_blocks says what the pool is
        del values["pool"]
    if g.tensor_parallel_size == 1:
        del values["tensor_parallel_size"]
    return {k: v for k, v in values.items() if v is not None}


def geometry_of(values: Mapping[str, Any]) -> Geometry:
    """The geometry of these values, named by them (``explore-<hash>``); checked as a geometry
    file's table is."""
    digest = hashlib.sha256(json.dumps(dict(values), sort_keys=True).encode()).hexdigest()[:8]
    table = {"description": "a geometry of hil explore", **values}
    return parse_geometry(f"explore-{digest}", table, SOURCE)


def example_from_dict(data: Mapping[str, Any]) -> Example:
    """The example a finding recorded (``Example.to_dict``); refused with what is wrong."""
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, Mapping) else type(data).__name__
        raise ExampleError(f"an example of format {got!r}; this harness reads format {FORMAT}")
    values = data.get("geometry")
    if not isinstance(values, Mapping):
        raise ExampleError("an example without its geometry")
    geometry_of(values)  # a bad key or value raises GeometryError naming it
    known = {f.name for f in fields(RequestShape)}
    shapes = []
    for i, r in enumerate(data.get("workload") or ()):
        if not isinstance(r, Mapping) or set(r) - known:
            raise ExampleError(f"request r{i}: {r!r} is not a request shape (keys:"
                               f" {', '.join(sorted(known))})")
        try:
            shape = RequestShape(**r)
        except TypeError as e:
            raise ExampleError(f"request r{i}: {e}") from None
        problem = shape.problem()
        if problem:
            raise ExampleError(f"request r{i}: {problem}")
        shapes.append(shape)
    if not shapes:
        raise ExampleError("an example without requests")
    return Example.of(values, shapes)


@cache
def _text(name: str) -> str:
    return (FIXTURES / "corpus" / name).read_text(encoding="utf-8")


def prompt_ids(tokenizer: Tokenizer, r: RequestShape, index: int, salt: int,
               max_model_len: int) -> list[int]:
    """The prompt of request ``index``: its family's shared text for its first ``shared``
    tokens, then its own text, ``prompt_len`` tokens in all."""
    lead = f"Run {salt}. " if salt else ""
    # A few characters a token: a slice of the text is enough, and cheaper to encode.
    chars = 8 * max_model_len
    family = prompt_of_length(tokenizer, lead + _text(FAMILY_FILES[r.family])[:chars],
                              max_model_len)
    own = prompt_of_length(tokenizer, f"{lead}Request number {index}. "
                           + _text(OWN_FILE)[:chars], max_model_len)
    return family[: r.shared] + own[: r.prompt_len - r.shared]


@dataclass(frozen=True)
class Identity:
    """What a finding depends on besides its example: the target variant, model, stack and
    the faults injected."""

    target: str
    model: str
    stack: str
    faults: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "model": self.model, "stack": self.stack,
                "faults": list(self.faults)}
