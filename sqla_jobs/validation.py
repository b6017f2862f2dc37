"""Checks of values where they enter: every job before it is written, and the numbers,
durations and ids of the worker's configuration and the operators' commands.

Both ways in (``enqueue``/``enqueue_many`` and ``session.add(Job(...))``) call these, so
bad input is refused with [``InvalidJobError``][sqla_jobs.exceptions.InvalidJobError] before any SQL
runs and the caller's transaction stays usable. PostgreSQL would refuse some of these
values too (jsonb rejects ``\\u0000`` and ``NaN``), but only after aborting the caller's
transaction, which is exactly what a job queue must not do to its caller.
"""

from __future__ import annotations

import json
import math
import re
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqla_jobs.exceptions import InvalidJobError, SqlaJobsError


def what(value: object) -> str:
    """How an error names the value it got: ``the class Base`` for a class (whose type
    is its metaclass, which says nothing: ``DeclarativeAttributeIntercept``), ``the
    module shop.models`` for a module, ``None``, else the name of its type."""
    if isinstance(value, type):
        return f"the class {value.__qualname__}"
    if isinstance(value, types.ModuleType):
        return f"the module {value.__name__}"
    return "None" if value is None else type(value).__name__


# --- numbers, durations and ids, for every entry point ----------------------------------
#
# ``error`` is the exception of the entry point: InvalidJobError at enqueue, ConfigError
# for the worker's settings and the operators' commands.


def integer(
    name: str,
    value: object,
    *,
    minimum: int,
    maximum: int | None = None,
    error: type[SqlaJobsError] = InvalidJobError,
    hint: str = "",
) -> int:
    """``value`` if it is an int (not a bool) within ``[minimum, maximum]``; ``hint``
    (what the numbers mean) goes in parentheses after the range in the error."""
    if maximum is not None:
        expected = f"between {minimum} and {maximum}"
    else:
        expected = {0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer >= {minimum}"
        )
    if hint:
        expected += f" ({hint})"
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{name} must be {expected}, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        raise error(f"{name} must be {expected}, got {value}")
    return value


def number(
    name: str,
    value: object,
    *,
    minimum: float = 0.0,
    allow_minimum: bool = True,
    error: type[SqlaJobsError] = InvalidJobError,
) -> float:
    """``value`` as a float if it is a finite int or float (not a bool) above ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise error(f"{name} must be a finite number, got {value!r}")
    if value < minimum or (value == minimum and not allow_minimum):
        raise error(f"{name} must be {'>=' if allow_minimum else '>'} {minimum:g}, got {value}")
    return float(value)


def seconds(
    name: str,
    value: object,
    *,
    numbers: bool = True,
    allow_zero: bool = True,
    error: type[SqlaJobsError] = InvalidJobError,
) -> float | None:
    """A duration (a timedelta, or seconds when ``numbers``) as seconds >= 0; None stays None."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return number(name, value.total_seconds(), allow_minimum=allow_zero, error=error)
    if not numbers:
        raise error(f"{name} must be a timedelta, got {what(value)}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{name} must be seconds or a timedelta, got {what(value)}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise error(f"{name} must be a finite number of seconds {bound}, got {value!r}")
    return float(value)


def ids(
    name: str, values: object, *, error: type[SqlaJobsError] = InvalidJobError
) -> list[int] | None:
    """A sequence of job ids (non-negative ints) as a list; None stays None."""
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, set, frozenset)):
        raise error(f"{name} must be a sequence of integers, got {values!r}")
    return [integer(f"each of {name}", v, minimum=0, error=error) for v in values]


# --- jobs -------------------------------------------------------------------------------

#: Largest accepted payload, measured as UTF-8 bytes of its JSON text.
MAX_PAYLOAD_BYTES = 1_048_576
#: Longest accepted kind and idempotency key.
MAX_KIND_LENGTH = 255
MAX_KEY_LENGTH = 255
#: Priorities run from 0 (first) to 9 (last), as in Oban; the claim walks them in order.
MIN_PRIORITY, MAX_PRIORITY = 0, 9
MAX_MAX_ATTEMPTS = 10_000

# Queue names end up in LISTEN payloads, metrics labels and command lines, so they are
# restricted to a conservative identifier-like alphabet.
_QUEUE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,62}$")


