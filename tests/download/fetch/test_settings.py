"""The `download:` settings (shardsmith.download.fetch.settings): defaults as in the schema, and which reasons are
retried."""

import yaml
from httpserver import Reply
from workflow_helpers import REPO

from shardsmith.download.fetch.settings import FetchSettings
from tests.download.fetch.test_client import fetch, summary


def test_schema_defaults_are_the_fetch_settings_defaults():
    schema = yaml.safe_load((REPO / "config" / "config.schema.yaml").read_text())
    props = schema["properties"]["download"]["properties"]
    from_schema = FetchSettings.from_config({k: v["default"] for k, v in props.items()})
    assert from_schema == FetchSettings()
    assert set(props) == set(FetchSettings.__dataclass_fields__)


def test_a_reason_left_out_of_retry_reasons_is_not_retried(http_server):
    url = http_server.route("/down.jpg", Reply(500, b""))
    out = fetch({"a": url}, retry_reasons=["timeout"])
    assert summary(out["a"]) == ("server_error", 500, 1)
