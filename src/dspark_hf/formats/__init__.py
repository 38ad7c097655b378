"""Checkpoint layouts: one module per published layout, and the loader that serves them all.

Each layout module knows its own config.json (how to recognise it, how to read it
into a `DSparkConfig`, how to write one) and its tensor names. `loader` does the rest
once for every layout: Hub and cache resolution, validation against the target, the
shared embedding and LM head, and the errors.
"""
