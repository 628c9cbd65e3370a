"""Files that more than one stage reads, one owner each: tars, processed parts, parquet tables, the index
files, shard names, the DALI and Energon indexes, build.json. Imports core only.
"""
