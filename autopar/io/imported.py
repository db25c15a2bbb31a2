"""What every importer of another framework's configuration returns (:class:`Imported`), and
the helpers the importers share (:func:`read_source`, :func:`refusal`).

An :class:`Imported` holds the :class:`~autopar.config.ParallelConfig` fields, the
:class:`~autopar.config.TrainingConfig` fields they set, and notes on what was approximated or
ignored. Nothing is executed; unknown flags and keys are listed in ``notes``, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import InvalidParallelConfig
from ..frameworks.layersplit import MegatronLayerSplit
from ..frameworks.rules import first_n_modes


@dataclass(frozen=True)
class Imported:
    """A configuration read from another framework.

    Attributes:
        parallel: keyword arguments for :class:`~autopar.config.ParallelConfig` (only those set).
        train: keyword arguments for :class:`~autopar.config.TrainingConfig` (only those set).
        model: a preset name the source names, when it names one (torchtitan ``model.name`` and
            ``model.flavor``), else None.
        num_layers: the layer count the source states (to cross-check the model), else None.
        notes: what was approximated or ignored, one sentence each.
        local_batch_size: torchtitan's per-rank batch when no global batch is given (the global
            batch is then ``local_batch_size * dp``, resolved in :meth:`complete`).
        costs: framework-profile cost fields the source sets (e.g. Megatron-LM's
            ``--overlap-grad-reduce`` -> ``overlap_dp_grad_reduce=True``), for
            :meth:`autopar.frameworks.FrameworkProfile.with_costs` of the source's framework.
        cost_sources: the flag that set each of ``costs`` (the source with_costs records).
        layer_split: Megatron-LM's flags that split the layers over pipeline chunks (checked
            and applied in :meth:`complete`); None for a torchtitan TOML.
        model_fields: :class:`~autopar.models.ModelConfig` fields the source sets (Megatron-LM's
            router flags), applied to the model's config by the caller.
        recompute_first_n: Megatron-LM's ``--recompute-method block --recompute-num-layers
            N``: full recompute of the first N blocks of every pipeline chunk and none of the
            others, written per block in :meth:`complete` (where the chunks are known; with an
            unknown layer count, full recompute of every block); None otherwise.
        model_shape: model-shape values the source states (ModelConfig field -> value), checked
            against the model estimated (:meth:`shape_mismatch`).
    """

    parallel: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    model: str | None = None
    num_layers: int | None = None
    notes: tuple[str, ...] = ()
    local_batch_size: int | None = None
    costs: dict = field(default_factory=dict)
    cost_sources: dict = field(default_factory=dict)
    layer_split: MegatronLayerSplit | None = None
    model_fields: dict = field(default_factory=dict)
    recompute_first_n: int | None = None
    model_shape: dict = field(default_factory=dict)

    def shape_mismatch(self, model_config) -> str | None:
        """Why the source's model-shape flags (``model_shape``: ModelConfig field -> value, e.g.
        Megatron-LM's ``--hidden-size``; and ``num_layers``) do not describe ``model_config`` (a ModelConfig), as
        an error message with the fix; None when they agree or there is nothing to compare."""
        if model_config is None:
            return None
        # --num-layers too, so that one message names every field another model's flags set
        stated = {"num_layers": self.num_layers, **self.model_shape} if self.num_layers \
            else self.model_shape
        off = {k: (v, getattr(model_config, k, None)) for k, v in stated.items()
               if getattr(model_config, k, None) not in (None, v)}
        if not off:
            return None
        said = ", ".join(f"{k} {v} (the model: {m})" for k, (v, m) in off.items())
        return (f"the imported arguments describe another model: {said}. Fix: choose the model "
                "they were written for (--model), or drop those flags.")

    def complete(self, world_size: int, num_blocks: int,
                 overrides: dict | None = None) -> tuple[dict, dict]:
        """(parallel, train) keyword dicts with the fields that depend on the cluster's GPU count
        and the model's block count filled in.

        Args:
            world_size: GPUs of the cluster.
            num_blocks: the model's decoder blocks (0 when unknown: ``--num-layers`` is used).
            overrides: :class:`~autopar.config.ParallelConfig` fields that replace the imported
                ones (e.g. the CLI's ``--pp``); Megatron-LM's layer split is applied with them.

        Raises:
            InvalidParallelConfig: Megatron-LM would refuse to split the layers over the
                pipeline (:meth:`MegatronLayerSplit.chunks`), or the degrees do not divide the
                GPUs.
        """
        par, train = {**self.parallel, **(overrides or {})}, dict(self.train)
        pp = par.get("pp", 1)
        if num_blocks and self.num_layers and num_blocks != self.num_layers:
            # the split was checked for --num-layers; the model would be cut by its own count
            raise InvalidParallelConfig(
                f"--num-layers {self.num_layers} does not match the model's {num_blocks} decoder "
                "layers, which autopar estimates and splits over the pipeline. Fix: drop "
                f"--num-layers (or give {num_blocks}), or choose a model with "
                f"{self.num_layers} layers.")
        layers = num_blocks or self.num_layers
        if self.layer_split is not None and layers:
            given_v = (overrides or {}).get("virtual_stages")
            # a pp proposed as a fix must fill this cluster with the given tp and cp
            mp = par.get("tp", 1) * par.get("cp", 1)
            split = replace(self.layer_split,
                            pp_divides=world_size // mp if world_size % mp == 0 else None)
            chunks = split.chunks(layers, pp, given_v)
            if self.layer_split.sets_virtual_stages or given_v:
                par["virtual_stages"] = len(chunks) // pp
            # uneven chunks are what Megatron builds; even ones are autopar's default cut
            if len(set(chunks)) > 1:
                par["stage_blocks"] = chunks
            else:
                par.pop("stage_blocks", None)
            if self.recompute_first_n is not None and "recompute" not in (overrides or {}):
                # transformer_block.py _checkpointed_forward ('block'): per chunk, layers
                # 0..N-1 checkpointed, the rest run without recompute
                modes = first_n_modes(chunks, self.recompute_first_n)
                par["recompute"] = modes if len(set(modes)) > 1 else modes[0]
        if self.local_batch_size is not None and "global_batch_size" not in train:
            mp = par.get("tp", 1) * pp * par.get("cp", 1)
            dp = par.get("dp") or max(1, world_size // mp)
            train["global_batch_size"] = self.local_batch_size * dp
        return par, train


def read_source(source, what: str) -> str:
    """The text of ``source``: itself when it looks like file contents, else the file it names.

    Raises:
        InvalidParallelConfig: the file cannot be read.
    """
    text = str(source)
    if "\n" in text or ": " in text or text.lstrip().startswith("{"):
        return text
    try:
        return Path(source).read_text()
    except OSError as exc:
        raise InvalidParallelConfig(f"cannot read {what} {source}: {exc.strerror or exc}. Fix: "
                                    "pass the path of an existing file (or its text).") from exc


def refusal(rule: str, fix: str) -> InvalidParallelConfig:
    """The error for a framework's ``rule`` that a configuration breaks, with its ``fix``."""
    return InvalidParallelConfig(f"{rule}. Fix: {fix}.")
