"""Scenarios: requests as data, built from prompt-set files in fixtures/prompts.

A prompt set is a JSON file with engine limits, prompts and cases. A prompt
is text, or text stretched/truncated to an exact token count (``length``), so
that block edges (63, 64, 65 tokens) hold for any tokenizer. A case names the
prompts that go into one engine call; ``size`` draws that many prompts from
the ``pool`` instead, where ``size`` may be ``max_num_seqs`` or
``max_num_seqs+N`` so the batch shape follows the engine limits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from harness.core.paths import FIXTURES


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class RequestSpec:
    """One request: prompt token ids, how many tokens to generate, when it arrives, and in
    a step-driven run the step before which it is aborted (its client went away), if any."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival_step: int = 0
    prompt_text: str = ""
    abort_step: int | None = None

    def to_payload(self) -> dict[str, Any]:
        payload = {
            "request_id": self.request_id,
            "prompt_token_ids": list(self.prompt_token_ids),
            "max_tokens": self.max_tokens,
            "arrival_step": self.arrival_step,
        }
        if self.abort_step is not None:
            payload["abort_step"] = self.abort_step
        return payload


@dataclass(frozen=True)
class EngineLimits:
    """The engine shape a prompt set is written for."""

    max_model_len: int
    max_num_seqs: int
    sb_warmup: tuple[int, int, int] | None = None  # prompt_len, new_tokens, batch_size
    cp_chunk: int | None = None


@dataclass
class Scenario:
    name: str
    requests: list[RequestSpec]
    limits: EngineLimits
    tags: dict[str, Any] = field(default_factory=dict)

    def payload(self) -> list[dict[str, Any]]:
        return [r.to_payload() for r in self.requests]

    def prompts_by_id(self) -> dict[str, str]:
        return {r.request_id: r.prompt_text for r in self.requests}

    def aborts(self) -> dict[str, int]:
        """The requests a step-driven run aborts, each with the step before which it is
        aborted (``RequestSpec.abort_step``)."""
        return {r.request_id: r.abort_step for r in self.requests if r.abort_step is not None}

    def completing(self) -> Scenario:
        """This scenario without the requests it aborts: those that run to their end, which
        token equality compares (an aborted request returns no output)."""
        return replace(self, requests=[r for r in self.requests if r.abort_step is None])


def prompt_of_length(tokenizer: Tokenizer, text: str, length: int) -> list[int]:
    """Exactly ``length`` token ids: ``text`` repeated as needed, then truncated."""
    base = tokenizer.encode(text, add_special_tokens=False)
    if not base:
        raise ValueError(f"prompt text {text!r} encodes to no tokens")
    ids: list[int] = []
    while len(ids) < length:
        ids.extend(base)
    return ids[:length]


def resolve_size(size: int | str, max_num_seqs: int) -> int:
    """``4``, ``"max_num_seqs"`` or ``"max_num_seqs+2"`` -> a request count."""
    if isinstance(size, int):
        return size
    s = size.replace(" ", "")
    if s == "max_num_seqs":
        return max_num_seqs
    if s.startswith("max_num_seqs+"):
        return max_num_seqs + int(s.split("+", 1)[1])
    raise ValueError(f"case size {size!r} is not an integer, 'max_num_seqs' or 'max_num_seqs+N'")


def _cases_using(ps: PromptSet, pid: str) -> str:
    cases = [c for c, case in ps.cases.items()
             if pid in case.get("prompts", []) or ("size" in case and pid in ps.pool)]
    return f" (used by case {', '.join(map(repr, cases))})" if cases else ""


