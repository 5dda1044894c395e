"""``hicache``: the engine alone (SGLang with HiCache), no session control.

Every session is admitted at arrival, both queues stay first-come first-served,
nothing is pinned. The host tier itself is a property of the deployment.
"""

from __future__ import annotations

from basin.policy.base import Policy


class HiCachePolicy(Policy):
    name = "hicache"
