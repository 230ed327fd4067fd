"""Runs the Python package's tests with pytest (CTest's test_python).

Exits 77, which CTest reads as "skipped", when pytest, NumPy or PyTorch cannot
be imported: then there is nothing these tests could check. Any other problem,
the package failing to import included, is a failure.
"""
import sys

missing = []
for name in ("pytest", "numpy", "torch"):
    try:
        __import__(name)
    except ImportError as e:
        missing.append(f"{name} ({e})")
if missing:
    print("skipped: cannot import " + ", ".join(missing), file=sys.stderr)
    sys.exit(77)

import pytest

sys.exit(pytest.main(["-p", "no:cacheprovider"] + sys.argv[1:]))
