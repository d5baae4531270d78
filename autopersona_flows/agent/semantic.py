"""The semantic judge: meaning from a sentence encoder, structure from the lexical reading.

Words cannot tell "dietary needs" from "what I eat"; a sentence encoder can, but it
measures *relatedness*, not whether a memory *answers*: "hotel booking method" is
close to "hotel budget". `SemanticJudge` combines the two in a small model fitted on
data (``autopersona_flows/weights/judge.json``, refitted by
``training/fit_judge.py``):

- **meaning**: cosines of the requirement (its name; its name, description and
  options), the request's work (query and node) and each candidate's stored vector,
  and how far a candidate stands above the others for the requirement;
- **structure**: `LexicalJudge`'s reading of the candidate: how its topic relates to
  the requirement's name, whether it states or rejects a declared option, names the
  attribute, holds a value of the attribute's shape, says the preference stopped or
  changed, was learned at this node;
- **situation**: a preference tied to a circumstance ("on work trips, the aisle",
  see `memory.situations`) answers only in a request in that situation, judged by
  the encoder; its general part ("otherwise the window") elsewhere.

The model gives each candidate the probability that it answers the requirement
(``strength``); the policy's threshold applies to it as to the lexical judge's
strengths. Two readings stay rules, since they are structure, not meaning: a value
for a requirement with options is one of the options (or the candidate does not
answer), and a memory rejecting an option never answers with it.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from autopersona_flows.agent.decisions import PersonaRequest, Requirement
from autopersona_flows.agent.judges import LexicalJudge, Reading, Verdict
from autopersona_flows.agent.planners import requirement_text
from autopersona_flows.agent.reading import Need
from autopersona_flows.errors import PolicyError
from autopersona_flows.memory.embedders import Embedder
from autopersona_flows.memory.encoders import WEIGHTS, shared_encoder
from autopersona_flows.memory.extraction import is_question
from autopersona_flows.memory.records import MemoryRecord, PersonaMemory, TrajectoryMemory
from autopersona_flows.memory.retrieval import ScoredMemory
from autopersona_flows.memory.situations import Part, situated
from autopersona_flows.memory.text import memory_text

__all__ = ["FEATURES", "AnswerhoodModel", "SemanticJudge"]

FEATURES: tuple[str, ...] = (
    "cos_requirement",
    "cos_name",
    "cos_work",
    "margin_requirement",
    "top_requirement",
    "cos_option_gap",
    "lexical_strength",
    "lexical_answers",
    "lexical_choice",
    "ceases",
    "changes",
    "relation_match",
    "relation_partial",
    "relation_about",
    "relation_subject",
    "relation_conflict",
    "options_declared",
    "option_stated",
    "option_preferred",
    "option_rejected",
    "attribute_named",
    "attribute_elsewhere",
    "shape_needed",
    "shape_found",
    "layer_trajectory",
    "layer_workspace",
    "situated",
    "situation_holds",
    "situation_similarity",
    "trajectory_x_cos_work",
    "persona_x_cos_requirement",
    "has_insight",
    "someone_else",
    "asks",
)
"""The features of a (requirement, candidate) pair, in the model's order."""


class AnswerhoodModel:
    """A logistic model over `FEATURES`, read from a JSON file of weights.

    The file holds ``features`` (names, in order), ``mean`` and ``scale`` (the
    standardisation), ``coef`` and ``intercept`` of the answer head, and the
    ``situation`` threshold (the cosine from which a situation counts as the
    request's). It is written by ``training/fit_judge.py``.

    Raises:
        PolicyError: If the file is missing, unreadable, or names other features.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else WEIGHTS / "judge.json"
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if tuple(data["features"]) != FEATURES:
                missing = sorted(set(FEATURES) - set(data["features"]))
                extra = sorted(set(data["features"]) - set(FEATURES))
                raise ValueError(
                    f"they were fitted for other features (missing {missing}, extra {extra}, "
                    "or another order); refit them with training/fit_judge.py"
                )
            self.mean = np.asarray(data["mean"], dtype=np.float64)
            self.scale = np.asarray(data["scale"], dtype=np.float64)
            self.coef = np.asarray(data["coef"], dtype=np.float64)
            self.intercept = float(data["intercept"])
            self.slot_coef = np.asarray(data["slot_coef"], dtype=np.float64)
            self.slot_intercept = float(data["slot_intercept"])
            self.situation = float(data["situation"])
            self.request_band = float(data.get("request_band", 0.05))
            self.answering = float(data.get("answering", 0.35))
            self.meta: dict[str, Any] = data.get("meta", {})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PolicyError(f"cannot read the judge's weights from {self.path}: {exc}") from exc

    def __repr__(self) -> str:
        return f"AnswerhoodModel({self.path.name!r})"

    def predict(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Score feature rows.

        Returns:
            For each row, the probability that its candidate answers its requirement, and
            that it is about the requirement's slot at all (see `SemanticJudge`).
        """
        if not len(features):
            return np.zeros(0), np.zeros(0)
        z = (features - self.mean) / self.scale
        answer = z @ self.coef + self.intercept
        slot = z @ self.slot_coef + self.slot_intercept
        return 1.0 / (1.0 + np.exp(-answer)), 1.0 / (1.0 + np.exp(-slot))


