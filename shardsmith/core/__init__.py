"""The base every other folder stands on: errors, the ledger's columns and stage names, keys, the config
checks, job logs, malloc settings, atomic writes and hashes, and the cleanup of what killed jobs left.

Imports nothing else of shardsmith. Kept empty of re-exports: each rule's environment imports only what
its script names.
"""
