"""LoCoMo conversations as memories and questions, and evidence recall@k.

LoCoMo: Maharana et al., "Evaluating Very Long-Term Conversational Memory of LLM
Agents", ACL 2024 (snap-research/locomo, CC BY-NC 4.0). Each turn becomes one
memory ``"{speaker}: {text}"`` (plus ``[shares a photo of …]`` when the turn
carried an image caption), with its session date as metadata. A question's
evidence recall@k is the share of its evidence turns in the top k results.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

CATEGORY_NAMES = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}

_DIA_ID = re.compile(r"D:?(\d+):(\d+)")
_SESSION_KEY = re.compile(r"session_(\d+)$")


@dataclass(frozen=True)
class Turn:
    dia_id: str
    session: int
    index: int
    speaker: str
    text: str
    session_date: str
    image_caption: str = ""

    def memory_text(self, *, with_caption: bool = True) -> str:
        body = f"{self.speaker}: {self.text}"
        if with_caption and self.image_caption:
            body += f" [shares a photo of {self.image_caption.removeprefix('a photo of ')}]"
        return body


@dataclass(frozen=True)
class Question:
    text: str
    category: int
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class Conversation:
    name: str
    speakers: tuple[str, str]
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]


def parse_session_date(value: str) -> datetime | None:
    """LoCoMo dates look like '1:56 pm on 8 May, 2023'."""
    try:
        return datetime.strptime(value.strip(), "%I:%M %p on %d %B, %Y")
    except ValueError:
        return None


def normalise_evidence(raw: Iterable[str]) -> list[str]:
    """Evidence ids as released include 'D8:6; D9:17' and 'D:11:26'; keep well-formed ids."""
    ids: list[str] = []
    for item in raw:
        for session, turn in _DIA_ID.findall(str(item)):
            ids.append(f"D{int(session)}:{int(turn)}")
    return list(dict.fromkeys(ids))


def load_conversation(path: Path | str) -> Conversation:
    path = Path(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    conv = data.get("conversation", data)  # the full locomo10.json nests it
    turns: list[Turn] = []
    sessions = sorted(
        (int(m.group(1)), key)
        for key in conv
        if (m := _SESSION_KEY.match(key)) and isinstance(conv[key], list)
    )
    for number, key in sessions:
        date = str(conv.get(f"{key}_date_time", ""))
        for index, raw in enumerate(conv[key]):
            turns.append(
                Turn(
                    dia_id=str(raw["dia_id"]),
                    session=number,
                    index=index,
                    speaker=str(raw["speaker"]),
                    text=str(raw.get("text", "")),
                    session_date=date,
                    image_caption=str(raw.get("blip_caption", "") or ""),
                )
            )
    known = {t.dia_id for t in turns}
    questions: list[Question] = []
    for qa in data.get("qa", []):
        evidence = tuple(e for e in normalise_evidence(qa.get("evidence", [])) if e in known)
        if evidence:
            questions.append(Question(str(qa["question"]), int(qa.get("category", 0)), evidence))
    speakers = (str(conv.get("speaker_a", "")), str(conv.get("speaker_b", "")))
    return Conversation(path.stem, speakers, tuple(turns), tuple(questions))


def evidence_recall(ranked: Sequence[str], evidence: Sequence[str], k: int) -> float:
    """Share of ``evidence`` ids among the first k of ``ranked``."""
    top = set(ranked[:k])
    return sum(1 for e in evidence if e in top) / len(evidence)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100.0 * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass
class RecallReport:
    """Accumulates per-question recall at several k, overall and per category."""

    ks: tuple[int, ...]
    latencies_ms: list[float] = field(default_factory=list)
    _sums: dict[tuple[str, int], float] = field(default_factory=lambda: defaultdict(float))
    _counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(
        self, question: Question, ranked: Sequence[str], latency_ms: float | None = None
    ) -> None:
        groups = ("all", CATEGORY_NAMES.get(question.category, str(question.category)))
        for group in groups:
            self._counts[group] += 1
            for k in self.ks:
                self._sums[(group, k)] += evidence_recall(ranked, question.evidence, k)
        if latency_ms is not None:
            self.latencies_ms.append(latency_ms)

    def recall(self, k: int, group: str = "all") -> float:
        count = self._counts.get(group, 0)
        return self._sums.get((group, k), 0.0) / count if count else 0.0

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {f"recall@{k}": round(self.recall(k), 4) for k in self.ks}
        out["queries"] = self._counts.get("all", 0)
        out["search_p50_ms"] = round(percentile(self.latencies_ms, 50), 3)
        out["search_p95_ms"] = round(percentile(self.latencies_ms, 95), 3)
        categories: dict[str, Mapping[str, float | int]] = {}
        for group, count in sorted(self._counts.items()):
            if group != "all":
                categories[group] = {
                    "queries": count,
                    **{f"recall@{k}": round(self.recall(k, group), 4) for k in self.ks},
                }
        out["categories"] = categories
        return out
