"""Reading requirements and memories for judgement: roots, heads, clauses and value shapes.

Retrieval (``memory/text.py``) only needs words that meet; judging needs to know
what a phrase is *about*. An English noun phrase names its attribute last
("hotel **budget**", "flight **seat**") and qualifies it before it, or after a
preposition ("**budget** per night"). `Phrase` keeps that head apart from the
modifiers, so "hotel booking method" and "hotel budget" share a word but not an
attribute. Generic nouns ("preference", "stuff") carry no attribute and are
dropped; weak heads ("style", "format", "number") name one only together with
their modifiers ("citation style"), so the modifiers are what must match.

Values have shapes too: a budget is an amount, a pickup time a time of day, a shoe
size a size. `value_kinds` recognises a few such shapes in free text and
`attribute_kinds` says which attributes take them.

Everything here is small general English: stop words, generic nouns, negation,
preference and change cues, suffixes, and value shapes. No list names a domain.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from functools import lru_cache

from autopersona_flows.memory.text import stem

__all__ = [
    "CESSATION",
    "KIN_WORDS",
    "QUALIFIER_ROOTS",
    "Clause",
    "Phrase",
    "attribute_kinds",
    "clauses",
    "content_roots",
    "kin",
    "phrase",
    "root",
    "value_kinds",
    "words",
]


def _set(text: str) -> frozenset[str]:
    return frozenset(text.split())


# A word: letters or digits, apostrophes inside ("can't"); letters and digits apart
# ("python3.11" is python, 3, 11), so versions and sizes meet their words.
_WORD = re.compile(r"[^\W\d_]+(?:['\u2019][^\W\d_]+)*|\d+")

# Function words; negations and cue words are kept out so that clauses keep them.
_STOP = _set(
    "a about above after again all am an and any are as at be because been before being "
    "below between both but by could did do does doing down during each few for from "
    "further had has have having he her here hers herself him himself his how i i'd i'll "
    "i'm i've if in into is it it's its itself just let's me more most my myself of off "
    "on once or other our ours ourselves out over own same she should so some such than "
    "that that's the their theirs them themselves then there these they this those "
    "through to too under until up us very was we were what when where which while who "
    "whom why will with would you your yours yourself yourselves also get got one ones "
    "per via etc eg ie lot lots bit really quite pretty much many something anything "
    "everything thing things stuff pls please oh ok okay just"
)

# Nouns and adjectives that say "a preference" without saying about what.
_GENERIC = _set(
    "preference preferences prefer prefers preferred favourite favorite favourites "
    "favorites usual usually choice choices option options setting settings default "
    "defaults info information detail details need needs requirement requirements want "
    "wants wanted general misc miscellaneous note notes personal current standard "
    "typical ideal ideally like likes liked go goes going way ways person people someone "
    "somebody user instruction instructions particular specific"
)

# Adjectives that qualify an attribute without naming what it is of ("max spend").
_QUALIFIERS = _set(
    "max maximum min minimum total overall average daily weekly monthly yearly nightly "
    "hourly upper lower top usual normal regular"
)

# Heads that name an attribute only together with their modifiers ("citation style").
_WEAK_HEADS = _set("style type kind sort format mode form variety system convention number")

_PREPOSITIONS = _set(
    "per for of in on at to with from by about during within around across into onto"
)

_NEGATIONS = _set(
    "not no never don't dont doesn't doesnt didn't didnt won't wont can't cant cannot "
    "isn't isnt aren't arent wasn't wasnt shouldn't shouldnt nor neither none hate hates "
    "hated dislike dislikes disliked avoid avoids avoided without against stop stopped "
    "refuse refuses deleted cancelled canceled dropped quit left skip"
)

_PREFERENCE_CUES = _set(
    "prefer prefers preferred always usually only like likes love loves want wants pick "
    "picks picked choose chooses chose go goes stick sticks favourite favorite best "
    "ideally default must need needs please keep keeps insist insists rather fan use "
    "uses wanted asked"
)

# "No longer", "stopped", "quit": what follows is not true any more.
CESSATION = re.compile(
    r"\b(?:no longer|not any ?more|any ?more|no more(?! than)|stopped|quit|quitting"
    r"|gave up|given up"
    r"|cut out|cut \w+ out|dropped|done with|(?<!\bbe )(?<!\bget )(?<!'m )(?<!am )(?<!got )used to"
    r"|formerly|previously|deleted|cancell?ed"
    r"|uninstalled|ditched|sold|moved away|gone off|went off"
    r"|not going back|is gone|are gone|not using)\b"
)
# "Now", "instead", "switched to": a new value replaces the old one.
_CHANGE = re.compile(
    r"\b(?:(?<!for )now|nowadays|these days|lately|instead|switched|switching|changed|moved to"
    r"|moved|from now on|back on|back to|started|new|since|again|anymore|actually|turns out"
    r"|turned out|correction|wrong|mixed (?:it |them )?up|what i said|i said before"
    r"|(?:'ve|have|has|'s) gone)\b"
)

_CLAUSE_BREAK = re.compile(
    "[.;!?\n]+|,|\\(|\\)|\\s[-\u2013\u2014]\\s|\\b(?:but|though|although|except|whereas)\\b",
    re.IGNORECASE,
)

_DAYS = (
    r"(?:mon|tues?|wednes|thurs|fri|satur|sun)days?|mon|tue|tues|wed|thu|thur|thurs|fri"
    r"|weekends?|weekdays?|week ?nights?|daily|every day"
)
_MONTHS = (
    r"january|february|march|april|june|july|august|september|october|november|december"
    r"|jan|feb|apr|jun|jul|aug|sep|sept|oct|nov|dec"
)

_VALUE_KINDS: dict[str, re.Pattern[str]] = {
    "amount": re.compile(
        r"[$€£¥₹]\s?\d|\d\s?(?:k\b|usd|eur|gbp|chf|dollars?|euros?|pounds?|bucks|quid)"
        r"|\b\d+(?:[.,]\d+)?\s?(?:a|per|/)\s?(?:night|day|week|month|year|person|head|hour)\b",
        re.IGNORECASE,
    ),
    "time": re.compile(
        r"\b\d{1,2}(?::\d{2})?\s?(?:am|pm)\b|\b\d{1,2}[:h.]\d{2}\b|\b(?:noon|midday|midnight)\b"
        r"|\b(?:between|from|after|before|by|until|till)\s\d{1,2}\b|\b\d{1,2}\s?[-\u2013]\s?\d{1,2}\b"
        r"|\b(?:mornings?|afternoons?|evenings?|nights?|lunchtime)\b",
        re.IGNORECASE,
    ),
    "day": re.compile(rf"\b(?:{_DAYS})\b", re.IGNORECASE),
    "date": re.compile(
        rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b\d{{1,2}}(?:st|nd|rd|th)\b|\b(?:{_MONTHS})\b",
        re.IGNORECASE,
    ),
    "duration": re.compile(
        r"\b\d+(?:\.\d+)?\s?(?:-\s?\d+\s?)?(?:min(?:ute)?s?|hours?|hrs?|h|days?|weeks?|months?)\b",
        re.IGNORECASE,
    ),
    "count": re.compile(
        r"\b\d+\s?(?:words?|pages?|slides?|items?|people|guests?|bullets?|lines?|kids?)\b",
        re.IGNORECASE,
    ),
    "size": re.compile(
        r"\b(?:xx?s|xx?l|small|medium|large)\b|\bsize\s\w+|\b(?:uk|eu|us)\s?\d+|\d+\s?(?:uk|eu|us)\b"
        r"|\b\d+\s?(?:pt|cm|mm|inch(?:es)?|in|waist|leg)\b",
        re.IGNORECASE,
    ),
    "dose": re.compile(
        r"\b\d+(?:\.\d+)?\s?(?:mg|mcg|ml|iu|tablets?|pills?|capsules?|drops?|puffs?)\b",
        re.IGNORECASE,
    ),
    "version": re.compile(r"(?<![\d.])\d+\.\d+(?:\.\d+)?\b|\bv\d+\b", re.IGNORECASE),
    "limit": re.compile(
        r"\b(?:under|below|max(?:imum)?|up to|at most|no more than|not more than|cap(?:ped)? at"
        r"|less than|tops)\s?[$€£]?\d|\d+\s?(?:max|tops)\b",
        re.IGNORECASE,
    ),
    # A name: a capitalised word inside a sentence, a handle, a quoted phrase.
    "name": re.compile(
        r"(?<=[\w,;:(] )(?!I(?:'|\b))[A-Z][\w&'.-]+|[@#][\w-]+|['\"][^'\"]{2,40}['\"]"
    ),
}

# What kind of value an attribute takes, for the attributes whose values have a shape.
_ATTRIBUTE_KINDS: dict[str, frozenset[str]] = {
    "amount": _set(
        "budget price cost spend spending afford rate fee allowance amount money tip "
        "deposit salary pay"
    ),
    "limit": _set("limit cap max maximum ceiling"),
    "time": _set(
        "time hour hours slot start starting when window arrival departure bedtime curfew "
        "alarm wake"
    ),
    "day": _set("day days weekday weekdays date when schedule"),
    "date": _set("date deadline birthday anniversary due"),
    "duration": _set("length duration long time"),
    "count": _set("length count number"),
    "size": _set("size sizes fit"),
    "dose": _set("dose dosage"),
    "version": _set("version release"),
    "name": _set(
        "brand shop store airline restaurant venue provider company app platform supplier "
        "bank school doctor vet dentist plumber groomer reviewer contact name hairdresser "
        "barber mechanic garage pharmacy carrier channel tool stylist editor framework "
        "insurer recipient recipients"
    ),
}

# Attribute nouns that name the same attribute in other words ("budget" / "price").
_KIN = (
    _set("budget price cost spend spending rate fee allowance cap limit max maximum"),
    _set("time hour hours slot window availability"),
    _set("length duration time"),
    _set("size sizes"),
    _set("day days date dates timestamp"),
    _set("dose dosage"),
    _set("version release"),
)

# Question names ("when I can meet", "how much to spend") ask for a value of a shape.
_ASKS: dict[tuple[str, ...], frozenset[str]] = {
    ("when",): frozenset({"time", "day", "date"}),
    ("what", "time"): frozenset({"time"}),
    ("which", "day"): frozenset({"day"}),
    ("which", "days"): frozenset({"day"}),
    ("how", "much"): frozenset({"amount", "limit"}),
    ("how", "many"): frozenset({"count"}),
    ("how", "long"): frozenset({"duration"}),
    ("who",): frozenset({"name"}),
}

# Derivational endings stripped to a shared root ("dietary" / "diet", "allergic" /
# "allergy", "plumber" / "plumbing"), longest first, with the letters that must remain.
_DERIVATIONAL = (
    ("ibility", 4),
    ("ability", 4),
    ("ational", 4),
    ("ation", 3),
    ("ition", 3),
    ("ical", 4),
    ("ible", 4),
    ("able", 4),
    ("ary", 4),
    ("ery", 4),
    ("ian", 4),
    ("ion", 4),
    ("ive", 4),
    ("er", 5),
    ("ic", 4),
    ("al", 4),
    ("y", 4),
)


_ENDINGS_BY_LAST: dict[str, tuple[tuple[str, int], ...]] = {
    last: tuple(pair for pair in _DERIVATIONAL if pair[0][-1] == last)
    for last in {ending[-1] for ending, _ in _DERIVATIONAL}
}


@lru_cache(maxsize=65536)
def root(word: str) -> str:
    """The root of a lowercase word: its stem, one derivational ending stripped, undoubled.

    >>> root("dietary") == root("diet"), root("allergic") == root("allergies")
    (True, True)
    """
    word = stem(word)
    if not word.isalpha():
        return word
    for ending, keep in _ENDINGS_BY_LAST.get(word[-1], ()):
        if word.endswith(ending) and len(word) - len(ending) >= keep:
            word = word[: -len(ending)]
            break
    if len(word) > 4 and word[-1] == word[-2] and word[-1] not in "aeiou":
        word = word[:-1]
    if len(word) >= 4 and word.endswith("e"):
        word = word[:-1]  # "update" meets "updates", which the stemmer cut to "updat"
    return word


def words(text: str) -> list[str]:
    """The lowercase words of ``text``: apostrophes kept inside ("can't"), possessives cut."""
    return [word.casefold() for word in _written(text)]


def _written(text: str) -> list[str]:
    found = [match.replace("\u2019", "'") for match in _WORD.findall(text)]
    return [word[:-2] if word.lower().endswith("'s") else word for word in found]


def _is_content(word: str) -> bool:
    return (
        len(word) > 1
        and not word.isdigit()
        and word not in _STOP
        and word not in _GENERIC
        and word not in _NEGATIONS
        and word not in _PREFERENCE_CUES
    )


@lru_cache(maxsize=65536)
def content_roots(text: str) -> frozenset[str]:
    """The roots of the words of ``text`` that carry meaning (no stop, generic or cue words)."""
    return frozenset(root(word) for word in words(text) if _is_content(word))


@dataclass(frozen=True, eq=False)
class Phrase:
    """What a short phrase (a topic, a requirement name) is about.

    Attributes:
        roots: The content roots, in order.
        head: The attribute it names: the last root before any preposition, or
            ``None`` for a phrase of generic words only.
        modifiers: The other roots: what the attribute is of or for.
        closest: The modifier right before the head ("food" in "dog food brand").
        subject: The modifiers before the head, qualifiers ("max", "daily") left out:
            what the attribute is of ("quiz" in "quiz length", none in "price per night").
        activity: It names an activity and its object ("citing sources").
        weak: Whether the head names an attribute only with its modifiers.
        asks: For a question ("when I can meet"), the value shapes it asks for; its
            content words are then all modifiers.
        surface: Each root's word as written (for matchers that compare words).
    """

    roots: tuple[str, ...]
    head: str | None
    modifiers: frozenset[str]
    closest: str | None
    subject: frozenset[str]
    activity: bool
    weak: bool
    asks: frozenset[str]
    surface: dict[str, str]

    @property
    def specific(self) -> bool:
        """Whether it names one attribute of one thing ("writing tone").

        Not a category ("travel", "code style", "work stuff") many values fall under.
        """
        return self.head is not None and not self.weak and len(self.roots) > 1

    @property
    def identity(self) -> frozenset[str]:
        """The roots that name the attribute: the head, or a weak head's modifiers."""
        if self.head is None or self.asks:
            return frozenset()
        return self.modifiers if self.weak else frozenset({self.head})


