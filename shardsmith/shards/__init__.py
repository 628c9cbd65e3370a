"""The shards stage (rules/shards.smk): planning with the dataset-wide exclusions (records already published,
near-duplicates), writing each shard, and validating it with the loaders' own readers. Imports the base only.
"""
