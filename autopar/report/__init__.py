"""What a person reads: the plan summary, rich tables, explanations, advice to fit, plots.

Presentation only: units are converted here (GB = 1e9 bytes), nothing is estimated or searched
that the API does not already offer. Submodules are imported on use (``plots`` needs matplotlib).
"""
