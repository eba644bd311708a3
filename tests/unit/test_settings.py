from __future__ import annotations

import pytest

from config import Settings, SettingsError, describe


def test_environment_then_overrides() -> None:
    s = Settings.from_env({"AIP_BROKER": "kafka://k1:9092,k2:9093", "AIP_WINDOW_S": "5", "AIP_SSL_CHECK_HOSTNAME": "no"}, window_s=7.0)
    assert s.bootstrap_servers == ["k1:9092", "k2:9093"]
    assert s.window_s == 7.0
    assert s.ssl_check_hostname is False


def test_defaults_point_at_the_embedded_broker() -> None:
    assert Settings.from_env({}).bootstrap_servers == ["127.0.0.1:19092"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AIP_WINDOW_S": "ten"}, "AIP_WINDOW_S"),
        ({"AIP_SECURITY_PROTOCOL": "SASL"}, "security_protocol"),
        ({"AIP_BROKER": "localhost"}, "host:port"),
        ({"AIP_ALERT_CLEAR_PCT": "90"}, "alert_clear_pct"),
        ({"AIP_STAGE1_BATCH_WAIT_S": "0"}, "stage1_batch_wait_s"),
        ({"AIP_STAGE2_BATCH_WAIT_S": "60"}, "AIP_STAGE2_BATCH_WAIT_S"),
        ({"AIP_GC_GEN0_THRESHOLD": "-1"}, "gc_gen0_threshold"),
        ({"AIP_PRODUCER_LINGER_S": "2"}, "AIP_PRODUCER_LINGER_S"),
        ({"AIP_PRODUCER_BATCH_BYTES": "2000000"}, "producer_batch_bytes"),
    ],
)
def test_bad_values_say_which_setting(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_secrets_are_masked_when_printed() -> None:
    s = Settings.from_env({"AIP_SASL_PASSWORD": "s3cret-value", "AIP_SECURITY_PROTOCOL": "SASL_PLAINTEXT"})
    assert s.sasl_password == "s3cret-value"
    for text in (repr(s), str(s), str(s.public_dict()), str(describe())):
        assert "s3cret-value" not in text
    assert "****" in repr(s)


def test_every_setting_is_documented() -> None:
    for env, kind, _default, help_text in describe():
        assert env.startswith("AIP_") and kind and help_text


def test_readme_documents_every_setting() -> None:
    from pathlib import Path

    from config.settings import markdown_table

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert markdown_table() in readme, "README's configuration table is stale: run `python -m config`"


def test_worker_producer_batches_come_from_the_settings() -> None:
    from streams.app import app_config

    config = app_config(Settings(producer_linger_s=0.02, producer_batch_bytes=65536), web=False)
    assert (config["producer_linger"], config["producer_max_batch_size"]) == (0.02, 65536)
    assert (Settings().producer_linger_s, Settings().producer_batch_bytes) == (0.05, 256 * 1024)