_EMPTY = Phrase(
    roots=(),
    head=None,
    modifiers=frozenset(),
    closest=None,
    subject=frozenset(),
    activity=False,
    weak=False,
    asks=frozenset(),
    surface={},
)


@lru_cache(maxsize=65536)
def phrase(text: str) -> Phrase:
    """Read ``text`` as a noun phrase; see `Phrase`.

    "citing sources" and "booking hotels" (a gerund and a plural object) name the
    activity, so the gerund is their head; "booking method" names the method.
    """
    tokens = words(text.replace("-", " ").replace("_", " "))
    asks = next(
        (kinds for start, kinds in _ASKS.items() if tuple(tokens[: len(start)]) == start), None
    )
    content = [(i, word) for i, word in enumerate(tokens) if _is_content(word)]
    if not content:
        return _EMPTY
    roots = [root(word) for _, word in content]
    surface = {root(word): word for _, word in reversed(content)}
    if asks:
        return Phrase(
            roots=tuple(dict.fromkeys(roots)),
            head=f"?{tokens[0]}",
            modifiers=frozenset(roots),
            closest=roots[-1],
            subject=frozenset(roots) - QUALIFIER_ROOTS - KIN_WORDS,
            activity=False,
            weak=False,
            asks=asks,
            surface=surface,
        )
    cut = next((i for i, word in enumerate(tokens) if word in _PREPOSITIONS and i > 0), None)
    before = [(i, word) for i, word in content if cut is None or i < cut] or content[-1:]
    first, last = content[0][1], content[-1][1]
    if len(content) > 1 and first.endswith("ing") and last.endswith("s") and cut is None:
        head_at, before = 0, content  # "citing sources": the activity
    else:
        head_at = len(before) - 1
    head = root(before[head_at][1])
    return Phrase(
        roots=tuple(dict.fromkeys(roots)),
        head=head,
        modifiers=frozenset(roots) - {head},
        closest=root(before[head_at - 1][1]) if head_at > 0 else None,
        subject=frozenset(root(word) for _, word in before[:head_at])
        - QUALIFIER_ROOTS
        - KIN_WORDS
        - {head},
        activity=head_at == 0 and len(before) > 1 and before is content,
        weak=head in _WEAK_ROOTS and len(set(roots)) > 1,
        asks=frozenset(),
        surface=surface,
    )


