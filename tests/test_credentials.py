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


def test_found_inside_a_longer_text_and_named_without_the_secret() -> None:
    body = ("# Accesso al DWH\n\nIl job notturno si collega come etl.\n"
            "dwh.ospedale.local:5432:psd:etl_user:S3gret0!\n\nFine.\n")
    [p] = credential_problems({"title": "Accesso"}, body, path="evidence/curated/x.md",
                              evidence_id="evidence:x")
    assert (p.code, p.field) == ("credentials_found", "body")
    assert ".pgpass line" in p.message and "S3gret0" not in p.message


def test_credential_figures() -> None:
    missed = [line for line in POSITIVE if not find_credentials(line)]
    false_positives = [line for line in NEGATIVE if find_credentials(line)]
    print_at_end(f"credential corpus: {len(POSITIVE)} positive, "
                 f"{len(POSITIVE) - len(missed)} found, {len(missed)} missed; "
                 f"{len(NEGATIVE)} look-alike, {len(false_positives)} false positive(s)")
    assert missed == [] and false_positives == []