def _text(field: str, value: object, max_length: int) -> str:
    if not isinstance(value, str):
        raise InvalidJobError(f"{field} must be a string, got {what(value)}")
    if not value.strip():
        raise InvalidJobError(f"{field} must not be empty")
    if "\x00" in value:
        raise InvalidJobError(f"{field} must not contain NUL characters")
    if len(value) > max_length:
        raise InvalidJobError(f"{field} is longer than {max_length} characters")
    return value


def check_kind(kind: object) -> str:
    return _text("kind", kind, MAX_KIND_LENGTH)


def check_key(key: object) -> str | None:
    return None if key is None else _text("idempotency key", key, MAX_KEY_LENGTH)


def check_queue(queue: object) -> str:
    if not isinstance(queue, str) or not _QUEUE_RE.match(queue):
        raise InvalidJobError(
            f"queue must match {_QUEUE_RE.pattern} (letters, digits, _ . : -; at most 63), "
            f"got {queue!r}"
        )
    return queue


def check_priority(priority: object) -> int:
    # Which end is urgent is not obvious (some queues run the highest number first).
    return integer(
        "priority",
        priority,
        minimum=MIN_PRIORITY,
        maximum=MAX_PRIORITY,
        hint=f"{MIN_PRIORITY} runs first, {MAX_PRIORITY} last",
    )


def check_max_attempts(max_attempts: object) -> int:
    return integer("max_attempts", max_attempts, minimum=1, maximum=MAX_MAX_ATTEMPTS)


def check_run_at(run_at: object) -> datetime | None:
    if run_at is None:
        return None
    if not isinstance(run_at, datetime):
        raise InvalidJobError(f"run_at must be a datetime, got {what(run_at)}")
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise InvalidJobError(
            "run_at must be timezone-aware (a naive datetime is ambiguous); "
            "use datetime.now(timezone.utc) or pass delay="
        )
    return run_at


def check_delay(delay: object) -> float | None:
    return seconds("delay", delay)


#: Longest accepted job or handler timeout: a week.
MAX_TIMEOUT_SECONDS = 7 * 86_400.0


def check_timeout(timeout: object, *, error: type[SqlaJobsError] = InvalidJobError) -> float | None:
    """A timeout (seconds or timedelta), > 0 and at most a week; None (no limit) stays None."""
    value = seconds("timeout", timeout, allow_zero=False, error=error)
    if value is not None and value > MAX_TIMEOUT_SECONDS:
        raise error(f"timeout must be at most {MAX_TIMEOUT_SECONDS:g} seconds, got {value:g}")
    return value


# One encoder, built once: json.dumps with any option builds a new one per call, which
# cost more than the encoding itself for a small payload. ensure_ascii (the default)
# makes the text ASCII, so its length is its size in UTF-8 bytes.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
# The C encoder json.JSONEncoder.encode builds on every call, built once (a third of the
# cost of encoding a small payload: 1.3 us -> 0.45 us). Without the markers dict (which
# a failed call would leave dirty for the next), a circular payload ends in
# RecursionError rather than ValueError; both are refused below. None where the
# interpreter has no C accelerator: then the encoder above is used.
_MAKE_C_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)
_C_ENCODE: Any = (
    None
    if _MAKE_C_ENCODER is None
    else _MAKE_C_ENCODER(
        None,
        _ENCODER.default,
        json.encoder.encode_basestring_ascii,
        None,
        ":",
        ",",
        False,
        False,
        False,
    )
)


def json_string(value: str) -> str:
    """``value`` as a JSON string literal (quoted, escaped, ASCII)."""
    return _ENCODER.encode(value)


def dump_payload(payload: object) -> str:
    """Return the payload's JSON text, or raise InvalidJobError if jsonb would refuse it
    (or if JSON would change it: a key that is not a string).

    ``None`` is refused here: where a payload is optional (``enqueue``), the caller turns
    an omitted one into ``{}`` before this; a ``None`` that reaches here was given for a
    payload that must be there (``NewJob``, ``Job``), most likely by mistake.
    """
    if payload is None:
        raise InvalidJobError(
            "payload must be a JSON object (a dict), got None; pass {} for a job that "
            "needs no payload"
        )
    return _dump_object("payload", payload, MAX_PAYLOAD_BYTES)


