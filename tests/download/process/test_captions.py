"""Caption stage: field fallback, normalization, and rejection of records without a caption."""

import json
import unicodedata

import pytest

from shardsmith.core.errors import ConfigError, Rejection
from shardsmith.download.process.captions import (
    STAGE,
    CaptionSettings,
    check_caption,
    get_field,
    normalize_caption,
    pick_caption,
)

DEFAULT = CaptionSettings()


def rejection_for(fields, settings=DEFAULT) -> Rejection:
    with pytest.raises(Rejection) as info:
        pick_caption(fields, settings)
    return info.value


# --- ordered fallback ---------------------------------------------------------------------


def test_first_declared_field_wins_when_several_are_present():
    caption, path = pick_caption({"txt": "from txt", "caption": "from caption"}, DEFAULT)
    assert (caption, path) == ("from txt", "txt")


def test_json_description_is_used_when_txt_missing():
    record = {"json": {"description": "a red bicycle"}}
    assert pick_caption(record, DEFAULT) == ("a red bicycle", "json.description")


def test_json_description_is_read_from_raw_json_text():
    record = {"json": json.dumps({"id": 7, "description": "a red bicycle"})}
    assert pick_caption(record, DEFAULT) == ("a red bicycle", "json.description")


def test_json_description_is_read_from_raw_json_bytes_of_a_tar_member():
    record = {"json": json.dumps({"description": "à la plage"}).encode("utf-8")}
    assert pick_caption(record, DEFAULT) == ("à la plage", "json.description")


def test_json_caption_is_preferred_over_json_description():
    record = {"json": {"description": "second", "caption": "first"}}
    assert pick_caption(record, DEFAULT) == ("first", "json.caption")


def test_empty_and_whitespace_fields_fall_through_to_the_next():
    record = {"txt": "", "caption": "  \n\t ", "json": {"caption": None}, "alt": "alt text"}
    assert pick_caption(record, DEFAULT) == ("alt text", "alt")


@pytest.mark.parametrize("invisible", ["\u200d", "\u200c\u200d", "\u0301", "\ufe0f", "\u2800", "\u3164 \u115f"])
def test_a_caption_with_no_visible_character_falls_through_and_is_named_in_the_detail(invisible):
    """A joiner, a lone mark or a blank look-alike survives normalization but is no caption a reader can see."""
    assert pick_caption({"txt": invisible, "alt": "alt text"}, DEFAULT) == ("alt text", "alt")
    with pytest.raises(Rejection, match=r"txt \(no visible character after normalization") as e:
        pick_caption({"txt": invisible}, DEFAULT)
    assert e.value.reason == "no_caption"
    assert (
        pick_caption({"txt": "\u3164 a cat \U0001f408\u200d\u2b1b"}, DEFAULT)[0]
        == "\u3164 a cat \U0001f408\u200d\u2b1b"
    )


def test_a_subdivision_flag_keeps_its_tag_sequence_and_stray_tags_are_dropped():
    """England's flag is a black flag and tag characters: dropping the tags left a plain black flag."""
    england = "\U0001f3f4\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f"
    assert normalize_caption(f"go {england} team") == f"go {england} team"
    assert normalize_caption("a\U000e0067\U000e007f cat") == "a cat"
    assert normalize_caption("x" * 20 + england, max_chars=24) == "x" * 20  # never cut inside the sequence


def test_nan_manifest_cell_falls_through_to_the_next_field():
    record = {"txt": float("nan"), "caption": None, "alt": "the alt"}
    assert pick_caption(record, DEFAULT) == ("the alt", "alt")


def test_declared_order_is_respected_not_the_default_one():
    settings = CaptionSettings(fields=("alt", "txt"))
    assert pick_caption({"txt": "t", "alt": "a"}, settings) == ("a", "alt")


def test_fields_given_as_a_list_are_stored_as_a_tuple():
    assert CaptionSettings(fields=["alt", "txt"]).fields == ("alt", "txt")


