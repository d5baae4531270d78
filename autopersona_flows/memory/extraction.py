"""Extraction: from a completed task to the persona memories it reveals.

Ingestion stores a task's trajectory as it happened; what the person prefers or
needs has to be read out of it. An `Extractor` does that reading.
`RuleExtractor`, the default, needs no model: it keeps the persona items a task
lists, reads first-person statements out of what the person wrote ("I prefer
aisle seats", "my budget is 150 a night", "I quit coffee"), and reads how long
each holds ("until March", see `valid_until`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from autopersona_flows.memory.phrases import phrase, value_kinds
from autopersona_flows.memory.records import PersonaMemory, RawTaskRecord, UtcDatetime
from autopersona_flows.memory.slots import same_slot
from autopersona_flows.memory.text import normalise
from autopersona_flows.memory.validity import valid_until

__all__ = [
    "ExtractedMemory",
    "Extractor",
    "RuleExtractor",
    "bounded",
    "fact",
    "first_person",
    "is_question",
    "names_secret",
    "person_texts",
    "statement",
]


class ExtractedMemory(BaseModel):
    """A persona memory read out of a task, and until when it holds.

    Attributes:
        content: The memory.
        valid_until: When it stops holding, if the person said ("until March").
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    content: PersonaMemory
    valid_until: UtcDatetime | None = None


@runtime_checkable
class Extractor(Protocol):
    """Reads the persona memories a completed task reveals.

    Contract: return `ExtractedMemory` items (anything else is an
    `IngestionError` naming the extractor); an empty list when the task reveals
    nothing. The task's own time is ``record.at`` (``None``: now).
    """

    def extract(self, record: RawTaskRecord) -> list[ExtractedMemory]:
        """The persona memories ``record`` reveals."""
        ...


_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")
# "I'd like..." asks for something now; it states no preference.
_I = r"\b(?:i|i'm|i am|i've|i have|we|we're|we are|we've)\b"
_ADVERBS = (
    r"(?:\s+(?:really|usually|always|generally|now|still|also|actually|definitely|mostly|"
    r"just|finally|completely|totally|officially))*"
)
_VERB = (
    r"(?P<verb>prefer|like|love|enjoy|hate|dislike|avoid|can't stand|cannot stand|"
    r"can't eat|cannot eat|can't have|can't handle|cannot handle|can't do|can't tolerate|"
    r"don't eat|don't drink|don't use|don't want|do not want|never|always|only|no longer|"
    r"stopped|quit|gave up|given up|switched to|moved to|gone back to|went back to|"
    r"allergic to|intolerant to|vegan|vegetarian|pescatarian|use|go for|stick to|tend to|"
    r"using|liking|loving|hating|preferring|sticking to|going for|cancelled|canceled|"
    r"ditched|dropped|sold|moved|changed|started|done with|off(?!\s+to\b)|"
    r"in(?=\s+(?-i:[A-Z]))|based in|living in|live in)"
)
_STATEMENT = re.compile(
    rf"{_I}(?:\s+(?:am|'m|are|'re|have|'ve))?{_ADVERBS}\s+{_VERB}(?:s|d|ed|ing)?\b"
    r"(?P<rest>[^.!?;]*)",
    re.IGNORECASE,
)
# "I'm gluten intolerant", "we're allergic": what comes before the adjective.
_CONDITION = re.compile(
    rf"{_I}(?:\s+(?:am|'m|are|'re))?\s+(?P<what>[a-z][\w-]*)\s+(?P<verb>intolerant|allergic)\b",
    re.IGNORECASE,
)
# "Always use my Monzo account", "Sold the car!": the person is implied.
_IMPLIED = re.compile(
    r"^(?:please\s+|and\s+)?(?P<verb>always|never(?!\s+mind)|from now on|sold|cancelled|"
    r"canceled|quit|ditched|stopped|dropped|gave up)\b(?P<rest>[^.!?;]*)",
    re.IGNORECASE,
)
# "Mum loves gardening stuff", "Leo's quit piano", "my husband is allergic to nuts":
# what someone close to the person likes, stated by the person.
_THEIRS = re.compile(
    r"^(?:and\s+|so\s+|also\s+)?(?P<who>(?i:my\s+(?:mum|mom|dad|mother|father|wife|husband|"
    r"partner|son|daughter|sister|brother|kids?|boss|nephew|niece|grandma|grandad))"
    r"|(?!(?:It|Here|That|There|What|Who|He|She|Let|This|The|They|We|You)\b)[A-Z][a-z]+)"
    r"(?:\s+(?i:really|now|just|still))?"
    r"(?P<verb>(?i:\s+(?:loves|likes|hates|prefers|adores)|(?:'s|\s+is)\s+(?:into|allergic to)"
    r"|\s+can't eat|(?:'s|\s+has)\s+(?:quit|stopped|gone off|given up)"
    r"|\s+(?:quit|stopped|gave up)))"
    r"\b(?P<rest>[^.!?;]*)",
)
_MY = re.compile(
    r"\b(?P<owner>(?i:my|our)|(?!(?:It|Here|That|There|What|Who|He|She|Let|This)'s)"
    r"[A-Z][a-z]+'s)\s+(?P<topic>(?i:[a-z][\w' -]{1,40}?))\s+"
    r"(?i:is|are|has changed to|changed to|is now|are now)\s+"
    r"(?P<value>.+?)(?=[.!?;](?:\s|$)|$)",
)
# Secrets are never remembered from free text, whatever else the person says.
_SECRET = re.compile(
    r"\b(?:pin|password|passcode|passphrase|ssn|social security|cvv|cvc|security code|"
    r"card number|account number|iban|routing number|api key|token|secret|login)\b",
    re.IGNORECASE,
)
_NOT_A_VALUE = re.compile(r"^(?:at|on|in|tomorrow|today|tonight|coming|going|here|there)\b", re.I)
_BY_VERB = {
    "allergic to": "allergies",
    "allergic": "allergies",
    "intolerant to": "intolerances",
    "intolerant": "intolerances",
    "vegan": "diet",
    "vegetarian": "diet",
    "pescatarian": "diet",
    "in": "location",
    "based in": "location",
    "living in": "location",
    "live in": "location",
}