def _dump_object(label: str, value: object, max_bytes: int) -> str:
    """``value``'s JSON text if it is a JSON object jsonb holds as it is, within
    ``max_bytes``; else InvalidJobError naming ``label`` (``payload``, ``meta``)."""
    if type(value) is not dict and not isinstance(value, Mapping):
        raise InvalidJobError(f"{label} must be a JSON object (a dict), got {what(value)}")
    try:
        text = _ENCODER.encode(value) if _C_ENCODE is None else "".join(_C_ENCODE(value, 0))
    except (TypeError, ValueError):
        raise InvalidJobError(
            f"{label} is not JSON-serializable: {_not_json(value, label)}"
        ) from None
    except RecursionError:
        raise InvalidJobError(
            f"{label} is not JSON-serializable: it refers to itself or is nested too deeply"
        ) from None
    # json.dumps escapes every NUL (in keys and values) as \u0000, which jsonb refuses;
    # the text test is a cheap filter, the walk rules out an escaped backslash before it.
    if "\\u0000" in text and _has_nul(value):
        raise InvalidJobError(f"{label} must not contain NUL characters (jsonb refuses \\u0000)")
    if len(text) > max_bytes:
        raise InvalidJobError(f"{label} is larger than {max_bytes} bytes as JSON")
    # After the encoder: it has refused a value that refers to itself, so this walk
    # ends, and the size check bounds it.
    if not _keys_are_strings(value):
        _check_keys(value, label)  # finds the key and where it is, or passes
    return text


# --- job metadata (revision 0013) -----------------------------------------------------

#: Largest ``meta`` object, as bytes of its JSON text: metadata is for short facts
#: (tenant, request id, trace context) that filters and traces read, not for data. It
#: bounds the meta the application gives; the trace context an insert adds when tracing
#: is on (``MAX_TRACE_CONTEXT_BYTES``) comes on top, so turning tracing on never
#: makes a job that was accepted without it too large.
MAX_META_BYTES = 8_192
#: Most tags on one job, and the longest tag (characters).
MAX_TAGS = 32
MAX_TAG_LENGTH = 100

# --- the trace context in meta (sqla_jobs._otel) ---------------------------------------

#: The keys of ``meta`` that hold the job's W3C trace context. They are reserved: a value
#: the application gives must be well formed (checked with the rest of meta), and is
#: then the parent of the job's publish span (see ``_otel.with_trace_context``).
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: A ``traceparent`` of W3C Trace Context version 00, lowercase hex, neither id all zeros.
_TRACEPARENT_FORMAT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
_TRACEPARENT_EXAMPLE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
#: Longest ``tracestate``: the length W3C asks every vendor to propagate. A longer one
#: an insert stores is cut to this as W3C says (its long entries first, then from the
#: end), so the context an insert adds is bounded.
MAX_TRACESTATE_BYTES = 512
#: Most bytes the trace context adds to a job's meta as JSON: the keys, a traceparent
#: (55 characters) and a tracestate of at most ``MAX_TRACESTATE_BYTES`` as JSON.
MAX_TRACE_CONTEXT_BYTES = (
    (len(',"traceparent":""') + len(_TRACEPARENT_EXAMPLE) + len(',"tracestate":'))
    + 2
    + MAX_TRACESTATE_BYTES
)


def is_traceparent(value: object) -> bool:
    """Whether ``value`` is a W3C ``traceparent`` (version 00)."""
    return isinstance(value, str) and _TRACEPARENT_FORMAT.fullmatch(value) is not None


def _check_trace_context(meta: Mapping[str, Any]) -> None:
    """InvalidJobError unless the trace context keys ``meta`` holds are well formed."""
    if TRACEPARENT in meta and not is_traceparent(meta[TRACEPARENT]):
        raise InvalidJobError(
            f'meta["{TRACEPARENT}"] is reserved for the job\'s trace context and must be a '
            f"W3C traceparent (version 00: 00-<32 hex trace id>-<16 hex parent id>-<2 hex "
            f'flags>, lowercase, ids not all zero, e.g. "{_TRACEPARENT_EXAMPLE}"), '
            f"got {_short(meta[TRACEPARENT])}"
        )
    if TRACESTATE in meta:
        value = meta[TRACESTATE]
        if TRACEPARENT not in meta:
            raise InvalidJobError(
                f'meta["{TRACESTATE}"] is reserved for the job\'s trace context and needs a '
                f'meta["{TRACEPARENT}"] it belongs to'
            )
        if (
            not isinstance(value, str)
            or not all(" " <= c <= "~" for c in value)
            or len(json_string(value)) - 2 > MAX_TRACESTATE_BYTES
        ):
            raise InvalidJobError(
                f'meta["{TRACESTATE}"] is reserved for the job\'s trace context and must be a '
                f"W3C tracestate: a string of printable ASCII characters, at most "
                f"{MAX_TRACESTATE_BYTES} bytes as JSON, got {_short(value)}"
            )


