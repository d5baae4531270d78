"""Standing constraints: what must reach a node even when nobody declared it.

An allergy, a wheelchair, a hard budget cap or a legal limit is not a preference a
node author thinks to require, yet getting it wrong is costly. A memory states a
standing constraint when it names one of a few *stakes* (health, access, money,
law); it applies to a node whose work is in one of the *domains* that stake
touches: an allergy to anything about food or medicine, not to formatting a
bibliography. Both are small lists of everyday English words, not of any data set.
"""

from __future__ import annotations

import re
from functools import lru_cache

from autopersona_flows.memory.phrases import content_roots

__all__ = ["applies", "stake_words", "stakes"]

# Stake -> words that state it, as written (to look memories up by) ...
_STAKE_WORDS: dict[str, tuple[str, ...]] = {
    "health": tuple(
        "allergy allergies allergic anaphylaxis anaphylactic epipen intolerance intolerant"
        " coeliac celiac diabetic diabetes insulin medication medications prescription"
        " pregnant pregnancy asthma asthmatic condition diagnosed interaction interacts"
        " contraindicated blood thinner warfarin immune".split()
    ),
    "access": tuple(
        "wheelchair accessible accessibility step-free stepfree mobility disability disabled"
        " ramp ramps lift elevator deaf blind visually impaired crutches walker cane"
        " seizures epilepsy".split()
    ),
    "money": tuple("cap capped ceiling afford overspend".split()),
    "law": tuple(
        "legal law laws lawyer compliance compliant regulation regulated regulatory gdpr hipaa"
        " confidential confidentiality nda consent pii personal-data privacy copyright"
        " licence license licensing embargo export-controlled sanction sanctions audit".split()
    ),
}
# ... and as roots (to read them with).
_STAKES = {stake: content_roots(" ".join(words)) for stake, words in _STAKE_WORDS.items()}
# A hard money limit is stated by a phrase (`_HARD_LIMIT`), mostly of stop words the
# index drops ("no more than"): these words of such statements look them up.
_LIMIT_WORDS = tuple("never max maximum afford strict strictly hard budget limit spend".split())

# Domain -> words of the work it covers.
_DOMAINS: dict[str, frozenset[str]] = {
    "food": content_roots(
        "food eat eating meal meals dinner lunch breakfast brunch snack snacks restaurant"
        " restaurants cafe café canteen catering caterer menu dish dishes recipe recipes cook"
        " cooking bake baking grocery groceries supermarket ingredients kitchen picnic"
        " barbecue bbq takeaway takeout drinks cake dessert party potluck diner table"
    ),
    "health": content_roots(
        "pharmacy pharmacist prescription medication medicine pills supplements vitamins"
        " doctor gp clinic hospital dentist dental nurse appointment treatment vaccine"
        " therapy health medical"
    ),
    "venue": content_roots(
        "venue venues hotel hotels room rooms flight flights train trains bus coach ferry"
        " trip trips travel travelling journey tour tours event events concert concerts"
        " theatre theater cinema museum stadium conference accommodation apartment airbnb"
        " taxi transfer airport station office offsite meeting meetings visit outing"
        " holiday vacation wedding party restaurant booking reservation seat seats"
    ),
    "purchase": content_roots(
        "buy buying purchase purchases order ordering shop shopping store checkout cart"
        " pay payment price quote subscription subscribe rent rental hire gift gifts"
        " present presents booking book reserve reservation ticket tickets upgrade"
        " invoice spend"
    ),
    "data": content_roots(
        "data dataset datasets export exports share sharing send upload publish report"
        " reports records database backup analytics survey customer customers client"
        " clients patient patients email emails spreadsheet crm logs contract contracts"
        " post posts blog article press announcement tweet public website newsletter"
        " social portfolio talk slides"
    ),
}

_TOUCHES: dict[str, frozenset[str]] = {
    "health": frozenset({"food", "health"}),
    "access": frozenset({"venue"}),
    "money": frozenset({"purchase"}),
    "law": frozenset({"data"}),
}


# Money is at stake only when a limit is hard, not whenever a budget is mentioned.
_HARD_LIMIT = re.compile(
    r"\b(?:no|never|not) more than\b|\bat most\b|\bhard (?:limit|cap)\b|\bmax(?:imum)?\b"
    r"|\bcan(?:'|no)?t afford\b|\bstrict(?:ly)? (?:budget|limit)\b",
    re.IGNORECASE,
)


@lru_cache(maxsize=16384)
def _domains(text: str) -> frozenset[str]:
    roots = content_roots(text.replace("-", " ").replace("_", " "))
    return frozenset(domain for domain, words in _DOMAINS.items() if roots & words)


@lru_cache(maxsize=16384)
def stakes(text: str) -> frozenset[str]:
    """The stakes ``text`` states: ``health``, ``access``, ``money``, ``law``."""
    roots = content_roots(text) | content_roots(text.replace("-", ""))
    found = {stake for stake, words in _STAKES.items() if roots & words}
    if _HARD_LIMIT.search(text):
        found.add("money")
    return frozenset(found)


def applies(text: str, work: str) -> bool:
    """Whether ``text`` states a standing constraint for ``work`` (a node and its request).

    It must state a stake whose domains include one of the work's, and if it names
    domains itself ("the hotel budget is a hard cap"), one of those too.
    """
    stake_set = stakes(text)
    if not stake_set:
        return False
    work_domains = _domains(work)
    touched = frozenset().union(*(_TOUCHES[stake] for stake in stake_set)) & work_domains
    if not touched:
        return False
    own = _domains(text) - {"health"}  # naming a condition is not naming the work
    return not own or bool(own & work_domains)


def stake_words(work: str) -> list[str]:
    """The words stating the stakes that could apply to ``work``, as written.

    A memory stating an allergy shares no word with "Order groceries": looking the
    person's memories up by these words finds it, however much else the bank holds.
    Some memories found state no stake ("budget: flexible"): `applies` tells.
    """
    domains = _domains(work)
    wanted = [stake for stake, touched in _TOUCHES.items() if touched & domains]
    words = {word for stake in wanted for word in _STAKE_WORDS[stake]}
    if "money" in wanted:
        words |= set(_LIMIT_WORDS)
    return sorted(words)