# "How do I use SharePoint?", "can you find me...": the person asks, states nothing.
_QUESTION = re.compile(
    r"\?\s*$|^\s*(?:how|what|why|when|where|which|who|whose|can you|could you|would you|"
    r"will you|do you|does|did you|is there|are there|any (?:ideas|tips|suggestions))\b",
    re.IGNORECASE,
)
# What the person did or has that is theirs to keep ("finally got my MSc", "ran the
# half in 1:52"), read when it names what and holds a value of a shape, or a thing.
_ACHIEVED = re.compile(
    rf"(?:{_I}{_ADVERBS}\s+|^\s*(?:(?:just|finally|also|so|and)\s+)*(?=\w+\s+my\b))"
    r"(?P<verb>got|finished|completed|passed|ran|bought|graduated|earned|"
    r"joined|started|qualified|signed up for|switched to|upgraded to|weigh|drive|own|speak|"
    r"play|work as|work at|work for|study|studied)\b(?P<rest>[^.!?;]*)",
    re.IGNORECASE,
)
# "I'm always a 39 in running shoes", "I'm an L in everything": a size, and of what.
_SIZED = re.compile(
    r"\b(?:i'm|i am)\s+(?:(?:always|usually|normally|generally|basically)\s+)?(?:a|an)\s+"
    r"(?P<value>(?:size\s+)?[\w.+/-]{1,6})\s+(?:in|for)\s+(?P<what>[a-z][\w -]{2,30})",
    re.IGNORECASE,
)
# Words a statement's object is never about: times, moods, fillers ("3 weeks ago",
# "I'm sure", "I'm looking for...").
_NOT_TOPICS = frozenset(
    "ago sure looking going trying thinking wondering hoping planning glad happy sorry "
    "excited time times day days week weeks month months year years today tomorrow "
    "yesterday tonight lot lots bit way ways thing things stuff one kind sort fine okay "
    "good great well back moment minute minutes second idea ideas luck fun deal point "
    "course chance".split()
)


# A statement about the person: they are in it ("I", "my"), it is not a request to
# the assistant, and it says something lasting: a preference or change cue, or a value
# of a shape ("new rule for all my figures: viridis from now on", "drop-off is 8 now").
_SELF = re.compile(r"\b(?:i|i'm|i've|i'd|i'll|my|me|mine|we|we're|we've|our|us)\b", re.I)
_REQUEST = re.compile(
    r"^\s*(?:(?:ok|okay|so|and|also|hey|hi|right|ugh|oh)\b[\s,!-]*)*(?:can|could|would|will)\s+"
    r"(?:you|u)\b|^\s*(?:(?:ok|okay|so|and|also|hey|hi|right|ugh|oh)\b[\s,!-]*)*(?:please|pls|"
    r"help|remind|find|book|write|draft|make|give|tell|show|send|add|check|plan|sort|suggest|"
    r"recommend|set|order|search|look|let's|lets|need (?:some|a few|ideas|help|you)|"
    r"(?:i|we)\s+(?:need|want|would like|'d like)|i'd like|i'm looking for|get me|book me)\b",
    re.IGNORECASE,
)
_LASTING = re.compile(
    r"\b(?:always|never|usually|normally|generally|prefer|preferably|from now on|new rule|"
    r"these days|nowadays|now|any ?more|no more|no longer|only|can't|cannot|don't|hate|love|"
    r"rule|every|each|anything but|instead|switched|gave up|stopped|started|allergic|"
    r"intolerant|favourite|favorite)\b",
    re.IGNORECASE,
)


