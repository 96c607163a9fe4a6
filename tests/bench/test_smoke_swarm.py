"""The swarm benches' ``--smoke`` runs: SmolLM2 served by `pnode start` servers on loopback.

In a file apart from tests/bench/test_smoke.py so that the two halves run
side by side (``--dist loadfile``); tests/bench/smokekit.py says what a run
must show.
"""

from __future__ import annotations

import pytest

from tests.bench.smokekit import LIMIT_S, SWARM, check_smoke


@pytest.mark.timeout(LIMIT_S + 60)
@pytest.mark.parametrize("name", sorted(SWARM))
def test_smoke(name):
    check_smoke(name)
