"""The credential rules against a corpus (issue 14, item 5): every positive line is found, no
look-alike is. The corpus is ``tests/fixtures/credentials/{positive,negative}.txt``, one case a
line; the figures are printed at the end of the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from evidence_pipeline.validation.credentials import credential_problems, find_credentials
from tests.helpers import print_at_end

CORPUS = Path(__file__).parent / "fixtures" / "credentials"


def cases(name: str) -> list[str]:
    lines = (CORPUS / name).read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


POSITIVE = cases("positive.txt")
NEGATIVE = cases("negative.txt")


def test_the_corpus_is_large_enough() -> None:
    assert len(POSITIVE) >= 40 and len(NEGATIVE) >= 40
    assert len(set(POSITIVE)) == len(POSITIVE) and len(set(NEGATIVE)) == len(NEGATIVE)


@pytest.mark.parametrize("line", POSITIVE)
def test_credential_is_found(line: str) -> None:
    assert find_credentials(line), line


@pytest.mark.parametrize("line", NEGATIVE)
def test_look_alike_is_not_a_credential(line: str) -> None:
    assert find_credentials(line) == [], line


# Forms a file cannot show (issue 28, item 9): invisible characters inside the keyword, written
# as escapes; each must be found, and its look-alike (the same text, no secret) must not be.
INVISIBLE_FORMS = [
    "pass\u200bword=S3gret0x",  # ZERO WIDTH SPACE
    "PGPASS\u200dWORD=S3gret0x",  # ZERO WIDTH JOINER
    "pass\u00adword: S3gret0x",  # SOFT HYPHEN
    "PG\u2060PASSWORD=S3gret0x",  # WORD JOINER
    "\ufeffPGPASSWORD=S3gret0x",  # BYTE ORDER MARK inside a line
    "pass\u202eword=S3gret0x",  # RIGHT-TO-LEFT OVERRIDE
    "ＰＧＰＡＳＳ\u200bＷＯＲＤ＝S3gret0x",  # fullwidth and zero-width together
    "pass\U000e0020word=S3gret0x",  # a TAG character
]
INVISIBLE_LOOK_ALIKES = [
    "pass\u200bword policy: almeno 12 caratteri",
    "PGPASS\u200dWORD=$PGPASS",
    "La pass\u00adword è chiesta a mano.",
    "ＰＧＰＡＳＳＷＯＲＤ non è impostata.",
]


@pytest.mark.parametrize("line", INVISIBLE_FORMS)
def test_credential_with_invisible_characters_is_found(line: str) -> None:
    assert find_credentials(line), ascii(line)


@pytest.mark.parametrize("line", INVISIBLE_LOOK_ALIKES)
def test_invisible_look_alike_is_not_a_credential(line: str) -> None:
    assert find_credentials(line) == [], ascii(line)


def test_found_inside_a_longer_text_and_named_without_the_secret() -> None:
    body = ("# Accesso al DWH\n\nIl job notturno si collega come etl.\n"
            "dwh.ospedale.local:5432:psd:etl_user:S3gret0!\n\nFine.\n")
    [p] = credential_problems({"title": "Accesso"}, body, path="evidence/curated/x.md",
                              evidence_id="evidence:x")
    assert (p.code, p.field) == ("credentials_found", "body")
    assert ".pgpass line" in p.message and "S3gret0" not in p.message


def test_credential_figures() -> None:
    positive, negative = POSITIVE + INVISIBLE_FORMS, NEGATIVE + INVISIBLE_LOOK_ALIKES
    missed = [line for line in positive if not find_credentials(line)]
    false_positives = [line for line in negative if find_credentials(line)]
    print_at_end(f"credential corpus: {len(positive)} positive, "
                 f"{len(positive) - len(missed)} found, {len(missed)} missed; "
                 f"{len(negative)} look-alike, {len(false_positives)} false positive(s)")
    assert missed == [] and false_positives == []
