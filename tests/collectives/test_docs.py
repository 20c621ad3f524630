"""The trainer/generator example in docs/collectives.md runs as written and checks what it received."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the collectives runtime needs torch (the comms extra)")

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- runnable: tests/collectives/test_docs.py -->"


def test_the_documented_example_runs_and_every_engine_gets_the_right_bits(tmp_path):
    text = (ROOT / "docs" / "collectives.md").read_text()
    assert MARK in text, "the runnable example lost its marker"
    block = re.search(r"```python\n(.*?)```", text.split(MARK, 1)[1], re.S)
    assert block, "no python block follows the marker"
    script = tmp_path / "example.py"
    script.write_text(block.group(1))
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "GLOO_SOCKET_IFNAME": "lo"}
    try:  # under pytest's 300 s, so a hang shows the ranks' output, not a pytest stack
        out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=270)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the example ran past 270 s:\n{e.stdout}\n{e.stderr}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.splitlines()[-1] == "ok"
    assert len(re.findall(r"step \d: 19 parameters verified=True", out.stdout)) == 2, out.stdout
