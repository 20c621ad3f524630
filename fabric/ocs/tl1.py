"""The TL1 dialect (Polatis style) spoken by the driver and the emulator: format and parse, no I/O.

Commands (input messages) are ``VERB:TID:AID:CTAG:GB:PARAMS;``; the ones used here::

    ACT-USER::<user>:<ctag>::<password>;      log in
    CANC-USER::<user>:<ctag>:;                log out
    ENT-PATCH::<ins>,<outs>:<ctag>:;          connect pairwise: ENT-PATCH::1&2,17&18:7:; is 1->17, 2->18
    DLT-PATCH::<ports>:<ctag>:;               remove the cross-connects on ports (either side)
    RTRV-PATCH:::<ctag>:;                     list cross-connects, one data line "<in>,<out>" each
    RTRV-PORT-STATUS::<ports|ALL>:<ctag>:;    data lines "<port>:<state>[,<alarm>]"
    RTRV-ALM-ALL:::<ctag>:;                   data lines "<port>:<severity>,<alarm>" for alarmed ports
    RTRV-EQPT::SYSTEM:<ctag>:;                data line "SYSTEM:SIZE=<N>x<N>,PROFILE=<name>,DELAY_MS=<ms>"
    OPR-PORT-SHUTTER::<ports>:<ctag>:;        force-block ports (close the shutter)
    RLS-PORT-SHUTTER::<ports>:<ctag>:;        release force-blocked ports

Responses are blocks ending with a line ``;``::

       <sid> <yy-mm-dd> <hh:mm:ss>
    M  <ctag> COMPLD                          or  M  <ctag> DENY
       "<data line>"                              SAAL          (the error code)
       /* comment */                              "<aid>"       (the ports the refusal is about)
    ;                                             /* text */
                                                  ;

Autonomous messages (``A  <atag> REPT ALM``, ``*C ...``) carry no ctag of a command. Quoted text
may hold any character: ``"`` and ``\\`` are backslash-escaped and control characters are written
``\\xHH``, so a ``;`` inside quotes (or comments) never ends a block (:class:`Tl1Splitter`).
"""

from __future__ import annotations

import codecs
import dataclasses
import re
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import Iterable, Mapping

from orchestrl.fabric.ocs.errors import OcsProtocolError

__all__ = [
    "Command", "Response", "Autonomous", "Acknowledgement", "Tl1Splitter", "quote", "unquote", "split_fields",
    "format_command", "parse_command", "format_response", "format_acknowledgement", "parse_response", "parse_ports", "format_ports",
    "parse_pair_lists", "split_pair_lists", "format_pair_lists", "format_patch_line", "parse_patch_line", "format_keywords",
    "parse_keywords", "COMPLETION_CODES",
]

COMPLETION_CODES = ("COMPLD", "DENY", "PRTL", "DELAY", "RTRV")
_SAFE = re.compile(r"[A-Za-z0-9_.\-&,=/+@#%!?~^$\[\]]*")  # field text that needs no quoting (no "/*")
# the SID may hold spaces ("Polatis OXC", set with SET-SID:::123::Polatis OXC;), quoted or not
_HEADER = re.compile(r"^(.+?)\s+(\d{2,4}-\d{2}-\d{2})\s+(\d{2}:\d{2}:\d{2})$")
# a GR-831 acknowledgement: "IP <ctag>" (in progress: the response follows), PF, OK, NA, NG, RL; it ends with "<"
_ACK = re.compile(r"^(IP|PF|OK|NA|NG|RL)\s+(\S+)\s*<?$")
_ERRCDE = re.compile(r"ERRCDE=([A-Za-z]{4})")
_RESPONSE = re.compile(r"^M\s+(\S+)\s+(" + "|".join(COMPLETION_CODES) + r")$")
_AUTONOMOUS = re.compile(r"^(\*C|\*\*|\*|A)\s+(\S+)\s+(.+)$")
_PLAIN = re.compile(r'[^"\\\x00-\x1f\x7f]*')  # text that quote() leaves as it is (every patch line)
# The head of a reply exactly as format_response writes it (no DENY): parse_response reads such a reply
# whose data lines are plain quoted text (no comment, nothing escaped) with one match and one split.
_CANONICAL_HEAD = re.compile(r'\r\n\r\n   (\S+) (\d{2,4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2})\r\nM  (\S+) '
                             r'(COMPLD|PRTL|DELAY|RTRV)(?=\r\n)')
