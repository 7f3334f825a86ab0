import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

# Test helper modules (engine_helpers) live beside the tests.
sys.path.insert(0, str(Path(__file__).parent))

# Hypothesis profiles. "ci" is derandomised (the same examples on every run, no example database), so a
# CI failure reproduces exactly and a green CI is not luck; it is chosen when the CI environment variable
# is set (.ci/run passes --hypothesis-profile=ci too). "dev" (the default) explores new examples each run.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI", "").lower() not in ("", "0", "false") else "dev")
