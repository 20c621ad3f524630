"""The TL1 dialect: commands and responses survive format -> parse, and any chunking of the stream."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrl.fabric.ocs.errors import OcsProtocolError
from orchestrl.fabric.ocs.tl1 import (
    Autonomous, Command, Response, Tl1Splitter, format_command, format_keywords, format_pair_lists, format_response,
    parse_command, parse_keywords, parse_pair_lists, parse_ports, parse_response, quote, unquote,
)

safe = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.&", max_size=12)
verb = st.from_regex(r"[A-Z]{1,8}(-[A-Z]{1,8}){0,2}", fullmatch=True)
ctag = st.from_regex(r"[A-Za-z0-9]{1,6}", fullmatch=True)
any_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)
param = st.one_of(safe, any_text.map(quote))
# Comment words: no blanks (the format collapses runs of blanks), no "*/" (it would end the comment).
word = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp", "Zs")), min_size=1, max_size=8).filter(
    lambda t: "*/" not in t and not t.startswith("*") and not t.endswith("/") and t.strip() == t)


@given(any_text)
def test_quote_round_trips_any_text(text):
    quoted = quote(text)
    assert "\n" not in quoted and "\r" not in quoted
    assert unquote(quoted) == text


@given(verb, safe, ctag, safe, st.lists(param, max_size=4))
def test_commands_round_trip(verb_, aid, ctag_, tid, params):
    cmd = Command(verb_, aid, ctag_, tid, tuple(params))
    assert parse_command(format_command(cmd)) == cmd


@st.composite
def responses(draw):
    status = draw(st.sampled_from(["COMPLD", "DENY"]))
    return Response(
        ctag=draw(ctag), status=status, data=tuple(draw(st.lists(any_text, max_size=4))),
        code=draw(st.sampled_from(["SAAL", "SNVS", "PLNA", "IIAC"])) if status == "DENY" else "",
        comment=" ".join(draw(st.lists(word, max_size=3))),
        sid=draw(st.from_regex(r"[A-Za-z0-9/_-]{1,12}", fullmatch=True)),
        date="24-05-01", time="12:34:56",
    )


@settings(max_examples=200)
@given(responses())
def test_responses_round_trip(resp):
    assert parse_response(format_response(resp)) == resp


@settings(max_examples=100)
@given(st.lists(responses(), min_size=1, max_size=4), st.data())
def test_splitter_finds_every_block_whatever_the_chunking(resps, data):
    stream = "".join(format_response(r) for r in resps).encode("utf-8")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    splitter, blocks = Tl1Splitter(), []
    for lo, hi in zip([0, *cuts], [*cuts, len(stream)]):
        blocks.extend(splitter.feed(stream[lo:hi]))
    assert [parse_response(b) for b in blocks] == resps
    assert splitter.pending == ""


@settings(max_examples=300)
@given(st.text(alphabet='ab";\\/* \r\né', max_size=40), st.data())
def test_the_splitter_fast_path_reads_any_stream_as_the_character_scan_does(text, data):
    stream = text.encode("utf-8")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=5)))
    fast, slow = Tl1Splitter(), Tl1Splitter()
    got, want = [], []
    for lo, hi in zip([0, *cuts], [*cuts, len(stream)]):
        got += fast.feed(stream[lo:hi])
        want += slow._feed_chars(slow._decoder.decode(stream[lo:hi]))  # one character at a time
    assert got == want and fast.pending == slow.pending


def test_semicolons_in_quotes_and_comments_do_not_end_a_block():
    resp = Response("9", "COMPLD", ('3:failed,fibre cut; see "rack 2";',), comment="a; b", sid="sw1")
    blocks = Tl1Splitter().feed(format_response(resp).encode())
    assert len(blocks) == 1 and parse_response(blocks[0]) == resp
    cmd = Command("ACT-USER", "admin", "1", params=("", quote("pa;ss:wo\"rd")))
    assert Tl1Splitter().feed(format_command(cmd).encode()) == [format_command(cmd)]
    assert unquote(parse_command(format_command(cmd)).params[1]) == 'pa;ss:wo"rd'


def test_the_commands_of_the_dialect_read_as_documented():
    assert format_command(Command("ENT-PATCH", format_pair_lists([(1, 17), (2, 18)]), "7")) == "ENT-PATCH::1&2,17&18:7:;"
    assert parse_pair_lists(parse_command("ENT-PATCH::1&2,17&18:7:;").aid) == [(1, 17), (2, 18)]
    assert format_command(Command("RTRV-PATCH", ctag="3")) == "RTRV-PATCH:::3:;"
    assert format_command(Command("ACT-USER", "admin", "1", params=("", "secret"))) == "ACT-USER::admin:1::secret;"
    assert parse_command("  dlt-patch::1&&3&20:4:;\r\n") == Command("DLT-PATCH", "1&&3&20", "4")
    assert parse_ports("1&&3&20") == [1, 2, 3, 20]


def test_a_deny_block_gives_its_code_ports_and_text():
    text = '\r\n\n   OCS 24-05-01 12:00:00\r\nM  8 DENY\r\n   SAAL\r\n   "1"\r\n   /* port 1 in use */\r\n;'
    resp = parse_response(text)
    assert (resp.status, resp.code, resp.data, resp.comment, resp.ok) == ("DENY", "SAAL", ("1",), "port 1 in use", False)


def test_autonomous_messages_are_told_apart_from_responses():
    msg = parse_response(format_response(Autonomous("12", "**", "REPT ALM OCS", ("3:MJ,LOS",), "sw1")))
    assert isinstance(msg, Autonomous) and (msg.atag, msg.alarm, msg.data) == ("12", "**", ("3:MJ,LOS",))


@pytest.mark.parametrize("text", ["hello;", "   OCS 24-05-01 12:00:00\r\nX what\r\n;", ""])
def test_garbage_is_a_protocol_error(text):
    with pytest.raises(OcsProtocolError, match="not a TL1 response|neither"):
        parse_response(text)


def test_bad_lists_are_refused_with_the_expected_shape():
    with pytest.raises(OcsProtocolError, match="equally long"):
        parse_pair_lists("1&2,17")
    with pytest.raises(OcsProtocolError, match="joined by '&'"):
        parse_ports("1&x")
    with pytest.raises(OcsProtocolError, match="cannot carry"):
        format_command(Command("ENT-PATCH", "1;2", "1"))


def test_keywords_round_trip_with_quoting():
    values = {"FAIL": "3&7", "ALARM": "fibre cut, rack 2; urgent", "DROP": "0.5"}
    assert parse_keywords(format_keywords(values)) == values


def test_replies_real_switches_send_parse_sids_with_spaces_in_progress_acks_and_errcde_denials():
    """Issue 29: valid TL1 the parser refused (SID with a space, GR-831 'IP' acks, DENY 'aid:ERRCDE=')."""
    from orchestrl.fabric.ocs.tl1 import Acknowledgement, Tl1Splitter, parse_response

    stream = ('IP 7\r\n<'
              '\r\n\r\n   "Polatis OXC" 24-05-01 12:00:00\r\nM  7 COMPLD\r\n   "1,17"\r\n;'
              '\r\n\r\n   Polatis OXC 24-05-01 12:00:01\r\nM  8 DENY\r\n   "3:ERRCDE=SAAL"\r\n   /* in use */\r\n;')
    blocks = Tl1Splitter().feed(stream.encode())
    msgs = [parse_response(b) for b in blocks if b.strip(" \r\n\t;<>")]
    assert msgs[0] == Acknowledgement("IP", "7")
    assert msgs[1].sid == "Polatis OXC" and msgs[1].ok and msgs[1].data == ("1,17",)
    assert msgs[2].sid == "Polatis OXC" and msgs[2].code == "SAAL" and msgs[2].data == ("3",)
    assert msgs[2].comment == "in use"
