"""What extraction needs of an ``nn.Module``, in the words errors use (one place, so every
error that refuses a model says the same thing and offers the same ways out)."""

from __future__ import annotations

#: What autopar plans: the contract of :func:`autopar.graph.extract`.
LM_NEEDS = ("autopar plans decoder-only language models: forward(input_ids) taking token ids "
            "[batch, seq] (int64) and returning logits [batch, seq, vocab], with a token "
            "embedding (nn.Embedding) and the repeated decoder blocks in one nn.ModuleList of a "
            "single class")

#: Ways to give autopar such a model.
LM_FIX = ("Fix: pass a preset name (`autopar models` lists them) or a model dict, or a module "
          "from autopar.models.build(name, ...), or a Hugging Face causal LM (e.g. "
          "transformers.AutoModelForCausalLM.from_config(config) built under "
          "torch.device('meta'))")