def kin(a: str, b: str) -> bool:
    """Whether two attribute roots name the same attribute ("budget" / "price")."""
    return a == b or bool(_KIN_GROUPS.get(a, 0) & _KIN_GROUPS.get(b, 0))


@dataclass(frozen=True, eq=False)
class Clause:
    """One clause of a text and what it says about what it mentions.

    Attributes:
        roots: The roots of its words, in order (stop words included, for positions).
        content: For each word, whether it carries meaning (see `content_roots`).
        surface: Its words as written (case kept), in order.
        joined: Its roots plus every two neighbouring words joined ("pick up" ->
            "pickup"), for finding a word written in two.
        negated: Positions of negation words.
        preferring: Whether a preference cue ("always", "prefer") occurs in it.
        ceasing: Whether it says something stopped being true ("no longer").
        changing: Whether it announces a change ("now", "switched to").
    """

    roots: tuple[str, ...]
    content: tuple[bool, ...]
    surface: tuple[str, ...]
    joined: frozenset[str]
    negated: tuple[int, ...]
    preferring: bool
    ceasing: bool
    changing: bool

    def positions(self, wanted: frozenset[str]) -> list[int]:
        """Where roots in ``wanted`` occur in this clause."""
        return [i for i, word in enumerate(self.roots) if word in wanted]

    def polarity(self, position: int) -> int:
        """-1 if the word at ``position`` is negated or ceased, +1 if preferred, else 0."""
        if any(i < position for i in self.negated) or self.ceasing:
            return -1
        before = self.roots[:position]
        if "than" in before or "instead" in before:
            return -1  # "rather A than B", "A instead of B": B is what is not wanted
        if "over" in before and any(
            word in _PREFERENCE_CUE_ROOTS for word in before[: before.index("over")]
        ):
            return -1  # "prefer A over B or C": B and C are not
        if _REJECTING_ROOTS & set(self.roots[position + 1 : position + 3]):
            return -1  # "gluten-free", "nut allergy", "crowd avoidance"
        return 1 if self.preferring else 0


