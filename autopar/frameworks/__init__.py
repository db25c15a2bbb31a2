"""Training frameworks as data: what each can run (:class:`FrameworkProfile`), read by the search
(only runnable plans) and by the exporters (what is really written), and how each lays out memory
(:class:`MemoryConventions`, read by the cost model). Imports only :mod:`autopar.config` and
:mod:`autopar.errors`, so every stage may use it."""

from .edits import edits_text, profile_edits, with_edits
from .memory import MemoryConventions
from .profiles import CHUNK_RULES, CUT_RULES, FrameworkProfile
from .stacks import (BAND_FRAMEWORK, PROFILES, band_framework, get_profile, shard_within,
                     with_compiled_loss, with_host_rate, with_inplace_loss, with_pure_bf16)
from .seqrule import SeqLenRule

__all__ = ["BAND_FRAMEWORK", "CHUNK_RULES", "CUT_RULES", "PROFILES", "band_framework",
           "FrameworkProfile", "MemoryConventions", "SeqLenRule", "edits_text", "get_profile",
           "profile_edits", "shard_within", "with_compiled_loss", "with_edits",
           "with_host_rate", "with_inplace_loss", "with_pure_bf16"]
