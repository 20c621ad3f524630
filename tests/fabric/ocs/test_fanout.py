"""Work on several devices at once: concurrency, results by device, errors after every device finished."""

import threading

import pytest

from orchestrl.fabric.ocs.fanout import SendCollect, each_device


def test_jobs_of_different_devices_run_at_the_same_time():
    both = threading.Barrier(2, timeout=10)  # passes only if the two jobs are in flight together

    def job(name: str) -> str:
        both.wait()
        return name.upper()

    assert each_device({"b": lambda: job("b"), "a": lambda: job("a")}) == {"a": "A", "b": "B"}


def test_an_error_is_raised_only_after_every_device_finished():
    finished = []

    def slow_ok() -> None:
        threading.Event().wait(0.05)
        finished.append("ok")

    def broken() -> None:
        raise KeyError("no client")

    with pytest.raises(KeyError, match="no client"):
        each_device({"a": broken, "b": slow_ok})
    assert finished == ["ok"]  # no command is left running behind the caller's back


def test_a_single_device_runs_inline():
    assert each_device({"only": threading.current_thread}) == {"only": threading.current_thread()}


def test_send_collect_jobs_write_to_every_device_before_reading_any_reply_in_one_thread():
    events: list[tuple[str, str, object]] = []

    def job(name: str) -> SendCollect:
        def send() -> str:
            events.append(("send", name, threading.current_thread()))
            return f"pending {name}"

        def collect(pending: str) -> str:
            events.append(("collect", name, threading.current_thread()))
            return pending.upper()
        return SendCollect(send, collect)

    assert each_device({"b": job("b"), "a": job("a")}) == {"a": "PENDING A", "b": "PENDING B"}
    assert [(what, name) for what, name, _ in events] == [("send", "a"), ("send", "b"), ("collect", "a"),
                                                           ("collect", "b")]
    assert {thread for _, _, thread in events} == {threading.current_thread()}  # no thread hand-off


def test_a_failed_send_or_collect_still_collects_every_other_device_then_raises_the_first():
    collected: list[str] = []

    def broken_send() -> None:
        raise KeyError("no session")

    def broken_collect(_: object) -> None:
        raise ValueError("reply lost")

    def slow_callable() -> str:
        threading.Event().wait(0.05)
        collected.append("d")
        return "d"

    jobs = {"a": SendCollect(broken_send, collected.append), "b": SendCollect(lambda: "b", collected.append),
            "c": SendCollect(lambda: "c", broken_collect), "d": slow_callable}  # a client without the split API
    with pytest.raises(KeyError, match="no session"):  # the first in device order, once all are done
        each_device(jobs)
    assert sorted(collected) == ["b", "d"]  # a's collect is skipped (nothing was sent), every other one ran
