"""The research tests import the core and research/ from the repository root."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))   # the core tests' helpers (conftest's from_script and the like)
