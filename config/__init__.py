"""The project's one settings object."""

from config.settings import EMBEDDED_HOST, EMBEDDED_PORT, Settings, SettingsError, describe

__all__ = ["EMBEDDED_HOST", "EMBEDDED_PORT", "Settings", "SettingsError", "describe"]
