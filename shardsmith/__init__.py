"""shardsmith: image-caption data to validated, indexed WebDataset shards for OpenCLIP-style training."""

__version__ = "0.1.0"
