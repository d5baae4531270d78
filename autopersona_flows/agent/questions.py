"""Questions as a person would ask them, composed from what a requirement declares.

A requirement without a question of its own is asked about in three parts:

1. what the work is, when it reads as a purpose: the node's instruction (else the
   request) is an imperative, so "Format the references" becomes "To format the
   references, ..."; "my" in it becomes "your". It is left out when it would not
   read naturally (it does not start with a verb, it is long) or would only repeat
   the requirement's words ("Plan breakfasts" before "breakfast");
2. what is asked, from the requirement's name: "what is your home airport", "what
   are your dietary needs" for what a person has or is; "which seat would you like"
   for a choice; "what tone would you like" otherwise; "could you tell me who
   gives the lessons" for a name that is a question already;
3. the options, once, as a person says them ("Window or aisle?", "APA, MLA or
   something else?"); for a free-text answer, the declared example (or default)
   or the description.

Everything here is small general English: the lexicon says which nouns are a
person's own ("needs", "allergies", "budget") and which words cannot start an
imperative; no list names a domain.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from autopersona_flows.agent.decisions import PersonaRequest, Requirement
from autopersona_flows.memory.phrases import content_roots, root

__all__ = ["compose_question", "names_options", "options_phrase"]


def compose_question(
    requirement: Requirement,
    request: PersonaRequest | None = None,
    options: Sequence[str] | None = None,
) -> str:
    """The question to ask a person for ``requirement``; its own, if it declares one.

    Args:
        requirement: What is missing.
        request: What it is needed for: its node's instruction, else its query, gives
            the question its purpose.
        options: The answers to offer; the requirement's declared options if not given.

    Returns:
        One or two sentences, ending in a question mark (or an example answer).
    """
    if requirement.question:
        return requirement.question
    options = list(requirement.options if options is None else options)
    lead = _purpose(requirement, request)
    question = f"{lead}, {_asking(requirement, options)}" if lead else _asking(requirement, options)
    question = question[0].upper() + question[1:] + "?"
    if options:
        return f"{question} {_capitalised(options_phrase(options, requirement.allow_other))}?"
    example = requirement.example or requirement.default
    if example:
        return f"{question} For example: {_ended(example)}"
    if requirement.description and not content_roots(requirement.description) <= content_roots(
        question
    ):
        return f"{question} ({requirement.description.strip()})"
    return question


def options_phrase(options: Sequence[str], others: bool = False) -> str:
    """The options as a person lists them: "window or aisle", "APA, MLA or Chicago".

    With ``others``, they are suggestions: "APA, MLA or something else".
    """
    listed = [*options, "something else"] if others else list(options)
    if len(listed) < 2:
        return "".join(listed)
    return f"{', '.join(listed[:-1])} or {listed[-1]}"


def names_options(question: str, options: Sequence[str]) -> bool:
    """Whether ``question`` names every one of ``options`` already (as a composed one does)."""
    said = question.casefold()
    return bool(options) and all(
        re.search(rf"(?<!\w){re.escape(option.casefold())}(?!\w)", said) for option in options
    )


# -- what is asked -------------------------------------------------------------------------


def _asking(requirement: Requirement, options: Sequence[str]) -> str:
    """The question's clause from the requirement's name: "which seat would you like"."""
    name = " ".join(requirement.name.split())
    said = _yours(name)
    first = said.split()[0].casefold()
    if first in _WH:
        return f"could you tell me {said}"  # "who gives the lessons": a question already
    head, after = _head(name)
    if first in _OWN_ADJECTIVES or (root(head) in _OWN_ROOTS and after != "of"):
        return f"what {'are' if _plural(head) else 'is'} your {name}"
    return f"{'which' if options else 'what'} {name} would you like"


def _head(name: str) -> tuple[str, str | None]:
    """The noun a name is about, and the preposition after it: "budget" and "per"."""
    tokens = [re.sub(r"[^\w']+", "", word) for word in name.casefold().split()]
    cut = next((i for i, word in enumerate(tokens) if word in _PREPOSITIONS and i > 0), None)
    if cut is None:
        return tokens[-1], None
    return tokens[cut - 1], tokens[cut]


def _plural(word: str) -> bool:
    return len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is"))


# What a person has or is, asked as "your ...": "what are your dietary needs", not
# "what dietary needs would you like". Not "size" or "level": a paper size and a
# difficulty level are chosen ("the number of guests" neither: "of" follows).
_OWN = (
    "need requirement restriction allergy intolerance condition preference priority "
    "goal constraint interest diet measurement height weight age birthday nationality "
    "address email number budget deadline limit availability role title timezone"
)
_OWN_ROOTS = frozenset(root(word) for word in _OWN.split())
_OWN_ADJECTIVES = frozenset(
    "preferred favourite favorite usual home own default main current regular normal "
    "typical personal".split()
)
_WH = frozenset("who whom whose what which when where why how whether if".split())
_PREPOSITIONS = frozenset("per for of in on at to with from by about during".split())


# -- what the work is -----------------------------------------------------------------------


def _purpose(requirement: Requirement, request: PersonaRequest | None) -> str | None:
    """The work as a purpose ("to format the references"), if it reads as one."""
    if request is None:
        return None
    node = request.node
    work = (node.instruction if node is not None and node.instruction.strip() else "") or (
        request.query
    )
    tokens = work.strip().rstrip(".!?;:").split()
    if tokens and tokens[0].casefold() == "please":
        tokens = tokens[1:]
    if not 2 <= len(tokens) <= _MAX_WORDS or not _imperative(tokens[0]):
        return None
    clause = _yours(" ".join([tokens[0].casefold(), *tokens[1:]]))
    if content_roots(requirement.name) & content_roots(clause):
        return None  # "to plan breakfasts, what breakfast ...": the work says it already
    return f"to {clause}"


_MAX_WORDS = 14
"""A longer instruction or request is a paragraph: the step it names is shown beside
the question anyway (in the dialog's heading, the log line, the notification)."""


def _imperative(word: str) -> bool:
    """Whether an instruction's first word can be the verb of an imperative ("Book ...")."""
    lower = word.casefold()
    return (
        word.isalpha()
        and word[1:] == word[1:].lower()  # not "NDA", "iOS"
        and lower not in _NOT_VERBS
        and not lower.endswith(("ing", "ed"))
        and not _plural(lower)  # "Sends the email", "Papers to read": not an instruction
    )


_NOT_VERBS = frozenset(
    (
        "a an the this that these those my our your his her their its some any all each "
        "every no i we you he she it they me us them there here what which who whom whose "
        "when where why how whether if for to of in on at by with from about as and or but "
        "not can could would should will shall may might must let let's is are was were be "
        "do does did have has had just also then now"
    ).split()
)


# -- words ------------------------------------------------------------------------------------

_PERSON = {
    "i": "you",
    "me": "you",
    "my": "your",
    "mine": "yours",
    "myself": "yourself",
    "i'm": "you're",
    "i've": "you've",
    "i'll": "you'll",
    "i'd": "you'd",
    "we": "you",
    "us": "you",
    "our": "your",
    "ours": "yours",
    "ourselves": "yourselves",
}
_WORD = re.compile(r"[A-Za-z]+(?:['\u2019][A-Za-z]+)?")


def _yours(text: str) -> str:
    """``text`` said to the person: "my trip" becomes "your trip", "I can" "you can"."""

    def swap(match: re.Match[str]) -> str:
        word = match.group(0)
        if word.isupper() and word != "I":
            return word  # "the US", not "us"
        said = _PERSON.get(word.casefold().replace("\u2019", "'"))
        if said is None:
            return word
        return said.capitalize() if word[0].isupper() and word != "I" else said

    return _WORD.sub(swap, re.sub(r"\bI am\b", "you are", text))


def _capitalised(text: str) -> str:
    """The first letter up, unless the first word is cased on purpose ("iPhone")."""
    first = text.split(" ", 1)[0]
    return text[0].upper() + text[1:] if first == first.lower() else text


def _ended(text: str) -> str:
    text = text.strip()
    return text if text[-1] in ".!?" else f"{text}."
