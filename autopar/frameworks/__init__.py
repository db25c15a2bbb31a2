"""Training frameworks as data: what each can run (:class:`FrameworkProfile`), read by the search
(only runnable plans) and by the exporters (what is really written). Imports only
:mod:`autopar.config` and :mod:`autopar.errors`, so every stage may use it."""

from .profiles import CHUNK_RULES, CUT_RULES, PROFILES, FrameworkProfile, get_profile
from .seqrule import SeqLenRule

__all__ = ["CHUNK_RULES", "CUT_RULES", "PROFILES", "FrameworkProfile", "SeqLenRule",
           "get_profile"]
