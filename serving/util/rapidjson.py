"""What TF Serving's REST codecs get from rapidjson, emulated: parsing and the values in messages.

``tensorflow_serving/util/json_tensor.cc`` parses every request body with rapidjson
(``ParseJson``) and renders JSON values inside its error messages with rapidjson's writer
(``JsonValueToDebugString``); both shape what a client sees, so both are kept here.

Parsing (:func:`parse`) -- ``ParseStream<kParseIterativeFlag | kParseNanAndInfFlag |
kParseStopWhenDoneFlag>``:

* standard JSON plus the tokens ``NaN``, ``Infinity`` and ``-Infinity``;
* *stop when done*: what follows the first complete value is not read (``{"a": 1} x`` parses);
* *iterative*: nesting has no limit -- a 500,000-deep array under a key nobody reads parses
  (``json_tensor_test.cc``'s ``DeeplyNestedWellFormed``). Here the fast parsers (orjson, then the
  json module's C scanner) are tried first; a document nested beyond their limits (1,024 / ~1,000
  levels) goes to :func:`_parse_deep`, a parser with its own stack whose work is linear in the
  body (runs of ``[`` and ``]`` cost one step each) and whose memory is bounded: values nested
  deeper than :data:`BUILD_DEPTH` are checked but not built, and stand as a :class:`Deep`
  marker. No valid request tensor is that deep (its rank is at most ``MAX_RANK``), and a message
  rendering one is cut at 256 bytes long before the marker;
* integers in the 64-bit range (``[-2**63, 2**64 - 1]``) stay integers, larger ones become doubles
  (rapidjson's ``kNumberDoubleFlag``); a number beyond the double range is a parse error, ``Number
  too big to be stored in double.`` (a 5,000-digit integer included); decimals too small for a
  double are 0;
* bytes that are not UTF-8 are accepted (rapidjson's default ``UTF8<>`` does not validate) and come
  back as lone surrogates (``surrogateescape``); the codecs restore them as raw bytes;
* errors are ``JSON Parse error: <rapidjson's message> at offset: <byte offset>``.

Differences: ``Inf`` / ``-Inf`` / ``-NaN`` (which rapidjson also reads) are refused; the offset
of a number too big is that of its first occurrence in the text.

Rendering (:func:`debug_string`) -- ``PrettyWriter`` with ``kFormatSingleLineArray`` through
``JsonWriterWithLimit``: objects one member per line indented by 4 spaces, arrays on one line
(``[1, 2]``), doubles with the shortest digits (``Writer::Double``), and output cut once it
reaches 256 bytes (``kMaxJsonDebugStringBytes``, at a token boundary; the text is not closed). A
``NaN`` or infinite double stops the writer (rapidjson writes no non-finite number without
``kWriteNanAndInfFlag``), so the text ends before it. Iterative, so any depth renders.

Pure: the standard library only.
"""

from __future__ import annotations

import json
import json.decoder
import math
import re
from typing import Any

__all__ = [
    "BUILD_DEPTH",
    "Deep",
    "JsonParseError",
    "debug_string",
    "parse",
    "type_string",
    "write_double",
]

INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
#: Containers nested deeper than this are parsed but not built (see :class:`Deep`).
BUILD_DEPTH = 256
_DEBUG_LIMIT = 256  # kMaxJsonDebugStringBytes
_WS = " \t\n\r"


class JsonParseError(ValueError):
    """A body rapidjson would not parse; ``str()`` is TF Serving's message (without a code)."""


class Deep:
    """A container nested deeper than :data:`BUILD_DEPTH`, parsed but not built.

    ``kind`` is ``"array"`` or ``"object"``; ``depth`` the deepest nesting inside it (1 for
    ``[]``).
    """

    __slots__ = ("depth", "kind")

    def __init__(self, kind: str, depth: int) -> None:
        self.kind = kind
        self.depth = depth