def test_returned_path_is_the_declared_field_path():
    settings = CaptionSettings(fields=("meta.text.en",))
    record = {"meta": {"text": {"en": "hello"}}}
    assert pick_caption(record, settings) == ("hello", "meta.text.en")


# --- get_field ------------------------------------------------------------------------------


def test_top_level_key_with_dots_wins_over_the_nested_walk():
    record = {"json.description": "from the column", "json": {"description": "nested"}}
    assert get_field(record, "json.description") == "from the column"
    assert pick_caption(record, DEFAULT) == ("from the column", "json.description")


def test_nan_column_with_dotted_name_lets_the_nested_value_through():
    record = {"json.description": float("nan"), "json": {"description": "nested"}}
    assert get_field(record, "json.description") == "nested"


def test_dotted_key_inside_a_nested_dict_is_found():
    assert get_field({"json": {"alt.text": "x"}}, "json.alt.text") == "x"


def test_get_field_returns_none_when_absent():
    assert get_field({}, "txt") is None
    assert get_field({"json": {"other": 1}}, "json.description") is None
    assert get_field({"json": "not json at all"}, "json.description") is None
    assert get_field({"json": "{broken"}, "json.description") is None
    assert get_field({"json": 3}, "json.description") is None


def test_get_field_does_not_parse_a_final_string_value():
    assert get_field({"txt": '{"a": 1}'}, "txt") == '{"a": 1}'


def test_get_field_indexes_lists_with_digit_segments():
    assert get_field({"json": {"captions": ["one", "two"]}}, "json.captions.1") == "two"
    assert get_field({"json": {"captions": ["one"]}}, "json.captions.5") is None


# --- normalization ------------------------------------------------------------------------------


def test_mojibake_is_fixed():
    assert normalize_caption("cafÃ©") == "café"


def test_mojibake_quotes_become_curly_quotes_not_straight_ones():
    assert normalize_caption("â€œquotedâ€\x9d") == "\u201cquoted\u201d"


def test_html_entities_are_unescaped():
    assert normalize_caption("Tom &amp; Jerry") == "Tom & Jerry"
    assert normalize_caption("&quot;x&quot;") == '"x"'
    assert normalize_caption("caf&#233; &#x2014; ok") == "café — ok"


def test_html_tags_are_kept_as_text():
    assert normalize_caption("<b>bold</b> &amp; more") == "<b>bold</b> & more"


def test_entities_without_semicolon_are_left_alone():
    assert normalize_caption("Tom &notes AT&T") == "Tom &notes AT&T"


def test_double_escaped_entity_is_unescaped_only_once():
    assert normalize_caption("R&amp;amp;D") == "R&amp;D"


def test_decomposed_text_is_nfc_composed():
    decomposed = "cafe\u0301"
    result = normalize_caption(decomposed)
    assert result == "caf\u00e9"
    assert unicodedata.is_normalized("NFC", result)


def test_zero_width_char_between_letter_and_accent_does_not_block_composition():
    assert normalize_caption("cafe\u200b\u0301") == "caf\u00e9"


def test_control_characters_become_spaces():
    assert normalize_caption("a\x00b\x07c\x1bd\x7fe\x0bf") == "a b c d e f"


def test_terminal_escape_sequences_are_dropped_whole_not_left_as_words():
    assert normalize_caption("\x1b[31mred\x1b[0m sky") == "red sky"
    assert normalize_caption("\x1b[1;38;5;208mbold orange\x1b[m text") == "bold orange text"
    assert normalize_caption("\x1b]0;window title\x07a cat") == "a cat"
    assert normalize_caption("a cat \x1b[") == "a cat ["  # a cut sequence: its ESC is a control, the rest text


def test_c1_control_is_read_as_the_cp1252_character_it_stands_for():
    assert normalize_caption("wait\x85 what") == "wait\u2026 what"


def test_zero_width_characters_are_removed():
    assert normalize_caption("\ufeffzero\u200bwidth\u2060 soft\u00adhyphen") == "zerowidth softhyphen"


def test_emoji_joiner_is_kept():
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"
    assert normalize_caption(f"a {family} family") == f"a {family} family"


