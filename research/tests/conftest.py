"""The research tests import the core and the research scripts from the repository root."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "tests"):   # the core; the core tests' helpers (tests/conftest.py)
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
