"""Analysis of a run: the waterfall model (model.py), advice (advice.py), compare (compare.py)."""
