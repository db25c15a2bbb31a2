"""What is written and read: the plan file schema and importers of other frameworks' configs
(Megatron-LM arguments, torchtitan TOML)."""
