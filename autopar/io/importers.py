"""Read a hand-tuned configuration written for another framework: Megatron-LM arguments or a
torchtitan job TOML, into autopar's terms.

The names live one module a framework and are handed on here, where callers have always found
them: :class:`Imported` and the helpers every importer shares (:mod:`autopar.io.imported`),
:func:`from_megatron_args` (:mod:`autopar.io.megatron_importer`), :func:`from_torchtitan_toml`
and :func:`from_torchtitan_doc` (:mod:`autopar.io.torchtitan_importer`). The other frameworks'
importers: :mod:`autopar.io.titan_config` (torchtitan >= 0.3), :mod:`autopar.io.plugin_importers`
(Accelerate), :mod:`autopar.io.colossalai_importer`, :mod:`autopar.io.megatron_bridge_importer`.
"""

from __future__ import annotations

from .imported import Imported
from .megatron_importer import from_megatron_args
from .torchtitan_importer import from_torchtitan_doc, from_torchtitan_toml

__all__ = ["Imported", "from_megatron_args", "from_torchtitan_doc", "from_torchtitan_toml"]