_DEFAULT: AnswerhoodModel | None = None
_DEFAULT_LOCK = threading.Lock()


def _default_model() -> AnswerhoodModel:
    global _DEFAULT  # noqa: PLW0603 - one copy of the shipped weights per process
    if _DEFAULT is None:
        with _DEFAULT_LOCK:
            if _DEFAULT is None:
                _DEFAULT = AnswerhoodModel()
    return _DEFAULT


@dataclass(frozen=True)
class _Candidate:
    """One candidate of one requirement, read for the request's situation."""

    memory: ScoredMemory
    reading: Reading
    situated: bool
    holds: bool  # the part that applies here (its situation's, or the general one)
    situation: str | None  # the situation of the part that applies, if specific
    option: str | None = None  # the declared option it gives: stated, or left by rejections
    other: Part | None = None  # when no part holds here: its best part, for another situation
    similarity: float = 0.0  # of its closest stated situation to the request's
    rejected: bool = False  # it rules out a declared option
    learned: bool = False  # the person's answer for this requirement's slot (see _learned_slots)
    here: bool = False  # an answer learned at this node or for this request, whatever its topic
    fits: bool = True  # its value has the requirement's shape (an option, a time...)
    # A learned answer: how near its question is to the requirement (1.0: not learned;
    # a learned one near enough is the same need in other words, whatever its topic).
    asked_for: float = 1.0