# "Anything but X", "except X", "other than X": X is excluded, not a new clause.
_EXCLUDING = (
    re.compile(
        r"\b(anything|everything|all|any\s+\w+)\s+(?:but|except(?:\s+for)?)\b", re.IGNORECASE
    ),
    re.compile(r"\b(?:except(?:\s+for)?|other\s+than)\b", re.IGNORECASE),
)


@lru_cache(maxsize=16384)
def clauses(text: str) -> tuple[Clause, ...]:
    """Split ``text`` into clauses at punctuation and contrasts ("but", "though")."""
    result = []
    text = _EXCLUDING[1].sub("not", _EXCLUDING[0].sub(r"\1 not", text))
    for part in _CLAUSE_BREAK.split(text):
        written = _written(part.replace("-", " ").replace("_", " "))
        tokens = [word.casefold() for word in written]
        if not tokens:
            continue
        lowered = " ".join(tokens)
        roots = tuple(root(word) for word in tokens)
        pairs = {root(a + b) for a, b in itertools.pairwise(tokens)}
        result.append(
            Clause(
                roots=roots,
                content=tuple(_is_content(word) for word in tokens),
                surface=tuple(written),
                joined=frozenset(roots) | pairs,
                negated=tuple(i for i, word in enumerate(tokens) if word in _NEGATIONS),
                preferring=any(word in _PREFERENCE_CUES for word in tokens),
                ceasing=bool(CESSATION.search(lowered)),
                changing=bool(_CHANGE.search(lowered)),
            )
        )
    return tuple(result)


