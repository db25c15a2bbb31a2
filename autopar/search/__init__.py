"""The search: enumerate meshes and choices, stage cuts, per-block recomputation."""
