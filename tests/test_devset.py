"""The hard dev set (bench/devset/psd-dev.yaml) stays valid against the demo corpus, and its
semantic-overlap check really finds shared words (issue 16 item 3)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import devset_check  # noqa: E402

from evidence_pipeline.demo import DEMO_SOURCE  # noqa: E402
from evidence_pipeline.formats.evalset import read_evaluation  # noqa: E402


@pytest.fixture(scope="module")
def corpus() -> dict[str, devset_check.CorpusUnit]:
    return devset_check.read_corpus(DEMO_SOURCE / "evidence")


def test_devset_has_no_problems(corpus: dict[str, devset_check.CorpusUnit]) -> None:
    questions = devset_check.load_devset()
    gate = [q.text for q in read_evaluation(DEMO_SOURCE / "evidence").queries]
    checked = devset_check.check_devset(questions, corpus, gate)
    assert checked["problems"] == []
    assert checked["questions"] >= 120
    assert min(checked["per_profile"].values()) >= 40
    assert len(checked["expected_kinds"]) == 8
    assert set(checked["per_purpose"]) == set(devset_check.PURPOSES)


def test_overlap_check_finds_stems_and_prefixes(corpus: dict[str, devset_check.CorpusUnit]
                                                ) -> None:
    unit = corpus["evidence:fascia-pediatrica"]
    keys = devset_check.WordKeys()
    pairs = devset_check.shared_words(keys, "Quanti pazienti pediatrici in ospedale?",
                                      unit.text + unit.source)
    assert ("pazienti", "pazienti") in pairs
    assert ("pediatrici", "pediatrica") in pairs  # same stem
    assert not [p for p in pairs if p[0] in ("quanti", "in")]  # stop words never count
    drg = corpus["evidence:drg"]
    assert ("gruppi", "gruppo") in devset_check.shared_words(keys, "gruppi tariffari",
                                                             drg.text + drg.source)
    assert devset_check.shared_words(keys, "Come filtro le donne?", unit.text) == []
