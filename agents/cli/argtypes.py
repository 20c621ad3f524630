"""argparse types that refuse out-of-range numbers by option name (argparse then exits 2 with the message)."""

from __future__ import annotations

import argparse
import math
from typing import Callable

__all__ = ["bounded_float", "bounded_int"]


def bounded_float(option: str, low: float, high: float, unit: str = "") -> Callable[[str], float]:
    """Return an argparse type reading a finite float in ``low..high`` (both included).

    >>> bounded_float("--timeout", 0.001, 600, "seconds")("5")
    5.0
    """
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is outside {low:g}..{high:g}{' ' + unit if unit else ''}")
        return value
    parse.__name__ = option  # argparse names the option in its message anyway
    return parse


def bounded_int(option: str, low: int, high: int) -> Callable[[str], int]:
    """Return an argparse type reading an integer in ``low..high`` (both included).

    >>> bounded_int("--ports", 1, 4096)("32")
    32
    """
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}")
        return value
    parse.__name__ = option
    return parse
