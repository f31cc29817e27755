"""Runs the Python example of sdk/python/README.md unmodified, so it cannot rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Tuple

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(airlock_env: Tuple[str, str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README.md has no python example"
    env = dict(os.environ, AIRLOCK_URL=airlock_env[0], AIRLOCK_API_KEY=airlock_env[1])
    p = subprocess.run([sys.executable, "-c", blocks[0]], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"README example failed:\n{p.stdout}\n{p.stderr}"
    lines = p.stdout.splitlines()
    assert lines[0].startswith("3 hello from ") and lines[0].endswith(" oops"), p.stdout
    assert "written by the SDK" in lines[1] and "notes.txt" in lines[2]
    assert lines[3] == "suspended" and lines[4] == "written by the SDK", p.stdout
