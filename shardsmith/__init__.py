"""shardsmith: image-caption data to validated, indexed WebDataset shards for OpenCLIP-style training."""

__version__ = "0.1.0"
# Where site owners read what the crawler does (named in the default User-Agent).
PROJECT_URL = "https://github.com/shardsmith/shardsmith"
