"""Work on several devices at once: concurrency, results by device, errors after every device finished."""

import threading

import pytest

from fabric.ocs.fanout import each_device


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
