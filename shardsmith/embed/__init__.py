"""The embed stage (rules/embed.smk): CLIP embeddings and scores per part on GPU nodes (CPU works too),
the model, the decoding, and the per-shard stats. Imports the base only.
"""
