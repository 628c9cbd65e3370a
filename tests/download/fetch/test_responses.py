"""The checks every response goes through (shardsmith.download.fetch.responses): image sniffing, Retry-After values,
hash checks."""

import time
from email.utils import formatdate

import pytest
from generated import jpeg_bytes

from shardsmith.download.fetch.responses import (
    AttemptError,
    check_hash,
    describe_non_image,
    parse_retry_after,
    sniff_image,
)


def test_sniff_image_knows_images_by_their_bytes():
    assert sniff_image(jpeg_bytes()) == "jpeg"
    assert sniff_image(b"\x89PNG\r\n\x1a\n....") == "png"
    assert sniff_image(b"GIF89a...") == "gif"
    assert sniff_image(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "webp"
    assert sniff_image(b"\x00\x00\x00\x1cftypavif\x00") == "avif"
    for not_image in (b"<!DOCTYPE html><html>", b'{"error": 1}', b"", b"Access denied", b"<svg xmlns="):
        assert sniff_image(not_image) is None


def test_retry_after_values():
    assert parse_retry_after("7") == 7.0
    assert 3500 < parse_retry_after(formatdate(time.time() + 3600, usegmt=True)) <= 3600
    assert parse_retry_after(formatdate(time.time() - 60, usegmt=True)) == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_check_hash():
    check_hash(b"abc", "900150983CD24FB0D6963F7D28E17F72", "md5")  # case does not matter
    check_hash(b"abc", "", "md5")  # no hash, no check
    with pytest.raises(AttemptError) as e:
        check_hash(b"abd", "900150983cd24fb0d6963f7d28e17f72", "md5")
    assert e.value.reason == "hash_mismatch"


def test_sniff_image_reads_the_bytearray_the_fetcher_hands_it():
    """Bodies arrive as bytearrays (no copy into bytes): AVIF and HEIF must be known from one as from bytes."""
    assert sniff_image(bytearray(b"\x00\x00\x00\x1cftypavif\x00")) == "avif"
    assert sniff_image(bytearray(b"\x00\x00\x00\x18ftypheic\x00")) == "heif"
    assert sniff_image(bytearray(jpeg_bytes())) == "jpeg"
    assert sniff_image(bytearray(b"RIFF\x00\x00\x00\x00WEBPVP8 ")) == "webp"


def test_the_detail_of_a_non_image_quotes_its_first_bytes_as_bytes():
    detail = describe_non_image(bytearray(b"<!DOCTYPE html><html>gone</html>"), "image/jpeg")
    assert detail == "body is an HTML page (Content-Type image/jpeg; starts with b'<!DOCTYPE html><html>gon')"
