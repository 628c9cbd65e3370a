"""Sample keys: dot-free, bounded, unique, stable."""

import hashlib

import pytest

from shardsmith.core.keys import MAX_KEY_BYTES, is_valid_key, make_key, sanitize


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("photo.2023.jpg", "photo_2023_jpg"),
        ("dir/sub/file", "dir_sub_file"),
        ("two  words", "two_words"),
        ("café crème", "caf_cr_me"),
        ("keep-this_one", "keep-this_one"),
        ("...", "_"),
    ],
)
def test_sanitize_replaces_dots_slashes_spaces_and_non_ascii_by_underscore(text, expected):
    assert sanitize(text) == expected


def test_make_key_joins_sanitized_parts_with_dash_and_is_dot_free():
    key = make_key("src", "a.b/c d", "photo 1")
    assert key == "src-a_b_c_d-photo_1"
    assert "." not in key and is_valid_key(key)
    assert make_key("src", "a.b/c d", "photo 1") == key  # stable


def test_names_beyond_ascii_keep_distinct_keys_with_a_hash_of_the_name():
    cats = [make_key("cjk", name) for name in ("猫", "狗", "鳥", "éa", "àa", "sub/猫")]
    assert len(set(cats)) == 6 and all(is_valid_key(k) for k in cats)
    assert cats[3].startswith("cjk-a_") and cats[5].startswith("cjk-sub_")
    assert make_key("cjk", "猫") == cats[0]  # stable
    assert make_key("src", "ü.1") == f"src-1_{hashlib.sha1('ü.1'.encode()).hexdigest()[:8]}"


def test_long_key_is_cut_to_the_byte_cap_with_a_hash_suffix():
    key = make_key("src", "x" * 300)
    assert len(key.encode()) <= MAX_KEY_BYTES
    assert is_valid_key(key)
    assert key.startswith("src-xxxx")
    suffix = key.rsplit("-", 1)[1]
    assert len(suffix) == 12 and all(c in "0123456789abcdef" for c in suffix)


def test_long_non_ascii_key_fits_the_byte_cap():
    key = make_key("src", "日本語の長いキャプション" * 30)
    assert len(key.encode()) <= MAX_KEY_BYTES and is_valid_key(key)


def test_long_keys_differing_only_at_the_end_stay_distinct():
    a = make_key("src", "y" * 200 + "a")
    b = make_key("src", "y" * 200 + "b")
    assert a != b
    assert a[:-13] == b[:-13]  # same visible prefix, told apart by the hash


def test_key_at_the_cap_is_kept_unchanged():
    text = "z" * (MAX_KEY_BYTES - 4)
    assert make_key("src", text) == f"src-{text}"


@pytest.mark.parametrize("key", ["src-abc_1", "A-Z_0-9", "x" * MAX_KEY_BYTES])
def test_is_valid_key_accepts_safe_keys_within_the_cap(key):
    assert is_valid_key(key)


@pytest.mark.parametrize("key", ["", "a.b", "a/b", "a b", "é", "x" * (MAX_KEY_BYTES + 1)])
def test_is_valid_key_refuses_empty_dotted_unsafe_or_long_keys(key):
    assert not is_valid_key(key)
