"""The model step of prepare (spec §5.3): reply contract, prompt, and the three backends.

``openai`` runs against a local OpenAI-compatible HTTP server and ``pi`` runs a fake ``pi``
executable through the real subprocess code; ``structural`` runs on crafted notes and on the demo
notes. No test needs a real model.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from evidence_pipeline.authoring.backends.base import (
    ModelBackendError,
    ModelReply,
    ModelRequest,
    PreviousUnit,
    build_prompt,
    parse_reply,
    reply_json_schema,
    schema_without_titles,
)
from evidence_pipeline.authoring.backends.factory import make_backend
from evidence_pipeline.authoring.backends.openai import OpenAIBackend
from evidence_pipeline.authoring.backends.pi import PiBackend, PiSettings
from evidence_pipeline.authoring.backends.structural import StructuralBackend
from evidence_pipeline.formats.normalize import excerpt_in_source, normalize_text
from evidence_runtime.errors import ConfigError
from evidence_runtime.units import EvidenceKind, parse_unit, unit_json_schemas
from tests.fakes.openai_server import FakeOpenAIServer

FAKE_PI = Path(__file__).parent / "fakes" / "fake_pi.py"
DEMO_SOURCES = Path(__file__).parent.parent / "examples" / "psd" / "evidence" / "source"

PAZIENTE = """\
# Paziente

## Fascia pediatrica