def is_question(sentence: str) -> bool:
    """Whether ``sentence`` asks something rather than states it."""
    return bool(_QUESTION.search(sentence))


def names_secret(text: str) -> bool:
    """Whether ``text`` names a secret (a PIN, a password, a card number...)."""
    return bool(_SECRET.search(text))


def person_texts(record: RawTaskRecord) -> list[str]:
    """What the person wrote in a task: the request and their messages.

    An entry of the trace or of the interactions is the person's when it is an
    object whose ``role`` is ``"user"`` (chat logs, see `chat_sessions`); its text
    is ``"text"`` or ``"content"``. Both are read: where a log puts the
    conversation does not decide whether the person is heard.
    """
    texts = [record.query]
    for entry in (*record.trace, *record.interaction):
        if isinstance(entry, dict) and entry.get("role") == "user":
            text = entry.get("text", entry.get("content"))
            if isinstance(text, str) and text.strip() and text not in texts:
                texts.append(text)
    return texts


class RuleExtractor:
    """The default extractor: listed items, first-person statements, their validity.

    Args:
        read_text: Read statements out of what the person wrote, besides the
            task's listed persona items. Off, only the listed items are kept
            (with their validity read from their text).
    """

    def __init__(self, *, read_text: bool = True) -> None:
        self.read_text = read_text

    def __repr__(self) -> str:
        return f"RuleExtractor(read_text={self.read_text})"

    def extract(self, record: RawTaskRecord) -> list[ExtractedMemory]:
        """Listed persona items first, then statements not already listed."""
        at = record.at or datetime.now(UTC)
        found = [
            ExtractedMemory(content=item, valid_until=valid_until(item.preference, at))
            for item in record.persona
        ]
        if not self.read_text:
            return found
        known = {normalise(item.preference) for item in record.persona}
        for text in person_texts(record):
            for sentence in _SENTENCE.split(text):
                if is_question(sentence):
                    continue
                memory = (
                    first_person(sentence)
                    or fact(sentence)
                    or bounded(sentence, at)
                    or statement(sentence)
                )
                if memory is None or normalise(memory.preference) in known:
                    continue
                if any(normalise(memory.preference) in k for k in known):
                    continue  # a listed item says it already, and more
                if any(same_slot(memory.topic, item.topic) for item in record.persona):
                    continue  # what the task lists of that slot is what holds
                known.add(normalise(memory.preference))
                until = valid_until(_clause_of(memory.preference, sentence), at)
                found.append(ExtractedMemory(content=memory, valid_until=until))
        return found


def first_person(sentence: str) -> PersonaMemory | None:
    """The persona memory a first-person sentence states, if it states one.

    "My seat preference is aisle" gives topic "seat preference", preference
    "aisle"; "I prefer aisle seats on long flights" gives the object's head,
    "seats", as the topic and the sentence as the preference, as it was said.
    A sentence naming a secret (a PIN, a password, a card number) states nothing.
    """
    sentence = sentence.strip()
    if names_secret(sentence) or is_question(sentence):
        return None
    said = sentence.rstrip(".!?; ")
    mine = _MY.search(sentence)
    if mine and not _NOT_A_VALUE.match(mine.group("value").strip()):
        owner, topic = mine.group("owner"), mine.group("topic").strip()
        value = mine.group("value").strip(" ,")
        if value and len(topic.split()) <= 4:
            named = owner[0].isupper() and owner.endswith("'s")
            return PersonaMemory(topic=f"{owner} {topic}" if named else topic, preference=value)
    condition = _CONDITION.search(sentence)
    if condition:
        return PersonaMemory(topic=_BY_VERB[condition.group("verb").casefold()], preference=said)
    found = _STATEMENT.search(sentence) or _IMPLIED.search(sentence)
    if found is None:
        return _theirs(sentence, said)
    topic = _BY_VERB.get(found.group("verb").casefold()) or _object_topic(found.group("rest"))
    return None if topic is None else PersonaMemory(topic=topic, preference=said)


