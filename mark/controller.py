"""Moved to ``mark.control``; this name stays only while importers are re-pointed."""

from mark.control import *  # noqa: F403
from mark.control import __all__ as __all__
