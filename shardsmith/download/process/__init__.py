"""What download_part's forked resize process runs: decode, check, shrink and re-encode (resize), the
perceptual hash (phash), the caption (captions), and the part's samples written as they come (child).
"""
