"""When a stated fact stops holding: "until March", "this week", "for the next 3 days".

`valid_until` reads the end of a time-bounded statement relative to when it was
said. Only phrases that bound the statement count ("until", "till", "through",
"for the next", "this week"); a date mentioned for another reason ("my flight on
March 3") bounds nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta

__all__ = ["valid_until"]

_MONTHS = {
    name: number
    for number, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        start=1,
    )
    for name in names
}
_DAYS = {
    name: number
    for number, names in enumerate(
        (
            ("monday", "mon"),
            ("tuesday", "tue", "tues"),
            ("wednesday", "wed"),
            ("thursday", "thu", "thurs"),
            ("friday", "fri"),
            ("saturday", "sat"),
            ("sunday", "sun"),
        )
    )
    for name in names
}
_UNITS = {"day": 1, "night": 1, "week": 7, "fortnight": 14, "month": 30, "year": 365}
_NUMBERS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "couple of": 2,
    "few": 3,
}

_MONTH = "|".join(sorted(_MONTHS, key=len, reverse=True))
_DAY = "|".join(sorted(_DAYS, key=len, reverse=True))
_NUMBER = r"\d+|" + "|".join(sorted(_NUMBERS, key=len, reverse=True))
_UNTIL = r"(?:until|till|til|up to|up until|through|thru|to the end of|till the end of)"

# "until his stitches come out on the 28th of April": the event, then its date (only
# after "until": "I pay through PayPal on the 1st" bounds nothing).
_EVENT = r"(?:(?:(?<=until )|(?<=till ))[^.;,]{0,40}?\s(?:on|by)\s+)?"
_UNTIL_DATE = re.compile(
    rf"\b(?P<kind>{_UNTIL})\s+{_EVENT}(?:the\s+)?(?:(?:end|start|beginning)\s+of\s+)?"
    rf"(?:(?P<day1>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<month1>{_MONTH})\b"
    rf"|(?P<month2>{_MONTH})\b\.?(?:\s+(?P<day2>\d{{1,2}})(?:st|nd|rd|th)?\b)?)"
    r"(?:,?\s+(?P<year>\d{4}))?",
    re.IGNORECASE,
)
_UNTIL_DAY = re.compile(
    rf"\b{_UNTIL}\s+{_EVENT}the\s+(?P<day>\d{{1,2}})(?:st|nd|rd|th)\b(?!\s+(?:of\s+)?(?:{_MONTH})\b)",
    re.IGNORECASE,
)
_UNTIL_WEEKDAY = re.compile(rf"\b{_UNTIL}\s+(?:next\s+)?(?P<day>{_DAY})\b", re.IGNORECASE)
_FOR_NEXT = re.compile(
    rf"\b(?:for|over|during)\s+(?:the\s+)?(?:next|coming)?\s*(?:a\s+)?"
    rf"(?P<n>{_NUMBER})?\s*(?:of\s+)?(?P<unit>day|night|week|fortnight|month|year)s?\b",
    re.IGNORECASE,
)
# "I've been vegan for 10 years", "I tried keto for a month": a past span bounds nothing.
_PAST = re.compile(
    r"\b(?:been|have|has|had|'ve|was|were|did|used|ago|tried|spent|lasted|took)\b|\w{3,}ed\b",
    re.IGNORECASE,
)
_THIS = re.compile(
    r"\b(?:(?:this|the rest of the|the rest of this)\s+(?P<span>week|weekend|month|year)"
    r"|until (?:the end of )?the (?P<the>week|month|year)"
    r"|until (?P<end>the end of )?next (?P<next>week|month|year)"
    r"|(?P<today>today only|just for today|for today|for tonight|tonight only))\b",
    re.IGNORECASE,
)


def _midnight(when: datetime) -> datetime:
    return when.replace(hour=0, minute=0, second=0, microsecond=0)


def _month_start(year: int, month: int, at: datetime) -> datetime:
    return _midnight(at.replace(year=year, month=month, day=1))


def _next_month_start(when: datetime) -> datetime:
    year, month = (when.year + 1, 1) if when.month == 12 else (when.year, when.month + 1)
    return _month_start(year, month, when)


def _on_or_after(at: datetime, month: int, day: int, year: str | None) -> datetime | None:
    chosen = int(year) if year else at.year
    try:
        when = _midnight(at.replace(year=chosen, month=month, day=day))
    except ValueError:  # "February 30"
        return None
    if not year and when + timedelta(days=1) <= at:
        when = when.replace(year=chosen + 1)
    return when


def _from_date(match: re.Match[str], at: datetime) -> datetime | None:
    kind = match.group("kind").casefold()
    month = _MONTHS[(match.group("month1") or match.group("month2")).casefold()]
    day = match.group("day1") or match.group("day2")
    whole = match.group(0).casefold()
    if day:
        start = _on_or_after(at, month, int(day), match.group("year"))
        return start + timedelta(days=1) if start else None  # "until the 3rd": all of it
    year = int(match.group("year")) if match.group("year") else at.year
    start = _month_start(year, month, at)
    if start <= at < _next_month_start(start):  # "until March", said in March: all of it
        return _next_month_start(start)
    if start <= at and not match.group("year"):
        start = _month_start(year + 1, month, at)
    through = kind in ("through", "thru") or "end of" in whole
    return _next_month_start(start) if through else start


def _end_of(span: str, at: datetime) -> datetime:
    """The first moment after the week, month or year that ``at`` is in."""
    if span in ("week", "weekend"):
        return _midnight(at) + timedelta(days=7 - at.weekday())  # the coming Monday
    if span == "month":
        return _next_month_start(at)
    return _month_start(at.year + 1, 1, at)


def _span(match: re.Match[str], at: datetime) -> datetime:
    if match.group("today"):
        return _midnight(at) + timedelta(days=1)
    this = match.group("span") or match.group("the")
    if this:
        return _end_of(this.casefold(), at)
    ahead = _end_of(match.group("next").casefold(), at)  # when the next one starts
    return _end_of(match.group("next").casefold(), ahead) if match.group("end") else ahead


def valid_until(text: str, at: datetime) -> datetime | None:
    """When the statement ``text``, made at ``at``, stops holding, if it says.

    Args:
        text: The statement as the person made it.
        at: When it was said (timezone-aware); relative phrases count from it.

    Returns:
        The first moment it no longer holds, or ``None`` if it is not bounded.
        "until March" ends when March starts; "through March", "until March 3" and
        "until Friday" include the month or the day.
    """
    if not isinstance(at, datetime) or at.utcoffset() is None:
        raise ValueError(f"at must be a timezone-aware datetime, got {at!r}")
    candidates = [
        *_dates(text, at),
        *_days_of_month(text, at),
        *_weekdays(text, at),
        *_durations(text, at),
        *(_span(match, at) for match in _THIS.finditer(text)),
    ]
    later = [end for end in candidates if end > at]
    return min(later) if later else None


def _dates(text: str, at: datetime) -> Iterator[datetime]:
    for match in _UNTIL_DATE.finditer(text):
        try:
            end = _from_date(match, at)
        except (ValueError, OverflowError):  # "until March 0000"
            continue
        if end is not None:
            yield end


def _days_of_month(text: str, at: datetime) -> Iterator[datetime]:
    """Days of a month named alone ("until payday on the 28th"): this month's or next."""
    for match in _UNTIL_DAY.finditer(text):
        day = int(match.group("day"))
        month_start = _month_start(at.year, at.month, at)
        for start in (month_start, _next_month_start(month_start)):
            try:
                end = start.replace(day=day) + timedelta(days=1)
            except ValueError:
                continue
            if end > at:
                yield end
                break


def _weekdays(text: str, at: datetime) -> Iterator[datetime]:
    for match in _UNTIL_WEEKDAY.finditer(text):
        ahead = (_DAYS[match.group("day").casefold()] - at.weekday()) % 7 or 7
        yield _midnight(at) + timedelta(days=ahead + 1)


def _durations(text: str, at: datetime) -> Iterator[datetime]:
    for match in _FOR_NEXT.finditer(text):
        count = match.group("n")
        ahead = re.search(r"\b(?:next|coming)\b", match.group(0), re.IGNORECASE)
        if count is None and not ahead:
            continue  # "for days" bounds nothing
        if not ahead and _PAST.search(text[: match.start()]):
            continue
        n = 1 if count is None else int(count) if count.isdigit() else _NUMBERS[count.casefold()]
        try:
            yield at + timedelta(days=n * _UNITS[match.group("unit").casefold()])
        except OverflowError:  # "for the next 9999 years": no end this calendar holds
            continue
