"""The publish stage (rules/publish.smk): a validated version to a mounted path or S3, the completion
marker, then latest; what a version holds and the settings. Imports the base only.
"""