Per fascia pediatrica si intendono i pazienti con età inferiore a 18 anni.
"""

PREVIOUS = PreviousUnit(
    id="evidence:fascia-pediatrica",
    data={"schema_version": 1, "id": "evidence:fascia-pediatrica", "title": "Fascia pediatrica",
          "kind": "glossary", "purposes": ["disambiguation"], "language": "it",
          "provenance": {"source_file": "source/paziente.md",
                         "source_sha256": "sha256:" + "0" * 64,
                         "supporting_excerpts": ["Per fascia pediatrica si intendono i pazienti"]},
          "glossary": {"term": "fascia pediatrica", "definition": "età inferiore a 18 anni"},
          "review_items": []},
    body="\n# Fascia pediatrica\n\nPazienti con età inferiore a 18 anni.\n")


def request(text: str = PAZIENTE, *, previous: tuple[PreviousUnit, ...] = (PREVIOUS,),
            source_file: str = "source/paziente.md", max_chunk_chars: int = 4000,
            previous_text: str | None = None) -> ModelRequest:
    return ModelRequest(
        source_file=source_file,
        source_sha256="sha256:" + hashlib.sha256(text.encode()).hexdigest(),
        normalized_text=normalize_text(text), language="it", previous_units=previous,
        max_chunk_chars=max_chunk_chars,
        previous_text=normalize_text(previous_text) if previous_text is not None else None)


def unit(**over: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "title": "Fascia pediatrica", "kind": "glossary",
        "purposes": ["disambiguation", "rewriting"],
        "applies_to": {"concepts": ["fascia pediatrica"]},
        "glossary": {"term": "fascia pediatrica",
                     "definition": "I pazienti con età inferiore a 18 anni."},
        "supporting_excerpts": [
            "Per fascia pediatrica si intendono i pazienti con età inferiore a 18 anni."],
        "review_items": [],
        "body": "I pazienti con età inferiore a 18 anni.",
    }
    out.update(over)
    return out


def reply_text(*units: dict[str, Any], retire: tuple[dict[str, str], ...] = ()) -> str:
    return json.dumps({"units": list(units), "retirement_candidates": list(retire)})


VALID = reply_text(unit(id="evidence:fascia-pediatrica"),
                   unit(title="Età", glossary={"term": "età", "definition": "Anni compiuti."}))
MALFORMED = '{"units": [{"title": "Fascia"'
UNKNOWN_ID = reply_text(unit(id="evidence:inventato"))
OTHER_SOURCE = reply_text(unit(source_file="source/altro.md"))

# scripted bad replies shared by both backends: (raw reply, error code, words in the message)
BAD_REPLIES = [
    pytest.param(MALFORMED, "model_malformed_json", "not valid JSON", id="malformed-json"),
    pytest.param(UNKNOWN_ID, "model_unknown_id", "evidence:inventato", id="unknown-id"),
    pytest.param(OTHER_SOURCE, "model_invalid_output", "another source", id="other-source"),
]


# ---------------------------------------------------------------------------------------------
# Reply contract and prompt
# ---------------------------------------------------------------------------------------------


def test_a_valid_reply_parses_into_units_without_envelope_fields() -> None:
    reply = parse_reply(VALID, request())
    assert [u.id for u in reply.units] == ["evidence:fascia-pediatrica", None]
    first = reply.units[0]
    assert list(first.data) == ["title", "kind", "purposes", "applies_to", "glossary",
                                "supporting_excerpts", "review_items"]
    assert first.body == "I pazienti con età inferiore a 18 anni."
    assert reply.retirement_candidates == ()


def test_one_surrounding_code_fence_is_tolerated() -> None:
    reply = parse_reply(f"```json\n{VALID}\n```\n", request())
    assert len(reply.units) == 2


@pytest.mark.parametrize(("raw", "code", "words"), BAD_REPLIES)
def test_bad_replies_are_refused_naming_the_source(raw: str, code: str, words: str) -> None:
    with pytest.raises(ModelBackendError) as err:
        parse_reply(raw, request())
    assert err.value.code == code
    assert err.value.path == "source/paziente.md"
    assert words in err.value.message


def test_an_unknown_id_makes_the_whole_reply_invalid_even_next_to_good_units() -> None:
    raw = reply_text(unit(id="evidence:fascia-pediatrica"), unit(id="evidence:altro"))
    with pytest.raises(ModelBackendError) as err:
        parse_reply(raw, request())
    assert err.value.code == "model_unknown_id"
    assert err.value.evidence_id == "evidence:altro"
    assert err.value.field == "units[1].id"


def test_no_previous_units_means_no_id_is_allowed() -> None:
    with pytest.raises(ModelBackendError) as err:
        parse_reply(reply_text(unit(id="evidence:fascia-pediatrica")), request(previous=()))
    assert err.value.code == "model_unknown_id"


def test_a_retirement_candidate_with_an_unknown_id_is_refused() -> None:
    raw = reply_text(unit(), retire=({"id": "evidence:nuovo", "message": "gone"},))
    with pytest.raises(ModelBackendError) as err:
        parse_reply(raw, request())
    assert err.value.code == "model_unknown_id"
    ok = parse_reply(reply_text(unit(), retire=(
        {"id": "evidence:fascia-pediatrica", "message": "non più nel sorgente"},)), request())
    assert ok.retirement_candidates[0].id == "evidence:fascia-pediatrica"


@pytest.mark.parametrize(("bad", "field", "words"), [
    ({"glossary": {"term": "x"}}, "units[0].glossary.definition", "Field required"),
    ({"kind": "formula"}, "units[0]", "formula"),
    ({"purposes": ["nope"]}, "units[0].purposes[0]", "disambiguation"),
    ({"supporting_excerpts": []}, "units[0].supporting_excerpts", "at least 1"),
    ({"supporting_excerpts": ["x" * 1001]}, "units[0].supporting_excerpts[0]", "1000"),
    ({"provenance": {}}, "units[0].provenance", "Extra inputs"),
    ({"enum": {"column": "a.b.c", "values": {"A": "a"}}}, "units[0].enum", "Extra inputs"),
])
def test_a_wrong_shape_names_the_unit_index_and_field(bad: dict, field: str, words: str) -> None:
    with pytest.raises(ModelBackendError) as err:
        parse_reply(reply_text(unit(**bad)), request())
    assert err.value.code == "model_invalid_output"
    assert field in err.value.message
    assert words in err.value.message


def test_the_same_id_twice_or_kept_and_retired_is_invalid() -> None:
    uid = "evidence:fascia-pediatrica"
    for raw in (reply_text(unit(id=uid), unit(id=uid)),
                reply_text(unit(id=uid), retire=({"id": uid, "message": "x"},))):
        with pytest.raises(ModelBackendError) as err:
            parse_reply(raw, request())
        assert err.value.code == "model_invalid_output"


@pytest.mark.parametrize("raw", ["[]", '{"units": {}}', '{"units": [], "extra": 1}', "null"])
def test_a_reply_that_is_not_the_reply_object_is_invalid(raw: str) -> None:
    with pytest.raises(ModelBackendError) as err:
        parse_reply(raw, request())
    assert err.value.code == "model_invalid_output"


def test_reply_schema_has_one_variant_per_kind_built_from_the_unit_contract() -> None:
    schema = reply_json_schema()
    variants = schema["properties"]["units"]["items"]["oneOf"]
    assert len(variants) == len(EvidenceKind)
    defs = schema["$defs"]
    for kind in EvidenceKind:
        proposed = defs[f"Proposed{kind.value.capitalize()}Unit"]
        assert kind.value in proposed["required"]
        assert "id" not in proposed["required"]
        assert proposed["properties"]["supporting_excerpts"]["maxItems"] == 5
        assert proposed["properties"]["supporting_excerpts"]["items"]["maxLength"] == 1000
        # generation order for grammar-constrained models: id and kind first, the body last
        names = list(proposed["properties"])
        assert names[:2] == ["id", "kind"] and names[-1] == "body"
        assert names.index(kind.value) < names.index("supporting_excerpts")
        assert proposed["additionalProperties"] is False
    assert defs["FormulaBlock"] == schema_without_titles(
        unit_json_schemas()["formula"]["$defs"]["FormulaBlock"])
    # no generated "title" annotations (small models copied them into units); the unit's own
    # title property stays
    assert '"title":"' not in json.dumps(schema, separators=(",", ":"))
    assert defs["ProposedGlossaryUnit"]["properties"]["title"]["type"] == "string"
    assert "title" in defs["ProposedGlossaryUnit"]["required"]
    assert schema["properties"]["retirement_candidates"]["items"]["$ref"]


def test_the_prompt_carries_rules_schemas_previous_units_and_the_text() -> None:
    req = request(PAZIENTE + "\n{{REPLY_SCHEMA}} resta testo.\n")
    prompt = build_prompt(req)
    assert "non inventare" in prompt and "segnala il dubbio" in prompt
    assert "ambiguous_source_statement" in prompt
    assert ("formula, enum, mapping, normalization, glossary, domain, example, reference"
            in prompt)
    assert json.dumps(schema_without_titles(unit_json_schemas()), ensure_ascii=False,
                      separators=(",", ":")) in prompt
    assert '"id":"evidence:fascia-pediatrica"' in prompt.replace(": ", ":")
    assert "allowed ids (rule 6): evidence:fascia-pediatrica\n" in prompt
    assert "- path: `source/paziente.md`" in prompt
    assert req.normalized_text in prompt  # placeholders inside the source stay as they are
    assert "{{REPLY_SCHEMA}} resta testo." in prompt
    assert json.dumps(reply_json_schema(), ensure_ascii=False, separators=(",", ":")) in prompt
    assert "What changed in the note" not in prompt  # no previous text known
    assert "{{" not in prompt.replace("{{REPLY_SCHEMA}} resta", "")


def test_the_prompt_of_every_source_starts_with_the_same_fixed_part() -> None:
    # the rules and both schemas come before anything that depends on the source, so that an
    # endpoint's prompt cache can serve them again for the next source of the batch
    one = build_prompt(request())
    other = build_prompt(request(EIGHT_KINDS, previous=(), source_file="source/altro.md"))
    fixed = one[:one.index("# The note\n")]
    assert other.startswith(fixed)
    assert json.dumps(reply_json_schema(), ensure_ascii=False, separators=(",", ":")) in fixed
    for per_source in ("source/paziente.md", "evidence:fascia-pediatrica", "Per fascia"):
        assert per_source not in fixed


def test_the_prompt_shows_what_changed_since_the_previous_units() -> None:
    before = PAZIENTE
    now = PAZIENTE + "\n## Neonati\n\nPer neonato si intende il paziente sotto i 28 giorni.\n"
    prompt = build_prompt(request(now, previous_text=before))
    section = prompt.split("## What changed in the note since the previous units were made")[1]
    diff = section.split("```diff\n")[1].split("```")[0]
    assert "--- previous\n+++ now\n" in diff
    assert "+Per neonato si intende il paziente sotto i 28 giorni.\n" in diff
    assert not [line for line in diff.splitlines() if line.startswith("-") and
                not line.startswith("---")]  # nothing was removed
    assert section.index("```diff") < section.index("## Source text")
    # the same text as before: no section
    assert "What changed" not in build_prompt(request(PAZIENTE, previous_text=PAZIENTE))


# ---------------------------------------------------------------------------------------------
# Factory
# ---------------------------------------------------------------------------------------------


def test_make_backend_picks_by_name_and_refuses_unknown_names(monkeypatch) -> None:
    monkeypatch.delenv("THT_LLM_BASE_URL", raising=False)
    monkeypatch.delenv("THT_LLM_MODEL", raising=False)
    assert make_backend("structural", {}).name == "structural"
    pi = make_backend("pi", {"command": "/opt/pi", "model": "m", "timeout_s": 5,
                             "openai": {"base_url": "http://x/v1"}})
    assert isinstance(pi, PiBackend) and pi.settings.command == "/opt/pi"
    oa = make_backend("openai", {"command": "pi",  # a pi key is ignored for openai
                                 "openai": {"base_url": "http://127.0.0.1:1/v1", "model": "m"}})
    assert isinstance(oa, OpenAIBackend) and oa.url == "http://127.0.0.1:1/v1/chat/completions"
    with pytest.raises(ConfigError, match="unknown model backend 'llama'"):
        make_backend("llama", {})
    with pytest.raises(ConfigError, match="unknown model setting 'temprature'"):
        make_backend("pi", {"temprature": 0})
    with pytest.raises(ConfigError, match=r"needs model\.base_url"):
        make_backend("openai", {"model": "m"})
    with pytest.raises(ConfigError, match="timeout_s"):
        make_backend("pi", {"timeout_s": -1})


def test_openai_key_comes_from_the_named_env_var(monkeypatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-from-env")
    backend = make_backend("openai", {"base_url": "http://h/v1", "model": "m",
                                      "api_key_env": "MY_KEY"})
    assert isinstance(backend, OpenAIBackend) and backend.api_key == "sk-from-env"
    monkeypatch.delenv("THT_LLM_API_KEY", raising=False)
    keyless = make_backend("openai", {"base_url": "http://h/v1", "model": "m"})
    assert isinstance(keyless, OpenAIBackend) and keyless.api_key is None


# ---------------------------------------------------------------------------------------------
# openai: a local OpenAI-compatible server
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def server():
    with FakeOpenAIServer() as s:
        yield s


def openai(server: FakeOpenAIServer, timeout_s: float = 5.0) -> OpenAIBackend:
    return OpenAIBackend(base_url=server.url, model="fake-model", api_key="sk-test",
                         timeout_s=timeout_s)


def test_openai_valid_reply_and_the_request_it_sends(server: FakeOpenAIServer) -> None:
    server.add(VALID)
    reply = openai(server).restructure(request())
    assert [u.id for u in reply.units] == ["evidence:fascia-pediatrica", None]
    [received] = server.received
    assert received.path == "/v1/chat/completions"
    assert received.headers["Authorization"] == "Bearer sk-test"
    body = received.body
    assert body["model"] == "fake-model"
    assert body["temperature"] == 0
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "evidence_units", "schema": reply_json_schema(), "strict": False}}
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][1]["content"] == build_prompt(request())


@pytest.mark.parametrize(("raw", "code", "words"), BAD_REPLIES)
def test_openai_bad_replies(server: FakeOpenAIServer, raw: str, code: str, words: str) -> None:
    server.add(raw)
    with pytest.raises(ModelBackendError) as err:
        openai(server).restructure(request())
    assert (err.value.code, err.value.path) == (code, "source/paziente.md")
    assert words in err.value.message


def test_openai_http_500_is_an_error_naming_the_source(server: FakeOpenAIServer) -> None:
    server.add(status=500, raw_body='{"error": {"message": "model crashed"}}')
    with pytest.raises(ModelBackendError) as err:
        openai(server).restructure(request())
    assert err.value.code == "model_http_error"
    assert err.value.path == "source/paziente.md"
    assert "HTTP 500" in err.value.message and "model crashed" in err.value.message
    assert len(server.received) == 1  # no retry


def test_openai_hang_times_out_without_retry(server: FakeOpenAIServer) -> None:
    server.add(VALID, delay_s=10)
    started = time.monotonic()
    with pytest.raises(ModelBackendError) as err:
        openai(server, timeout_s=0.5).restructure(request())
    elapsed = time.monotonic() - started
    assert err.value.code == "model_timeout"
    assert err.value.path == "source/paziente.md"
    # it gives up at the timeout, far before the 10 s reply (a loaded machine can add seconds of
    # client start-up); one request proves there was no retry
    assert 0.4 < elapsed < 8
    assert len(server.received) == 1


def test_openai_truncated_or_empty_completions_are_invalid(server: FakeOpenAIServer) -> None:
    server.add(VALID[:50], finish_reason="length")
    server.add(None)
    server.add(status=200, raw_body="<html>proxy error</html>")
    for words in ("cut off", "no message content", "not JSON"):
        with pytest.raises(ModelBackendError) as err:
            openai(server).restructure(request())
        assert err.value.code == "model_invalid_output"
        assert words in err.value.message


def test_openai_unreachable_endpoint() -> None:
    with FakeOpenAIServer() as gone:
        url = gone.url
    backend = OpenAIBackend(base_url=url, model="m", timeout_s=2)
    with pytest.raises(ModelBackendError) as err:
        backend.restructure(request())
    assert err.value.code in {"model_unreachable", "model_timeout"}
    assert err.value.path == "source/paziente.md"


# ---------------------------------------------------------------------------------------------
# pi: a fake executable run by the real subprocess code
# ---------------------------------------------------------------------------------------------


class FakePi:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.command = tmp_path / "bin" / "pi"
        self.command.parent.mkdir()
        self.command.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_PI}" "$@"\n',
                                encoding="utf-8")
        self.command.chmod(self.command.stat().st_mode | stat.S_IXUSR)
        self.script = tmp_path / "script.json"
        self.record_file = tmp_path / "record.json"
        monkeypatch.setenv("FAKE_PI_SCRIPT", str(self.script))
        monkeypatch.setenv("FAKE_PI_RECORD", str(self.record_file))

    def backend(self, mode: str, *, timeout_s: float = 20, **script: Any) -> PiBackend:
        self.script.write_text(json.dumps({"mode": mode, **script}), encoding="utf-8")
        return PiBackend(PiSettings(command=str(self.command), provider="llama-local",
                                    model="qwen", timeout_s=timeout_s))

    def record(self) -> dict[str, Any]:
        return json.loads(self.record_file.read_text(encoding="utf-8"))


@pytest.fixture
def fake_pi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakePi:
    return FakePi(tmp_path, monkeypatch)


def test_pi_valid_reply_in_a_clean_directory_without_tools(fake_pi: FakePi) -> None:
    reply = fake_pi.backend("reply", stdout=VALID + "\n").restructure(request())
    assert [u.id for u in reply.units] == ["evidence:fascia-pediatrica", None]
    rec = fake_pi.record()
    assert rec["listing"] == [".pi", ".pi/settings.json"]
    assert not Path(rec["cwd"]).exists()  # the temporary directory is gone
    assert rec["settings"]["retry"]["enabled"] is False
    assert rec["settings"]["retry"]["provider"]["maxRetries"] == 0
    argv = rec["argv"]
    for flag in ("-p", "--no-session", "--no-tools", "--no-extensions", "--no-skills",
                 "--no-context-files"):
        assert flag in argv
    assert argv[argv.index("--provider") + 1] == "llama-local"
    assert argv[argv.index("--model") + 1] == "qwen"
    assert "--system-prompt" in argv
    assert rec["prompt"].strip() == build_prompt(request()).strip()
    assert rec["pgid"] == rec["pid"] == rec["sid"]  # its own session and process group
    assert rec["env"]["PI_OFFLINE"] == "1"


@pytest.mark.parametrize(("raw", "code", "words"), BAD_REPLIES)
def test_pi_bad_replies(fake_pi: FakePi, raw: str, code: str, words: str) -> None:
    with pytest.raises(ModelBackendError) as err:
        fake_pi.backend("reply", stdout=raw).restructure(request())
    assert (err.value.code, err.value.path) == (code, "source/paziente.md")
    assert words in err.value.message


def test_pi_non_zero_exit_reports_a_bounded_stderr_tail(fake_pi: FakePi) -> None:
    stderr = "x" * 5000 + "\nNo API key found for llama-local."
    with pytest.raises(ModelBackendError) as err:
        fake_pi.backend("fail", stderr=stderr, exit=3).restructure(request())
    assert err.value.code == "model_process_failed"
    assert err.value.path == "source/paziente.md"
    assert "exited with status 3" in err.value.message
    assert "No API key found for llama-local." in err.value.message
    assert len(err.value.message) < 1700


def _alive(pid: int) -> bool:
    stat_file = Path(f"/proc/{pid}/stat")
    if stat_file.exists():
        try:
            state = stat_file.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in {"Z", "X"}
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_pi_hang_is_killed_with_its_process_group_by_the_wall_clock(fake_pi: FakePi) -> None:
    backend = fake_pi.backend("hang", timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(ModelBackendError) as err:
        backend.restructure(request())
    elapsed = time.monotonic() - started
    assert err.value.code == "model_timeout"
    assert err.value.path == "source/paziente.md"
    assert 1.0 <= elapsed < 4.0
    rec = fake_pi.record()
    deadline = time.monotonic() + 2
    while (_alive(rec["pid"]) or _alive(rec["child_pid"])) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(rec["pid"])
    assert not _alive(rec["child_pid"])  # the grandchild went with the group


def test_pi_missing_executable_is_a_process_error(tmp_path: Path) -> None:
    backend = PiBackend(PiSettings(command=str(tmp_path / "no-such-pi")))
    with pytest.raises(ModelBackendError) as err:
        backend.restructure(request())
    assert err.value.code == "model_process_failed"
    assert "cannot find the Pi CLI" in err.value.message


# ---------------------------------------------------------------------------------------------
# structural: deterministic, verbatim, flags its doubts
# ---------------------------------------------------------------------------------------------

EIGHT_KINDS = """\
# Fascia pediatrica

