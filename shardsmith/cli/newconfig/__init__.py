"""Write a complete, commented config for the inputs a user points at: `shardsmith new-config PATH...`.

Each PATH becomes one source: a folder of images with sidecar .txt/.json captions, tar shards (a brace
pattern or a .tar), or a manifest (parquet, csv, tsv, jsonl, optionally .gz; local, http(s):// or s3://).
Only the start of each input is read (at most `--max-read-mb`; a parquet through its footer and first
pages). Every guess (a header row or none, the URL and caption columns, the caption members) is stated on
stderr with its evidence. Where two columns could be the URL or the caption, or none can, nothing is
guessed: the command exits with status 2, naming the choices and the flag that picks one. LAION's and
DataComp's metadata columns (punsafe, pwatermark, NSFW, similarity, a language column, aesthetic, sizes,
clip_b32/l14_similarity_score) become suggested filters, written commented out with where each cut-off
comes from, and DataComp's basic filter becomes commented captions and resize settings; a column (or json
key) of face boxes (face_bboxes) becomes the source's blur_boxes, written on. Defaults come from
config/config.schema.yaml, read at run time, and the written config is validated against it.
"""