def _short(value: object) -> str:
    return repr(value) if isinstance(value, str) and len(value) <= 80 else what(value)


def dump_meta(meta: object) -> str | None:
    """``meta``'s JSON text (None for None or an empty object: the column stays NULL),
    or InvalidJobError: a JSON object of at most ``MAX_META_BYTES`` whose trace
    context keys, if any, are well formed."""
    if meta is None:
        return None
    if isinstance(meta, Mapping) and (TRACEPARENT in meta or TRACESTATE in meta):
        text = _dump_object("meta", meta, MAX_META_BYTES + MAX_TRACE_CONTEXT_BYTES)
        _check_trace_context(meta)
        # The limit is the application's meta's, without the context: a handler passing
        # its job.meta (context included) on to a follow-up job stays within it.
        own = {k: v for k, v in meta.items() if k != TRACEPARENT and k != TRACESTATE}
        _dump_object("meta", own, MAX_META_BYTES)
        return text
    text = _dump_object("meta", meta, MAX_META_BYTES)
    return None if text == "{}" else text


def dump_traced_meta(meta: Mapping[str, Any]) -> str:
    """The JSON text of a checked meta plus the trace context an insert added to it: it
    may exceed ``MAX_META_BYTES`` by at most ``MAX_TRACE_CONTEXT_BYTES``."""
    return _dump_object("meta", meta, MAX_META_BYTES + MAX_TRACE_CONTEXT_BYTES)


def check_meta(meta: object) -> dict[str, Any] | None:
    """``meta`` as a dict to store (None for None or empty), or InvalidJobError."""
    return None if dump_meta(meta) is None else dict(meta)  # type: ignore[call-overload]


def check_tags(tags: object) -> tuple[str, ...] | None:
    """``tags`` as a tuple of distinct strings, in the order given (None for None or
    empty: the column stays NULL), or InvalidJobError: a list (or tuple) of at most
    ``MAX_TAGS`` non-empty strings of at most ``MAX_TAG_LENGTH`` characters,
    without a comma. A single string is refused: ``tags="vip"`` would otherwise read as
    three tags; a set too: its order, so the stored one, would be arbitrary (tags are
    shown in the order given)."""
    if tags is None:
        return None
    if isinstance(tags, (set, frozenset)):
        raise InvalidJobError(
            f"tags must be a list of strings, got a {type(tags).__name__}, which has no "
            f"order: give a list (e.g. sorted(tags)) so the tags are stored and shown in "
            f"an order you chose"
        )
    if isinstance(tags, (str, bytes)) or not isinstance(tags, (list, tuple)):
        raise InvalidJobError(
            f'tags must be a list of strings, e.g. ["vip", "signup"], got {what(tags)}'
        )
    found: dict[str, None] = {}
    for tag in tags:
        if not isinstance(tag, str):
            raise InvalidJobError(f"each tag must be a string, got {what(tag)}")
        if not tag or "\x00" in tag:
            raise InvalidJobError(f"each tag must be a non-empty string without NUL, got {tag!r}")
        if len(tag) > MAX_TAG_LENGTH:
            raise InvalidJobError(
                f"each tag must be at most {MAX_TAG_LENGTH} characters, got one of "
                f"{len(tag)} ({tag[:20]!r}...)"
            )
        if "," in tag:
            # Tags are listed comma-separated (sqla-jobs show, the dashboard): "a,b"
            # would read as two tags there.
            raise InvalidJobError(
                f"a tag must not contain a comma (tags are listed comma-separated, where "
                f"it would read as two tags), got {tag!r}"
            )
        found[tag] = None
    if len(found) > MAX_TAGS:
        raise InvalidJobError(f"a job has at most {MAX_TAGS} tags, got {len(found)}")
    return tuple(found) or None