class _NumberTooBig(Exception):
    def __init__(self, literal: str) -> None:
        super().__init__(literal)
        self.literal = literal


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def _double(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise _NumberTooBig(literal)
    return value


def _integer(literal: str) -> int | float:
    if len(literal) <= 20:  # int() of a longer literal could not be in the 64-bit range anyway
        value = int(literal)
        if INT64_MIN <= value <= UINT64_MAX:
            return value
    return _double(literal)  # float() has no digit limit, unlike int() (4,300 digits)


_DECODER = json.JSONDecoder(parse_float=_double, parse_int=_integer)

# json module messages -> rapidjson's GetParseError_En() text.
_PARSE_ERRORS = {
    "Expecting property name enclosed in double quotes": "Missing a name for object member.",
    "Expecting ':' delimiter": "Missing a colon after a name of object member.",
    "Unterminated string starting at": "Missing a closing quotation mark in string.",
    "Invalid \\escape": "Invalid escape character in string.",
    "Invalid \\uXXXX escape": "Incorrect hex digit after \\u escape in string.",
    "Invalid control character at": "Invalid encoding in string.",
}
_TOO_BIG = "Number too big to be stored in double."


def parse(body: bytes, fast: Any = None) -> Any:
    """Parse ``body`` (non-empty) as ``ParseJson`` does; ``fast`` is a first parser to try
    (``orjson.loads``: its accepting a body means rapidjson's would too, with the same values).

    Raises :class:`JsonParseError` with TF Serving's message.
    """
    if fast is not None:
        try:
            return fast(body)
        except ValueError:
            pass
    text = body.decode("utf-8", "surrogateescape")
    start = len(text) - len(text.lstrip(_WS))
    if start == len(text):
        raise _error("The document is empty.", text, len(text))
    try:
        return _DECODER.raw_decode(text, start)[0]  # what follows the value is not read
    except _NumberTooBig as exc:
        raise _error(_TOO_BIG, text, _number_position(text, exc.literal)) from None
    except RecursionError:
        return _parse_deep(text, start)
    except json.JSONDecodeError as exc:
        if exc.msg == "Expecting ',' delimiter":
            message = (
                "Missing a comma or '}' after an object member."
                if _innermost_container(text, exc.pos) == "{"
                else "Missing a comma or ']' after an array element."
            )
        else:
            message = _PARSE_ERRORS.get(exc.msg, "Invalid value.")
        raise _error(message, text, exc.pos) from None


def _error(message: str, text: str, position: int) -> JsonParseError:
    offset = len(text[:position].encode("utf-8", "surrogateescape"))
    return JsonParseError(f"JSON Parse error: {message} at offset: {offset}")


def _number_position(text: str, literal: str) -> int:
    match = re.search(r"(?<![0-9.eE+\-])" + re.escape(literal) + r"(?![0-9.eE+\-])", text)
    return match.start() if match else 0


def _innermost_container(text: str, pos: int) -> str:
    """The bracket (``{`` or ``[``) enclosing ``text[pos]``, skipping string contents."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text[:pos]:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            stack.append(ch)
        elif ch in "]}" and stack:
            stack.pop()
    return stack[-1] if stack else ""


# ---- the deep parser ---------------------------------------------------------------------------

_TOKEN = re.compile(
    r"[ \t\n\r]*(?:"
    r"(\[(?:[ \t\n\r]*\[)*)"  # 1: a run of array openings
    r"|(\{)"  # 2
    r"|([\]}](?:[ \t\n\r]*[\]}])*)"  # 3: a run of closings
    r"|(,)|(:)|(\")"  # 4, 5, 6
    r"|(-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?)"  # 7: a number (8: fraction, 9: exp)
    r"|(true|false|null|NaN|Infinity|-Infinity)"  # 10
    r"|(\S|$))"  # 11: anything else, or the end
)
_CONSTANTS = {
    "true": True,
    "false": False,
    "null": None,
    "NaN": math.nan,
    "Infinity": math.inf,
    "-Infinity": -math.inf,
}
_OPENER = str.maketrans("]}", "[{")
_NO_WS = str.maketrans("", "", _WS)
_ARRAY, _OBJECT = ord("["), ord("{")
# What the parser expects next (_ARRAY_COMMA only names the error of a bad token after an
# array element; in an object after a member it is _COMMA_OR_CLOSE's).
_VALUE, _VALUE_OR_CLOSE, _COMMA_OR_CLOSE, _KEY, _KEY_OR_CLOSE, _COLON, _ARRAY_COMMA = range(7)


def _parse_deep(text: str, start: int) -> Any:
    """The iterative parser (see the module doc); ``text[start]`` begins the value."""
    kinds = bytearray()  # b"[" or b"{" per open container, outermost first
    built: list[Any] = []  # the containers being built: those of kinds[:len(built)]
    keys: list[str] = []  # the pending member name of each built container
    skip_from = -1  # index in kinds of the outermost container not built, or -1
    deepest = 0  # while skipping: the deepest len(kinds) seen
    root: list[Any] = []
    expect = _VALUE
    pos = start

    def put(value: Any) -> None:
        """Store a finished value in the innermost built container (or as the root)."""
        if skip_from >= 0:
            return
        if not built:
            root.append(value)
        elif kinds[len(built) - 1] == _ARRAY:
            built[-1].append(value)
        else:
            built[-1][keys[-1]] = value

    def fail(position: int) -> JsonParseError:
        """rapidjson's error for an unexpected token at ``position``."""
        in_array = bool(kinds) and kinds[-1] == _ARRAY
        return _unexpected(_ARRAY_COMMA if expect == _COMMA_OR_CLOSE and in_array else expect,
                           text, position)

    while True:
        match = _TOKEN.match(text, pos)
        assert match is not None  # the last alternative matches anything
        pos = match.end()
        group = match.lastindex
        token = match.group(group) if group is not None else ""
        token_pos = pos - len(token)
        if group in (1, 2):  # openings: a run of "[", or one "{"
            if expect not in (_VALUE, _VALUE_OR_CLOSE):
                raise fail(token_pos)
            count = token.count("[") if group == 1 else 1
            opener = _ARRAY if group == 1 else _OBJECT
            while count and skip_from < 0:
                if len(kinds) >= BUILD_DEPTH:
                    skip_from = deepest = len(kinds)
                    break
                container: Any = [] if opener == _ARRAY else {}
                put(container)
                built.append(container)
                keys.append("")
                kinds.append(opener)
                count -= 1
            kinds.extend(bytes([opener]) * count)
            if skip_from >= 0:
                deepest = max(deepest, len(kinds))
            expect = _VALUE_OR_CLOSE if group == 1 else _KEY_OR_CLOSE
        elif group == 3:  # a run of closings
            closers = token.translate(_NO_WS)[: len(kinds)]  # nothing after the root is read
            first = closers[0]
            if not (
                expect == _COMMA_OR_CLOSE
                or (expect == _VALUE_OR_CLOSE and first == "]")
                or (expect == _KEY_OR_CLOSE and first == "}")
            ):
                raise fail(token_pos)
            count = len(closers)
            wanted = closers.translate(_OPENER)[::-1].encode()
            if kinds[len(kinds) - count :] != wanted:
                for index, closer in enumerate(closers):  # the first that closes the wrong kind
                    open_kind = kinds[len(kinds) - 1 - index]
                    if open_kind != ord(closer.translate(_OPENER)):
                        where = token_pos + _nth_bracket(token, index)
                        raise _unexpected(
                            _COMMA_OR_CLOSE if open_kind == _OBJECT else _ARRAY_COMMA, text, where
                        )
            new_depth = len(kinds) - count
            if 0 <= skip_from and new_depth <= skip_from:
                # The outermost container not built is complete: it stands as a marker in the
                # innermost one built (before the run closes that one too).
                kind = "array" if kinds[skip_from] == _ARRAY else "object"
                skip_from, depth = -1, deepest - skip_from
                put(Deep(kind, depth))
            del kinds[new_depth:]
            del built[new_depth:]
            del keys[new_depth:]
            if not kinds:
                return root[0]
            expect = _COMMA_OR_CLOSE
        elif group == 4:  # ,
            if expect != _COMMA_OR_CLOSE:
                raise fail(token_pos)
            expect = _VALUE if kinds[-1] == _ARRAY else _KEY
        elif group == 5:  # :
            if expect != _COLON:
                raise fail(token_pos)
            expect = _VALUE
        elif group == 6:  # a string
            if expect not in (_VALUE, _VALUE_OR_CLOSE, _KEY, _KEY_OR_CLOSE):
                raise fail(token_pos)
            try:
                # json's own string scanner (C, else Python); typeshed leaves it out of json.decoder.
                value, pos = json.decoder.scanstring(text, token_pos + 1, True)  # type: ignore[attr-defined]
            except json.JSONDecodeError as exc:
                raise _error(_PARSE_ERRORS.get(exc.msg, "Invalid value."), text, exc.pos) from None
            if expect in (_KEY, _KEY_OR_CLOSE):
                if skip_from < 0:
                    keys[-1] = value
                expect = _COLON
                continue
            put(value)
            if not kinds:
                return root[0]
            expect = _COMMA_OR_CLOSE
        elif group in (7, 10):  # a number or a constant
            if expect not in (_VALUE, _VALUE_OR_CLOSE):
                raise fail(token_pos)
            if group == 10:
                value = _CONSTANTS[token]
            else:
                try:
                    value = _double(token) if match.group(8) or match.group(9) else _integer(token)
                except _NumberTooBig:
                    raise _error(_TOO_BIG, text, token_pos) from None
            put(value)
            if not kinds:
                return root[0]
            expect = _COMMA_OR_CLOSE
        else:
            raise fail(token_pos)


def _nth_bracket(run: str, index: int) -> int:
    """The position in ``run`` of its ``index``-th bracket (runs may hold whitespace)."""
    seen = -1
    for position, char in enumerate(run):
        if char in "[]{}":
            seen += 1
            if seen == index:
                return position
    return 0


def _unexpected(expect: int, text: str, position: int) -> JsonParseError:
    """rapidjson's error for the token at ``position`` when ``expect`` was due."""
    if expect in (_KEY, _KEY_OR_CLOSE):
        message = "Missing a name for object member."
    elif expect == _COLON:
        message = "Missing a colon after a name of object member."
    elif expect == _COMMA_OR_CLOSE:
        message = "Missing a comma or '}' after an object member."
    elif expect == _ARRAY_COMMA:
        message = "Missing a comma or ']' after an array element."
    else:
        message = "Invalid value."
    return _error(message, text, position)


# --------------------------------------------------------------------------------------------
# Rendering values in messages
# --------------------------------------------------------------------------------------------


def type_string(value: Any) -> str:
    """``JsonTypeString``: rapidjson's type names (``Null``, ``True``, ``Number``, ...)."""
    if value is None:
        return "Null"
    if value is True:
        return "True"
    if value is False:
        return "False"
    kind = type(value)
    if kind is dict or (kind is Deep and value.kind == "object"):
        return "Object"
    if kind is list or kind is Deep:
        return "Array"
    if kind is str:
        return "String"
    return "Number"


class _Stop(Exception):
    """The writer refused a value (a non-finite double) or the output reached its limit."""


def debug_string(value: Any) -> str:
    """``JsonValueToDebugString``: ``value`` as TF Serving renders it in messages (module doc)."""
    out: list[str] = []
    size = 0
    # Work items (item, depth, prefix): a value, a member name (_Key) or a closing (_End); a
    # value's prefix (", ", ": ", a newline and indent) is written with it, as PrettyPrefix is.
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]

    def emit(text: str) -> None:
        nonlocal size
        if size >= _DEBUG_LIMIT:
            raise _Stop
        out.append(text)
        size += len(text.encode("utf-8", "surrogatepass"))

    try:
        while stack:
            item, depth, prefix = stack.pop()
            kind = type(item)
            if kind is _End:
                emit(item.text)
            elif kind is list:
                if not item:
                    emit(prefix + "[]")
                    continue
                emit(prefix + "[")
                stack.append((_End("]"), depth, ""))
                for index in range(len(item) - 1, -1, -1):
                    stack.append((item[index], depth + 1, ", " if index else ""))
            elif kind is dict:
                if not item:
                    emit(prefix + "{}")
                    continue
                emit(prefix + "{")
                stack.append((_End("\n" + "    " * depth + "}"), depth, ""))
                members = list(item.items())
                indent = "\n" + "    " * (depth + 1)
                for index in range(len(members) - 1, -1, -1):
                    key, member = members[index]
                    stack.append((member, depth + 1, ": "))
                    stack.append((_Key(key), depth + 1, ("," if index else "") + indent))
            elif kind is _Key:
                emit(prefix + _string(item.text))
            elif kind is float and not math.isfinite(item):
                # PrettyWriter writes the prefix, then WriteDouble refuses the value: stop there.
                emit(prefix)
                raise _Stop
            else:
                emit(prefix + _scalar(item))
    except _Stop:
        pass
    return "".join(out)