@lru_cache(maxsize=16384)
def value_kinds(text: str) -> frozenset[str]:
    """The shapes of value ``text`` holds (see `attribute_kinds`); ``text`` as written."""
    return frozenset(kind for kind, pattern in _VALUE_KINDS.items() if pattern.search(text))


def attribute_kinds(words_of_name: frozenset[str]) -> frozenset[str]:
    """The value shapes an attribute named by these roots takes ("budget" -> amount)."""
    return frozenset(kind for kind, roots in _ATTRIBUTE_ROOTS.items() if roots & words_of_name)


_WEAK_ROOTS = frozenset(root(word) for word in _WEAK_HEADS)
_PREFERENCE_CUE_ROOTS = frozenset(root(word) for word in _PREFERENCE_CUES)
_REJECTING_ROOTS = frozenset(
    root(word)
    for word in (
        "free avoidance allergy allergies allergic intolerance intolerant ban banned"
    ).split()
)
QUALIFIER_ROOTS = frozenset(root(word) for word in _QUALIFIERS)
_KIN_ROOTS = tuple(frozenset(root(word) for word in group) for group in _KIN)
KIN_WORDS = frozenset().union(*_KIN_ROOTS)
_KIN_GROUPS = {  # root -> bit set of its groups
    word: sum(1 << i for i, group in enumerate(_KIN_ROOTS) if word in group) for word in KIN_WORDS
}
_ATTRIBUTE_ROOTS = {
    kind: frozenset(root(word) for word in names) for kind, names in _ATTRIBUTE_KINDS.items()
}
