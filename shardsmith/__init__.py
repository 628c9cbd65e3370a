"""shardsmith: image-caption data to validated, indexed WebDataset shards for OpenCLIP-style training.

The package is arranged by stage, as the rule files are (docs/architecture.md has the annotated tree):
`core`, `storage` and `formats` at the bottom; the stages `download`, `shards`, `embed`, `publish` and
`report` above them, never importing one another; `cli` (what a person runs) on top.
"""

from pathlib import Path

__version__ = "0.1.0"
# Where site owners read what the crawler does (named in the default User-Agent).
PROJECT_URL = "https://github.com/shardsmith/shardsmith"
# The checkout around the package (Snakefile, rules/, scripts/), for what runs the workflow itself.
REPO = Path(__file__).resolve().parents[1]
# config/config.schema.yaml, reached through a link inside the package, so an installed package has it too.
SCHEMA_PATH = Path(__file__).resolve().parent / "config.schema.yaml"
