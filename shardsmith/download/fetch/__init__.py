"""The client download_part fetches with: settings and retry policy, the scheduling loop, the checks on a
response, the network guard and the opt-outs (robots.txt, TDM).
"""
