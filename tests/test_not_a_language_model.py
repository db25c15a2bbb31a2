"""A module that is not a decoder language model gets our error, saying what autopar needs and
what to pass instead, with no torch traceback printed before it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autopar
from autopar.errors import UntraceableModelError

TRAIN = autopar.TrainingConfig(global_batch_size=8, seq_len=64)


class _MLPStack(nn.Module):
    """Repeated blocks in a ModuleList, float inputs: not a language model."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


class _ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Conv2d(3, 3, 3, padding=1) for _ in range(3))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


class _EmbedThenWrongWidth(nn.Module):
    """Has a token embedding, but its blocks expect another width: fails inside torch.export."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(256, 16)
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(2))

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return x


MODELS = {
    "sequential": lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)),
    "mlp-stack": _MLPStack,
    "conv": _ConvNet,
    "encoder": lambda: nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2),
    "embed-wrong-width": _EmbedThenWrongWidth,
}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("call", ["optimize", "estimate"])
def test_not_a_language_model_says_what_autopar_needs_without_tracebacks(name, call, capfd):
    model = MODELS[name]()
    with pytest.raises(UntraceableModelError) as info:
        if call == "optimize":
            autopar.optimize(model, "1x8xA100-80GB", TRAIN)
        else:
            autopar.estimate(model, "1x8xA100-80GB", TRAIN, autopar.ParallelConfig(dp=8))
    out, err = capfd.readouterr()
    # torch.export used to log three full tracebacks (torch/_subclasses/fake_tensor.py) first
    assert "Traceback" not in out + err and "fake_tensor" not in out + err
    msg = str(info.value)
    assert "decoder-only language models" in msg and "token ids [batch, seq]" in msg
    assert "autopar.models.build" in msg and "AutoModelForCausalLM" in msg
    # the old fix (data-dependent Python / ModuleList) does not apply to these models
    assert "data-dependent" not in msg


def test_torch_loggers_are_restored_after_a_failed_capture():
    import logging
    before = logging.getLogger("torch._subclasses.fake_tensor").level
    with pytest.raises(UntraceableModelError):
        autopar.optimize(_EmbedThenWrongWidth(), "1x8xA100-80GB", TRAIN)
    assert logging.getLogger("torch._subclasses.fake_tensor").level == before
