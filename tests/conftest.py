import sys
from pathlib import Path

# Test helper modules (engine_helpers, scipy_free_stats) live beside the tests.
sys.path.insert(0, str(Path(__file__).parent))