_CONTAINERS = (dict, list, tuple)
_SCALARS = (str, int, float, bool, type(None))


def _keys_are_strings(value: object) -> bool:
    """True when every key in ``value`` is a ``str``, checked by exact types only; False
    when it finds another key or a mapping of another type (then ``_check_keys``
    decides). The fast path of every enqueue: no ABC checks, no paths built (the walk
    with paths cost 7x the encoding of a 200-item payload)."""
    stack = [value]
    while stack:
        current = stack.pop()
        kind = type(current)
        if kind is dict:
            items: Iterable[object] = current.values()  # type: ignore[attr-defined]
            for key in current:  # type: ignore[attr-defined]
                if type(key) is not str:
                    return False
        elif kind is list or kind is tuple:
            items = current  # type: ignore[assignment]
        else:
            return False  # a Mapping of another type: the exact walk decides
        for item in items:
            kind = type(item)
            # Exact types first: the ABC check is slow, and most values are scalars.
            if kind in _CONTAINERS or (
                kind not in _SCALARS and isinstance(item, (Mapping, list, tuple))
            ):
                stack.append(item)
    return True


def _check_keys(value: object, path: str) -> None:
    """Refuse a key that is not a string, naming where it is.

    JSON turns ``1``, ``1.5``, ``True`` and ``None`` keys into strings, so the handler
    would read ``{"1": ...}`` where ``{1: ...}`` was enqueued, and ``{1: "a", "1": "b"}``
    would lose one of its values without a word. The encoder has no hook for keys,
    hence this walk over every mapping and list in the payload.
    """
    if isinstance(value, Mapping):
        for key, item in value.items():
            if type(key) is not str and not isinstance(key, str):
                raise InvalidJobError(
                    f"{path}: the key {key!r} is {_a(key)}, not a string; JSON keys are "
                    f"strings, so it would come back as {json_string(str(key))} (or be "
                    "lost beside a string key of that text): convert the keys to str"
                )
            if isinstance(item, (Mapping, list, tuple)):
                _check_keys(item, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            if isinstance(item, (Mapping, list, tuple)):
                _check_keys(item, f"{path}[{index}]")


def _not_json(value: object, path: str) -> str:
    """Where in ``value`` (a failed encode) the first value JSON cannot hold is, and what.

    Visits in the encoder's order, so it finds the value the encoder stopped at.
    """
    found = _find_not_json(value, path)
    if found is None:  # pragma: no cover - the encoder refused something the walk accepts
        return f"{path} holds a value JSON cannot represent"
    where, item = found
    if isinstance(item, float):
        return f"{where}: {item!r} is not JSON (jsonb refuses NaN and infinity)"
    return f"{where}: {what(item)} is not JSON (convert it to a string, number, list or dict)"


def _find_not_json(value: object, path: str) -> tuple[str, object] | None:
    if value is None or isinstance(value, (str, int)):  # bool is an int
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    if isinstance(value, dict):
        items: Any = ((f"{path}[{k!r}]", v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return path, value
    for where, item in items:
        found = _find_not_json(item, where)
        if found is not None:
            return found
    return None


def _a(value: object) -> str:
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


#: Largest result a handler may return, as UTF-8 bytes of its JSON text.
MAX_RESULT_BYTES = 1_048_576


def dump_result(value: object) -> str:
    """A handler's return value as JSON text for ``jobs.result``; ValueError if it cannot be.

    Any JSON value is accepted (object, array, string, number, boolean). Nothing is
    truncated: a value that is too large is refused.
    """
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"the handler's return value is not JSON-serializable: {_not_json(value, 'result')}"
        ) from None
    if "\\u0000" in text and _has_nul(value):
        raise ValueError("the handler's return value contains NUL characters (jsonb refuses them)")
    if len(text) > MAX_RESULT_BYTES:
        raise ValueError(
            f"the handler's return value is {len(text):,} bytes as JSON, more than the "
            f"{MAX_RESULT_BYTES:,} allowed (MAX_RESULT_BYTES); store large results in your "
            "own table and return a reference"
        )
    return text


def _has_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_nul(v) for v in value)
    return False


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def _no_constant(text: str) -> None:
    raise ValueError(f"{text} is not a JSON value")


def json_object(label: str, text: str, error: type[SqlaJobsError]) -> dict[str, Any]:
    """``text`` as a JSON object jsonb can hold (a payload filter's ``{"user": 7}``), or
    ``error`` saying what is wrong, naming ``label``: not JSON (``NaN``, ``Infinity`` and
    ``1e999`` are not), not an object, or holding a NUL character."""
    try:
        value = json.loads(text, parse_float=_finite, parse_constant=_no_constant)
        nul = isinstance(value, dict) and _has_nul(value)
    except ValueError as exc:
        raise error(f'{label} is not JSON ({exc}); e.g. {{"user": 7}}') from None
    except RecursionError:
        # The decoder (and the walk) recurse once per level: text nested ~1,000 deep
        # exhausts Python's stack, which is bad input, not a server error.
        raise error(f"{label} is nested too deeply to decode") from None
    if not isinstance(value, dict):
        raise error(f'{label} must be a JSON object, e.g. {{"user": 7}}, got {what(value)}')
    if nul:
        raise error(f"{label} must not contain a NUL character (jsonb refuses \\u0000)")
    return value


#: What enqueue checks of each value a list filter matches exactly: a value it refuses
#: can be in no job, so the filter could never match.
_FILTER_CHECKS: dict[str, Callable[[str], object]] = {
    "kind": check_kind,
    "queue": check_queue,
    "key": check_key,
    "tag": lambda tag: check_tags([tag]),
}


def filter_value(name: str, label: str, value: str, error: type[SqlaJobsError]) -> str:
    """``value`` of the list filter ``name`` (kind, queue, key, tag), or ``error`` naming
    ``label`` and the rule enqueue applies, when no job can hold it (a tag with a comma, a
    queue name with a space): such a filter would silently match nothing."""
    try:
        _FILTER_CHECKS[name](value)
    except InvalidJobError as exc:
        raise error(f"{label} can match no job: {exc}") from None
    return value


def check_payload(payload: Any) -> dict[str, Any]:
    dump_payload(payload)
    return dict(payload)


# --- queue control: limits and rates (revision 0006) ----------------------------------

#: Largest concurrency limit or rate count accepted.
MAX_LIMIT = 1_000_000
_RATE_RE = re.compile(
    r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*"
    # A plural "s" only after a unit of more than one letter: "1/ms" is not per minute.
    r"(s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?|d|days?)\s*$",
    re.IGNORECASE,
)
_RATE_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60}
_RATE_UNITS.update({"h": 3600, "hr": 3600, "hour": 3600, "d": 86400, "day": 86400})