def check_prompts(ps: PromptSet, source: str) -> None:
    """Refuse prompts no engine can run: empty text, length < 1, max_tokens < 1."""
    if ps.max_tokens < 1:
        raise ValueError(f"{source}: max_tokens {ps.max_tokens} must be at least 1")
    for pid, p in ps.prompts.items():
        where = f"{source}: prompt {pid!r}{_cases_using(ps, pid)}"
        text = p.get("text") if isinstance(p, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{where}: text {text!r} is empty; give it some text")
        if "length" in p and (not isinstance(p["length"], int) or p["length"] < 1):
            raise ValueError(f"{where}: length {p['length']!r} must be a whole number of"
                             " tokens, at least 1")
        if "max_tokens" in p and (not isinstance(p["max_tokens"], int) or p["max_tokens"] < 1):
            raise ValueError(f"{where}: max_tokens {p['max_tokens']!r} must be at least 1")
        prefix = p.get("prefix")
        if prefix is not None:
            if (not isinstance(prefix, dict) or prefix.get("of") not in ps.prompts
                    or prefix.get("of") == pid or not isinstance(prefix.get("tokens"), int)
                    or prefix["tokens"] < 1):
                raise ValueError(f"{where}: prefix {prefix!r} must name another prompt of the set"
                                 " and a number of its tokens, at least 1: {\"of\": ID, \"tokens\": N}")
            if "prefix" in ps.prompts[prefix["of"]]:
                raise ValueError(f"{where}: prefix names {prefix['of']!r}, which has a prefix"
                                 " itself; share the first prompt's tokens directly")
            if "length" in p and p["length"] < prefix["tokens"]:
                raise ValueError(f"{where}: length {p['length']} is shorter than its prefix of"
                                 f" {prefix['tokens']} tokens")


class PromptSet:
    """A prompt-set file: limits, prompts and cases."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        self.source = source
        self.name: str = data["name"]
        eng = data["engine"]
        w = eng.get("sb_warmup")
        self.limits = EngineLimits(
            max_model_len=int(eng["max_model_len"]),
            max_num_seqs=int(eng["max_num_seqs"]),
            sb_warmup=(int(w["prompt_len"]), int(w["new_tokens"]), int(w["batch_size"])) if w else None,
            cp_chunk=int(eng["cp_chunk"]) if eng.get("cp_chunk") else None,
        )
        self.max_tokens: int = int(data["max_tokens"])
        self.prompts: dict[str, dict[str, Any]] = data["prompts"]
        self.pool: list[str] = list(data.get("pool", []))
        self.cases: dict[str, dict[str, Any]] = data["cases"]
        for cid, case in self.cases.items():
            for pid in case.get("prompts", []):
                if pid not in self.prompts:
                    raise ValueError(f"{source}: case {cid!r} names unknown prompt {pid!r}")
        for pid in self.pool:
            if pid not in self.prompts:
                raise ValueError(f"{source}: pool names unknown prompt {pid!r}")
        check_prompts(self, source)

    @classmethod
    def load(cls, name_or_path: str | Path) -> PromptSet:
        path = Path(name_or_path)
        if not path.suffix:
            path = FIXTURES / "prompts" / f"{name_or_path}.json"
        with open(path, encoding="utf-8") as f:
            return cls(json.load(f), str(path))

    def case_ids(self) -> list[str]:
        return list(self.cases)

    def prompt_ids_for(self, case_id: str, max_num_seqs: int | None = None) -> list[str]:
        case = self.cases[case_id]
        if "prompts" in case:
            return list(case["prompts"])
        n = resolve_size(case["size"], max_num_seqs or self.limits.max_num_seqs)
        if not self.pool:
            raise ValueError(f"{self.source}: case {case_id!r} draws from an empty pool")
        return [self.pool[i % len(self.pool)] for i in range(n)]

    def prompt_ids(self, pid: str, tokenizer: Tokenizer) -> list[int]:
        """The token ids of prompt ``pid``. With ``prefix`` ({"of": ID, "tokens": N}) the first
        N tokens are prompt ID's, then its own text follows (to ``length`` tokens in all, when
        given): prompts that share a prefix and diverge at a chosen token, for prefix caching."""
        p = self.prompts[pid]
        prefix = p.get("prefix")
        if prefix is None:
            if "length" in p:
                return prompt_of_length(tokenizer, p["text"], int(p["length"]))
            return tokenizer.encode(p["text"], add_special_tokens=False)
        shared = self.prompt_ids(prefix["of"], tokenizer)[: int(prefix["tokens"])]
        own = tokenizer.encode(p["text"], add_special_tokens=False)
        if "length" in p:
            own = prompt_of_length(tokenizer, p["text"], int(p["length"]) - len(shared)) if int(
                p["length"]) > len(shared) else []
        return shared + own

    def scenario(self, case_id: str, tokenizer: Tokenizer) -> Scenario:
        """The requests of one case, tokenized with ``tokenizer``."""
        if case_id not in self.cases:
            raise ValueError(
                f"unknown case {case_id!r} in {self.source}; known: {', '.join(self.cases)}"
            )
        requests = []
        for i, pid in enumerate(self.prompt_ids_for(case_id)):
            p = self.prompts[pid]
            ids = self.prompt_ids(pid, tokenizer)
            if not ids:
                raise ValueError(f"{self.source}: case {case_id!r}, prompt {pid!r}: text"
                                 f" {p['text']!r} encodes to no tokens; give it some text")
            requests.append(
                RequestSpec(
                    request_id=f"{i}-{pid}",
                    prompt_token_ids=tuple(ids),
                    max_tokens=int(p.get("max_tokens", self.max_tokens)),
                    prompt_text=tokenizer.decode(ids),
                )
            )
        tags = {"prompt_set": self.name, "case": case_id, "batch_size": len(requests)}
        return Scenario(name=f"{self.name}/{case_id}", requests=requests, limits=self.limits, tags=tags)


def shaped_scenario(
    name: str,
    tokenizer: Tokenizer,
    shapes: list[tuple[int, ...]],
    limits: EngineLimits,
    text: str = "Blocks of cached keys and values fill up as the batch decodes, step by step. ",
) -> Scenario:
    """Requests of exact shapes: (prompt length in tokens, max_tokens, arrival step), and
    optionally a fourth value, the step before which the request is aborted."""
    requests = []
    for i, (length, max_tokens, arrival, *abort) in enumerate(shapes):
        ids = prompt_of_length(tokenizer, text + f"Request number {i}. ", length)
        requests.append(
            RequestSpec(
                request_id=f"r{i}", prompt_token_ids=tuple(ids), max_tokens=max_tokens,
                arrival_step=arrival, prompt_text=tokenizer.decode(ids),
                abort_step=abort[0] if abort else None,
            )
        )
    tags = {"scenario": name, "batch_size": len(requests), "max_num_seqs": limits.max_num_seqs}
    return Scenario(name=name, requests=requests, limits=limits, tags=tags)