class _End:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _Key:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is float:
        return write_double(value)
    if kind is str:
        return _string(value)
    if kind is Deep:
        return "[" if value.kind == "array" else "{"
    return str(value)


_ESCAPES = {i: f"\\u{i:04X}" for i in range(0x20)}
_ESCAPES.update({0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r"})
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\"})


def _string(text: str) -> str:
    """rapidjson ``Writer::String``: quotes, backslash and control characters escaped."""
    return '"' + text.translate(_ESCAPES) + '"'


def write_double(value: float) -> str:
    """rapidjson ``Writer::Double`` of a finite double: shortest digits laid out by
    ``internal::Prettify`` (``1e21``, ``0.001``, ``1.0``, ``-2.5e-10``)."""
    if value == 0.0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    mantissa, _, exponent = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    k = (int(exponent) if exponent else 0) - len(fraction)
    stripped = digits.rstrip("0")
    k += len(digits) - len(stripped)
    digits = stripped
    length, kk = len(digits), len(digits) + k
    if k >= 0 and kk <= 21:
        text = digits + "0" * k + ".0"
    elif 0 < kk <= 21:
        text = digits[:kk] + "." + digits[kk:]
    elif -6 < kk <= 0:
        text = "0." + "0" * -kk + digits
    elif length == 1:
        text = f"{digits}e{kk - 1}"
    else:
        text = f"{digits[0]}.{digits[1:]}e{kk - 1}"
    return sign + text
