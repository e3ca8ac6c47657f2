"""A tenant's maker-checker settings, kept in `Tenant.extra_settings` (their form: README.md),
and their one parser. `Tenant.clean()` refuses bad values; the maker-checker
(payments.services.approvals) parses them again at each decision, since a row written
without `clean()` can hold anything.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

THRESHOLD_KEY = "adjustment_approval_threshold"
THRESHOLDS_KEY = "adjustment_approval_thresholds"
WINDOW_HOURS_KEY = "adjustment_approval_window_hours"
THRESHOLD_DEFAULT = 100_000
WINDOW_HOURS_DEFAULT = 24
# A year: a longer window is a typo, and timedelta's range ends well before a float's.
WINDOW_HOURS_MAX = 366 * 24
# A minute: a shorter window (1e-9 hours) would add up nothing, every posting alone.
WINDOW_MIN = timedelta(minutes=1)
# The asset code form (wallets.Asset.code, apikit.fields.ASSET_CODE_RE; tenants sits below
# both): thresholds are looked up by the exact code, so "jpy" would silently never match.
ASSET_CODE_RE = re.compile(r"^[A-Z][A-Z0-9_]{1,11}$")


class ApprovalSettingInvalid(ValueError):
    """A maker-checker setting of the tenant is not of the documented form."""


@dataclass(frozen=True)
class ApprovalLimits:
    """Most (minor units) one staff member may post alone in one asset within `window`."""

    threshold: int
    window: timedelta


def _threshold(value: Any, name: str) -> int:
    # bool is an int to Python, and a float threshold of money is a bug.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ApprovalSettingInvalid(f"{name} must be a whole number of minor units, 0 or more (got {value!r})")
    return value


def _window(value: Any) -> timedelta:
    if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
            or not 0 < value <= WINDOW_HOURS_MAX or timedelta(hours=value) < WINDOW_MIN):
        raise ApprovalSettingInvalid(
            f"{WINDOW_HOURS_KEY} must be a number of hours from 1 minute (1/60) to {WINDOW_HOURS_MAX} (got {value!r})"
        )
    return timedelta(hours=value)  # fractions kept: 0.5 is 30 minutes


def _per_asset(extra: dict[str, Any]) -> dict[str, Any]:
    per_asset = extra.get(THRESHOLDS_KEY)
    if per_asset is None:
        return {}
    if not isinstance(per_asset, dict):
        raise ApprovalSettingInvalid(f"{THRESHOLDS_KEY} must map asset codes to thresholds")
    return per_asset


def approval_settings_validate(*, extra: Any) -> None:
    """Refuse (ApprovalSettingInvalid) maker-checker settings not of the documented form:
    the window (1 minute to a year), the default threshold, and every asset's, keyed by
    the asset code as written (upper case: "jpy" is refused, not looked up as JPY)."""
    if not isinstance(extra, dict):
        raise ApprovalSettingInvalid("extra_settings must be a JSON object")
    _window(extra.get(WINDOW_HOURS_KEY, WINDOW_HOURS_DEFAULT))
    _threshold(extra.get(THRESHOLD_KEY, THRESHOLD_DEFAULT), THRESHOLD_KEY)
    for code, value in _per_asset(extra).items():
        if not isinstance(code, str) or not ASSET_CODE_RE.fullmatch(code):
            raise ApprovalSettingInvalid(f"{THRESHOLDS_KEY} keys must be asset codes, upper case as in JPY (got {code!r})")
        _threshold(value, f"{THRESHOLDS_KEY}[{code!r}]")


def approval_limits(*, extra: dict[str, Any], asset_code: str) -> ApprovalLimits:
    """The threshold for `asset_code` and the window, from a tenant's `extra_settings`.
    Raises ApprovalSettingInvalid if any maker-checker setting is not of the documented
    form (another asset's too: a broken setting is fixed, not worked around)."""
    approval_settings_validate(extra=extra)
    per_asset = _per_asset(extra)
    threshold = per_asset[asset_code] if asset_code in per_asset else extra.get(THRESHOLD_KEY, THRESHOLD_DEFAULT)
    return ApprovalLimits(threshold=int(threshold), window=_window(extra.get(WINDOW_HOURS_KEY, WINDOW_HOURS_DEFAULT)))