@dataclass(frozen=True)
class Rate:
    """At most ``count`` starts in any window of ``seconds``: ``check_rate("r", "100/min")``."""

    count: int
    seconds: float

    def __str__(self) -> str:
        if self.seconds in (1, 60, 3600, 86400):
            unit = {1: "s", 60: "min", 3600: "h", 86400: "d"}[int(self.seconds)]
            return f"{self.count}/{unit}"
        return f"{self.count}/{self.seconds:g}s"


def check_limit(name: str, value: object, error: type[SqlaJobsError] = InvalidJobError) -> int:
    """A concurrency limit: how many jobs may run at once across the fleet."""
    return integer(name, value, minimum=1, maximum=MAX_LIMIT, error=error)


def check_rate(name: str, value: object, error: type[SqlaJobsError] = InvalidJobError) -> Rate:
    """``"100/min"``, ``"10/s"``, ``"5/10s"``, ``"1000/h"``, ``"2/day"`` (or a Rate) as a Rate."""
    if isinstance(value, Rate):
        return value
    match = _RATE_RE.match(value) if isinstance(value, str) else None
    if match is None:
        raise error(
            f"{name} must look like '100/min' (a count, '/', an optional number and a unit "
            f"s, min, h or day), got {value!r}"
        )
    count = check_limit(f"{name}'s count", int(match.group(1)), error)
    unit = match.group(3).lower()
    seconds = float(match.group(2) or 1) * _RATE_UNITS[unit if unit in _RATE_UNITS else unit[:-1]]
    if seconds <= 0:
        raise error(f"{name}'s window must be longer than 0 seconds, got {value!r}")
    return Rate(count, seconds)