def test_whitespace_runs_collapse_to_one_space():
    text = "  line one\n\nline\ttwo\r\nnbsp\u00a0here\u3000end  "
    assert normalize_caption(text) == "line one line two nbsp here end"


def test_long_caption_is_cut_at_a_word_boundary_near_the_cap():
    text = "word " * 100  # 500 chars
    result = normalize_caption(text, max_chars=52)
    assert result == " ".join(["word"] * 10)
    assert len(result) <= 52


def test_long_caption_without_nearby_space_is_hard_cut():
    text = "a " + "x" * 200
    result = normalize_caption(text, max_chars=50)
    assert result == "a " + "x" * 48


def test_capped_caption_never_ends_with_whitespace():
    text = "x" * 9 + " " + "y" * 30
    result = normalize_caption(text, max_chars=10)
    assert result == "x" * 9
    for cap in range(1, 40):
        capped = normalize_caption(text, max_chars=cap)
        assert capped == capped.strip() and 0 < len(capped) <= cap


def test_hard_cut_does_not_separate_a_combining_mark():
    text = "x" * 9 + "e\u0308\u0301" + "y" * 20  # ë plus a second mark that cannot compose
    assert normalize_caption(text, max_chars=11) == "x" * 9 + "\u00eb\u0301"  # NFC: ë + acute
    assert normalize_caption(text, max_chars=10) == "x" * 9  # not "ë" without its accent


def test_short_caption_is_not_capped():
    assert normalize_caption("short", max_chars=5) == "short"


def test_max_chars_must_be_positive():
    with pytest.raises(ValueError):
        normalize_caption("x", max_chars=0)


def test_settings_cap_is_applied_by_pick_caption():
    caption, _ = pick_caption({"txt": "one two three four"}, CaptionSettings(max_chars=15))
    assert caption == "one two three"


# --- values that are not plain strings -------------------------------------------------------


def test_numbers_are_converted_to_text():
    assert pick_caption({"txt": 42}, DEFAULT) == ("42", "txt")
    assert pick_caption({"txt": 3.5}, DEFAULT) == ("3.5", "txt")


def test_integral_float_from_a_manifest_drops_the_trailing_zero():
    assert pick_caption({"txt": 1999.0}, DEFAULT) == ("1999", "txt")


def test_booleans_infinities_lists_and_dicts_are_skipped():
    record = {
        "txt": True,
        "caption": float("inf"),
        "json": {"caption": ["a", "b"], "description": {"en": "x"}},
        "alt": "fallback",
    }
    assert pick_caption(record, DEFAULT) == ("fallback", "alt")


def test_utf8_bytes_are_decoded():
    assert pick_caption({"txt": "naïve café".encode()}, DEFAULT) == ("naïve café", "txt")


def test_invalid_utf8_bytes_are_decoded_as_legacy_text():
    assert pick_caption({"txt": b"caf\xe9"}, DEFAULT) == ("café", "txt")
    assert pick_caption({"txt": b"\x93hi\x94"}, DEFAULT) == ("\u201chi\u201d", "txt")


# --- rejection ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["", "   ", "\n\t\u00a0", "\u200b\ufeff", None, float("nan")],
    ids=["empty", "spaces", "whitespace", "zero-width", "none", "nan"],
)
def test_record_without_usable_caption_is_rejected(value):
    error = rejection_for({"txt": value})
    assert error.stage == STAGE == "caption"
    assert error.reason == "no_caption"
    for field in DEFAULT.fields:
        assert field in error.detail


def test_rejection_detail_says_what_was_found_per_field():
    settings = CaptionSettings(fields=("txt", "caption", "json.description"))
    error = rejection_for({"caption": "  ", "json": {"description": [1]}}, settings)
    assert error.detail == (
        "tried txt (absent), caption (empty after normalization), json.description (not text (list))"
    )


