"""The download stage (rules/download.smk: plan_parts, download_part): sources cut into parts, each part
fetched into the raw cache and processed into samples. `fetch/` is the HTTP/S3 client, `process/` what the
part's forked resize process runs. Imports the base (core, storage, formats), no other stage.
"""
