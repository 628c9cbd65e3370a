"""What a person runs, never a rule: new-config, refresh, the demo's data and the tiny test model. The top
of the import order: may import any stage.
"""