def fact(sentence: str) -> PersonaMemory | None:
    """A fact the person states about themselves, if it names what it is about.

    "I'm always a 39 in running shoes" gives topic "running shoes size"; "finally
    got my MSc in public health" and "ran the half in 1:52" give their object
    ("MSc", "half"), the sentence as it was said being the value. Questions and
    secrets state nothing.
    """
    sentence = sentence.strip()
    if is_question(sentence) or names_secret(sentence):
        return None
    said = sentence.rstrip(".!?; ")
    sized = _SIZED.search(sentence)
    if sized:
        what = _OBJECT_END.sub("", sized.group("what")).strip()
        if what and what.split()[-1].casefold() not in _NOT_TOPICS:
            return PersonaMemory(topic=f"{what} size", preference=said)
    achieved = _ACHIEVED.search(sentence)
    if achieved is None:
        return None
    topic = _object_topic(achieved.group("rest"))
    return None if topic is None else PersonaMemory(topic=topic, preference=said)


def statement(sentence: str) -> PersonaMemory | None:
    """A lasting statement the person makes about themselves, as they said it.

    The last reading of a sentence no pattern above took: the person is in it, it
    asks and requests nothing, and it says something lasting (a preference or change
    cue, or a value of a shape). Its topic is what it is about; the sentence is the
    value, for the judge to read.
    """
    sentence = sentence.strip()
    if (
        len(sentence.split()) < 4
        or is_question(sentence)
        or names_secret(sentence)
        or _REQUEST.search(sentence)
        or not _SELF.search(sentence)
        or not (_LASTING.search(sentence) or value_kinds(sentence) - {"name"})
    ):
        return None
    self_at = _SELF.search(sentence)
    assert self_at is not None
    topic = _object_topic(sentence[self_at.end() :]) or _object_topic(sentence)
    return None if topic is None else PersonaMemory(topic=topic, preference=sentence.rstrip(".!;"))


def bounded(sentence: str, at: datetime) -> PersonaMemory | None:
    """A sentence saying how long something holds states it, whoever's the subject.

    "No non-essential spending until payday on the 28th" or "The kids are at
    their grandparents' this week": the person describes a situation that ends
    (see `valid_until`). The topic is what the sentence is about, before its
    bound; questions and secrets state nothing.
    """
    sentence = sentence.strip()
    if sentence.endswith("?") or names_secret(sentence) or valid_until(sentence, at) is None:
        return None
    topic = _object_topic(sentence)
    return None if topic is None else PersonaMemory(topic=topic, preference=sentence.rstrip(".!; "))


def _clause_of(preference: str, sentence: str) -> str:
    """The part of ``sentence`` a memory came from: its clause, not the whole sentence.

    "I prefer window seats, I'm flying to Rome this week": the preference is not
    bounded by the trip's week.
    """
    start = sentence.find(preference)
    if start < 0 or preference == sentence.rstrip(".!?; "):
        for clause in _CLAUSE.split(sentence):
            if _STATEMENT.search(clause) or _MY.search(clause) or _IMPLIED.search(clause.strip()):
                return clause
        return sentence
    return preference


_CLAUSE = re.compile(r",\s+(?=(?:i|i'm|we|we're|my|our|and i|but i|so i)\b)", re.IGNORECASE)


def _theirs(sentence: str, said: str) -> PersonaMemory | None:
    """What someone close to the person likes, as the person said it ("Dad's into jazz")."""
    found = _THEIRS.search(sentence)
    if found is None:
        return None
    who = re.sub(r"(?i)^my\s+", "", found.group("who")).capitalize()
    verb = found.group("verb").casefold()
    allergy = "allergic" in verb or "can't" in verb
    what = "allergies" if allergy else _object_topic(found.group("rest"))
    return None if what is None else PersonaMemory(topic=f"{who}'s {what}", preference=said)


# Where the object of a statement ends: a time, a reason, a condition.
_OBJECT_END = re.compile(
    r"(?:,|\b(?:until|till|til|through|thru|this|today|tonight|tomorrow|next|every|because|"
    r"since|when|while|whenever|if|unless|and|but|or|so|now|anymore|lately|these days)\b).*",
    re.IGNORECASE,
)
_MANNER = re.compile(r"\b\w+ly$", re.IGNORECASE)  # "caffeine completely"


def _object_topic(rest: str) -> str | None:
    """The head of the noun phrase a statement is about, as written."""
    read = phrase(_MANNER.sub("", _OBJECT_END.sub("", rest).strip()))
    if read.head is None or read.asks:
        return None
    topic = read.surface.get(read.head, read.head)
    return None if topic.casefold() in _NOT_TOPICS else topic
