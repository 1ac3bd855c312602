"""gradwire.distributions: probability distributions with differentiable log-densities.

Example:
    >>> from gradwire.distributions import Categorical
    >>> m = Categorical(probs=policy_net(state))
    >>> action = m.sample()
    >>> loss = -m.log_prob(action) * reward
"""

from __future__ import annotations

from .categorical import Categorical
from .distribution import Distribution

__all__ = ["Distribution", "Categorical"]
