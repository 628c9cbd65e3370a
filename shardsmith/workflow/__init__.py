"""What rules/common.smk reads, so that it holds input functions only: the settings the rules take from the
config, and what the input functions look up once per process. Imports the base only; the stages' own
arithmetic (the plan's layout, shard batches) stays in their folders.
"""
