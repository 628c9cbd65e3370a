"""Publish settings (shardsmith.publish.settings): taken from the config's publish section, and what goes to the
AWS CLI."""

from shardsmith.publish.settings import PublishSettings


def test_from_config_takes_the_settings_and_leaves_where_and_dedupe_to_others():
    section = {"dest": "s3://b/p", "dedupe": {"exact": True}, "keep_versions": 2, "verify": "etag", "hardlink": False}
    assert PublishSettings.from_config(section) == PublishSettings(keep_versions=2, verify="etag", hardlink=False)


def test_only_the_cli_settings_given_are_set():
    assert PublishSettings().cli_config() == {}
    given = PublishSettings(multipart_chunksize="64MB", max_concurrent_requests=16)
    assert given.cli_config() == {"multipart_chunksize": "64MB", "max_concurrent_requests": "16"}