class SemanticJudge:
    """The default judge: a fitted model over meaning and structure (module documentation).

    Args:
        encoder: The sentence encoder whose vector space the model was fitted in; the
            shipped one by default. Memories stored with its vectors are not encoded
            again; others are encoded once per text (and cached).
        model: The fitted weights; the shipped ones by default.
        lexical: The structural reading; a plain `LexicalJudge` by default.
    """

    def __init__(
        self,
        encoder: Embedder | None = None,
        model: AnswerhoodModel | None = None,
        *,
        lexical: LexicalJudge | None = None,
    ) -> None:
        self.encoder = encoder if encoder is not None else shared_encoder()
        self.model = model if model is not None else _default_model()
        self.lexical = lexical if lexical is not None else LexicalJudge()

    def __repr__(self) -> str:
        return f"SemanticJudge({self.encoder!r}, {self.model!r})"

    def judge(
        self, request: PersonaRequest, candidates: Mapping[str, Sequence[ScoredMemory]]
    ) -> dict[str, list[Verdict]]:
        """Judge each requirement's candidates; see the module documentation."""
        rows, places, read = self.features(request, candidates)
        answers, slots = self.model.predict(rows)
        _answered_here(places, read, answers)
        verdicts: dict[str, list[Verdict]] = {name: [] for name in candidates}
        requirements = {requirement.name: requirement for requirement in request.requirements}
        for (name, _), candidate, answer, slot in zip(places, read, answers, slots, strict=True):
            verdicts[name].append(
                _verdict(requirements[name], candidate, float(answer), float(slot))
            )
        for name, found in verdicts.items():
            self._nearest_situation(request, candidates[name], found)
        return verdicts

    def _nearest_situation(
        self, request: PersonaRequest, memories: Sequence[ScoredMemory], verdicts: list[Verdict]
    ) -> None:
        """Of answers that disagree, keep those said for situations nearest the request's.

        A memory's circumstances are what it was said for: the situations it names
        ("on work trips") and the request it was learned for ("the client pitch in
        Leeds"). An answer with none holds in general, as near as
        `AnswerhoodModel.situation`: a named
        situation the request is in outranks it, one it is not in yields to it.
        Answers about as near as the nearest (within ``model.request_band``) all stay;
        the policy's newest-first picks among them. "Quiet coach" learned for a client
        pitch and "table for four" for a hen do: a board meeting takes the first.
        """
        answering = [
            i
            for i, verdict in enumerate(verdicts)
            if verdict.answers and verdict.strength >= self.model.answering
        ]
        values = {" ".join((verdicts[i].value or "").casefold().split()) for i in answering}
        if len(values) < 2:
            return
        said = {i: self._circumstances(memories[i]) for i in answering}
        phrases = list(dict.fromkeys(p for found in said.values() for p in found))
        if not phrases:
            return
        near = dict(zip(phrases, self.encoder.embed(phrases) @ self._query(request), strict=True))
        nearness = {
            i: max((float(near[p]), p) for p in found) if found else (self.model.situation, "")
            for i, found in said.items()
        }
        best = max(score for score, _ in nearness.values())
        for i, (score, where) in nearness.items():
            if score < best - self.model.request_band:
                verdicts[i] = verdicts[i].model_copy(
                    update={
                        "answers": False,
                        "reason": f"said for another situation ({where!r})"
                        if where
                        else "said in general, and the request is in a situation named",
                        "hint": f"but for {where!r}" if where else "",
                    }
                )

    @staticmethod
    def _circumstances(memory: ScoredMemory) -> list[str]:
        """What a persona memory was said for.

        The situations it names and the request it was learned for (see
        `_nearest_situation`).
        """
        content = memory.record.content
        if not isinstance(content, PersonaMemory):
            return []
        found = [part.situation for part in _parts(content) if part.situation]
        return [*found, content.request] if content.request else found

    def features(
        self, request: PersonaRequest, candidates: Mapping[str, Sequence[ScoredMemory]]
    ) -> tuple[np.ndarray, list[tuple[str, int]], list[_Candidate]]:
        """The feature rows of every (requirement, candidate) pair, and where each belongs.

        Returns:
            The rows (one per pair, `FEATURES` in order), each row's requirement name
            and candidate index, and how each candidate was read.
        """
        requirements = {requirement.name: requirement for requirement in request.requirements}
        names = [name for name, memories in candidates.items() if memories]
        if not names:
            return np.zeros((0, len(FEATURES))), [], []
        needs = {name: Need.of(requirements[name], request) for name in names}
        records = {m.record.id: m.record for name in names for m in candidates[name]}
        vectors = self._memory_vectors(list(records.values()))
        texts = []
        for name in names:
            texts += [requirement_text(requirements[name]), name, *requirements[name].options]
        encoded = dict(zip(texts, self.encoder.embed(texts), strict=True))
        work = self._work(request)
        situations = self._situations(request, records.values(), self._query(request))
        read = {
            name: [
                self._read(requirements[name], needs[name], m, situations.get(m.record.id))
                for m in candidates[name]
            ]
            for name in names
        }
        self._learned_slots(request, needs, candidates, read)
        self._asked_for(requirements, read)
        rows: list[list[float]] = []
        places: list[tuple[str, int]] = []
        for name in names:
            requirement = requirements[name]
            memories = candidates[name]
            matrix = np.stack([vectors[m.record.id] for m in memories])
            cos_requirement = matrix @ encoded[requirement_text(requirement)]
            cos_name = matrix @ encoded[name]
            cos_work = matrix @ work
            if requirement.options:
                by_option = matrix @ np.stack([encoded[o] for o in requirement.options]).T
                option_gap = by_option.max(axis=1) - by_option.mean(axis=1)
            else:
                option_gap = np.zeros(len(memories))
            order = np.argsort(-cos_requirement)
            for i, (memory, candidate) in enumerate(zip(memories, read[name], strict=True)):
                others = [j for j in order[:2] if j != i]
                best_other = float(cos_requirement[others[0]]) if len(memories) > 1 else 0.0
                rows.append(
                    [
                        float(cos_requirement[i]),
                        float(cos_name[i]),
                        float(cos_work[i]),
                        float(cos_requirement[i]) - best_other,
                        float(order[0] == i),
                        float(option_gap[i]),
                        *_structure(candidate, requirement, needs[name]),
                        float(memory.record.layer == "trajectory"),
                        float(memory.record.layer == "workspace"),
                        float(candidate.situated),
                        float(candidate.situation is not None),
                        candidate.similarity,
                        float(memory.record.layer == "trajectory") * float(cos_work[i]),
                        float(memory.record.layer == "persona") * float(cos_requirement[i]),
                        float(bool(getattr(memory.record.content, "insight", ""))),
                        float(_someone_else(memory.record, request)),
                        float(is_question(_value_text(memory.record, candidate) or "")),
                    ]
                )
                places.append((name, i))
        flat = [candidate for name in names for candidate in read[name]]
        return np.asarray(rows, dtype=np.float64), places, flat

    def _asked_for(
        self, requirements: Mapping[str, Requirement], read: dict[str, list[_Candidate]]
    ) -> None:
        """How near each learned answer's question is to the requirement judged.

        An answer learned for a question ("airline: British Airways") answers that
        need, named in any words ("which carrier"), not another need of the same job
        ("hotel"), however near the job makes it.
        """
        topics = {
            c.memory.record.content.topic
            for found in read.values()
            for c in found
            if isinstance(c.memory.record.content, PersonaMemory)
            and c.memory.record.content.request
        }
        if not topics:
            return
        texts = [*topics, *read]
        vectors = dict(zip(texts, self.encoder.embed(texts), strict=True))
        for name, found in read.items():
            for i, candidate in enumerate(found):
                content = candidate.memory.record.content
                if isinstance(content, PersonaMemory) and content.request:
                    near = float(vectors[content.topic] @ vectors[name])
                    found[i] = replace(candidate, asked_for=near)

    def _learned_slots(
        self,
        request: PersonaRequest,
        needs: Mapping[str, Need],
        candidates: Mapping[str, Sequence[ScoredMemory]],
        read: dict[str, list[_Candidate]],
    ) -> None:
        """Mark the answers learned for a requirement: they answer it, by construction.

        An answer the person gave to a question answers the question again: in the
        same words ("seat preference": its topic names the requirement), or, at the
        node or for the request it was asked for, in other words ("where to sit"),
        when the lexical reading (`LexicalJudge.learned_here`) finds it fits.
        """
        lexical = {name: [c.reading.verdict for c in read[name]] for name in read}
        before = {name: list(found) for name, found in lexical.items()}
        self.lexical.learned_here(request, needs, {n: candidates[n] for n in read}, lexical)
        node = request.node
        # At the node it was asked at, an answer answers its question in any words;
        # elsewhere in the job, only as the lexical rule links it (a tip is no hotel
        # budget).
        here = {
            " ".join(text.casefold().split())
            for text in ((node.id, node.instruction) if node else ())
            if text.strip()
        }
        for name, found in read.items():
            for i, candidate in enumerate(found):
                content = candidate.memory.record.content
                if not isinstance(content, PersonaMemory) or not (
                    content.request or content.contexts
                ):
                    continue
                learned_here = bool(
                    {" ".join(c.casefold().split()) for c in content.contexts} & here
                )
                verdict = lexical[name][i]
                same_words = candidate.reading.relation == "match"
                linked = verdict is not before[name][i]  # the lexical rule linked it here
                if verdict.answers and (learned_here or same_words or linked):
                    reading = candidate.reading._replace(verdict=verdict)
                    found[i] = replace(candidate, reading=reading, learned=True)
                elif learned_here:
                    found[i] = replace(candidate, here=True)

    # -- reading ---------------------------------------------------------------------

    def _read(
        self, requirement: Requirement, need: Need, memory: ScoredMemory, parts: _Applies | None
    ) -> _Candidate:
        """Read a candidate on the part of it that holds in the request's situation."""
        if parts is None:
            reading = self.lexical.reading(need, memory)
            candidate = _Candidate(memory, reading, situated=False, holds=True, situation=None)
        else:
            part = parts.part or parts.best
            reading = self.lexical.reading(need, memory, part.text)
            specific = parts.part is not None and parts.part.situation is not None
            candidate = _Candidate(
                memory,
                reading,
                situated=True,
                holds=parts.part is not None,
                situation=part.situation if specific and parts.matches else None,
                other=None if parts.part is not None else parts.best,
                similarity=parts.similarity,
            )
        text = _value_text(memory.record, candidate)
        rejected = self.lexical.reader.rejected(need, text) if text else frozenset()
        option = _option(requirement, reading.found.option, rejected)
        return replace(
            candidate,
            rejected=bool(rejected),
            option=option,
            # Its value has the shape the requirement takes: one of its options, a time
            # for a departure time.
            fits=(not requirement.options or option is not None or requirement.allow_other)
            and (not need.kinds or bool(reading.found.kinds)),
        )

    def _work(self, request: PersonaRequest) -> np.ndarray:
        """The work a request is for, as a unit vector: its query's and its node's.

        The mean of the two texts the retrieval embeds anyway (its searches), so the
        judge embeds nothing more for it.
        """
        node = request.node
        texts = [text for text in (request.query, node.instruction if node else "") if text.strip()]
        if not texts:
            return np.zeros(self.encoder.dim, dtype=np.float32)
        mean = self.encoder.embed(texts).mean(axis=0)
        return mean / max(float(np.linalg.norm(mean)), 1e-12)

    def _query(self, request: PersonaRequest) -> np.ndarray:
        """The request's query as a vector.

        The query is where its situation shows ("for the sales kickoff"); the node's step
        is the same for every request of the node.
        """
        return self.encoder.embed([request.query])[0]

    def _situations(
        self, request: PersonaRequest, records: Any, query: np.ndarray
    ) -> dict[str, _Applies]:
        """For each situated persona memory, the part of it that holds in this request."""
        split: dict[str, tuple[Part, ...]] = {}
        for record in records:
            if isinstance(record.content, PersonaMemory):
                parts = _parts(record.content)
                if any(part.situation for part in parts):
                    split[record.id] = parts
        if not split:
            return {}
        phrases = list({p.situation for parts in split.values() for p in parts if p.situation})
        similarity = dict(zip(phrases, self.encoder.embed(phrases) @ query, strict=True))
        applies: dict[str, _Applies] = {}
        for memory_id, parts in split.items():
            specific = [p for p in parts if p.situation]
            best = max(specific, key=lambda p: similarity[p.situation or ""])
            score = float(similarity[best.situation or ""])
            matches = score >= self.model.situation
            if len(parts) == 1:
                # One condition, and nothing said of other situations: how near the
                # request is to it is weighed by the model, not ruled on here.
                applies[memory_id] = _Applies(best, best, score, matches)
                continue
            general = next((p for p in parts if p.situation is None), None)
            applies[memory_id] = _Applies(best if matches else general, best, score, matches)
        return applies

    def _memory_vectors(self, records: list[MemoryRecord]) -> dict[str, np.ndarray]:
        """Each record's vector: stored with it if the encoder made it, else encoded now."""
        vectors: dict[str, np.ndarray] = {}
        missing: list[MemoryRecord] = []
        for record in records:
            embedding = record.embedding
            if embedding is not None and embedding.model == self.encoder.name:
                vectors[record.id] = embedding.array()
            else:
                missing.append(record)
        if missing:
            encoded = self.encoder.embed([memory_text(record.content) for record in missing])
            vectors.update(zip((record.id for record in missing), encoded, strict=True))
        return vectors