_DATA_SEP = '"\r\n   "'  # between two quoted data lines
# the data lines of the last few such replies by their text: a recurring step's DLT-PATCH gets the same
# reply, whose lines are then neither split nor hashed again (the driver keeps their statuses by them)
_DATA_LINES: dict[str, tuple[str, ...]] = {}


def quote(text: str) -> str:
    """Return ``text`` as a TL1 quoted string (escapes ``"``, ``\\`` and control characters).

    Examples
    --------
    >>> quote('a;b"c')
    '"a;b\\\\"c"'
    >>> unquote(quote('a;b"c'))
    'a;b"c'
    """
    if _PLAIN.fullmatch(text):  # nothing to escape: skip the walk over every character
        return '"' + text + '"'
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def unquote(text: str) -> str:
    """Return the value of a quoted string (unquoted text is returned unchanged)."""
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        return text
    body, out, i = text[1:-1], [], 0
    if "\\" not in body:  # nothing escaped (every patch line): the body is the value
        return body
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", body[i + 2:i + 4]):
                out.append(chr(int(body[i + 2:i + 4], 16)))
                i += 4
                continue
            out.append(nxt)
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def split_fields(text: str, sep: str) -> list[str]:
    """Split ``text`` on ``sep`` outside quoted strings (quotes are kept in the fields)."""
    if '"' not in text:  # no quoted string (every ENT-PATCH and DLT-PATCH): a plain split is exact
        return text.split(sep)
    fields, cur, in_quote, escaped = [], [], False, False
    for ch in text:
        if in_quote:
            cur.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_quote = False
        elif ch == '"':
            in_quote = True
            cur.append(ch)
        elif ch == sep:
            fields.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    fields.append("".join(cur))
    return fields


