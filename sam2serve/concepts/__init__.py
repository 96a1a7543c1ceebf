"""Concept segmentation (SAM 3): noun phrases and exemplar boxes -> every instance."""
