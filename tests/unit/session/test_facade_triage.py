"""The session hands a failed token-equality or KV verdict of a run it made to triage, and
only then: the failure text, the listeners and the statistics get the verdict; a green test,
an untriaged check, a trace the session did not make and a spent budget cost nothing."""

from __future__ import annotations

import pytest

from harness.core.config import EngineConfig
from harness.core.trace import Trace
from harness.core.triage import BATCHING, TriageResult, TriageRun
from harness.core.verdict import Verdict, VerdictFailed
from harness.scenario.prompts import EngineLimits, RequestSpec, Scenario
from harness.session.facade import HilSession, SessionOptions
from harness.session.listeners import SessionListener
from harness.triage.session_hook import named_request

SCENARIO = Scenario("pair", [RequestSpec("0-weather", (1, 2), 4), RequestSpec("1-code", (3,), 4)],
                    EngineLimits(256, 4))
CFG = EngineConfig("vllm-cpu", "/m", 256, 4)
RESULT = TriageResult("t::pair", "token_equality", BATCHING, "depends on batching: fails only"
                      " when decoded with another request",
                      (TriageRun("batching", "alone (1-code)", "vllm-cpu", ("1-code",), "passed"),),
                      3.5)


class FakeRunner:
    def __init__(self, budget) -> None:
        self.budget = budget
        self.calls: list = []

    def triage(self, nodeid, run, facts):
        self.calls.append((nodeid, run))
        self.budget.tests += 1
        return RESULT


class Heard(SessionListener):
    def __init__(self) -> None:
        self.triaged: list[TriageResult] = []

    def on_triage(self, result: TriageResult) -> None:
        self.triaged.append(result)


def session(tmp_path, **opts) -> tuple[HilSession, FakeRunner, Heard]:
    hil = HilSession(SessionOptions(cache_dir=tmp_path, reports_dir=tmp_path, **opts))
    fake = FakeRunner(hil.triage.runner.budget)
    hil.triage.runner = fake
    heard = Heard()
    hil.add_listener(heard)
    hil.begin_test("t::pair")
    return hil, fake, heard


def ran(hil: HilSession) -> Trace:
    trace = Trace(target="vllm-cpu")
    hil.triage.ran(CFG, SCENARIO, "generate", None, trace)
    return trace


BAD = Verdict.failed("token_equality", "token mismatch: request '1-code' at position 2",
                     details="token mismatch: request '1-code' at position 2\nprompt ...")


def test_a_failed_token_verdict_is_triaged_and_says_so_everywhere(tmp_path):
    hil, fake, heard = session(tmp_path)
    trace = ran(hil)
    with pytest.raises(VerdictFailed) as e:
        hil.expect(Verdict.passed("logprob_closeness"), BAD, trace=trace)
    text = str(e.value)
    assert text.startswith("[check token_equality] token mismatch: request '1-code'")
    assert "\n\ntriage: depends on batching: fails only when decoded with another request\n" in text
    assert "batching  alone (1-code): passed" in text
    (nodeid, run), = fake.calls
    assert nodeid == "t::pair" and run.request_id == "1-code" and run.cfg == CFG
    assert heard.triaged == [RESULT]
    assert hil.stats().to_dict()["triage"] == [RESULT.to_dict()]
    assert hil.timers.get("triage") == 3.5


@pytest.mark.parametrize("why", ["green", "untriaged check", "foreign trace", "no trace", "off",
                                 "spent"])
def test_what_is_not_triaged(tmp_path, why):
    hil, fake, heard = session(tmp_path, triage=why != "off", triage_max=0 if why == "spent" else 3)
    trace = ran(hil)
    verdict = {"green": Verdict.passed("token_equality"),
               "untriaged check": Verdict.failed("full_batch", "3 running")}.get(why, BAD)
    given = {"foreign trace": Trace(target="vllm-cpu"), "no trace": None}.get(why, trace)
    try:
        hil.expect(verdict, trace=given)
    except VerdictFailed as e:
        text = e.verdict.details or str(e)
        if why == "spent":  # left untriaged by the budget: the failure says so
            assert text.endswith("\n\ntriage: not triaged: the first 0 failed test(s) of this"
                                 " process were (--triage-max)")
        else:
            assert "triage:" not in text
    assert not fake.calls and not heard.triaged and hil.stats().triage == []


def test_a_new_test_forgets_the_runs_of_the_last(tmp_path):
    hil, fake, _ = session(tmp_path)
    trace = ran(hil)
    hil.begin_test("t::next")
    with pytest.raises(VerdictFailed):
        hil.expect(BAD, trace=trace)
    assert not fake.calls


def test_the_named_request_is_the_first_the_text_names():
    v = Verdict.failed("kv_ledger.conservation", "step 3: 1-code holds 2 blocks; 0-weather ...")
    assert named_request(v, SCENARIO) == "1-code"
    assert named_request(Verdict.failed("kv_ledger.x", "no names"), SCENARIO) == "0-weather"
    # a request id inside a longer word is not a mention
    assert named_request(Verdict.failed("x", "11-code"), SCENARIO) == "0-weather"
