"""Money at the edge of the service: amounts are int minor units (or integral Decimals),
never float (SPEC 2); rates are Decimals with the rounding mode stated next to them."""

from __future__ import annotations

from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Decimal, InvalidOperation

from wallets.errors import AmountInvalid

# Largest single amount accepted, in minor units: far above any real payment, far below
# bigint overflow even when many such amounts are summed into a balance.
MAX_AMOUNT = 10**15


def amount_to_minor(value: object, *, param: str = "amount") -> int:
    """`value` as a positive int amount in minor units, or AmountInvalid(param=param).
    TypeError on a float: a bug in the caller (the HTTP layer refuses JSON fractions)."""
    if isinstance(value, float):
        raise TypeError(f"{param}: float amounts are refused; use int minor units or Decimal")
    if isinstance(value, bool):
        raise AmountInvalid(param=param)
    if isinstance(value, int):
        minor = value
    elif isinstance(value, Decimal):
        try:
            if not value.is_finite() or value != value.to_integral_value():
                raise AmountInvalid(param=param)
            minor = int(value)
        except InvalidOperation as exc:
            raise AmountInvalid(param=param) from exc
    else:
        raise AmountInvalid(param=param)
    if minor <= 0 or minor > MAX_AMOUNT:
        raise AmountInvalid(param=param)
    return minor


def points_for(*, amount: int, rate: Decimal) -> int:
    """Points earned for `amount` main-currency minor units: amount x rate, rounded down."""
    return _times(amount, rate, ROUND_FLOOR)


def topup_bonus_for(*, amount: int, rate: Decimal) -> int:
    """Top-up bonus for `amount`: amount x rate, rounded down."""
    return _times(amount, rate, ROUND_FLOOR)


def carbon_grams_for(*, amount: int, grams_per_unit: Decimal) -> int:
    """Grams of CO2 for `amount` main-currency minor units, rounded half-even."""
    return _times(amount, grams_per_unit, ROUND_HALF_EVEN)


def fee_for(*, amount: int, rate: Decimal, rounding: str, fixed: int) -> int:
    """A payment's fee: amount x rate rounded with the schedule's own mode, plus the fixed
    part, never more than the amount (the merchant's side is never negative)."""
    return min(amount, _times(amount, rate, rounding) + fixed)


def proportion_floor(*, total: int, part: int, whole: int) -> int:
    """floor(total x part / whole) in exact integer arithmetic (refunds return rewards in proportion)."""
    return (total * part) // whole


def proportion_share(*, total: int, part_from: int, part_to: int, whole: int) -> int:
    """The share of `total` that the part of `whole` from `part_from` to `part_to` takes, by the
    cumulative floor: consecutive shares never sum past `total`, and reach it at the whole."""
    return proportion_floor(total=total, part=part_to, whole=whole) - proportion_floor(total=total, part=part_from, whole=whole)


def _times(amount: int, rate: object, rounding: str) -> int:
    if isinstance(rate, float):
        raise TypeError("rates are Decimal, never float")
    if not isinstance(rate, Decimal):
        raise TypeError(f"rate must be Decimal, not {type(rate).__name__}")
    return int((Decimal(amount) * rate).to_integral_value(rounding=rounding))


CURRENCY_SYMBOLS = {"JPY": "¥", "USD": "$", "GBP": "£"}
GRAMS_PER_KG = 1000


def money_format(*, amount: int, code: str, kind: str, exponent: int) -> str:
    """`amount` minor units of an asset, as staff read it: ¥1,200, 12.50 EUR, 340 pt,
    1.2 kg CO₂ (carbon is stored in grams). Exact: Decimal arithmetic, never float."""
    sign = "-" if amount < 0 else ""
    magnitude = abs(int(amount))
    if kind == "points":
        return f"{sign}{magnitude:,} pt"
    if kind == "carbon":
        if magnitude < GRAMS_PER_KG:
            return f"{sign}{magnitude:,} g CO₂"
        kg = (Decimal(magnitude) / GRAMS_PER_KG).normalize()
        return f"{sign}{kg:,f} kg CO₂"
    value = Decimal(magnitude).scaleb(-exponent) if exponent else Decimal(magnitude)
    text = f"{value:,.{exponent}f}"
    symbol = CURRENCY_SYMBOLS.get(code)
    return f"{sign}{symbol}{text}" if symbol else f"{sign}{text} {code}"