@dataclass(frozen=True)
class _Applies:
    part: Part | None  # the part holding in the request's situation; None: no part does
    best: Part  # the situated part closest to the request's situation
    similarity: float  # of that part's situation to the request
    matches: bool  # whether the request is in that situation (see `AnswerhoodModel`)


# Someone else's: "Mum's GP", "my sister's size", "Alex runs 4 times a week".
_KIN = (
    r"mum|mom|mother|dad|father|wife|husband|partner|son|daughter|sister|brother|kids?|"
    r"boss|nephew|niece|gran|grandma|grandad|grandpa|friend|colleague|flatmate|neighbour|"
    r"neighbor|cousin|aunt|uncle"
)
_OTHERS = re.compile(
    rf"\b(?:my\s+(?:{_KIN})|(?:{_KIN})'s|[A-Z][a-z]+'s)\b"
    r"|(?:^|(?<=[:;,.] ))[A-Z][a-z]+(?=\s+(?:is|has|was|does|[a-z]+s)\b)",
)


def _someone_else(record: MemoryRecord, request: PersonaRequest) -> bool:
    """Whether a memory is about someone the request does not name ("Mum's GP")."""
    content = record.content
    text = (
        f"{content.topic}: {content.preference}"
        if isinstance(content, PersonaMemory)
        else memory_text(content)
    )
    asked = f"{request.query} {request.node.instruction if request.node else ''}".casefold()
    return any(
        who.group(0).casefold().removesuffix("'s").removeprefix("my ").strip() not in asked
        for who in _OTHERS.finditer(text)
    )