class Tl1Splitter:
    """Incremental splitter of a TL1 byte stream into messages, each ending at an unquoted ``;``.

    ``;`` inside quoted strings and ``/* */`` comments does not end a message. Works for both
    directions (commands and responses) and for any chunking of the stream.

    Examples
    --------
    >>> s = Tl1Splitter()
    >>> s.feed(b'RTRV-PATCH:::1:;ACT-USER::a:2::"p;w')
    ['RTRV-PATCH:::1:;']
    >>> s.feed(b'";')
    ['ACT-USER::a:2::"p;w";']
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf: list[str] = []
        self._in_quote = self._escaped = self._in_comment = False
        self._prev = ""

    def feed(self, data: bytes) -> list[str]:
        text = self._decoder.decode(data)
        if self._in_comment or self._escaped or self._prev == "/" or "\\" in text or "/" in text or "<" in text:
            return self._feed_chars(text)
        # No escape and no comment can start or end in this chunk: only quotes and ';' matter, so
        # jump from one ';' to the next, counting the quotes in between instead of visiting each.
        out, start, pos = [], 0, 0
        while (end := text.find(";", pos)) >= 0:
            if text.count('"', pos, end) % 2:
                self._in_quote = not self._in_quote
            pos = end + 1
            if not self._in_quote:
                self._buf.append(text[start:pos])
                out.append("".join(self._buf))
                self._buf, start = [], pos
        if text.count('"', pos) % 2:
            self._in_quote = not self._in_quote
        self._buf.append(text[start:])
        self._prev = text[-1:] or self._prev
        return out

    def _feed_chars(self, text: str) -> list[str]:
        out = []
        for ch in text:
            self._buf.append(ch)
            prev, self._prev = self._prev, ch
            if self._in_quote:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_quote = False
            elif self._in_comment:
                if prev == "*" and ch == "/":
                    self._in_comment = False
                    self._prev = ""  # "*/*" must not reopen a comment
            elif ch == '"':
                self._in_quote = True
            elif prev == "/" and ch == "*":
                self._in_comment = True
                self._prev = ""  # "/*/" must not close it
            elif ch == ";" or ch == "<":  # "<" ends a GR-831 acknowledgement ("IP 7\r\n<")
                out.append("".join(self._buf))
                self._buf = []
        return out

    @property
    def pending(self) -> str:
        """Text received since the last complete message."""
        return "".join(self._buf)


@dataclass(frozen=True)
class Command:
    """One TL1 input message. Fields hold raw TL1 text (quote parameters with :func:`quote`)."""

    verb: str
    aid: str = ""
    ctag: str = ""
    tid: str = ""
    params: tuple[str, ...] = ()  # the fields after CTAG: general block first, then parameter blocks

    def __post_init__(self) -> None:
        if self.params == ("",):  # "VERB::AID:CTAG:;" has an empty GB and nothing else
            object.__setattr__(self, "params", ())


def format_command(cmd: Command) -> str:
    """Return the TL1 text of ``cmd``, ending with ``;``.

    Examples
    --------
    >>> format_command(Command("ENT-PATCH", "1&2,17&18", "7"))
    'ENT-PATCH::1&2,17&18:7:;'
    >>> format_command(Command("ACT-USER", "admin", "1", params=("", quote("se;cret"))))
    'ACT-USER::admin:1::"se;cret";'
    """
    for name in ("verb", "tid", "aid", "ctag"):
        value = getattr(cmd, name)
        if not _SAFE.fullmatch(value) or (name == "verb" and not value):
            raise OcsProtocolError("", cmd.verb, f"TL1 {name} {value!r} holds characters TL1 cannot carry there; "
                                                 "use letters, digits and - . & , = /")
    return ":".join([cmd.verb, cmd.tid, cmd.aid, cmd.ctag, *(cmd.params or ("",))]) + ";"


def parse_command(text: str) -> Command:
    """Return the :class:`Command` in ``text`` (trailing ``;`` and surrounding blanks optional)."""
    body = text.strip()
    if body.endswith(";"):
        body = body[:-1]
    fields = split_fields(body.strip(), ":")
    if len(fields) < 4 or not fields[0]:
        raise OcsProtocolError("", fields[0] if fields else "", f"TL1 command {text.strip()!r} has fewer than the "
                                                                "4 fields VERB:TID:AID:CTAG")
    verb, tid, aid, ctag = (f.strip() for f in fields[:4])
    return Command(verb.upper(), aid, ctag, tid, tuple(fields[4:]))


@dataclass(frozen=True)
class Response:
    """One TL1 response to the command with tag ``ctag``."""

    ctag: str
    status: str  # COMPLD | DENY | PRTL | DELAY | RTRV
    data: tuple[str, ...] = ()  # unquoted data lines; for DENY, the AIDs the refusal is about
    code: str = ""  # the four-letter error code of a DENY
    comment: str = ""  # the /* ... */ text
    sid: str = "OCS"  # source identifier (the device name)
    date: str = "70-01-01"
    time: str = "00:00:00"

    @property
    def ok(self) -> bool:
        return self.status == "COMPLD"


@dataclass(frozen=True)
class Acknowledgement:
    """A GR-831 acknowledgement of the command with tag ``ctag`` (``IP``: in progress, its response follows)."""

    code: str
    ctag: str


@dataclass(frozen=True)
class Autonomous:
    """An autonomous message (alarm or event report): not an answer to any command."""

    atag: str
    alarm: str  # *C critical, ** major, * minor, A non-alarm
    verb: str  # e.g. "REPT ALM"
    data: tuple[str, ...] = ()
    sid: str = "OCS"


def _stamp() -> tuple[str, str]:
    now = time.gmtime()
    return time.strftime("%y-%m-%d", now), time.strftime("%H:%M:%S", now)


def _comment_text(text: str) -> str:
    return " ".join(text.replace("*/", "* /").split())


def format_acknowledgement(ctag: str, code: str = "IP") -> str:
    """Return a GR-831 acknowledgement (``IP <ctag>``: in progress, the response follows), ending with ``<``.

    Examples
    --------
    >>> format_acknowledgement("7")
    '\\r\\n\\nIP 7\\r\\n<'
    """
    return f"\r\n\n{code} {ctag}\r\n<"


def format_response(resp: Response | Autonomous, *, errcde: bool = False) -> str:
    """Return the TL1 text of a response or autonomous message, ending with the ``;`` line.

    ``errcde``: write a ``DENY``'s code in the ``"<aid>:ERRCDE=<code>"`` data line (the first data
    line's ports as aid) instead of on a line of its own.

    Examples
    --------
    >>> print(format_response(Response("7", "DENY", ("3",), "SAAL", "port 3 in use", "sw1", "24-01-02", "03:04:05")))
    <BLANKLINE>
    <BLANKLINE>
       sw1 24-01-02 03:04:05
    M  7 DENY
       SAAL
       "3"
       /* port 3 in use */
    ;
    """
    date, clock = (resp.date, resp.time) if isinstance(resp, Response) else _stamp()
    lines = ["", "", f"   {resp.sid} {date} {clock}"]
    if isinstance(resp, Response):
        lines.append(f"M  {resp.ctag} {resp.status}")
        if resp.status == "DENY" and errcde:
            aid = resp.data[0] if resp.data else ""
            resp = dataclasses.replace(resp, data=(f"{aid}:ERRCDE={resp.code or 'SNVS'}", *resp.data[1:]))
        elif resp.status == "DENY":
            lines.append(f"   {resp.code or 'SNVS'}")
    else:
        lines.append(f"{resp.alarm}{' ' if len(resp.alarm) > 1 else '  '}{resp.atag} {resp.verb}")
    if _PLAIN.fullmatch("".join(resp.data)):  # nothing to escape in any line (every patch line): one check
        lines.extend(['   "' + d + '"' for d in resp.data])
    else:
        lines.extend(f"   {quote(d)}" for d in resp.data)
    if isinstance(resp, Response) and resp.comment:
        lines.append(f"   /* {_comment_text(resp.comment)} */")
    lines.append(";")
    return "\r\n".join(lines)


def parse_response(text: str, device: str = "") -> Response | Autonomous | Acknowledgement:
    """Return the response or autonomous message in one block of TL1 text.

    Raises
    ------
    OcsProtocolError
        If the block has no header line or no ``M <ctag> <status>`` / autonomous line.
    """
    head = _CANONICAL_HEAD.match(text)
    if head is not None:  # as format_response writes it: the fast path, with the result of the walk below
        rest = text[head.end():]
        if rest == "\r\n;":
            return Response(head[4], head[5], (), "", "", head[1], head[2], head[3])
        if len(rest) >= 10 and rest.startswith('\r\n   "') and rest.endswith('"\r\n;'):
            body = rest[6:-4]  # '"<line>"\r\n   "<line>"' without its outer quotes
            data = _DATA_LINES.get(body)
            if data is None and _PLAIN.fullmatch(body.replace(_DATA_SEP, "")):  # no line holds anything escaped
                data = tuple(body.split(_DATA_SEP))
                if len(_DATA_LINES) >= 64:
                    _DATA_LINES.clear()
                _DATA_LINES[body] = data
            if data is not None:
                return Response(head[4], head[5], data, "", "", head[1], head[2], head[3])
    lines = [s for ln in text.replace("\r", "\n").split("\n") if (s := ln.strip()) and s not in (";", "<", ">")]
    ack = _ACK.match(lines[0]) if len(lines) == 1 else None
    if ack:
        return Acknowledgement(ack.group(1), ack.group(2))
    if lines and lines[-1].endswith(";") and not lines[-1].startswith('"'):
        lines[-1] = lines[-1][:-1].rstrip()
    header = _HEADER.match(lines[0]) if lines else None
    if not header or len(lines) < 2:
        raise OcsProtocolError(device, "", f"reply {text.strip()[:120]!r} is not a TL1 response: expected a header "
                                           "line '<sid> <date> <time>' and an 'M <ctag> <status>' line")
    sid, date, clock = header.groups()
    sid = unquote(sid.strip())
    data: list[str] = []
    comments: list[str] = []
    code = ""
    head = _RESPONSE.match(lines[1])
    auto = None if head else _AUTONOMOUS.match(lines[1])
    if not head and not auto:
        raise OcsProtocolError(device, "", f"reply line {lines[1]!r} is neither 'M <ctag> <status>' nor an "
                                           "autonomous message")
    rest = lines[2:]
    if head and head.group(2) != "DENY" and "/*" not in text and "\\" not in text:
        # the usual reply, data lines only and nothing escaped: a quoted value is what its quotes enclose
        for line in rest:
            if line[0] == '"':
                line = line.rstrip(",")
                if len(line) > 1 and line[-1] == '"':
                    line = line[1:-1]
            data.append(line)
        return Response(head.group(1), head.group(2), tuple(data), "", "", sid, date, clock)
    i = 0
    while i < len(rest):
        line = rest[i]
        if line.startswith("/*"):
            chunk = [line]
            while not chunk[-1].endswith("*/") and i + 1 < len(rest):
                i += 1
                chunk.append(rest[i])
            comments.append(" ".join(chunk)[2:].removesuffix("*/").strip())
        elif line.startswith('"'):
            value = unquote(line.rstrip(","))
            errcde = _ERRCDE.search(value) if head and head.group(2) == "DENY" else None
            if errcde and not code:  # the "<aid>:ERRCDE=<code>" form of a DENY: the code, and the aid it names
                code = errcde.group(1).upper()
                value = value.partition(":")[0]
            data.append(value)
        elif head and head.group(2) == "DENY" and not code:
            code = line
        else:
            data.append(line)
        i += 1
    if auto:
        return Autonomous(auto.group(2), auto.group(1), auto.group(3), tuple(data), sid)
    return Response(head.group(1), head.group(2), tuple(data), code, " ".join(comments), sid, date, clock)


# -- parameter helpers --------------------------------------------------------------------------
def format_ports(ports: Iterable[int]) -> str:
    """Return ports as a TL1 ``&`` list: ``[1, 2]`` -> ``'1&2'``."""
    return "&".join(map(str, map(int, ports)))


def parse_ports(text: str, device: str = "", command: str = "") -> list[int]:
    """Return the ports of a TL1 ``&`` list, also accepting ranges ``1&&4`` (ports 1 to 4).

    Examples
    --------
    >>> parse_ports("1&3&&5")
    [1, 3, 4, 5]
    """
    if "&&" not in text:
        # the common case, a list of single ports, converted in one pass; empty items or junk fall
        # through to the loop below, which skips the one and names the other
        with suppress(ValueError):
            return list(map(int, text.split("&"))) if text.strip() else []
    out: list[int] = []
    for part in text.replace("&&", "~").split("&"):
        try:
            if "~" in part:
                lo, hi = (int(x) for x in part.split("~"))
                out.extend(range(lo, hi + 1))
            elif part.strip():
                out.append(int(part))
        except ValueError:
            raise OcsProtocolError(device, command, f"port list {text!r} is not numbers joined by '&'") from None
    return out


def format_pair_lists(pairs: Iterable[tuple[int, int]]) -> str:
    """Return the ENT-PATCH AID ``<ins>,<outs>`` for ``(ingress, egress)`` pairs."""
    pairs = list(pairs)
    ins, outs = zip(*pairs) if pairs else ((), ())
    return format_ports(ins) + "," + format_ports(outs)


def split_pair_lists(aid: str, device: str = "", command: str = "ENT-PATCH") -> tuple[list[int], list[int]]:
    """Return the ingress and egress port lists of an ENT-PATCH AID ``<ins>,<outs>``."""
    parts = aid.split(",")
    if len(parts) != 2:
        raise OcsProtocolError(device, command, f"AID {aid!r} is not '<ingress ports>,<egress ports>'")
    return parse_ports(parts[0], device, command), parse_ports(parts[1], device, command)


def parse_pair_lists(aid: str, device: str = "", command: str = "ENT-PATCH") -> list[tuple[int, int]]:
    """Return the ``(ingress, egress)`` pairs of an ENT-PATCH AID.

    Examples
    --------
    >>> parse_pair_lists("1&2,17&18")
    [(1, 17), (2, 18)]
    """
    ins, outs = split_pair_lists(aid, device, command)
    if len(ins) != len(outs) or not ins:
        raise OcsProtocolError(device, command, f"AID {aid!r} has {len(ins)} ingress and {len(outs)} egress ports; "
                                                "give equally long, non-empty lists")
    return list(zip(ins, outs))


def format_patch_line(ingress: int, egress: int) -> str:
    return f"{ingress},{egress}"


def parse_patch_line(line: str, device: str = "") -> tuple[int, int]:
    """Return ``(ingress, egress)`` from an RTRV-PATCH data line ``"<in>,<out>"``."""
    try:
        a, b = line.split(",")[:2]
        return int(a), int(b)
    except ValueError:
        raise OcsProtocolError(device, "RTRV-PATCH", f"data line {line!r} is not '<in>,<out>'") from None


def format_keywords(values: Mapping[str, object]) -> str:
    """Return ``KEY=VALUE,...`` with values quoted where needed."""
    parts = []
    for key, value in values.items():
        text = str(value)
        parts.append(f"{key}={text if _SAFE.fullmatch(text) and ',' not in text else quote(text)}")
    return ",".join(parts)


def parse_keywords(text: str) -> dict[str, str]:
    """Return ``{KEY: value}`` from ``KEY=VALUE,...`` (keys upper-cased, values unquoted).

    Examples
    --------
    >>> parse_keywords('FAIL=3&7,ALARM="fibre cut, rack 2"')
    {'FAIL': '3&7', 'ALARM': 'fibre cut, rack 2'}
    """
    out = {}
    for part in split_fields(text, ","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        out[key.strip().upper()] = unquote(value.strip()) if sep else ""
    return out