def test_caption_shorter_than_min_chars_is_rejected():
    settings = CaptionSettings(fields=("txt",), min_chars=5)
    error = rejection_for({"txt": " ab "}, settings)
    assert error.reason == "no_caption"
    assert "txt" in error.detail and "min_chars=5" in error.detail


def test_min_chars_counts_normalized_text():
    settings = CaptionSettings(fields=("txt", "alt"), min_chars=4)
    assert pick_caption({"txt": "a\n\n\n\n b", "alt": "long enough"}, settings) == (
        "long enough",
        "alt",
    )


@pytest.mark.parametrize(
    "value",
    ["x", " x ", "\u200bx", "&amp;", "x" * 5000, "a" + "\u0301" * 3000, 0, b"\xff", "\x00x\x00"],
)
def test_picked_caption_is_never_empty(value):
    caption, _ = pick_caption({"txt": value}, CaptionSettings(max_chars=20))
    assert caption and caption == caption.strip() and len(caption) <= 20


# --- settings validation --------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"fields": ()},
        {"fields": "txt"},
        {"fields": ("txt", "")},
        {"max_chars": 0},
        {"min_chars": 0},
        {"min_chars": 10, "max_chars": 5},
        {"max_chars": True},
    ],
)
def test_invalid_settings_are_a_config_error(kwargs):
    with pytest.raises(ConfigError):
        CaptionSettings(**kwargs)


def test_caption_rules_name_the_rule_and_what_they_saw():
    rules = CaptionSettings(min_words=3, languages=["en", "de"], min_language_score=0.5)
    check_caption("a red bicycle", "en", 0.9, rules)  # passes every rule
    for args, reason, detail in [
        (("a bicycle", "en", 0.9), "too_few_words", "2 words, fewer than min_words=3"),
        (("un vélo rouge", "fr", 0.93), "language", "fr (0.93), not in languages [en, de]"),
        (("a red bicycle", "en", 0.31), "language", "en (0.31), below min_language_score=0.5"),
        (("a red bicycle", "en", 0.4981), "language", "en (0.4981), below min_language_score=0.5"),  # not 0.50
        (("🙂 🙂 🙂", "", 0.0), "language", "none (0.00), not in languages [en, de]"),
    ]:
        with pytest.raises(Rejection) as e:
            check_caption(*args, rules)
        assert (e.value.stage, e.value.reason, e.value.detail) == (STAGE, reason, detail)
    check_caption("x", "fr", 0.1, DEFAULT)  # by default every caption passes


def test_caption_rule_settings_are_checked():
    for bad in ({"min_words": 0}, {"languages": "en"}, {"min_language_score": 1.5}):
        with pytest.raises(ConfigError, match="captions"):
            CaptionSettings(**bad)
    assert CaptionSettings(languages=["en"]).languages == ("en",)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"languages": ["eng"]}, "'eng' is not a language lid.176 identifies.*'en', not 'eng'"),
        ({"languages": ["en", "xx"]}, "'xx' is not a language lid.176 identifies"),
        ({"languages": []}, "an empty list keeps no caption; null keeps every language"),
        ({"min_language_score": 0.5}, "min_language_score is checked on the languages kept; set captions.languages"),
    ],
)
def test_languages_lid176_cannot_name_and_rules_that_would_do_nothing_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        CaptionSettings(**settings)


def test_other_models_codes_of_a_language_are_taken_as_lid176_names_it():
    assert CaptionSettings(languages=["nb", "iw", "fil", "zh"]).languages == ("no", "he", "tl", "zh")


@pytest.mark.parametrize("kept", ["hr", "sr", "bs", "sh"])
def test_any_name_of_serbo_croatian_keeps_the_captions_identified_under_another(kept):
    # lid.176 and the other models give hr, sr or sh to the same captions almost at random
    rules = CaptionSettings(languages=[kept])
    for found in ("hr", "sr", "sh", "bs"):
        check_caption("crveni bicikl naslonjen na zid", found, 0.9, rules)
    with pytest.raises(Rejection, match=r"sl \(0.90\), not in languages"):
        check_caption("rdeče kolo ob zidu", "sl", 0.9, rules)
