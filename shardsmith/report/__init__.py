"""The report stage (rules/report.smk): the numbers, plots, near-duplicate pages and dataset card, and the
end-of-run summary the Snakefile prints. Imports the base only.
"""
