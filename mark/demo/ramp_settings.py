"""What `mark demo ramp` runs with: its own store, the demo model, its settings in layers.

The settings are the config file < the demo's values (``mark.demo.ramp``'s
overrides, the calibrated slowdown, the forecaster's model file) < the user's
--set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mark.demo.ramp import calibrated_slowdown, deep_merge, demo_overrides, heavy_model_overrides

if TYPE_CHECKING:
    from mark.config import Settings


def fresh_store(out: Path) -> Path:
    """``out/ramp.db``, deleted first: each run its own store, the timeline this run's only."""
    out.mkdir(parents=True, exist_ok=True)
    db = out / "ramp.db"
    db.unlink(missing_ok=True)
    return db


def use_demo_model(settings: Settings) -> None:
    """Build the digits model if it is missing, and let the agents (children) find it."""
    from mark.demo.model import ensure_demo_model

    ensure_demo_model(settings.data_dir)
    os.environ["MARK_DATA_DIR"] = str(settings.data_dir)


@dataclass
class RampSettings:
    """The demo's settings in layers: the config file < the demo's values < the user's --set.

    The demo's values grow as the run is prepared (the calibrated slowdown,
    the forecaster's model file); --set still beats every one of them.
    """

    config_file: Path | None
    demo: dict[str, Any]
    user: dict[str, Any]

    @classmethod
    def for_run(
        cls,
        config_file: Path | None,
        user: Mapping[str, Any],
        *,
        database: Path,
        update_period_s: float,
        cooldown_s: float,
        boot_delay_s: float,
        slowdown: float | None,
        plain_model: bool,
    ) -> RampSettings:
        """The demo's timings and store; ``digits_x40`` unless ``plain_model``."""
        demo = demo_overrides(
            update_period_s=update_period_s,
            cooldown_s=cooldown_s,
            boot_delay_s=boot_delay_s,
            slowdown=slowdown or 1.0,
        )
        demo["database_url"] = f"sqlite:///{database.resolve()}"
        if not plain_model:
            demo = deep_merge(demo, heavy_model_overrides())
        return cls(config_file, demo, dict(user))

    def load(self) -> Settings:
        from mark.config import load_settings

        return load_settings(self.config_file, deep_merge(self.demo, self.user))

    def add(self, over: Mapping[str, Any]) -> None:
        """Add to the demo's values (``over`` wins over them, not over --set)."""
        self.demo = deep_merge(self.demo, over)

    def calibrate(self, settings: Settings, t1_s: float) -> tuple[float, float]:
        """Emulate the c5.large at the slowdown that gives it T_1 ``t1_s`` on this machine,
        from the profile measured here, which the world then emulates as it is.

        Why the profile too: the world measured the model again at start, and its second
        measurement on this busy 2-core machine could come out slower than the first. On
        2026-11-28 the calibration aimed at 22 ms and the planner rated a c5.large at
        10.3 r/s, where 22 ms rates it at 26. Returns (slowdown, measured T_1).
        """
        slowdown, profile = calibrated_slowdown(settings, t1_s)
        self.add(
            {
                "local": {
                    "slowdown": {"c5.large": slowdown},
                    "reference_profile": {settings.models[0].name: str(profile)},
                }
            }
        )
        return slowdown, profile(1)