def _answered_here(
    places: list[tuple[str, int]], read: list[_Candidate], answers: np.ndarray
) -> None:
    """An answer given at this node or for this request answers its question again.

    In any words ("which day should they come?" after "cleaning day"): of the
    answers learned here, each takes the requirement it fits best, by the model's
    probability, and each requirement the answer that fits it best. By construction,
    so that nothing answered is asked twice where it was answered.
    """
    here = [
        k
        for k, candidate in enumerate(read)
        if (candidate.here or candidate.learned) and (candidate.fits or answers[k] >= _SURE)
    ]
    if not here:
        return
    best_for_memory: dict[str, int] = {}
    for k in here:
        memory_id = read[k].memory.record.id
        if memory_id not in best_for_memory or answers[k] > answers[best_for_memory[memory_id]]:
            best_for_memory[memory_id] = k
    best_for_requirement: dict[str, int] = {}
    for k in best_for_memory.values():
        name = places[k][0]
        if name not in best_for_requirement or answers[k] > answers[best_for_requirement[name]]:
            best_for_requirement[name] = k
    for k in best_for_requirement.values():
        read[k] = replace(read[k], learned=True)


def _structure(candidate: _Candidate, requirement: Requirement, need: Need) -> list[float]:
    """The lexical reading's features of a candidate, in `FEATURES` order."""
    verdict, relation, found = candidate.reading
    return [
        verdict.strength,
        float(verdict.answers),
        float(verdict.kind == "choice"),
        float(found.ceases or verdict.ceases),
        float(found.changes),
        float(relation == "match"),
        float(relation == "partial"),
        float(relation == "about"),
        float(relation == "subject"),
        float(relation == "conflict"),
        float(bool(requirement.options)),
        float(found.option is not None),
        float(found.option is not None and found.polarity > 0),
        float(candidate.rejected),
        float(found.attribute),
        float(found.elsewhere),
        float(bool(need.kinds)),
        float(bool(found.kinds - {"name"})),
    ]


