"""Frozen backbones (`backbones`) and their features: computed once and cached (`cache`), image transforms
(`transforms`), decoded training images (`decoded`) and the t-SNE embeddings kept with a record (`embeddings`).
"""