Classifica l'episodio in fascia pediatrica o adulta.
Colonne: clinical.patient.birth_date, clinical.episode.admission_date

```sql
CASE WHEN date_part('year', age(episode.admission_date::date, patient.birth_date)) < 18
  THEN 'pediatrica' ELSE 'adulta' END
```

# Esito della dimissione

Codici di clinical.episode.discharge_status:

| codice | significato |
|---|---|
| D | dimesso |
| T | trasferito |

# Anagrafica paziente

I dati anagrafici sono in clinical.patient, una riga per paziente.

# Normalizzazione codice fiscale

Il codice fiscale va normalizzato in maiuscolo senza spazi.

- rss mra 80a01 → RSSMRA80A01

# Ricovero

Il ricovero è la permanenza del paziente in ospedale. Sinonimi: degenza, ospedalizzazione.

# Episodi aperti

Gli episodi aperti vanno sempre esclusi dagli indicatori di durata.

# Domanda: quanti ricoveri nel 2024?

Interpretazione: episodi con data di ricovero nel 2024.

```sql
SELECT count(*) FROM clinical.episode
WHERE admission_date >= DATE '2024-01-01' AND admission_date < DATE '2025-01-01'
```

# Linea guida triage

https://example.org/linee-guida-triage

Documento nazionale sui codici di priorità.
"""


def structural(text: str, **kw: Any) -> ModelReply:
    kw.setdefault("previous", ())
    return StructuralBackend().restructure(request(text, source_file="source/note.md", **kw))


def blocks(reply: ModelReply) -> list[tuple[str, dict[str, Any]]]:
    return [(u.data["kind"], u.data[u.data["kind"]]) for u in reply.units]


def review_codes(reply: ModelReply) -> list[list[str]]:
    return [[r["code"] for r in u.data["review_items"]] for u in reply.units]


_WORD = re.compile(r"\w+")


def assert_verbatim(reply: ModelReply, req: ModelRequest, *, curated: tuple[str, ...] = ()
                    ) -> None:
    """Excerpts are found in the source; no word of a structured field is absent from it."""
    source_words = {w.casefold() for w in _WORD.findall(req.normalized_text)}

    def strings(value: Any) -> list[str]:
        if isinstance(value, str):
            return [value]
        if isinstance(value, dict):
            return [s for v in value.values() for s in strings(v)]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return []

    for u in reply.units:
        for excerpt in u.data["supporting_excerpts"]:
            assert excerpt_in_source(excerpt, req.normalized_text), excerpt
        if u.id in curated:
            continue  # a curator's wording, kept as it is
        kind = u.data["kind"]
        fields = [u.data["title"], u.data[kind], u.data["applies_to"]]
        if kind == "enum":
            fields.append(list(u.data["enum"]["values"]))  # the codes
        for text in strings(fields):
            invented = {w for w in _WORD.findall(text) if w.casefold() not in source_words}
            assert not invented, (u.data["title"], text, invented)
        full = {"schema_version": 1, "id": u.id or "evidence:x", "language": "it",
                "provenance": {"source_file": req.source_file,
                               "source_sha256": req.source_sha256,
                               "supporting_excerpts": u.data["supporting_excerpts"]},
                **{k: v for k, v in u.data.items() if k != "supporting_excerpts"}}
        parse_unit(full)


def test_structural_recognizes_each_kind_in_order() -> None:
    reply = structural(EIGHT_KINDS)
    assert [k for k, _ in blocks(reply)] == [
        "formula", "enum", "mapping", "normalization", "glossary", "domain", "example",
        "reference"]
    got = dict(blocks(reply))
    assert got["formula"]["concept"] == "Fascia pediatrica"
    assert got["formula"]["columns"] == ["clinical.patient.birth_date",
                                         "clinical.episode.admission_date"]
    assert got["formula"]["sql"].startswith("CASE WHEN")
    assert got["enum"] == {"column": "clinical.episode.discharge_status",
                           "values": {"D": "dimesso", "T": "trasferito"}}
    assert got["mapping"]["tables"] == ["clinical.patient"]
    assert got["normalization"]["examples"] == [{"raw": "rss mra 80a01",
                                                 "normalized": "RSSMRA80A01"}]
    assert got["glossary"]["term"] == "ricovero"
    assert got["glossary"]["synonyms"] == ["degenza", "ospedalizzazione"]
    assert "Sinonimi" not in got["glossary"]["definition"]
    assert got["domain"]["rule"].startswith("Gli episodi aperti vanno sempre esclusi")
    assert got["example"]["question"] == "quanti ricoveri nel 2024?"
    assert got["example"]["interpretation"] == "episodi con data di ricovero nel 2024."
    assert got["example"]["sql"].startswith("SELECT count(*)")
    assert got["reference"] == {"url": "https://example.org/linee-guida-triage",
                                "label": "Linea guida triage",
                                "description": "Documento nazionale sui codici di priorità."}
    assert review_codes(reply) == [[]] * 8
    # the purpose policy (docs/purposes.md): from what the unit says, not its kind alone
    purposes = {u.data["kind"]: u.data["purposes"] for u in reply.units}
    every = ["disambiguation", "rewriting", "schema_linking", "sql_generation"]
    assert purposes["formula"] == every
    assert purposes["enum"] == every
    assert purposes["mapping"] == every
    assert purposes["normalization"] == ["disambiguation", "rewriting", "sql_generation"]
    assert purposes["glossary"] == ["disambiguation", "rewriting", "sql_generation"]
    assert purposes["domain"] == ["disambiguation", "rewriting", "sql_generation"]
    assert purposes["example"] == every  # its SQL names clinical.episode
    assert purposes["reference"] == ["disambiguation", "rewriting"]
    assert_verbatim(reply, request(EIGHT_KINDS, source_file="source/note.md", previous=()))


def test_structural_purposes_follow_what_the_unit_says() -> None:
    """The same kinds get schema_linking (and a reference sql_generation) once they name a
    table or a column: the purpose policy reads the unit, not only its kind."""
    reply = structural(
        "# Ricovero\n\nIl ricovero è la permanenza registrata in clinical.episode. "
        "Sinonimi: degenza.\n\n"
        "# Episodi aperti\n\nGli episodi con clinical.episode.discharge_date vuota vanno "
        "esclusi dagli indicatori di durata.\n\n"
        "# Tracciato SDO\n\n- [Tracciato SDO](https://example.org/sdo): descrive "
        "clinical.episode.\n")
    got = {u.data["kind"]: u.data["purposes"] for u in reply.units}
    every = ["disambiguation", "rewriting", "schema_linking", "sql_generation"]
    assert got == {"glossary": every, "domain": every, "reference": every}


@pytest.mark.parametrize(("kind", "names", "expected"), [
    ("reference", False, ("disambiguation", "rewriting")),
    ("glossary", False, ("disambiguation", "rewriting", "sql_generation")),
    ("mapping", True, ("disambiguation", "rewriting", "schema_linking", "sql_generation")),
])
def test_purpose_policy(kind: str, names: bool, expected: tuple[str, ...]) -> None:
    from evidence_pipeline.authoring.backends.structural.purposes import (
        names_schema,
        policy_purposes,
    )

    assert tuple(p.value for p in policy_purposes(EvidenceKind(kind),
                                                  names_schema=names)) == expected
    assert names_schema([], [], {"column": "clinical.episode.x"})
    assert names_schema([], [], {"sql": "SELECT 1 FROM clinical.episode"})
    assert not names_schema([], [], {"term": "ricovero", "definition": "..."})


def test_structural_is_deterministic() -> None:
    assert structural(EIGHT_KINDS) == structural(EIGHT_KINDS)


@pytest.mark.parametrize(("text", "code", "field"), [
    ("# Note varie\n\nIl reparto di cardiologia ha sede al terzo piano.\n",
     "structural_classification_uncertain", "kind"),
    ("# Esclusioni\n\nForse i DH vanno esclusi dal conteggio.\n",
     "ambiguous_source_statement", "domain.rule"),
    ("Calcolo dell'età dei pazienti:\n\n```sql\nSELECT age(birth_date) FROM patient\n```\n",
     "structural_classification_uncertain", "kind"),
    ("# Età\n\nL'età si calcola così:\n\n```sql\nage(birth_date)\n```\n",
     "structural_classification_uncertain", "kind"),
    ("# Esempi\n\n## Ricoveri per reparto\n\nInterpretazione: conteggio per reparto.\n\n"
     "```sql\nSELECT ward_code, count(*) FROM clinical.episode GROUP BY 1\n```\n",
     "structural_field_uncertain", "example.question"),
])
def test_structural_flags_what_it_is_not_sure_of(text: str, code: str, field: str) -> None:
    reply = structural(text)
    items = [r for u in reply.units for r in u.data["review_items"]]
    assert {"code": code, "field": field} in [{"code": r["code"], "field": r.get("field")}
                                              for r in items]
    assert_verbatim(reply, request(text, source_file="source/note.md", previous=()))


def test_structural_flags_atomic_content_longer_than_max_chunk_chars() -> None:
    reply = structural(EIGHT_KINDS, max_chunk_chars=60)
    formula = next(u for u in reply.units if u.data["kind"] == "formula")
    assert {"code": "atomic_content_too_large", "field": "formula.sql"} in [
        {"code": r["code"], "field": r.get("field")} for r in formula.data["review_items"]]
    assert formula.data["formula"]["sql"].endswith("END")  # never cut


def curate(reply: ModelReply, req: ModelRequest, ids: list[str]) -> tuple[PreviousUnit, ...]:
    """What prepare would have written: ids, envelope, body with its title heading."""
    out = []
    for uid, u in zip(ids, reply.units, strict=True):
        data = dict(u.data)
        excerpts = data.pop("supporting_excerpts")
        front = {"schema_version": 1, "id": uid, **data, "language": "it",
                 "provenance": {"source_file": req.source_file,
                                "source_sha256": req.source_sha256,
                                "supporting_excerpts": excerpts}}
        out.append(PreviousUnit(id=uid, data=front,
                                body=f"\n# {data['title']}\n\n{u.body}\n"))
    return tuple(out)


EDITED = (EIGHT_KINDS
          # a row more in the enum table
          .replace("| T | trasferito |", "| T | trasferito |\n| X | deceduto |")
          # the domain rule gains a formula: reclassified, same first excerpt
          .replace("dagli indicatori di durata.\n",
                   "dagli indicatori di durata.\nColonna: clinical.episode.discharge_date\n\n"
                   "```sql\nepisode.discharge_date IS NULL\n```\n")
          # the reference is gone, a new section arrives
          .split("# Linea guida triage")[0]
          + "# Presidio\n\nIl presidio è la sede ospedaliera dell'azienda.\n")


@pytest.mark.parametrize("with_previous_text", [False, True])
def test_structural_keeps_ids_reclassifies_and_proposes_retirement(
        with_previous_text: bool) -> None:
    first_req = request(EIGHT_KINDS, source_file="source/note.md", previous=())
    first = StructuralBackend().restructure(first_req)
    ids = [f"evidence:u{n}" for n in range(len(first.units))]
    previous = curate(first, first_req, ids)
    # a curator fixes a unit: unchanged source text keeps the correction
    fixed = dict(previous[4].data, title="Ricovero ospedaliero")
    previous = (*previous[:4], PreviousUnit(previous[4].id, fixed,
                                            previous[4].body.replace("# Ricovero", "# R")),
                *previous[5:])

    req = request(EDITED, source_file="source/note.md", previous=previous,
                  previous_text=EIGHT_KINDS if with_previous_text else None)
    reply = StructuralBackend().restructure(req)
    by_id = {u.id: u for u in reply.units}
    assert set(by_id) == {"evidence:u0", "evidence:u1", "evidence:u2", "evidence:u3",
                          "evidence:u4", "evidence:u5", "evidence:u6", None}
    # unchanged units come back exactly as curated
    for n in (0, 2, 3, 6):
        kept = by_id[f"evidence:u{n}"]
        assert kept.data == first.units[n].data
        assert kept.body == first.units[n].body
    assert by_id["evidence:u4"].data["title"] == "Ricovero ospedaliero"
    # changed text: same id, new content
    assert by_id["evidence:u1"].data["enum"]["values"] == {"D": "dimesso", "T": "trasferito",
                                                           "X": "deceduto"}
    assert by_id["evidence:u5"].data["kind"] == "formula"  # reclassified, id kept
    assert by_id[None].data["glossary"]["term"] == "presidio"
    assert [(r.id, "no longer supports" in r.message)
            for r in reply.retirement_candidates] == [("evidence:u7", True)]
    assert_verbatim(reply, req, curated=("evidence:u4",))


def test_structural_unchanged_note_returns_the_previous_units_as_they_are() -> None:
    req0 = request(EIGHT_KINDS, source_file="source/note.md", previous=())
    first = StructuralBackend().restructure(req0)
    previous = curate(first, req0, [f"evidence:u{n}" for n in range(len(first.units))])
    again = StructuralBackend().restructure(
        request(EIGHT_KINDS, source_file="source/note.md", previous=previous))
    assert [u.id for u in again.units] == [p.id for p in previous]
    assert [u.data for u in again.units] == [u.data for u in first.units]
    assert again.retirement_candidates == ()


def test_structural_through_the_factory() -> None:
    backend = make_backend("structural", {"pi": {"command": "pi"}})
    assert backend.restructure(request(EIGHT_KINDS, source_file="source/note.md",
                                       previous=())) == structural(EIGHT_KINDS)


DEMO_NOTES = sorted(p for p in DEMO_SOURCES.rglob("*") if p.is_file()) \
    if DEMO_SOURCES.is_dir() else []


@pytest.mark.skipif(not DEMO_NOTES, reason="demo notes not present")
def test_structural_on_the_demo_notes_is_verbatim_deterministic_and_valid() -> None:
    kinds: set[str] = set()
    for path in DEMO_NOTES:
        text = path.read_text(encoding="utf-8")
        rel = "source/" + path.relative_to(DEMO_SOURCES).as_posix()
        req = request(text, source_file=rel, previous=())
        reply = StructuralBackend().restructure(req)
        assert reply.units, rel
        assert reply == StructuralBackend().restructure(req)
        assert_verbatim(reply, req)
        kinds.update(u.data["kind"] for u in reply.units)
    assert kinds == {k.value for k in EvidenceKind}


# ---------------------------------------------------------------------------------------------
# A real model, when one is configured (THT_LLM_BASE_URL, THT_LLM_MODEL, THT_LLM_API_KEY)
# ---------------------------------------------------------------------------------------------


@pytest.mark.llm
@pytest.mark.skipif(not os.environ.get("THT_LLM_BASE_URL"),
                    reason="no model endpoint configured (THT_LLM_BASE_URL)")
def test_openai_against_a_configured_endpoint() -> None:
    backend = make_backend("openai", {"timeout_s": float(os.environ.get("THT_LLM_TIMEOUT_S",
                                                                         "600"))})
    req = request(EIGHT_KINDS, source_file="source/note.md", previous=())
    reply = backend.restructure(req)  # schema-constrained: must parse, ids must be new
    assert reply.units
    assert all(u.id is None for u in reply.units)
    assert reply.retirement_candidates == ()