def _option(requirement: Requirement, stated: str | None, rejected: frozenset[str]) -> str | None:
    """The option a memory gives.

    The one it states, unless it rejects it; or the one its rejections leave ("anything
    but the window" where aisle or window is asked).
    """
    if stated is not None and stated not in rejected:
        return stated
    left = [option for option in requirement.options if option not in rejected]
    return left[0] if rejected and len(left) == 1 else None


def _parts(content: PersonaMemory) -> tuple[Part, ...]:
    return situated(content.preference)


def _value_text(record: MemoryRecord, candidate: _Candidate) -> str:
    content = record.content
    if isinstance(content, PersonaMemory):
        return content.preference
    if isinstance(content, TrajectoryMemory):
        return content.insight
    return ""


_SAME_NEED = 0.6
"""The cosine from which the question an answer was learned for at another node ("shoe
size") and a requirement ("trainer size") ask for the same thing: names of one job sit
near each other ("airline" and "hotel" 0.5), so the bar is high; at the node it was asked
at, an answer answers in any words (`_answered_here`)."""

_PLAIN = 0.75
"""The lexical strength from which a reading is plain: a topic naming the requirement
(1.0, 0.7 for its attribute in general), a value naming it (0.8) or stating an option with
a preference (0.85)."""

_SURE = 0.8
"""A probability from which the model's reading outweighs a learned answer's question
being named apart, or its value's shape ("half an inch" for a cut length)."""

_LEARNED = 0.95
"""The strength of an answer the person gave for the requirement's slot."""


