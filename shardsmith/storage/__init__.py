"""Where bytes live: S3 through the AWS CLI, local and mounted files, and the published versions on a
destination (read by planning and by publishing alike). Imports core only.
"""