def _verdict(
    requirement: Requirement, candidate: _Candidate, strength: float, slot: float
) -> Verdict:
    """The verdict on a candidate from its probabilities and its structural reading.

    ``strength`` is the probability that it answers the requirement, ``slot`` that
    it is about the requirement's slot at all (an answer, an old one, another
    situation's, or the end of it).
    """
    lexical = candidate.reading.verdict
    memory_id = candidate.memory.record.id
    if not candidate.holds and not candidate.learned:
        return Verdict(
            memory_id=memory_id,
            answers=False,
            strength=strength,
            value=candidate.other.text if candidate.other else None,
            reason="it holds in another situation",
            hint=f"but for {candidate.other.situation}" if candidate.other else "",
        )
    found = candidate.reading.found
    if (found.ceases or lexical.ceases) and candidate.option is None:
        # "I don't do the gym any more": how surely it is about this slot, not
        # whether it answers, is what weighs against the older value.
        return Verdict(
            memory_id=memory_id,
            answers=False,
            strength=max(slot, lexical.strength if lexical.ceases else 0.0),
            ceases=True,
            reason="says it no longer holds",
        )
    if candidate.learned:
        strength = max(strength, _LEARNED)
    else:
        if lexical.answers and lexical.strength >= _PLAIN:
            # Said plainly (its topic names the requirement, or its value the
            # attribute): the lexical reading is rarely wrong there.
            strength = max(strength, lexical.strength)
        refused = _vetoed(candidate, strength)
        if refused:
            return Verdict(memory_id=memory_id, answers=False, strength=strength, reason=refused)
    value = candidate.option
    if requirement.options and value is None and not requirement.allow_other:
        # A choice must be one of the choices: "Chicago" where APA or MLA is asked.
        return Verdict(
            memory_id=memory_id,
            answers=False,
            strength=strength,
            value=_default_value(candidate),
            reason="its value is none of the options",
            # Named in the question only when it is plainly about the requirement
            # ("citation style: Chicago"), not merely near it.
            hint=f"which is none of {', '.join(map(repr, requirement.options))}"
            if candidate.reading.relation in ("match", "partial", "about")
            else "",
        )
    reason = lexical.reason if lexical.answers else "it means the same"
    if candidate.situation:
        reason = f"{reason} (when {candidate.situation})"
    content = candidate.memory.record.content
    if isinstance(content, TrajectoryMemory) and not content.insight:
        return _past_choice(candidate, content, strength)
    return Verdict(
        memory_id=memory_id,
        answers=True,
        strength=strength,
        value=value or (lexical.value if lexical.answers else None) or _default_value(candidate),
        kind=lexical.kind,
        changes=found.changes,
        situation=candidate.situation,
        reason=reason,
    )


def _past_choice(candidate: _Candidate, content: TrajectoryMemory, strength: float) -> Verdict:
    """A past task without a lesson only shows what was chosen.

    It gives a choice, and only where the trace shows which (evidence when other tasks
    agree).
    """
    lexical = candidate.reading.verdict
    chosen = candidate.option or (lexical.value if lexical.kind == "choice" else None)
    if chosen is None:
        return Verdict(
            memory_id=candidate.memory.record.id, answers=False, reason="no choice of it"
        )
    return Verdict(
        memory_id=candidate.memory.record.id,
        answers=True,
        strength=strength,
        value=chosen,
        kind="choice",
        reason=f"chosen in a past task ({content.query!r})",
    )


def _vetoed(candidate: _Candidate, strength: float) -> str | None:
    """Why structure refuses a candidate that meaning finds near, if it does."""
    lexical, relation, found = candidate.reading
    if candidate.asked_for < _SAME_NEED and not lexical.answers and strength < _SURE:
        return "it answered another question"  # "airline: British Airways" for "hotel"
    if (
        candidate.asked_for == 1.0
        and not lexical.answers
        and (relation == "conflict" or found.elsewhere)
    ):
        # A topic naming another attribute of the same thing ("citation manager" for
        # "citation style", "hotel parking" for "hotel budget") answers only if its
        # value says so plainly, which the lexical reading tells: nearness in meaning
        # is what makes it a near miss.
        return "its topic names another attribute"
    return None


def _default_value(candidate: _Candidate) -> str:
    content = candidate.memory.record.content
    if isinstance(content, PersonaMemory):
        return content.preference
    if isinstance(content, TrajectoryMemory):
        return content.insight
    return memory_text(content)
